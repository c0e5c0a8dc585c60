"""Steps shared by the chain and tree mutants of the zoo: row normalisation in float64 and
uniforms from the caller's generator (each mutant's own steps live with it)."""

from __future__ import annotations

import torch

ROW_SUM_EXACT = 1e-12
"""Rows whose sums are within this of 1 are already normalised to float64 rounding."""


def renormalise(probs: torch.Tensor) -> torch.Tensor:
    """Rows divided by their sums; an all-zero row stays zero.

    Args:
        probs: ``[..., V]`` float rows, non-negative.

    Returns:
        A tensor of the same shape and dtype.
    """
    total = probs.sum(dim=-1, keepdim=True)
    return probs / torch.where(total > 0, total, 1.0)


def normalised(probs: torch.Tensor) -> torch.Tensor:
    """Rows of ``probs`` as float64 divided by their sums (:func:`renormalise`).

    Rows already normalised to float64 rounding (:data:`ROW_SUM_EXACT`; the audit's cases) are
    returned as they are, possibly the input itself, which callers never modify: the division
    would be the most expensive pass of a call at large V.

    Args:
        probs: ``[..., V]`` float rows, non-negative.

    Returns:
        ``[..., V]`` float64.
    """
    rows = probs.to(torch.float64)
    sums = rows.sum(dim=-1, keepdim=True)
    if rows.numel() == 0 or bool(((sums - 1.0).abs() <= ROW_SUM_EXACT).all()):
        return rows
    return renormalise(rows)


def draw_uniforms(generator: torch.Generator, *shape: int) -> torch.Tensor:
    """float64 uniforms in [0, 1) of ``shape``, drawn on the generator's device (all of a
    mutant's randomness comes from the caller's generator), returned on CPU."""
    return torch.rand(shape, generator=generator, dtype=torch.float64,
                      device=generator.device).cpu()
