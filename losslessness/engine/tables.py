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
its records in sampling order with counts of 1 (:func:`chunk_table`); expanding it then gives
back the samples in the order they were drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from losslessness.cases import ChainCase
from losslessness.samples import ChainSamples

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


def expand_table(
    table: CountTable, case: ChainCase, seed: int, steps_per_call: int
) -> ChainSamples:
    """The samples a count table stands for: every record repeated ``count`` times, in table
    order, the steps of a pair adjacent.

    Args:
        table: count table of ``case``.
        case: the chain case (R row types, draft length k).
        seed: the seed reported with the samples.
        steps_per_call: copies of each row type per verifier call, by design.

    Returns:
        :class:`ChainSamples` with ``pairs`` the kind-1 pairs (timings left at 0).

    Raises:
        ValueError: the record width is not ``1 + 2 * R * (2k+1)``, or an unknown kind.
    """
    rows, k = case.n_rows, case.k
    step_width = rows * (2 * k + 1)
    if table.records.shape[1] != 1 + 2 * step_width:
        raise ValueError(
            f"table: records have width {table.records.shape[1]}, expected "
            f"1 + 2 * R * (2k+1) = {1 + 2 * step_width}"
        )
    repeated = np.repeat(table.records, table.counts, axis=0)
    kinds = repeated[:, 0]
    if np.any((kinds != PAIR_SAME_CALL) & (kinds != PAIR_TWO_CALLS) & (kinds != SINGLE_STEP)):
        raise ValueError(f"table: unknown record kinds {sorted(set(kinds.tolist()))}")
    width = np.where(kinds == SINGLE_STEP, 1, 2)
    first = np.concatenate([[0], np.cumsum(width)[:-1]])
    n = int(width.sum())
    steps = np.empty((n, step_width), dtype=np.int64)
    steps[first] = repeated[:, 1 : 1 + step_width]
    two = width == 2
    steps[first[two] + 1] = repeated[two, 1 + step_width :]
    same = first[kinds == PAIR_SAME_CALL]
    per_row = steps.reshape(n, rows, 2 * k + 1).transpose(1, 0, 2)
    return ChainSamples(
        case=case,
        outputs=np.ascontiguousarray(per_row[..., : k + 1]),
        drafts=np.ascontiguousarray(per_row[..., k + 1 :]),
        pairs=np.stack([same, same + 1], axis=1),
        seed=seed,
        steps_per_call=steps_per_call,
    )
