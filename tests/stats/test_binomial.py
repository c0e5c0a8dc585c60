"""Unit tests of the acceptance-rate test: agreement with scipy's exact binomial test, the
reported direction, impossible outcomes, and validation. Deterministic."""

from __future__ import annotations

import math

import pytest
import scipy.stats

from losslessness.stats import BinomialTestResult, acceptance_rate_test


@pytest.mark.parametrize(
    ("successes", "n", "rate"),
    [(0, 10, 0.3), (3, 10, 0.3), (7, 10, 0.3), (512, 1000, 0.5), (9990, 10000, 0.999), (1, 1, 0.5)],
)
def test_pvalue_equals_scipy_exact_two_sided_binomtest(successes: int, n: int, rate: float) -> None:
    """The p-value is scipy's exact two-sided (minlike) binomial test, not an approximation."""
    result = acceptance_rate_test(successes, n, rate)
    expected = scipy.stats.binomtest(successes, n, rate, alternative="two-sided").pvalue
    assert result.pvalue == pytest.approx(float(expected), rel=1e-12, abs=0.0)
    assert result.statistic == pytest.approx(successes / n)
    assert (result.n, result.successes, result.expected_rate) == (n, successes, rate)


@pytest.mark.parametrize(
    ("successes", "direction"), [(40, "higher"), (20, "lower"), (30, "as expected")]
)
def test_direction_reports_the_side_of_the_observation(successes: int, direction: str) -> None:
    """direction compares the observed proportion with the expected rate: the verdict needs it
    (higher proves loss, lower is only suboptimal)."""
    assert acceptance_rate_test(successes, 100, 0.3).direction == direction


def test_impossible_outcomes_at_rate_zero_or_one_have_pvalue_zero() -> None:
    """Under rate 0 a success (under rate 1 a failure) cannot happen: p-value exactly 0; the
    possible outcome gets p-value 1."""
    assert acceptance_rate_test(1, 50, 0.0).pvalue == 0.0
    assert acceptance_rate_test(49, 50, 1.0).pvalue == 0.0
    assert acceptance_rate_test(0, 50, 0.0).pvalue == 1.0
    assert acceptance_rate_test(50, 50, 1.0).pvalue == 1.0
    assert acceptance_rate_test(1, 50, 0.0).direction == "higher"
    assert acceptance_rate_test(49, 50, 1.0).direction == "lower"


def test_no_trials_give_pvalue_one_and_nan_statistic() -> None:
    """With n == 0 nothing was observed: p-value 1, statistic NaN, direction as expected."""
    result = acceptance_rate_test(0, 0, 0.4)
    assert isinstance(result, BinomialTestResult)
    assert result.pvalue == 1.0 and math.isnan(result.statistic)
    assert result.direction == "as expected"


def test_rate_within_round_off_of_the_unit_interval_is_clipped() -> None:
    """sum(min(p, q)) can exceed 1 by float round-off; within 1e-12 it is clipped, not refused."""
    assert acceptance_rate_test(10, 10, 1.0 + 1e-13).expected_rate == 1.0
    assert acceptance_rate_test(0, 10, -1e-13).expected_rate == 0.0


@pytest.mark.parametrize(
    ("successes", "n", "rate", "match"),
    [
        (11, 10, 0.5, "successes: 11 exceeds n = 10"),
        (-1, 10, 0.5, "successes: must be a non-negative integer"),
        (1.5, 10, 0.5, "successes: must be a non-negative integer"),
        (1, -10, 0.5, "n: must be a non-negative integer"),
        (1, 10, 1.01, r"expected_rate: must lie in \[0, 1\]"),
        (1, 10, -1e-9, r"expected_rate: must lie in \[0, 1\]"),
        (1, 10, math.nan, "expected_rate: must be finite"),
    ],
)
def test_invalid_input_raises_value_error_naming_the_argument(
    successes: object, n: object, rate: object, match: str
) -> None:
    """Malformed arguments are rejected with a message naming them."""
    with pytest.raises(ValueError, match=match):
        acceptance_rate_test(successes, n, rate)  # type: ignore[arg-type]
