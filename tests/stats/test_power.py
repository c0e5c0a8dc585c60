"""Tests of power and sample size: monotonicity, inversion round trips, the honest identity bound,
and two Monte Carlo checks that the stated power is delivered (fixed seeds).

The Monte Carlo assertions compare a measured detection rate with the promised power; their
tolerances are many standard errors wide (2000-4000 draws, standard error about 0.007 at power
0.9), so with the fixed seeds they are deterministic and a change that moves the real power
by more than about 0.05 makes them fail.
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest
import scipy.stats

from losslessness.stats import (
    EXPECTED_COUNT_FLOOR,
    IdentityPlan,
    acceptance_rate_minimum_detectable_shift,
    acceptance_rate_sample_size,
    acceptance_rate_test,
    chi_square_minimum_detectable_tv,
    chi_square_power,
    chi_square_sample_size,
    exact_check_minimum_detectable_rate,
    exact_check_sample_size,
    identity_minimum_detectable_tv,
    identity_test,
    plan_identity_test,
    pooling_partition,
)
from losslessness.stats.binomial import rate_bound_minimum_detectable_shift
from losslessness.stats.power import _binomial_rejection_region, rate_bound_sample_size


def test_chi_square_power_increases_with_n_and_tv() -> None:
    """More samples or a larger deviation can only help (strictly, until power saturates at 1)."""
    sizes = [10, 100, 1000, 10_000]
    distances = [0.01, 0.05, 0.1, 0.3]
    for df in (1, 15, 500):
        for tv in distances:
            powers = [chi_square_power(n, tv, df, 1e-3) for n in sizes]
            assert all(a < b or a == b == 1.0 for a, b in itertools.pairwise(powers))
        for n in sizes:
            powers = [chi_square_power(n, tv, df, 1e-3) for tv in distances]
            assert all(a < b or a == b == 1.0 for a, b in itertools.pairwise(powers))


def test_chi_square_power_edge_cases() -> None:
    """df 0 tests nothing (power 0); n 0 rejects only at the level (power alpha)."""
    assert chi_square_power(1000, 0.5, 0, 0.01) == 0.0
    assert chi_square_power(0, 0.5, 3, 0.01) == pytest.approx(0.01)


@pytest.mark.parametrize(("n", "df"), [(100, 1), (2000, 15), (50_000, 999)])
@pytest.mark.parametrize("power", [0.5, 0.9, 0.99])
def test_minimum_detectable_tv_inverts_chi_square_power(n: int, df: int, power: float) -> None:
    """The power at the returned TV is the requested power."""
    tv = chi_square_minimum_detectable_tv(n, df, 1e-3, power)
    assert 0.0 < tv <= 1.0
    assert chi_square_power(n, tv, df, 1e-3) == pytest.approx(power, abs=1e-8)


def test_minimum_detectable_tv_is_infinite_when_nothing_is_testable() -> None:
    """No samples or no degrees of freedom: no deviation is detectable."""
    assert chi_square_minimum_detectable_tv(0, 5, 1e-3, 0.9) == math.inf
    assert chi_square_minimum_detectable_tv(100, 0, 1e-3, 0.9) == math.inf


def test_minimum_detectable_tv_may_exceed_one() -> None:
    """Too few samples give a bound above 1, returned as is for callers to show."""
    assert chi_square_minimum_detectable_tv(1, 100, 1e-6, 0.99) > 1.0


@pytest.mark.parametrize(("tv", "df"), [(0.01, 1), (0.05, 15), (0.1, 300)])
def test_sample_size_round_trips(tv: float, df: int) -> None:
    """chi_square_sample_size is the smallest n reaching the power: n does, n - 1 does not, and
    the minimum detectable TV at n is at most tv."""
    n = chi_square_sample_size(tv, df, 1e-3, 0.9)
    assert chi_square_power(n, tv, df, 1e-3) >= 0.9
    assert chi_square_power(n - 1, tv, df, 1e-3) < 0.9
    assert (
        chi_square_minimum_detectable_tv(n, df, 1e-3, 0.9)
        <= tv
        < chi_square_minimum_detectable_tv(n - 1, df, 1e-3, 0.9)
    )


def test_sample_size_refuses_df_zero() -> None:
    """A one-cell test never gains power, so no sample size exists."""
    with pytest.raises(ValueError, match="df"):
        chi_square_sample_size(0.1, 0, 1e-3, 0.9)


def test_plan_reaches_tv_and_one_fewer_sample_does_not() -> None:
    """On uniform p (no pooling once n >= floor * V, so the bound is monotone there) the plan's
    bound is <= tv and the bound at n - 1 is not."""
    probs = np.full(16, 1 / 16)
    plan = plan_identity_test(probs, 0.05, 1e-3, 0.9)
    assert isinstance(plan, IdentityPlan)
    assert not plan.capped and plan.pooled_mass == 0.0 and plan.df == 15
    assert plan.minimum_detectable_tv <= 0.05
    before = identity_minimum_detectable_tv(probs, plan.n - 1, 1e-3, 0.9)
    assert before.minimum_detectable_tv > 0.05
    assert plan.n == chi_square_sample_size(0.05, 15, 1e-3, 0.9)


def test_plan_on_peaked_probs_reaches_tv() -> None:
    """With pooling (bound not exactly monotone) the result still meets tv, and n - 1 fails."""
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(1000) / 0.3
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    plan = plan_identity_test(probs, 0.05, 5e-6, 0.9)
    assert plan.minimum_detectable_tv <= 0.05 and not plan.capped
    assert identity_minimum_detectable_tv(probs, plan.n - 1, 5e-6, 0.9).minimum_detectable_tv > 0.05


def test_honest_bound_adds_the_pooled_mass() -> None:
    """The identity bound is the chi-square bound on the pooled partition plus the pooled mass
    (deviations hidden inside the pool are not seen by the chi-square)."""
    probs = np.array([0.4, 0.3, 0.2, 0.05, 0.03, 0.02])
    n = 120
    plan = identity_minimum_detectable_tv(probs, n, 1e-3, 0.9)
    _, df, pooled_mass = pooling_partition(probs, n, EXPECTED_COUNT_FLOOR)
    assert pooled_mass > 0.0
    assert (plan.df, plan.pooled_mass) == (df, pooled_mass)
    assert plan.minimum_detectable_tv == pytest.approx(
        chi_square_minimum_detectable_tv(n, df, 1e-3, 0.9) + pooled_mass
    )
    assert not plan.capped


def test_one_hot_bound_is_the_exact_check_rate() -> None:
    """With one support cell, any deviation is mass on p == 0 cells, caught exactly."""
    plan = identity_minimum_detectable_tv([0.0, 1.0, 0.0], 500, 1e-3, 0.9)
    assert plan.minimum_detectable_tv == exact_check_minimum_detectable_rate(500, 0.9)
    assert (plan.df, plan.pooled_mass, plan.capped) == (0, 0.0, False)


def test_all_pooled_bound_is_infinite() -> None:
    """When the whole support is one pooled cell nothing is detectable."""
    plan = identity_minimum_detectable_tv(np.full(100, 0.01), 50, 1e-3, 0.9)
    assert plan.df == 0 and plan.minimum_detectable_tv == math.inf


def test_plan_stops_at_max_n_and_says_so() -> None:
    """A cap below the needed n returns the bound at the cap, flagged capped; a cap above it
    changes nothing."""
    probs = np.full(16, 1 / 16)
    capped = plan_identity_test(probs, 0.01, 1e-3, 0.9, max_n=1000)
    assert capped.capped and capped.n == 1000
    assert capped.minimum_detectable_tv > 0.01
    assert (
        capped.minimum_detectable_tv
        == identity_minimum_detectable_tv(probs, 1000, 1e-3, 0.9).minimum_detectable_tv
    )
    free = plan_identity_test(probs, 0.05, 1e-3, 0.9)
    roomy = plan_identity_test(probs, 0.05, 1e-3, 0.9, max_n=10**9)
    assert roomy == free


def test_exact_check_rate_formula() -> None:
    """1 - (1 - r)**n equals the power at the returned rate; n == 0 detects nothing."""
    rate = exact_check_minimum_detectable_rate(1000, 0.9)
    assert 1.0 - (1.0 - rate) ** 1000 == pytest.approx(0.9)
    assert exact_check_minimum_detectable_rate(0, 0.9) == math.inf
    assert exact_check_minimum_detectable_rate(10**12, 0.9) == pytest.approx(
        -math.log(0.1) / 10**12, rel=1e-6
    )


@pytest.mark.parametrize("rate", [1e-9, 1e-3, 0.05, 0.5, 0.999, 1.0])
@pytest.mark.parametrize("power", [0.5, 0.9, 0.99])
def test_exact_check_sample_size_inverts_the_minimum_detectable_rate(
    rate: float, power: float
) -> None:
    """The exact check's triple closes: at the returned n the rate is caught with ``power``,
    at n - 1 it is not."""
    n = exact_check_sample_size(rate, power)
    assert exact_check_minimum_detectable_rate(n, power) <= rate
    assert n == 1 or exact_check_minimum_detectable_rate(n - 1, power) > rate


@pytest.mark.parametrize(("shift", "rate"), [(0.05, 0.5), (0.02, 0.9), (0.1, 0.0), (0.03, 1.0)])
def test_acceptance_rate_sample_size_inverts_the_minimum_detectable_shift(
    shift: float, rate: float
) -> None:
    """The acceptance-rate test's triple closes: the shift is detected at the returned n and
    not at n - 1."""
    n = acceptance_rate_sample_size(shift, rate, 1e-3, 0.9)
    assert acceptance_rate_minimum_detectable_shift(n, rate, 1e-3, 0.9) <= shift
    assert acceptance_rate_minimum_detectable_shift(n - 1, rate, 1e-3, 0.9) > shift


@pytest.mark.parametrize(
    ("bound", "alternative"), [(0.3, "greater"), (0.3, "less"), (0.0, "greater")]
)
def test_rate_bound_sample_size_inverts_the_minimum_detectable_shift(
    bound: float, alternative: str
) -> None:
    """The rate-bound test's triple closes: the shift is detected at the returned n and not
    at n - 1."""
    n = rate_bound_sample_size(0.05, bound, 1e-3, 0.9, alternative)
    assert rate_bound_minimum_detectable_shift(n, bound, 1e-3, 0.9, alternative) <= 0.05
    assert rate_bound_minimum_detectable_shift(n - 1, bound, 1e-3, 0.9, alternative) > 0.05


def test_rate_bound_sample_size_refuses_a_shift_beyond_the_room() -> None:
    """No rate lies 0.2 above a bound of 0.9, so no n detects it: ValueError naming ``shift``;
    a bad ``alternative`` is named before any search."""
    with pytest.raises(ValueError, match=r"shift: 0\.2 exceeds the room"):
        rate_bound_sample_size(0.2, 0.9, 1e-3, 0.9, "greater")
    with pytest.raises(ValueError, match="alternative"):
        rate_bound_sample_size(0.05, 0.5, 1e-3, 0.9, "two-sided")


def _detection_rate(n: int, true_rate: float, alpha: float, draws: int, seed: int) -> float:
    """Fraction of Binomial(n, true_rate) draws that acceptance_rate_test rejects at alpha."""
    successes = np.random.default_rng(seed).binomial(n, true_rate, size=draws)
    verdicts = {
        int(k): acceptance_rate_test(int(k), n, 0.3).pvalue <= alpha for k in np.unique(successes)
    }
    return float(np.mean([verdicts[int(k)] for k in successes]))


def test_binomial_shift_is_detected_with_the_requested_power() -> None:
    """Monte Carlo: at the returned shift the exact test detects the worse direction with power
    about 0.9 (in [0.85, 0.95] over 2000 draws) and the other at least as often; half the shift
    is detected clearly less often. The shift is exact, so a normal approximation would miss."""
    n, rate, alpha = 2000, 0.3, 1e-3
    shift = acceptance_rate_minimum_detectable_shift(n, rate, alpha, 0.9)
    up = _detection_rate(n, rate + shift, alpha, 2000, seed=11)
    down = _detection_rate(n, rate - shift, alpha, 2000, seed=12)
    assert 0.85 <= min(up, down) <= 0.95
    assert max(up, down) >= 0.85
    half_up = _detection_rate(n, rate + shift / 2, alpha, 2000, seed=13)
    half_down = _detection_rate(n, rate - shift / 2, alpha, 2000, seed=14)
    assert max(half_up, half_down) < 0.5


def test_binomial_shift_power_is_exact_not_simulated() -> None:
    """The exact power of the worse direction at the shift equals the requested power."""
    n, rate, alpha = 500, 0.3, 1e-2
    shift = acceptance_rate_minimum_detectable_shift(n, rate, alpha, 0.8)

    def power(true_rate: float) -> float:
        outcomes = np.arange(n + 1)
        rejects = np.array(
            [acceptance_rate_test(int(k), n, rate).pvalue <= alpha for k in outcomes]
        )
        return float(scipy.stats.binom.pmf(outcomes[rejects], n, true_rate).sum())

    assert min(power(rate + shift), power(rate - shift)) == pytest.approx(0.8, abs=1e-6)


def test_binomial_shift_edge_cases() -> None:
    """n 0 detects nothing; at rate 0 the test is an exact check; with no room to detect an
    increase (rate 0.999, n 100) the worse direction is undetectable."""
    assert acceptance_rate_minimum_detectable_shift(0, 0.5, 1e-3, 0.9) == math.inf
    assert acceptance_rate_minimum_detectable_shift(100, 0.0, 1e-3, 0.9) == pytest.approx(
        exact_check_minimum_detectable_rate(100, 0.9)
    )
    assert acceptance_rate_minimum_detectable_shift(100, 1.0, 1e-3, 0.9) == pytest.approx(
        exact_check_minimum_detectable_rate(100, 0.9)
    )
    assert acceptance_rate_minimum_detectable_shift(100, 0.999, 1e-3, 0.9) == math.inf


def test_binomial_shift_is_fast_at_a_million_trials() -> None:
    """The planner calls it per check; it must stay interactive (< 50 ms on a quiet machine;
    asserted at 0.5 s to leave room for a loaded CI runner)."""
    start = time.perf_counter()
    shift = acceptance_rate_minimum_detectable_shift(1_000_000, 0.7, 5e-6, 0.9)
    assert time.perf_counter() - start < 0.5
    assert 0.0 < shift < 0.01


def test_identity_test_detects_an_alternative_at_the_minimum_detectable_tv() -> None:
    """Empirical power of identity_test on uniform p, V = 16, at TV =
    chi_square_minimum_detectable_tv.

    The alternative spreads the change in proportion to p (q = p(1 + 2 tv) on one half of the
    cells, p(1 - 2 tv) on the other, halves of equal mass), which makes Cohen's w exactly 2 TV:
    the least detectable shape for its TV, so the promised power 0.9 is the real target.
    Detection must be >= 0.85 over 4000 draws (standard error 0.005); it must also stay <= 0.95,
    since for this shape the bound is tight and a much higher rate means the stated minimum
    detectable TV is needlessly pessimistic (e.g. w = tv instead of 2 tv)."""
    size, n, alpha = 16, 2000, 1e-3
    probs = np.full(size, 1 / size)
    _, df, pooled_mass = pooling_partition(probs, n, EXPECTED_COUNT_FLOOR)
    assert (df, pooled_mass) == (size - 1, 0.0)
    tv = chi_square_minimum_detectable_tv(n, df, alpha, 0.9)
    sign = np.where(np.arange(size) < size // 2, 1.0, -1.0)
    alternative = probs * (1.0 + 2.0 * tv * sign)
    assert 0.5 * np.abs(alternative - probs).sum() == pytest.approx(tv)
    assert np.sqrt(((alternative - probs) ** 2 / probs).sum()) == pytest.approx(2 * tv)
    samples = np.random.default_rng(2024).multinomial(n, alternative, size=4000)
    detected = np.mean([identity_test(row, probs).pvalue <= alpha for row in samples])
    print(f"tv={tv:.4f}: measured power {detected:.3f} (promised 0.9)")
    assert 0.85 <= detected <= 0.95


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: chi_square_power(-1, 0.1, 3, 0.01), "n: must be a non-negative integer"),
        (lambda: chi_square_power(10, 0.0, 3, 0.01), r"tv: must lie in \(0, 1\]"),
        (lambda: chi_square_power(10, 1.5, 3, 0.01), r"tv: must lie in \(0, 1\]"),
        (lambda: chi_square_power(10, 0.1, 3, 1.0), r"alpha: must lie in the open interval"),
        (
            lambda: chi_square_minimum_detectable_tv(10, 3, 0.01, 0.0),
            r"power: must lie in the open",
        ),
        (lambda: chi_square_minimum_detectable_tv(10, -3, 0.01, 0.5), "df: must be a non-negative"),
        (lambda: chi_square_sample_size(math.nan, 3, 0.01, 0.5), "tv: must be finite"),
        (lambda: plan_identity_test([0.5, 0.6], 0.1, 0.01, 0.9), "probs: must sum to 1"),
        (lambda: plan_identity_test([0.5, 0.5], 0.1, 0.01, 0.9, max_n=0), "max_n"),
        (lambda: identity_minimum_detectable_tv([0.5, 0.5], 10, 0.01, 0.9, -1.0), "expected_floor"),
        (lambda: acceptance_rate_minimum_detectable_shift(10, 1.5, 0.01, 0.9), "rate"),
        (lambda: exact_check_minimum_detectable_rate(10, 1.0), "power"),
    ],
)
def test_invalid_input_raises_value_error_naming_the_argument(call: object, match: str) -> None:
    """Every out-of-range argument is rejected with a message naming it."""
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


def _region_by_full_search(n: int, rate: float, alpha: float) -> tuple[int | None, int | None]:
    """The rejection region by binary search over each whole side, without any bracket."""

    def rejects(k: int) -> bool:
        return acceptance_rate_test(k, n, rate).pvalue <= alpha

    low = high = None
    top, bottom = math.ceil(n * rate) - 1, math.floor(n * rate) + 1
    if top >= 0 and rejects(0):
        lo, hi = 0, top
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if rejects(mid) else (lo, mid - 1)
        low = lo
    if bottom <= n and rejects(n):
        lo, hi = bottom, n
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if rejects(mid) else (mid + 1, hi)
        high = hi
    return low, high


@pytest.mark.parametrize("n", [1, 5, 37, 1000, 20000, 300000])
@pytest.mark.parametrize("rate", [0.0, 1e-4, 0.3, 0.5, 0.97, 1.0])
@pytest.mark.parametrize("alpha", [0.05, 6.7e-6])
def test_bracketed_rejection_region_equals_the_full_search(
    n: int, rate: float, alpha: float
) -> None:
    """The quantile bracket that speeds up the region search never changes the region."""
    assert _binomial_rejection_region(n, rate, alpha) == _region_by_full_search(n, rate, alpha)
