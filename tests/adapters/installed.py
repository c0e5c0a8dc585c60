"""Skip markers for the tests of engines whose kernels run through Triton (``tox -e engines``):
one rule for every such test module."""

from __future__ import annotations

import importlib.util
from importlib import metadata

import pytest

__all__ = ["engine_installed", "needs_engine"]


def engine_installed(name: str) -> bool:
    """Whether the distribution ``name`` is installed (its metadata) and Triton importable."""
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("triton") is not None


def needs_engine(name: str) -> pytest.MarkDecorator:
    """A ``skipif`` marker: skip unless :func:`engine_installed` (reason: not installed)."""
    return pytest.mark.skipif(not engine_installed(name), reason=f"{name} is not installed")
