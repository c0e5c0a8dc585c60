"""Count tables: the sufficient statistics of a chain case's samples, which shards merge exactly.

A record holds two consecutive steps of one chunk (or the chunk's last step alone when its
number of steps is odd), each step with every row type's output ``[k+1]`` and drafts ``[k]``,
behind one *kind* column::

    record = [kind, out[0, a], d[0, a], ..., out[R-1, a], d[R-1, a],
                    out[0, b], d[0, b], ..., out[R-1, b], d[R-1, b]]

    kind 1: steps a, b were copies in one verifier call (the independence check pairs them)
    kind 0: steps a, b came from different calls
    kind 2: step a alone (b is all -1 and ignored)

    width 1 + 2 * R * (2k+1), int64, -1 placeholders kept

Every chain check is a function of the multiset of records: structure, conditional laws and
acceptance read each step's output and drafts, whatever their order; the independence check
reads the kind-1 pairs. Merging sums the tables (``np.unique(axis=0)`` of the union, counts
added), so the merged table of N shards equals the table of one run of the same chunk grid,
count for count, whatever N and the merge order. A table kept in memory by one process may hold
its records in sampling order with counts of 1 (:func:`chunk_table`).

The checks read a table as it is, counts included (:func:`counted_steps`): each record's steps
become distinct steps weighted by its count, never repeated. Where a check names a step, it
names the step's place in the table's *expanded order*: records in table order, each repeated
count times, a pair's two steps adjacent (for a chunk's table, the order the steps were drawn).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from losslessness.cases import ChainCase
from losslessness.samples import ChainCounts, ChainSamples

PAIR_SAME_CALL = 1
PAIR_TWO_CALLS = 0
SINGLE_STEP = 2


@dataclass(frozen=True)
class CountTable:
    """Records of one chain case and their counts (see the module docstring for the layout).

    Attributes:
        records: ``[M, 1 + 2 * R * (2k+1)]`` int64.
        counts: ``[M]`` int64, each >= 1.
    """

    records: np.ndarray
    counts: np.ndarray

    @property
    def n_records(self) -> int:
        """Number of records counted (pairs and single steps)."""
        return int(self.counts.sum())

    def canonical(self) -> CountTable:
        """The same multiset with distinct records in lexicographic order (what files hold and
        what equality compares)."""
        return count_records(self.records, self.counts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CountTable):
            return NotImplemented
        left, right = self.canonical(), other.canonical()
        return np.array_equal(left.records, right.records) and np.array_equal(
            left.counts, right.counts
        )

    __hash__ = None  # type: ignore[assignment]


def count_records(records: np.ndarray, counts: np.ndarray | None = None) -> CountTable:
    """The canonical count table of ``records`` (each weighted by ``counts``, default 1).

    Args:
        records: ``[M, W]`` integer.
        counts: ``[M]`` nonnegative integer weights, or None.

    Returns:
        :class:`CountTable` with distinct rows in lexicographic order.

    Raises:
        ValueError: naming ``records`` or ``counts`` for shapes that do not fit.
    """
    records = np.asarray(records, dtype=np.int64)
    if records.ndim != 2:
        raise ValueError(f"records: expected a [M, W] array, got shape {records.shape}")
    weights = (
        np.ones(records.shape[0], dtype=np.int64)
        if counts is None
        else np.asarray(counts, dtype=np.int64)
    )
    if weights.shape != (records.shape[0],):
        raise ValueError(f"counts: expected shape ({records.shape[0]},), got {weights.shape}")
    unique, inverse = np.unique(records, axis=0, return_inverse=True)
    summed = np.zeros(unique.shape[0], dtype=np.int64)
    np.add.at(summed, inverse.reshape(-1), weights)
    keep = summed > 0
    return CountTable(unique[keep], summed[keep])


def merge_tables(tables: list[CountTable]) -> CountTable:
    """Sum count tables of the same case (same record width) into one canonical table.

    Raises:
        ValueError: no tables, or tables of different widths.
    """
    if not tables:
        raise ValueError("tables: nothing to merge")
    widths = {table.records.shape[1] for table in tables}
    if len(widths) != 1:
        raise ValueError(f"tables: record widths differ: {sorted(widths)}")
    return count_records(
        np.concatenate([table.records for table in tables]),
        np.concatenate([table.counts for table in tables]),
    )


def concatenate_tables(tables: list[CountTable]) -> CountTable:
    """The records of ``tables`` one after the other, order and counts kept (one process's
    chunks of one case, in chunk order).

    Raises:
        ValueError: no tables.
    """
    if not tables:
        raise ValueError("tables: nothing to concatenate")
    return CountTable(
        np.concatenate([table.records for table in tables]),
        np.concatenate([table.counts for table in tables]),
    )


def chunk_table(samples: ChainSamples) -> CountTable:
    """The records of one chunk's samples, in sampling order, each counted once.

    Args:
        samples: one chunk: outputs ``[R, n, k+1]``, drafts ``[R, n, k]``, and ``pairs`` whose
            rows are among ``(2m, 2m+1)``.

    Returns:
        ``ceil(n / 2)`` records: pair ``m`` of steps ``2m, 2m+1`` (kind 1 when it is in
        ``samples.pairs``, else 0), then step ``n-1`` alone (kind 2) when ``n`` is odd.

    Raises:
        ValueError: ``samples.pairs`` holds a pair that is not ``(2m, 2m+1)``.
    """
    outputs, drafts = samples.outputs, samples.drafts
    n = outputs.shape[1]
    pairs = np.asarray(samples.pairs, dtype=np.int64).reshape(-1, 2)
    if pairs.size and (np.any(pairs[:, 0] % 2) or np.any(pairs[:, 1] != pairs[:, 0] + 1)):
        raise ValueError("samples: pairs must be steps (2m, 2m+1) of the chunk")
    steps = np.concatenate([outputs, drafts], axis=-1).transpose(1, 0, 2).reshape(n, -1)
    kinds = np.full(n // 2, PAIR_TWO_CALLS, dtype=np.int64)
    kinds[pairs[:, 0] // 2] = PAIR_SAME_CALL
    width = steps.shape[1]
    paired = np.concatenate([kinds[:, None], steps[: n - n % 2].reshape(n // 2, 2 * width)], axis=1)
    if n % 2:
        single = np.concatenate([[SINGLE_STEP], steps[-1], np.full(steps.shape[1], -1)])
        paired = np.concatenate([paired, single[None, :]])
    return CountTable(np.ascontiguousarray(paired, dtype=np.int64), np.ones(len(paired), np.int64))


def counted_steps(table: CountTable, case: ChainCase, steps_per_call: int) -> ChainCounts:
    """The steps a count table stands for, as the chain checks read them: every record's one or
    two steps weighted by its count, in table order, and every same-call pair (kind 1) weighted
    likewise; nothing is repeated.

    Args:
        table: count table of ``case``.
        case: the chain case (R row types, draft length k).
        steps_per_call: copies of each row type per verifier call, by design.

    Returns:
        :class:`~losslessness.samples.ChainCounts` of ``M = sum of record widths`` steps (a
        pair's record gives its steps a, b, a single step's record gives a), each step's
        ``first_step`` its first place in the expanded order (see the module docstring):
        ``sum over earlier records of width x count``, plus 1 for step b.

    Raises:
        ValueError: the record width is not ``1 + 2 * R * (2k+1)``, an unknown kind, or a
            count below 1.
    """
    rows, k = case.n_rows, case.k
    step_width = rows * (2 * k + 1)
    records, counts = table.records, table.counts
    if records.ndim != 2 or records.shape[1] != 1 + 2 * step_width:
        raise ValueError(
            f"table: records have shape {records.shape}, expected [M, 1 + 2 * R * (2k+1) = "
            f"{1 + 2 * step_width}]"
        )
    if counts.shape != (records.shape[0],):
        raise ValueError(f"table: counts have shape {counts.shape}, expected ({records.shape[0]},)")
    if np.any(counts < 1):
        below = sorted(set(counts[counts < 1].tolist()))
        raise ValueError(f"table: counts must be >= 1, got {below}")
    kinds = records[:, 0]
    if np.any((kinds != PAIR_SAME_CALL) & (kinds != PAIR_TWO_CALLS) & (kinds != SINGLE_STEP)):
        raise ValueError(f"table: unknown record kinds {sorted(set(kinds.tolist()))}")
    width = np.where(kinds == SINGLE_STEP, 1, 2)
    # [M_records, 2]: does the record hold step a, step b; row-major order keeps table order.
    holds = np.stack([np.ones_like(width, dtype=bool), width == 2], axis=1)
    steps = records[:, 1:].reshape(-1, 2, step_width)[holds]
    expanded_start = np.cumsum(width * counts) - width * counts
    view_start = np.cumsum(width) - width
    same = kinds == PAIR_SAME_CALL
    per_row = steps.reshape(-1, rows, 2 * k + 1).transpose(1, 0, 2)
    return ChainCounts(
        case=case,
        outputs=np.ascontiguousarray(per_row[..., : k + 1]),
        drafts=np.ascontiguousarray(per_row[..., k + 1 :]),
        weights=np.repeat(counts, width),
        first_step=(expanded_start[:, None] + np.arange(2))[holds],
        pairs=np.stack([view_start[same], view_start[same] + 1], axis=1),
        pair_weights=counts[same],
        steps_per_call=steps_per_call,
    )
