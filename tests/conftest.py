"""Shared pytest configuration: choose the Hypothesis settings profile before tests are imported.

The profile comes from ``--losslessness-profile NAME`` when given, else from
``LOSSLESSNESS_HYPOTHESIS_PROFILE`` (``dev`` by default, ``ci`` in CI, ``nightly`` on the
nightly job); see :mod:`strategies.profiles`. It is loaded once at conftest import (from the
environment) and again in ``pytest_configure`` (where the option can override it), both before
any test module is imported, so test modules that size their statistical budget from
``hypothesis.settings().max_examples`` see the active profile.
"""

from __future__ import annotations

import os

import pytest
import torch

import strategies
from strategies.profiles import add_profile_option, configure_profile

ACTIVE_HYPOTHESIS_PROFILE = strategies.load_profile()
"""Name of the Hypothesis profile loaded from the environment at conftest import (the option,
when given, replaces it in ``pytest_configure``)."""


if os.environ.get("PYTEST_XDIST_WORKER"):
    # tox runs one xdist worker per core; torch's intra-op threads on top oversubscribe the
    # cores (on 2 cores: 395 s with torch's default threads, 277 s with one thread each).
    torch.set_num_threads(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--losslessness-profile NAME``."""
    add_profile_option(parser)


def pytest_configure(config: pytest.Config) -> None:
    """Load the profile the option or the environment names."""
    global ACTIVE_HYPOTHESIS_PROFILE
    ACTIVE_HYPOTHESIS_PROFILE = configure_profile(config)


def pytest_report_header() -> str:
    """Show the active Hypothesis profile in pytest's header."""
    return f"losslessness hypothesis profile: {ACTIVE_HYPOTHESIS_PROFILE}"
