"""The run-level uniformity test (losslessness.stats.uniformity): the KS direction, the higher
criticism statistic and its exact boundary-crossing p-value (closed forms, Monte Carlo, bounds
at small levels), the Bonferroni combination, and input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from losslessness.stats.uniformity import (
    DEFAULT_ALPHA0,
    as_pvalues,
    higher_criticism,
    higher_criticism_boundary,
    higher_criticism_pvalue,
    uniformity_test,
)


def _hc_many(u: np.ndarray, alpha0: float = DEFAULT_ALPHA0) -> np.ndarray:
    """HC of each row of ``u`` [R, m] (vectorised restatement of the definition)."""
    m = u.shape[1]
    k = max(1, math.floor(alpha0 * m))
    p = np.sort(u, axis=1)[:, :k]
    a = np.arange(1, k + 1) / m
    return np.max(math.sqrt(m) * (a - p) / np.sqrt(p * (1 - p)), axis=1)


def test_ks_direction_small_pvalues_reject_large_ones_do_not() -> None:
    """The KS part is one-sided towards SMALL p-values: the empirical CDF above the uniform
    one (scipy's alternative='greater', D+ = max(i/m - p_(i))) gives a tiny p-value; p-values
    piled near 1 give none."""
    rng = np.random.default_rng(1)
    small = rng.beta(0.3, 1.0, size=60)
    large = 1.0 - small
    low = uniformity_test(small)
    high = uniformity_test(large)
    assert low.ks_pvalue < 1e-6
    assert high.ks_pvalue > 0.5
    assert high.pvalue > 0.5
    sorted_small = np.sort(small)
    expected_d = np.max(np.arange(1, 61) / 60 - sorted_small)
    assert low.ks_statistic == pytest.approx(expected_d, rel=1e-12)
    assert low.ks_pvalue == pytest.approx(scipy.special.smirnov(60, expected_d), rel=1e-9)


def test_hc_statistic_matches_its_definition_over_the_smallest_half() -> None:
    """HC is max over i <= floor(m/2) of sqrt(m)(i/m - p_(i))/sqrt(p_(i)(1 - p_(i))), with the
    1-based rank that attains it; the larger half is ignored."""
    values = np.array([0.9, 0.01, 0.5, 0.2, 0.03, 0.99, 0.7, 0.001])
    hc, index = higher_criticism(values)
    sorted_values = np.sort(values)[:4]
    terms = [
        math.sqrt(8) * ((i + 1) / 8 - v) / math.sqrt(v * (1 - v))
        for i, v in enumerate(sorted_values)
    ]
    assert hc == pytest.approx(max(terms), rel=1e-12)
    assert index == int(np.argmax(terms)) + 1
    # Changing a value in the larger half leaves HC as it was.
    assert higher_criticism(np.where(values == 0.99, 0.6, values))[0] == hc


def test_boundary_is_where_a_single_term_equals_h() -> None:
    """c_i(h) is the p-value at which the i-th term equals h, below i/m, increasing in i."""
    m, h = 40, 3.7
    boundary = higher_criticism_boundary(h, m)
    assert boundary.shape == (20,)
    a = np.arange(1, 21) / m
    terms = math.sqrt(m) * (a - boundary) / np.sqrt(boundary * (1 - boundary))
    np.testing.assert_allclose(terms, h, rtol=1e-12)
    assert (np.diff(boundary) > 0).all() and (boundary < a).all()


@pytest.mark.parametrize("m", [1, 2, 3])
def test_hc_pvalue_with_one_term_is_the_minimum_order_statistic_law(m: int) -> None:
    """With K = 1 term (m <= 3), P(HC >= h) = P(U_(1) <= c_1) = 1 - (1 - c_1)^m exactly."""
    for h in (0.5, 2.0, 30.0):
        c1 = higher_criticism_boundary(h, m)[0]
        assert higher_criticism_pvalue(h, m) == pytest.approx(1 - (1 - c1) ** m, rel=1e-12)


def test_hc_pvalue_with_two_terms_matches_the_closed_form() -> None:
    """m = 5 (K = 2): P(no crossing) = P(N(c_1) = 0, N(c_2) <= 1) = (1 - c_2)^m
    + m (c_2 - c_1) (1 - c_2)^(m - 1)."""
    m = 5
    for h in (1.0, 4.0, 50.0):
        c1, c2 = higher_criticism_boundary(h, m)
        survive = (1 - c2) ** m + m * (c2 - c1) * (1 - c2) ** (m - 1)
        assert higher_criticism_pvalue(h, m) == pytest.approx(1 - survive, rel=1e-9)


@pytest.mark.parametrize("m", [10, 60, 200])
def test_hc_pvalue_agrees_with_monte_carlo(m: int) -> None:
    """The exact P(HC >= h) lies within the 99.99% binomial interval of the Monte Carlo
    frequency over 20,000 sets of m uniforms, at the median, 0.9 and 0.99 quantiles of HC."""
    rng = np.random.default_rng([7, m])
    draws = _hc_many(rng.random((20_000, m)))
    for quantile in (0.5, 0.9, 0.99):
        h = float(np.quantile(draws, quantile))
        exact = higher_criticism_pvalue(h, m)
        count = int((draws >= h).sum())
        interval = scipy.stats.binomtest(count, draws.size).proportion_ci(0.9999)
        assert interval.low <= exact <= interval.high, (m, quantile, exact, count)


def test_hc_pvalue_at_small_levels_lies_between_its_single_term_and_union_bounds() -> None:
    """At the ~1e-6 levels a run uses, where Monte Carlo cannot reach: max_i P(U_(i) <= c_i)
    <= P(HC >= h) <= sum_i P(U_(i) <= c_i) (U_(i) ~ Beta(i, m - i + 1)), and the exact value
    is positive, decreasing in h, and close to the union bound far in the tail."""
    m = 150
    previous = 1.0
    for h in (20.0, 100.0, 1e3, 1e4):
        boundary = higher_criticism_boundary(h, m)
        i = np.arange(1, boundary.size + 1)
        singles = scipy.stats.beta.cdf(boundary, i, m - i + 1)
        exact = higher_criticism_pvalue(h, m)
        assert singles.max() * (1 - 1e-12) <= exact <= singles.sum() * (1 + 1e-12)
        assert 0 < exact < previous
        previous = exact
    assert exact == pytest.approx(singles.sum(), rel=1e-3)
    assert exact < 1e-6


def test_combined_pvalue_is_bonferroni_over_ks_and_hc() -> None:
    """pvalue = min(1, 2 min(p_KS, p_HC)) and the parts are the functions' own."""
    rng = np.random.default_rng(3)
    for values in (rng.random(50), rng.beta(0.7, 1.0, 50), np.linspace(0.02, 0.98, 30)):
        result = uniformity_test(values)
        assert result.pvalue == min(1.0, 2 * min(result.ks_pvalue, result.hc_pvalue))
        hc, index = higher_criticism(values)
        assert (result.hc_statistic, result.hc_index) == (hc, index)
        assert result.hc_pvalue == higher_criticism_pvalue(hc, values.size)
        assert result.m == values.size and result.hc_terms == values.size // 2


def test_sparse_tiny_pvalues_are_caught_by_hc_where_ks_misses_them() -> None:
    """Three p-values of 1e-9 among 297 evenly spread ones: KS sees almost nothing (D+ about
    0.01), HC gives a p-value far below the run's levels (about 5e-6)."""
    values = np.concatenate([np.full(3, 1e-9), (np.arange(297) + 0.5) / 297])
    result = uniformity_test(values)
    assert result.ks_pvalue > 0.1
    assert result.hc_pvalue < 1e-7
    assert result.pvalue < 1e-6


def test_zero_and_one_pvalues_are_handled() -> None:
    """A p-value of exactly 0 makes HC infinite and the combined p-value 0; all ones give 1."""
    zero = uniformity_test(np.array([0.0, 0.3, 0.6, 0.9]))
    assert zero.hc_statistic == math.inf and zero.hc_pvalue == 0.0 and zero.pvalue == 0.0
    ones = uniformity_test(np.ones(12))
    assert ones.ks_statistic == 0.0 and ones.pvalue == 1.0


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ([0.1, float("nan")], "pvalues: contains NaN at index 1"),
        ([0.1, -0.01], r"pvalues: must lie in \[0, 1\]"),
        ([1.5], r"pvalues: must lie in \[0, 1\]"),
        ([], "pvalues: must not be empty"),
        ([[0.1, 0.2]], "pvalues: must be 1-D"),
        (["a", "b"], "pvalues: must be an array of real numbers"),
    ],
)
def test_bad_pvalues_raise_naming_the_argument(value: object, match: str) -> None:
    """NaN, values outside [0, 1], empty, non-1-D and non-numeric input raise ValueError
    naming ``pvalues``."""
    with pytest.raises(ValueError, match=match):
        uniformity_test(value)  # type: ignore[arg-type]


def test_bad_alpha0_and_levels_raise_naming_the_argument() -> None:
    """alpha0 outside (0, 1], a non-positive boundary level or m < 1 raise naming them."""
    with pytest.raises(ValueError, match="alpha0"):
        uniformity_test([0.5, 0.2], alpha0=0.0)
    with pytest.raises(ValueError, match="alpha0"):
        uniformity_test([0.5, 0.2], alpha0=1.5)
    with pytest.raises(ValueError, match="h:"):
        higher_criticism_boundary(-1.0, 10)
    with pytest.raises(ValueError, match="m:"):
        higher_criticism_pvalue(2.0, 0)
    with pytest.raises(ValueError, match="h:"):
        higher_criticism_pvalue(float("nan"), 10)
    with pytest.raises(ValueError, match="scores"):
        as_pvalues([2.0], name="scores")
