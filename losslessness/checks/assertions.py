"""Which assertions a chain case makes.

The run's false-alarm budget is split over statistical assertions before any sample is drawn,
so the assertions are decided from the case's exact laws alone (never from the samples). Only
assertions whose samples depend on the target are made: where the standard algorithm accepts a
draft with probability exactly 1 (p == q at that position), the token emitted there is the
run's own draft, so a law test there would test the run's sampler, not the target.
"""

from __future__ import annotations

from losslessness.cases import ChainCase
from losslessness.checks.ids import ACCEPTANCE_CHECK_ID, INDEPENDENCE_CHECK_ID, LAW_CHECK_ID
from losslessness.laws import ChainLaws

RATE_TOLERANCE = 1e-12
"""An acceptance probability within this of 0 or 1 is treated as exactly 0 or 1 (float64
rounding of sum min(p, q) when p == q or the supports are disjoint)."""

def case_laws(case: ChainCase) -> list[ChainLaws]:
    """Exact laws of each row type of ``case`` (cached on the case, :attr:`ChainCase.laws`)."""
    return list(case.laws)


def is_reachable(laws: ChainLaws, position: int) -> bool:
    """Whether the step reaches ``position`` with positive probability."""
    return float(laws.reach[position]) > RATE_TOLERANCE


def emits_target_randomness(laws: ChainLaws, position: int) -> bool:
    """Whether the token emitted at ``position`` can come from the target's own randomness:
    the bonus position always; a draft position unless its draft is accepted with probability
    exactly 1 (then the emitted token is the run's draft, d ~ q = p)."""
    return position >= int(laws.acceptance.shape[0]) or exact_acceptance(laws, position) != 1.0


def law_is_statistical(laws: ChainLaws, position: int) -> bool:
    """A reachable position whose p has two or more positive cells, and whose emitted token
    depends on the target (:func:`emits_target_randomness`), needs an identity test; with one
    positive cell (one-hot p) the law is checked exactly."""
    return (
        is_reachable(laws, position)
        and int((laws.emitted[position] > 0).sum()) >= 2
        and emits_target_randomness(laws, position)
    )


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


def independence_is_statistical(laws: ChainLaws, steps_per_call: int) -> bool:
    """Whether a row type makes an independence assertion: its first token has two or more
    possible values, depends on the target (:func:`emits_target_randomness`), and each call
    carries at least two copies of the row (``steps_per_call``)."""
    first = laws.emitted[0]
    return int((first > 0).sum()) >= 2 and emits_target_randomness(laws, 0) and steps_per_call >= 2


def count_statistical_assertions(
    case: ChainCase, steps_per_call: int, check_ids: tuple[str, ...] = ()
) -> int:
    """Number of statistical assertions ``case`` makes when each verifier call carries
    ``steps_per_call`` copies of its row types: identity tests (``law``), acceptance tests
    (``acceptance``) and independence tests (``independence``); only those whose check id is
    in ``check_ids`` when it is not empty."""
    wanted = set(check_ids or (LAW_CHECK_ID, ACCEPTANCE_CHECK_ID, INDEPENDENCE_CHECK_ID))
    total = 0
    for laws in case_laws(case):
        if LAW_CHECK_ID in wanted:
            total += sum(law_is_statistical(laws, i) for i in range(case.k + 1))
        if ACCEPTANCE_CHECK_ID in wanted:
            total += sum(acceptance_is_statistical(laws, i) for i in range(case.k))
        if INDEPENDENCE_CHECK_ID in wanted:
            total += independence_is_statistical(laws, steps_per_call)
    return total
