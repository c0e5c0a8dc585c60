"""Running a shard: the units shard ``i/N`` owns, in grid order (a target's chain units
interleaved), with a progress callback, a time budget's deadline and interruptions (Ctrl-C,
SIGTERM: :mod:`losslessness.engine.interrupts`).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

from losslessness.engine.chains import run_chain_units
from losslessness.engine.interrupts import clear, interruptible, note
from losslessness.engine.plan import RunPlan, UnitKind
from losslessness.engine.shards import FailureKind, ShardResult, ShardSpec, UnitRecord
from losslessness.engine.state import (
    INTERRUPTED_MESSAGE,
    ProgressCallback,
    ProgressTracker,
    ShardState,
)
from losslessness.engine.tables import concatenate_tables
from losslessness.engine.units import run_unit
from losslessness.results import run_environment
from losslessness.worker import release_engine


def _release_finished_engines(plan: RunPlan, last: dict[str, int], position: int) -> None:
    """Release every whole-engine target whose last unit of this shard lies before
    ``position`` (:func:`~losslessness.worker.release_engine`)."""
    for name, index in list(last.items()):
        if index >= position:
            continue
        del last[name]
        try:
            release_engine(plan.adapter(name))
        except KeyError:
            continue


def run_shard(
    plan: RunPlan,
    spec: ShardSpec,
    work_dir: str | Path | None = None,
    progress: ProgressCallback | None = None,
    deadline: float | None = None,
) -> ShardResult:
    """Run the units shard ``spec`` owns and keep their sufficient statistics.

    Args:
        plan: the run's plan (the same on every shard).
        spec: which shard.
        work_dir: where the property suite runs (``work_dir/suite/...``); default the
            current directory.
        progress: optional callback (steps done, steps planned, label).
        deadline: ``time.perf_counter()`` value at which sampling stops (the time budget):
            every chain and tree case keeps the steps it drew, and its checks report the
            minimum detectable TV those reach; a unit not begun by then is not sampled.

    Returns:
        :class:`ShardResult` (save it with :func:`losslessness.engine.shards.save_shard`).
    """
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    began = time.perf_counter()
    mine = [unit for unit in plan.units if spec.takes(unit.index)]
    tracker = ProgressTracker(progress, plan.planned_steps(mine))
    state = ShardState(
        plan, tracker, Path(work_dir) if work_dir is not None else Path.cwd(), spec, deadline
    )
    for unit in mine:
        warm_up = plan.warm_up.tables.get((unit.target, unit.case_id))
        if unit.kind is UnitKind.CHAIN and unit.chunk == 0 and warm_up:
            # The time budget's warm-up calls are checked with the case's own (first in its
            # table): a verifier wrong only on its first calls is caught as without a budget.
            state.chunks[(unit.target, unit.case_id)] = list(warm_up)
    records: dict[int, UnitRecord] = {}
    interrupted = False
    position = 0
    last = {unit.target: index for index, unit in enumerate(mine)}
    while position < len(mine):
        _release_finished_engines(plan, last, position)
        unit = mine[position]
        if unit.kind is UnitKind.CHAIN and not interrupted and unit.target not in state.hung:
            # A target's chain units are consecutive in the grid: they run interleaved.
            group = [unit]
            while (
                position + len(group) < len(mine)
                and mine[position + len(group)].kind is UnitKind.CHAIN
                and mine[position + len(group)].target == unit.target
            ):
                group.append(mine[position + len(group)])
            try:
                with interruptible():
                    run_chain_units(state, group, records)
            except KeyboardInterrupt as error:
                interrupted = True
                note(error)
            for member in group:
                if member.index not in records:
                    records[member.index] = UnitRecord.of(
                        member, FailureKind.INCOMPLETE, INTERRUPTED_MESSAGE
                    )
            position += len(group)
            continue
        position += 1
        tracker.label = f"{unit.target} {unit.case_id}".strip()
        unit_began = time.perf_counter()
        if interrupted:
            record = UnitRecord.of(unit, FailureKind.INCOMPLETE, INTERRUPTED_MESSAGE)
        elif unit.target in state.hung:
            record = UnitRecord.of(
                unit,
                FailureKind.ERROR,
                f"skipped: the target hung on an earlier call ({state.hung[unit.target]})",
            )
        else:
            record = UnitRecord.of(unit)
            try:
                with interruptible():
                    run_unit(state, unit, record)
            except KeyboardInterrupt as error:
                # Ctrl-C: keep what finished, record this unit and the rest as not run.
                interrupted = True
                note(error)
                record = UnitRecord.of(unit, FailureKind.INCOMPLETE, INTERRUPTED_MESSAGE)
        record.wall_time_s = time.perf_counter() - unit_began
        records[unit.index] = record
    _release_finished_engines(plan, last, position)
    # The interruption is in the records now: a later run in this process starts clean.
    clear()
    tracker.label = "done"
    tracker.advance(0)
    return ShardResult(
        plan=plan.record,
        shard=spec,
        units=records,
        tables={key: concatenate_tables(parts) for key, parts in sorted(state.chunks.items())},
        cases={case.case_id: case for case in plan.chain_cases},
        environment=run_environment(),
        started_at=started,
        wall_time_s=time.perf_counter() - began,
    )


