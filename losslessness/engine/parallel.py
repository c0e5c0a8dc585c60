"""An audit's shards in parallel processes on one machine (``losslessness audit --jobs N``).

The run's unit grid does not depend on how it is split (:mod:`losslessness.engine.plan`), so
shards ``i/M`` run anywhere merge to the one-process run count for count
(:func:`losslessness.engine.finish.finish_run`): this module only places them. The calling
process and ``N - 1`` child processes (started with ``spawn``: fresh interpreters sharing none
of the parent's torch or target state) take the shards, one unit each, one at a time from a
shared counter, longest first (:func:`longest_first`), so the processes end nearly together.
The calling process runs them with the targets it already resolved; a child resolves and plans
the run once through the caller's :data:`ShardRunner` and sends each finished
:class:`~losslessness.engine.shards.ShardResult` back through a pipe.

What a careful operator would want, and what this module does:

- A child that crashes, exits or raises, or whose plan differs from the parent's (a target
  that loads in one process and not the other), costs only the shard it was running (or all
  of its shards, for a different plan): their units are recorded as ERROR with the reason, and
  every other shard's results stand.
- An interruption of the parent (Ctrl-C or SIGTERM, :mod:`losslessness.engine.interrupts`)
  is passed on to each child as SIGTERM, which the child turns into the same interruption: it
  keeps what finished and records the rest INCOMPLETE, as one process would; shards no
  process took are INCOMPLETE too. A child ignores
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
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import torch

from losslessness.engine import interrupts
from losslessness.engine.plan import RunPlan, Unit, UnitKind
from losslessness.engine.scheduler import run_shard
from losslessness.engine.shards import FailureKind, ShardResult, ShardSpec, UnitRecord
from losslessness.engine.state import INTERRUPTED_MESSAGE, ProgressCallback
from losslessness.results import run_environment
from losslessness.worker import worker_of

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

EXIT_GRACE_S = 10.0
"""Seconds a child that sent its last message has to exit by itself (stopping its target
workers) before it is killed."""

_PR_SET_PDEATHSIG = 1


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS has one), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def threads_per_job(jobs: int) -> int:
    """Intra-op threads each of ``jobs`` processes gets: the available CPUs divided between
    them, at least 1. Without the division every process (and each of its target workers) takes
    torch's default of one thread per CPU: on 2 cores two jobs ran the default audit slower
    than one (tiny per-row ops are 3-12x slower on an oversubscribed pool).

    Raises:
        ValueError: ``jobs`` below 1 (the message names ``--jobs``).
    """
    if jobs < 1:
        raise ValueError(f"--jobs: must be >= 1, got {jobs}")
    return max(1, available_cpus() // jobs)


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


def _use_threads(plan: RunPlan, threads: int) -> None:
    """Give this process and its targets' workers ``threads`` intra-op threads: they are
    decided once the plan says how many processes run (a run that stays in one process keeps
    every thread)."""
    torch.set_num_threads(threads)
    for adapter in plan.adapters:
        worker = worker_of(adapter)
        if worker is not None:
            worker.set_threads(threads)


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def longest_first(plan: RunPlan) -> list[int]:
    """The order in which the processes take the shards (one unit each): end-to-end units
    first (a model's forward passes per step: seconds per hundred steps), then the others by
    planned steps, most first, ties in grid order. Longest-processing-time-first leaves at most
    about one unit's time between the processes' ends; taken in grid order, the default audit's
    largest transformers units came last and left one core idle.

    Returns:
        Shard indices (``ShardSpec(i, len(plan.units))`` runs unit ``i``), a permutation.
    """
    def cost(unit: Unit) -> tuple[bool, int, int]:
        return (unit.kind is not UnitKind.END_TO_END, -plan.planned_steps([unit]), unit.index)

    return [unit.index for unit in sorted(plan.units, key=cost)]


def _next_shard(counter: Any, order: list[int]) -> int | None:
    """Take the next shard index of ``order`` from the shared counter, or None when all are
    taken."""
    with counter.get_lock():
        position = int(counter.value)
        if position >= len(order):
            return None
        counter.value = position + 1
    return order[position]


def _child_main(
    runner: ShardRunner, order: list[int], counter: Any, connection: Connection, threads: int
) -> None:
    """A child's body: take shards from ``counter`` until none is left, sending
    ``("result", ShardResult)`` after each (what finished survives a later crash), or
    ``("error", index, traceback text)``; then ``("done", None)``. SIGTERM interrupts the
    shard in progress (finished units kept) and takes no more; SIGINT is ignored. The child,
    and the target workers it starts, use ``threads`` intra-op threads."""
    _die_with_parent()
    torch.set_num_threads(threads)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(
        signal.SIGTERM,
        lambda signum, frame: interrupts.interrupt(KeyboardInterrupt("SIGTERM from the audit")),
    )
    while interrupts.interrupted() is None and (index := _next_shard(counter, order)) is not None:
        interrupted = False
        try:
            result = runner(ShardSpec(index, len(order)))
            message: tuple[Any, ...] = ("result", result)
            interrupted = _was_interrupted(result)
        except BaseException:
            message = ("error", index, traceback.format_exc())
        # Plain pickle, by value: the multiprocessing pickler would pass tensors as file
        # descriptors that only a living child can serve.
        connection.send_bytes(pickle.dumps(message))
        if interrupted:
            break
    connection.send_bytes(pickle.dumps(("done", None)))
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
    """Whether a signal interrupted the shard: a unit left INCOMPLETE by it, or a chain unit
    whose stream it stopped (``interrupted``: its finished calls kept, not INCOMPLETE). The
    shard's run has forgotten the interruption by then (``interrupts.clear``), so this record
    is all that says to take no more shards."""
    return any(
        record.interrupted
        or (record.failure_kind is FailureKind.INCOMPLETE and record.failure == INTERRUPTED_MESSAGE)
        for record in result.units.values()
    )


class _Child:
    """One child process, its pipe, and what it has sent.

    A reader thread takes the child's messages off the pipe as they come: a shard's result is
    often larger than the pipe's buffer, and a child whose send waited for this process to
    finish its own shard sat idle for the length of that shard (the default audit on two
    processes ran barely faster than on one).
    """

    def __init__(self, process: BaseProcess, connection: Connection) -> None:
        self.process = process
        self.connection = connection
        self.results: dict[int, ShardResult] = {}
        self.errors: dict[int, str] = {}
        self.done = False
        self._inbox: queue.Queue[bytes | None] = queue.Queue()
        self._reader = threading.Thread(
            target=self._receive, name="losslessness-audit-shard-reader", daemon=True
        )
        self._reader.start()

    def _receive(self) -> None:
        """The reader thread: every message into the inbox, then None once the pipe ends."""
        try:
            while True:
                self._inbox.put(self.connection.recv_bytes())
        except (EOFError, OSError):
            self._inbox.put(None)

    def read(self, plan: RunPlan, wait: float) -> list[ShardResult]:
        """Read what the child sent within ``wait`` seconds; returns the new results."""
        new: list[ShardResult] = []
        while not self.done:
            try:
                data = self._inbox.get(timeout=wait) if wait > 0 else self._inbox.get_nowait()
            except queue.Empty:
                break
            wait = 0.0
            if data is None:
                self.done = True
                break
            message = pickle.loads(data)
            if message[0] == "done":
                self.done = True
            elif message[0] == "error":
                self.errors[message[1]] = message[2].strip()
            else:
                result: ShardResult = message[1]
                if result.fingerprint != plan.fingerprint:
                    self.errors[result.shard.index] = (
                        f"planned a different run (plan {result.fingerprint}, the audit's "
                        f"{plan.fingerprint}): a target loaded differently there"
                    )
                else:
                    self.results[result.shard.index] = result
                    new.append(result)
        return new

    def finish(self, plan: RunPlan, interrupted: bool) -> None:
        """Wait for the child's last message (after SIGTERM, at most :data:`CHILD_GRACE_S`),
        then make sure it is gone."""
        if interrupted and self.process.is_alive():
            self.process.terminate()
        deadline = time.monotonic() + CHILD_GRACE_S if interrupted else None
        while not self.done and (deadline is None or time.monotonic() < deadline):
            self.read(plan, 1.0)
            if (
                not self.done
                and not self.process.is_alive()
                and not self._reader.is_alive()
                and self._inbox.empty()
            ):
                break
        if self.done:
            # A child that sent its last message is exiting: its exit handlers stop its target
            # workers and unlink their shared memory. Killed at once, it left those blocks to
            # the resource tracker, which warned of "leaked shared_memory objects" at exit.
            self.process.join(timeout=EXIT_GRACE_S)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        # The child is gone, so its end of the pipe is closed and the reader sees the end.
        self._reader.join(timeout=CHILD_GRACE_S)
        self.connection.close()


def run_shards_in_processes(
    plan: RunPlan,
    jobs: int,
    runner: ShardRunner,
    work_dir: str | Path | None = None,
    progress: ProgressCallback | None = None,
) -> list[ShardResult]:
    """Run ``plan`` as one shard per unit, taken one at a time by this process and
    ``jobs - 1`` child processes from a shared counter in :func:`longest_first` order (a
    process that drew cheap units takes more).

    Args:
        plan: the run's plan (this process runs it as it is; children plan again and must
            reach the same fingerprint).
        jobs: N >= 1 processes.
        runner: runs shard ``i/M`` in a child (:data:`ShardRunner`).
        work_dir: where this process's property-suite units run.
        progress: told (steps done, steps planned, label) as this process's shards advance and
            as the children's shards arrive.

    Returns:
        One :class:`ShardResult` per shard, in shard order, together covering every unit (a
        failed child's shards recorded as ERROR, or INCOMPLETE when the run was
        interrupted); merge them with :func:`losslessness.engine.finish.finish_run`.

    Raises:
        ValueError: ``jobs`` below 1.
    """
    if jobs < 1:
        raise ValueError(f"jobs: must be >= 1, got {jobs}")
    count = max(1, len(plan.units))
    order = longest_first(plan) or [0]
    planned = plan.planned_steps(plan.units)
    context = multiprocessing.get_context("spawn")
    counter = context.Value("i", 0)
    children: list[_Child] = []
    finished = 0
    mine: dict[int, ShardResult] = {}

    def tell(done: int, _planned: int, label: str) -> None:
        if progress is not None:
            progress(finished + done, planned, label)

    def arrived(results: list[ShardResult]) -> None:
        nonlocal finished
        finished += sum(plan.planned_steps(_units_of(plan, r.shard)) for r in results)
        tell(0, planned, "")

    threads, share = torch.get_num_threads(), threads_per_job(jobs)
    _use_threads(plan, share)
    try:
        for _ in range(jobs - 1):
            receive, send = context.Pipe(duplex=False)
            process = context.Process(
                target=_child_main, args=(runner, order, counter, send, share),
                daemon=True,
                name="losslessness-audit-shards",
            )
            process.start()
            send.close()
            children.append(_Child(process, receive))
        interrupted = False
        while not interrupted and (index := _next_shard(counter, order)) is not None:
            spec = ShardSpec(index, count)
            result = run_shard(plan, spec, work_dir, tell)
            mine[index] = result
            finished += plan.planned_steps(_units_of(plan, spec))
            interrupted = _was_interrupted(result) or interrupts.interrupted() is not None
            for child in children:
                arrived(child.read(plan, 0.0))
        if interrupted:
            with counter.get_lock():
                counter.value = len(order)
        for child in children:
            interrupted = interrupted or interrupts.interrupted() is not None
            before = len(child.results)
            child.finish(plan, interrupted)
            arrived(list(child.results.values())[before:])
    finally:
        _use_threads(plan, threads)
        for child in children:
            if child.process.is_alive():
                child.process.kill()
                child.process.join()
    results: list[ShardResult] = []
    for index in range(count):
        spec = ShardSpec(index, count)
        if index in mine:
            results.append(mine[index])
            continue
        found = [child for child in children if index in child.results or index in child.errors]
        if found and index in found[0].results:
            results.append(found[0].results[index])
        elif found:
            results.append(_failed_shard(
                plan, spec, FailureKind.ERROR,
                f"audit shard {spec} (in a child process) raised: {found[0].errors[index]}",
            ))
        else:
            codes = ", ".join(str(child.process.exitcode) for child in children)
            kind = FailureKind.INCOMPLETE if interrupted else FailureKind.ERROR
            reason = (
                INTERRUPTED_MESSAGE if interrupted else
                f"audit shard {spec} was lost: a child process exited (codes {codes}) before "
                "returning its results"
            )
            results.append(_failed_shard(plan, spec, kind, reason))
    return results


def _units_of(plan: RunPlan, spec: ShardSpec) -> list[Any]:
    return [unit for unit in plan.units if spec.takes(unit.index)]


__all__ = [
    "CHILD_GRACE_S",
    "EXIT_GRACE_S",
    "MIN_PARALLEL_STEPS",
    "ShardRunner",
    "available_cpus",
    "longest_first",
    "parallel_jobs",
    "run_shards_in_processes",
    "threads_per_job",
]
