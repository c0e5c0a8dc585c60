"""The two-sample homogeneity test: its statistic and pooling, its calibration and power, and
input validation.

Calibration and power are measured by simulation (numpy, fixed seeds, so deterministic). Each
statistical assertion is an exact two-sided binomial test at level :data:`ASSERTION_LEVEL` of
"the measured rate equals the nominal one": 3 regimes x 2 levels for calibration, 1 for power,
so a correct test fails this module with probability at most 7e-3 for a fresh seed (union
bound). With 2000 replicates at alpha = 0.05 the calibration assertion detects a false-alarm rate
of about 1.4 alpha (and 0.6 alpha: a test too conservative loses power) with probability > 0.9.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from numpy.typing import NDArray

from losslessness.stats import (
    EXPECTED_COUNT_FLOOR,
    TwoSampleTestResult,
    chi_square_minimum_detectable_tv,
    pooling_partition,
    two_sample_minimum_detectable_tv,
    two_sample_sample_size,
    two_sample_test,
)

ASSERTION_LEVEL = 1e-3
"""Level of each calibration or power assertion (7 assertions)."""

PAIRS = 2000
"""Simulated pairs per calibration regime."""


def _peaked(vocab: int, seed: int) -> NDArray[np.float64]:
    """softmax(N(0, 1) / 0.3) over ``vocab`` cells: a few large cells and a long sparse tail."""
    logits = np.random.default_rng(seed).normal(size=vocab) / 0.3
    probs = np.exp(logits - logits.max())
    return probs / probs.sum()


def _with_zeros(vocab: int, zeros: int, seed: int) -> NDArray[np.float64]:
    """Dirichlet(1) over ``vocab`` cells with the first ``zeros`` set to exactly 0."""
    probs = np.random.default_rng(seed).dirichlet(np.ones(vocab))
    probs[:zeros] = 0.0
    return probs / probs.sum()


REGIMES = {
    # name: (law, n_a, n_b). Unequal sizes, heavy pooling, exact zeros, a two-cell table.
    "V2 [0.3, 0.7], 200 vs 800": (np.array([0.3, 0.7]), 200, 800),
    "V64 Dirichlet(1) with 16 zeros, 300 vs 300": (_with_zeros(64, 16, 3), 300, 300),
    "V1000 peaked, 800 vs 3000": (_peaked(1000, 4), 800, 3000),
}


def _pvalues(
    law_a: NDArray[np.float64],
    law_b: NDArray[np.float64],
    n_a: int,
    n_b: int,
    pairs: int,
    seed: int,
) -> NDArray[np.float64]:
    """p-values of :func:`two_sample_test` on ``pairs`` independent (multinomial(n_a, law_a),
    multinomial(n_b, law_b)) pairs."""
    rng = np.random.default_rng(seed)
    a = rng.multinomial(n_a, law_a, size=pairs)
    b = rng.multinomial(n_b, law_b, size=pairs)
    return np.array([two_sample_test(x, y).pvalue for x, y in zip(a, b, strict=True)])


def test_two_sample_statistic_equals_chi2_contingency_cressie_read_without_pooling() -> None:
    """With every cell's smaller expected count above the floor, the test is exactly scipy's
    chi2_contingency with lambda = 2/3 and no continuity correction on the raw table."""
    a = np.array([90, 230, 280, 400])
    b = np.array([120, 190, 310, 380])
    result = two_sample_test(a, b)
    reference = scipy.stats.chi2_contingency(
        np.stack([a, b]), correction=False, lambda_="cressie-read"
    )
    assert result.statistic == pytest.approx(float(reference.statistic), rel=1e-12)
    assert result.pvalue == pytest.approx(float(reference.pvalue), rel=1e-12)
    assert (result.df, result.cells, result.n_a, result.n_b) == (3, 4, 1000, 1000)
    assert (result.pooled_cells, result.pooled_mass) == (0, 0.0)
    assert result.expected_floor == EXPECTED_COUNT_FLOOR
    assert isinstance(result, TwoSampleTestResult) and isinstance(result.pvalue, float)


def test_two_sample_pools_by_pooling_partition_of_pooled_law_at_smaller_sample() -> None:
    """Pooling is pooling_partition's: on the pooled law (a + b) / N at min(n_a, n_b) = 235,
    cell 3 (expected 2.97) pools; the pool stays below 20 so it absorbs the smallest remaining
    cell (cell 2, expected 29.7); cell 4 (observed nowhere) takes no part. The statistic is
    chi2_contingency on the 3 remaining columns."""
    a = np.array([100, 100, 30, 5, 0])
    b = np.array([400, 420, 120, 10, 0])
    pooled, df, mass = pooling_partition((a + b) / (a + b).sum(), int(a.sum()))
    assert pooled.tolist() == [False, False, True, True, False] and df == 2
    result = two_sample_test(a, b)
    assert (result.df, result.cells, result.pooled_cells) == (2, 3, 2)
    assert result.pooled_mass == pytest.approx(mass) == pytest.approx(165 / 1185)
    table = np.array([[100, 100, 35], [400, 420, 130]])
    reference = scipy.stats.chi2_contingency(table, correction=False, lambda_="cressie-read")
    assert result.statistic == pytest.approx(float(reference.statistic), rel=1e-12)
    assert result.pvalue == pytest.approx(float(reference.pvalue), rel=1e-12)


@pytest.mark.parametrize(
    ("a", "b", "cells"),
    [
        ([0, 0, 0], [0, 0, 0], 0),  # nothing observed
        ([0, 0, 0], [5, 7, 9], 1),  # one sample empty: everything pooled at n = 0
        ([40, 0, 0], [60, 0, 0], 1),  # one observed cell
        ([3, 2, 1], [2, 1, 4], 1),  # every cell below the floor
    ],
)
def test_two_sample_with_nothing_to_compare_has_df_zero_and_pvalue_one(
    a: list[int], b: list[int], cells: int
) -> None:
    """An empty sample or a single cell after pooling tests nothing: df 0, p-value 1."""
    result = two_sample_test(a, b)
    assert (result.df, result.cells, result.statistic, result.pvalue) == (0, cells, 0.0, 1.0)


@pytest.mark.parametrize("regime", list(REGIMES))
def test_two_sample_false_alarm_rate_is_nominal_at_005_and_001(regime: str) -> None:
    """Under the null (both samples from one law), the rejection rate over 2000 pairs is
    consistent with alpha at 0.05 and at 0.01 (exact two-sided binomial test at 1e-3 each)."""
    law, n_a, n_b = REGIMES[regime]
    pvalues = _pvalues(law, law, n_a, n_b, PAIRS, seed=list(REGIMES).index(regime))
    for alpha in (0.05, 0.01):
        rejections = int((pvalues <= alpha).sum())
        check = scipy.stats.binomtest(rejections, PAIRS, alpha)
        assert check.pvalue > ASSERTION_LEVEL, (regime, alpha, rejections / PAIRS)


def test_two_sample_detects_planned_tv_with_planned_power() -> None:
    """Two laws at TV 0.1 that attain Cohen's bound w = 2 TV (the change proportional to the
    mixture) are detected at alpha = 0.01 with the planned power 0.9 at the planned per-sample
    n (1000 pairs, exact two-sided binomial test at 1e-3), and far less often at n / 4."""
    shift = np.tile([0.01, -0.01], 5)
    law_a, law_b = 0.1 + shift, 0.1 - shift
    assert 0.5 * np.abs(law_a - law_b).sum() == pytest.approx(0.1)
    n = two_sample_sample_size(0.1, 9, 0.01, 0.9)
    assert two_sample_minimum_detectable_tv(n, n, 9, 0.01, 0.9) <= 0.1
    detected = int((_pvalues(law_a, law_b, n, n, 1000, seed=11) <= 0.01).sum())
    assert scipy.stats.binomtest(detected, 1000, 0.9).pvalue > ASSERTION_LEVEL, detected
    rarely = float((_pvalues(law_a, law_b, n // 4, n // 4, 500, seed=12) <= 0.01).mean())
    assert rarely < 0.5


def test_two_sample_minimum_detectable_tv_is_identity_value_at_effective_size() -> None:
    """For two samples of n each the effective size is n / 2, so the minimum detectable TV is
    the one-sample value at n / 2 (sqrt(2) times that at n); empty samples or df 0 detect
    nothing."""
    assert two_sample_minimum_detectable_tv(2000, 2000, 9, 1e-3, 0.9) == pytest.approx(
        chi_square_minimum_detectable_tv(1000, 9, 1e-3, 0.9), rel=1e-12
    )
    assert two_sample_minimum_detectable_tv(1000, 3000, 4, 1e-3, 0.9) == pytest.approx(
        chi_square_minimum_detectable_tv(750, 4, 1e-3, 0.9), rel=1e-12
    )
    assert math.isinf(two_sample_minimum_detectable_tv(0, 100, 3, 0.01, 0.9))
    assert math.isinf(two_sample_minimum_detectable_tv(100, 100, 0, 0.01, 0.9))


@pytest.mark.parametrize(
    ("a", "b", "floor", "message"),
    [
        ([1, 2, 3], [1, 2], EXPECTED_COUNT_FLOOR, "counts_b: length 2 does not match"),
        ([[1, 2]], [1, 2], EXPECTED_COUNT_FLOOR, "counts_a: must have shape"),
        ([1, 2], [1, -2], EXPECTED_COUNT_FLOOR, "counts_b: must be non-negative"),
        ([1.5, 2], [1, 2], EXPECTED_COUNT_FLOOR, "counts_a: must be non-negative integers"),
        ([1, 2], [math.nan, 2], EXPECTED_COUNT_FLOOR, "counts_b: contains NaN"),
        ([], [], EXPECTED_COUNT_FLOOR, "counts_a: must not be empty"),
        ([1, 2], [1, 2], -1.0, "expected_floor: must be >= 0"),
    ],
)
def test_two_sample_rejects_bad_input_naming_the_argument(
    a: object, b: object, floor: float, message: str
) -> None:
    """Wrong shapes, negative, non-integer or NaN counts and a negative floor raise ValueError
    naming the argument."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        two_sample_test(a, b, expected_floor=floor)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, 10, 3, 0.01, 0.9), "n_a"),
        ((10, 10, 3, 1.5, 0.9), "alpha"),
        ((10, 10, 3, 0.01, 0.0), "power"),
    ],
)
def test_two_sample_minimum_detectable_tv_rejects_bad_arguments(
    args: tuple[int, int, int, float, float], message: str
) -> None:
    """Out-of-range sizes, levels or powers raise ValueError naming the argument."""
    with pytest.raises(ValueError, match=message):
        two_sample_minimum_detectable_tv(*args)
    with pytest.raises(ValueError, match="df"):
        two_sample_sample_size(0.1, 0, 0.01, 0.9)
