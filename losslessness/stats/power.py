"""Power and sample size: the smallest discrepancy each test detects at n, and the n it needs.

Contract (in the manner of TFP's ``statistical_testing``): every fixed-n test in
:mod:`losslessness.stats` comes as a triple -- the assertion, the smallest discrepancy it detects
at ``n`` with power ``power`` at level ``alpha``, and the ``n`` it needs for a given
discrepancy. The triples (assertion / minimum detectable discrepancy at n / n for a
discrepancy):

- chi-square(df) test (its power, the assertion's sizing model): :func:`chi_square_power` /
  :func:`chi_square_minimum_detectable_tv` / :func:`chi_square_sample_size`;
- :func:`~losslessness.stats.identity.identity_test` /
  :func:`identity_minimum_detectable_tv` / :func:`plan_identity_test` (an :class:`IdentityPlan`:
  the n with its partition and bound);
- :func:`~losslessness.stats.two_sample.two_sample_test` /
  :func:`~losslessness.stats.two_sample.two_sample_minimum_detectable_tv` /
  :func:`~losslessness.stats.two_sample.two_sample_sample_size`;
- :func:`~losslessness.stats.binomial.acceptance_rate_test` /
  :func:`acceptance_rate_minimum_detectable_shift` / :func:`acceptance_rate_sample_size`;
- :func:`~losslessness.stats.binomial.rate_bound_test` /
  :func:`~losslessness.stats.binomial.rate_bound_minimum_detectable_shift` /
  :func:`rate_bound_sample_size`;
- an exact "never happens" check (zero-mass tokens, structure; false-alarm rate 0) /
  :func:`exact_check_minimum_detectable_rate` / :func:`exact_check_sample_size`.

The anytime-valid e-processes (:mod:`losslessness.stats.sequential`) and the run-level
uniformity test (:mod:`losslessness.stats.uniformity`) have no triple: they only add power on
top of the fixed-n tests, which carry the stated minimum detectable TV.

Discrepancies are total-variation (TV) distances, in probability units. Deviations larger than
the minimum detectable TV are caught with at least the stated power; nothing is claimed below it.

Chi-square power uses the noncentral chi-square approximation (Cohen 1988, ch. 7): under an
alternative q the statistic is approximately noncentral chi-square(df) with noncentrality
``n * w**2``, ``w**2 = sum((q - p)**2 / p)`` (Cohen's effect size w). By Cauchy-Schwarz,
``2 TV = sum |q - p| = sum (|q - p| / sqrt(p)) sqrt(p) <= w``, so ``w = 2 * tv`` is the
*least* detectable effect among all alternatives at TV ``tv`` and bounds their power from below
(asymptotically; the equality case spreads the change in proportion to p).

References:
    Cohen, J. (1988). Statistical Power Analysis for the Behavioral Sciences, 2nd ed., ch. 7
    (effect size w, noncentral chi-square power).
    Cressie, N. and Read, T. R. C. (1984). Multinomial goodness-of-fit tests. JRSS B 46(3).
    Paninski, L. (2008). A coincidence-based test for uniformity given very sparsely sampled
    discrete data. IEEE Trans. Inf. Theory 54(10) (sqrt(V) / eps^2 samples are necessary).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.optimize
import scipy.special
import scipy.stats
from numpy.typing import ArrayLike, NDArray

from losslessness.stats.binomial import acceptance_rate_test, rate_bound_minimum_detectable_shift
from losslessness.stats.identity import (
    EXPECTED_COUNT_FLOOR,
    as_probs,
    pooling_partition_unchecked,
)
from losslessness.stats.validation import (
    check_expected_floor,
    check_nonnegative_int,
    check_open_unit_interval,
    check_rate,
    check_tv,
)

__all__ = [
    "IdentityPlan",
    "acceptance_rate_minimum_detectable_shift",
    "acceptance_rate_sample_size",
    "chi_square_minimum_detectable_tv",
    "chi_square_power",
    "chi_square_sample_size",
    "exact_check_minimum_detectable_rate",
    "exact_check_sample_size",
    "identity_minimum_detectable_tv",
    "plan_identity_test",
    "rate_bound_sample_size",
]

_MAX_SEARCH_N = 2**60
"""Upper end of :func:`plan_identity_test`'s search when no ``max_n`` is given."""


@functools.lru_cache(maxsize=4096)
def _noncentrality(df: int, alpha: float, power: float) -> float:
    """Noncentrality lambda at which the level-``alpha`` chi-square(df) test has ``power``.

    ``scipy.special.chndtrinc`` inverts the noncentral chi-square CDF in its noncentrality
    (cdflib): ``ncx2.sf(chi2.isf(alpha, df), df, lambda) = power`` to ~1e-15 over df 1..20000,
    alpha 1e-9..0.05, power 0.1..0.999, a hundred times faster than a root search on ``sf``.
    Cached: :func:`plan_identity_test` asks for the same (df, alpha, power) many times.
    """
    critical = float(scipy.stats.chi2.isf(alpha, df))
    if float(scipy.stats.chi2.sf(critical, df)) >= power:
        # power <= alpha: the test already has it under the null.
        return 0.0
    return float(scipy.special.chndtrinc(critical, df, 1.0 - power))


def chi_square_power(n: int, tv: float, df: int, alpha: float) -> float:
    """Power of the level-``alpha`` chi-square(``df``) test against alternatives at TV ``tv``.

    ``P(ncx2(df, n * w**2) > chi2.isf(alpha, df))`` with ``w = 2 * tv``: a lower bound, up to the
    asymptotic approximation, on the power against *every* alternative at TV ``>= tv`` (see the
    module docstring: ``w >= 2 TV`` by Cauchy-Schwarz).

    Args:
        n: sample size, integer ``>= 0``.
        tv: total-variation distance, in (0, 1].
        df: degrees of freedom, integer ``>= 0``.
        alpha: significance level, in (0, 1).

    Returns:
        Power as a float in [0, 1]; ``0.0`` when ``df == 0`` (nothing is testable), ``alpha``
        when ``n == 0``.

    Raises:
        ValueError: naming the argument that is out of range or of the wrong type.

    Notes:
        Cohen (1988), ch. 7; ``scipy.stats.chi2`` and ``scipy.stats.ncx2``.
    """
    size = check_nonnegative_int(n, "n")
    distance = check_tv(tv)
    dof = check_nonnegative_int(df, "df")
    level = check_open_unit_interval(alpha, "alpha")
    if dof == 0:
        return 0.0
    critical = float(scipy.stats.chi2.isf(level, dof))
    return float(scipy.stats.ncx2.sf(critical, dof, size * (2.0 * distance) ** 2))


def chi_square_minimum_detectable_tv(n: int, df: int, alpha: float, power: float) -> float:
    """Smallest TV that the level-``alpha`` chi-square(``df``) test detects with ``power`` at ``n``.

    Solves ``ncx2.sf(chi2.isf(alpha, df), df, lam) = power`` for the noncentrality ``lam``
    (``scipy.special.chndtrinc``), then ``tv = sqrt(lam / n) / 2`` (``w = 2 tv``). Inverse of
    :func:`chi_square_power` in ``tv``.

    Args:
        n: sample size, integer ``>= 0``.
        df: degrees of freedom, integer ``>= 0``.
        alpha: significance level, in (0, 1).
        power: required power, in (0, 1).

    Returns:
        TV as a float. ``math.inf`` when ``n == 0`` or ``df == 0``. It may exceed 1 (no
        alternative is detected reliably at this ``n``); it is returned as is so callers can
        show it. ``0.0`` when ``power <= alpha``.

    Raises:
        ValueError: naming the argument that is out of range or of the wrong type.

    Notes:
        Cohen (1988), ch. 7.
    """
    size = check_nonnegative_int(n, "n")
    dof = check_nonnegative_int(df, "df")
    level = check_open_unit_interval(alpha, "alpha")
    target = check_open_unit_interval(power, "power")
    if size == 0 or dof == 0:
        return math.inf
    return math.sqrt(_noncentrality(dof, level, target) / size) / 2.0


def chi_square_sample_size(tv: float, df: int, alpha: float, power: float) -> int:
    """Smallest ``n`` with ``chi_square_power(n, tv, df, alpha) >= power``.

    Args:
        tv: total-variation distance to detect, in (0, 1].
        df: degrees of freedom, integer ``>= 1``.
        alpha: significance level, in (0, 1).
        power: required power, in (0, 1).

    Returns:
        Sample size as an int (``0`` when ``power <= alpha``).

    Raises:
        ValueError: naming the argument that is out of range; ``df == 0`` is an error because
            no sample size gives any power.

    Notes:
        Cohen (1988), ch. 7.
    """
    distance = check_tv(tv)
    dof = check_nonnegative_int(df, "df")
    if dof == 0:
        raise ValueError("df: must be >= 1; a one-cell test has no power at any n")
    level = check_open_unit_interval(alpha, "alpha")
    target = check_open_unit_interval(power, "power")
    lam = _noncentrality(dof, level, target)
    n = math.ceil(lam / (2.0 * distance) ** 2)
    # The root is found to ~1e-12; step by one where rounding put n one off the true boundary.
    while n > 0 and chi_square_power(n - 1, distance, dof, level) >= target:
        n -= 1
    while chi_square_power(n, distance, dof, level) < target:
        n += 1
    return n


def exact_check_minimum_detectable_rate(n: int, power: float) -> float:
    """Smallest per-sample violation rate an exact "never happens" check catches with ``power``.

    The check fails on any single occurrence, so it detects a violation rate ``r`` with
    probability ``1 - (1 - r)**n``; the smallest ``r`` reaching ``power`` is
    ``1 - (1 - power)**(1 / n)``. Its false-alarm rate is 0.

    Args:
        n: number of independent samples, integer ``>= 0``.
        power: required detection probability, in (0, 1).

    Returns:
        Rate in probability units as a float; ``math.inf`` when ``n == 0``.

    Raises:
        ValueError: naming ``n`` or ``power``.
    """
    size = check_nonnegative_int(n, "n")
    target = check_open_unit_interval(power, "power")
    if size == 0:
        return math.inf
    # expm1/log1p keep precision when the rate is tiny (large n).
    return -math.expm1(math.log1p(-target) / size)


def exact_check_sample_size(rate: float, power: float) -> int:
    """Smallest ``n`` at which an exact "never happens" check catches a per-sample violation
    rate ``rate`` with ``power``: the inverse of :func:`exact_check_minimum_detectable_rate`,
    ``ceil(log(1 - power) / log(1 - rate))``.

    Args:
        rate: per-sample violation rate to catch, in (0, 1].
        power: required detection probability, in (0, 1).

    Returns:
        Sample size as an int ``>= 1``, with ``exact_check_minimum_detectable_rate(n, power)
        <= rate < exact_check_minimum_detectable_rate(n - 1, power)``.

    Raises:
        ValueError: naming ``rate`` or ``power``.
    """
    violation = check_tv(rate, "rate")
    target = check_open_unit_interval(power, "power")
    if violation == 1.0:
        return 1
    n = max(1, math.ceil(math.log1p(-target) / math.log1p(-violation)))
    # Step by one where rounding put n one off the boundary of the function it inverts.
    while n > 1 and exact_check_minimum_detectable_rate(n - 1, target) <= violation:
        n -= 1
    while exact_check_minimum_detectable_rate(n, target) > violation:
        n += 1
    return n


@dataclass(frozen=True)
class IdentityPlan:
    """Sizing of :func:`identity_test` for one ``probs``: the n, its partition and its bound.

    Attributes:
        n: sample size.
        df: degrees of freedom after pooling at ``n``.
        pooled_mass: null probability of the pooled cell at ``n`` (``0.0`` if none).
        minimum_detectable_tv: honest bound at ``n``: every alternative at TV at least this is
            detected with the requested power;
            ``chi_square_minimum_detectable_tv(n, df, alpha, power) + pooled_mass``
            (``math.inf`` when nothing is testable).
        capped: True when ``max_n`` stopped :func:`plan_identity_test` before the target TV was
            reached (then ``n == max_n`` and the bound is above the target).
    """

    n: int
    df: int
    pooled_mass: float
    minimum_detectable_tv: float
    capped: bool


def _identity_plan(
    p: NDArray[np.float64], n: int, alpha: float, power: float, floor: float
) -> IdentityPlan:
    """:func:`identity_minimum_detectable_tv` on already validated arguments."""
    if int(np.count_nonzero(p)) == 1:
        # One support cell: any mass elsewhere lands on a p == 0 cell, which the exact part
        # catches; TV(p, q) equals that mass, so the exact check's rate is the bound.
        return IdentityPlan(
            n=n,
            df=0,
            pooled_mass=0.0,
            minimum_detectable_tv=exact_check_minimum_detectable_rate(n, power),
            capped=False,
        )
    _, df, pooled_mass = pooling_partition_unchecked(p, n, floor)
    bound = chi_square_minimum_detectable_tv(n, df, alpha, power) + pooled_mass
    return IdentityPlan(
        n=n, df=df, pooled_mass=pooled_mass, minimum_detectable_tv=bound, capped=False
    )


def identity_minimum_detectable_tv(
    probs: ArrayLike,
    n: int,
    alpha: float,
    power: float,
    expected_floor: float = EXPECTED_COUNT_FLOOR,
) -> IdentityPlan:
    """Honest minimum detectable TV of :func:`identity_test` against ``probs`` at ``n``.

    The chi-square only sees the pooled partition (:func:`pooling_partition` at ``n``), so the
    bound adds the pooled cell's null mass ``P(pool)`` to the chi-square's own minimum detectable
    TV on the partition. Why that is enough: for any alternative ``Q``, split
    ``2 TV(P, Q) = sum_unpooled |P_i - Q_i| + sum_pool |P_j - Q_j|``; within the pool
    ``sum_pool |P_j - Q_j| <= P(pool) + Q(pool) <= 2 P(pool) + |Q(pool) - P(pool)|``, hence
    ``TV(P, Q) <= TV_partition(P, Q) + P(pool)``. So ``TV(P, Q) >= mdtv_partition + P(pool)``
    forces ``TV_partition >= mdtv_partition``, which the chi-square detects with ``power``.

    One-cell partitions (``df == 0``) detect nothing by the chi-square: the bound is
    ``math.inf``. The exception is ``probs`` with exactly one positive cell (one-hot): any mass
    off that cell is a zero-mass violation caught by the exact part, and ``TV(p, q)`` equals that
    mass, so the bound is :func:`exact_check_minimum_detectable_rate` ``(n, power)`` (reported
    with ``df == 0`` and ``pooled_mass == 0.0``).

    The bound covers alternatives supported where ``probs > 0``. Mass ``z`` that an alternative
    puts on zero-probability cells is caught by the exact part with probability
    ``1 - (1 - z)**n``; a bound covering both parts adds
    :func:`exact_check_minimum_detectable_rate` (the chi-square then sees ``TV >= tv - z``).

    Args:
        probs: ``[V]`` null probabilities (validated as in :func:`identity_test`).
        n: sample size, integer ``>= 0``.
        alpha: significance level of the chi-square part, in (0, 1).
        power: required power, in (0, 1).
        expected_floor: pooling floor, as in :func:`identity_test`.

    Returns:
        :class:`IdentityPlan` at ``n`` with ``capped=False``.

    Raises:
        ValueError: naming the invalid argument.
    """
    p = as_probs(probs)
    size = check_nonnegative_int(n, "n")
    level = check_open_unit_interval(alpha, "alpha")
    target = check_open_unit_interval(power, "power")
    floor = check_expected_floor(expected_floor)
    return _identity_plan(p, size, level, target, floor)


def plan_identity_test(
    probs: ArrayLike,
    tv: float,
    alpha: float,
    power: float,
    expected_floor: float = EXPECTED_COUNT_FLOOR,
    max_n: int | None = None,
) -> IdentityPlan:
    """Smallest ``n`` at which :func:`identity_test` detects every alternative at TV ``>= tv``.

    Search: evaluate the honest bound (:func:`identity_minimum_detectable_tv`) at ``n = 1, 2,
    4, ...`` until it is ``<= tv``, then bisect on integers between the last failing and the
    first passing ``n``. The bound is not exactly monotone in ``n`` (cells leave the pool as
    ``n`` grows, which changes ``df``), so the result is the smallest ``n`` *evaluated* whose
    bound is ``<= tv``: ``n - 1`` always fails, but some smaller unevaluated ``n`` might pass.

    Args:
        probs: ``[V]`` null probabilities (validated as in :func:`identity_test`).
        tv: TV distance to detect, in (0, 1].
        alpha: significance level of the chi-square part, in (0, 1).
        power: required power, in (0, 1).
        expected_floor: pooling floor, as in :func:`identity_test`.
        max_n: optional cap on ``n`` (integer ``>= 1``). If the bound at ``max_n`` is still
            above ``tv`` the search stops and returns the plan at ``max_n`` with
            ``capped=True``.

    Returns:
        :class:`IdentityPlan` with ``minimum_detectable_tv <= tv`` unless ``capped``.

    Raises:
        ValueError: naming the invalid argument, or ``tv`` when no ``n`` up to 2**60 reaches it
            (only possible without ``max_n``).
    """
    p = as_probs(probs)
    distance = check_tv(tv)
    level = check_open_unit_interval(alpha, "alpha")
    target = check_open_unit_interval(power, "power")
    floor = check_expected_floor(expected_floor)
    limit = _MAX_SEARCH_N
    if max_n is not None:
        limit = check_nonnegative_int(max_n, "max_n")
        if limit < 1:
            raise ValueError("max_n: must be >= 1")

    def plan(n: int) -> IdentityPlan:
        return _identity_plan(p, n, level, target, floor)

    failing = 0  # n = 0 never detects anything
    passing = 1
    best = plan(passing)
    while best.minimum_detectable_tv > distance:
        if passing >= limit:
            if max_n is None:
                raise ValueError(f"tv: {distance!r} is not reached by any n up to {limit}")
            return IdentityPlan(
                n=best.n,
                df=best.df,
                pooled_mass=best.pooled_mass,
                minimum_detectable_tv=best.minimum_detectable_tv,
                capped=True,
            )
        failing = passing
        passing = min(2 * passing, limit)
        best = plan(passing)
    while passing - failing > 1:
        middle = (failing + passing) // 2
        candidate = plan(middle)
        if candidate.minimum_detectable_tv <= distance:
            passing, best = middle, candidate
        else:
            failing = middle
    return best


def _smallest_reaching_n(reaches: Callable[[int], bool], name: str, value: float) -> int:
    """Smallest ``n >= 1`` *evaluated* with ``reaches(n)``, searched as in
    :func:`plan_identity_test`: ``n = 1, 2, 4, ...`` until it reaches, then bisection between
    the last failing and the first reaching ``n``. For a predicate that is monotone in ``n``
    this is the smallest such ``n``; for one monotone only up to a sawtooth (a discrete test's
    power), ``n - 1`` always fails but some smaller unevaluated ``n`` might reach.

    Raises:
        ValueError: naming ``name`` (whose value is ``value``) when no ``n`` up to 2**60
            reaches.
    """
    failing, passing = 0, 1
    while not reaches(passing):
        if passing >= _MAX_SEARCH_N:
            raise ValueError(f"{name}: {value!r} is not reached by any n up to {_MAX_SEARCH_N}")
        failing, passing = passing, min(2 * passing, _MAX_SEARCH_N)
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if reaches(middle):
            passing = middle
        else:
            failing = middle
    return passing


def _last_true(predicate: Callable[[int], bool], lo: int, hi: int, guess: int) -> int | None:
    """Largest ``k`` in ``[lo, hi]`` with ``predicate(k)``, for a predicate that holds on a
    prefix of the range and fails after it; None when it fails at ``lo`` (or the range is
    empty). Gallops from ``guess`` in steps 1, 2, 4, ... and bisects the last step, so a good
    guess costs two or three calls and a bad one ``O(log distance)``."""
    if hi < lo:
        return None
    good = min(max(guess, lo), hi)
    step = 1
    if predicate(good):
        bad = hi + 1  # first k known (or assumed, past the range) to fail
        while good + step <= hi:
            if not predicate(good + step):
                bad = good + step
                break
            good += step
            step *= 2
    else:
        bad = good
        while True:
            candidate = max(bad - step, lo)
            if predicate(candidate):
                good = candidate
                break
            if candidate == lo:
                return None
            bad = candidate
            step *= 2
    while bad - good > 1:
        middle = (good + bad) // 2
        if predicate(middle):
            good = middle
        else:
            bad = middle
    return good


def _binomial_rejection_region(n: int, rate: float, alpha: float) -> tuple[int | None, int | None]:
    """Tails ``{k <= low} | {k >= high}`` where ``acceptance_rate_test`` rejects at ``alpha``.

    Found by search on the test's own p-values (scipy's binomtest, "minlike" ordering), which
    are monotone on each side of ``n * rate``, so the region is exact. ``None`` marks an empty
    tail. A two-sided p-value is at least its own tail's probability, so nothing beyond the
    one-sided ``alpha`` quantile rejects: that bounds each side. The search gallops from the
    ``alpha / 2`` quantile, where the boundary lies for a symmetric law and within a few
    counts of it otherwise: about three test calls per side.
    """

    def rejects(k: int) -> bool:
        return acceptance_rate_test(k, n, rate).pvalue <= alpha

    binomial = scipy.stats.binom(n, rate)
    top = math.ceil(n * rate) - 1  # largest k < n * rate
    # P(K <= k) >= alpha for k >= ppf(alpha): those k cannot reject (one spare for rounding).
    low = _last_true(
        rejects, 0, min(top, int(binomial.ppf(alpha)) + 1), int(binomial.ppf(alpha / 2))
    )
    bottom = math.floor(n * rate) + 1  # smallest k > n * rate
    # P(K >= k) > alpha for k <= isf(alpha): those k cannot reject (isf kept as a spare).
    lo = max(bottom, int(binomial.isf(alpha)))
    # The upper tail is a suffix of [lo, n]: search its mirror image as a prefix.
    mirrored = _last_true(
        lambda j: rejects(lo + n - j), lo, n, lo + n - (int(binomial.isf(alpha / 2)) + 1)
    )
    high = None if mirrored is None else lo + n - mirrored
    return low, high


def acceptance_rate_minimum_detectable_shift(
    n: int, rate: float, alpha: float, power: float
) -> float:
    """Smallest rate shift the exact two-sided binomial test detects with ``power`` at ``n``.

    The rejection region is that of :func:`acceptance_rate_test` (``scipy.stats.binomtest``,
    two-sided, likelihood "minlike" ordering), found exactly by search on its p-values;
    the power at a shifted rate ``rate + delta`` is ``P(K in region)`` under
    ``binom(n, rate + delta)`` (``scipy.special.bdtr``), and ``delta`` is solved with
    ``scipy.optimize.brentq``. Both directions that stay inside [0, 1] are solved and the worse
    (larger) shift is returned. The shift equals the TV between Bernoulli(rate) and
    Bernoulli(rate + delta). Exact, no normal approximation; about 10 ms at ``n = 1e6``.

    Args:
        n: number of trials, integer ``>= 0``.
        rate: null success probability, in [0, 1].
        alpha: significance level, in (0, 1).
        power: required power, in (0, 1).

    Returns:
        ``|delta|`` in probability units as a float. ``math.inf`` when ``n == 0`` or when some
        direction with room cannot reach ``power`` even at the boundary (e.g. rate 0.999 at
        n = 100: not even a true rate of 1 is detected). ``0.0`` when ``power`` does not exceed
        the test's size. At rate 0 (or 1) only one direction exists and the result equals
        :func:`exact_check_minimum_detectable_rate`.

    Raises:
        ValueError: naming the invalid argument.
    """
    trials = check_nonnegative_int(n, "n")
    null_rate = check_rate(rate, "rate")
    level = check_open_unit_interval(alpha, "alpha")
    target = check_open_unit_interval(power, "power")
    if trials == 0:
        return math.inf
    low, high = _binomial_rejection_region(trials, null_rate, level)

    def detection(true_rate: float) -> float:
        probability = 0.0
        # scipy.special's binomial CDF and survival function: what scipy.stats.binom
        # computes, without its per-call argument handling (1 us instead of 40 us a call).
        if low is not None:
            probability += float(scipy.special.bdtr(low, trials, true_rate))
        if high is not None:
            probability += float(scipy.special.bdtrc(high - 1, trials, true_rate))
        return probability

    worst = 0.0
    for sign, room in ((1.0, 1.0 - null_rate), (-1.0, null_rate)):
        if room <= 0.0:
            continue

        def shortfall(delta: float, sign: float = sign) -> float:
            return detection(min(max(null_rate + sign * delta, 0.0), 1.0)) - target

        if shortfall(room) < 0.0:
            return math.inf
        if shortfall(0.0) >= 0.0:
            continue
        delta = float(scipy.optimize.brentq(shortfall, 0.0, room, xtol=1e-12, rtol=1e-10))
        worst = max(worst, delta)
    return worst


def acceptance_rate_sample_size(shift: float, rate: float, alpha: float, power: float) -> int:
    """Smallest ``n`` (evaluated) at which :func:`acceptance_rate_test` detects a rate shift of
    ``shift`` in either direction with ``power``: the inverse of
    :func:`acceptance_rate_minimum_detectable_shift`.

    The minimum detectable shift of a discrete test falls with ``n`` only up to a sawtooth, so
    the search is that of :func:`plan_identity_test` (doubling, then bisection): at the
    returned ``n`` the shift is detected and at ``n - 1`` it is not, but some smaller
    unevaluated ``n`` might detect it too.

    Args:
        shift: rate shift to detect, in (0, 1] (the TV between Bernoulli(rate) and the shifted
            Bernoulli).
        rate: null success probability, in [0, 1].
        alpha: significance level, in (0, 1).
        power: required power, in (0, 1).

    Returns:
        Sample size as an int ``>= 1`` with
        ``acceptance_rate_minimum_detectable_shift(n, rate, alpha, power) <= shift``.

    Raises:
        ValueError: naming the invalid argument, or ``shift`` when no ``n`` up to 2**60
            detects it.
    """
    distance = check_tv(shift, "shift")
    null_rate = check_rate(rate, "rate")
    level = check_open_unit_interval(alpha, "alpha")
    target = check_open_unit_interval(power, "power")
    return _smallest_reaching_n(
        lambda n: acceptance_rate_minimum_detectable_shift(n, null_rate, level, target)
        <= distance,
        "shift",
        distance,
    )


def rate_bound_sample_size(
    shift: float, bound: float, alpha: float, power: float, alternative: str
) -> int:
    """Smallest ``n`` (evaluated) at which
    :func:`~losslessness.stats.binomial.rate_bound_test` detects a rate ``shift`` beyond
    ``bound`` with ``power``: the inverse of
    :func:`~losslessness.stats.binomial.rate_bound_minimum_detectable_shift`, searched as in
    :func:`acceptance_rate_sample_size`.

    Args:
        shift: shift beyond the bound to detect, in (0, 1].
        bound: the rate bound, in [0, 1].
        alpha: the test's level, in (0, 1).
        power: required power, in (0, 1).
        alternative: ``"greater"`` or ``"less"``, as in the test.

    Returns:
        Sample size as an int ``>= 1`` with
        ``rate_bound_minimum_detectable_shift(n, bound, alpha, power, alternative) <= shift``.

    Raises:
        ValueError: naming the invalid argument; ``shift`` when it exceeds the room beyond the
            bound (no rate that far exists) or no ``n`` up to 2**60 detects it.
    """
    distance = check_tv(shift, "shift")
    rate = check_rate(bound, "bound")
    level = check_open_unit_interval(alpha, "alpha")
    target = check_open_unit_interval(power, "power")
    # The test validates ``alternative`` itself; ask it once before searching.
    rate_bound_minimum_detectable_shift(1, rate, level, target, alternative)
    room = 1.0 - rate if alternative == "greater" else rate
    if distance > room:
        raise ValueError(
            f"shift: {distance!r} exceeds the room beyond the bound {rate!r} ({room!r})"
        )
    return _smallest_reaching_n(
        lambda n: rate_bound_minimum_detectable_shift(n, rate, level, target, alternative)
        <= distance,
        "shift",
        distance,
    )
