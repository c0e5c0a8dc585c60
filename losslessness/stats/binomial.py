"""Acceptance-rate test: is the observed acceptance proportion consistent with its expected rate?

Contract (in the manner of TFP's ``statistical_testing``):

- **Correct code fails rarely.** If ``successes ~ Binomial(n, expected_rate)``, the exact
  two-sided test gives ``pvalue <= alpha`` with probability at most ``alpha`` (exact test, no
  approximation; conservative because the binomial is discrete).
- **Code whose rate is off by more than the minimum detectable shift fails with the stated
  power**; :func:`losslessness.stats.power.binomial_minimum_detectable_shift` gives that shift
  for ``n``.
- **Nothing is claimed below it.**

The direction matters to the verdict (DESIGN.md section 4): an acceptance rate significantly
*higher* than ``sum(min(p, q))`` proves loss, significantly *lower* is only suboptimal. The test is
two-sided; :attr:`BinomialTestResult.direction` says which side the observation fell on.
"""

from __future__ import annotations

from dataclasses import dataclass

import scipy.stats

from losslessness.stats.identity import _check_nonnegative_int, _check_real

__all__ = ["RATE_CLIP_TOLERANCE", "BinomialTestResult", "acceptance_rate_test"]

RATE_CLIP_TOLERANCE = 1e-12
"""Expected rates this far outside [0, 1] are clipped (float round-off in ``sum(min(p, q))``)."""


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


def _check_rate(value: object, name: str) -> float:
    rate = _check_real(value, name)
    if not -RATE_CLIP_TOLERANCE <= rate <= 1.0 + RATE_CLIP_TOLERANCE:
        raise ValueError(f"{name}: must lie in [0, 1], got {rate!r}")
    return min(max(rate, 0.0), 1.0)


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
    k = _check_nonnegative_int(successes, "successes")
    trials = _check_nonnegative_int(n, "n")
    if k > trials:
        raise ValueError(f"successes: {k} exceeds n = {trials}")
    rate = _check_rate(expected_rate, "expected_rate")
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
