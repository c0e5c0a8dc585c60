"""Fitting a run into a time budget (``--time-budget``): measure each target's throughput in a
short warm-up, then choose the design TV (and, if even the coarsest design is too slow, the
cases to drop) so that the planned sampling fits, and say so before sampling.

The cost model, per (target, case):

- chain: a call of m copies of the case's rows takes ``overhead + per_step * m`` seconds,
  fitted on two warm-up calls (8 and 32 copies, after one of a single copy that absorbs
  first-call costs such as compilation); the case's call schedule
  (:func:`losslessness.engine.draw.call_schedule`) gives its time;
- tree: one warm-up call of the case's batch; the case makes ``ceil(trees / batch)`` calls;
- greedy and greedy tree: one call each, timed once;
- end-to-end: two sequences timed after one; the planned sequences at the requested TV (an
  upper bound at any larger TV).

The warm-up draws from its own seeds (``derive_seed(seed, "warm-up", ...)``): its outputs are
never part of any test. Device checks and the property suite are outside the budget.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from losslessness.adapters import Adapter
from losslessness.design import RunConfig
from losslessness.engine.draw import (
    ChainSampler,
    call_schedule,
    generate_sequences,
    sample_greedy,
    sample_greedy_tree,
    sample_tree,
)
from losslessness.engine.plan import (
    MIN_STEPS,
    RunPlan,
    UnavailableTarget,
    _chain_case_plan,
    _tree_case_plan,
    plan_run,
)
from losslessness.seeding import derive_seed

WARM_UP_STEPS = (1, 8, 32)
"""Copies per warm-up call of a chain case: the first call is discarded (first-call costs),
the other two fit overhead and per-step time."""

FIT_FRACTION = 0.8
"""Share of the budget the planned sampling may fill: the rest absorbs the checks' own time
and the error of a two-call throughput estimate."""

DEADLINE_FRACTION = 0.95
"""Share of the budget after which chain sampling stops whatever the plan said."""

TV_GROWTH = 1.15
"""Ratio between consecutive design TVs the fit tries."""

MAX_TV = 0.5
"""Coarsest design TV the fit raises to; then it caps every case's steps."""

MIN_CAP = 200
"""Fewest steps per case the fit caps to before it drops cases."""


@dataclass(frozen=True)
class CallCost:
    """Seconds one call of a target takes: ``overhead_s + per_step_s * m`` for m copies.

    Attributes:
        overhead_s: fixed seconds per call (>= 0).
        per_step_s: seconds per copy of the case's rows (>= 0).
    """

    overhead_s: float
    per_step_s: float

    def seconds(self, sizes: Sequence[int]) -> float:
        """Seconds of calls of ``sizes`` copies."""
        return sum(self.overhead_s + self.per_step_s * m for m in sizes)


@dataclass
class Throughput:
    """What the warm-up measured, by ``(target, unit kind, case id)``.

    Attributes:
        chain: chain cases' call costs.
        per_call_s: seconds per call of tree cases (a call of the case's batch), greedy and
            greedy tree cases (their one call).
        per_sequence_s: seconds per sequence of end-to-end targets.
        warm_up_s: seconds the warm-up took.
        failures: units whose warm-up raised (their cost is unknown: the run will report
            their error), with the error.
    """

    chain: dict[tuple[str, str], CallCost] = field(default_factory=dict)
    per_call_s: dict[tuple[str, str, str], float] = field(default_factory=dict)
    per_sequence_s: dict[tuple[str, str], float] = field(default_factory=dict)
    warm_up_s: float = 0.0
    failures: dict[str, str] = field(default_factory=dict)


def _timed(function: Callable[..., object], *args: object) -> float:
    began = time.perf_counter()
    function(*args)
    return time.perf_counter() - began


def measure_throughput(plan: RunPlan) -> Throughput:
    """Warm up every (target, case) of ``plan`` and measure its cost.

    Args:
        plan: the plan at the requested design (its cases and targets).

    Returns:
        :class:`Throughput`. A target that raises during warm-up is recorded in
        ``failures`` and costs nothing in the fit (its units will report the error).
    """
    began = time.perf_counter()
    config = plan.config
    measured = Throughput()
    for adapter in plan.adapters:
        try:
            _measure_adapter(plan, adapter, measured, config)
        except Exception as error:  # the run reports it on the target's units
            measured.failures[adapter.name] = f"{type(error).__name__}: {error}"
    measured.warm_up_s = time.perf_counter() - began
    return measured


def _measure_adapter(
    plan: RunPlan, adapter: Adapter, measured: Throughput, config: RunConfig
) -> None:
    name = adapter.name
    timeout = config.timeout_s
    if adapter.chain is not None:
        for case in plan.chain_cases:
            seconds = []
            for copies in WARM_UP_STEPS:
                sampler = ChainSampler(
                    adapter.chain, case, copies,
                    derive_seed(config.seed, "warm-up", name, case.case_hash, copies), timeout,
                )
                seconds.append(_timed(sampler.step))
            (_, small, large), (_, few, many) = WARM_UP_STEPS, seconds
            per_step = max((many - few) / (large - small), many / large / 4, 0.0)
            measured.chain[(name, case.case_id)] = CallCost(max(few - per_step * small, 0.0),
                                                           per_step)
    if adapter.greedy is not None:
        for greedy_case in plan.greedy_cases:
            measured.per_call_s[(name, "greedy", greedy_case.case_id)] = _timed(
                sample_greedy, adapter.greedy, greedy_case, timeout
            )
    if adapter.tree is not None:
        for tree_case in plan.tree_cases:
            seed = derive_seed(config.seed, "warm-up", name, tree_case.case_hash)
            measured.per_call_s[(name, "tree", tree_case.case_id)] = _timed(
                sample_tree, adapter.tree, tree_case, tree_case.batch_size, seed, timeout
            )
    if adapter.greedy_tree is not None:
        for greedy_tree_case in plan.greedy_tree_cases:
            measured.per_call_s[(name, "greedy-tree", greedy_tree_case.case_id)] = _timed(
                sample_greedy_tree, adapter.greedy_tree, greedy_tree_case, timeout
            )
    for entry in plan.end_to_end.get(name, []):
        target = entry.target
        seed = derive_seed(config.seed, "warm-up", name, target.name)
        generate_sequences(target.generator, target.prompt_ids, target.new_tokens, 1, seed,
                           timeout_s=timeout)
        _, inside = generate_sequences(
            target.generator, target.prompt_ids, target.new_tokens, 2, derive_seed(seed, 1),
            timeout_s=timeout,
        )
        measured.per_sequence_s[(name, target.name)] = inside / 2


@dataclass(frozen=True)
class BudgetFit:
    """The design a time budget allows.

    Attributes:
        config: the run's config at the fitted design TV (``cases`` narrowed when cases
            were dropped).
        estimate_s: estimated sampling seconds of the fitted plan, by target.
        dropped: case ids left out because even the coarsest design did not fit.
        warm_up_s: seconds the warm-up took.
        claim: the sentence printed before sampling.
    """

    config: RunConfig
    estimate_s: dict[str, float]
    dropped: tuple[str, ...]
    warm_up_s: float
    claim: str


def estimate_seconds(
    plan: RunPlan,
    measured: Throughput,
    tv: float,
    cases: set[str] | None = None,
    max_steps: int | None = None,
) -> dict[str, dict[str, float]]:
    """Estimated sampling seconds of every (target, case) of ``plan`` at design TV ``tv``.

    Args:
        plan: the plan at the requested design (targets, cases, end-to-end plans).
        measured: the warm-up's costs.
        tv: the design TV to price (the per-assertion levels are the plan's: they do not
            depend on the TV).
        cases: case ids to keep (None: all).
        max_steps: cap on every case's steps (None: the plan's).

    Returns:
        Seconds by target name, then case id (end-to-end targets by their name).
    """
    config = dataclasses.replace(
        plan.config, tv=tv, max_steps=max_steps or plan.config.max_steps
    )
    chain_alpha = plan.record.alpha_split.fixed
    seconds: dict[str, dict[str, float]] = {}
    for adapter in plan.adapters:
        mine = seconds.setdefault(adapter.name, {})
        if adapter.name in measured.failures:
            continue
        for case in plan.chain_cases:
            cost = measured.chain.get((adapter.name, case.case_id))
            if cost is None or (cases is not None and case.case_id not in cases):
                continue
            grid = _chain_case_plan(case, config, chain_alpha)
            sizes = [
                size
                for chunk in range(grid.n_chunks)
                for size in call_schedule(case, grid.chunk_size(chunk), ramp=True)
            ]
            mine[case.case_id] = cost.seconds(sizes)
        for tree_case in plan.tree_cases:
            per_call = measured.per_call_s.get((adapter.name, "tree", tree_case.case_id))
            if per_call is None or (cases is not None and tree_case.case_id not in cases):
                continue
            trees = _tree_case_plan(tree_case, config, plan.record.alpha_split.fixed).n_steps
            mine[tree_case.case_id] = per_call * math.ceil(trees / tree_case.batch_size)
        for (target, kind, case_id), per_call in measured.per_call_s.items():
            if target == adapter.name and kind != "tree" and (cases is None or case_id in cases):
                mine[case_id] = per_call
        for entry in plan.end_to_end.get(adapter.name, []):
            per_sequence = measured.per_sequence_s.get((adapter.name, entry.target.name))
            if per_sequence is not None and (cases is None or entry.target.name in cases):
                mine[entry.target.name] = per_sequence * entry.planned_runs
    return seconds


def _total(seconds: dict[str, dict[str, float]]) -> float:
    return sum(sum(by_case.values()) for by_case in seconds.values())


Design = tuple[float, int | None]
"""A design the fit tries: (design TV, cap on every case's steps or None for the plan's)."""


def _first_fitting(
    plan: RunPlan, measured: Throughput, designs: list[Design], room: float, kept: set[str]
) -> Design | None:
    """The first of ``designs`` (ordered from the finest) whose estimate on the ``kept`` cases
    fits ``room`` seconds (None when even the last does not); the time only falls along the
    list, so bisect."""

    def fits(design: Design) -> bool:
        tv, cap = design
        return _total(estimate_seconds(plan, measured, tv, kept, cap)) <= room

    if not fits(designs[-1]):
        return None
    low, high = 0, len(designs) - 1
    while low < high:
        middle = (low + high) // 2
        if fits(designs[middle]):
            high = middle
        else:
            low = middle + 1
    return designs[high]


def fit_time_budget(
    config: RunConfig,
    targets: Sequence[Adapter | UnavailableTarget],
    device_note: str | None = None,
) -> BudgetFit:
    """Warm up, then choose the finest design whose estimated sampling time fits
    :data:`FIT_FRACTION` of ``config.time_budget_s``: the design TV from ``config.tv`` up by
    factors of :data:`TV_GROWTH` to :data:`MAX_TV`, then at :data:`MAX_TV` every case's steps
    capped from :data:`~losslessness.engine.plan.MIN_STEPS` down to :data:`MIN_CAP`. Breadth
    comes first: cases are dropped (those that cost most at the coarsest design first, named
    in the claim, at least one kept) only while the others cannot fit even then; sampling
    stops at the deadline whatever the estimate.

    Args:
        config: the requested design, with ``time_budget_s`` set.
        targets: the run's targets.
        device_note: as :func:`losslessness.engine.plan.plan_run`'s.

    Returns:
        :class:`BudgetFit`.

    Raises:
        ValueError: naming ``time_budget_s`` when the config has none.
    """
    if config.time_budget_s is None:
        raise ValueError("time_budget_s: the config has no time budget to fit")
    budget = config.time_budget_s
    plan = plan_run(config, targets, device_note)
    measured = measure_throughput(plan)
    room = FIT_FRACTION * budget
    designs: list[Design] = [(config.tv, None)]
    while designs[-1][0] < MAX_TV:
        designs.append((min(MAX_TV, designs[-1][0] * TV_GROWTH), None))
    cap = float(min(config.max_steps, MIN_STEPS))
    while cap > MIN_CAP:
        cap = max(MIN_CAP, cap / TV_GROWTH)
        designs.append((MAX_TV, int(cap)))
    coarsest_tv, coarsest_cap = designs[-1]
    floor = estimate_seconds(plan, measured, coarsest_tv, None, coarsest_cap)
    by_case: dict[str, float] = {}
    for per_target in floor.values():
        for case_id, value in per_target.items():
            by_case[case_id] = by_case.get(case_id, 0.0) + value
    kept = set(by_case)
    dropped: list[str] = []
    # Breadth first: the TV is raised, then every case's steps capped, and a case is dropped
    # only while the kept ones cannot fit even then, the one that costs most there first.
    for case_id in sorted(by_case, key=lambda c: -by_case[c]):
        if len(kept) == 1 or sum(by_case[c] for c in kept) <= room:
            break
        kept.discard(case_id)
        dropped.append(case_id)
    design = _first_fitting(plan, measured, designs, room, kept) or designs[-1]
    tv, steps_cap = float(f"{design[0]:.3g}"), design[1]
    seconds = estimate_seconds(plan, measured, tv, kept, steps_cap)
    fitted = dataclasses.replace(
        config,
        tv=tv,
        max_steps=steps_cap or config.max_steps,
        cases=tuple(sorted(_kept_cases(plan, dropped))) if dropped else config.cases,
    )
    estimate = {name: sum(by_case.values()) for name, by_case in seconds.items()}
    names = ", ".join(adapter.name for adapter in plan.adapters)
    n_cases = len({case_id for by_case in seconds.values() for case_id in by_case})
    claim = (
        f"in {budget:g} s, {names} allow{'s' if len(plan.adapters) == 1 else ''} "
        f"TV >= {tv:.3g} at power {config.power:g} on {n_cases} cases"
        + (
            f", at most {steps_cap} steps per case (each result says the TV its steps reach)"
            if steps_cap
            else ""
        )
        + f" (estimated sampling {_total(seconds):.0f} s after a {measured.warm_up_s:.1f} s "
        "warm-up)"
    )
    if tv > config.tv:
        claim += f"; the requested TV {config.tv:g} would need about " + (
            f"{_total(estimate_seconds(plan, measured, config.tv)):.0f} s"
        )
    if dropped:
        claim += f"; dropped as too slow for the budget: {', '.join(dropped)}"
    if measured.failures:
        claim += "; warm-up failed on " + ", ".join(
            f"{name} ({why})" for name, why in measured.failures.items()
        )
    return BudgetFit(fitted, estimate, tuple(dropped), measured.warm_up_s, claim)


def _kept_cases(plan: RunPlan, dropped: Sequence[str]) -> list[str]:
    every = [case.case_id for case in plan.chain_cases]
    every += [case.case_id for case in plan.greedy_cases]
    every += [case.case_id for case in plan.tree_cases]
    every += [case.case_id for case in plan.greedy_tree_cases]
    every += [entry.target.name for entries in plan.end_to_end.values() for entry in entries]
    return [case_id for case_id in dict.fromkeys(every) if case_id not in dropped]


__all__ = [
    "DEADLINE_FRACTION",
    "FIT_FRACTION",
    "MAX_TV",
    "MIN_CAP",
    "TV_GROWTH",
    "WARM_UP_STEPS",
    "BudgetFit",
    "CallCost",
    "Throughput",
    "estimate_seconds",
    "fit_time_budget",
    "measure_throughput",
]
