"""Splitting a compiled kernel's batch over threads (the kernels release the GIL)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")

MIN_ROWS_PER_THREAD = 1 << 14
"""Rows below which a kernel call stays on one thread: a thread's start and join cost about
as much as verifying this many rows."""


def split_rows(batch: int, run: Callable[[slice], T]) -> list[T]:
    """Run ``run`` on contiguous slices covering ``range(batch)``, one per thread.

    ``min(torch.get_num_threads(), batch // MIN_ROWS_PER_THREAD)`` threads, at least one; the
    slices are as equal as integers allow. ``run`` must only write its own rows (each row's
    result then does not depend on the split).

    Args:
        batch: B >= 0 rows.
        run: called once per slice, from a worker thread when there are several.

    Returns:
        ``run``'s results in slice order.
    """
    threads = max(1, min(torch.get_num_threads(), batch // MIN_ROWS_PER_THREAD))
    bounds = [batch * t // threads for t in range(threads + 1)]
    slices = [slice(low, high) for low, high in itertools.pairwise(bounds)]
    if threads == 1:
        return [run(slices[0])]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(run, slices))


def worst_of(errors: Iterable[float]) -> float:
    """The largest of the threads' errors, NaN if any is NaN (a NaN sum marks a NaN or inf
    entry, which ``max`` alone could drop), 0.0 for none."""
    values = list(errors)
    return math.nan if any(math.isnan(v) for v in values) else max(values, default=0.0)
