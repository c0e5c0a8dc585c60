"""Running a night: a shard's units, then one merge that runs every check once.

``run_shard`` samples the units a shard owns and keeps their sufficient statistics
(:mod:`losslessness.nightly.shards`); ``finish_night`` merges shards and runs the checks on the
merged statistics. The unsharded night is shard ``0/1`` followed by the same merge, so N shards
merged give the same count tables, statistics, p-values and verdicts as one run: the checks
only ever see merged tables, and the chunk grid (not the shard count) decides every sample.

Chain chunks are sampled with :func:`losslessness.checks.sample_chain` from seed
``derive_seed(case seed, chunk)``, where the case seed is
``derive_seed(run seed, "nightly", target, case hash)`` (reported as each result's seed, with
``chunk_steps`` and ``n_chunks`` in its details). Checks run on outputs rebuilt from the merged
table: record ``m`` repeated ``count`` times, its two steps adjacent, ``steps_per_call`` 2.
The order of steps differs from the sampling order; every check but the example that the
structure check quotes (its step index) is order-invariant.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from losslessness.adapters import Adapter
from losslessness.audit import (
    SCHEMA_VERSION,
    AuditConfig,
    AuditResult,
    TargetResult,
    TargetVerdict,
    run_audit,
    run_environment,
    target_verdict,
)
from losslessness.checks import (
    SEQUENCE_CHECK_IDS,
    ChainCase,
    ChainSamples,
    CheckContext,
    CheckResult,
    ProtocolViolation,
    Verdict,
    check_greedy,
    default_chain_battery,
    malformed_output_result,
    run_chain_checks,
    sample_chain,
)
from losslessness.checks.sampling import rows_per_call
from losslessness.nightly.plan import CI_MAX_STEPS, NightlyPlan, Unit, load_device_checks
from losslessness.nightly.shards import (
    CountTable,
    MergedShards,
    ShardResult,
    ShardSpec,
    UnitRecord,
    count_records,
    expand_table,
    merge_shards,
    pair_records,
)
from losslessness.nightly.suite import run_suite, suite_family_wise_alpha
from losslessness.seeding import derive_seed

UnitProgress = Callable[[int, int, str], None]
"""Called with (units done, units of the shard, label of the next unit)."""

CHAIN_CHECKS = ("structure", "law", "acceptance", "independence")
"""Check ids reported as ERROR when a target crashes on a chain case."""


def case_seed(run_seed: int, target: str, case_hash: str) -> int:
    """Seed of one target's case; chunk ``j`` is sampled from ``derive_seed(case seed, j)``."""
    return derive_seed(run_seed, "nightly", target, case_hash)


def _failure_message(error: BaseException) -> str:
    where = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    location = f" at {where.filename}:{where.lineno}" if where else ""
    return f"target raised {type(error).__name__}: {error}{location}"


def _run_chain_unit(
    adapter: Adapter, case: ChainCase, unit: Unit, run_seed: int
) -> tuple[UnitRecord, np.ndarray | None]:
    assert adapter.chain is not None
    record = unit.record()
    seed = derive_seed(case_seed(run_seed, adapter.name, case.case_hash), unit.chunk)
    began = time.perf_counter()
    try:
        samples = sample_chain(adapter.chain, case, unit.steps, seed)
    except ProtocolViolation as violation:
        record.failure_kind, record.failure = "protocol", f"chunk {unit.chunk}: {violation}"
        return record, None
    except Exception as error:
        record.failure_kind, record.failure = "error", _failure_message(error)
        return record, None
    finally:
        record.wall_time_s = time.perf_counter() - began
    if rows_per_call(case) >= 2 and samples.steps_per_call < unit.steps:
        # The grid sizes chunks to one call; anything else would pair steps of different calls.
        raise RuntimeError(
            f"{unit.key}: sample_chain split a chunk of {unit.steps} steps into calls of "
            f"{samples.steps_per_call}; the nightly chunk grid assumes one call per chunk"
        )
    record.verify_steps = unit.steps * case.n_rows
    record.verifier_calls = samples.calls
    record.verifier_time_s = samples.verifier_time_s
    return record, pair_records(samples.outputs, samples.drafts)


def _greedy_context(plan: NightlyPlan, target: str, case_id: str) -> CheckContext:
    case = next(case for case in plan.greedy_cases if case.case_id == case_id)
    return CheckContext.for_case(
        target,
        case,
        alpha=plan.budget.per_assertion_alpha,
        power=plan.config.power,
        tv=plan.config.tv,
        seed=0,
    )


def _run_greedy_unit(plan: NightlyPlan, adapter: Adapter, unit: Unit) -> UnitRecord:
    assert adapter.greedy is not None
    record = unit.record()
    case = next(case for case in plan.greedy_cases if case.case_id == unit.case_id)
    context = _greedy_context(plan, adapter.name, unit.case_id)
    began = time.perf_counter()
    try:
        record.checks = [check_greedy(adapter.greedy, case, context)]
        record.verify_steps = int(case.draft_token_ids.shape[0])
        record.verifier_calls = 1
    except Exception as error:
        record.failure_kind, record.failure = "error", _failure_message(error)
        record.checks = [context.untested("greedy", Verdict.ERROR, record.failure)]
    record.wall_time_s = record.verifier_time_s = time.perf_counter() - began
    return record


def _run_end_to_end_unit(plan: NightlyPlan, adapter: Adapter, unit: Unit) -> UnitRecord:
    record = unit.record()
    engines = Adapter(adapter.name, adapter.description, end_to_end=adapter.end_to_end)
    assertions = plan.end_to_end_assertions.get(adapter.name, 0)
    config = AuditConfig(
        tv=plan.config.tv,
        # run_audit splits this over the adapter's sequence-law tests: the night's level each.
        family_wise_alpha=plan.budget.per_assertion_alpha * max(1, assertions),
        power=plan.config.power,
        seed=plan.config.seed,
        only=SEQUENCE_CHECK_IDS,
        max_steps=max(1, math.ceil(CI_MAX_STEPS * plan.config.budget)),
    )
    result = run_audit([engines], config).targets[0]
    record.checks = result.checks
    record.wall_time_s = result.wall_time_s
    record.verify_steps = result.verify_steps
    record.verifier_calls = result.verifier_calls
    record.verifier_time_s = result.verifier_time_s
    return record


def _run_device_unit(plan: NightlyPlan, unit: Unit) -> UnitRecord:
    record = unit.record()
    run_device_checks, note = load_device_checks()
    began = time.perf_counter()
    if run_device_checks is None:
        record.failure_kind, record.failure = "error", note
        return record
    try:
        checks, unavailable = run_device_checks(
            plan.config.device,
            plan.device_steps,
            derive_seed(plan.config.seed, "nightly", "device"),
            plan.device_alpha,
        )
    except Exception as error:
        record.failure_kind, record.failure = "error", _failure_message(error)
    else:
        record.checks = list(checks)
        record.extra["unavailable"] = [[name, reason] for name, reason in unavailable]
    record.wall_time_s = time.perf_counter() - began
    return record


def _run_suite_unit(plan: NightlyPlan, adapter: Adapter, unit: Unit, work_dir: Path) -> UnitRecord:
    record = unit.record()
    folder = re.sub(r"[^A-Za-z0-9_.-]", "_", adapter.name)
    outcome = run_suite(adapter, plan.config.suite_profile, work_dir / "suite" / folder)
    record.checks = outcome.checks
    record.wall_time_s = outcome.wall_time_s
    record.extra = {
        "returncode": outcome.returncode,
        "command": outcome.command,
        "junit_xml": outcome.junit_xml,
        "output_tail": outcome.output_tail,
    }
    return record


def run_shard(
    plan: NightlyPlan,
    spec: ShardSpec,
    work_dir: str | Path,
    progress: UnitProgress | None = None,
) -> ShardResult:
    """Run the units shard ``spec`` owns and keep their sufficient statistics.

    Args:
        plan: the night's plan (the same on every shard).
        spec: which shard.
        work_dir: where the property suite runs (``work_dir/suite/...``).
        progress: optional callback after each unit.

    Returns:
        :class:`ShardResult` (save it with :func:`losslessness.nightly.shards.save_shard`).
    """
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    began = time.perf_counter()
    work = Path(work_dir)
    cases = {case.case_id: case for case in plan.chain_cases}
    mine = [unit for unit in plan.units if spec.takes(unit.index)]
    records: dict[int, UnitRecord] = {}
    pairs: dict[tuple[str, str], list[np.ndarray]] = {}
    for done, unit in enumerate(mine):
        if progress is not None:
            progress(done, len(mine), unit.key)
        if unit.kind == "chain":
            adapter = plan.adapter(unit.target)
            record, chunk_pairs = _run_chain_unit(
                adapter, cases[unit.case_id], unit, plan.config.seed
            )
            if chunk_pairs is not None:
                pairs.setdefault((unit.target, unit.case_id), []).append(chunk_pairs)
        elif unit.kind == "greedy":
            record = _run_greedy_unit(plan, plan.adapter(unit.target), unit)
        elif unit.kind == "end-to-end":
            record = _run_end_to_end_unit(plan, plan.adapter(unit.target), unit)
        elif unit.kind == "device":
            record = _run_device_unit(plan, unit)
        elif unit.kind == "suite":
            record = _run_suite_unit(plan, plan.adapter(unit.target), unit, work)
        else:
            raise ValueError(f"unit: unknown kind {unit.kind!r}")
        records[unit.index] = record
    if progress is not None:
        progress(len(mine), len(mine), "done")
    tables = {key: count_records(np.concatenate(parts)) for key, parts in sorted(pairs.items())}
    return ShardResult(
        plan=plan.describe(),
        fingerprint=plan.fingerprint,
        shard=spec,
        units=records,
        tables=tables,
        target_descriptions={adapter.name: adapter.description for adapter in plan.targets},
        unavailable={target.name: target.reason for target in plan.unavailable},
        environment=run_environment(),
        started_at=started,
        wall_time_s=time.perf_counter() - began,
    )


@dataclass
class NightlyResult:
    """A finished night.

    Attributes:
        audit: the :class:`AuditResult` the reports render (battery targets, unavailable
            targets, device checks grouped by their target, property-suite runs as
            ``suite:<target>``).
        exit_code: 0 lossless, 1 any LOSSY, 3 a check crashed or a named target did not load
            (registered adapters that do not load on this machine are recorded, not failed).
        summary: JSON-able record of the night: plan, budgets, shards, suite runs.
        suite_junit: pytest's junit XML of each suite run, by target.
        tables: the merged count tables, by (target, case id).
    """

    audit: AuditResult
    exit_code: int
    summary: dict[str, Any]
    suite_junit: dict[str, str] = field(default_factory=dict)
    tables: dict[tuple[str, str], CountTable] = field(default_factory=dict)


def _battery_cases(plan: dict[str, Any]) -> dict[str, ChainCase]:
    cases = {case.case_id: case for case in default_chain_battery()}
    for case_id, grid in plan["chain_cases"].items():
        if case_id not in cases or cases[case_id].case_hash != grid["case_hash"]:
            raise ValueError(
                f"plan: battery case {case_id!r} differs from this losslessness's battery "
                "(merge with the version that ran the shards)"
            )
    return cases


def _chain_checks(
    merged: MergedShards,
    target: str,
    case: ChainCase,
    units: Sequence[UnitRecord],
    alpha: float,
) -> list[CheckResult]:
    plan = merged.plan
    config = plan["config"]
    grid = plan["chain_cases"][case.case_id]
    seed = case_seed(config["seed"], target, case.case_hash)
    context = CheckContext.for_case(
        target, case, alpha=alpha, power=config["power"], tv=config["tv"], seed=seed
    )
    sampling_time = sum(unit.wall_time_s for unit in units)
    context = dataclasses.replace(context, sampling_time_s=sampling_time)
    failures = sorted((unit for unit in units if unit.failure_kind), key=lambda unit: unit.index)
    protocol = [unit for unit in failures if unit.failure_kind == "protocol"]
    if protocol:
        return [malformed_output_result(context, protocol[0].failure)]
    if failures:
        message = str(failures[0].failure)
        return [context.untested(check_id, Verdict.ERROR, message) for check_id in CHAIN_CHECKS]
    table = merged.tables[(target, case.case_id)]
    outputs, drafts = expand_table(table, case.n_rows, case.k)
    samples = ChainSamples(
        case=case,
        outputs=outputs,
        drafts=drafts,
        seed=seed,
        wall_time_s=sampling_time,
        verifier_time_s=sum(unit.verifier_time_s for unit in units),
        calls=sum(unit.verifier_calls for unit in units),
        steps_per_call=2 if rows_per_call(case) >= 2 else 1,
    )
    results = run_chain_checks(samples, context)
    for result in results:
        result.details.update(
            steps=int(outputs.shape[1]),
            capped=grid["capped"],
            ci_steps=grid["ci_steps"],
            chunk_steps=grid["chunk_steps"],
            n_chunks=-(-grid["n_steps"] // grid["chunk_steps"]),
        )
    return results


def _totals(result: TargetResult, units: Sequence[UnitRecord]) -> None:
    for unit in units:
        result.wall_time_s += unit.wall_time_s
        result.verify_steps += unit.verify_steps
        result.verifier_calls += unit.verifier_calls
        result.verifier_time_s += unit.verifier_time_s


def finish_night(shards: Sequence[ShardResult]) -> NightlyResult:
    """Merge ``shards`` and run every check once on the merged statistics.

    Raises:
        ShardMergeError: shards of different plans, duplicate or missing units.
        ValueError: the battery differs from the one the shards sampled.
    """
    began = time.perf_counter()
    merged = merge_shards(list(shards))
    plan = merged.plan
    config = plan["config"]
    cases = _battery_cases(plan)
    alpha = plan["battery_alpha"] / plan["n_assertions"]
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
    descriptions = merged.shards[0].target_descriptions
    targets: list[TargetResult] = []
    for name in plan["targets"]:
        result = TargetResult(name, descriptions.get(name, name), TargetVerdict.LOSSLESS)
        for (kind, case_id), units in by_target.get(name, {}).items():
            if kind == "chain":
                result.checks += _chain_checks(merged, name, cases[case_id], units, alpha)
            else:
                result.checks += [check for unit in units for check in unit.checks]
            _totals(result, units)
        result.verdict = target_verdict(result.checks)
        targets.append(result)
    unavailable = merged.shards[0].unavailable
    # A target the user named must load (ERROR); registered adapters whose package or device
    # is missing on this machine are listed but decide nothing.
    missing = TargetVerdict.ERROR if config["targets"] else TargetVerdict.UNAVAILABLE
    for name in plan["unavailable"]:
        targets.append(TargetResult(name, "unavailable", missing, error=unavailable.get(name)))
    device_unavailable: list[list[str]] = []
    for unit in device_units:
        grouped: dict[str, list[CheckResult]] = {}
        for check in unit.checks:
            grouped.setdefault(check.target, []).append(check)
        for name, checks in grouped.items():
            result = TargetResult(
                name, f"device checks on {config['device']}", target_verdict(checks), checks
            )
            result.wall_time_s = sum(check.wall_time_s for check in checks)
            targets.append(result)
        if unit.failure:
            targets.append(
                TargetResult(
                    f"device-checks@{config['device']}",
                    "coupling and precision checks",
                    TargetVerdict.ERROR,
                    error=unit.failure,
                )
            )
        device_unavailable += unit.extra.get("unavailable", [])
    for name, reason in device_unavailable:
        targets.append(
            TargetResult(
                f"{name}@{config['device']}",
                "unavailable",
                TargetVerdict.UNAVAILABLE,
                error=reason,
            )
        )
    suite_junit = {}
    for name, unit in suite_units.items():
        result = TargetResult(
            f"suite:{name}",
            f"property suite on {name}, Hypothesis profile {config['suite_profile']!r}",
            target_verdict(unit.checks),
            unit.checks,
            wall_time_s=unit.wall_time_s,
        )
        targets.append(result)
        suite_junit[name] = str(unit.extra.get("junit_xml", ""))
    exit_code = _exit_code(targets, config, plan, device_unavailable)
    audit = AuditResult(
        schema_version=SCHEMA_VERSION,
        config=AuditConfig(
            tv=config["tv"],
            family_wise_alpha=config["family_wise_alpha"],
            power=config["power"],
            seed=config["seed"],
            max_steps=max(1, math.ceil(CI_MAX_STEPS * config["budget"])),
        ),
        n_assertions=plan["n_assertions"],
        per_assertion_alpha=alpha,
        targets=targets,
        wall_time_s=sum(shard.wall_time_s for shard in merged.shards) + time.perf_counter() - began,
        started_at=min(shard.started_at for shard in merged.shards),
        environment={**merged.shards[0].environment, **_night_environment(merged)},
    )
    summary = _summary(merged, exit_code, device_unavailable, time.perf_counter() - began)
    return NightlyResult(audit, exit_code, summary, suite_junit, merged.tables)


def _exit_code(
    targets: Sequence[TargetResult],
    config: dict[str, Any],
    plan: dict[str, Any],
    device_unavailable: Sequence[Sequence[str]],
) -> int:
    skipped = set() if config["targets"] else set(plan["unavailable"])
    skipped |= {f"{name}@{config['device']}" for name, _ in device_unavailable}
    verdicts = {target.verdict for target in targets if target.name not in skipped}
    if TargetVerdict.LOSSY in verdicts:
        return 1
    if TargetVerdict.ERROR in verdicts:
        return 3
    return 0


def _night_environment(merged: MergedShards) -> dict[str, str]:
    plan = merged.plan
    config = plan["config"]
    suites = len(plan["suite_targets"])
    suite_alpha = suite_family_wise_alpha()
    bound = config["family_wise_alpha"] + suites * suite_alpha
    return {
        "nightly": (
            f"budget {config['budget']:g}x the CI plan on {config['device']}; "
            f"{len(merged.shards)} shard(s) merged; plan {merged.fingerprint[:12]}"
        ),
        "nightly error budget": (
            f"battery {plan['battery_alpha']:.3g} over {plan['n_assertions']} assertions "
            f"({plan['battery_alpha'] / plan['n_assertions']:.3g} each); device checks "
            f"{plan['device_alpha']:.3g}; property suite {suite_alpha:g} per target "
            f"x {suites}; whole night <= {bound:.3g}"
        ),
    }


def _summary(
    merged: MergedShards,
    exit_code: int,
    device_unavailable: Sequence[Sequence[str]],
    merge_time_s: float,
) -> dict[str, Any]:
    plan = merged.plan
    suites = []
    for unit in merged.units.values():
        if unit.kind == "suite":
            suites.append(
                {
                    "target": unit.target,
                    "returncode": unit.extra.get("returncode"),
                    "command": unit.extra.get("command"),
                    "wall_time_s": unit.wall_time_s,
                    "verdicts": [check.verdict.value for check in unit.checks],
                }
            )
    return {
        "fingerprint": merged.fingerprint,
        "plan": plan,
        "exit_code": exit_code,
        "error_budget": {
            "battery_alpha": plan["battery_alpha"],
            "n_assertions": plan["n_assertions"],
            "per_assertion_alpha": plan["battery_alpha"] / plan["n_assertions"],
            "device_alpha": plan["device_alpha"],
            "suite_alpha_per_target": suite_family_wise_alpha(),
            "night_bound": plan["config"]["family_wise_alpha"]
            + len(plan["suite_targets"]) * suite_family_wise_alpha(),
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
            f"{target}/{case_id}": {"pairs": table.n_pairs, "distinct": len(table.counts)}
            for (target, case_id), table in merged.tables.items()
        },
        "device_unavailable": [list(item) for item in device_unavailable],
        "suite": suites,
        "merge_time_s": merge_time_s,
    }


__all__ = [
    "CHAIN_CHECKS",
    "NightlyResult",
    "UnitProgress",
    "case_seed",
    "finish_night",
    "run_shard",
]
