"""Reference greedy verifier: the output equals plain greedy (argmax) decoding.

Accept d_i while it equals argmax of the target logits at position i (ties go to the lowest
index, as ``torch.argmax`` documents); at the first mismatch emit the argmax; when all k match,
emit the bonus argmax at position k. Source: Leviathan et al. 2022, Sec. 2 (greedy case);
vLLM ``rejection_sampler.py`` greedy path.
"""

from __future__ import annotations

import torch

from losslessness.protocol import InvalidInputError, validate_greedy_inputs
from losslessness.reference.output import accepted_lengths, emitted_tokens


def argmax_lowest_index(logits: torch.Tensor) -> torch.Tensor:
    """Argmax along the last axis with ties broken towards the lowest index.

    Computed explicitly (first index equal to the row maximum) rather than trusting a backend's
    argmax, whose tie rule is documented for CPU but is exactly what implementations get wrong.

    Args:
        logits: ``[..., V]`` float, no NaN.

    Returns:
        ``[...]`` int64.
    """
    is_max = logits == logits.max(dim=-1, keepdim=True).values
    positions = torch.arange(logits.shape[-1], device=logits.device)
    return torch.where(is_max, positions, logits.shape[-1]).min(dim=-1).values


def verify_greedy(target_logits: torch.Tensor, draft_token_ids: torch.Tensor) -> torch.Tensor:
    """One greedy verification step (the greedy protocol).

    Args:
        target_logits: ``[B, k+1, V]`` float on any device; ``-inf`` allowed for masked tokens.
        draft_token_ids: ``[B, k]`` int64 on the same device.

    Returns:
        ``[B, k+1]`` int64 on the device of ``target_logits``, emitted tokens left-aligned and
        -1 after the last. Computed on that device in the logits' own dtype (the argmax
        needs no conversion).

    Raises:
        InvalidInputError: see :func:`losslessness.protocol.validate_greedy_inputs`; also
            ``draft_token_ids`` on another device than ``target_logits``.
    """
    _, k, _ = validate_greedy_inputs(target_logits, draft_token_ids)
    if draft_token_ids.device != target_logits.device:
        raise InvalidInputError(
            "draft_token_ids",
            f"is on {draft_token_ids.device}, but target_logits is on {target_logits.device}; "
            "use one device",
        )
    ids = draft_token_ids.to(torch.int64)
    best = argmax_lowest_index(target_logits)
    n_accepted = accepted_lengths(ids == best[:, :k])
    final_token = best.gather(1, n_accepted.unsqueeze(1)).squeeze(1)
    return emitted_tokens(ids, n_accepted, final_token)
