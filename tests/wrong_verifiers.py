"""Deliberately wrong chain verifiers (and one lossless-but-suboptimal control) for measuring
the audit's power. Each is the reference algorithm with one step changed; the docstring names
the change and the property it breaks.

Run one: ``losslessness audit tests.wrong_verifiers:residual_is_target`` (exits 1).
``sample_and_match``, ``shared_random_stream`` and ``greedy_ties_to_highest`` are the mutant
zoo's (:mod:`losslessness.zoo.chain`), re-exported under their old names.
"""

from __future__ import annotations

import torch

from losslessness.laws import residual_distribution
from losslessness.protocol import validate_chain_inputs
from losslessness.reference import accepted_lengths, emitted_tokens, sample_inverse_cdf
from losslessness.zoo.chain import (
    greedy_ties_to_highest,
    sample_and_match,
    shared_random_stream,
)

__all__ = [
    "acceptance_never_stops",
    "bonus_from_wrong_row",
    "clamp_target_at_floor",
    "crashes_on_large_vocab",
    "drops_placeholder",
    "greedy_ties_to_highest",
    "ratio_inverted",
    "residual_is_target",
    "residual_truncated_to_top16",
    "sample_and_match",
    "shared_random_stream",
]


def _chain(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
    *,
    invert_ratio: bool = False,
    count_all_accepts: bool = False,
    residual_is_target: bool = False,
    bonus_row_offset: int = 0,
    target_floor: float | None = None,
    residual_top: int | None = None,
) -> torch.Tensor:
    """The reference chain verifier with optional single-step defects (float64)."""
    batch, k, _ = validate_chain_inputs(target_probs, draft_probs, draft_token_ids, generator)
    p = target_probs.to(torch.float64)
    if target_floor is not None:
        p = torch.where(p > 0, p.clamp(min=target_floor), p)
        p = p / p.sum(dim=-1, keepdim=True)
    q = draft_probs.to(torch.float64)
    ids = draft_token_ids.to(torch.int64)
    u = torch.rand((batch, k), generator=generator, dtype=torch.float64)
    p_d = p[:, :k].gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    q_d = q.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    ratio = q_d / p_d.clamp(min=1e-300) if invert_ratio else p_d / q_d
    accepted = u < ratio
    n_accepted = accepted.sum(dim=1) if count_all_accepts else accepted_lengths(accepted)
    rows = torch.arange(batch)
    final_row = torch.where(n_accepted == k, n_accepted - bonus_row_offset, n_accepted)
    p_final = p[rows, final_row]
    law = p_final
    if k > 0 and not residual_is_target:
        q_final = q[rows, n_accepted.clamp(max=k - 1)]
        residual = residual_distribution(p_final, q_final)
        if residual_top is not None and residual.shape[-1] > residual_top:
            kth = residual.topk(residual_top, dim=-1).values[:, -1:]
            residual = torch.where(residual >= kth, residual, 0.0)
        law = torch.where((n_accepted < k).unsqueeze(1), residual, p_final)
    final = sample_inverse_cdf(law, torch.rand(batch, generator=generator, dtype=torch.float64))
    return emitted_tokens(ids, n_accepted, final)


def residual_is_target(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """WRONG: after a rejection, samples from p instead of norm(max(0, p - q)).

    Tokens that q over-proposes get mass twice (accepted drafts and resamples), so the
    emitted law at every draft position is biased towards q's favourites (LOSSY at ``law``).
    """
    return _chain(target_probs, draft_probs, draft_token_ids, generator, residual_is_target=True)


def bonus_from_wrong_row(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """WRONG: the bonus token (all k drafts accepted) is drawn from p_{k-1} instead of p_k,
    an off-by-one in the row index (LOSSY at ``law`` on the bonus position)."""
    return _chain(target_probs, draft_probs, draft_token_ids, generator, bonus_row_offset=1)


def ratio_inverted(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """WRONG: accepts with probability min(1, q(d) / p(d)) instead of min(1, p(d) / q(d)), so
    drafts the target dislikes are kept (LOSSY at ``law``, and p = 0 drafts are accepted)."""
    return _chain(target_probs, draft_probs, draft_token_ids, generator, invert_ratio=True)


def acceptance_never_stops(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """WRONG: counts every accepted position instead of the leading run (sum, not cumprod),
    so drafts after a rejection are emitted as if accepted: acceptance does not stop at the
    first rejection (LOSSY at ``law`` and ``acceptance``)."""
    return _chain(target_probs, draft_probs, draft_token_ids, generator, count_all_accepts=True)


def crashes_on_large_vocab(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """CRASHES for V > 1000 (as a kernel with a fixed shared-memory tile might) and is the
    reference otherwise: the audit must record ERROR for those cases and go on with the rest."""
    if target_probs.shape[-1] > 1000:
        raise RuntimeError("vocabulary too large for this kernel")
    return _chain(target_probs, draft_probs, draft_token_ids, generator)


def drops_placeholder(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """WRONG (structure): returns only the emitted tokens of the first row, not [B, k+1]."""
    out = _chain(target_probs, draft_probs, draft_token_ids, generator)
    return out[0][out[0] != -1]


def clamp_target_at_floor(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """WRONG only on peaked or tiny-mass targets: raises every positive target mass to at least
    1e-3 and renormalises (a "numerical safety" floor, like vLLM PR 13933's clamp of the
    residual). Exact on any p whose positive masses are all >= 1e-3."""
    return _chain(target_probs, draft_probs, draft_token_ids, generator, target_floor=1e-3)


def residual_truncated_to_top16(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """WRONG only when the residual spreads over more than 16 tokens (so only for V > 16):
    after a rejection, samples from the 16 largest residual masses only, as a top-k-limited
    kernel would. Exact for V <= 16."""
    return _chain(target_probs, draft_probs, draft_token_ids, generator, residual_top=16)
