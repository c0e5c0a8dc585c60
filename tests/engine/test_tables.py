"""Count tables hold exactly a chain case's samples, and the checks read them as they are: a
chunk's table is its steps in sampling order, each counted once; the checks on any table (its
records in any order, counts above 1) give the results they give on the raw samples it stands
for, step indices in messages included; canonical tables compare equal whatever the order; bad
widths, kinds and counts are refused naming the problem."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from losslessness.batteries import default_chain_battery
from losslessness.cases import ChainCase
from losslessness.checks import run_chain_checks
from losslessness.engine.draw import sample_chain
from losslessness.engine.tables import (
    PAIR_SAME_CALL,
    SINGLE_STEP,
    CountTable,
    chunk_table,
    concatenate_tables,
    count_records,
    counted_steps,
)
from losslessness.reference import verify
from losslessness.results import CheckContext, CheckResult, Verdict
from losslessness.samples import ChainSamples, chain_counts


def _case(case_id: str) -> ChainCase:
    return next(c for c in default_chain_battery() if c.case_id == case_id)


def _samples(n: int, pairs: list[tuple[int, int]], seed: int = 0) -> ChainSamples:
    """Random (mostly malformed) outputs of the mixed-batch case: every check has work."""
    case = _case("v32-mixed-batch")
    rng = np.random.default_rng(seed)
    outputs = rng.integers(-1, case.vocab_size, size=(case.n_rows, n, case.k + 1))
    drafts = rng.integers(0, case.vocab_size, size=(case.n_rows, n, case.k))
    return ChainSamples(case, outputs, drafts, np.array(pairs, dtype=np.int64).reshape(-1, 2), 3)


def _raw_samples_of(table: CountTable, case: ChainCase, steps_per_call: int) -> ChainSamples:
    """The samples a table stands for, written out step by step (the oracle): records in table
    order, each repeated count times, a pair's two steps adjacent."""
    width = case.n_rows * (2 * case.k + 1)
    steps: list[np.ndarray] = []
    pairs: list[tuple[int, int]] = []
    for record, count in zip(table.records, table.counts, strict=True):
        for _ in range(int(count)):
            if record[0] == PAIR_SAME_CALL:
                pairs.append((len(steps), len(steps) + 1))
            steps.append(record[1 : 1 + width])
            if record[0] != SINGLE_STEP:
                steps.append(record[1 + width :])
    per_row = np.array(steps).reshape(len(steps), case.n_rows, -1).transpose(1, 0, 2)
    return ChainSamples(
        case,
        per_row[..., : case.k + 1],
        per_row[..., case.k + 1 :],
        np.array(pairs, dtype=np.int64).reshape(-1, 2),
        0,
        steps_per_call=steps_per_call,
    )


def _comparable(results: list[CheckResult]) -> list[dict[str, Any]]:
    """Every field of the results but the time they took."""
    return [
        {key: value for key, value in dataclasses.asdict(r).items() if key != "wall_time_s"}
        for r in results
    ]


def _context(case: ChainCase) -> CheckContext:
    return CheckContext.for_case("t", case, alpha=1e-3, power=0.9, tv=0.1, seed=1)


@pytest.mark.parametrize("n", [1, 2, 7, 40])
def test_a_chunk_table_is_its_steps_in_sampling_order_each_counted_once(n: int) -> None:
    """A chunk of n steps (odd n: the last step is a single record) reads back as exactly its
    outputs and drafts, in order, each of weight 1 and first at its own index, with exactly
    the same-call pairs it was given."""
    pairs = [(m, m + 1) for m in range(0, n - 1, 2) if m % 4 == 0]
    samples = _samples(n, pairs)
    counted = counted_steps(chunk_table(samples), samples.case, 5)
    np.testing.assert_array_equal(counted.outputs, samples.outputs)
    np.testing.assert_array_equal(counted.drafts, samples.drafts)
    np.testing.assert_array_equal(counted.pairs, samples.pairs)
    np.testing.assert_array_equal(counted.weights, np.ones(n))
    np.testing.assert_array_equal(counted.first_step, np.arange(n))
    np.testing.assert_array_equal(counted.pair_weights, np.ones(len(pairs)))
    assert counted.steps_per_call == 5 and counted.n_steps == n


@pytest.mark.parametrize("block", [False, True])
def test_checks_on_a_table_equal_checks_on_the_samples_it_stands_for(block: bool) -> None:
    """Random outputs (structure, law and acceptance failures) in two chunks, merged into a
    canonical table and into one with every count tripled: every check on the table (not
    expanded) gives the results it gives on the raw samples the table stands for, messages
    naming a step included."""
    first, second = _samples(9, [(0, 1), (4, 5)], seed=1), _samples(6, [(2, 3)], seed=2)
    table = concatenate_tables([chunk_table(first), chunk_table(second)]).canonical()
    tripled = CountTable(table.records, 3 * table.counts)
    verification = "block" if block else "token"
    for each in (table, tripled):
        raw = _raw_samples_of(each, first.case, 2)
        counted = counted_steps(each, first.case, 2)
        assert counted.n_steps == raw.n_steps and counted.n_pairs == len(raw.pairs)
        context = _context(first.case)
        on_table = run_chain_checks(counted, context, verification)
        assert _comparable(on_table) == _comparable(run_chain_checks(raw, context, verification))
        assert {r.verdict for r in on_table} >= {Verdict.LOSSY}


def test_checks_on_a_sampled_tables_counts_equal_checks_on_its_samples() -> None:
    """A reference verifier's steps on a small case (few distinct records, large counts): the
    checks on the canonical merged table equal the checks on the raw samples it stands for,
    and (order aside) on the samples as drawn."""
    case = _case("v2-tilted")
    drawn = sample_chain(verify, case, 3000, seed=5)
    table = count_records(chunk_table(drawn).records)
    counted = counted_steps(table, case, drawn.steps_per_call)
    assert 5 * len(table.counts) < table.n_records and counted.n_steps == drawn.n_steps
    context = _context(case)
    on_table = run_chain_checks(counted, context)
    raw = _raw_samples_of(table, case, drawn.steps_per_call)
    assert _comparable(on_table) == _comparable(run_chain_checks(raw, context))
    assert _comparable(on_table) == _comparable(run_chain_checks(drawn, context))
    assert {r.verdict for r in on_table} <= {Verdict.PASS, Verdict.SKIPPED}


def test_a_message_names_the_step_of_the_expanded_order() -> None:
    """A malformed step in the third record, after a pair counted 3 times and a single step
    counted twice, is step 3 * 2 + 2 * 1 = 8 of the expanded order (its record's first)."""
    samples = _samples(4, [(0, 1)])
    good = samples.outputs.copy()
    good[...] = -1
    good[..., 0] = 0
    drafts = np.ones_like(samples.drafts)
    clean = chunk_table(dataclasses.replace(samples, outputs=good, drafts=drafts))
    bad_outputs = good.copy()
    bad_outputs[1, 2, 2] = 5
    bad = chunk_table(dataclasses.replace(samples, outputs=bad_outputs, drafts=drafts))
    single = clean.records[0].copy()
    single[0] = SINGLE_STEP
    single[1 + (single.size - 1) // 2 :] = -1
    table = CountTable(
        np.stack([clean.records[0], single, bad.records[1]]), np.array([3, 2, 4], np.int64)
    )
    counted = counted_steps(table, samples.case, 1)
    np.testing.assert_array_equal(counted.first_step, [0, 1, 6, 8, 9])
    np.testing.assert_array_equal(counted.weights, [3, 3, 2, 4, 4])
    (structure, *_) = run_chain_checks(counted, _context(samples.case))
    assert structure.verdict is Verdict.LOSSY
    assert "4 of 48 rows malformed: token after a placeholder -1 (4 rows)" in structure.message
    assert "First: row type 1, step 8," in structure.message


def test_raw_samples_read_as_counts_of_one() -> None:
    """Raw samples are their own counted view: weights 1, steps at their own index."""
    samples = _samples(5, [(0, 1)])
    counted = chain_counts(samples)
    assert chain_counts(counted) is counted
    np.testing.assert_array_equal(counted.first_step, np.arange(5))
    assert counted.n_steps == 5 and counted.n_pairs == 1


def test_tables_refuse_bad_widths_kinds_counts_and_pairs() -> None:
    """A table of another case's width, an unknown record kind, a count below 1, or pairs
    that are not (2m, 2m+1) raise a ValueError naming the problem."""
    samples = _samples(4, [(0, 1)])
    table = chunk_table(samples)
    with pytest.raises(ValueError, match=r"table: records have shape \(2, 30\)"):
        counted_steps(CountTable(table.records[:, :-1], table.counts), samples.case, 1)
    bad = table.records.copy()
    bad[0, 0] = 7
    with pytest.raises(ValueError, match=r"table: unknown record kinds \[0, 7\]"):
        counted_steps(CountTable(bad, table.counts), samples.case, 1)
    with pytest.raises(ValueError, match=r"table: counts must be >= 1, got \[0\]"):
        counted_steps(CountTable(table.records, np.array([1, 0])), samples.case, 1)
    with pytest.raises(ValueError, match=r"table: counts have shape \(1,\)"):
        counted_steps(CountTable(table.records, np.array([1])), samples.case, 1)
    with pytest.raises(ValueError, match="samples: pairs"):
        chunk_table(_samples(4, [(1, 2)]))
    with pytest.raises(ValueError, match="records: expected a"):
        count_records(np.zeros(3))
    with pytest.raises(ValueError, match=r"pairs: step indices must be in \[0, 4\)"):
        chain_counts(dataclasses.replace(samples, pairs=np.array([[0, 4]])))
