"""Shared builders for the chain-reference tests."""

from __future__ import annotations

import torch

from losslessness.reference import ChainUniforms, verify_with_uniforms


def verify_each_row_alone(
    target: torch.Tensor, draft: torch.Tensor, ids: torch.Tensor, uniforms: ChainUniforms
) -> torch.Tensor:
    """Each batch row verified alone through the shared-table path (a batch of 2 expanded
    copies of it, with its own uniforms): ``[B, k+1, V]``, ``[B, k, V]``, ``[B, k]`` ->
    ``[B, k+1]``."""
    rows = []
    for b in range(target.shape[0]):
        pair = verify_with_uniforms(
            target[b].expand(2, -1, -1),
            draft[b].expand(2, -1, -1),
            ids[b].expand(2, -1),
            uniforms.accept_uniforms[b].expand(2, -1),
            uniforms.sample_uniforms[b].expand(2),
        )
        rows.append(pair[0])
    return torch.stack(rows)
