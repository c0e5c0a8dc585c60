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
import re
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from losslessness.adapters import Adapter, NotApplicable
from losslessness.cases import ChainCase
from losslessness.checks import malformed_output_result, run_chain_checks
from losslessness.checks.greedy import check_greedy
from losslessness.checks.ids import (
    GREEDY_CHECK_ID,
    SAMPLED_CHAIN_CHECK_IDS,
    TREE_CHECK_IDS,
    TREE_GREEDY_CHECK_ID,
    TREE_STRUCTURE_CHECK_ID,
)
from losslessness.checks.tree import check_tree_greedy, run_tree_checks
from losslessness.design import RunConfig
from losslessness.engine.battery import default_chain_battery, default_greedy_battery
from losslessness.engine.draw import (
    ProtocolViolation,
    TargetTimeout,
    sample_chain,
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
from losslessness.engine.tree_battery import default_greedy_tree_battery, default_tree_battery
from losslessness.results import (
    SCHEMA_VERSION,
    AuditResult,
    CheckContext,
    CheckResult,
    TargetResult,
    TargetVerdict,
    Verdict,
    run_environment,
    target_verdict,
)

INCOMPLETE = "incomplete"
"""``UnitRecord.failure_kind`` of a unit the run did not finish (interrupted)."""

INTERRUPTED_MESSAGE = "not run: the run was interrupted (Ctrl-C) before this unit finished"

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

    def advance(self, steps: int) -> None:
        self.done += steps
        if self.callback is not None:
            self.callback(self.done, self.planned, self.label)


@dataclass
class _ShardState:
    plan: RunPlan
    tracker: _Tracker
    work_dir: Path
    hung: dict[str, str] = field(default_factory=dict)
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


def _run_chain_unit(state: _ShardState, unit: Unit, record: UnitRecord) -> None:
    plan = state.plan
    adapter = plan.adapter(unit.target)
    assert adapter.chain is not None
    case = next(case for case in plan.chain_cases if case.case_id == unit.case_id)
    grid = plan.record.chain_cases[unit.case_id]
    try:
        samples = sample_chain(
            adapter.chain,
            case,
            unit.steps,
            grid.chunk_seed(unit.chunk),
            progress=lambda m: state.tracker.advance(m * case.n_rows),
            timeout_s=plan.config.timeout_s,
        )
    except ProtocolViolation as violation:
        record.failure_kind, record.failure = "protocol", f"chunk {unit.chunk}: {violation}"
        return
    except Exception as error:
        _target_error(state, record, error)
        return
    record.verify_steps = unit.steps * case.n_rows
    record.verifier_calls = samples.calls
    record.verifier_time_s = samples.verifier_time_s
    state.chunks.setdefault((unit.target, unit.case_id), []).append(chunk_table(samples))


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
    selected = [c for c in TREE_CHECK_IDS if plan.config.selects(c)]
    began = time.perf_counter()
    try:
        samples = sample_tree(
            adapter.tree,
            case,
            unit.steps,
            grid.seed,
            plan.config.timeout_s,
            progress=state.tracker.advance,
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
    for result in results:
        result.details.update(
            steps=samples.n_steps, capped=grid.capped, ci_steps=grid.ci_steps,
            needed_steps=grid.needed_steps,
        )
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
    "chain": _run_chain_unit,
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
) -> ShardResult:
    """Run the units shard ``spec`` owns and keep their sufficient statistics.

    Args:
        plan: the run's plan (the same on every shard).
        spec: which shard.
        work_dir: where the property suite runs (``work_dir/suite/...``); default the
            current directory.
        progress: optional callback (steps done, steps planned, label).

    Returns:
        :class:`ShardResult` (save it with :func:`losslessness.engine.shards.save_shard`).
    """
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    began = time.perf_counter()
    mine = [unit for unit in plan.units if spec.takes(unit.index)]
    tracker = _Tracker(progress, plan.planned_steps(mine))
    state = _ShardState(plan, tracker, Path(work_dir) if work_dir is not None else Path.cwd())
    records: dict[int, UnitRecord] = {}
    interrupted = False
    for unit in mine:
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
    where no command can (device comparisons, suite runs replay with their pytest command)."""
    config = plan.config
    grid = plan.chain_cases.get(check.case_id)
    if check.check_id in ("coupling", "two-sample", "precision", "suite") or "@" in check.target:
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
        grid.n_steps if grid is not None
        else tree_grid.n_steps if tree_grid is not None
        else check.details.get("steps")
    )
    if steps:
        command += f" --steps {steps}"
    if grid is not None and grid.n_chunks > 1:
        command += f" --chunk-steps {grid.chunk_steps}"
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
    context = dataclasses.replace(context, sampling_time_s=sum(u.wall_time_s for u in units))
    failures = sorted(
        (unit for unit in units if unit.failure_kind not in (None, INCOMPLETE)),
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
    if (target, case.case_id) not in merged.tables:
        # Interrupted before any chunk of the case finished.
        return [
            context.untested(check_id, Verdict.SKIPPED, INTERRUPTED_MESSAGE)
            for check_id in selected
        ]
    samples = expand_table(
        merged.tables[(target, case.case_id)], case, grid.seed, grid.steps_per_call
    )
    samples.wall_time_s = context.sampling_time_s
    samples.verifier_time_s = sum(unit.verifier_time_s for unit in units)
    samples.calls = sum(unit.verifier_calls for unit in units)
    results = run_chain_checks(samples, context, verification)
    for result in results:
        result.details.update(
            steps=samples.n_steps,
            capped=grid.capped,
            ci_steps=grid.ci_steps,
            chunk_steps=grid.chunk_steps,
            n_chunks=grid.n_chunks,
        )
    return [result for result in results if plan.config.selects(result.check_id)]


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
            complete &= all(unit.failure_kind != INCOMPLETE for unit in units)
            if kind == "chain":
                result.checks += _chain_checks(merged, name, cases[case_id], units, verification)
            else:
                result.checks += [check for unit in units for check in unit.checks]
            _add_totals(result, units)
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
    from losslessness.engine.suite import suite_family_wise_alpha

    return suite_family_wise_alpha()


def _run_environment(merged: MergedShards) -> dict[str, str]:
    plan = merged.plan
    config = plan.config
    if config.budget == 1 and len(merged.shards) == 1 and not plan.suite_targets:
        return {}
    suites = len(plan.suite_targets)
    suite_alpha = _suite_alpha() if suites else 0.0
    bound = config.family_wise_alpha + suites * suite_alpha
    return {
        "run": (
            f"budget {config.budget:g}x the CI plan on {config.device}; "
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
) -> AuditResult:
    """Audit every target: plan, run as one shard, finish.

    Args:
        targets: adapters to audit, or :class:`UnavailableTarget` placeholders (recorded as
            ERROR so that the run's record says what could not be audited).
        config: the design; defaults to :class:`RunConfig` () (the CI budget, one chunk per
            case, no device checks or suite).
        progress: optional callback (steps done, steps planned, current label).
        work_dir: where suite units run, when the config has them.

    Returns:
        :class:`AuditResult`; ``exit_code`` gives the CLI's exit status.

    Raises:
        ValueError: unknown case ids in ``config.cases``.
    """
    config = config or RunConfig()
    note = load_device_checks()[1] if config.device_checks else None
    plan = plan_run(config, targets, note)
    return finish_run([run_shard(plan, ShardSpec(0, 1), work_dir, progress)]).audit
