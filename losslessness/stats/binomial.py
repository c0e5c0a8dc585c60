"""Acceptance-rate test: is the observed acceptance proportion consistent with its expected rate?

Contract (in the manner of TFP's ``statistical_testing``):

- **Correct code fails rarely.** If ``successes ~ Binomial(n, expected_rate)``, the exact
  two-sided test gives ``pvalue <= alpha`` with probability at most ``alpha`` (exact test, no
  approximation; conservative because the binomial is discrete).
- **Code whose rate is off by more than the minimum detectable shift fails with the stated
  power**; :func:`losslessness.stats.power.acceptance_rate_minimum_detectable_shift` gives that
  shift for ``n``, and :func:`losslessness.stats.power.acceptance_rate_sample_size` the ``n``
  for a shift.
- **Nothing is claimed below it.**

The triples: :func:`acceptance_rate_test` / ``power.acceptance_rate_minimum_detectable_shift``
/ ``power.acceptance_rate_sample_size``; :func:`rate_bound_test` /
:func:`rate_bound_minimum_detectable_shift` / ``power.rate_bound_sample_size`` (the sample
sizes live in :mod:`losslessness.stats.power`, which imports this module).

The direction matters to the verdict (docs/architecture.md, 'What lossless means'): an acceptance
rate significantly *higher* than ``sum(min(p, q))`` proves loss, significantly *lower* is only
suboptimal. The test is two-sided; :attr:`BinomialTestResult.direction` says which side the
observation fell on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import scipy.optimize
import scipy.special
import scipy.stats

from losslessness.stats.validation import (
    check_nonnegative_int,
    check_open_unit_interval,
    check_rate,
)

__all__ = [
    "BinomialTestResult",
    "acceptance_rate_test",
    "rate_bound_minimum_detectable_shift",
    "rate_bound_test",
]

@dataclass(frozen=True)
class BinomialTestResult:
    """Outcome of :func:`acceptance_rate_test`.

    Attributes:
        statistic: observed proportion ``successes / n`` (``nan`` when ``n == 0``).
        pvalue: exact two-sided p-value (``scipy.stats.binomtest``, likelihood ordering);
            ``1.0`` when ``n == 0``.
        n: number of trials.
        successes: number of successes.
        expected_rate: the null rate, clipped into [0, 1].
        direction: ``"higher"``, ``"lower"`` or ``"as expected"``: the observed proportion
            against ``expected_rate`` (``"as expected"`` when equal or when ``n == 0``).
    """

    statistic: float
    pvalue: float
    n: int
    successes: int
    expected_rate: float
    direction: str


def acceptance_rate_test(successes: int, n: int, expected_rate: float) -> BinomialTestResult:
    """Exact two-sided binomial test of ``successes`` out of ``n`` against ``expected_rate``.

    Args:
        successes: integer in ``[0, n]``.
        n: number of trials, integer ``>= 0``.
        expected_rate: null success probability in ``[0, 1]``; values within 1e-12 outside are
            clipped (round-off), anything further out is an error.

    Returns:
        :class:`BinomialTestResult`. At ``expected_rate`` 0 (or 1), observing any success (or
        failure) is impossible under the null and gives ``pvalue == 0.0``.

    Raises:
        ValueError: naming ``successes``, ``n`` or ``expected_rate``: not an integer, negative,
            ``successes > n``, rate NaN or outside [0, 1].

    Notes:
        ``scipy.stats.binomtest(successes, n, expected_rate, alternative="two-sided")``: the
        p-value sums the probabilities of all outcomes no more likely than the observed one
        (the "minlike" method).
    """
    k = check_nonnegative_int(successes, "successes")
    trials = check_nonnegative_int(n, "n")
    if k > trials:
        raise ValueError(f"successes: {k} exceeds n = {trials}")
    rate = check_rate(expected_rate, "expected_rate")
    if trials == 0:
        return BinomialTestResult(
            statistic=float("nan"),
            pvalue=1.0,
            n=0,
            successes=0,
            expected_rate=rate,
            direction="as expected",
        )
    if (rate == 0.0 and k > 0) or (rate == 1.0 and k < trials):
        # Impossible under the null; stated here rather than left to binomtest's edge handling.
        pvalue = 0.0
    else:
        pvalue = float(scipy.stats.binomtest(k, trials, rate, alternative="two-sided").pvalue)
    proportion = k / trials
    if proportion > rate:
        direction = "higher"
    elif proportion < rate:
        direction = "lower"
    else:
        direction = "as expected"
    return BinomialTestResult(
        statistic=proportion,
        pvalue=pvalue,
        n=trials,
        successes=k,
        expected_rate=rate,
        direction=direction,
    )


_ALTERNATIVES = ("greater", "less")


def _check_alternative(alternative: object) -> str:
    if alternative not in _ALTERNATIVES:
        raise ValueError(f"alternative: must be 'greater' or 'less', got {alternative!r}")
    return str(alternative)


def rate_bound_test(successes: int, n: int, bound: float, alternative: str) -> BinomialTestResult:
    """Exact one-sided binomial test of a *bound* on the success rate.

    ``alternative="greater"`` tests the null "rate <= bound" (p-value ``P(K >= successes)``
    under ``Binomial(n, bound)``); ``"less"`` tests "rate >= bound" (``P(K <= successes)``).
    The binomial tail is monotone in the rate, so the p-value is valid (at most ``alpha``
    with probability at most ``alpha``) for every rate in the composite null, and exact at the
    bound itself.

    Args:
        successes: integer in ``[0, n]``.
        n: number of trials, integer ``>= 0``.
        bound: the rate bound in ``[0, 1]`` (values within 1e-12 outside are clipped).
        alternative: ``"greater"`` or ``"less"``.

    Returns:
        :class:`BinomialTestResult` (``expected_rate`` is the bound; ``direction`` compares
        the observed proportion with it). ``pvalue`` is 1.0 when ``n == 0``.

    Raises:
        ValueError: naming ``successes``, ``n``, ``bound`` or ``alternative``.

    Notes:
        ``scipy.special.bdtrc(successes - 1, n, bound)`` and ``bdtr(successes, n, bound)``:
        the binomial survival and distribution functions (what ``scipy.stats.binomtest(...,
        alternative=...)`` returns, without its per-call overhead).
    """
    k = check_nonnegative_int(successes, "successes")
    trials = check_nonnegative_int(n, "n")
    if k > trials:
        raise ValueError(f"successes: {k} exceeds n = {trials}")
    rate = check_rate(bound, "bound")
    side = _check_alternative(alternative)
    if trials == 0:
        return BinomialTestResult(float("nan"), 1.0, 0, 0, rate, "as expected")
    if side == "greater":
        pvalue = 1.0 if k == 0 else float(scipy.special.bdtrc(k - 1, trials, rate))
    else:
        pvalue = 1.0 if k == trials else float(scipy.special.bdtr(k, trials, rate))
    proportion = k / trials
    direction = "higher" if proportion > rate else "lower" if proportion < rate else "as expected"
    return BinomialTestResult(proportion, min(max(pvalue, 0.0), 1.0), trials, k, rate, direction)


def rate_bound_minimum_detectable_shift(
    n: int, bound: float, alpha: float, power: float, alternative: str
) -> float:
    """Smallest shift beyond ``bound`` that :func:`rate_bound_test` detects with ``power``.

    The rejection region at level ``alpha`` is ``{K >= c}`` (``"greater"``) or ``{K <= c}``
    (``"less"``), with ``c`` the exact critical count; the power at ``bound + delta`` (or
    ``bound - delta``) is that region's binomial probability, solved for ``delta`` with
    ``scipy.optimize.brentq``. Exact, no normal approximation.

    Args:
        n: number of trials, integer ``>= 0``.
        bound: the rate bound in [0, 1].
        alpha: the test's level, in (0, 1).
        power: required power, in (0, 1).
        alternative: ``"greater"`` or ``"less"``.

    Returns:
        ``delta`` in probability units (the TV between Bernoulli(bound) and the detected
        Bernoulli); ``math.inf`` when ``n == 0``, when there is no room beyond the bound, or
        when even a rate of 1 (or 0) is not detected with ``power``.

    Raises:
        ValueError: naming the invalid argument.
    """
    trials = check_nonnegative_int(n, "n")
    rate = check_rate(bound, "bound")
    level = check_open_unit_interval(alpha, "alpha")
    target = check_open_unit_interval(power, "power")
    side = _check_alternative(alternative)
    room = 1.0 - rate if side == "greater" else rate
    if trials == 0 or room <= 0.0:
        return math.inf
    binomial = scipy.stats.binom(trials, rate)
    if side == "greater":
        # Smallest c with P(K >= c) <= level; isf gives it up to rounding: adjust exactly.
        critical = int(binomial.isf(level)) + 1
        while critical > 0 and rate_bound_test(critical - 1, trials, rate, side).pvalue <= level:
            critical -= 1
        while critical <= trials and rate_bound_test(critical, trials, rate, side).pvalue > level:
            critical += 1
        if critical > trials:
            return math.inf

        def detection(true_rate: float) -> float:
            return float(scipy.special.bdtrc(critical - 1, trials, true_rate))

        sign = 1.0
    else:
        critical = int(binomial.ppf(level)) - 1
        while (
            critical < trials and rate_bound_test(critical + 1, trials, rate, side).pvalue <= level
        ):
            critical += 1
        while critical >= 0 and rate_bound_test(critical, trials, rate, side).pvalue > level:
            critical -= 1
        if critical < 0:
            return math.inf

        def detection(true_rate: float) -> float:
            return float(scipy.special.bdtr(critical, trials, true_rate))

        sign = -1.0

    def shortfall(delta: float) -> float:
        return detection(min(max(rate + sign * delta, 0.0), 1.0)) - target

    if shortfall(room) < 0.0:
        return math.inf
    if shortfall(0.0) >= 0.0:
        return 0.0
    return float(scipy.optimize.brentq(shortfall, 0.0, room, xtol=1e-12, rtol=1e-10))
