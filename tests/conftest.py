"""Shared pytest configuration: load the Hypothesis settings profile before tests are imported.

The profile comes from ``LOSSLESSNESS_HYPOTHESIS_PROFILE`` (``dev`` by default, ``ci`` in CI,
``nightly`` on the nightly job); see :mod:`strategies.profiles`. Loading it here, at conftest
import, means test modules that size their statistical budget from
``hypothesis.settings().max_examples`` see the active profile.
"""

from __future__ import annotations

import strategies

ACTIVE_HYPOTHESIS_PROFILE = strategies.load_profile()
"""Name of the Hypothesis profile loaded for this test session."""


def pytest_report_header() -> str:
    """Show the active Hypothesis profile in pytest's header."""
    return f"losslessness hypothesis profile: {ACTIVE_HYPOTHESIS_PROFILE}"
