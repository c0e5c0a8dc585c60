"""Serving units in shards: a plan with serving units survives its JSON form, and two shards
saved to disk and merged give the one-shard run's serving results, result for result."""

from __future__ import annotations

from pathlib import Path

from losslessness.config import RunConfig
from losslessness.engine import ShardSpec, finish_run, load_shard, plan_run, run_shard, save_shard
from losslessness.engine.plan import PlanRecord, UnitKind
from losslessness.targets import resolve_targets
from tests.serving.profile import small_profile


def test_serving_shards_merge_into_the_one_shard_run(tmp_path: Path) -> None:
    """Two serving cases, two shards: the same verdicts, p-values and n as one shard."""
    small_profile()
    targets = resolve_targets(
        ["tests.serving.targets:reference"], protocol="serving", in_process=True
    )
    config = RunConfig(cases=("serving-b1", "serving-bfloat16"), steps=150)
    plan = plan_run(config, targets)
    assert [unit.kind for unit in plan.units] == [UnitKind.SERVING, UnitKind.SERVING]
    assert PlanRecord.from_json(plan.record.to_json()) == plan.record
    one = finish_run([run_shard(plan, ShardSpec(0, 1), tmp_path / "one")]).audit
    files = []
    for index in range(2):
        path = tmp_path / f"s{index}.npz"
        save_shard(run_shard(plan, ShardSpec(index, 2), tmp_path / f"w{index}"), path)
        files.append(path)
    merged = finish_run([load_shard(path) for path in files]).audit

    def key(audit: object) -> list[tuple[object, ...]]:
        checks = audit.targets[0].checks  # type: ignore[attr-defined]
        return sorted((c.case_id, c.check_id, c.row or 0, c.position or 0, c.verdict, c.p_value,
                       c.n) for c in checks)

    assert key(one) == key(merged) and len(key(one)) > 10
