"""The randomized PIT (:mod:`losslessness.stats.pit`): exactly U(0, 1) for draws from their law
(an exact computation of its distribution function, for laws Hypothesis draws), the order it
uses, its histogram, and the errors it raises."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from losslessness.stats import identity_test
from losslessness.stats.pit import PIT_CELLS, mass_before, pit_histogram, randomized_pit
from strategies import probability_vectors


def _pit_cdf(p: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``P(u <= t)`` for x ~ p: u is uniform on ``[F(x-), F(x-) + p(x)]`` given x."""
    before = mass_before(p)
    inside = np.clip((t[:, None] - before[None, :]) / np.where(p > 0, p, 1.0), 0.0, 1.0)
    cdf: np.ndarray = (inside * p[None, :]).sum(axis=1)
    return cdf


@given(probability_vectors(st.integers(1, 64)))
def test_pit_of_a_draw_from_its_law_is_exactly_uniform(vector: torch.Tensor) -> None:
    """Exactness, computed: for every law p (every regime of the project's strategy: peaked,
    one-hot, sparse, tiny masses, ties), ``P(u <= t) = t`` at 101 points of [0, 1] (the
    intervals ``[F(x-), F(x-) + p(x))`` tile [0, 1))."""
    p = vector.numpy() / vector.numpy().sum()
    t = np.linspace(0.0, 1.0, 101)
    np.testing.assert_allclose(_pit_cdf(p, t), t, atol=1e-12)


def test_mass_before_orders_tokens_by_decreasing_p_then_index() -> None:
    """The order: the most likely token first; equal p by increasing token index."""
    p = np.array([0.1, 0.4, 0.1, 0.4])
    np.testing.assert_allclose(mass_before(p), [0.8, 0.0, 0.9, 0.4])


def test_truncating_the_tail_moves_the_pit_towards_zero() -> None:
    """Power's direction: draws from p cut to its top 2 have u below the top 2's mass only, so
    the histogram's last cells are empty and the identity test rejects."""
    p = np.array([0.3, 0.25, 0.15, 0.15, 0.1, 0.05])
    cut = np.where(np.arange(6) < 2, p, 0.0) / 0.55
    rng = np.random.default_rng(0)
    x = rng.choice(6, size=2000, p=cut)
    u = randomized_pit(mass_before(p)[x], p[x], rng.random(x.size))
    assert u.max() <= 0.55
    assert identity_test(pit_histogram(u), np.full(PIT_CELLS, 0.1)).pvalue < 1e-100


def test_pooled_pit_of_draws_from_many_laws_is_uniform_in_distribution() -> None:
    """Pooling: one draw from each of 20,000 different laws (Dirichlet rows at V = 50), their
    PITs pass the Kolmogorov-Smirnov test against U(0, 1) (fixed seed, p-value > 1e-3)."""
    rng = np.random.default_rng(1)
    laws = rng.dirichlet(np.full(50, 0.3), size=20_000)
    x = np.array([rng.choice(50, p=row) for row in laws])
    before = np.array([mass_before(row)[token] for row, token in zip(laws, x, strict=True)])
    mass = laws[np.arange(x.size), x]
    u = randomized_pit(before, mass, rng.random(x.size))
    assert stats.kstest(u, "uniform").pvalue > 1e-3


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=200))
def test_pit_histogram_counts_every_value_in_its_cell(values: list[float]) -> None:
    """Each u lands in cell ``floor(u * cells)`` (1.0 in the last) and nothing is lost."""
    u = np.array(values)
    counts = pit_histogram(u)
    assert counts.sum() == u.size
    expected = np.bincount(np.minimum((u * PIT_CELLS).astype(int), PIT_CELLS - 1),
                           minlength=PIT_CELLS)
    np.testing.assert_array_equal(counts, expected)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: randomized_pit(np.zeros(2), np.ones(3), np.zeros(2)), "before, mass, uniforms"),
        (lambda: randomized_pit(np.zeros(2), np.array([0.5, 0.0]), np.zeros(2)), "mass"),
        (lambda: randomized_pit(np.zeros(1), np.ones(1), np.array([1.5])), "uniforms"),
        (lambda: pit_histogram(np.array([0.5]), cells=1), "cells"),
        (lambda: pit_histogram(np.array([np.nan])), "u"),
        (lambda: mass_before(np.array([0.5, -0.1, 0.6])), "probs"),
    ],
)
def test_bad_input_names_the_argument(call: object, match: str) -> None:
    """Wrong shapes, a draw with p = 0, a uniform outside [0, 1], fewer than 2 cells, a NaN and
    negative mass are errors naming the argument."""
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]
