"""Which assertions a case makes, and how many verification steps they need.

The run's false-alarm budget is split over statistical assertions before any sample is drawn,
so the assertions are decided from the case's exact laws alone (never from the samples).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from losslessness.checks.cases import ChainCase
from losslessness.checks.sampling import rows_per_call
from losslessness.reference.laws import ChainLaws, chain_laws
from losslessness.stats import plan_identity_test

RATE_TOLERANCE = 1e-12
"""An acceptance probability within this of 0 or 1 is treated as exactly 0 or 1 (float64
rounding of sum min(p, q) when p == q or the supports are disjoint)."""

MIN_STEPS = 2000
"""Fewest verification steps per row type, so that exact checks and acceptance tests see
enough samples even where the identity tests need few."""


def case_laws(case: ChainCase) -> list[ChainLaws]:
    """Exact laws of each row type of ``case``."""
    return [chain_laws(case.target_probs[r], case.draft_probs[r]) for r in range(case.n_rows)]


def is_reachable(laws: ChainLaws, position: int) -> bool:
    """Whether the step reaches ``position`` with positive probability."""
    return float(laws.reach[position]) > RATE_TOLERANCE


def law_is_statistical(laws: ChainLaws, position: int) -> bool:
    """A reachable position whose p has two or more positive cells needs an identity test;
    with one positive cell (one-hot p) the law is checked exactly."""
    return is_reachable(laws, position) and int((laws.emitted[position] > 0).sum()) >= 2


def exact_acceptance(laws: ChainLaws, position: int) -> float | None:
    """0.0 or 1.0 when the acceptance probability at ``position`` is exactly that, else None."""
    rate = float(laws.acceptance[position])
    if rate <= RATE_TOLERANCE:
        return 0.0
    if rate >= 1.0 - RATE_TOLERANCE:
        return 1.0
    return None


def acceptance_is_statistical(laws: ChainLaws, position: int) -> bool:
    """A reachable draft position whose acceptance probability lies strictly in (0, 1)."""
    return is_reachable(laws, position) and exact_acceptance(laws, position) is None


def independence_is_statistical(case: ChainCase, row: int) -> bool:
    """Whether row type ``row`` of ``case`` makes an independence assertion: its first token
    has two or more possible values and each call carries at least two copies of the row."""
    first = case_laws(case)[row].emitted[0]
    return int((first > 0).sum()) >= 2 and rows_per_call(case) >= 2


def count_statistical_assertions(case: ChainCase, check_ids: tuple[str, ...] = ()) -> int:
    """Number of statistical assertions ``case`` makes: identity tests (``law``), acceptance
    tests (``acceptance``) and independence tests (``independence``); only those whose check
    id is in ``check_ids`` when it is not empty."""
    wanted = set(check_ids or ("law", "acceptance", "independence"))
    total = 0
    for row, laws in enumerate(case_laws(case)):
        if "law" in wanted:
            total += sum(law_is_statistical(laws, i) for i in range(case.k + 1))
        if "acceptance" in wanted:
            total += sum(acceptance_is_statistical(laws, i) for i in range(case.k))
        if "independence" in wanted:
            total += independence_is_statistical(case, row)
    return total


@dataclass(frozen=True)
class CasePlan:
    """Verification steps one case needs.

    Attributes:
        n_steps: steps per row type.
        needed_steps: steps the design (tv, alpha, power) asks for, before the cap.
        capped: True when ``max_steps`` cut ``needed_steps``; the results then report a
            minimum detectable TV above the requested one.
    """

    n_steps: int
    needed_steps: int
    capped: bool


def plan_case(case: ChainCase, tv: float, alpha: float, power: float, max_steps: int) -> CasePlan:
    """Steps needed so that every identity test of ``case`` detects TV >= ``tv``.

    Position i of row r is reached with probability ``reach[r, i]``, so it needs about
    ``n_i / reach[r, i]`` steps (plus three binomial standard deviations) for the ``n_i``
    samples of its identity test
    (:func:`losslessness.stats.plan_identity_test`); exact checks need
    ``log(1 - power) / log(1 - tv)`` observations.

    Args:
        case: the case.
        tv: design TV distance in (0, 1].
        alpha: per-assertion significance level.
        power: design power 1 - beta.
        max_steps: cap on the steps per row type.

    Returns:
        :class:`CasePlan`.
    """
    exact_n = math.ceil(math.log1p(-power) / math.log1p(-min(tv, 1 - 1e-12)))
    needed = max(MIN_STEPS, exact_n)
    for laws in case_laws(case):
        for i in range(case.k + 1):
            if not law_is_statistical(laws, i):
                continue
            plan = plan_identity_test(laws.emitted[i].numpy(), tv, alpha, power, max_n=max_steps)
            reach = float(laws.reach[i])
            # The count reaching position i is Binomial(steps, reach); three standard
            # deviations of head-room keep it at or above plan.n in all but ~0.1% of runs.
            needed = max(needed, math.ceil((plan.n + 3 * math.sqrt(plan.n * (1 - reach))) / reach))
    return CasePlan(min(needed, max_steps), needed, needed > max_steps)
