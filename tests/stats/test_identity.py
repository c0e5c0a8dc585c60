"""Unit tests of the identity test: the statistic, the pooling rule, the exact zero-mass part and
input validation. Deterministic (no sampling except fixed-seed draws), so none can flake."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from losslessness.stats import (
    EXPECTED_COUNT_FLOOR,
    IdentityTestResult,
    identity_test,
    identity_test_pvalues,
    pooling_partition,
)


def test_statistic_equals_scipy_cressie_read_without_pooling() -> None:
    """With every expected count above the floor the test is exactly scipy's Cressie-Read
    power divergence against chi-square(V - 1); a wrong lambda or df would change it."""
    probs = np.array([0.1, 0.2, 0.3, 0.4])
    counts = np.array([90, 230, 280, 400])
    result = identity_test(counts, probs)
    reference = scipy.stats.power_divergence(counts, 1000 * probs, lambda_="cressie-read")
    assert result.statistic == pytest.approx(float(reference.statistic), rel=1e-12)
    assert result.pvalue == pytest.approx(float(reference.pvalue), rel=1e-12)
    assert (result.df, result.n, result.n_cells) == (3, 1000, 4)
    assert (result.pooled_cells, result.pooled_mass) == (0, 0.0)
    assert result.expected_floor == EXPECTED_COUNT_FLOOR
    assert isinstance(result.statistic, float) and isinstance(result.pvalue, float)


def test_cells_below_floor_merge_into_one_pooled_cell() -> None:
    """Cells with n * p below the floor (expected 4 and 1 here) merge into one cell whose
    expected count (5) reaches the floor, so nothing else joins; the statistic is computed on
    the merged counts."""
    probs = np.array([0.5, 0.3, 0.15, 0.04, 0.01])
    counts = np.array([52, 28, 14, 5, 1])
    pooled, df, pooled_mass = pooling_partition(probs, 100, 5.0)
    assert pooled.tolist() == [False, False, False, True, True]
    assert df == 3
    assert pooled_mass == pytest.approx(0.05)
    result = identity_test(counts, probs, expected_floor=5.0)
    assert (result.df, result.n_cells, result.pooled_cells) == (3, 4, 2)
    assert result.pooled_mass == pytest.approx(0.05)
    reference = scipy.stats.power_divergence(
        [52, 28, 14, 6], [50.0, 30.0, 15.0, 5.0], lambda_="cressie-read"
    )
    assert result.statistic == pytest.approx(float(reference.statistic), rel=1e-12)
    assert result.pvalue == pytest.approx(float(reference.pvalue), rel=1e-12)


def test_pool_below_floor_absorbs_smallest_remaining_cell() -> None:
    """A pool that stays below the floor (expected 2 < 5) absorbs the smallest remaining cell
    (expected 8, index 2), not a larger one; df drops accordingly."""
    probs = np.array([0.6, 0.3, 0.08, 0.02])
    pooled, df, pooled_mass = pooling_partition(probs, 100, 5.0)
    assert pooled.tolist() == [False, False, True, True]
    assert df == 2
    assert pooled_mass == pytest.approx(0.1)


def test_pool_ties_take_the_lowest_index() -> None:
    """Among equally small remaining cells the lowest index joins the pool (a stable rule, so
    the partition is reproducible)."""
    probs = np.array([0.3, 0.3, 0.38, 0.02])
    pooled, df, _ = pooling_partition(probs, 100, 5.0)
    assert pooled.tolist() == [True, False, False, True]
    assert df == 2


def test_everything_pooled_leaves_nothing_to_test() -> None:
    """When every cell is below the floor the partition has one cell: df 0, p-value 1."""
    probs = np.full(10, 0.1)
    pooled, df, pooled_mass = pooling_partition(probs, 20, 5.0)
    assert pooled.all() and df == 0 and pooled_mass == pytest.approx(1.0)
    result = identity_test(np.full(10, 2), probs, expected_floor=5.0)
    assert (result.df, result.statistic, result.pvalue, result.n_cells) == (0, 0.0, 1.0, 1)
    assert result.pooled_cells == 10


def test_zero_floor_pools_nothing() -> None:
    """expected_floor = 0 disables pooling: every positive cell is its own cell."""
    probs = np.array([0.999, 0.0005, 0.0005])
    pooled, df, pooled_mass = pooling_partition(probs, 10, 0.0)
    assert not pooled.any() and df == 2 and pooled_mass == 0.0


def test_zero_mass_observations_are_counted_exactly_and_reported() -> None:
    """Observations on p == 0 cells are the exact part: counted, listed ascending, and kept out
    of the chi-square (the statistic equals the one on the positive cells alone)."""
    probs = np.array([0.5, 0.0, 0.5, 0.0])
    counts = np.array([50, 3, 50, 1])
    result = identity_test(counts, probs)
    assert result.zero_mass_count == 4
    assert result.zero_mass_tokens == (1, 3)
    assert result.n == 104
    clean = identity_test(np.array([50, 50]), np.array([0.5, 0.5]))
    assert (result.statistic, result.pvalue, result.df) == (clean.statistic, clean.pvalue, 1)


def test_zero_mass_tokens_list_at_most_ten_lowest() -> None:
    """The report lists the ten lowest offending cells, ascending, while the count covers all."""
    probs = np.zeros(30)
    probs[0] = 1.0
    counts = np.ones(30, dtype=np.int64)
    result = identity_test(counts, probs)
    assert result.zero_mass_count == 29
    assert result.zero_mass_tokens == tuple(range(1, 11))


def test_correct_counts_have_no_zero_mass_violation() -> None:
    """Counts that respect the support report zero_mass_count 0 and no tokens."""
    result = identity_test([10, 0, 10], [0.5, 0.0, 0.5])
    assert result.zero_mass_count == 0 and result.zero_mass_tokens == ()


def test_one_hot_probs_give_df_zero_and_pvalue_one() -> None:
    """A single positive cell is not testable by the chi-square: df 0, statistic 0, pvalue 1."""
    result = identity_test([0, 500, 0], [0.0, 1.0, 0.0])
    assert (result.df, result.statistic, result.pvalue, result.n_cells) == (0, 0.0, 1.0, 1)
    assert result.zero_mass_count == 0


def test_no_observations_give_df_zero_and_pvalue_one() -> None:
    """n == 0 tests nothing."""
    result = identity_test([0, 0, 0], [0.2, 0.3, 0.5])
    assert (result.n, result.df, result.pvalue, result.statistic) == (0, 0, 1.0, 0.0)


def test_pvalue_is_small_for_a_gross_deviation() -> None:
    """The test rejects a sample that is obviously not from p (guards against a constant
    p-value)."""
    result = identity_test([900, 100], [0.5, 0.5])
    assert result.pvalue < 1e-100


def test_result_is_frozen() -> None:
    """Results are immutable values."""
    result = identity_test([5, 5], [0.5, 0.5])
    assert isinstance(result, IdentityTestResult)
    with pytest.raises(AttributeError):
        result.pvalue = 0.0  # type: ignore[misc]


def test_partition_agrees_with_test_on_random_cases() -> None:
    """identity_test and pooling_partition share one pooling rule (power.py relies on it)."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        size = int(rng.integers(2, 200))
        probs = rng.dirichlet(np.full(size, 0.3))
        n = int(rng.integers(1, 5000))
        counts = rng.multinomial(n, probs)
        result = identity_test(counts, probs)
        pooled, df, pooled_mass = pooling_partition(probs, n, EXPECTED_COUNT_FLOOR)
        assert (result.df, result.pooled_cells) == (df, int(pooled.sum()))
        assert result.pooled_mass == pooled_mass


def test_float_probs_are_renormalised_after_validation() -> None:
    """Probabilities off by less than 1e-6 are accepted and renormalised (float32 softmax)."""
    probs = np.array([0.25, 0.25, 0.5 + 5e-7])
    result = identity_test([25, 25, 50], probs)
    assert result.pvalue == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(
    ("counts", "probs", "match"),
    [
        ([1, 2, np.nan], [0.2, 0.3, 0.5], "counts: contains NaN"),
        ([1, -2, 3], [0.2, 0.3, 0.5], "counts: must be non-negative integers"),
        ([1.5, 2, 3], [0.2, 0.3, 0.5], "counts: must be non-negative integers"),
        (["a", "b", "c"], [0.2, 0.3, 0.5], "counts: must be non-negative integers"),
        ([[1, 2, 3]], [0.2, 0.3, 0.5], "counts: must have shape"),
        ([1, 2], [0.2, 0.3, 0.5], "counts: length 2 does not match probs length 3"),
        ([1, 2, 3], [0.2, np.nan, 0.8], "probs: contains NaN"),
        ([1, 2, 3], [0.7, -0.2, 0.5], "probs: contains negative"),
        ([1, 2, 3], [0.2, 0.3, 0.4], "probs: must sum to 1"),
        ([1, 2, 3], [0.2, 0.3, 0.5 + 2e-6], "probs: must sum to 1"),
        ([1, 2, 3], [[0.2, 0.3, 0.5]], "probs: must have shape"),
        ([], [], "counts: must not be empty"),
    ],
)
def test_invalid_input_raises_value_error_naming_the_argument(
    counts: object, probs: object, match: str
) -> None:
    """Each malformed argument is rejected with a message that names it and the problem."""
    with pytest.raises(ValueError, match=match):
        identity_test(counts, probs)  # type: ignore[arg-type]


@pytest.mark.parametrize("floor", [-1.0, math.nan, math.inf])
def test_invalid_expected_floor_is_rejected(floor: float) -> None:
    """The floor must be a finite number >= 0."""
    with pytest.raises(ValueError, match="expected_floor"):
        identity_test([1, 2], [0.5, 0.5], expected_floor=floor)


@pytest.mark.parametrize("n", [-1, 2.5, True])
def test_pooling_partition_rejects_invalid_n(n: object) -> None:
    """n must be a non-negative integer (bools and floats are bugs, not sample sizes)."""
    with pytest.raises(ValueError, match="n: must be a non-negative integer"):
        pooling_partition([0.5, 0.5], n, 5.0)  # type: ignore[arg-type]


def test_batched_pvalues_reject_rows_with_different_totals_or_impossible_cells() -> None:
    """identity_test_pvalues is only valid for equal-n null replicates: it says so otherwise."""
    probs = np.array([0.5, 0.5, 0.0])
    with pytest.raises(ValueError, match="same total"):
        identity_test_pvalues(np.array([[3, 2, 0], [1, 1, 0]]), probs)
    with pytest.raises(ValueError, match="zero-probability"):
        identity_test_pvalues(np.array([[3, 1, 1]]), probs)
    with pytest.raises(ValueError, match="counts"):
        identity_test_pvalues(np.array([3, 2, 0]), probs)
