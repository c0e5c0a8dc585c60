"""Count tables hold exactly a chain case's samples: a chunk's records expand back to its steps
in sampling order, with the pairs of one verifier call marked; canonical tables compare equal
whatever the order; bad widths and kinds are refused naming the argument."""

from __future__ import annotations

import numpy as np
import pytest

from losslessness.batteries import default_chain_battery
from losslessness.engine.tables import (
    CountTable,
    chunk_table,
    concatenate_tables,
    count_records,
    expand_table,
)
from losslessness.samples import ChainSamples


def _samples(n: int, pairs: list[tuple[int, int]], seed: int = 0) -> ChainSamples:
    case = next(c for c in default_chain_battery() if c.case_id == "v32-mixed-batch")
    rng = np.random.default_rng(seed)
    outputs = rng.integers(-1, case.vocab_size, size=(case.n_rows, n, case.k + 1))
    drafts = rng.integers(0, case.vocab_size, size=(case.n_rows, n, case.k))
    return ChainSamples(case, outputs, drafts, np.array(pairs, dtype=np.int64).reshape(-1, 2), 3)


@pytest.mark.parametrize("n", [1, 2, 7, 40])
def test_chunk_records_expand_back_to_the_same_steps_in_order(n: int) -> None:
    """A chunk of n steps (odd n: the last step is a single record) expands back to exactly its
    outputs and drafts, in order, and to exactly the same-call pairs it was given."""
    pairs = [(m, m + 1) for m in range(0, n - 1, 2) if m % 4 == 0]
    samples = _samples(n, pairs)
    back = expand_table(chunk_table(samples), samples.case, samples.seed, 5)
    np.testing.assert_array_equal(back.outputs, samples.outputs)
    np.testing.assert_array_equal(back.drafts, samples.drafts)
    np.testing.assert_array_equal(back.pairs, samples.pairs)
    assert back.steps_per_call == 5 and back.seed == 3


def test_canonical_tables_keep_the_multiset_of_steps_and_pairs() -> None:
    """Two chunks concatenated, canonicalised, and expanded hold the same multiset of steps
    and the same multiset of same-call pairs as the chunks themselves."""
    first, second = _samples(9, [(0, 1), (4, 5)], seed=1), _samples(6, [(2, 3)], seed=2)
    table = concatenate_tables([chunk_table(first), chunk_table(second)])
    canonical = table.canonical()
    assert canonical == table
    back = expand_table(canonical, first.case, 0, 2)
    assert back.n_steps == 15

    def steps(samples: ChainSamples) -> list[tuple[int, ...]]:
        joined = np.concatenate([samples.outputs, samples.drafts], axis=-1)
        return sorted(map(tuple, joined.transpose(1, 0, 2).reshape(samples.n_steps, -1).tolist()))

    def pair_steps(samples: ChainSamples) -> list[tuple[int, ...]]:
        joined = np.concatenate([samples.outputs, samples.drafts], axis=-1)
        flat = joined.transpose(1, 0, 2).reshape(samples.n_steps, -1)
        return sorted(tuple(flat[a].tolist() + flat[b].tolist()) for a, b in samples.pairs)

    assert steps(back) == sorted(steps(first) + steps(second))
    assert pair_steps(back) == sorted(pair_steps(first) + pair_steps(second))


def test_tables_refuse_bad_widths_kinds_and_pairs() -> None:
    """A table of another case's width, an unknown record kind, or pairs that are not
    (2m, 2m+1) raise a ValueError naming the argument."""
    samples = _samples(4, [(0, 1)])
    table = chunk_table(samples)
    with pytest.raises(ValueError, match="table: records have width"):
        expand_table(CountTable(table.records[:, :-1], table.counts), samples.case, 0, 1)
    bad = table.records.copy()
    bad[0, 0] = 7
    with pytest.raises(ValueError, match="table: unknown record kinds"):
        expand_table(CountTable(bad, table.counts), samples.case, 0, 1)
    with pytest.raises(ValueError, match="samples: pairs"):
        chunk_table(_samples(4, [(1, 2)]))
    with pytest.raises(ValueError, match="records: expected a"):
        count_records(np.zeros(3))
