"""Running a plan: a shard's units into count tables and unit records, then one finish that
runs every chain check once on the merged tables and builds the :class:`AuditResult`.

The audit is shard ``0/1`` of a plan at the CI budget followed by the finish; the nightly is
the same run at a multiple of the budget, in chunks, split into any number of shards. N shards
merged give the same count tables, statistics, p-values and verdicts as one run: the checks only
ever see merged tables, and the chunk grid (not the shard count) decides every sample.

Faults never stop a run: a target that raises or returns malformed output is an ERROR (LOSSY
for malformed output) for that case's checks; a call that outlasts ``config.timeout_s`` is an
ERROR, and every later unit of that target (its property suite too) is skipped as ERROR without
calling it again (a hung target would hang again); a unit whose optional package is missing is
UNAVAILABLE. A target that raises :class:`~losslessness.adapters.NotApplicable` for a case shape
it cannot take by design (vLLM's FLy at k = 1) gets that case's checks SKIPPED with the reason
(``not applicable: ...``), neither ERROR nor PASS; its other checks decide its verdict.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from losslessness.adapters import Adapter, NotApplicable
from losslessness.batteries import (
    default_chain_battery,
    default_greedy_battery,
    default_greedy_tree_battery,
    default_tree_battery,
)
from losslessness.cases import ChainCase
from losslessness.checks import malformed_output_result, run_chain_checks, run_tree_checks
from losslessness.checks.greedy import check_greedy
from losslessness.checks.ids import (
    GREEDY_CHECK_ID,
    PVALUES_CHECK_ID,
    SAMPLED_CHAIN_CHECK_IDS,
    TREE_CHECK_IDS,
    TREE_GREEDY_CHECK_ID,
    TREE_STRUCTURE_CHECK_ID,
)
from losslessness.checks.pvalues import check_pvalue_uniformity
from losslessness.checks.sequential import (
    ChainMonitor,
    attach_sequential_evidence,
    evidence_to_json,
    merged_evidence,
)
from losslessness.checks.tree_greedy import check_tree_greedy
from losslessness.checks.tree_sequential import TreeMonitor
from losslessness.config import RunConfig
from losslessness.engine.draw import (
    ChainSampler,
    ProtocolViolation,
    TargetTimeout,
    sample_greedy,
    sample_greedy_tree,
    sample_tree,
)
from losslessness.engine.end_to_end import (
    EndToEndPlan,
    end_to_end_checks,
    sample_end_to_end,
)
from losslessness.engine.plan import (
    ChainCasePlan,
    PlanRecord,
    RunPlan,
    UnavailableTarget,
    Unit,
    end_to_end_check_ids,
    plan_run,
    resolve_targets,
)
from losslessness.engine.shards import (
    MergedShards,
    ShardResult,
    ShardSpec,
    UnitRecord,
    merge_shards,
)
from losslessness.engine.tables import CountTable, chunk_table, concatenate_tables, expand_table
from losslessness.reference.block import BLOCK_VERIFICATION
from losslessness.results import (
    SCHEMA_VERSION,
    AuditResult,
    CheckContext,
    CheckKind,
    CheckResult,
    TargetResult,
    TargetVerdict,
    Verdict,
    run_environment,
    target_verdict,
)
from losslessness.stats import SUITE_FAMILY_WISE_ALPHA

INCOMPLETE = "incomplete"
"""``UnitRecord.failure_kind`` of a unit the run did not finish (interrupted)."""

INTERRUPTED_MESSAGE = "not run: the run was interrupted (Ctrl-C) before this unit finished"

STOPPED = "stopped"
"""``UnitRecord.failure_kind`` of a chain chunk the run did not sample because its case or its
target was already decided LOSSY (sequential early stop): not an error, and the case's checks
run on the chunks that were sampled."""

NOT_APPLICABLE = "not-applicable"
"""``UnitRecord.failure_kind`` of a unit whose target raised :class:`NotApplicable`: its checks
are SKIPPED with ``UnitRecord.failure`` (``not applicable: <reason>``) as the message."""

ProgressCallback = Callable[[int, int, str], None]
"""Called with (steps done, steps planned, label of the current unit)."""

DEVICE_CHECKS_MODULE = "losslessness.engine.device"
"""Where the device-check unit's ``run_device_checks`` lives (imported on use: torch CUDA
and the GPU adapters load there)."""


def _failure_message(error: BaseException) -> str:
    if isinstance(error, TargetTimeout):
        return f"target hung: {error}"
    where = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    location = f" at {where.filename}:{where.lineno}" if where else ""
    return f"target raised {type(error).__name__}: {error}{location}"


def load_device_checks() -> tuple[Callable[..., Any] | None, str | None]:
    """``run_device_checks`` of :data:`DEVICE_CHECKS_MODULE`, or None and why it is missing."""
    try:
        module = importlib.import_module(DEVICE_CHECKS_MODULE)
    except ImportError as error:
        return None, f"{DEVICE_CHECKS_MODULE} does not import: {error}"
    function = getattr(module, "run_device_checks", None)
    if function is None:
        return None, f"{DEVICE_CHECKS_MODULE} has no run_device_checks"
    checks: Callable[..., Any] = function
    return checks, None


def make_plan(config: RunConfig, greedy: bool = False) -> RunPlan:
    """Resolve ``config.targets`` (every registered adapter when empty), look for the device
    checks when the config asks for them, and plan the run.

    Raises:
        ValueError: unknown or repeated target names, or unknown case ids.
    """
    adapters, unavailable = resolve_targets(config.targets, greedy=greedy)
    note = load_device_checks()[1] if config.device_checks else None
    return plan_run(config, [*adapters, *unavailable], note)


@dataclass
class _Tracker:
    callback: ProgressCallback | None
    planned: int
    done: int = 0
    label: str = ""
    began: float = field(default_factory=time.perf_counter)

    def seconds_left(self, deadline: float | None) -> float | None:
        """Seconds to the deadline, else extrapolated from the pace so far (None before
        any step)."""
        now = time.perf_counter()
        if deadline is not None:
            return max(0.0, deadline - now)
        if not self.done:
            return None
        return (now - self.began) / self.done * max(0, self.planned - self.done)

    def advance(self, steps: int) -> None:
        self.done += steps
        if self.callback is not None:
            self.callback(self.done, self.planned, self.label)


@dataclass
class _ShardState:
    plan: RunPlan
    tracker: _Tracker
    work_dir: Path
    spec: ShardSpec = field(default_factory=lambda: ShardSpec(0, 1))
    deadline: float | None = None
    hung: dict[str, str] = field(default_factory=dict)
    decided: dict[str, str] = field(default_factory=dict)
    chunks: dict[tuple[str, str], list[CountTable]] = field(default_factory=dict)


def _target_error(state: _ShardState, record: UnitRecord, error: BaseException) -> None:
    if isinstance(error, NotApplicable):
        record.failure_kind, record.failure = NOT_APPLICABLE, error.skip_message
        return
    record.failure_kind, record.failure = "error", _failure_message(error)
    if isinstance(error, TargetTimeout):
        state.hung[record.target] = record.failure


def _untested(
    context: CheckContext, record: UnitRecord, check_ids: Sequence[str]
) -> list[CheckResult]:
    """The results of checks a failed unit could not run: SKIPPED when the target refused the
    case as not applicable, ERROR otherwise, with the unit's failure as the message."""
    verdict = Verdict.SKIPPED if record.failure_kind == NOT_APPLICABLE else Verdict.ERROR
    return [context.untested(check_id, verdict, str(record.failure)) for check_id in check_ids]


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


def _chain_monitor(state: _ShardState, unit: Unit, case: ChainCase) -> ChainMonitor | None:
    plan = state.plan.record
    if not plan.config.early_stop:
        return None
    grid = plan.chain_cases[case.case_id]
    shards = {
        other.index % state.spec.count
        for other in plan.units
        if other.kind == "chain" and other.target == unit.target and other.case_id == unit.case_id
    }
    verification = next(how for name, _, how in plan.targets if name == unit.target)
    context = _context(plan, unit.target, case.case_id, case.summary, case.case_hash, grid.seed,
                       case.n_rows)
    return ChainMonitor(
        case,
        grid.n_steps,
        plan.alpha_split.sequential,
        context,
        shards=len(shards),
        block_decisions=verification == BLOCK_VERIFICATION,
    )


def _finish_chunk(state: _ShardState, stream: _ChainStream, stopped: str | None) -> None:
    """Close the stream's current chunk: its table, its record (with the monitor's evidence
    and why it stopped early, if it did)."""
    sampler, record, unit = stream.sampler, stream.record, stream.units[stream.position]
    assert sampler is not None and record is not None
    if not sampler.inputs_intact():
        # The verifier wrote into its reused inputs: every sample of the chunk is redrawn with
        # fresh inputs per call, and the monitor looks at them once.
        adapter = state.plan.adapter(unit.target)
        assert adapter.chain is not None
        again = ChainSampler(adapter.chain, stream.case, sampler.done, sampler.seed,
                             state.plan.config.timeout_s, ramp=sampler.ramp, fresh_inputs=True)
        while not again.finished:
            again.step()
        sampler = again
        if stream.monitor is not None:
            stream.monitor.reset()
            stream.monitor.update(sampler.outputs, sampler.drafts,
                                  sampler.samples().pairs)
    samples = sampler.samples()
    record.verify_steps = samples.n_steps * stream.case.n_rows
    record.verifier_calls = samples.calls
    record.verifier_time_s = samples.verifier_time_s
    record.wall_time_s = stream.chunk_time_s
    if stream.monitor is not None:
        record.extra["sequential"] = evidence_to_json(stream.monitor.evidence())
    if stopped is not None:
        record.extra["stopped"] = stopped
        record.extra["planned_steps"] = unit.steps
    state.chunks.setdefault((unit.target, unit.case_id), []).append(chunk_table(samples))
    stream.records[unit.index] = record
    stream.sampler, stream.record = None, None
    stream.position += 1


def _close_stream(state: _ShardState, stream: _ChainStream, reason: str) -> None:
    """Stop ``stream`` for ``reason``: its current chunk keeps what it sampled, its later chunks
    are recorded as not sampled (:data:`STOPPED`)."""
    if stream.sampler is not None:
        if stream.sampler.done:
            _finish_chunk(state, stream, reason)
        else:
            stream.sampler = None
    for unit in stream.units[stream.position:]:
        record = UnitRecord(unit.index, unit.key, unit.kind, unit.target, unit.case_id, unit.chunk)
        record.failure_kind, record.failure = STOPPED, f"not sampled: {reason}"
        stream.records[unit.index] = record
    stream.position = len(stream.units)
    stream.done = True


def _advance_stream(state: _ShardState, stream: _ChainStream) -> None:
    """One verifier call of ``stream`` (starting its next chunk when needed)."""
    unit = stream.units[stream.position]
    config = state.plan.config
    if stream.sampler is None:
        adapter = state.plan.adapter(unit.target)
        assert adapter.chain is not None
        stream.record = UnitRecord(
            unit.index, unit.key, unit.kind, unit.target, unit.case_id, unit.chunk
        )
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
        record.failure_kind, record.failure = "protocol", f"chunk {unit.chunk}: {violation}"
        if config.early_stop:
            state.decided.setdefault(unit.target, f"{unit.case_id}: malformed output")
        _fail_stream(stream, record)
        return
    except Exception as error:
        _target_error(state, record, error)
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
        if stream.monitor.update(outputs, drafts, sampler.call_pairs(start, m)):
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
    _abandon(stream, str(record.failure_kind), str(record.failure))


def _abandon(stream: _ChainStream, kind: str, message: str) -> None:
    """Record the stream's unfinished chunks (its current one's samples dropped) as ``kind``."""
    for unit in stream.units[stream.position:]:
        record = UnitRecord(unit.index, unit.key, unit.kind, unit.target, unit.case_id, unit.chunk)
        record.failure_kind, record.failure = kind, message
        stream.records[unit.index] = record
    stream.sampler, stream.record = None, None
    stream.position = len(stream.units)
    stream.done = True


def _chain_status(
    state: _ShardState, target: str, current: _ChainStream, streams: Sequence[_ChainStream]
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


def _run_chain_units(
    state: _ShardState, units: Sequence[Unit], records: dict[int, UnitRecord]
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
    try:
        while True:
            active = [stream for stream in streams.values() if not stream.done]
            if not active:
                break
            if target in state.hung:
                for stream in active:
                    _abandon(stream, "error", f"skipped: the target hung ({state.hung[target]})")
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
                if record.failure_kind == STOPPED:
                    record.failure_kind = INCOMPLETE
                else:
                    record.extra["interrupted"] = True
        raise
    finally:
        for stream in streams.values():
            records.update(stream.records)


def _context(
    plan: PlanRecord,
    target: str,
    case_id: str,
    summary: str,
    case_hash: str,
    seed: int,
    n_rows: int = 1,
) -> CheckContext:
    config = plan.config
    return CheckContext(
        target=target,
        case_id=case_id,
        case_summary=summary,
        case_hash=case_hash,
        alpha=plan.per_assertion_alpha,
        power=config.power,
        tv=config.tv,
        seed=seed,
        n_rows=n_rows,
    )


def _run_greedy_unit(state: _ShardState, unit: Unit, record: UnitRecord) -> None:
    plan = state.plan
    adapter = plan.adapter(unit.target)
    assert adapter.greedy is not None
    case = next(case for case in plan.greedy_cases if case.case_id == unit.case_id)
    context = _context(plan.record, unit.target, case.case_id, case.summary, case.case_hash, 0)
    began = time.perf_counter()
    try:
        outputs = sample_greedy(adapter.greedy, case, plan.config.timeout_s)
    except ProtocolViolation as violation:
        record.checks = [malformed_output_result(context, violation, GREEDY_CHECK_ID)]
        return
    except Exception as error:
        _target_error(state, record, error)
        record.checks = _untested(context, record, [GREEDY_CHECK_ID])
        return
    finally:
        record.verifier_time_s = time.perf_counter() - began
        state.tracker.advance(case.batch_size)
    record.verify_steps = case.batch_size
    record.verifier_calls = 1
    record.checks = [check_greedy(outputs, case, context)]


def _run_tree_unit(state: _ShardState, unit: Unit, record: UnitRecord) -> None:
    plan = state.plan
    adapter = plan.adapter(unit.target)
    assert adapter.tree is not None
    case = next(case for case in plan.tree_cases if case.case_id == unit.case_id)
    grid = plan.record.tree_cases[unit.case_id]
    context = _context(plan.record, unit.target, case.case_id, case.summary, case.case_hash,
                       grid.seed)
    context = dataclasses.replace(context, alpha=plan.record.alpha_split.fixed)
    selected = [c for c in TREE_CHECK_IDS if plan.config.selects(c)]
    if unit.target in state.decided:
        record.failure_kind = STOPPED
        record.failure = f"not sampled: target already LOSSY ({state.decided[unit.target]})"
        record.checks = [context.untested(c, Verdict.SKIPPED, record.failure) for c in selected]
        return
    monitor = (
        TreeMonitor(case, unit.steps, plan.record.alpha_split.sequential, context)
        if plan.config.early_stop
        else None
    )
    began = time.perf_counter()
    try:
        samples = sample_tree(
            adapter.tree,
            case,
            unit.steps,
            grid.seed,
            plan.config.timeout_s,
            progress=state.tracker.advance,
            monitor=monitor.update if monitor is not None else None,
        )
    except ProtocolViolation as violation:
        record.checks = [malformed_output_result(context, violation, TREE_STRUCTURE_CHECK_ID)]
        record.verifier_time_s = time.perf_counter() - began
        return
    except Exception as error:
        _target_error(state, record, error)
        record.checks = _untested(context, record, selected)
        record.verifier_time_s = time.perf_counter() - began
        return
    record.verify_steps = samples.n_steps
    record.verifier_calls = samples.calls
    record.verifier_time_s = samples.verifier_time_s
    context = dataclasses.replace(context, sampling_time_s=samples.wall_time_s)
    results = run_tree_checks(samples, context)
    reason = None
    if monitor is not None:
        if monitor.decision is not None:
            reason = monitor.decision.reason
            record.extra["stopped"] = f"LOSSY: {reason}"
            state.decided.setdefault(unit.target, f"{unit.case_id}: {reason}")
        evidence = monitor.evidence()
        record.extra["sequential"] = evidence_to_json(evidence)
        attach_sequential_evidence(results, evidence, reason)
    for result in results:
        result.details.update(
            steps=samples.n_steps, capped=grid.capped, ci_steps=grid.ci_steps,
            needed_steps=grid.needed_steps, planned_steps=grid.n_steps,
        )
        if reason is not None:
            result.details["stopped"] = f"LOSSY: {reason}"
    record.checks = [result for result in results if plan.config.selects(result.check_id)]


def _run_greedy_tree_unit(state: _ShardState, unit: Unit, record: UnitRecord) -> None:
    plan = state.plan
    adapter = plan.adapter(unit.target)
    assert adapter.greedy_tree is not None
    case = next(case for case in plan.greedy_tree_cases if case.case_id == unit.case_id)
    context = _context(plan.record, unit.target, case.case_id, case.summary, case.case_hash, 0)
    began = time.perf_counter()
    try:
        tokens, nodes = sample_greedy_tree(adapter.greedy_tree, case, plan.config.timeout_s)
    except ProtocolViolation as violation:
        record.checks = [malformed_output_result(context, violation, TREE_GREEDY_CHECK_ID)]
        return
    except Exception as error:
        _target_error(state, record, error)
        record.checks = _untested(context, record, [TREE_GREEDY_CHECK_ID])
        return
    finally:
        record.verifier_time_s = time.perf_counter() - began
        state.tracker.advance(case.batch_size)
    record.verify_steps = case.batch_size
    record.verifier_calls = 1
    record.checks = [check_tree_greedy(tokens, nodes, case, context)]


def _end_to_end_entry(plan: RunPlan, unit: Unit) -> EndToEndPlan:
    return next(
        entry for entry in plan.end_to_end[unit.target] if entry.target.name == unit.case_id
    )


def _run_end_to_end_unit(state: _ShardState, unit: Unit, record: UnitRecord) -> None:
    plan = state.plan
    entry = _end_to_end_entry(plan, unit)
    target = entry.target
    context = _context(
        plan.record, unit.target, target.name, target.description, entry.case_hash, entry.seed
    )
    selected = [c for c in end_to_end_check_ids(target) if plan.config.selects(c)]
    if isinstance(entry.error, NotApplicable):
        record.failure_kind, record.failure = NOT_APPLICABLE, entry.error.skip_message
    elif entry.error is not None:
        record.failure_kind, record.failure = "error", _failure_message(entry.error)
    else:
        try:
            samples = sample_end_to_end(entry, state.tracker.advance, plan.config.timeout_s)
        except Exception as error:
            _target_error(state, record, error)
        else:
            context = dataclasses.replace(context, sampling_time_s=samples.wall_time_s)
            checks = end_to_end_checks(entry, samples, context)
            record.checks = [check for check in checks if plan.config.selects(check.check_id)]
            record.verify_steps = int(checks[-1].details.get("verify_steps", 0))
            record.verifier_calls = len(samples.sequences)
            record.verifier_time_s = samples.inside_s
            return
    record.checks = _untested(context, record, selected)


def _run_device_unit(state: _ShardState, unit: Unit, record: UnitRecord) -> None:
    plan = state.plan.record
    run_device_checks, note = load_device_checks()
    if run_device_checks is None:
        record.failure_kind, record.failure = "error", note
        return
    try:
        checks, unavailable = run_device_checks(
            plan.config.device,
            plan.device_steps,
            plan.config.seed,
            plan.device_alpha,
        )
    except Exception as error:
        record.failure_kind, record.failure = "error", _failure_message(error)
    else:
        record.checks = list(checks)
        record.extra["unavailable"] = [[name, reason] for name, reason in unavailable]


def _run_suite_unit(state: _ShardState, unit: Unit, record: UnitRecord) -> None:
    from losslessness.engine.suite import run_suite, suite_unavailable_reason

    reason = suite_unavailable_reason()
    if reason is not None:
        record.failure_kind, record.failure = "unavailable", reason
        return
    folder = re.sub(r"[^A-Za-z0-9_.-]", "_", unit.target)
    outcome = run_suite(
        state.plan.adapter(unit.target),
        state.plan.config.suite_profile,
        state.work_dir / "suite" / folder,
    )
    record.checks = outcome.checks
    record.extra = {
        "returncode": outcome.returncode,
        "command": outcome.command,
        "junit_xml": outcome.junit_xml,
        "output_tail": outcome.output_tail,
    }


_UNIT_RUNNERS = {
    "greedy": _run_greedy_unit,
    "tree": _run_tree_unit,
    "greedy-tree": _run_greedy_tree_unit,
    "end-to-end": _run_end_to_end_unit,
    "device": _run_device_unit,
    "suite": _run_suite_unit,
}


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
        deadline: ``time.perf_counter()`` value at which chain sampling stops (the time
            budget): every case keeps the steps it drew, and its checks report the minimum
            detectable TV those reach.

    Returns:
        :class:`ShardResult` (save it with :func:`losslessness.engine.shards.save_shard`).
    """
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    began = time.perf_counter()
    mine = [unit for unit in plan.units if spec.takes(unit.index)]
    tracker = _Tracker(progress, plan.planned_steps(mine))
    state = _ShardState(
        plan, tracker, Path(work_dir) if work_dir is not None else Path.cwd(), spec, deadline
    )
    records: dict[int, UnitRecord] = {}
    interrupted = False
    position = 0
    while position < len(mine):
        unit = mine[position]
        if unit.kind == "chain" and not interrupted and unit.target not in state.hung:
            # A target's chain units are consecutive in the grid: they run interleaved.
            group = [unit]
            while (
                position + len(group) < len(mine)
                and mine[position + len(group)].kind == "chain"
                and mine[position + len(group)].target == unit.target
            ):
                group.append(mine[position + len(group)])
            try:
                _run_chain_units(state, group, records)
            except KeyboardInterrupt:
                interrupted = True
            for member in group:
                if member.index not in records:
                    record = UnitRecord(member.index, member.key, member.kind, member.target,
                                        member.case_id, member.chunk)
                    record.failure_kind, record.failure = INCOMPLETE, INTERRUPTED_MESSAGE
                    records[member.index] = record
            position += len(group)
            continue
        position += 1
        tracker.label = f"{unit.target} {unit.case_id}".strip()
        record = UnitRecord(unit.index, unit.key, unit.kind, unit.target, unit.case_id, unit.chunk)
        unit_began = time.perf_counter()
        if interrupted:
            record.failure_kind, record.failure = INCOMPLETE, INTERRUPTED_MESSAGE
        elif unit.target in state.hung:
            record.failure_kind = "error"
            record.failure = (
                f"skipped: the target hung on an earlier call ({state.hung[unit.target]})"
            )
        else:
            try:
                _UNIT_RUNNERS[unit.kind](state, unit, record)
            except KeyboardInterrupt:
                # Ctrl-C: keep what finished, record this unit and the rest as not run.
                interrupted = True
                record = UnitRecord(
                    unit.index, unit.key, unit.kind, unit.target, unit.case_id, unit.chunk
                )
                record.failure_kind, record.failure = INCOMPLETE, INTERRUPTED_MESSAGE
        record.wall_time_s = time.perf_counter() - unit_began
        records[unit.index] = record
    tracker.label = "done"
    tracker.advance(0)
    return ShardResult(
        plan=plan.record,
        shard=spec,
        units=records,
        tables={key: concatenate_tables(parts) for key, parts in sorted(state.chunks.items())},
        environment=run_environment(),
        started_at=started,
        wall_time_s=time.perf_counter() - began,
    )


@dataclass
class RunResult:
    """A finished run.

    Attributes:
        audit: the :class:`AuditResult` the reports render (targets, unavailable targets,
            device checks grouped by their target, property-suite runs as ``suite:<target>``).
        summary: JSON-able record of the run: plan, budgets, shards, suite runs.
        suite_junit: pytest's junit XML of each suite run, by target.
        tables: the merged count tables, by (target, case id).
    """

    audit: AuditResult
    summary: dict[str, Any]
    suite_junit: dict[str, str] = field(default_factory=dict)
    tables: dict[tuple[str, str], CountTable] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """The audit's exit code."""
        return self.audit.exit_code


def _battery_cases(plan: PlanRecord) -> dict[str, ChainCase]:
    cases = {case.case_id: case for case in default_chain_battery()}
    for case_id, grid in plan.chain_cases.items():
        if case_id not in cases or cases[case_id].case_hash != grid.case_hash:
            raise ValueError(
                f"plan: battery case {case_id!r} differs from this losslessness's battery "
                "(merge with the version that ran the shards)"
            )
    greedy = {case.case_id: case.case_hash for case in default_greedy_battery()}
    for case_id, case_hash in plan.greedy_cases.items():
        if greedy.get(case_id) != case_hash:
            raise ValueError(
                f"plan: greedy case {case_id!r} differs from this losslessness's battery "
                "(merge with the version that ran the shards)"
            )
    tree = {case.case_id: case.case_hash for case in default_tree_battery()}
    tree |= {case.case_id: case.case_hash for case in default_greedy_tree_battery()}
    recorded = {case_id: grid.case_hash for case_id, grid in plan.tree_cases.items()}
    for case_id, case_hash in (recorded | plan.greedy_tree_cases).items():
        if tree.get(case_id) != case_hash:
            raise ValueError(
                f"plan: tree case {case_id!r} differs from this losslessness's tree battery "
                "(merge with the version that ran the shards)"
            )
    return cases


def replay_command(plan: PlanRecord, check: CheckResult, greedy: bool = False) -> str | None:
    """The command that redraws exactly the samples behind ``check`` and recomputes its test
    (its p-value; its significance level is that of a run of the replayed case alone), or None
    where no command can (device comparisons, suite runs replay with their pytest command).

    A chain check's command names the steps its case drew (fewer than planned when the case
    stopped early) and ``--no-early-stop``, so the replay draws all of them whatever its own
    level; a check made LOSSY by its sequential test gets back its samples and fixed-n p-value
    (its e-value is in the record)."""
    config = plan.config
    grid = plan.chain_cases.get(check.case_id)
    if (
        check.check_id in ("coupling", "two-sample", "precision", "suite", PVALUES_CHECK_ID)
        or "@" in check.target
    ):
        return None
    command = f"losslessness audit {check.target}"
    if greedy and check.check_id == GREEDY_CHECK_ID:
        command += " --greedy"
    if check.check_id.startswith("tree.") and greedy:
        # A pkg.module:callable audited as a tree verifier is named by its option.
        option = "--tree-greedy" if check.check_id == TREE_GREEDY_CHECK_ID else "--tree"
        command = f"losslessness audit {option} {check.target}"
    command += f" --seed {config.seed} --case {check.case_id} --only {check.check_id}"
    tree_grid = plan.tree_cases.get(check.case_id)
    steps = (
        check.details.get("steps", grid.n_steps) if grid is not None
        else tree_grid.n_steps if tree_grid is not None
        else check.details.get("steps")
    )
    if steps:
        command += f" --steps {steps}"
    if grid is not None and grid.n_chunks > 1:
        command += f" --chunk-steps {grid.chunk_steps}"
    if grid is not None:
        # The steps the case drew, every one of them: a replay never stops on its own
        # evidence (its level, and so its stopping point, depends on what it selects).
        command += " --no-early-stop"
    return command


def _chain_checks(
    merged: MergedShards,
    target: str,
    case: ChainCase,
    units: Sequence[UnitRecord],
    verification: str,
) -> list[CheckResult]:
    plan = merged.plan
    grid: ChainCasePlan = plan.chain_cases[case.case_id]
    context = _context(
        plan, target, case.case_id, case.summary, case.case_hash, grid.seed, case.n_rows
    )
    context = dataclasses.replace(
        context,
        alpha=plan.alpha_split.fixed,
        sampling_time_s=sum(u.wall_time_s for u in units),
    )
    failures = sorted(
        (unit for unit in units if unit.failure_kind not in (None, INCOMPLETE, STOPPED)),
        key=lambda unit: unit.index,
    )
    protocol = [unit for unit in failures if unit.failure_kind == "protocol"]
    if protocol:
        return [malformed_output_result(context, protocol[0].failure)]
    selected = [c for c in SAMPLED_CHAIN_CHECK_IDS if plan.config.selects(c)]
    errors = [unit for unit in failures if unit.failure_kind != NOT_APPLICABLE]
    if errors:
        message = str(errors[0].failure)
        return [context.untested(check_id, Verdict.ERROR, message) for check_id in selected]
    if failures:
        # The target refused the case's shape (NotApplicable): nothing was sampled.
        message = str(failures[0].failure)
        return [context.untested(check_id, Verdict.SKIPPED, message) for check_id in selected]
    stopped = [unit for unit in units if unit.failure_kind == STOPPED]
    if (target, case.case_id) not in merged.tables:
        # Interrupted, or stopped (its target decided, the time budget spent), before any
        # chunk of the case was sampled.
        message = str(stopped[0].failure) if stopped else INTERRUPTED_MESSAGE
        return [context.untested(check_id, Verdict.SKIPPED, message) for check_id in selected]
    samples = expand_table(
        merged.tables[(target, case.case_id)], case, grid.seed, grid.steps_per_call
    )
    samples.wall_time_s = context.sampling_time_s
    samples.verifier_time_s = sum(unit.verifier_time_s for unit in units)
    samples.calls = sum(unit.verifier_calls for unit in units)
    results = run_chain_checks(samples, context, verification)
    reasons = [str(unit.extra["stopped"]) for unit in units if "stopped" in unit.extra]
    reasons += [str(unit.failure) for unit in stopped]
    for result in results:
        result.details.update(
            steps=samples.n_steps,
            capped=grid.capped,
            ci_steps=grid.ci_steps,
            chunk_steps=grid.chunk_steps,
            n_chunks=grid.n_chunks,
            planned_steps=grid.n_steps,
        )
        if reasons:
            result.details["stopped"] = reasons[0]
    evidence = merged_evidence([unit.extra.get("sequential", []) for unit in units])
    attach_sequential_evidence(results, evidence, reasons[0] if reasons else None)
    return [result for result in results if plan.config.selects(result.check_id)]


def _pvalues_check(
    plan: PlanRecord, target: str, checks: Sequence[CheckResult], complete: bool
) -> CheckResult:
    """The run-level uniformity test of ``target``'s law p-values (one assertion of the
    budget); ERROR when another check of the target crashed (its p-values are incomplete),
    SKIPPED when the run was interrupted or the target stopped early on evidence (the sizes of
    its samples then depend on the data; a stop at the time budget's deadline does not, and
    the test runs)."""
    config = plan.config
    context = CheckContext(
        target=target,
        case_id="run",
        case_summary="the run's independent law p-values against U(0, 1)",
        case_hash="",
        alpha=plan.per_assertion_alpha,
        power=config.power,
        tv=config.tv,
        seed=config.seed,
    )
    stopped = any(
        str(check.details.get("stopped", "")).startswith("LOSSY") for check in checks
    )
    crashed = any(check.verdict is Verdict.ERROR for check in checks)
    if crashed or not complete or stopped:
        return context.result(
            PVALUES_CHECK_ID,
            kind=CheckKind.STATISTICAL,
            n=0,
            verdict=Verdict.ERROR if crashed else Verdict.SKIPPED,
            min_detectable_tv=float("inf"),
            message="not run: "
            + (
                "other checks of the target crashed, so its p-values are incomplete"
                if crashed
                else "the run was interrupted or the target stopped early on evidence"
            ),
        )
    return check_pvalue_uniformity(checks, context)


def _stopped_early(
    groups: dict[tuple[str, str], list[UnitRecord]], verify_steps: int
) -> str | None:
    """Why a target's chain sampling stopped before its plan, said once for the target."""
    stops = [
        (case_id, str(unit.extra["stopped"]))
        for (kind, case_id), units in groups.items()
        if kind in ("chain", "tree")
        for unit in units
        if "stopped" in unit.extra
    ]
    reasons = [reason for _, reason in stops]
    lossy = [(case_id, reason) for case_id, reason in stops if reason.startswith("LOSSY: ")]
    if lossy:
        case_id, reason = lossy[0]
        return (
            f"LOSSY after {verify_steps} verify steps ({case_id}: "
            f"{reason.removeprefix('LOSSY: ')})"
        )
    if reasons:
        return f"{reasons[0]} after {verify_steps} verify steps"
    return None


def _add_totals(result: TargetResult, units: Sequence[UnitRecord]) -> None:
    for unit in units:
        result.wall_time_s += unit.wall_time_s
        result.verify_steps += unit.verify_steps
        result.verifier_calls += unit.verifier_calls
        result.verifier_time_s += unit.verifier_time_s


def finish_run(shards: Sequence[ShardResult]) -> RunResult:
    """Merge ``shards`` and run every check once on the merged statistics.

    Raises:
        ShardMergeError: shards of different plans, duplicate or missing units.
        ValueError: the battery differs from the one the shards sampled.
    """
    began = time.perf_counter()
    merged = merge_shards(list(shards))
    plan = merged.plan
    config = plan.config
    cases = _battery_cases(plan)
    by_target: dict[str, dict[tuple[str, str], list[UnitRecord]]] = {}
    device_units: list[UnitRecord] = []
    suite_units: dict[str, UnitRecord] = {}
    for _, unit in sorted(merged.units.items()):
        if unit.kind == "device":
            device_units.append(unit)
        elif unit.kind == "suite":
            suite_units[unit.target] = unit
        else:
            group = by_target.setdefault(unit.target, {})
            group.setdefault((unit.kind, unit.case_id), []).append(unit)
    targets: list[TargetResult] = []
    for name, description, verification in plan.targets:
        result = TargetResult(name, description, TargetVerdict.LOSSLESS)
        complete = True
        for (kind, case_id), units in by_target.get(name, {}).items():
            complete &= all(
                unit.failure_kind != INCOMPLETE and not unit.extra.get("interrupted")
                for unit in units
            )
            if kind == "chain":
                result.checks += _chain_checks(merged, name, cases[case_id], units, verification)
            else:
                result.checks += [check for unit in units for check in unit.checks]
            _add_totals(result, units)
        if name in plan.pvalues_targets:
            result.checks.append(_pvalues_check(plan, name, result.checks, complete))
        result.stopped_early = _stopped_early(by_target.get(name, {}), result.verify_steps)
        result.verdict = target_verdict(result.checks, complete)
        if result.verdict is TargetVerdict.UNAVAILABLE:
            result.error = (
                f"nothing tested: all {len(result.checks)} checks SKIPPED "
                f"({result.checks[0].message})"
            )
        targets.append(result)
    # A target the user named must load (ERROR); registered adapters whose package or device
    # is missing on this machine are listed but decide nothing.
    for name, reason, named in plan.unavailable:
        missing = TargetVerdict.ERROR if named else TargetVerdict.UNAVAILABLE
        targets.append(TargetResult(name, "unavailable", missing, error=reason))
    targets += _device_results(device_units, config)
    suite_junit = {}
    for name, unit in suite_units.items():
        if unit.failure_kind is not None:
            verdict = {
                "unavailable": TargetVerdict.UNAVAILABLE,
                INCOMPLETE: TargetVerdict.INCOMPLETE,
            }.get(unit.failure_kind, TargetVerdict.ERROR)
            targets.append(
                TargetResult(
                    f"suite:{name}",
                    f"property suite on {name}",
                    verdict,
                    error=unit.failure,
                    wall_time_s=unit.wall_time_s,
                )
            )
            continue
        replay = " ".join(str(part) for part in unit.extra.get("command", [])) or None
        for check in unit.checks:
            check.replay = replay
        targets.append(
            TargetResult(
                f"suite:{name}",
                f"property suite on {name}, Hypothesis profile {config.suite_profile!r}",
                target_verdict(unit.checks),
                unit.checks,
                wall_time_s=unit.wall_time_s,
            )
        )
        suite_junit[name] = str(unit.extra.get("junit_xml", ""))
    greedy_callables = {name for name, _, _ in plan.targets if ":" in name}
    for target in targets:
        for check in target.checks:
            if check.replay is None and not target.name.startswith("suite:"):
                check.replay = replay_command(plan, check, target.name in greedy_callables)
    audit = AuditResult(
        schema_version=SCHEMA_VERSION,
        config=config,
        n_assertions=plan.n_assertions,
        per_assertion_alpha=plan.per_assertion_alpha,
        targets=targets,
        wall_time_s=sum(shard.wall_time_s for shard in merged.shards) + time.perf_counter() - began,
        started_at=min(shard.started_at for shard in merged.shards),
        environment={**merged.shards[0].environment, **_run_environment(merged)},
    )
    summary = _summary(merged, audit, time.perf_counter() - began)
    return RunResult(audit, summary, suite_junit, merged.tables)


def _device_results(units: Sequence[UnitRecord], config: RunConfig) -> list[TargetResult]:
    results: list[TargetResult] = []
    for unit in units:
        grouped: dict[str, list[CheckResult]] = {}
        for check in unit.checks:
            grouped.setdefault(check.target, []).append(check)
        for name, checks in grouped.items():
            result = TargetResult(
                name, f"device checks on {config.device}", target_verdict(checks), checks
            )
            result.wall_time_s = sum(check.wall_time_s for check in checks)
            results.append(result)
        if unit.failure:
            results.append(
                TargetResult(
                    f"device-checks@{config.device}",
                    "coupling and precision checks",
                    TargetVerdict.INCOMPLETE
                    if unit.failure_kind == INCOMPLETE
                    else TargetVerdict.ERROR,
                    error=unit.failure,
                )
            )
        for name, reason in unit.extra.get("unavailable", []):
            results.append(
                TargetResult(
                    f"{name}@{config.device}",
                    "unavailable",
                    TargetVerdict.UNAVAILABLE,
                    error=reason,
                )
            )
    return results


def _suite_alpha() -> float:
    return SUITE_FAMILY_WISE_ALPHA


def _run_environment(merged: MergedShards) -> dict[str, str]:
    plan = merged.plan
    config = plan.config
    if config.step_multiplier == 1 and len(merged.shards) == 1 and not plan.suite_targets:
        return {}
    suites = len(plan.suite_targets)
    suite_alpha = _suite_alpha() if suites else 0.0
    bound = config.family_wise_alpha + suites * suite_alpha
    return {
        "run": (
            f"steps x{config.step_multiplier:g} of the CI plan on {config.device}; "
            f"{len(merged.shards)} shard(s) merged; plan {merged.fingerprint[:12]}"
        ),
        "error budget": (
            f"battery {plan.battery_alpha:.3g} over {plan.n_assertions} assertions "
            f"({plan.per_assertion_alpha:.3g} each); device checks {plan.device_alpha:.3g}; "
            f"property suite {suite_alpha:g} per target x {suites}; whole run <= {bound:.3g}"
        ),
    }


def _summary(merged: MergedShards, audit: AuditResult, merge_time_s: float) -> dict[str, Any]:
    plan = merged.plan
    suites = [
        {
            "target": unit.target,
            "returncode": unit.extra.get("returncode"),
            "command": unit.extra.get("command"),
            "wall_time_s": unit.wall_time_s,
            "unavailable": unit.failure if unit.failure_kind == "unavailable" else None,
            "verdicts": [check.verdict.value for check in unit.checks],
        }
        for unit in merged.units.values()
        if unit.kind == "suite"
    ]
    suite_alpha = _suite_alpha() if plan.suite_targets else 0.0
    return {
        "fingerprint": merged.fingerprint,
        "plan": plan.to_json(),
        "exit_code": audit.exit_code,
        "error_budget": {
            "battery_alpha": plan.battery_alpha,
            "n_assertions": plan.n_assertions,
            "per_assertion_alpha": plan.per_assertion_alpha,
            "device_alpha": plan.device_alpha,
            "suite_alpha_per_target": suite_alpha,
            "run_bound": plan.config.family_wise_alpha + len(plan.suite_targets) * suite_alpha,
        },
        "shards": [
            {
                "source": shard.source,
                "shard": str(shard.shard),
                "units": sorted(shard.units),
                "started_at": shard.started_at,
                "wall_time_s": shard.wall_time_s,
                "environment": shard.environment,
            }
            for shard in merged.shards
        ],
        "tables": {
            f"{target}/{case_id}": {"records": table.n_records, "distinct": len(table.counts)}
            for (target, case_id), table in merged.tables.items()
        },
        "suite": suites,
        "merge_time_s": merge_time_s,
    }


def run_audit(
    targets: Sequence[Adapter | UnavailableTarget],
    config: RunConfig | None = None,
    progress: ProgressCallback | None = None,
    work_dir: str | Path | None = None,
    announce: Callable[[str], None] | None = None,
) -> AuditResult:
    """Audit every target: plan (fitted to ``config.time_budget_s`` when set), run as one
    shard, finish.

    Args:
        targets: adapters to audit, or :class:`UnavailableTarget` placeholders (recorded as
            ERROR so that the run's record says what could not be audited).
        config: the design; defaults to :class:`RunConfig` () (the CI budget, one chunk per
            case, no device checks or suite).
        progress: optional callback (steps done, steps planned, current label).
        work_dir: where suite units run, when the config has them.
        announce: called with the time budget's claim before sampling (with a budget).

    Returns:
        :class:`AuditResult`; ``exit_code`` gives the CLI's exit status (its environment
        carries the time budget's claim under ``"time budget"``).

    Raises:
        ValueError: unknown case ids in ``config.cases``.
    """
    config = config or RunConfig()
    note = load_device_checks()[1] if config.device_checks else None
    plan, deadline, claim = plan_within_budget(config, targets, note, announce)
    audit = finish_run([run_shard(plan, ShardSpec(0, 1), work_dir, progress, deadline)]).audit
    if claim is not None:
        audit.environment["time budget"] = claim
    return audit


def make_budgeted_plan(
    config: RunConfig, greedy: bool = False, announce: Callable[[str], None] | None = None
) -> tuple[RunPlan, float | None, str | None]:
    """:func:`make_plan`, fitted to ``config.time_budget_s`` when set
    (:func:`plan_within_budget`).

    Raises:
        ValueError: unknown or repeated target names, or unknown case ids.
    """
    adapters, unavailable = resolve_targets(config.targets, greedy=greedy)
    note = load_device_checks()[1] if config.device_checks else None
    return plan_within_budget(config, [*adapters, *unavailable], note, announce)


def plan_within_budget(
    config: RunConfig,
    targets: Sequence[Adapter | UnavailableTarget],
    device_note: str | None = None,
    announce: Callable[[str], None] | None = None,
) -> tuple[RunPlan, float | None, str | None]:
    """The run's plan; with a time budget, fitted to it first
    (:func:`losslessness.engine.time_budget.fit_time_budget`, its claim passed to ``announce``
    before any sampling).

    Returns:
        (the plan; the ``time.perf_counter()`` deadline of chain sampling, or None; the
        budget's claim, or None).
    """
    if config.time_budget_s is None:
        return plan_run(config, targets, device_note), None, None
    from losslessness.engine.time_budget import DEADLINE_FRACTION, fit_time_budget

    began = time.perf_counter()
    fit = fit_time_budget(config, targets, device_note)
    if announce is not None:
        announce(fit.claim)
    plan = plan_run(fit.config, targets, device_note)
    # The budget counts from the end of the warm-up: the fit's own search is inside it.
    deadline = began + fit.warm_up_s + DEADLINE_FRACTION * config.time_budget_s
    return plan, deadline, fit.claim
