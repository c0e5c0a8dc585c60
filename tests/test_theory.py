"""The speedup model's claims (Leviathan et al. 2022, eq. 1 and Thm. 3.8; the course's lab on
the speedup model): the formula's edges, agreement with a simulated loop, the losing regime,
the EAGLE-like ballpark, the monotonicities of the optimal k, geometric marginal value, and the
alpha inversion; plus the ``losslessness speedup`` command."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from losslessness.cli import main
from losslessness.theory import (
    alpha_from_mean_accepted_length,
    expected_tokens_per_verify,
    marginal_value,
    optimal_k,
    speedup,
    tokens_per_verify_ceiling,
)

SIMULATION_SEED = 20240611
"""Seed of the simulated loop (printed on failure through the assertion message)."""


@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_expected_tokens_is_one_at_alpha_zero_and_k_plus_one_at_alpha_one(k: int) -> None:
    """Edges: at alpha = 0 only the correction is emitted (1 token, never less than plain
    decoding); at alpha = 1 every draft and the bonus token (k + 1)."""
    assert expected_tokens_per_verify(0.0, k) == 1.0
    assert expected_tokens_per_verify(1.0, k) == k + 1


def test_expected_tokens_matches_the_closed_form_and_the_seed_value() -> None:
    """E = (1 - a^(k+1)) / (1 - a) inside (0, 1); at k = 5, a = 0.8 gives 3.69 and a = 0.9
    gives 4.69, as the course's table prints. (Its rows for 0.6 and 0.7, 2.31 and 2.77, are
    the k = 4 values: (1 - a^5) / (1 - a).)"""
    for alpha in (0.1, 0.5, 0.7, 0.93):
        for k in (1, 3, 8):
            closed = (1 - alpha ** (k + 1)) / (1 - alpha)
            assert expected_tokens_per_verify(alpha, k) == pytest.approx(closed, rel=1e-12)
    assert round(expected_tokens_per_verify(0.8, 5), 2) == 3.69
    assert round(expected_tokens_per_verify(0.9, 5), 2) == 4.69
    assert round(expected_tokens_per_verify(0.6, 4), 2) == 2.31
    assert round(expected_tokens_per_verify(0.7, 4), 2) == 2.77


@pytest.mark.parametrize(("alpha", "k"), [(0.5, 3), (0.7, 5), (0.9, 8)])
def test_iid_model_agrees_with_a_simulated_200k_cycle_loop_within_one_percent(
    alpha: float, k: int
) -> None:
    """The i.i.d. model is validated by simulation: 200,000 cycles, each accepting drafts
    until the first rejection (probability alpha each), then emitting one more token."""
    rng = np.random.default_rng(SIMULATION_SEED)
    accepted = rng.random((200_000, k)) < alpha
    run_lengths = np.cumprod(accepted, axis=1).sum(axis=1)
    simulated = float((run_lengths + 1).mean())
    model = expected_tokens_per_verify(alpha, k)
    assert abs(simulated - model) / model < 0.01, (simulated, model, SIMULATION_SEED)


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5, 0.99, 1.0])
@pytest.mark.parametrize("k", [0, 1, 4, 16])
def test_free_drafter_never_loses(alpha: float, k: int) -> None:
    """With c = 0 (n-gram / prompt lookup) the speedup equals E >= 1 for every alpha and k."""
    assert speedup(alpha, k, 0.0) == expected_tokens_per_verify(alpha, k) >= 1.0


def test_weak_expensive_drafter_loses_and_optimal_k_turns_speculation_off() -> None:
    """alpha = 0.2, c = 0.5, k = 5: speedup below 1, and the optimal k is 0."""
    assert speedup(0.2, 5, 0.5) < 1.0
    assert optimal_k(0.2, 0.5) == 0


def test_eagle_like_numbers_give_about_2_3x() -> None:
    """alpha ~ 0.7, c ~ 0.05, k = 5: about 2.3x (the ballpark EAGLE deployments report)."""
    assert speedup(0.7, 5, 0.05) == pytest.approx(2.35, abs=0.05)


def test_optimal_k_grows_with_alpha_and_shrinks_with_cost() -> None:
    """Monotone in both directions, and strictly so somewhere on each grid."""
    alphas = [0.3, 0.5, 0.7, 0.8, 0.9, 0.95]
    for cost in (0.01, 0.05, 0.2):
        ks = [optimal_k(alpha, cost) for alpha in alphas]
        assert ks == sorted(ks) and ks[0] < ks[-1], (cost, ks)
    costs = [0.0, 0.01, 0.05, 0.1, 0.3, 1.0]
    for alpha in (0.5, 0.8, 0.9):
        ks = [optimal_k(alpha, cost) for cost in costs]
        assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1], (alpha, ks)


def test_marginal_value_of_draft_token_decays_geometrically() -> None:
    """The i-th draft token adds alpha^i: consecutive ratios are alpha, and the increments of
    E in k are exactly the marginal values."""
    alpha = 0.7
    values = [marginal_value(alpha, i) for i in range(1, 10)]
    ratios = [b / a for a, b in itertools.pairwise(values)]
    assert ratios == pytest.approx([alpha] * len(ratios))
    for k in range(1, 10):
        increment = expected_tokens_per_verify(alpha, k) - expected_tokens_per_verify(alpha, k - 1)
        assert increment == pytest.approx(marginal_value(alpha, k))


def test_ceiling_bounds_tokens_per_verify_for_every_k() -> None:
    """Free drafts cannot beat 1 / (1 - alpha) tokens per verify (3.33 at 0.7, 2 at 0.5)."""
    assert tokens_per_verify_ceiling(0.5) == 2.0
    assert tokens_per_verify_ceiling(1.0) == math.inf
    for k in (1, 10, 100):
        assert expected_tokens_per_verify(0.7, k) < tokens_per_verify_ceiling(0.7)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7, 0.95, 1.0])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_alpha_from_mean_accepted_length_inverts_the_model(alpha: float, k: int) -> None:
    """Backing alpha out of E - 1 (mean accepted drafts per verify) recovers alpha."""
    mean = expected_tokens_per_verify(alpha, k) - 1.0
    assert alpha_from_mean_accepted_length(mean, k) == pytest.approx(alpha, abs=1e-10)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: expected_tokens_per_verify(1.2, 3), "alpha"),
        (lambda: expected_tokens_per_verify(0.5, -1), "k"),
        (lambda: speedup(0.5, 3, -0.1), "c"),
        (lambda: speedup(0.5, 3, math.nan), "c"),
        (lambda: marginal_value(0.5, 0), "i"),
        (lambda: optimal_k(0.5, 0.1, max_k=-1), "max_k"),
        (lambda: alpha_from_mean_accepted_length(4.0, 3), "mean_accepted"),
        (lambda: alpha_from_mean_accepted_length(1.0, 0), "k"),
    ],
)
def test_out_of_range_arguments_are_named_in_the_error(call: object, argument: str) -> None:
    """Bad input raises ValueError naming the argument."""
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        call()  # type: ignore[operator]


def test_speedup_command_prints_the_numbers_and_writes_the_plot(tmp_path: Path) -> None:
    """``losslessness speedup --alpha 0.7 --k 5 --c 0.05 --plot PATH`` prints E, speedup and
    the optimal k, and writes a PNG."""
    path = tmp_path / "speedup.png"
    result = CliRunner().invoke(
        main,
        ["speedup", "--alpha", "0.7", "--k", "5", "--c", "0.05", "--plot", str(path)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "k=5: 2.941 tokens/verify, speedup 2.353x (a gain)" in result.output
    assert "optimal k in 0..16: 6, speedup 2.353x" in result.output
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_speedup_command_says_to_turn_speculation_off_when_it_loses() -> None:
    """The losing regime is reported as such."""
    result = CliRunner().invoke(
        main, ["speedup", "--alpha", "0.2", "--k", "5", "--c", "0.5"], catch_exceptions=False
    )
    assert result.exit_code == 0
    assert "a loss" in result.output and "turn it off" in result.output
