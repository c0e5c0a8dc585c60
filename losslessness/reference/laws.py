"""Exact laws of chain speculative sampling: residual, acceptance, per-position laws.

Sources: Leviathan, Kalman, Matias 2022, "Fast Inference from Transformers via Speculative
Decoding", Alg. 1, Thm. 3.5 (the output follows p) and Def. 3.1/Cor. 3.6 (acceptance
probability alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q)); Chen et al. 2023, "Accelerating LLM
Decoding with Speculative Sampling", Alg. 2 and Thm. 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """The residual ``norm(max(0, p - q))`` sampled from after a rejection.

    Where ``p == q`` the residual has no mass; a rejection has probability 0 there, and the
    row is returned as ``p`` (the limit as ``q -> p``), so the result is always a distribution.

    Args:
        target_probs: ``[..., V]`` float, p.
        draft_probs: ``[..., V]`` float, q (same shape).

    Returns:
        ``[..., V]`` float64 rows summing to 1.

    Source: Leviathan et al. 2022, Alg. 1 ("sample from norm(max(0, p - q))").
    """
    p = target_probs.to(torch.float64)
    residual = (p - draft_probs.to(torch.float64)).clamp_(min=0.0)
    # Scaling by the row maximum first keeps subnormal residual masses exact to normalise.
    peak = residual.amax(dim=-1, keepdim=True)
    positive = peak > 0
    scaled = residual / torch.where(positive, peak, 1.0)
    return torch.where(positive, scaled / scaled.sum(dim=-1, keepdim=True), p)


def acceptance_probability(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Probability that a draft ``d ~ q`` is accepted: ``sum_x min(p(x), q(x))``.

    Args:
        target_probs: ``[..., V]`` float, p.
        draft_probs: ``[..., V]`` float, q.

    Returns:
        ``[...]`` float64 in ``[0, 1]``, equal to ``1 - TV(p, q)``.

    Source: Leviathan et al. 2022, Def. 3.1 and Cor. 3.6.
    """
    p = target_probs.to(torch.float64)
    q = draft_probs.to(torch.float64)
    return torch.minimum(p, q).sum(dim=-1).clamp_(0.0, 1.0)


def total_variation(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Total variation distance ``0.5 * sum_x |a(x) - b(x)|`` along the last axis.

    Args:
        first: ``[..., V]`` float.
        second: ``[..., V]`` float.

    Returns:
        ``[...]`` float64 in ``[0, 1]``.
    """
    return 0.5 * (first.to(torch.float64) - second.to(torch.float64)).abs().sum(dim=-1)


@dataclass(frozen=True)
class ChainLaws:
    """Exact laws of one chain verification step for one row (p_0..p_k, q_0..q_{k-1}).

    Rows do not depend on the drafted prefix here (the audit's cases fix them), so the law of
    the token emitted at position i, given that position i is reached, is exactly p_i.

    Attributes:
        emitted: ``[k+1, V]`` float64; law of the token emitted at position i given the
            step reaches i (that is, d_0..d_{i-1} were accepted). Row k is the bonus token.
        acceptance: ``[k]`` float64; P(d_i accepted | position i reached) = sum min(p_i, q_i).
        reach: ``[k+1]`` float64; P(position i reached) = prod_{j<i} acceptance_j.
        accepted_length: ``[k+1]`` float64; P(exactly m drafts accepted), m = 0..k.
        residual: ``[k, V]`` float64; law of the emitted token given d_i was rejected.
        accepted_token: ``[k, V]`` float64; law of d_i given it was accepted,
            ``min(p_i, q_i) / acceptance_i`` (uniform-free diagnostic; rows with acceptance 0
            are all zero).
    """

    emitted: torch.Tensor
    acceptance: torch.Tensor
    reach: torch.Tensor
    accepted_length: torch.Tensor
    residual: torch.Tensor
    accepted_token: torch.Tensor


def chain_laws(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> ChainLaws:
    """Compute :class:`ChainLaws` for one row.

    Args:
        target_probs: ``[k+1, V]`` float, p_0..p_k.
        draft_probs: ``[k, V]`` float, q_0..q_{k-1}.

    Returns:
        The exact laws, all float64.

    Raises:
        ValueError: if the shapes are not ``[k+1, V]`` and ``[k, V]``.

    Source: Leviathan et al. 2022, Thm. 3.5 and Sec. 3.3 (number of generated tokens).
    """
    if target_probs.dim() != 2 or draft_probs.dim() != 2:
        raise ValueError(
            f"target_probs/draft_probs: expected [k+1, V] and [k, V], got "
            f"{tuple(target_probs.shape)} and {tuple(draft_probs.shape)}"
        )
    if (
        draft_probs.shape[0] + 1 != target_probs.shape[0]
        or draft_probs.shape[1] != target_probs.shape[1]
    ):
        raise ValueError(
            f"draft_probs: shape {tuple(draft_probs.shape)} does not fit target_probs "
            f"{tuple(target_probs.shape)} (expected [k, V] with k+1 target rows)"
        )
    p = target_probs.to(torch.float64)
    q = draft_probs.to(torch.float64)
    k = q.shape[0]
    acceptance = acceptance_probability(p[:k], q)
    reach = torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(acceptance, dim=0)])
    stop = torch.cat([1.0 - acceptance, torch.ones(1, dtype=torch.float64)])
    overlap = torch.minimum(p[:k], q)
    safe = acceptance.clamp(min=torch.finfo(torch.float64).tiny).unsqueeze(1)
    return ChainLaws(
        emitted=p / p.sum(dim=-1, keepdim=True),
        acceptance=acceptance,
        reach=reach,
        accepted_length=reach * stop,
        residual=residual_distribution(p[:k], q),
        accepted_token=torch.where(
            acceptance.unsqueeze(1) > 0, overlap / safe, torch.zeros_like(overlap)
        ),
    )
