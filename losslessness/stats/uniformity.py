"""Run-level uniformity test: are a target's p-values a sample of U(0, 1)?

Each statistical assertion of a run spends a tiny share of the family-wise false-alarm budget
(about 1e-3 / 200 = 5e-6), so a deviation that moves every p-value a little (a ratio p / q
computed in float16: about TV 0.006 per position) stays under every single test's reach. If
the p-values are independent and uniform under the null, many small shifts towards 0 add up:
:func:`uniformity_test` tests the set of p-values against U(0, 1), towards SMALL p-values, with
two statistics and a Bonferroni combination of the two:

- **one-sided Kolmogorov-Smirnov** ``D+ = max_x (F_m(x) - x)``, the largest excess of the
  empirical CDF of the p-values over the uniform CDF (``scipy.stats.kstest(..., 'uniform',
  alternative='greater')``; its p-value is the exact finite-m distribution of Smirnov's
  statistic, Birnbaum & Tingey 1951). Powerful against a dense small shift.
- **higher criticism** (Donoho & Jin 2004, "Higher criticism for detecting sparse
  heterogeneous mixtures", Ann. Statist. 32(3), 962-994, section 1.1 and eq. (1.3))::

      HC = max_{1 <= i <= alpha0 m} sqrt(m) (i/m - p_(i)) / sqrt(p_(i) (1 - p_(i)))

  over the ``floor(alpha0 m)`` smallest sorted p-values (at least one), ``alpha0 = 1/2`` as in
  Donoho & Jin. This is their HC*; their HC+ also drops the terms with ``p_(i) <= 1/m``, whose
  heavy tail makes the *asymptotic* null law of HC* useless at moderate m. We never use that
  law: the p-value of HC is computed exactly (below), so the heavy tail costs nothing, and the
  smallest p-values, which carry the evidence against a sparse alternative, stay in. Powerful
  against a sparse alternative (a few p-values far too small).

**Exact p-value of HC.** ``z(p) = sqrt(m) (a - p) / sqrt(p (1 - p))`` is strictly decreasing in
p on (0, 1) for every ``a = i/m`` in (0, 1] (its derivative has the sign of
``-(a + p (1 - 2a)) < 0``), so ``HC >= h`` (for h > 0) iff ``p_(i) <= c_i(h)`` for some
``i <= K``, where ``c_i(h)`` is the smaller root of ``m (a - c)^2 = h^2 c (1 - c)``::

    c_i(h) = 2 m a^2 / (2 a m + h^2 + h sqrt(h^2 + 4 m a (1 - a))),   a = i / m,

(the product-of-roots form, free of cancellation), increasing in i. Under the null the sorted
p-values are uniform order statistics ``U_(1) <= ... <= U_(m)``, and ``P(HC >= h)`` is the
probability that they cross the lower boundary ``c_1 <= ... <= c_K``. With ``N(t)`` the number
of the m uniforms at or below t, ``U_(i) <= c_i`` iff ``N(c_i) >= i``, so the first crossing
is at the first j with ``N(c_j) >= j``. Given ``N(c_{j-1}) = l``, the other ``m - l`` points are
i.i.d. uniform on (c_{j-1}, 1], so ``N(c_j) - l ~ Binomial(m - l, (c_j - c_{j-1}) / (1 -
c_{j-1}))``. Carrying the law of ``N(c_j)`` on the paths that have not crossed yet (support
0..j-1) gives the recursion of Noé (1972, "The calculation of distributions of two-sided
Kolmogorov-Smirnov type statistics", Ann. Math. Statist. 43(1), 58-64) for a one-sided boundary,
O(K^2) terms per step, O(K^3) in all (K = 150 at m = 300: milliseconds)::

    P(HC >= h) = sum_{j=1..K} sum_{l=0..j-2} P(N(c_{j-1}) = l, no crossing yet)
                                             * P(Binomial(m - l, r_j) >= j - l)

The sum has only non-negative terms (no ``1 - P(no crossing)`` cancellation), the binomial
laws come from log-gamma tables and the binomial tails from ``scipy.stats.binom.sf``, so the
p-value has a small *relative* error (about 1e-13 at m = 300) all the way down to float64's
underflow: it is valid at the ~5e-6 levels a run's assertions use. The tests check it against
Monte Carlo and against the closed forms ``K = 1`` (``1 - (1 - c_1)^m``).

**Combination.** ``pvalue = min(1, 2 min(p_KS, p_HC))`` (Bonferroni over the two tests: valid
whatever their dependence).

**Validity with discrete p-values.** Both statistics only grow when a p-value decreases. If
each null p-value is super-uniform (``P(p <= x) <= x``, true of exact and conservative tests)
and they are independent, the test is conservative, by coupling each p-value above a uniform.
Chi-square identity-test p-values are uniform only approximately; the calibration tests
(``tests/calibration/test_uniformity_calibration.py``) measure the false-alarm rate with them.

No TFP triple: the assertion is :func:`uniformity_test`, but it has no planned minimum
detectable effect or sample size (its power against the zoo is measured,
``benchmarks/uniformity_power.py``); it adds power to the per-assertion tests, which carry the
run's stated minimum detectable TVs.

Shapes: ``pvalues`` is ``[m]`` (any 1-D array-like, any order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.special
import scipy.stats
from numpy.typing import ArrayLike, NDArray

from losslessness.stats.validation import check_real

__all__ = [
    "DEFAULT_ALPHA0",
    "UniformityTestResult",
    "as_pvalues",
    "higher_criticism",
    "higher_criticism_boundary",
    "higher_criticism_pvalue",
    "uniformity_test",
]

DEFAULT_ALPHA0 = 0.5
"""Fraction of the sorted p-values the higher criticism looks at (Donoho & Jin 2004, section
1.1: ``alpha0 = 1/2``; deviations in the larger half are KS's job)."""


@dataclass(frozen=True)
class UniformityTestResult:
    """Outcome of :func:`uniformity_test`.

    Attributes:
        m: number of p-values tested.
        ks_statistic: one-sided KS ``D+ = max(F_m(x) - x)`` in [0, 1].
        ks_pvalue: its exact p-value ``P(D+ >= ks_statistic)`` under U(0, 1).
        hc_statistic: higher criticism over the ``hc_terms`` smallest p-values (``inf`` when a
            p-value among them is 0).
        hc_pvalue: its exact p-value ``P(HC >= hc_statistic)`` (1.0 when ``hc_statistic <=
            0``: conservative, such a sample shows nothing towards small p-values).
        hc_index: the 1-based rank i at which HC attains its maximum.
        hc_terms: ``K = max(1, floor(alpha0 m))``.
        alpha0: the fraction used.
        pvalue: ``min(1, 2 min(ks_pvalue, hc_pvalue))``.
    """

    m: int
    ks_statistic: float
    ks_pvalue: float
    hc_statistic: float
    hc_pvalue: float
    hc_index: int
    hc_terms: int
    alpha0: float
    pvalue: float


def as_pvalues(pvalues: ArrayLike, name: str = "pvalues") -> NDArray[np.float64]:
    """Validate p-values and return them as a float64 ``[m]`` array (same order).

    Raises:
        ValueError: naming ``name``: not 1-D, empty, not numeric, NaN, or outside [0, 1].
    """
    try:
        values = np.asarray(pvalues, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name}: must be an array of real numbers ({error})") from error
    if values.ndim != 1:
        raise ValueError(f"{name}: must be 1-D, got shape {values.shape}")
    if values.size == 0:
        raise ValueError(f"{name}: must not be empty")
    if np.isnan(values).any():
        raise ValueError(
            f"{name}: contains NaN at index {int(np.flatnonzero(np.isnan(values))[0])}"
        )
    outside = (values < 0.0) | (values > 1.0)
    if outside.any():
        index = int(np.flatnonzero(outside)[0])
        raise ValueError(f"{name}: must lie in [0, 1], got {values[index]!r} at index {index}")
    return values


def _check_alpha0(alpha0: object) -> float:
    value = check_real(alpha0, "alpha0")
    if not 0.0 < value <= 1.0:
        raise ValueError(f"alpha0: must lie in (0, 1], got {value!r}")
    return value


def _terms(m: int, alpha0: float) -> int:
    return max(1, math.floor(alpha0 * m))


def higher_criticism(pvalues: ArrayLike, alpha0: float = DEFAULT_ALPHA0) -> tuple[float, int]:
    """Higher criticism HC* of Donoho & Jin (2004, eq. (1.3)) over the ``K = max(1,
    floor(alpha0 m))`` smallest p-values.

    Args:
        pvalues: ``[m]`` float in [0, 1].
        alpha0: in (0, 1].

    Returns:
        ``(HC, i)``: the maximum of ``sqrt(m) (i/m - p_(i)) / sqrt(p_(i) (1 - p_(i)))`` over
        ``i = 1..K`` and the 1-based rank attaining it (a term with ``p_(i) = 0`` is ``+inf``,
        one with ``p_(i) = 1`` is ``-inf`` unless ``i = m``, where it is 0).

    Raises:
        ValueError: naming ``pvalues`` or ``alpha0`` (see :func:`as_pvalues`).
    """
    values = np.sort(as_pvalues(pvalues))
    a0 = _check_alpha0(alpha0)
    m = values.size
    k = _terms(m, a0)
    p = values[:k]
    a = np.arange(1, k + 1, dtype=np.float64) / m
    with np.errstate(divide="ignore", invalid="ignore"):
        z = math.sqrt(m) * (a - p) / np.sqrt(p * (1.0 - p))
    z = np.where(p == 0.0, np.inf, z)
    z = np.where(p == 1.0, np.where(a < 1.0, -np.inf, 0.0), z)
    index = int(np.argmax(z))
    return float(z[index]), index + 1


def higher_criticism_boundary(
    h: float, m: int, alpha0: float = DEFAULT_ALPHA0
) -> NDArray[np.float64]:
    """The boundary ``c_1(h) <= ... <= c_K(h)``: ``HC >= h`` iff ``p_(i) <= c_i(h)`` for some i.

    Args:
        h: a positive finite HC level.
        m: number of p-values (>= 1).
        alpha0: in (0, 1].

    Returns:
        ``[K]`` float64, ``K = max(1, floor(alpha0 m))``, each in (0, i/m).

    Raises:
        ValueError: naming ``h``, ``m`` or ``alpha0``.
    """
    if not (isinstance(h, (int, float, np.number)) and math.isfinite(h) and h > 0):
        raise ValueError(f"h: must be a positive finite number, got {h!r}")
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m: must be an integer >= 1, got {m!r}")
    a0 = _check_alpha0(alpha0)
    k = _terms(int(m), a0)
    a = np.arange(1, k + 1, dtype=np.float64) / m
    h2 = float(h) ** 2
    root = np.sqrt(h2 + 4.0 * m * a * (1.0 - a))
    boundary: NDArray[np.float64] = 2.0 * m * a * a / (2.0 * a * m + h2 + float(h) * root)
    return boundary


def _crossing_probability(boundary: NDArray[np.float64], m: int) -> float:
    """``P(U_(i) <= boundary[i-1] for some i)`` for m i.i.d. U(0, 1), ``boundary`` [K]
    non-decreasing in [0, 1) (the recursion in the module docstring)."""
    k = boundary.size
    log_factorial = scipy.special.gammaln(np.arange(m + 1, dtype=np.float64) + 1.0)
    state = np.ones(1)  # law of N(c_{j-1}) on the paths that have not crossed, support 0..j-2
    previous = 0.0
    total = 0.0
    for j in range(1, k + 1):
        rate = (float(boundary[j - 1]) - previous) / (1.0 - previous)
        rate = min(max(rate, 0.0), 1.0)
        lo = np.arange(state.size)
        # Crossing at j: N(c_j) >= j, i.e. at least j - lo of the m - lo remaining points.
        total += float(np.dot(state, scipy.stats.binom.sf(j - 1 - lo, m - lo, rate)))
        if j == k:
            break
        # New law of N(c_j) on 0..j-1: sum_lo state[lo] * Binomial(m - lo, rate)(n - lo).
        n = np.arange(j)[:, None]
        step = n - lo[None, :]
        valid = step >= 0
        steps = np.where(valid, step, 0)
        log_pmf = (
            log_factorial[m - lo][None, :]
            - log_factorial[steps]
            - log_factorial[np.where(valid, m - n, 0)]
            + scipy.special.xlogy(steps, rate)
            + scipy.special.xlog1py(np.where(valid, m - n, 0), -rate)
        )
        state = np.exp(np.where(valid, log_pmf, -np.inf)) @ state
        previous = float(boundary[j - 1])
    return min(total, 1.0)


def higher_criticism_pvalue(h: float, m: int, alpha0: float = DEFAULT_ALPHA0) -> float:
    """Exact ``P(HC >= h)`` for m i.i.d. U(0, 1) p-values (module docstring).

    Args:
        h: an observed HC value (``inf`` gives 0.0; ``h <= 0`` gives 1.0, a conservative
            bound).
        m: number of p-values (>= 1).
        alpha0: in (0, 1].

    Returns:
        The probability in [0, 1], with a relative error of about K x 1e-15.

    Raises:
        ValueError: naming ``h``, ``m`` or ``alpha0``.
    """
    if isinstance(h, bool) or not isinstance(h, (int, float, np.number)) or math.isnan(h):
        raise ValueError(f"h: must be a real number, got {h!r}")
    if h == math.inf:
        return 0.0
    if h <= 0:
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise ValueError(f"m: must be an integer >= 1, got {m!r}")
        _check_alpha0(alpha0)
        return 1.0
    boundary = higher_criticism_boundary(float(h), m, alpha0)
    return _crossing_probability(boundary, int(m))


def uniformity_test(pvalues: ArrayLike, alpha0: float = DEFAULT_ALPHA0) -> UniformityTestResult:
    """Test independent p-values against U(0, 1), towards small values (module docstring).

    Args:
        pvalues: ``[m]`` float in [0, 1], m >= 1, independent under the null.
        alpha0: fraction of the sorted p-values the higher criticism looks at, in (0, 1].

    Returns:
        :class:`UniformityTestResult`; reject at level alpha when ``pvalue <= alpha``.

    Raises:
        ValueError: naming ``pvalues`` (not 1-D, empty, NaN, outside [0, 1]) or ``alpha0``.

    Sources: Donoho & Jin (2004), Ann. Statist. 32(3), 962-994 (HC); Noé (1972), Ann. Math.
    Statist. 43(1), 58-64 (boundary-crossing recursion); Birnbaum & Tingey (1951), Ann. Math.
    Statist. 22(4), 592-596 (exact one-sided KS law, as computed by ``scipy.special.smirnov``).
    """
    values = as_pvalues(pvalues)
    a0 = _check_alpha0(alpha0)
    m = int(values.size)
    # 'greater': the statistic is max(F_m(x) - x), the empirical CDF above the uniform one,
    # which is what too many small p-values produce.
    ks = scipy.stats.kstest(values, "uniform", alternative="greater", method="exact")
    hc, index = higher_criticism(values, a0)
    hc_p = higher_criticism_pvalue(hc, m, a0)
    ks_p = float(ks.pvalue)
    return UniformityTestResult(
        m=m,
        ks_statistic=float(ks.statistic),
        ks_pvalue=ks_p,
        hc_statistic=hc,
        hc_pvalue=hc_p,
        hc_index=index,
        hc_terms=_terms(m, a0),
        alpha0=a0,
        pvalue=min(1.0, 2.0 * min(ks_p, hc_p)),
    )
