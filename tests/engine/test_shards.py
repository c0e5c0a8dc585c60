"""A run's shards merge exactly: N shards merged equal one run of the same grid, count for count
and verdict for verdict; shards of different plans, duplicate or missing units are refused with
an error naming the problem; ``losslessness nightly`` writes the four reports."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from losslessness.adapters import Adapter
from losslessness.cases import ChainCase
from losslessness.cli import main
from losslessness.config import RunConfig
from losslessness.engine import (
    RunPlan,
    ShardMergeError,
    ShardSpec,
    finish_run,
    load_shard,
    parse_shard_spec,
    plan_run,
    run_shard,
    save_shard,
)
from losslessness.engine.finish import RunResult
from losslessness.engine.suite import parse_junit
from losslessness.engine.tables import count_records, merge_tables
from losslessness.results import TargetVerdict, Verdict
from losslessness.targets import resolve_adapter
from tests import wrong_verifiers
from tests.engine.outcomes import check_outcome

# Small step multiplier, a few cases (V = 2 and 8, a batch of three row types, disjoint
# supports, two greedy cases) and small chunks: every chain case spans several chunks, so shards
# hold parts of the same case and the merge really sums tables; the grid samples in a few seconds.
STEP_MULTIPLIER = 0.05
CHUNK = 64
CASES = (
    "v2-tilted",
    "v8-far",
    "v32-mixed-batch",
    "edge-disjoint",
    "greedy-v2-random",
    "greedy-v8-ties",
)


def _plan(step_multiplier: float = STEP_MULTIPLIER) -> RunPlan:
    config = RunConfig(
        step_multiplier=step_multiplier,
        cases=CASES,
        suite=False,
        device_checks=False,
        chunk_steps=CHUNK,
        seed=7,
        # Early stopping decides per shard: only the fixed design merges count for count.
        early_stop=False,
    )
    lossy = Adapter(
        "residual-is-target",
        "wrong verifier: residual distribution is p instead of norm(max(0, p - q))",
        chain=wrong_verifiers.residual_is_target,
    )
    return plan_run(config, [resolve_adapter("reference"), lossy])


@pytest.fixture(scope="module")
def plan() -> RunPlan:
    return _plan()


@pytest.fixture(scope="module")
def one_run(plan: RunPlan, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return finish_run([run_shard(plan, ShardSpec(0, 1), tmp_path_factory.mktemp("one"))])


def test_shard_spec_parses_i_of_n_and_names_the_option_on_bad_specs() -> None:
    """``i/N`` parses to a zero-based shard; malformed or out-of-range specs raise a ValueError
    that names ``shard`` and what is wrong."""
    assert parse_shard_spec("0/1") == ShardSpec(0, 1)
    assert parse_shard_spec(" 2 / 3 ") == ShardSpec(2, 3)
    for text, problem in (
        ("3/3", "i must lie in [0, N)"),
        ("1/0", "N must be >= 1"),
        ("a/b", "expected i/N"),
        ("-1/2", "expected i/N"),
        ("1", "expected i/N"),
    ):
        with pytest.raises(ValueError, match="shard") as raised:
            parse_shard_spec(text)
        assert problem in str(raised.value)


def test_shards_partition_the_unit_grid(plan: RunPlan) -> None:
    """For every N, the N shards together run every unit of the grid exactly once."""
    for count in (1, 2, 3, 7):
        taken = sorted(
            unit.index
            for i in range(count)
            for unit in plan.units
            if ShardSpec(i, count).takes(unit.index)
        )
        assert taken == list(range(len(plan.units)))


def test_count_table_merge_does_not_depend_on_grouping_or_order() -> None:
    """Summing tables of parts equals the table of the whole, whatever the split and order."""
    rng = np.random.default_rng(1)
    records = rng.integers(0, 4, size=(500, 3))
    whole = count_records(records)
    parts = [count_records(part) for part in np.array_split(records, 5)]
    assert merge_tables(parts) == whole
    assert merge_tables(parts[::-1]) == whole
    assert merge_tables([merge_tables(parts[:2]), merge_tables(parts[2:])]) == whole
    assert whole.n_records == 500


@pytest.mark.parametrize("count", [1, 2, 3])
def test_n_shards_merged_equal_one_run_count_for_count_and_verdict_for_verdict(
    count: int, plan: RunPlan, one_run: RunResult, tmp_path: Path
) -> None:
    """N shards, saved to files and merged in reverse order, give the one run's count tables
    exactly and the same statistics, p-values and verdicts for every check; the wrong
    verifier in the plan comes out LOSSY and the reference LOSSLESS, so the comparison covers
    both verdicts."""
    files = [
        save_shard(run_shard(plan, ShardSpec(i, count), tmp_path), tmp_path / f"s{i}.npz")
        for i in range(count)
    ]
    merged = finish_run([load_shard(path) for path in reversed(files)])
    assert merged.tables.keys() == one_run.tables.keys()
    for key, table in one_run.tables.items():
        assert merged.tables[key] == table, key
    assert [check_outcome(c) for t in merged.audit.targets for c in t.checks] == [
        check_outcome(c) for t in one_run.audit.targets for c in t.checks
    ]
    verdicts = {target.name: target.verdict for target in merged.audit.targets}
    assert verdicts == {
        "reference": TargetVerdict.LOSSLESS,
        "residual-is-target": TargetVerdict.LOSSY,
    }
    assert merged.exit_code == one_run.exit_code == 1


def test_merged_steps_are_the_planned_steps(plan: RunPlan, one_run: RunResult) -> None:
    """Every chain case's merged table holds exactly the planned steps per target (two per
    pair record, one per single-step record), and the structure check saw all of them."""
    for (target, case_id), table in one_run.tables.items():
        steps = int((table.counts * np.where(table.records[:, 0] == 2, 1, 2)).sum())
        assert steps == plan.record.chain_cases[case_id].n_steps, (target, case_id)
    structure = [
        check
        for target in one_run.audit.targets
        for check in target.checks
        if check.check_id == "structure" and check.target == "reference"
    ]
    case_rows = {case.case_id: case.n_rows for case in plan.chain_cases}
    for check in structure:
        assert check.n == plan.record.chain_cases[check.case_id].n_steps * case_rows[check.case_id]


def test_merge_refuses_shards_of_different_plans_naming_the_difference(
    plan: RunPlan, tmp_path: Path
) -> None:
    """Shards planned with different step multipliers do not merge; the error names
    ``config.step_multiplier`` and both shards."""
    other = _plan(step_multiplier=2 * STEP_MULTIPLIER)
    first = run_shard(plan, ShardSpec(0, 2), tmp_path)
    second = dataclasses.replace(first, plan=other.record, source="other.npz")
    different = r"different plans: .*config\.step_multiplier"
    with pytest.raises(ShardMergeError, match=different) as raised:
        finish_run([first, second])
    assert "other.npz" in str(raised.value)


def test_merge_refuses_duplicate_and_missing_units(plan: RunPlan, tmp_path: Path) -> None:
    """The same shard twice is a duplicate (named with its unit); one shard of two leaves
    units missing (counted)."""
    shard = run_shard(plan, ShardSpec(1, 2), tmp_path)
    with pytest.raises(ShardMergeError, match="appears in both"):
        finish_run([shard, dataclasses.replace(shard, source="copy.npz")])
    with pytest.raises(ShardMergeError, match=r"units were run by no shard given"):
        finish_run([shard])


def test_shard_files_carry_the_chain_cases_and_refuse_altered_ones(
    plan: RunPlan, tmp_path: Path
) -> None:
    """A shard file holds the plan's chain cases themselves (the finish checks them, not the
    battery it imports): loaded back, every case has its exact tensors, summary and tags; a
    file whose case tensors differ from the plan's hashes is refused."""
    shard = run_shard(plan, ShardSpec(0, 2), tmp_path)
    loaded = load_shard(save_shard(shard, tmp_path / "s.npz"))
    assert loaded.cases.keys() == {case.case_id for case in plan.chain_cases}
    for case in plan.chain_cases:
        back = loaded.cases[case.case_id]
        assert back.case_hash == case.case_hash
        assert (back.summary, back.tags) == (case.summary, case.tags)
        assert back.target_probs.dtype == case.target_probs.dtype
    first = plan.chain_cases[0]
    altered = ChainCase(
        first.case_id, first.summary, first.target_probs.flip(-1), first.draft_probs, first.tags
    )
    forged = dataclasses.replace(shard, cases={**shard.cases, first.case_id: altered})
    with pytest.raises(ShardMergeError, match="chain cases do not match"):
        load_shard(save_shard(forged, tmp_path / "forged.npz"))


def test_suite_junit_maps_failures_to_lossy_and_errors_to_error() -> None:
    """A failed suite test is LOSSY, an errored one ERROR, a skipped one SKIPPED."""
    junit = (
        '<testsuites><testsuite name="pytest">'
        '<testcase name="a" time="1.5"/>'
        '<testcase name="b" time="2"><failure message="law: p-value 1e-9">x</failure></testcase>'
        '<testcase name="c" time="0"><error message="boom">y</error></testcase>'
        '<testcase name="d" time="0"><skipped message="no greedy"/></testcase>'
        "</testsuite></testsuites>"
    )
    checks = parse_junit(junit, "target", "ci")
    assert [check.verdict for check in checks] == [
        Verdict.PASS,
        Verdict.LOSSY,
        Verdict.ERROR,
        Verdict.SKIPPED,
    ]
    assert checks[1].message == "law: p-value 1e-9"


def test_nightly_command_writes_the_four_reports_and_merge_refuses_bad_shards(
    tmp_path: Path,
) -> None:
    """``losslessness nightly --out DIR`` (reduced step multiplier and battery, reference only)
    writes report.html, report.md, junit.xml and report.json (and nightly.json) and exits 0;
    ``--shard 2/2`` and merging one shard of two are usage errors (exit 2) that say why."""
    runner = CliRunner()
    options = ["--targets", "reference", "--budget", str(STEP_MULTIPLIER), "--no-suite"]
    options += [f"--case={case}" for case in CASES]
    options += ["--no-device-checks", "--no-progress"]
    out = tmp_path / "night"
    result = runner.invoke(main, ["nightly", *options, "--out", str(out)])
    assert result.exit_code == 0, result.output
    for name in ("report.html", "report.md", "junit.xml", "report.json", "nightly.json"):
        assert (out / name).stat().st_size > 0, name
    bad = runner.invoke(main, ["nightly", *options, "--shard", "2/2", "--out", str(out)])
    assert bad.exit_code == 2 and "shard" in bad.output
    merge = runner.invoke(
        main, ["merge", str(out / "shard-0-of-1.npz"), "--out", str(tmp_path / "m")]
    )
    assert merge.exit_code == 0, merge.output
    assert (tmp_path / "m" / "report.json").exists()
    half = tmp_path / "half"
    shard = runner.invoke(main, ["nightly", *options, "--shard", "0/2", "--out", str(half)])
    assert shard.exit_code == 0, shard.output
    refused = runner.invoke(
        main, ["merge", str(half / "shard-0-of-2.npz"), "--out", str(tmp_path / "x")]
    )
    assert refused.exit_code == 2 and "run by no shard" in refused.output
