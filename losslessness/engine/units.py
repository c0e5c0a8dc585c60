"""One runner per unit kind that is not a chain chunk (greedy, tree, greedy tree, serving, seed
contract, end-to-end, device checks, property suite): each calls its target once for the unit and
records the unit's check results. The sampled kinds obey a time budget's deadline: a unit not
begun by then is not sampled, a tree unit stops at it (device checks and the property suite are
outside the budget).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from losslessness.adapters import NotApplicable
from losslessness.batteries import SERVING_CI_MAX_STEPS
from losslessness.cases import GreedyCase, GreedyTreeCase
from losslessness.checks import malformed_output_result, run_tree_checks
from losslessness.checks.greedy import check_greedy
from losslessness.checks.ids import (
    GREEDY_CHECK_ID,
    SEED_CONTRACT_CHECK_ID,
    SERVING_CHECK_IDS,
    SERVING_STRUCTURE_CHECK_ID,
    TREE_CHECK_IDS,
    TREE_GREEDY_CHECK_ID,
    TREE_STRUCTURE_CHECK_ID,
)
from losslessness.checks.seed_contract import check_seed_contract
from losslessness.checks.serving import check_serving, serving_design
from losslessness.checks.tree_greedy import check_tree_greedy
from losslessness.checks.tree_sequential import TreeMonitor
from losslessness.engine.draw import (
    ProtocolViolation,
    ServingTreeCall,
    sample_greedy,
    sample_greedy_tree,
    sample_tree,
)
from losslessness.engine.end_to_end import EndToEndPlan, end_to_end_checks, sample_end_to_end
from losslessness.engine.plan import (
    MIN_STEPS,
    RunPlan,
    Unit,
    UnitKind,
    end_to_end_check_ids,
    load_device_checks,
)
from losslessness.engine.seed_contract import SEED_CONTRACT_SUMMARY, seed_contract_observations
from losslessness.engine.serving import sample_serving
from losslessness.engine.shards import FailureKind, SuiteRun, UnitRecord
from losslessness.engine.state import (
    ShardState,
    check_context,
    failure_message,
    record_target_error,
    untested_results,
)
from losslessness.protocol import TreeVerifier
from losslessness.reference.profiles import get_profile
from losslessness.requests import UnsupportedRequest
from losslessness.results import CheckContext, CheckResult, Verdict
from losslessness.samples import TreeSamples
from losslessness.seeding import derive_seed

_Outputs = TypeVar("_Outputs")


def _past_deadline(state: ShardState) -> bool:
    """Whether the time budget's deadline has passed (never without a budget)."""
    return state.deadline is not None and time.perf_counter() >= state.deadline


def _not_sampled(
    record: UnitRecord, context: CheckContext, check_ids: list[str], reason: str
) -> None:
    """Record ``record``'s unit as not sampled for ``reason`` (:attr:`FailureKind.STOPPED`),
    its checks SKIPPED."""
    record.failure_kind, record.failure = FailureKind.STOPPED, f"not sampled: {reason}"
    record.checks = [context.untested(c, Verdict.SKIPPED, record.failure) for c in check_ids]


def _blamed_draw(
    state: ShardState,
    record: UnitRecord,
    context: CheckContext,
    selected: list[str],
    structure_id: str,
    draw: Callable[[], _Outputs],
) -> _Outputs | None:
    """``draw()``, the target's samples of a unit, or None after recording why there are none:
    a malformed output is LOSSY under ``structure_id``, any other failure of the target an
    ERROR (or SKIPPED when not applicable) for every check of ``selected``; on failure the
    time spent is the target's (``record.verifier_time_s``)."""
    began = time.perf_counter()
    try:
        return draw()
    except ProtocolViolation as violation:
        record.checks = [malformed_output_result(context, violation, structure_id)]
    except Exception as error:
        record_target_error(state, record, error)
        record.checks = untested_results(context, record, selected)
    record.verifier_time_s = time.perf_counter() - began
    return None


def _run_exact_unit(
    state: ShardState,
    unit: Unit,
    record: UnitRecord,
    case: GreedyCase | GreedyTreeCase,
    check_id: str,
    draw: Callable[[], _Outputs],
    check: Callable[[_Outputs, CheckContext], CheckResult],
) -> None:
    """One deterministic call of a greedy (chain or tree) verifier on ``case`` (``draw``) and
    its exact check: a malformed output is LOSSY under ``check_id``, a target failure ERROR
    (or SKIPPED when not applicable); only ``draw`` is timed and blamed on the target."""
    context = check_context(
        state.plan.record, unit.target, case.case_id, case.summary, case.case_hash, 0
    )
    # A time budget's warm-up made this unit's one call already: that call is the checked one.
    kept = state.plan.warm_up.exact.get((unit.target, unit.kind, unit.case_id))
    if kept is None and _past_deadline(state):
        _not_sampled(record, context, [check_id], "time budget spent")
        return
    began = time.perf_counter()
    try:
        if isinstance(kept, ProtocolViolation):
            raise kept
        outputs = draw() if kept is None else kept
    except ProtocolViolation as violation:
        record.checks = [malformed_output_result(context, violation, check_id)]
        return
    except Exception as error:
        record_target_error(state, record, error)
        record.checks = untested_results(context, record, [check_id])
        return
    finally:
        record.verifier_time_s = time.perf_counter() - began
        state.tracker.advance(case.batch_size)
    record.verify_steps = case.batch_size
    record.verifier_calls = 1
    record.checks = [check(outputs, context)]


def _run_greedy_unit(state: ShardState, unit: Unit, record: UnitRecord) -> None:
    plan = state.plan
    verifier = plan.adapter(unit.target).greedy
    assert verifier is not None
    case = next(case for case in plan.greedy_cases if case.case_id == unit.case_id)
    _run_exact_unit(
        state, unit, record, case, GREEDY_CHECK_ID,
        lambda: sample_greedy(verifier, case, plan.config.timeout_s),
        lambda outputs, context: check_greedy(outputs, case, context),
    )


def _run_tree_unit(state: ShardState, unit: Unit, record: UnitRecord) -> None:
    plan = state.plan
    adapter = plan.adapter(unit.target)
    case = next(case for case in plan.tree_cases if case.case_id == unit.case_id)
    grid = plan.record.tree_cases[unit.case_id]
    context = check_context(
        plan.record, unit.target, case.case_id, case.summary, case.case_hash, grid.seed
    )
    context = dataclasses.replace(context, alpha=plan.record.alpha_split.fixed)
    selected = [c for c in TREE_CHECK_IDS if plan.config.selects(c)]
    if unit.target in state.decided:
        _not_sampled(record, context, selected,
                     f"target already LOSSY ({state.decided[unit.target]})")
        return
    if _past_deadline(state):
        _not_sampled(record, context, selected, "time budget spent")
        return
    monitor = (
        TreeMonitor(case, unit.steps, plan.record.alpha_split.sequential, context)
        if plan.config.early_stop
        else None
    )
    out_of_time = False

    def watch(call: TreeSamples) -> bool:
        """The monitor's decision after a call, or the deadline's."""
        nonlocal out_of_time
        if monitor is not None and monitor.update(call):
            return True
        out_of_time = _past_deadline(state)
        return out_of_time

    verifier: TreeVerifier | None = adapter.tree
    if case.serving is not None:
        assert adapter.serving_tree is not None
        verifier = ServingTreeCall(adapter.serving_tree, case)
    assert verifier is not None
    drawn = _blamed_draw(
        state, record, context, selected, TREE_STRUCTURE_CHECK_ID,
        lambda: sample_tree(
            verifier,
            case,
            unit.steps,
            grid.seed,
            plan.config.timeout_s,
            progress=state.tracker.advance,
            monitor=watch if monitor is not None or state.deadline is not None else None,
        ),
    )
    if drawn is None:
        return
    samples = drawn
    record.verify_steps = samples.n_steps
    record.verifier_calls = samples.calls
    record.verifier_time_s = samples.verifier_time_s
    details: dict[str, Any] = {
        "steps": samples.n_steps,
        "capped": grid.capped,
        "ci_steps": grid.ci_steps,
        "needed_steps": grid.needed_steps,
        "planned_steps": grid.n_steps,
    }
    if case.serving is not None:
        details["engine_profile"] = case.serving.profile
    reason = None
    if monitor is not None:
        if monitor.decision is not None:
            reason = monitor.decision.reason
            record.stopped = details["stopped"] = f"LOSSY: {reason}"
            state.decided.setdefault(unit.target, f"{unit.case_id}: {reason}")
        record.sequential = monitor.evidence()
    if out_of_time and samples.n_steps < unit.steps:
        reason = "time budget spent"
        record.stopped = details["stopped"] = reason
    context = dataclasses.replace(
        context,
        sampling_time_s=samples.wall_time_s,
        details=details,
        sequential=record.sequential or {},
        stop_reason=reason,
    )
    results = run_tree_checks(samples, context)
    record.checks = [result for result in results if plan.config.selects(result.check_id)]


def _run_greedy_tree_unit(state: ShardState, unit: Unit, record: UnitRecord) -> None:
    plan = state.plan
    verifier = plan.adapter(unit.target).greedy_tree
    assert verifier is not None
    case = next(case for case in plan.greedy_tree_cases if case.case_id == unit.case_id)
    _run_exact_unit(
        state, unit, record, case, TREE_GREEDY_CHECK_ID,
        lambda: sample_greedy_tree(verifier, case, plan.config.timeout_s),
        lambda outputs, context: check_tree_greedy(*outputs, case, context),
    )


def _run_serving_unit(state: ShardState, unit: Unit, record: UnitRecord) -> None:
    """One serving case on one target's serving verifier: its engine profile (the adapter's
    ``engine_profile``), its design stated before sampling, the samples, every serving check."""
    plan = state.plan
    adapter = plan.adapter(unit.target)
    serving = adapter.serving
    assert serving is not None
    case = next(case for case in plan.serving_cases if case.case_id == unit.case_id)
    seed = derive_seed(plan.config.seed, UnitKind.SERVING.value, case.case_hash)
    context = check_context(
        plan.record, unit.target, case.case_id, case.summary, case.case_hash, seed
    )
    context = dataclasses.replace(context, n_rows=case.n_rows)
    selected = [c for c in SERVING_CHECK_IDS if plan.config.selects(c)]
    if _past_deadline(state):
        _not_sampled(record, context, selected, "time budget spent")
        return
    try:
        profile = get_profile(adapter.engine_profile or "")
    except ValueError as error:
        record.fail(
            FailureKind.ERROR,
            f"no engine profile for the serving target ({error}): set the function's "
            "engine_profile attribute or pass --engine-profile",
        )
        record.checks = untested_results(context, record, selected)
        return
    cap = case.max_steps or SERVING_CI_MAX_STEPS
    try:
        design = serving_design(
            case, profile, plan.config.tv, context.alpha, plan.config.power,
            min(plan.config.max_steps, cap), MIN_STEPS,
        )
    except UnsupportedRequest as error:
        # The engine has no such processor: the case does not apply to this target.
        record.fail(FailureKind.NOT_APPLICABLE, f"not applicable: {error}")
        record.checks = untested_results(context, record, selected)
        return
    drawn = _blamed_draw(
        state, record, context, selected, SERVING_STRUCTURE_CHECK_ID,
        lambda: sample_serving(
            serving, case, unit.steps, seed, plan.config.timeout_s,
            progress=state.tracker.advance,
        ),
    )
    if drawn is None:
        return
    samples = drawn
    record.verify_steps = samples.n_steps
    record.verifier_calls = samples.calls
    record.verifier_time_s = samples.verifier_time_s
    context = dataclasses.replace(
        context,
        sampling_time_s=samples.wall_time_s,
        details={
            "steps": unit.steps,
            "engine_profile": profile.name,
            "capped": design.capped,
            "needed_steps": design.needed_steps,
            "dtype": case.dtype,
            "batch_size": case.batch_size,
        },
    )
    results = check_serving(samples, profile, context, design)
    record.checks = [result for result in results if plan.config.selects(result.check_id)]


def _run_seed_contract_unit(state: ShardState, unit: Unit, record: UnitRecord) -> None:
    """The seed contract of one serving target: its seeded requests in every batch
    composition (:func:`~losslessness.engine.seed_contract.seed_contract_observations`),
    compared exactly; a broken contract is IRREPRODUCIBLE, a crash or hang an ERROR, a
    malformed output a failed ``serving.structure``."""
    plan = state.plan
    serving = plan.adapter(unit.target).serving
    assert serving is not None
    seed = derive_seed(plan.config.seed, UnitKind.SEED_CONTRACT.value)
    context = check_context(
        plan.record, unit.target, unit.case_id, SEED_CONTRACT_SUMMARY, UnitKind.SEED_CONTRACT.value,
        seed,
    )
    if _past_deadline(state):
        _not_sampled(record, context, [SEED_CONTRACT_CHECK_ID], "time budget spent")
        return
    began = time.perf_counter()
    observations = _blamed_draw(
        state, record, context, [SEED_CONTRACT_CHECK_ID], SERVING_STRUCTURE_CHECK_ID,
        lambda: seed_contract_observations(
            serving, seed, plan.config.timeout_s, progress=state.tracker.advance
        ),
    )
    if observations is None:
        return
    record.verifier_time_s = time.perf_counter() - began
    record.verifier_calls = len(observations)
    context = dataclasses.replace(context, sampling_time_s=record.verifier_time_s)
    record.checks = [check_seed_contract(observations, context)]


def _end_to_end_entry(plan: RunPlan, unit: Unit) -> EndToEndPlan:
    return next(
        entry for entry in plan.end_to_end[unit.target] if entry.target.name == unit.case_id
    )


def _run_end_to_end_unit(state: ShardState, unit: Unit, record: UnitRecord) -> None:
    plan = state.plan
    entry = _end_to_end_entry(plan, unit)
    target = entry.target
    context = check_context(
        plan.record, unit.target, target.name, target.description, entry.case_hash, entry.seed
    )
    selected = [c for c in end_to_end_check_ids(target) if plan.config.selects(c)]
    if _past_deadline(state):
        _not_sampled(record, context, selected, "time budget spent")
        return
    if isinstance(entry.error, NotApplicable):
        record.fail(FailureKind.NOT_APPLICABLE, entry.error.skip_message)
    elif entry.error is not None:
        record.fail(FailureKind.ERROR, failure_message(entry.error))
    else:
        try:
            samples = sample_end_to_end(entry, state.tracker.advance, plan.config.timeout_s)
        except Exception as error:
            record_target_error(state, record, error)
        else:
            context = dataclasses.replace(context, sampling_time_s=samples.wall_time_s)
            checks = end_to_end_checks(entry, samples, context)
            record.checks = [check for check in checks if plan.config.selects(check.check_id)]
            record.verify_steps = int(checks[-1].details.get("verify_steps", 0))
            record.verifier_calls = len(samples.sequences)
            record.verifier_time_s = samples.inside_s
            return
    record.checks = untested_results(context, record, selected)


def _run_device_unit(state: ShardState, unit: Unit, record: UnitRecord) -> None:
    plan = state.plan.record
    run_device_checks, note = load_device_checks()
    if run_device_checks is None:
        record.failure_kind, record.failure = FailureKind.ERROR, note
        return
    try:
        checks, unavailable = run_device_checks(
            plan.config.device,
            plan.device_steps,
            plan.config.seed,
            plan.device_alpha,
        )
    except Exception as error:
        record.fail(FailureKind.ERROR, failure_message(error))
    else:
        record.checks = list(checks)
        record.unavailable = [(name, reason) for name, reason in unavailable]


def _run_suite_unit(state: ShardState, unit: Unit, record: UnitRecord) -> None:
    from losslessness.engine.suite import run_suite, suite_unavailable_reason

    reason = suite_unavailable_reason()
    if reason is not None:
        record.failure_kind, record.failure = FailureKind.UNAVAILABLE, reason
        return
    folder = re.sub(r"[^A-Za-z0-9_.-]", "_", unit.target)
    outcome = run_suite(
        state.plan.adapter(unit.target),
        state.plan.config.suite_profile,
        state.work_dir / "suite" / folder,
    )
    record.checks = outcome.checks
    record.suite_run = SuiteRun(
        outcome.command, outcome.returncode, outcome.junit_xml, outcome.output_tail
    )


_UNIT_RUNNERS = {
    UnitKind.GREEDY: _run_greedy_unit,
    UnitKind.TREE: _run_tree_unit,
    UnitKind.GREEDY_TREE: _run_greedy_tree_unit,
    UnitKind.SERVING: _run_serving_unit,
    UnitKind.SEED_CONTRACT: _run_seed_contract_unit,
    UnitKind.END_TO_END: _run_end_to_end_unit,
    UnitKind.DEVICE: _run_device_unit,
    UnitKind.SUITE: _run_suite_unit,
}


def run_unit(state: ShardState, unit: Unit, record: UnitRecord) -> None:
    """Run ``unit`` (any kind but ``chain``) and fill in ``record``: its checks, its timings,
    and its failure when the target raised, hung or refused the case.

    Raises:
        KeyError: a chain unit (those run in streams, :mod:`losslessness.engine.chains`).
        KeyboardInterrupt: Ctrl-C (the scheduler records the unit as not run).
    """
    _UNIT_RUNNERS[unit.kind](state, unit, record)
