"""An audit's shards in parallel processes on one machine (``losslessness audit --jobs N``).

The run's unit grid does not depend on how it is split (:mod:`losslessness.engine.plan`), so
shards ``0/N .. N-1/N`` run side by side merge to the one-process run count for count
(:func:`losslessness.engine.finish.finish_run`): this module only places them. Shard 0 runs
in the calling process with the targets it already resolved (its progress is the one shown);
shards ``1..N-1`` each run in a child process started with ``spawn`` (a fresh interpreter:
nothing of the parent's torch or target state is shared), which resolves and plans the run
again through the caller's :data:`ShardRunner` and sends its
:class:`~losslessness.engine.shards.ShardResult` back through a pipe.

What a careful operator would want, and what this module does:

- A child that crashes, exits or raises before sending its result, or whose plan differs from
  the parent's (a target that loads in one process and not the other), costs only its own
  units: each is recorded as ERROR with the reason, and every other shard's results stand.
- An interruption of the parent (Ctrl-C or SIGTERM, :mod:`losslessness.engine.interrupts`)
  is passed on to each child as SIGTERM, which the child turns into the same interruption: it
  keeps what finished and records the rest INCOMPLETE, as one process would. A child ignores
  SIGINT itself (a terminal's Ctrl-C reaches the whole process group; the parent decides).
- Children die with the parent (``PR_SET_PDEATHSIG`` where Linux has it); no process outlives
  the call.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from losslessness.engine import interrupts
from losslessness.engine.plan import RunPlan
from losslessness.engine.scheduler import run_shard
from losslessness.engine.shards import FailureKind, ShardResult, ShardSpec, UnitRecord
from losslessness.engine.state import INTERRUPTED_MESSAGE, ProgressCallback
from losslessness.results import run_environment

ShardRunner = Callable[[ShardSpec], ShardResult]
"""Runs one shard in a child process: resolves the targets, plans the run and calls
:func:`~losslessness.engine.scheduler.run_shard`. It must pickle (a module-level function, or
a ``functools.partial`` of one over picklable arguments)."""

MIN_PARALLEL_STEPS = 100_000
"""Planned verify steps below which an audit stays in one process: a child's start (a fresh
interpreter importing torch, then its own target workers) takes about 5-10 s of CPU on two
cores, more than a run this small saves (the reference verifies about 10^5 steps per second)."""

CHILD_GRACE_S = 60.0
"""Seconds an interrupted child has, after SIGTERM, to send the results it finished before it
is killed (a target call in progress may first have to end or time out)."""

_PR_SET_PDEATHSIG = 1


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def parallel_jobs(plan: RunPlan, jobs: int) -> int:
    """How many processes an audit of ``plan`` uses when allowed ``jobs``: 1 below
    :data:`MIN_PARALLEL_STEPS` planned steps, else at most one per unit.

    Raises:
        ValueError: ``jobs`` below 1 (the message names ``--jobs``).
    """
    if jobs < 1:
        raise ValueError(f"--jobs: must be >= 1, got {jobs}")
    if plan.planned_steps(plan.units) < MIN_PARALLEL_STEPS:
        return 1
    return max(1, min(jobs, len(plan.units)))


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _child_main(runner: ShardRunner, spec: ShardSpec, connection: Connection) -> None:
    """A child's body: SIGTERM interrupts its shard (finished units kept), SIGINT is ignored;
    sends ``("result", ShardResult)`` or ``("error", traceback text)``."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(
        signal.SIGTERM,
        lambda signum, frame: interrupts.interrupt(KeyboardInterrupt("SIGTERM from the audit")),
    )
    try:
        message: tuple[str, Any] = ("result", runner(spec))
    except BaseException:
        message = ("error", traceback.format_exc())
    # Plain pickle, by value: the multiprocessing pickler would pass tensors as file
    # descriptors that only a living child can serve.
    connection.send_bytes(pickle.dumps(message))
    connection.close()


def _failed_shard(plan: RunPlan, spec: ShardSpec, kind: FailureKind, reason: str) -> ShardResult:
    """The result of a shard that returned nothing: each of its units recorded with ``kind``."""
    units = {
        unit.index: UnitRecord.of(unit, kind, reason)
        for unit in plan.units
        if spec.takes(unit.index)
    }
    return ShardResult(
        plan=plan.record,
        shard=spec,
        units=units,
        tables={},
        cases={case.case_id: case for case in plan.chain_cases},
        environment=run_environment(),
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        wall_time_s=0.0,
    )


def _was_interrupted(result: ShardResult) -> bool:
    return any(
        record.failure_kind is FailureKind.INCOMPLETE and record.failure == INTERRUPTED_MESSAGE
        for record in result.units.values()
    )


def _collect(
    plan: RunPlan, spec: ShardSpec, process: BaseProcess, connection: Connection,
    interrupted: bool,
) -> ShardResult:
    """Wait for a child's message (interrupting it first when the parent was) and turn every
    way it can fail into ERROR (INCOMPLETE when interrupted) records of its units."""
    deadline: float | None = None
    message: tuple[str, Any] | None = None
    while message is None:
        if deadline is None and (interrupted or interrupts.interrupted() is not None):
            # Interrupted before or while waiting: the child keeps what it finished.
            interrupted = True
            if process.is_alive():
                process.terminate()
            deadline = time.monotonic() + CHILD_GRACE_S
        wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        if connection.poll(wait):
            try:
                message = pickle.loads(connection.recv_bytes())
            except (EOFError, OSError):
                break
        elif not process.is_alive() or (deadline is not None and time.monotonic() > deadline):
            break
    if process.is_alive():
        process.kill()
    process.join()
    kind = FailureKind.INCOMPLETE if interrupted else FailureKind.ERROR
    where = f"audit shard {spec} (a child process)"
    if message is None:
        return _failed_shard(
            plan, spec, kind,
            f"{where} exited with code {process.exitcode} before returning its results",
        )
    tag, value = message
    if tag == "error":
        return _failed_shard(plan, spec, kind, f"{where} raised: {value.strip()}")
    result: ShardResult = value
    if result.fingerprint != plan.fingerprint:
        return _failed_shard(
            plan, spec, FailureKind.ERROR,
            f"{where} planned a different run (plan {result.fingerprint}, the audit's "
            f"{plan.fingerprint}): a target loaded differently there",
        )
    return result


def run_shards_in_processes(
    plan: RunPlan,
    jobs: int,
    runner: ShardRunner,
    work_dir: str | Path | None = None,
    progress: ProgressCallback | None = None,
) -> list[ShardResult]:
    """Run shards ``0/jobs .. jobs-1/jobs`` of ``plan``: shard 0 here, the others in child
    processes through ``runner``.

    Args:
        plan: the run's plan (shard 0 runs it as it is; children plan again and must reach
            the same fingerprint).
        jobs: N >= 1 processes (1: just :func:`run_shard` here).
        runner: runs shard ``i/N`` in a child (:data:`ShardRunner`).
        work_dir: where shard 0's property-suite units run.
        progress: shard 0's progress callback.

    Returns:
        The N :class:`ShardResult` in shard order, each complete (a failed child's units
        recorded as ERROR or INCOMPLETE); merge them with
        :func:`losslessness.engine.finish.finish_run`.

    Raises:
        ValueError: ``jobs`` below 1.
    """
    if jobs < 1:
        raise ValueError(f"jobs: must be >= 1, got {jobs}")
    specs = [ShardSpec(index, jobs) for index in range(jobs)]
    context = multiprocessing.get_context("spawn")
    children: list[tuple[ShardSpec, BaseProcess, Connection]] = []
    try:
        for spec in specs[1:]:
            receive, send = context.Pipe(duplex=False)
            process = context.Process(
                target=_child_main, args=(runner, spec, send), daemon=True,
                name=f"losslessness-audit-shard-{spec.index}",
            )
            process.start()
            send.close()
            children.append((spec, process, receive))
        mine = run_shard(plan, specs[0], work_dir, progress)
        interrupted = _was_interrupted(mine) or interrupts.interrupted() is not None
        return [mine] + [
            _collect(plan, spec, process, connection, interrupted)
            for spec, process, connection in children
        ]
    finally:
        for _, child, pipe in children:
            if child.is_alive():
                child.kill()
                child.join()
            pipe.close()


__all__ = [
    "CHILD_GRACE_S",
    "MIN_PARALLEL_STEPS",
    "ShardRunner",
    "available_cpus",
    "parallel_jobs",
    "run_shards_in_processes",
]
