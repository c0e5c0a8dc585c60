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

The budget bounds the whole run from the start of the warm-up: the warm-up stops starting calls
at :data:`WARM_UP_FRACTION` of it (the cases it did not reach are dropped, and named), the fit
fills what is left of :data:`FIT_FRACTION` of it, and every unit stops at
:data:`DEADLINE_FRACTION` of it.

The warm-up draws from its own seeds (``derive_seed(seed, "warm-up", ...)``), with sizes fixed
in advance, and its outputs are checked like the run's own (``RunPlan.warm_up``): chain calls
join their case's count table, a greedy or greedy tree call is its unit's call, a malformed
output fails its case; so a verifier wrong only on its first calls (lazy initialisation, a
compile path) fails with a time budget as without one. Device checks and the property suite
are outside the budget.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from losslessness.adapters import Adapter
from losslessness.cases import ChainCase, TreeCase
from losslessness.config import RunConfig
from losslessness.engine.draw import (
    ChainSampler,
    ProtocolViolation,
    TargetTimeout,
    call_schedule,
    generate_sequences,
    sample_greedy,
    sample_greedy_tree,
    sample_tree,
)
from losslessness.engine.interrupts import interruptible, note
from losslessness.engine.plan import (
    ChainCasePlan,
    RunPlan,
    TreeCasePlan,
    UnitKind,
    WarmUp,
    _chain_case_plan,
    _tree_case_plan,
    load_device_checks,
    plan_run,
)
from losslessness.engine.tables import chunk_table
from losslessness.protocol import GeneratesBatches
from losslessness.seeding import derive_seed
from losslessness.targets import UnavailableTarget, resolve_targets
from losslessness.worker import release_engine

_T = TypeVar("_T")

WARM_UP_STEPS = (1, 8, 32)
"""Copies per warm-up call of a chain case: the first call's time is discarded (first-call
costs), the other two fit overhead and per-step time."""

WARM_UP_FRACTION = 0.5
"""Share of the budget after which the warm-up starts no call: a slow target's warm-up cannot
spend the budget on measuring alone."""

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

CAP_STEP = 1.5
"""Ratio between consecutive step caps the fit tries."""


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
        failures: targets whose warm-up hung (by name) and (target, case)s whose warm-up
            raised (by ``"target case"``): their cost is unknown, the run reports their error.
        not_reached: (target, case id)s the warm-up had no time for.
        interrupted: an interruption (Ctrl-C, SIGTERM) ended the warm-up.
    """

    chain: dict[tuple[str, str], CallCost] = field(default_factory=dict)
    per_call_s: dict[tuple[str, UnitKind, str], float] = field(default_factory=dict)
    per_sequence_s: dict[tuple[str, str], float] = field(default_factory=dict)
    warm_up_s: float = 0.0
    failures: dict[str, str] = field(default_factory=dict)
    not_reached: set[tuple[str, str]] = field(default_factory=set)
    interrupted: bool = False


def _timed(function: Callable[..., _T], *args: object) -> tuple[float, _T]:
    began = time.perf_counter()
    value = function(*args)
    return time.perf_counter() - began, value


def measure_throughput(plan: RunPlan, deadline: float | None = None) -> Throughput:
    """Warm up every (target, case) of ``plan``, measure its cost and keep what it drew in
    ``plan.warm_up`` (:class:`~losslessness.engine.plan.WarmUp`: the run checks it like its
    own samples).

    Args:
        plan: the plan at the requested design (its cases and targets).
        deadline: ``time.perf_counter()`` value after which no warm-up call starts (the cases
            not reached are listed in ``not_reached``).

    Returns:
        :class:`Throughput`. A target that hangs during warm-up is recorded in ``failures``
        and costs nothing in the fit (its units will report the error); a case on which it
        raised costs nothing either. An interruption (Ctrl-C, SIGTERM) ends the warm-up with
        ``interrupted`` set and what finished kept.
    """
    began = time.perf_counter()
    measured = Throughput()
    try:
        with interruptible():
            for adapter in plan.adapters:
                try:
                    _measure_adapter(plan, adapter, measured, deadline)
                except Exception as error:  # a hang: the run reports it on the target's units
                    measured.failures[adapter.name] = f"{type(error).__name__}: {error}"
                finally:
                    release_engine(adapter)
    except KeyboardInterrupt as error:
        note(error)
        measured.interrupted = True
    measured.warm_up_s = time.perf_counter() - began
    return measured


def _warm_up_cases(plan: RunPlan, adapter: Adapter) -> list[tuple[UnitKind, str]]:
    """The (unit kind, case id) pairs the warm-up measures for ``adapter``, in its order."""
    cases: list[tuple[UnitKind, str]] = []
    if adapter.chain is not None:
        cases += [(UnitKind.CHAIN, case.case_id) for case in plan.chain_cases]
    if adapter.greedy is not None:
        cases += [(UnitKind.GREEDY, case.case_id) for case in plan.greedy_cases]
    if adapter.tree is not None:
        cases += [(UnitKind.TREE, case.case_id) for case in plan.tree_cases]
    if adapter.greedy_tree is not None:
        cases += [(UnitKind.GREEDY_TREE, case.case_id) for case in plan.greedy_tree_cases]
    cases += [(UnitKind.END_TO_END, entry.target.name) for entry in plan.end_to_end.get(
        adapter.name, [])]
    return cases


def _measure_adapter(
    plan: RunPlan, adapter: Adapter, measured: Throughput, deadline: float | None
) -> None:
    """Warm up ``adapter`` case by case until ``deadline``.

    Raises:
        TargetTimeout: a call hung (every later call could hang too).
    """
    for kind, case_id in _warm_up_cases(plan, adapter):
        if deadline is not None and time.perf_counter() >= deadline:
            measured.not_reached.add((adapter.name, case_id))
            continue
        try:
            _measure_case(plan, adapter, kind, case_id, measured)
        except TargetTimeout:
            raise
        except ProtocolViolation as violation:
            _keep_violation(plan, adapter.name, kind, case_id, violation)
        except Exception as error:  # its unit calls the target again and reports what it does
            measured.failures[f"{adapter.name} {case_id}"] = f"{type(error).__name__}: {error}"


def _keep_violation(
    plan: RunPlan, name: str, kind: UnitKind, case_id: str, violation: ProtocolViolation
) -> None:
    """A malformed warm-up output: the case fails as any malformed output does."""
    if kind is UnitKind.CHAIN:
        plan.warm_up.violations[(name, case_id)] = f"warm-up: {violation}"
    elif kind in (UnitKind.GREEDY, UnitKind.GREEDY_TREE):
        plan.warm_up.exact[(name, kind, case_id)] = violation


def _measure_case(
    plan: RunPlan, adapter: Adapter, kind: UnitKind, case_id: str, measured: Throughput
) -> None:
    """Time one (target, case)'s warm-up calls and keep what they drew."""
    config, name, timeout = plan.config, adapter.name, plan.config.timeout_s
    if kind is UnitKind.CHAIN:
        assert adapter.chain is not None
        case = next(case for case in plan.chain_cases if case.case_id == case_id)
        call_seconds: list[float] = []
        for copies in WARM_UP_STEPS:
            sampler = ChainSampler(
                adapter.chain, case, copies,
                derive_seed(config.seed, "warm-up", name, case.case_hash, copies), timeout,
            )
            try:
                call_seconds.append(_timed(sampler.step)[0])
            finally:
                if sampler.calls:
                    plan.warm_up.tables.setdefault((name, case_id), []).append(
                        chunk_table(sampler.samples())
                    )
        (_, small, large), (_, few, many) = WARM_UP_STEPS, call_seconds
        per_step = max((many - few) / (large - small), many / large / 4, 0.0)
        measured.chain[(name, case_id)] = CallCost(max(few - per_step * small, 0.0), per_step)
    elif kind is UnitKind.GREEDY:
        assert adapter.greedy is not None
        greedy_case = next(case for case in plan.greedy_cases if case.case_id == case_id)
        seconds, greedy_outputs = _timed(sample_greedy, adapter.greedy, greedy_case, timeout)
        plan.warm_up.exact[(name, kind, case_id)] = greedy_outputs
        measured.per_call_s[(name, kind, case_id)] = seconds
    elif kind is UnitKind.TREE:
        assert adapter.tree is not None
        tree_case = next(case for case in plan.tree_cases if case.case_id == case_id)
        seed = derive_seed(config.seed, "warm-up", name, tree_case.case_hash)
        measured.per_call_s[(name, kind, case_id)] = _timed(
            sample_tree, adapter.tree, tree_case, tree_case.batch_size, seed, timeout
        )[0]
    elif kind is UnitKind.GREEDY_TREE:
        assert adapter.greedy_tree is not None
        greedy_tree_case = next(c for c in plan.greedy_tree_cases if c.case_id == case_id)
        tree_seconds, tree_outputs = _timed(
            sample_greedy_tree, adapter.greedy_tree, greedy_tree_case, timeout
        )
        plan.warm_up.exact[(name, kind, case_id)] = tree_outputs
        measured.per_call_s[(name, kind, case_id)] = tree_seconds
    else:
        entry = next(e for e in plan.end_to_end[name] if e.target.name == case_id)
        target = entry.target
        seed = derive_seed(config.seed, "warm-up", name, target.name)
        generate_sequences(target.generator, target.prompt_ids, target.new_tokens, 1, seed,
                           timeout_s=timeout)
        # A batching engine is timed on one full batch: its cost per sequence falls with size.
        timed = target.generator.batch_size if isinstance(target.generator, GeneratesBatches) \
            else 2
        _, inside = generate_sequences(
            target.generator, target.prompt_ids, target.new_tokens, timed, derive_seed(seed, 1),
            timeout_s=timeout,
        )
        measured.per_sequence_s[(name, target.name)] = inside / timed


@dataclass(frozen=True)
class BudgetFit:
    """The design a time budget allows.

    Attributes:
        config: the run's config at the fitted design TV (``cases`` narrowed when cases
            were dropped).
        estimate_s: estimated sampling seconds of the fitted plan, by target.
        dropped: case ids left out because even the coarsest design did not fit, or the
            warm-up had no time for them.
        warm_up_s: seconds the warm-up took.
        claim: the sentence printed before sampling.
        warm_up: what the warm-up drew (the run checks it).
        interrupted: an interruption ended the warm-up (``config`` is then the requested
            design, unfitted: nothing more is sampled).
    """

    config: RunConfig
    estimate_s: dict[str, float]
    dropped: tuple[str, ...]
    warm_up_s: float
    claim: str
    warm_up: WarmUp = field(default_factory=WarmUp)
    interrupted: bool = False


@functools.lru_cache(maxsize=4096)
def _chain_plan(case: ChainCase, config: RunConfig, alpha: float) -> ChainCasePlan:
    return _chain_case_plan(case, config, alpha)


@functools.lru_cache(maxsize=4096)
def _tree_plan(case: TreeCase, config: RunConfig, alpha: float) -> TreeCasePlan:
    return _tree_case_plan(case, config, alpha)


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
            grid = _chain_plan(case, config, chain_alpha)
            sizes = [
                size
                for chunk in range(grid.n_chunks)
                for size in call_schedule(case, grid.chunk_size(chunk), ramp=True)
            ]
            mine[case.case_id] = cost.seconds(sizes)
        for tree_case in plan.tree_cases:
            per_call = measured.per_call_s.get((adapter.name, UnitKind.TREE, tree_case.case_id))
            if per_call is None or (cases is not None and tree_case.case_id not in cases):
                continue
            trees = _tree_plan(tree_case, config, plan.record.alpha_split.fixed).n_steps
            mine[tree_case.case_id] = per_call * math.ceil(trees / tree_case.batch_size)
        for (target, kind, case_id), per_call in measured.per_call_s.items():
            wanted = cases is None or case_id in cases
            if target == adapter.name and kind is not UnitKind.TREE and wanted:
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


def needed_steps(plan: RunPlan, tv_grid: list[float]) -> dict[str, list[int]]:
    """Steps every chain and tree case of ``plan`` needs (before caps) at each TV of
    ``tv_grid``, by case id."""
    alpha = plan.record.alpha_split.fixed
    table: dict[str, list[int]] = {}
    configs = [dataclasses.replace(plan.config, tv=tv) for tv in tv_grid]
    for case in plan.chain_cases:
        table[case.case_id] = [_chain_steps(case, config, alpha)[1] for config in configs]
    for tree_case in plan.tree_cases:
        table[tree_case.case_id] = [_tree_steps(tree_case, config, alpha)[1] for config in configs]
    return table


def reached_tvs(
    plan: RunPlan,
    tv_grid: list[float],
    design: Design,
    kept: set[str],
    table: dict[str, list[int]] | None = None,
) -> dict[str, float]:
    """The TV each kept chain and tree case can detect under ``design``: the smallest TV of
    ``tv_grid`` whose plan needs no more steps than the design gives the case; below the
    coarsest, the coarsest TV scaled by ``sqrt(steps it needs / steps given)`` (a detectable
    TV falls as ``1 / sqrt(n)``; pessimistic where the plan's floor of
    :data:`~losslessness.engine.plan.MIN_STEPS` steps, not the test, sets the need), at most
    1. ``table`` is :func:`needed_steps` (computed when None)."""
    tv, cap = design
    config = dataclasses.replace(plan.config, tv=tv, max_steps=cap or plan.config.max_steps)
    alpha = plan.record.alpha_split.fixed
    table = table if table is not None else needed_steps(plan, tv_grid)
    given_steps = {case.case_id: _chain_steps(case, config, alpha)[0] for case in plan.chain_cases}
    given_steps |= {case.case_id: _tree_steps(case, config, alpha)[0] for case in plan.tree_cases}
    reached: dict[str, float] = {}
    for case_id, given in given_steps.items():
        if case_id not in kept:
            continue
        needed = table[case_id]
        reached[case_id] = next(
            (grid_tv for grid_tv, steps in zip(tv_grid, needed, strict=True) if steps <= given),
            min(1.0, tv_grid[-1] * math.sqrt(needed[-1] / max(given, 1))),
        )
    return reached


def _chain_steps(case: ChainCase, config: RunConfig, alpha: float) -> tuple[int, int]:
    grid = _chain_plan(case, config, alpha)
    return grid.ci_steps, grid.needed_steps


def _tree_steps(case: TreeCase, config: RunConfig, alpha: float) -> tuple[int, int]:
    grid = _tree_plan(case, config, alpha)
    return grid.ci_steps, grid.needed_steps


def _best_design(
    plan: RunPlan,
    measured: Throughput,
    tv_grid: list[float],
    table: dict[str, list[int]],
    designs: list[Design],
    room: float,
    kept: set[str],
) -> Design | None:
    """Among ``designs`` whose estimate on the ``kept`` cases fits ``room`` seconds, the one
    whose cases can detect the smallest TVs: the least geometric mean of
    :func:`reached_tvs`, then the smallest design TV (None when none fits)."""
    best: tuple[float, float, Design] | None = None
    for design in designs:
        tv, cap = design
        if _total(estimate_seconds(plan, measured, tv, kept, cap)) > room:
            continue
        reached = reached_tvs(plan, tv_grid, design, kept, table)
        score = (
            sum(math.log(value) for value in reached.values()) / len(reached)
            if reached
            else math.log(tv)
        )
        if best is None or (score, tv) < best[:2]:
            best = (score, tv, design)
    return None if best is None else best[2]


def fit_time_budget(
    config: RunConfig,
    targets: Sequence[Adapter | UnavailableTarget],
    device_note: str | None = None,
    began: float | None = None,
) -> BudgetFit:
    """Warm up, then choose the design that fits :data:`FIT_FRACTION` of
    ``config.time_budget_s`` and lets the cases detect the smallest TVs.

    The designs are pairs (design TV, step cap): the TV from ``config.tv`` up by factors of
    :data:`TV_GROWTH` to :data:`MAX_TV`, the cap from none down by :data:`CAP_STEP` to
    :data:`MIN_CAP` (a cap binds only the cases that need more steps, and those detect a
    coarser TV than the design's). Among those whose estimate fits, the chosen one has the
    least geometric mean, over the chain and tree cases, of the TV each case's steps can
    detect (:func:`reached_tvs`), then the smallest design TV: so one case whose cost hardly
    falls with the TV (a fully pooled V = 4096) is capped instead of coarsening every other
    case's claim. Breadth comes first: cases are dropped (those that cost most at the
    coarsest design first, named in the claim, at least one kept) only while the others
    cannot fit even at the coarsest design. Sampling stops at the deadline whatever the
    estimate. The time budget sizes the run itself: the fitted config's multiplier of the CI
    plan's steps (``budget``, the nightly's ``--budget``) is 1, whatever ``config`` had, so
    the claimed TV is the one the planned steps detect (a multiplier below 1 left in place
    would scale the steps down after the fit and leave the claim too fine).

    The budget counts from ``began``: the warm-up (which starts no call after
    :data:`WARM_UP_FRACTION` of the budget; the cases it reached on no target are dropped)
    and the fit's own search are inside it.

    Args:
        config: the requested design, with ``time_budget_s`` set.
        targets: the run's targets.
        device_note: as :func:`losslessness.engine.plan.plan_run`'s.
        began: ``time.perf_counter()`` value the budget counts from (default: now).

    Returns:
        :class:`BudgetFit`.

    Raises:
        ValueError: naming ``time_budget_s`` when the config has none.
    """
    budget = config.time_budget_s
    if budget is None:
        raise ValueError("time_budget_s: the config has no time budget to fit")
    began = time.perf_counter() if began is None else began
    config = dataclasses.replace(config, step_multiplier=1.0)
    plan = plan_run(config, targets, device_note)
    measured = measure_throughput(plan, began + WARM_UP_FRACTION * budget)
    if measured.interrupted:
        claim = f"interrupted during the {measured.warm_up_s:.1f} s warm-up: nothing more sampled"
        return BudgetFit(config, {}, (), measured.warm_up_s, claim, plan.warm_up, True)
    pairs = {(adapter.name, c) for adapter in plan.adapters
             for _, c in _warm_up_cases(plan, adapter)}
    reached = {case_id for _, case_id in pairs - measured.not_reached}
    unreached = sorted({case_id for _, case_id in measured.not_reached} - reached)
    room = FIT_FRACTION * budget - (time.perf_counter() - began)
    tv_grid = [config.tv]
    while tv_grid[-1] < MAX_TV:
        tv_grid.append(float(f"{min(MAX_TV, tv_grid[-1] * TV_GROWTH):.3g}"))
    largest = max(
        [_chain_steps(case, config, plan.record.alpha_split.fixed)[0] for case in plan.chain_cases]
        + [_tree_steps(case, config, plan.record.alpha_split.fixed)[0] for case in plan.tree_cases]
        + [MIN_CAP]
    )
    caps: list[int | None] = [None]
    cap = float(largest)
    while cap > MIN_CAP:
        cap = max(MIN_CAP, cap / CAP_STEP)
        caps.append(int(cap))
    designs: list[Design] = [(tv, cap_) for tv in tv_grid for cap_ in caps]
    coarsest: Design = (MAX_TV, MIN_CAP)
    floor = estimate_seconds(plan, measured, coarsest[0], None, coarsest[1])
    by_case: dict[str, float] = {}
    for per_target in floor.values():
        for case_id, value in per_target.items():
            by_case[case_id] = by_case.get(case_id, 0.0) + value
    kept = set(by_case) - set(unreached)
    dropped: list[str] = []
    # Breadth first: a case is dropped only while the kept ones cannot fit even at the
    # coarsest design, the one that costs most there first.
    for case_id in sorted(by_case, key=lambda c: -by_case[c]):
        if len(kept) == 1 or sum(by_case[c] for c in kept) <= room:
            break
        kept.discard(case_id)
        dropped.append(case_id)
    table = needed_steps(plan, tv_grid)
    design = _best_design(plan, measured, tv_grid, table, designs, room, kept) or coarsest
    tv, steps_cap = design
    if steps_cap is not None:
        # Where the cap binds every case, the design TV sizes nothing: claim the finest TV a
        # case reaches instead.
        tv = max(tv, min(reached_tvs(plan, tv_grid, design, kept, table).values(), default=tv))
    tv = min(tv, MAX_TV)
    seconds = estimate_seconds(plan, measured, tv, kept, steps_cap)
    fitted = dataclasses.replace(
        config,
        tv=tv,
        max_steps=steps_cap or config.max_steps,
        cases=(
            tuple(sorted(_kept_cases(plan, [*dropped, *unreached])))
            if dropped or unreached
            else config.cases
        ),
        dropped_cases=(*dropped, *unreached),
    )
    estimate = {name: sum(by_case.values()) for name, by_case in seconds.items()}
    names = ", ".join(adapter.name for adapter in plan.adapters)
    n_cases = len({case_id for by_case in seconds.values() for case_id in by_case})
    claim = (
        f"in {budget:g} s, {names} allow{'s' if len(plan.adapters) == 1 else ''} "
        f"TV >= {tv:.3g} at power {config.power:g} on {n_cases} cases"
        + _capped_note(plan, tv_grid, table, (tv, steps_cap), kept)
        + f" (estimated sampling {_total(seconds):.0f} s after a {measured.warm_up_s:.1f} s "
        "warm-up)"
    )
    if tv > config.tv:
        claim += f"; the requested TV {config.tv:g} would need about " + (
            f"{_total(estimate_seconds(plan, measured, config.tv)):.0f} s"
        )
    if dropped:
        claim += f"; dropped as too slow for the budget: {', '.join(dropped)}"
    if unreached:
        claim += f"; dropped, the warm-up had no time for them: {', '.join(unreached)}"
    if measured.failures:
        claim += "; warm-up failed on " + ", ".join(
            f"{name} ({why})" for name, why in measured.failures.items()
        )
    return BudgetFit(fitted, estimate, tuple([*dropped, *unreached]), measured.warm_up_s, claim,
                     plan.warm_up)


def _capped_note(
    plan: RunPlan,
    tv_grid: list[float],
    table: dict[str, list[int]],
    design: Design,
    kept: set[str],
) -> str:
    """What the step cap costs, for the claim: the cases it holds above the design TV."""
    tv, cap = design
    if cap is None:
        return ""
    above = {
        case_id: reached
        for case_id, reached in reached_tvs(plan, tv_grid, design, kept, table).items()
        if reached > tv * (1 + 1e-9)
    }
    if not above:
        return f", at most {cap} steps per case"
    shown = ", ".join(
        f"{case_id} TV {_tv_text(value, tv_grid[-1])}"
        for case_id, value in sorted(above.items(), key=lambda item: -item[1])
    )
    return f", at most {cap} steps per case (so these reach only: {shown})"


def _tv_text(value: float, largest: float) -> str:
    return f"~{value:.2g}" if value > largest else f"{value:.3g}"


def _kept_cases(plan: RunPlan, dropped: Sequence[str]) -> list[str]:
    every = [case.case_id for case in plan.chain_cases]
    every += [case.case_id for case in plan.greedy_cases]
    every += [case.case_id for case in plan.tree_cases]
    every += [case.case_id for case in plan.greedy_tree_cases]
    every += [entry.target.name for entries in plan.end_to_end.values() for entry in entries]
    return [case_id for case_id in dict.fromkeys(every) if case_id not in dropped]


def make_budgeted_plan(
    config: RunConfig,
    greedy: bool = False,
    announce: Callable[[str], None] | None = None,
    in_process: bool = False,
) -> tuple[RunPlan, float | None, str | None]:
    """:func:`make_plan`, fitted to ``config.time_budget_s`` when set
    (:func:`plan_within_budget`); ``in_process`` loads every target in this process
    (``--in-process``).

    Raises:
        ValueError: unknown or repeated target names, or unknown case ids.
    """
    note = load_device_checks()[1] if config.device_checks else None
    targets = resolve_targets(
        config.targets, greedy=greedy, in_process=True if in_process else None
    )
    return plan_within_budget(config, targets, note, announce)


def plan_within_budget(
    config: RunConfig,
    targets: Sequence[Adapter | UnavailableTarget],
    device_note: str | None = None,
    announce: Callable[[str], None] | None = None,
) -> tuple[RunPlan, float | None, str | None]:
    """The run's plan; with a time budget, fitted to it first
    (:func:`losslessness.engine.time_budget.fit_time_budget`, its claim passed to ``announce``
    before any sampling).

    The budget counts from here: the warm-up, the fit and the sampling are inside it. The
    warm-up's samples travel in the plan (``RunPlan.warm_up``), checked with the run's. An
    interrupted warm-up gives the requested design's plan; the interruption stays recorded
    (:mod:`losslessness.engine.interrupts`), so the shard samples nothing more and records
    every unit INCOMPLETE.

    Returns:
        (the plan; the ``time.perf_counter()`` deadline of every unit's sampling, or None; the
        budget's claim, or None).
    """
    if config.time_budget_s is None:
        return plan_run(config, targets, device_note), None, None
    began = time.perf_counter()
    fit = fit_time_budget(config, targets, device_note, began)
    if announce is not None:
        announce(fit.claim)
    plan = plan_run(fit.config, targets, device_note)
    plan.warm_up = fit.warm_up
    return plan, began + DEADLINE_FRACTION * config.time_budget_s, fit.claim


__all__ = [
    "CAP_STEP",
    "DEADLINE_FRACTION",
    "FIT_FRACTION",
    "MAX_TV",
    "MIN_CAP",
    "TV_GROWTH",
    "WARM_UP_FRACTION",
    "WARM_UP_STEPS",
    "BudgetFit",
    "CallCost",
    "Throughput",
    "estimate_seconds",
    "fit_time_budget",
    "make_budgeted_plan",
    "measure_throughput",
    "plan_within_budget",
    "reached_tvs",
]
