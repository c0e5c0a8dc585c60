"""Tree and greedy-tree units on the run engine: the error budget counts tree assertions, tree
cases are sized from the design, plans and shards round-trip, and ``audit --tree`` audits a
user's function end to end."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from losslessness.batteries import (
    TREE_CI_MAX_STEPS,
    default_greedy_tree_battery,
    default_tree_battery,
)
from losslessness.checks.tree_assertions import tree_assertions, tree_steps
from losslessness.cli import main
from losslessness.config import RunConfig
from losslessness.engine.finish import finish_run
from losslessness.engine.plan import MIN_STEPS, PlanRecord, plan_run
from losslessness.engine.scheduler import run_shard
from losslessness.engine.shards import ShardSpec, load_shard, save_shard
from losslessness.results import TargetVerdict
from losslessness.targets import resolve_adapter
from tests.checks.test_tree import _highest_index_greedy, _star_iid_verifier

TREE_CASES = ("tree-star2-iid", "tree-chain-topk")

original_p_tree = _star_iid_verifier("original-p")
"""A wrong tree verifier (siblings verified against the original p): audited by --tree."""

wrong_greedy_tree = _highest_index_greedy
"""A wrong greedy tree verifier (the highest-index duplicate child): audited by --tree-greedy."""


def _cases(ids: tuple[str, ...]):  # type: ignore[no-untyped-def]
    return [case for case in default_tree_battery() if case.case_id in ids]


def test_the_budget_counts_every_statistical_tree_assertion() -> None:
    """n_assertions is the sum of the tree cases' statistical assertions (per tree target), and
    --only tree.law counts only the law classes."""
    reference = resolve_adapter("reference")
    plan = plan_run(RunConfig(cases=TREE_CASES), [reference])
    expected = sum(tree_assertions(case).count() for case in _cases(TREE_CASES))
    assert expected > 0
    assert plan.record.n_assertions == expected
    assert plan.record.per_assertion_alpha == pytest.approx(
        plan.record.battery_alpha / expected
    )
    only_law = plan_run(RunConfig(cases=TREE_CASES, only=("tree.law",)), [reference])
    assert only_law.record.n_assertions == sum(
        tree_assertions(case).count(("tree.law",)) for case in _cases(TREE_CASES)
    )
    assert {unit.kind for unit in plan.units} == {"tree"}


def test_tree_cases_are_sized_from_the_design_tv_and_capped() -> None:
    """A tree case's trees are tree_steps at the fixed-n share of the run's per-assertion
    alpha, capped by --max-steps (and the CI cap), scaled by the step multiplier."""
    reference = resolve_adapter("reference")
    config = RunConfig(cases=TREE_CASES)
    plan = plan_run(config, [reference])
    alpha = plan.record.alpha_split.fixed
    for case in _cases(TREE_CASES):
        grid = plan.record.tree_cases[case.case_id]
        cap = min(config.max_steps, TREE_CI_MAX_STEPS)
        steps, needed = tree_steps(case, config.tv, alpha, config.power, cap, MIN_STEPS)
        assert (grid.ci_steps, grid.needed_steps, grid.capped) == (steps, needed, needed > cap)
    small = plan_run(RunConfig(cases=TREE_CASES, max_steps=2500, step_multiplier=2), [reference])
    for grid in small.record.tree_cases.values():
        assert grid.ci_steps <= 2500
        assert grid.n_steps == math.ceil(grid.ci_steps * 2)


def test_plan_records_with_tree_cases_round_trip_through_json() -> None:
    """PlanRecord.from_json(to_json()) gives the same record and fingerprint with tree and
    greedy-tree cases."""
    plan = plan_run(RunConfig(cases=(*TREE_CASES, "greedy-tree-ties")),
                    [resolve_adapter("reference")])
    assert plan.record.greedy_tree_cases and plan.record.tree_cases
    again = PlanRecord.from_json(plan.record.to_json())
    assert again == plan.record
    assert again.fingerprint == plan.record.fingerprint


def test_two_shards_merged_give_the_one_shard_results(tmp_path: Path) -> None:
    """Tree and greedy-tree units in two saved-and-loaded shards finish to the same checks
    (verdicts, p-values) as one shard; the reference is LOSSLESS."""
    config = RunConfig(cases=(*TREE_CASES, "greedy-tree-duplicates"), steps=512)
    plan = plan_run(config, [resolve_adapter("reference")])
    one = finish_run([run_shard(plan, ShardSpec(0, 1))]).audit
    paths = [save_shard(run_shard(plan, ShardSpec(i, 2)), tmp_path / f"s{i}.json")
             for i in range(2)]
    two = finish_run([load_shard(path) for path in paths]).audit
    assert one.verdict is TargetVerdict.LOSSLESS

    def key(audit):  # type: ignore[no-untyped-def]
        return [(c.check_id, c.case_id, c.position, c.verdict, c.p_value)
                for t in audit.targets for c in t.checks]

    assert key(one) == key(two)
    checks = {c.check_id for t in one.targets for c in t.checks}
    assert {"tree.structure", "tree.law", "tree.independence", "tree.greedy"} <= checks


def test_audit_tree_option_audits_a_function_and_finds_it_lossy() -> None:
    """`losslessness audit --tree module:fn` audits a bare tree verifier: the reference's is
    LOSSLESS (exit 0), one verifying siblings against the original p is LOSSY (exit 1) with a
    replay naming --tree; --tree-greedy catches a wrong greedy tree verifier."""
    runner = CliRunner()
    common = ["--case", "tree-star2-iid", "--steps", "2048", "--no-progress"]
    good = runner.invoke(main, ["audit", "--tree", "losslessness.reference.tree:verify_tree",
                                *common])
    assert good.exit_code == 0, good.output
    bad = runner.invoke(main, ["audit", "--tree", f"{__name__}:original_p_tree", *common])
    assert bad.exit_code == 1, bad.output
    assert "LOSSY" in bad.output
    greedy = runner.invoke(main, ["audit", "--tree-greedy", f"{__name__}:wrong_greedy_tree",
                                  "--case", "greedy-tree-duplicates", "--no-progress"])
    assert greedy.exit_code == 1, greedy.output


def test_list_shows_the_tree_cases() -> None:
    """`losslessness list` lists every tree and greedy tree case with its protocol."""
    result = CliRunner().invoke(main, ["list"], terminal_width=200)
    assert result.exit_code == 0
    for case in [*default_tree_battery(), *default_greedy_tree_battery()]:
        assert case.case_id in result.output


def test_a_malformed_tree_output_is_lossy_and_a_crash_is_an_error() -> None:
    """A tree verifier returning float tokens is a protocol violation (LOSSY, malformed output,
    in tree.structure); one that raises is ERROR on every tree check of the case."""
    from losslessness.adapters import Adapter
    from losslessness.engine.audit import run_audit
    from losslessness.protocol import TreeOutput

    def float_tokens(target, draft, parents, token_ids, scheme, generator):  # type: ignore[no-untyped-def]
        depth = 1
        return TreeOutput(torch.zeros((token_ids.shape[0], depth + 1)),
                          torch.zeros((token_ids.shape[0], depth), dtype=torch.int64))

    def crash(target, draft, parents, token_ids, scheme, generator):  # type: ignore[no-untyped-def]
        raise RuntimeError("kernel exploded")

    config = RunConfig(cases=("tree-star2-iid",), steps=256)
    bad = run_audit([Adapter("float", "float tokens", tree=float_tokens)], config)
    [check] = bad.targets[0].checks
    assert bad.targets[0].verdict is TargetVerdict.LOSSY
    assert check.check_id == "tree.structure" and "malformed output" in check.message
    crashed = run_audit([Adapter("crash", "raises", tree=crash)], config)
    assert crashed.targets[0].verdict is TargetVerdict.ERROR
    assert {c.check_id for c in crashed.targets[0].checks} == {
        "tree.structure", "tree.law", "tree.acceptance", "tree.independence"
    }
