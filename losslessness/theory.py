"""The speedup model of speculative decoding: tokens per verify, speedup, optimal draft length.

Assumptions (Leviathan, Kalman, Matias 2022, section 3.1 and eq. 1): each draft token is
accepted with the same probability alpha, independently of the others (the i.i.d. model;
alpha = E[sum min(p, q)] = 1 - E[TV(p, q)]); drafting one token costs ``c`` target forward
passes; verifying k drafts costs one target forward pass. One verify step ("cycle") then emits

    E[tokens / verify] = 1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha)

tokens (the accepted drafts plus one correction or bonus token; ``k + 1`` at alpha = 1) and
costs ``k c + 1``, so

    speedup(alpha, k, c) = E[tokens / verify] / (k c + 1)

over plain decoding. The i-th draft token adds alpha^i (it counts only if all before it are
accepted) at constant cost c: returns diminish geometrically, an optimal k exists, and it is 0
(turn speculation off) when no k >= 1 beats plain decoding. Even free drafts cannot beat the
ceiling ``1 / (1 - alpha)`` tokens per verify.

What the model omits, and which way it biases (so it is an upper bound): verify cost grows
slightly with k, acceptance correlates within a phrase, drafter and target compete for the
accelerator at high batch, and every cycle has fixed overheads.
"""

from __future__ import annotations

import math

import scipy.optimize

__all__ = [
    "DEFAULT_MAX_K",
    "alpha_from_mean_accepted_length",
    "expected_tokens_per_verify",
    "marginal_value",
    "optimal_k",
    "speedup",
    "tokens_per_verify_ceiling",
]

DEFAULT_MAX_K = 64
"""Largest draft length :func:`optimal_k` considers (at alpha = 1 and c = 0 the speedup grows
without bound, so the search needs a cap)."""


def _check_alpha(alpha: float) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise ValueError(f"alpha: must be a real number in [0, 1], got {type(alpha).__name__}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha: must lie in [0, 1], got {alpha!r}")
    return float(alpha)


def _check_k(k: int, name: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"{name}: must be an int >= 0, got {k!r}")
    return k


def _check_cost(c: float) -> float:
    if isinstance(c, bool) or not isinstance(c, int | float):
        raise ValueError(f"c: must be a real number >= 0, got {type(c).__name__}")
    if not (math.isfinite(c) and c >= 0.0):
        raise ValueError(f"c: must be finite and >= 0, got {c!r}")
    return float(c)


def expected_tokens_per_verify(alpha: float, k: int) -> float:
    """E[tokens emitted per verify step] = (1 - alpha^(k+1)) / (1 - alpha).

    Args:
        alpha: per-token acceptance rate in [0, 1].
        k: draft length, int >= 0.

    Returns:
        Tokens per verify step in [1, k + 1]: 1 at alpha = 0 (the correction only), k + 1 at
        alpha = 1 (every draft and the bonus token).

    Raises:
        ValueError: naming ``alpha`` or ``k`` when out of range.

    Notes:
        Leviathan et al. 2022, eq. 1. Summed as the series 1 + alpha + ... + alpha^k, which is
        exact at both edges and avoids 0/0 at alpha = 1.
    """
    rate = _check_alpha(alpha)
    drafts = _check_k(k)
    return math.fsum(rate**i for i in range(drafts + 1))


def speedup(alpha: float, k: int, c: float) -> float:
    """Expected speedup over plain decoding: ``expected_tokens_per_verify(alpha, k) / (k c + 1)``.

    Args:
        alpha: per-token acceptance rate in [0, 1].
        k: draft length, int >= 0 (k = 0 is plain decoding: speedup 1).
        c: cost of drafting one token, in target forward passes, >= 0.

    Returns:
        The speedup factor (below 1: speculation loses).

    Raises:
        ValueError: naming the argument out of range.

    Notes:
        Leviathan et al. 2022, Thm. 3.8 (expected walltime improvement factor, with c their
        cost coefficient and gamma = k).
    """
    cost = _check_cost(c)
    return expected_tokens_per_verify(alpha, k) / (_check_k(k) * cost + 1.0)


def optimal_k(alpha: float, c: float, max_k: int = DEFAULT_MAX_K) -> int:
    """The draft length in ``0..max_k`` with the largest :func:`speedup` (the smallest such k
    on ties); 0 when no k >= 1 beats plain decoding (turn speculation off).

    Raises:
        ValueError: naming ``alpha``, ``c`` or ``max_k`` when out of range.
    """
    rate = _check_alpha(alpha)
    cost = _check_cost(c)
    limit = _check_k(max_k, "max_k")
    speedups = [speedup(rate, k, cost) for k in range(limit + 1)]
    best = max(speedups)
    return speedups.index(best)


def marginal_value(alpha: float, i: int) -> float:
    """Expected tokens the i-th draft token adds: alpha^i (it counts only when drafts 1..i
    are all accepted). ``expected_tokens_per_verify(alpha, k) = 1 + sum_{i=1..k}
    marginal_value(alpha, i)``.

    Raises:
        ValueError: naming ``alpha`` or ``i`` (an int >= 1).
    """
    rate = _check_alpha(alpha)
    if isinstance(i, bool) or not isinstance(i, int) or i < 1:
        raise ValueError(f"i: must be an int >= 1 (draft positions count from 1), got {i!r}")
    return rate**i


def tokens_per_verify_ceiling(alpha: float) -> float:
    """``1 / (1 - alpha)``: the limit of tokens per verify as k grows (``inf`` at alpha = 1).

    Raises:
        ValueError: naming ``alpha`` when out of range.
    """
    rate = _check_alpha(alpha)
    return math.inf if rate == 1.0 else 1.0 / (1.0 - rate)


def alpha_from_mean_accepted_length(mean_accepted: float, k: int) -> float:
    """The alpha whose i.i.d. model gives ``mean_accepted`` accepted drafts per verify step.

    Solves ``alpha + alpha^2 + ... + alpha^k = mean_accepted`` (the left side increases
    strictly from 0 to k on [0, 1]) with ``scipy.optimize.brentq``.

    Args:
        mean_accepted: mean number of accepted draft tokens per verify step, in [0, k]. vLLM's
            ``mean acceptance length`` metric counts the emitted correction or bonus token
            too (``1 + accepted / drafts``): subtract 1 from it first.
        k: the draft length, int >= 1.

    Returns:
        alpha in [0, 1] (0 and 1 exactly at the edges).

    Raises:
        ValueError: naming ``k`` (< 1) or ``mean_accepted`` (outside [0, k]).
    """
    drafts = _check_k(k)
    if drafts < 1:
        raise ValueError("k: must be >= 1; with no drafts nothing is accepted")
    if isinstance(mean_accepted, bool) or not isinstance(mean_accepted, int | float):
        raise ValueError(f"mean_accepted: must be a real number, got {type(mean_accepted)}")
    if not 0.0 <= mean_accepted <= drafts:
        raise ValueError(f"mean_accepted: must lie in [0, k={drafts}], got {mean_accepted!r}")
    if mean_accepted == 0.0:
        return 0.0
    if mean_accepted == drafts:
        return 1.0

    def excess(alpha: float) -> float:
        return expected_tokens_per_verify(alpha, drafts) - 1.0 - mean_accepted

    return float(scipy.optimize.brentq(excess, 0.0, 1.0, xtol=1e-14, rtol=1e-14))
