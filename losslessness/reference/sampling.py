"""Inverse-CDF sampling from probability rows with explicit uniforms."""

from __future__ import annotations

import torch


def sample_inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Draw one token per uniform by inverting the cumulative distribution.

    A uniform ``u`` in ``[0, 1)`` maps to the first token whose cumulative mass exceeds
    ``u * total``; tokens with zero mass are never returned, and the row need not be normalised.

    Args:
        probs: ``[V]`` (one table shared by every draw) or ``[N, V]`` (one row per draw),
            non-negative with a positive sum; computed in float64.
        uniforms: ``[N]`` float in ``[0, 1)``.

    Returns:
        ``[N]`` int64 token ids in ``[0, V)``.
    """
    cdf = probs.to(torch.float64).cumsum(dim=-1)
    u = uniforms.to(torch.float64)
    if cdf.dim() == 1:
        targets = u * cdf[-1]
        index = torch.searchsorted(cdf, targets, right=True)
    else:
        targets = (u * cdf[:, -1]).unsqueeze(1)
        index = torch.searchsorted(cdf, targets, right=True).squeeze(1)
    # u * total can round up to total itself; the last positive-mass token is then the answer.
    overflow = index >= probs.shape[-1]
    if bool(overflow.any()):
        positions = torch.arange(probs.shape[-1], device=probs.device)
        last = torch.where(probs > 0, positions, -1).max(dim=-1).values
        index = torch.where(overflow, last, index)
    return index
