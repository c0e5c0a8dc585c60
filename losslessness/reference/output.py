"""Assembly of a verifier's output row from its accept/reject decisions."""

from __future__ import annotations

import torch

from losslessness.protocol import PLACEHOLDER


def accepted_lengths(accepted: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of accepted drafts in each row.

    Args:
        accepted: ``[B, k]`` bool, the per-position accept decisions (those after the first
            rejection are ignored: the chain stops there).

    Returns:
        ``[B]`` int64 in ``[0, k]``.
    """
    return accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)


def emitted_tokens(
    draft_token_ids: torch.Tensor, n_accepted: torch.Tensor, final_token: torch.Tensor
) -> torch.Tensor:
    """Lay out one verification step's output in the protocol's format.

    Args:
        draft_token_ids: ``[B, k]`` int64 drafts.
        n_accepted: ``[B]`` int64 in ``[0, k]``, accepted drafts per row.
        final_token: ``[B]`` int64, the token emitted after the accepted drafts (the
            correction at the first rejection, or the bonus token when all k were accepted).

    Returns:
        ``[B, k+1]`` int64: ``d_0 .. d_{m-1}, final, -1 ...`` with ``m = n_accepted``.
    """
    batch, k = draft_token_ids.shape
    positions = torch.arange(k + 1, device=draft_token_ids.device)
    out = torch.full((batch, k + 1), PLACEHOLDER, dtype=torch.int64, device=draft_token_ids.device)
    keep = positions[:k].unsqueeze(0) < n_accepted.unsqueeze(1)
    out[:, :k] = torch.where(keep, draft_token_ids.to(torch.int64), out[:, :k])
    out.scatter_(1, n_accepted.unsqueeze(1), final_token.to(torch.int64).unsqueeze(1))
    return out
