"""Fixtures of the reference tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import losslessness.reference.threads as threads


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Two torch threads and a thread per 16 rows, so small batches split across threads."""
    monkeypatch.setattr(threads, "MIN_ROWS_PER_THREAD", 16)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
