"""Running the battery on adapters: plan, budget, sample, check -> :class:`AuditResult`.

The run's family-wise false-alarm rate is split Bonferroni over every statistical assertion
of the run (all targets, cases, positions, and one sequence-law test per sampled end-to-end
target), counted before any sample is drawn; each case's number of verification steps (each
end-to-end target's number of generated sequences) is then sized so that its identity tests
detect the design TV with the design power at that per-assertion level (DESIGN.md section 5).
A target that raises is recorded as ERROR for that case's checks and the audit goes on.
"""

from __future__ import annotations

import dataclasses
import enum
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import scipy
import torch

import losslessness
from losslessness.adapters.base import Adapter, EndToEndTarget
from losslessness.checks import (
    CHAIN_CHECK_IDS,
    DRAFTS_ACCEPTED_CHECK_ID,
    SEQUENCE_GREEDY_CHECK_ID,
    SEQUENCE_LAW_CHECK_ID,
    CasePlan,
    ChainCase,
    CheckContext,
    CheckResult,
    GreedyCase,
    ProtocolViolation,
    SequencePlan,
    Verdict,
    accepted_length_snapshot,
    check_drafts_accepted,
    check_greedy,
    check_greedy_sequences,
    check_sequence_law,
    count_statistical_assertions,
    default_chain_battery,
    default_greedy_battery,
    malformed_output_result,
    plan_case,
    plan_sequence_law,
    run_chain_checks,
    sample_chain,
)
from losslessness.checks.sequence_law import GREEDY_SEQUENCE_RUNS, end_to_end_case_hash
from losslessness.seeding import derive_seed
from losslessness.stats import DEFAULT_FAMILY_WISE_ALPHA, ErrorBudget

SCHEMA_VERSION = "1"
"""Version of the :class:`AuditResult` JSON layout."""

ProgressCallback = Callable[[int, int, str], None]
"""Called with (steps done, steps planned, label of the current case)."""


@dataclass(frozen=True)
class RunDesign:
    """The statistical design every run states (an audit, a night).

    Attributes:
        tv: design TV distance eps: each identity test detects TV >= eps with ``power``.
        family_wise_alpha: probability that a correct target gets any false alarm in the run.
        power: design power 1 - beta.
        seed: the run seed; every case's (chunk's) seed derives from it.

    Raises:
        ValueError: naming the field, for values out of range.
    """

    tv: float = 0.05
    family_wise_alpha: float = DEFAULT_FAMILY_WISE_ALPHA
    power: float = 0.9
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.tv <= 1:
            raise ValueError(f"tv: must lie in (0, 1], got {self.tv}")
        if not 0 < self.family_wise_alpha < 1:
            raise ValueError(f"family_wise_alpha: must lie in (0, 1), got {self.family_wise_alpha}")
        if not 0 < self.power < 1:
            raise ValueError(f"power: must lie in (0, 1), got {self.power}")


@dataclass(frozen=True)
class AuditConfig(RunDesign):
    """Design of one audit run: :class:`RunDesign` (``tv``, ``family_wise_alpha``, ``power``,
    ``seed``: every case's seed derives from it and the case hash), then

    Attributes:
        only: check ids to run (``law``, ``acceptance``, ``structure``, ``greedy``, ``edge``
            for every ``edge.*``, ``sequence-law``, ``sequence-greedy``, ``drafts-accepted``);
            empty runs all.
        cases: case ids (battery cases, end-to-end target names) to run; empty runs all.
        max_steps: cap on verification steps per case and row type, and on the sequences
            generated per end-to-end target.
        steps: when set, every case uses exactly this many steps (every end-to-end target this
            many sequences: replays), overriding the plan.

    Raises:
        ValueError: naming the field, for values out of range.
    """

    only: tuple[str, ...] = ()
    cases: tuple[str, ...] = ()
    max_steps: int = 200_000
    steps: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_steps < 1:
            raise ValueError(f"max_steps: must be >= 1, got {self.max_steps}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps: must be >= 1, got {self.steps}")

    def selects(self, check_id: str) -> bool:
        """Whether ``check_id`` is among the checks to run (``edge`` selects every ``edge.*``)."""
        return not self.only or any(
            check_id == name or check_id.startswith(name + ".") for name in self.only
        )


class TargetVerdict(str, enum.Enum):
    """Verdict on one target: LOSSLESS, LOSSY (any check LOSSY), SUBOPTIMAL (lossless but
    accepts fewer drafts than sum min(p, q)), ERROR (crashed, or a target the user named could
    not load; nothing LOSSY), UNAVAILABLE (a registered adapter the run did not name whose
    package or device is missing here: nothing was tested, and the run's outcome ignores it)."""

    LOSSLESS = "LOSSLESS"
    LOSSY = "LOSSY"
    SUBOPTIMAL = "SUBOPTIMAL"
    ERROR = "ERROR"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True)
class UnavailableTarget:
    """A requested target that could not be loaded; recorded as ERROR with ``reason``."""

    name: str
    reason: str


@dataclass
class TargetResult:
    """Everything the audit found about one target.

    Attributes:
        name, description: the adapter's.
        verdict: see :class:`TargetVerdict`.
        checks: one record per assertion.
        wall_time_s: seconds spent on this target.
        verify_steps: verification steps (batch rows) the target ran.
        verifier_calls: calls made to the target.
        verifier_time_s: seconds spent inside the target.
        error: why the target could not be audited at all, if so.
    """

    name: str
    description: str
    verdict: TargetVerdict
    checks: list[CheckResult] = field(default_factory=list)
    wall_time_s: float = 0.0
    verify_steps: int = 0
    verifier_calls: int = 0
    verifier_time_s: float = 0.0
    error: str | None = None


@dataclass
class AuditResult:
    """One audit run (plain dataclasses; :mod:`reports.json` reads and writes it).

    Attributes:
        schema_version: :data:`SCHEMA_VERSION`.
        config: the design.
        n_assertions: statistical assertions the run's budget was split over.
        per_assertion_alpha: ``family_wise_alpha / n_assertions`` (Bonferroni).
        targets: one result per target, in the order requested.
        wall_time_s: seconds for the whole run.
        started_at: ISO 8601 UTC time the run started.
        environment: versions (python, torch, numpy, scipy, losslessness, platform).
    """

    schema_version: str
    config: AuditConfig
    n_assertions: int
    per_assertion_alpha: float
    targets: list[TargetResult]
    wall_time_s: float
    started_at: str
    environment: dict[str, str]

    @property
    def exit_code(self) -> int:
        """0 lossless (SUBOPTIMAL included), 1 any target LOSSY, 3 any target crashed."""
        verdicts = {target.verdict for target in self.targets}
        if TargetVerdict.LOSSY in verdicts:
            return 1
        if TargetVerdict.ERROR in verdicts:
            return 3
        return 0


def target_verdict(checks: Sequence[CheckResult]) -> TargetVerdict:
    """A target's verdict from its checks: LOSSY if any check is LOSSY, else ERROR if any is
    ERROR, else SUBOPTIMAL if any is SUBOPTIMAL, else LOSSLESS (also for no checks)."""
    verdicts = {check.verdict for check in checks}
    if Verdict.LOSSY in verdicts:
        return TargetVerdict.LOSSY
    if Verdict.ERROR in verdicts:
        return TargetVerdict.ERROR
    if Verdict.SUBOPTIMAL in verdicts:
        return TargetVerdict.SUBOPTIMAL
    return TargetVerdict.LOSSLESS


def run_environment() -> dict[str, str]:
    """Versions of what a run's numbers depend on: losslessness, Python, torch, numpy, scipy,
    the platform string, and transformers when it is imported."""
    environment = {
        "losslessness": losslessness.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "platform": platform.platform(),
    }
    if "transformers" in sys.modules:
        environment["transformers"] = str(sys.modules["transformers"].__version__)
    return environment


@dataclass
class _EndToEndPlan:
    """One end-to-end target's plan: its law and n (sampled), or why planning failed."""

    target: EndToEndTarget
    plan: SequencePlan | None = None
    error: BaseException | None = None

    @property
    def planned_runs(self) -> int:
        if self.target.greedy:
            return GREEDY_SEQUENCE_RUNS
        return self.plan.n if self.plan is not None else 0


@dataclass
class _Plan:
    chain_cases: list[ChainCase]
    greedy_cases: list[GreedyCase]
    budget: ErrorBudget
    case_plans: dict[str, CasePlan]
    end_to_end: dict[str, list[_EndToEndPlan]] = field(default_factory=dict)


def _end_to_end_check_ids(target: EndToEndTarget) -> tuple[str, str]:
    law = SEQUENCE_GREEDY_CHECK_ID if target.greedy else SEQUENCE_LAW_CHECK_ID
    return law, DRAFTS_ACCEPTED_CHECK_ID


def _select_end_to_end(adapter: Adapter, config: AuditConfig) -> list[EndToEndTarget]:
    return [
        target
        for target in adapter.end_to_end
        if (not config.cases or target.name in config.cases)
        and any(config.selects(check_id) for check_id in _end_to_end_check_ids(target))
    ]


def _select_cases(
    config: AuditConfig, adapters: Sequence[Adapter] = ()
) -> tuple[list[ChainCase], list[GreedyCase]]:
    chain = default_chain_battery()
    greedy = default_greedy_battery()
    if config.cases:
        known = {case.case_id for case in chain} | {case.case_id for case in greedy}
        known |= {target.name for adapter in adapters for target in adapter.end_to_end}
        unknown = sorted(set(config.cases) - known)
        if unknown:
            raise ValueError(f"cases: unknown case ids {unknown}; known: {sorted(known)}")
        chain = [case for case in chain if case.case_id in config.cases]
        greedy = [case for case in greedy if case.case_id in config.cases]
    if not any(config.selects(check_id) for check_id in CHAIN_CHECK_IDS):
        chain = []
    if not config.selects("greedy"):
        greedy = []
    return chain, greedy


def plan_audit(adapters: Sequence[Adapter], config: AuditConfig) -> _Plan:
    """Count the run's statistical assertions, split the budget, and size every case.

    Raises:
        ValueError: unknown case ids in ``config.cases``.
    """
    chain, greedy = _select_cases(config, adapters)
    chain_targets = sum(adapter.chain is not None for adapter in adapters)
    selected = tuple(
        check_id for check_id in ("law", "acceptance", "independence") if config.selects(check_id)
    )
    n_assertions = chain_targets * sum(
        count_statistical_assertions(case, selected) for case in chain if selected
    )
    end_to_end = {adapter.name: _select_end_to_end(adapter, config) for adapter in adapters}
    if config.selects(SEQUENCE_LAW_CHECK_ID):
        # One identity test per sampled end-to-end target; greedy and drafts-accepted are exact.
        n_assertions += sum(
            not target.greedy for targets in end_to_end.values() for target in targets
        )
    budget = ErrorBudget(max(1, n_assertions), config.family_wise_alpha)
    plans = {}
    for case in chain if chain_targets else []:
        if config.steps is not None:
            plans[case.case_id] = CasePlan(config.steps, config.steps, False)
        else:
            plans[case.case_id] = plan_case(
                case, config.tv, budget.per_assertion_alpha, config.power, config.max_steps
            )
    return _Plan(
        chain,
        greedy,
        budget,
        plans,
        {
            name: [_plan_end_to_end(target, config, budget) for target in targets]
            for name, targets in end_to_end.items()
        },
    )


def _plan_end_to_end(
    target: EndToEndTarget, config: AuditConfig, budget: ErrorBudget
) -> _EndToEndPlan:
    if target.greedy:
        return _EndToEndPlan(target)
    cap = min(config.max_steps, target.max_sequences or config.max_steps)
    try:
        plan = plan_sequence_law(
            target.generator,
            target.prompt_ids,
            target.new_tokens,
            config.tv,
            budget.per_assertion_alpha,
            config.power,
            cap,
            config.steps,
        )
    except Exception as error:
        return _EndToEndPlan(target, error=error)
    return _EndToEndPlan(target, plan)


@dataclass
class _ProgressTracker:
    callback: ProgressCallback | None
    planned: int
    done: int = 0
    label: str = ""

    def advance(self, steps: int) -> None:
        self.done += steps
        if self.callback is not None:
            self.callback(self.done, self.planned, self.label)


def _planned_steps(adapter: Adapter, plan: _Plan) -> int:
    steps = 0
    if adapter.chain is not None:
        steps += sum(
            plan.case_plans[case.case_id].n_steps * case.n_rows for case in plan.chain_cases
        )
    if adapter.greedy is not None:
        steps += sum(int(case.draft_token_ids.shape[0]) for case in plan.greedy_cases)
    steps += sum(entry.planned_runs for entry in plan.end_to_end.get(adapter.name, []))
    return steps


def _error_results(
    context: CheckContext, check_ids: Sequence[str], error: BaseException
) -> list[CheckResult]:
    where = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    location = f" at {where.filename}:{where.lineno}" if where else ""
    message = f"target raised {type(error).__name__}: {error}{location}"
    return [context.untested(check_id, Verdict.ERROR, message) for check_id in check_ids]


def _audit_chain_case(
    adapter: Adapter,
    case: ChainCase,
    plan: CasePlan,
    config: AuditConfig,
    budget: ErrorBudget,
    advance: Callable[[int], None],
    totals: TargetResult,
) -> list[CheckResult]:
    assert adapter.chain is not None
    seed = derive_seed(config.seed, "chain", case.case_hash)
    context = CheckContext.for_case(
        adapter.name,
        case,
        alpha=budget.per_assertion_alpha,
        power=config.power,
        tv=config.tv,
        seed=seed,
    )
    selected = [
        check_id
        for check_id in ("structure", "law", "acceptance", "independence")
        if config.selects(check_id)
    ]
    try:
        samples = sample_chain(
            adapter.chain, case, plan.n_steps, seed, progress=lambda m: advance(m * case.n_rows)
        )
    except ProtocolViolation as violation:
        return [malformed_output_result(context, violation)]
    except Exception as error:
        return _error_results(context, selected or ["structure"], error)
    totals.verify_steps += plan.n_steps * case.n_rows
    totals.verifier_calls += samples.calls
    totals.verifier_time_s += samples.verifier_time_s
    context = dataclasses.replace(context, sampling_time_s=samples.wall_time_s)
    results = run_chain_checks(samples, context)
    for result in results:
        result.details["steps"] = plan.n_steps
        result.details["capped"] = plan.capped
    return [result for result in results if config.selects(result.check_id)]


def _audit_greedy_case(
    adapter: Adapter,
    case: GreedyCase,
    config: AuditConfig,
    budget: ErrorBudget,
    totals: TargetResult,
) -> CheckResult:
    assert adapter.greedy is not None
    context = CheckContext.for_case(
        adapter.name,
        case,
        alpha=budget.per_assertion_alpha,
        power=config.power,
        tv=config.tv,
        seed=0,
    )
    began = time.perf_counter()
    try:
        result = check_greedy(adapter.greedy, case, context)
    except Exception as error:
        return _error_results(context, ["greedy"], error)[0]
    totals.verify_steps += int(case.draft_token_ids.shape[0])
    totals.verifier_calls += 1
    totals.verifier_time_s += time.perf_counter() - began
    return result


def _audit_end_to_end(
    adapter: Adapter,
    entry: _EndToEndPlan,
    config: AuditConfig,
    budget: ErrorBudget,
    advance: Callable[[int], None],
    totals: TargetResult,
) -> list[CheckResult]:
    target = entry.target
    context = CheckContext(
        target=adapter.name,
        case_id=target.name,
        case_summary=target.description,
        case_hash=end_to_end_case_hash(target.prompt_ids, target.new_tokens, target.greedy),
        alpha=budget.per_assertion_alpha,
        power=config.power,
        tv=config.tv,
        seed=derive_seed(config.seed, "end-to-end", target.name),
    )
    selected = [check_id for check_id in _end_to_end_check_ids(target) if config.selects(check_id)]
    if entry.error is not None:
        return _error_results(context, selected, entry.error)
    before = accepted_length_snapshot(target.generator)
    try:
        if entry.plan is not None:
            law, inside = check_sequence_law(
                target.generator, target.prompt_ids, entry.plan, context, advance
            )
        else:
            law, inside = check_greedy_sequences(
                target.generator, target.prompt_ids, target.new_tokens, context, progress=advance
            )
    except Exception as error:
        return _error_results(context, selected, error)
    drafts = check_drafts_accepted(before, accepted_length_snapshot(target.generator), context)
    totals.verify_steps += int(drafts.details.get("verify_steps", 0))
    totals.verifier_calls += law.n
    totals.verifier_time_s += inside
    return [result for result in (law, drafts) if config.selects(result.check_id)]


def run_audit(
    targets: Sequence[Adapter | UnavailableTarget],
    config: AuditConfig | None = None,
    progress: ProgressCallback | None = None,
) -> AuditResult:
    """Audit every target on the battery and return the full record.

    Args:
        targets: adapters to audit, or :class:`UnavailableTarget` placeholders (recorded as
            ERROR so that the run's record says what could not be audited).
        config: the design; defaults to :class:`AuditConfig` ().
        progress: optional callback (steps done, steps planned, current label).

    Returns:
        :class:`AuditResult`; ``exit_code`` gives the CLI's exit status.

    Raises:
        ValueError: unknown case ids in ``config.cases``.
    """
    config = config or AuditConfig()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    began = time.perf_counter()
    adapters = [target for target in targets if isinstance(target, Adapter)]
    plan = plan_audit(adapters, config)
    tracker = _ProgressTracker(progress, sum(_planned_steps(a, plan) for a in adapters))
    results = []
    for target in targets:
        if isinstance(target, UnavailableTarget):
            results.append(
                TargetResult(target.name, "unavailable", TargetVerdict.ERROR, error=target.reason)
            )
            continue
        target_began = time.perf_counter()
        totals = TargetResult(target.name, target.description, TargetVerdict.LOSSLESS)
        if target.chain is not None:
            for case in plan.chain_cases:
                tracker.label = f"{target.name} {case.case_id}"
                totals.checks += _audit_chain_case(
                    target,
                    case,
                    plan.case_plans[case.case_id],
                    config,
                    plan.budget,
                    tracker.advance,
                    totals,
                )
        if target.greedy is not None:
            for greedy_case in plan.greedy_cases:
                tracker.label = f"{target.name} {greedy_case.case_id}"
                totals.checks.append(
                    _audit_greedy_case(target, greedy_case, config, plan.budget, totals)
                )
                tracker.advance(int(greedy_case.draft_token_ids.shape[0]))
        for entry in plan.end_to_end.get(target.name, []):
            tracker.label = f"{target.name} {entry.target.name}"
            totals.checks += _audit_end_to_end(
                target, entry, config, plan.budget, tracker.advance, totals
            )
        totals.verdict = target_verdict(totals.checks)
        totals.wall_time_s = time.perf_counter() - target_began
        results.append(totals)
    return AuditResult(
        schema_version=SCHEMA_VERSION,
        config=config,
        n_assertions=plan.budget.n_assertions,
        per_assertion_alpha=plan.budget.per_assertion_alpha,
        targets=results,
        wall_time_s=time.perf_counter() - began,
        started_at=started,
        environment=run_environment(),
    )
