"""Sampling the chain units of one target: its cases' chunks interleaved call by call, each
case with its sequential monitor when the run stops early on evidence, each chunk kept as a
count table and a unit record.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from losslessness.cases import ChainCase
from losslessness.checks.sequential import ChainMonitor
from losslessness.engine.draw import ChainSampler, ProtocolViolation
from losslessness.engine.plan import ChainCasePlan, Unit, UnitKind
from losslessness.engine.shards import FailureKind, UnitRecord
from losslessness.engine.state import (
    INTERRUPTED_MESSAGE,
    ShardState,
    check_context,
    record_target_error,
)
from losslessness.engine.tables import chunk_table
from losslessness.reference.block import BLOCK_VERIFICATION


@dataclass
class _ChainStream:
    """One chain case of one target in this shard: its chunk units, sampled call by call."""

    units: list[Unit]
    case: ChainCase
    grid: ChainCasePlan
    monitor: ChainMonitor | None
    records: dict[int, UnitRecord] = field(default_factory=dict)
    position: int = 0
    sampler: ChainSampler | None = None
    record: UnitRecord | None = None
    chunk_time_s: float = 0.0
    time_s: float = 0.0
    steps_done: int = 0
    done: bool = False


def _chain_monitor(state: ShardState, unit: Unit, case: ChainCase) -> ChainMonitor | None:
    plan = state.plan.record
    if not plan.config.early_stop:
        return None
    grid = plan.chain_cases[case.case_id]
    shards = {
        other.index % state.spec.count
        for other in plan.units
        if other.kind is UnitKind.CHAIN
        and (other.target, other.case_id) == (unit.target, unit.case_id)
    }
    verification = next(how for name, _, how in plan.targets if name == unit.target)
    context = check_context(
        plan, unit.target, case.case_id, case.summary, case.case_hash, grid.seed, case.n_rows
    )
    return ChainMonitor(
        case,
        grid.n_steps,
        plan.alpha_split.sequential,
        context,
        shards=len(shards),
        block_decisions=verification == BLOCK_VERIFICATION,
    )


def _redraw_with_fresh_inputs(state: ShardState, stream: _ChainStream) -> ChainSampler:
    """The verifier wrote into its reused inputs, so the current chunk's calls so far saw
    corrupted p and q: redraw them (same seed, same call schedule, so the same drafts and
    uniforms) with fresh inputs per call, make the redrawn sampler the stream's (the chunk's
    later calls get fresh inputs too), and let the monitor look at the redrawn steps alone.
    Nothing decided on the corrupted calls survives."""
    sampler, unit = stream.sampler, stream.units[stream.position]
    assert sampler is not None
    adapter = state.plan.adapter(unit.target)
    assert adapter.chain is not None
    again = ChainSampler(adapter.chain, stream.case, unit.steps, sampler.seed,
                         state.plan.config.timeout_s, ramp=sampler.ramp, fresh_inputs=True)
    while again.calls < sampler.calls:
        again.step()
    stream.sampler = again
    if stream.monitor is not None:
        stream.monitor.reset()
        done = again.done
        stream.monitor.update(again.outputs[:, :done], again.drafts[:, :done],
                              again.samples().pairs)
    return again


def _finish_chunk(state: ShardState, stream: _ChainStream, stopped: str | None) -> None:
    """Close the stream's current chunk: its table, its record (with the monitor's evidence
    and why it stopped early, if it did)."""
    sampler, record, unit = stream.sampler, stream.record, stream.units[stream.position]
    assert sampler is not None and record is not None
    if not sampler.inputs_intact():
        sampler = _redraw_with_fresh_inputs(state, stream)
    samples = sampler.samples()
    record.verify_steps = samples.n_steps * stream.case.n_rows
    record.verifier_calls = samples.calls
    record.verifier_time_s = samples.verifier_time_s
    record.wall_time_s = stream.chunk_time_s
    if stream.monitor is not None:
        record.sequential = stream.monitor.evidence()
    if stopped is not None:
        record.stopped, record.planned_steps = stopped, unit.steps
    state.chunks.setdefault((unit.target, unit.case_id), []).append(chunk_table(samples))
    stream.records[unit.index] = record
    stream.sampler, stream.record = None, None
    stream.position += 1


def _close_stream(state: ShardState, stream: _ChainStream, reason: str) -> None:
    """Stop ``stream`` for ``reason``: its current chunk keeps what it sampled, its later chunks
    are recorded as not sampled (:attr:`FailureKind.STOPPED`)."""
    if stream.sampler is not None:
        if stream.sampler.done:
            _finish_chunk(state, stream, reason)
        else:
            stream.sampler = None
    for unit in stream.units[stream.position:]:
        stream.records[unit.index] = UnitRecord.of(
            unit, FailureKind.STOPPED, f"not sampled: {reason}"
        )
    stream.position = len(stream.units)
    stream.done = True


def _advance_stream(state: ShardState, stream: _ChainStream) -> None:
    """One verifier call of ``stream`` (starting its next chunk when needed)."""
    unit = stream.units[stream.position]
    config = state.plan.config
    if stream.sampler is None:
        adapter = state.plan.adapter(unit.target)
        assert adapter.chain is not None
        stream.record = UnitRecord.of(unit)
        stream.chunk_time_s = 0.0
        stream.sampler = ChainSampler(
            adapter.chain, stream.case, unit.steps, stream.grid.chunk_seed(unit.chunk),
            config.timeout_s, ramp=True,
        )
    sampler, record = stream.sampler, stream.record
    assert record is not None
    began = time.perf_counter()
    try:
        start, m = sampler.step()
    except ProtocolViolation as violation:
        record.failure_kind = FailureKind.PROTOCOL
        record.failure = f"chunk {unit.chunk}: {violation}"
        if config.early_stop:
            state.decided.setdefault(unit.target, f"{unit.case_id}: malformed output")
        _fail_stream(stream, record)
        return
    except Exception as error:
        record_target_error(state, record, error)
        _fail_stream(stream, record)
        return
    finally:
        stream.time_s += time.perf_counter() - began
        stream.chunk_time_s += time.perf_counter() - began
    stream.steps_done += m
    stop = None
    if stream.monitor is not None:
        outputs = sampler.outputs[:, start : start + m]
        drafts = sampler.drafts[:, start : start + m]
        decided = stream.monitor.update(outputs, drafts, sampler.call_pairs(start, m))
        if decided and not sampler.inputs_intact():
            # Evidence from calls whose inputs the verifier overwrote decides nothing: the
            # chunk so far is redrawn with fresh inputs and the monitor judges those steps.
            sampler = _redraw_with_fresh_inputs(state, stream)
            decided = stream.monitor.decision is not None
        if decided:
            decision = stream.monitor.decision
            assert decision is not None
            stop = f"LOSSY: {decision.reason}"
            state.decided.setdefault(unit.target, f"{unit.case_id}: {decision.reason}")
    state.tracker.advance(m * stream.case.n_rows)
    if stop is not None:
        _close_stream(state, stream, stop)
    elif sampler.finished:
        _finish_chunk(state, stream, None)
        stream.done = stream.position == len(stream.units)


def _fail_stream(stream: _ChainStream, record: UnitRecord) -> None:
    """The current chunk failed (``record`` says how): it and every later chunk of the stream
    are recorded with that failure."""
    unit = stream.units[stream.position]
    record.wall_time_s = stream.chunk_time_s
    stream.records[unit.index] = record
    stream.position += 1
    assert record.failure_kind is not None
    _abandon(stream, record.failure_kind, str(record.failure))


def _abandon(stream: _ChainStream, kind: FailureKind, message: str) -> None:
    """Record the stream's unfinished chunks (its current one's samples dropped) as ``kind``."""
    for unit in stream.units[stream.position:]:
        stream.records[unit.index] = UnitRecord.of(unit, kind, message)
    stream.sampler, stream.record = None, None
    stream.position = len(stream.units)
    stream.done = True


def _chain_status(
    state: ShardState, target: str, current: _ChainStream, streams: Sequence[_ChainStream]
) -> str:
    """The progress line of a target's chain sampling: the case being sampled, the verdict so
    far, the running minimum detectable TV and the time left.

    The running TV is the design TV scaled by ``sqrt(planned / drawn)`` of the least-sampled
    case (identity tests' detectable TV falls as ``1 / sqrt(n)``): an approximation for the
    display; every result reports the exact value at its n."""
    tv = state.plan.config.tv
    verdict = f"LOSSY ({state.decided[target]})" if target in state.decided else "no violation yet"
    reached = max(
        tv * math.sqrt(stream.grid.n_steps / max(stream.steps_done, 1)) for stream in streams
    )
    left = state.tracker.seconds_left(state.deadline)
    when = f"{left:.0f} s left" if left is not None else "time left unknown"
    return (
        f"{target} {current.case.case_id} | {verdict} | min TV ~{min(reached, 1.0):.3g} "
        f"(design {tv:.3g}) | {when}"
    )


def run_chain_units(
    state: ShardState, units: Sequence[Unit], records: dict[int, UnitRecord]
) -> None:
    """Sample the chain units of one target, its cases interleaved call by call (the case that
    has spent the least time goes next), so that a sequential stop on any case comes after
    about the time that case needs, whatever the battery's order. A case's chunks run in
    order. The samples do not depend on the interleaving: every case draws from its own
    seeds."""
    plan = state.plan
    cases = {case.case_id: case for case in plan.chain_cases}
    streams: dict[str, _ChainStream] = {}
    for unit in units:
        if unit.case_id not in streams:
            case = cases[unit.case_id]
            streams[unit.case_id] = _ChainStream(
                [], case, plan.record.chain_cases[unit.case_id],
                _chain_monitor(state, unit, case),
            )
        streams[unit.case_id].units.append(unit)
    target = units[0].target
    for stream in streams.values():
        violation = plan.warm_up.violations.get((target, stream.case.case_id))
        if violation is not None and stream.units[0].chunk == 0:
            # A time budget's warm-up call of the case was malformed: the case fails as it
            # would had the call been one of its own.
            record = UnitRecord.of(stream.units[0], FailureKind.PROTOCOL, violation)
            if plan.config.early_stop:
                state.decided.setdefault(target, f"{stream.case.case_id}: malformed output")
            _fail_stream(stream, record)
    try:
        while True:
            active = [stream for stream in streams.values() if not stream.done]
            if not active:
                break
            if target in state.hung:
                for stream in active:
                    message = f"skipped: the target hung ({state.hung[target]})"
                    _abandon(stream, FailureKind.ERROR, message)
                continue
            if target in state.decided:
                for stream in active:
                    _close_stream(state, stream, f"target already LOSSY ({state.decided[target]})")
                continue
            if state.deadline is not None and time.perf_counter() >= state.deadline:
                for stream in active:
                    _close_stream(state, stream, "time budget spent")
                continue
            stream = min(active, key=lambda s: s.time_s)
            state.tracker.label = _chain_status(state, target, stream, list(streams.values()))
            _advance_stream(state, stream)
    except KeyboardInterrupt:
        # Ctrl-C: every case keeps the calls it finished (its checks run on them), and the
        # target cannot be LOSSLESS (its units are marked interrupted).
        for stream in streams.values():
            if stream.done:
                continue
            _close_stream(state, stream, INTERRUPTED_MESSAGE)
            for unit in stream.units:
                record = stream.records[unit.index]
                if record.failure_kind is FailureKind.STOPPED:
                    record.failure_kind = FailureKind.INCOMPLETE
                else:
                    record.interrupted = True
        raise
    finally:
        for stream in streams.values():
            records.update(stream.records)


