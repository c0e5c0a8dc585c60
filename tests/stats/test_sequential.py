"""The e-processes of :mod:`losslessness.stats.sequential`: closed forms against independent
computations, the alpha split, the partitions, and bad input named."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, special

from losslessness.stats import pooling_partition
from losslessness.stats.sequential import (
    SEQUENTIAL_ALPHA_SHARE,
    binomial_upper_log_evalue,
    cell_partitions,
    multinomial_log_evalue,
    partition_mixture_log_evalue,
    split_alpha,
)


def test_multinomial_evalue_equals_the_product_of_krichevsky_trofimov_predictions() -> None:
    """The closed form equals the sequential product of the KT predictive probabilities divided
    by p, token by token (an independent computation of the same martingale)."""
    rng = np.random.default_rng(3)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    tokens = rng.choice(4, size=300, p=[0.4, 0.4, 0.1, 0.1])
    counts = np.zeros(4)
    log_e = 0.0
    for token in tokens:
        predictive = (counts[token] + 0.5) / (counts.sum() + 4 * 0.5)
        log_e += math.log(predictive / p[token])
        counts[token] += 1
    assert multinomial_log_evalue(counts.astype(np.int64), p) == pytest.approx(log_e, abs=1e-9)


def test_binomial_upper_evalue_equals_the_truncated_beta_mixture_integral() -> None:
    """The closed form equals the numerical integral of the likelihood ratio over the
    Beta(1/2, 1/2) prior truncated to (rate, 1]."""
    successes, trials, rate = 37, 60, 0.45
    prior_mass = special.betaincc(0.5, 0.5, rate)

    def integrand(theta: float) -> float:
        ratio = (theta / rate) ** successes * ((1 - theta) / (1 - rate)) ** (trials - successes)
        return float(ratio * theta**-0.5 * (1 - theta) ** -0.5 / special.beta(0.5, 0.5))

    value, _ = integrate.quad(integrand, rate, 1.0, limit=200)
    assert binomial_upper_log_evalue(successes, trials, rate) == pytest.approx(
        math.log(value / prior_mass), rel=1e-6
    )


def test_binomial_upper_evalue_grows_only_above_the_rate() -> None:
    """Evidence grows with a success rate above the bound and vanishes below it: the test is
    one-sided (a low acceptance rate is SUBOPTIMAL, never evidence of loss)."""
    above = binomial_upper_log_evalue(700, 1000, 0.6)
    below = binomial_upper_log_evalue(500, 1000, 0.6)
    assert above > math.log(1e6)
    assert below < 0
    assert binomial_upper_log_evalue(0, 0, 0.3) == 0.0
    assert binomial_upper_log_evalue(5, 10, 1.0) == 0.0
    assert binomial_upper_log_evalue(1, 10, 0.0) == math.inf


def test_partitions_start_with_the_fixed_tests_cells_and_leave_zero_cells_out() -> None:
    """The first partition is the fixed-n test's pooling at the planned n; coarsenings merge
    cells into fewer groups; zero-probability cells carry label -1 in every partition."""
    p = np.array([0.0, 0.4, 0.3, 0.2, 0.05, 0.03, 0.02, 0.0])
    pooled = pooling_partition(p, 400)[0]
    partitions = cell_partitions(p, pooled)
    first = partitions[0]
    assert (first[p == 0] == -1).all()
    assert int(first.max()) + 1 == int((p > 0).sum() - pooled.sum()) + int(pooled.any())
    assert len({int(first[i]) for i in np.flatnonzero(pooled)}) == 1
    for coarse in partitions[1:]:
        assert (coarse[p == 0] == -1).all()
        assert 2 <= int(coarse.max()) + 1 < int(first.max()) + 1


def test_mixture_over_partitions_is_the_average_of_the_e_values() -> None:
    """Averaging e-values keeps an e-value: the mixture is log of the mean of the parts."""
    p = np.full(16, 1 / 16)
    counts = np.random.default_rng(1).multinomial(500, p)
    partitions = cell_partitions(p, np.zeros(16, dtype=bool))
    parts = []
    for labels in partitions:
        size = int(labels.max()) + 1
        parts.append(
            multinomial_log_evalue(
                np.bincount(labels, weights=counts, minlength=size).astype(np.int64),
                np.bincount(labels, weights=p, minlength=size),
            )
        )
    assert partition_mixture_log_evalue(counts, p, partitions) == pytest.approx(
        math.log(np.mean(np.exp(parts)))
    )


def test_split_alpha_gives_the_sequential_share_and_keeps_the_sum() -> None:
    """The split's parts sum to the assertion's level; share 0 is the fixed design."""
    split = split_alpha(1e-4)
    assert split.sequential == pytest.approx(SEQUENTIAL_ALPHA_SHARE * 1e-4)
    assert split.total == pytest.approx(1e-4)
    assert split_alpha(1e-4, 0.0).fixed == 1e-4


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: split_alpha(0.0), "alpha"),
        (lambda: split_alpha(0.1, 1.0), "share"),
        (lambda: multinomial_log_evalue(np.array([1, 2]), np.array([1.0])), "counts"),
        (lambda: multinomial_log_evalue(np.array([-1, 2]), np.array([0.5, 0.5])), "counts"),
        (lambda: multinomial_log_evalue(np.array([1, 2]), np.array([0.0, 1.0])), "probs"),
        (lambda: multinomial_log_evalue(np.array([1, 2]), np.array([np.nan, 0.5])), "probs"),
        (lambda: multinomial_log_evalue(np.array([1.0, np.nan]), np.array([0.5, 0.5])), "counts"),
        (lambda: binomial_upper_log_evalue(11, 10, 0.5), "successes"),
        (lambda: binomial_upper_log_evalue(1, 10, float("nan")), "rate"),
    ],
)
def test_bad_input_names_the_argument(call: object, name: str) -> None:
    """Out-of-range input raises ValueError naming the argument."""
    with pytest.raises(ValueError, match=name):
        call()  # type: ignore[operator]
