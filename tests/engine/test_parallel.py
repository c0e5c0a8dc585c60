"""An audit's shards in parallel processes (``--jobs``, :mod:`losslessness.engine.parallel`):
the same result as one process, and a failing child costs only its own units."""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from losslessness.cli import main
from losslessness.commands.audit import TargetNames, run_child_shard
from losslessness.config import RunConfig
from losslessness.engine import parallel, run_audit
from losslessness.engine.draw import ChainSampler
from losslessness.engine.plan import UnitKind, plan_run
from losslessness.engine.shards import ShardResult, ShardSpec
from losslessness.results import Verdict
from losslessness.worker import shutdown_workers, worker_of
from tests.engine.thread_targets import THREADS_FILE

CASES = ("v2-tilted", "v8-far", "v16-near-k4")
"""Three battery cases: three units per target, split into one shard per unit."""


def _config() -> RunConfig:
    return dataclasses.replace(RunConfig(), cases=CASES, early_stop=False)


def _outcome(result: object) -> list[tuple[object, ...]]:
    return [
        (target.name, check.check_id, check.case_id, check.position, check.row, check.n,
         check.p_value, check.verdict)
        for target in result.targets  # type: ignore[attr-defined]
        for check in target.checks
    ]


@pytest.fixture
def parallel_from_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let these small plans use several processes (the threshold is for real audits)."""
    monkeypatch.setattr(parallel, "MIN_PARALLEL_STEPS", 0)


@pytest.fixture
def child_takes_shard_1(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The audit's process leaves shard 1 to the child (it would take every shard of these
    small plans before a child has started); the list holds True once the child took it."""
    take = parallel._next_shard
    handed_over: list[bool] = []

    def leave_shard_1(counter: Any, order: list[int]) -> int | None:
        deadline = time.monotonic() + 120
        while counter.value == 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        if counter.value > 1 and not handed_over:
            handed_over.append(True)
        return take(counter, order)

    monkeypatch.setattr(parallel, "_next_shard", leave_shard_1)
    return handed_over


def _crashing_runner(spec: ShardSpec) -> ShardResult:
    """A child that dies the hard way (no exception to report, no result)."""
    import os

    os._exit(7)


def test_two_processes_give_the_one_process_audit_count_for_count(
    parallel_from_any_size: None, child_takes_shard_1: list[bool]
) -> None:
    """Shards are placed, not changed: with two processes every check of a chain target in a
    worker and of the in-process reference has the n, p-value and verdict of the
    one-process run (fixed design, seed 0)."""
    names = TargetNames(("reference", "tests.wrong_verifiers:ratio_inverted"), False, (), (),
                        False, None, None)
    config = _config()
    one = run_audit(names.resolve(), config)
    runner = functools.partial(run_child_shard, config, names)
    two = run_audit(names.resolve(), config, jobs=2, shard_runner=runner)
    assert child_takes_shard_1 == [True]
    assert _outcome(one) == _outcome(two)
    assert [t.verdict for t in two.targets] == [t.verdict for t in one.targets]


def test_a_child_that_dies_costs_only_its_units(
    parallel_from_any_size: None, child_takes_shard_1: list[bool]
) -> None:
    """A child process that exits without a result: the shard it took (shard 1/3, the unit of
    v8-far) is ERROR with the exit code named; the shards the audit's own process took keep
    their checks (PASS for the reference)."""
    names = TargetNames(("reference",), False, (), (), False, None, None)
    result = run_audit(names.resolve(), _config(), jobs=2, shard_runner=_crashing_runner)
    checks = result.targets[0].checks
    errors = {c.case_id for c in checks if c.verdict is Verdict.ERROR and c.case_id != "run"}
    passed = {c.case_id for c in checks if c.verdict is Verdict.PASS}
    assert child_takes_shard_1 == [True]
    assert errors == {"v8-far"} and {"v2-tilted", "v16-near-k4"} <= passed, (errors, passed)
    assert all(
        "a child process exited (codes 7)" in c.message
        for c in checks
        if c.verdict is Verdict.ERROR and c.case_id == "v8-far"
    )


def test_small_plans_and_one_job_stay_in_one_process() -> None:
    """Below MIN_PARALLEL_STEPS planned steps an audit uses one process whatever --jobs
    says, and --jobs below 1 is refused naming the option."""
    names = TargetNames(("reference",), False, (), (), False, None, None)
    from losslessness.engine.plan import plan_run

    plan = plan_run(_config(), names.resolve(), None)
    assert plan.planned_steps(plan.units) < parallel.MIN_PARALLEL_STEPS
    assert parallel.parallel_jobs(plan, 8) == 1
    with pytest.raises(ValueError, match="--jobs"):
        parallel.parallel_jobs(plan, 0)


def test_shards_are_taken_end_to_end_first_then_by_planned_steps() -> None:
    """longest_first is a permutation of the unit grid: end-to-end units before the others,
    the rest in non-increasing planned steps (the default audit's plan, whose transformers
    units and generate loops are what two processes must spread)."""
    names = TargetNames((), False, (), (), False, None, None)
    plan = plan_run(RunConfig(), names.resolve(), None)
    order = parallel.longest_first(plan)
    units = {unit.index: unit for unit in plan.units}
    assert sorted(order) == sorted(units)
    kinds = [units[i].kind is UnitKind.END_TO_END for i in order]
    assert kinds == sorted(kinds, reverse=True) and any(kinds)
    rest = [
        plan.planned_steps([units[i]]) for i, first in zip(order, kinds, strict=True) if not first
    ]
    assert rest == sorted(rest, reverse=True)


@pytest.mark.parametrize(("cpus", "jobs", "threads"), [(2, 1, 2), (2, 2, 1), (2, 3, 1), (16, 3, 5)])
def test_each_job_gets_its_share_of_the_cpus_threads(
    monkeypatch: pytest.MonkeyPatch, cpus: int, jobs: int, threads: int
) -> None:
    """threads_per_job divides the available CPUs between the jobs, at least one thread each
    (two processes each on torch's default of one thread per CPU oversubscribe the cores)."""
    monkeypatch.setattr(parallel, "available_cpus", lambda: cpus)
    assert parallel.threads_per_job(jobs) == threads
    with pytest.raises(ValueError, match="--jobs"):
        parallel.threads_per_job(0)


def _recorded_threads(path: Path) -> set[int]:
    return {int(line) for line in path.read_text().split()}


def test_a_small_run_allowed_several_jobs_keeps_every_thread_in_its_targets_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--jobs 2 on a plan too small to split runs in one process: the target's worker gets
    all of this process's threads (it got half when the CLI divided them before it knew
    whether the run would split)."""
    record = tmp_path / "threads.txt"
    monkeypatch.setenv(THREADS_FILE, str(record))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        outcome = CliRunner().invoke(
            main, ["audit", "--jobs", "2", "--case", "v2-tilted", "--no-progress",
                   "tests.engine.thread_targets:counting_threads"],
        )
        assert torch.get_num_threads() == 2
    finally:
        shutdown_workers()
        torch.set_num_threads(threads)
    assert outcome.exit_code == 0, outcome.output
    assert _recorded_threads(record) == {2}


def test_a_split_run_divides_the_threads_of_its_targets_workers_and_gives_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a run is split between processes, this process and its targets' workers use
    their share of the threads (``threads_per_job``), now and after a worker restarts; then
    they get the count back."""
    record = tmp_path / "threads.txt"
    monkeypatch.setenv(THREADS_FILE, str(record))
    names = TargetNames(("tests.engine.thread_targets:counting_threads",), False, (), (),
                        False, None, None)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        plan = plan_run(_config(), names.resolve(), None)
        adapter = plan.adapters[0]
        worker = worker_of(adapter)
        assert worker is not None and adapter.chain is not None
        case = next(case for case in plan.chain_cases if case.case_id == "v2-tilted")
        sampler = functools.partial(ChainSampler, adapter.chain, case, 4, 0, None)
        parallel._use_threads(plan, 1)
        sampler().step()
        worker.kill()
        sampler().step()
        assert _recorded_threads(record) == {1} and torch.get_num_threads() == 1
        record.unlink()
        parallel._use_threads(plan, 2)
        sampler().step()
        assert _recorded_threads(record) == {2}
        with pytest.raises(ValueError, match="threads"):
            worker.set_threads(0)
    finally:
        shutdown_workers()
        torch.set_num_threads(threads)
