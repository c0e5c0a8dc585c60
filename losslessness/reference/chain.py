"""Reference chain rejection-sampling verifier (the ground truth for the chain protocol).

Source: Leviathan, Kalman, Matias 2022, "Fast Inference from Transformers via Speculative
Decoding", Alg. 1; Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling",
Alg. 2. Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection emit a
token from the residual norm(max(0, p_i - q_i)) and stop; if all k drafts are accepted, emit a
bonus token from p_k. Every emitted token then follows p exactly (Leviathan et al., Thm. 3.5).

Everything is computed in float64 on the inputs' device; all randomness comes from the
explicit generator, or from explicit uniforms (:func:`verify_with_uniforms`) so that two
implementations can be coupled decision by decision.
"""

from __future__ import annotations

import torch

from losslessness.protocol import InvalidInputError, validate_chain_inputs
from losslessness.reference.laws import residual_distribution
from losslessness.reference.output import accepted_lengths, emitted_tokens
from losslessness.reference.sampling import sample_inverse_cdf


def verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """One chain verification step by rejection sampling (the chain protocol).

    Args:
        target_probs: ``[B, k+1, V]`` float (any precision; computed in float64), p_0..p_k.
        draft_probs: ``[B, k, V]`` float, q_0..q_{k-1}.
        draft_token_ids: ``[B, k]`` int64, d_i ~ q_i.
        generator: source of all randomness; draws ``B*k`` accept uniforms then ``B``
            sampling uniforms, both float64 in ``[0, 1)``, on the generator's device.

    Returns:
        ``[B, k+1]`` int64, emitted tokens left-aligned and -1 after the last.

    Raises:
        InvalidInputError: see :func:`losslessness.protocol.validate_chain_inputs`.
    """
    batch, k, _ = validate_chain_inputs(target_probs, draft_probs, draft_token_ids, generator)
    device = target_probs.device
    accept_uniforms = torch.rand(
        (batch, k), generator=generator, dtype=torch.float64, device=generator.device
    ).to(device)
    sample_uniforms = torch.rand(
        (batch,), generator=generator, dtype=torch.float64, device=generator.device
    ).to(device)
    return _verify_validated(
        target_probs, draft_probs, draft_token_ids, accept_uniforms, sample_uniforms
    )


def verify_with_uniforms(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> torch.Tensor:
    """Chain verification with the randomness passed in, for coupled comparisons.

    Draft i is accepted iff ``accept_uniforms[b, i] < p_i(d_i) / q_i(d_i)`` (strict, so a
    token with p = 0 is never accepted even when the uniform is exactly 0). The one token
    drawn per row (the correction or the bonus) inverts the CDF of its distribution at
    ``sample_uniforms[b]``.

    Args:
        target_probs: ``[B, k+1, V]`` float, p.
        draft_probs: ``[B, k, V]`` float, q.
        draft_token_ids: ``[B, k]`` int64, d ~ q.
        accept_uniforms: ``[B, k]`` float in ``[0, 1)``.
        sample_uniforms: ``[B]`` float in ``[0, 1)``.

    Returns:
        ``[B, k+1]`` int64, emitted tokens left-aligned and -1 after the last.

    Raises:
        InvalidInputError: for malformed probabilities or ids (see
            :func:`losslessness.protocol.validate_chain_inputs`), or uniforms of the wrong
            shape, NaN, or outside ``[0, 1)``.
    """
    batch, k, _ = validate_chain_inputs(target_probs, draft_probs, draft_token_ids)
    _validate_uniforms("accept_uniforms", accept_uniforms, (batch, k))
    _validate_uniforms("sample_uniforms", sample_uniforms, (batch,))
    return _verify_validated(
        target_probs, draft_probs, draft_token_ids, accept_uniforms, sample_uniforms
    )


def _validate_uniforms(name: str, uniforms: object, shape: tuple[int, ...]) -> None:
    if not isinstance(uniforms, torch.Tensor):
        raise InvalidInputError(name, f"expected a torch.Tensor, got {type(uniforms).__name__}")
    if tuple(uniforms.shape) != shape:
        raise InvalidInputError(name, f"expected shape {shape}, got {tuple(uniforms.shape)}")
    if not uniforms.is_floating_point():
        raise InvalidInputError(name, f"expected a floating-point dtype, got {uniforms.dtype}")
    if uniforms.numel() and not bool(((uniforms >= 0) & (uniforms < 1)).all()):
        raise InvalidInputError(name, "values must lie in [0, 1) (and not be NaN)")


def _verify_validated(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> torch.Tensor:
    batch, k = draft_token_ids.shape
    ids = draft_token_ids.to(torch.int64)
    rows = torch.arange(batch, device=target_probs.device)
    # Rows are valid to 1e-5; dividing by the row sums makes the law followed exactly
    # "row / row sum". Only the gathered entries and one row per step are touched, never a
    # float64 copy of the whole [B, k+1, V] input.
    if k > 0:
        p_sums = target_probs[:, :k].sum(dim=-1, dtype=torch.float64)
        q_sums = draft_probs.sum(dim=-1, dtype=torch.float64)
        p_draft = target_probs[:, :k].gather(-1, ids.unsqueeze(-1)).squeeze(-1).to(torch.float64)
        q_draft = draft_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1).to(torch.float64)
        accepted = accept_uniforms.to(torch.float64) < (p_draft / p_sums) / (q_draft / q_sums)
        n_accepted = accepted_lengths(accepted)
    else:
        n_accepted = torch.zeros(batch, dtype=torch.int64, device=target_probs.device)
    p_final = target_probs[rows, n_accepted].to(torch.float64)
    p_final = p_final / p_final.sum(dim=-1, keepdim=True)
    final_law = p_final
    if k > 0:
        # The bonus row (n_accepted == k) has no draft row: its law is p_k itself.
        q_final = draft_probs[rows, n_accepted.clamp(max=k - 1)].to(torch.float64)
        q_final = q_final / q_final.sum(dim=-1, keepdim=True)
        corrections = residual_distribution(p_final, q_final)
        final_law = torch.where((n_accepted < k).unsqueeze(1), corrections, p_final)
    final_token = sample_inverse_cdf(final_law, sample_uniforms)
    return emitted_tokens(ids, n_accepted, final_token)
