"""Tests of the Bonferroni error budget: arithmetic, the rejection rule, and validation."""

from __future__ import annotations

import dataclasses
import math

import pytest

from losslessness.stats import DEFAULT_FAMILY_WISE_ALPHA, ErrorBudget


def test_per_assertion_alpha_is_family_wise_alpha_over_count() -> None:
    """Bonferroni: 1e-3 over 200 assertions is 5e-6 each, and the levels sum back to 1e-3."""
    budget = ErrorBudget(200)
    assert budget.family_wise_alpha == DEFAULT_FAMILY_WISE_ALPHA == 1e-3
    assert budget.per_assertion_alpha == pytest.approx(5e-6, rel=1e-12)
    assert budget.per_assertion_alpha * budget.n_assertions == pytest.approx(1e-3, rel=1e-12)
    assert ErrorBudget(4, 0.05).per_assertion_alpha == pytest.approx(0.0125, rel=1e-12)
    assert isinstance(budget.per_assertion_alpha, float)


def test_rejects_at_or_below_the_per_assertion_level() -> None:
    """A p-value equal to the level rejects (p <= alpha); anything above does not."""
    budget = ErrorBudget(10, 0.01)
    level = budget.per_assertion_alpha
    assert budget.rejects(level)
    assert budget.rejects(0.0)
    assert not budget.rejects(math.nextafter(level, 1.0))
    assert not budget.rejects(1.0)


def test_budget_is_frozen() -> None:
    """The budget is fixed for a run; it cannot be changed after the levels were printed."""
    budget = ErrorBudget(3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        budget.n_assertions = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("n_assertions", "alpha", "match"),
    [
        (0, 1e-3, "n_assertions: must be >= 1"),
        (-2, 1e-3, "n_assertions: must be a non-negative integer"),
        (2.5, 1e-3, "n_assertions: must be a non-negative integer"),
        (True, 1e-3, "n_assertions"),
        (10, 0.0, r"family_wise_alpha: must lie in the open interval \(0, 1\)"),
        (10, 1.0, r"family_wise_alpha: must lie in the open interval \(0, 1\)"),
        (10, math.nan, "family_wise_alpha: must be finite"),
    ],
)
def test_invalid_budget_raises_value_error_naming_the_field(
    n_assertions: object, alpha: object, match: str
) -> None:
    """Construction validates both fields and names the bad one."""
    with pytest.raises(ValueError, match=match):
        ErrorBudget(n_assertions, alpha)  # type: ignore[arg-type]


@pytest.mark.parametrize("pvalue", [-0.1, 1.5, math.nan])
def test_rejects_refuses_invalid_pvalues(pvalue: float) -> None:
    """A p-value outside [0, 1] (or NaN, which compares false) is a bug upstream, not a verdict."""
    with pytest.raises(ValueError, match="pvalue"):
        ErrorBudget(10).rejects(pvalue)
