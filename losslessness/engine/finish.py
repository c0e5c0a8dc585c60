"""Finishing a run: merge the shards, run every chain check once on the merged count tables,
assemble each target's verdict, and build the :class:`~losslessness.results.AuditResult`, its
summary and its environment.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from losslessness.cases import ChainCase
from losslessness.checks import malformed_output_result, run_chain_checks
from losslessness.checks.ids import PVALUES_CHECK_ID, SAMPLED_CHAIN_CHECK_IDS
from losslessness.checks.pvalues import check_pvalue_uniformity
from losslessness.checks.sequential import merged_evidence
from losslessness.config import RunConfig
from losslessness.engine.plan import ChainCasePlan, PlanRecord, UnitKind
from losslessness.engine.replay import SUITE_PREFIX, attach_replays
from losslessness.engine.shards import (
    FailureKind,
    MergedShards,
    ShardResult,
    UnitRecord,
    merge_shards,
)
from losslessness.engine.state import (
    INTERRUPTED_MESSAGE,
    check_context,
)
from losslessness.engine.tables import CountTable, counted_steps
from losslessness.results import (
    SCHEMA_VERSION,
    AuditResult,
    CheckContext,
    CheckKind,
    CheckResult,
    TargetResult,
    TargetVerdict,
    Verdict,
    design_shortfalls,
    message_key,
    shorten_message,
    target_verdict,
)
from losslessness.stats import SUITE_FAMILY_WISE_ALPHA


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


def _chain_checks(
    merged: MergedShards,
    target: str,
    case: ChainCase,
    units: Sequence[UnitRecord],
    verification: str,
) -> list[CheckResult]:
    plan = merged.plan
    grid: ChainCasePlan = plan.chain_cases[case.case_id]
    context = check_context(
        plan, target, case.case_id, case.summary, case.case_hash, grid.seed, case.n_rows
    )
    context = dataclasses.replace(
        context,
        alpha=plan.alpha_split.fixed,
        sampling_time_s=sum(u.wall_time_s for u in units),
    )
    failures = sorted(
        (
            unit
            for unit in units
            if unit.failure_kind not in (None, FailureKind.INCOMPLETE, FailureKind.STOPPED)
        ),
        key=lambda unit: unit.index,
    )
    protocol = [unit for unit in failures if unit.failure_kind is FailureKind.PROTOCOL]
    if protocol:
        return [malformed_output_result(context, protocol[0].failure)]
    selected = [c for c in SAMPLED_CHAIN_CHECK_IDS if plan.config.selects(c)]
    errors = [unit for unit in failures if unit.failure_kind is not FailureKind.NOT_APPLICABLE]
    if errors:
        message = str(errors[0].failure)
        return [context.untested(check_id, Verdict.ERROR, message) for check_id in selected]
    if failures:
        # The target refused the case's shape (NotApplicable): nothing was sampled.
        message = str(failures[0].failure)
        return [context.untested(check_id, Verdict.SKIPPED, message) for check_id in selected]
    stopped = [unit for unit in units if unit.failure_kind is FailureKind.STOPPED]
    if (target, case.case_id) not in merged.tables:
        # Interrupted, or stopped (its target decided, the time budget spent), before any
        # chunk of the case was sampled.
        message = str(stopped[0].failure) if stopped else INTERRUPTED_MESSAGE
        return [context.untested(check_id, Verdict.SKIPPED, message) for check_id in selected]
    steps = counted_steps(merged.tables[(target, case.case_id)], case, grid.steps_per_call)
    reasons = [unit.stopped for unit in units if unit.stopped is not None]
    reasons += [str(unit.failure) for unit in stopped]
    details: dict[str, Any] = {
        "steps": steps.n_steps,
        "capped": grid.capped,
        "ci_steps": grid.ci_steps,
        "chunk_steps": grid.chunk_steps,
        "n_chunks": grid.n_chunks,
        "planned_steps": grid.n_steps,
    }
    if reasons:
        details["stopped"] = reasons[0]
    context = dataclasses.replace(
        context,
        details=details,
        sequential=merged_evidence(
            [unit.sequential for unit in units if unit.sequential is not None]
        ),
        stop_reason=reasons[0] if reasons else None,
    )
    results = run_chain_checks(steps, context, verification)
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
    groups: dict[tuple[UnitKind, str], list[UnitRecord]], verify_steps: int
) -> str | None:
    """Why a target's chain sampling stopped before its plan, said once for the target."""
    stops = [
        (case_id, unit.stopped)
        for (kind, case_id), units in groups.items()
        if kind in (UnitKind.CHAIN, UnitKind.TREE)
        for unit in units
        if unit.stopped is not None
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


def _full_texts(texts: Sequence[str | None]) -> dict[str, str]:
    """The full text of every message of ``texts`` that was shortened (None: none was), once
    each, by :func:`~losslessness.results.message_key`: a target's ``full_messages``."""
    return {message_key(text): text for text in texts if text is not None}


def _add_totals(result: TargetResult, units: Sequence[UnitRecord]) -> None:
    for unit in units:
        result.wall_time_s += unit.wall_time_s
        result.verify_steps += unit.verify_steps
        result.verifier_calls += unit.verifier_calls
        result.verifier_time_s += unit.verifier_time_s
    result.full_messages.update(_full_texts([unit.failure_text for unit in units]))


def finish_run(shards: Sequence[ShardResult]) -> RunResult:
    """Merge ``shards`` and run every check once on the merged statistics.

    Raises:
        ShardMergeError: shards of different plans, duplicate or missing units.
    """
    began = time.perf_counter()
    merged = merge_shards(list(shards))
    plan = merged.plan
    config = plan.config
    cases = merged.cases
    by_target: dict[str, dict[tuple[UnitKind, str], list[UnitRecord]]] = {}
    device_units: list[UnitRecord] = []
    suite_units: dict[str, UnitRecord] = {}
    for _, unit in sorted(merged.units.items()):
        if unit.kind is UnitKind.DEVICE:
            device_units.append(unit)
        elif unit.kind is UnitKind.SUITE:
            suite_units[unit.target] = unit
        else:
            group = by_target.setdefault(unit.target, {})
            group.setdefault((unit.kind, unit.case_id), []).append(unit)
    targets: list[TargetResult] = []
    for name, description, verification in plan.targets:
        exclusions, expected, reason = plan.declared(name)
        result = TargetResult(
            name,
            description,
            TargetVerdict.LOSSLESS,
            exclusions=exclusions,
            expected_verdict=expected,
            expected_reason=reason,
        )
        complete = True
        for (kind, case_id), units in by_target.get(name, {}).items():
            complete &= all(
                unit.failure_kind is not FailureKind.INCOMPLETE and not unit.interrupted
                for unit in units
            )
            if kind is UnitKind.CHAIN:
                result.checks += _chain_checks(merged, name, cases[case_id], units, verification)
            else:
                result.checks += [check for unit in units for check in unit.checks]
            _add_totals(result, units)
        if name in plan.pvalues_targets:
            result.checks.append(_pvalues_check(plan, name, result.checks, complete))
        result.stopped_early = _stopped_early(by_target.get(name, {}), result.verify_steps)
        shortfalls = design_shortfalls(result.checks, config, exclusions)
        result.verdict = target_verdict(result.checks, complete, shortfalls)
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
        error = shorten_message(reason)
        kept = _full_texts([reason if error != reason else None])
        targets.append(TargetResult(name, "unavailable", missing, error=error, full_messages=kept))
    targets += _device_results(device_units, config)
    suite_junit = {}
    for name, unit in suite_units.items():
        if unit.failure_kind is not None:
            verdict = {
                FailureKind.UNAVAILABLE: TargetVerdict.UNAVAILABLE,
                FailureKind.INCOMPLETE: TargetVerdict.INCOMPLETE,
            }.get(unit.failure_kind, TargetVerdict.ERROR)
            targets.append(
                TargetResult(
                    f"{SUITE_PREFIX}{name}",
                    f"property suite on {name}",
                    verdict,
                    error=unit.failure,
                    wall_time_s=unit.wall_time_s,
                    full_messages=_full_texts([unit.failure_text]),
                )
            )
            continue
        targets.append(
            TargetResult(
                f"{SUITE_PREFIX}{name}",
                f"property suite on {name}, Hypothesis profile {config.suite_profile!r}",
                target_verdict(unit.checks),
                unit.checks,
                wall_time_s=unit.wall_time_s,
            )
        )
        suite_junit[name] = unit.suite_run.junit_xml if unit.suite_run is not None else ""
    attach_replays(plan, targets, {
        name: unit.suite_run.command
        for name, unit in suite_units.items()
        if unit.suite_run is not None
    })
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
                    if unit.failure_kind is FailureKind.INCOMPLETE
                    else TargetVerdict.ERROR,
                    error=unit.failure,
                    full_messages=_full_texts([unit.failure_text]),
                )
            )
        for name, reason in unit.unavailable:
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
            "returncode": unit.suite_run.returncode if unit.suite_run is not None else None,
            "command": unit.suite_run.command if unit.suite_run is not None else None,
            "wall_time_s": unit.wall_time_s,
            "unavailable": unit.failure
            if unit.failure_kind is FailureKind.UNAVAILABLE
            else None,
            "verdicts": [check.verdict.value for check in unit.checks],
        }
        for unit in merged.units.values()
        if unit.kind is UnitKind.SUITE
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


