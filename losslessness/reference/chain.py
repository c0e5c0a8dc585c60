"""Reference chain rejection-sampling verifier (the ground truth for the chain protocol).

Source: Leviathan, Kalman, Matias 2022, "Fast Inference from Transformers via Speculative
Decoding", Alg. 1; Chen et al. 2023, "Accelerating LLM Decoding with Speculative Sampling",
Alg. 2. Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection emit a
token from the residual norm(max(0, p_i - q_i)) and stop; if all k drafts are accepted, emit a
bonus token from p_k. Every emitted token then follows p exactly (Leviathan et al., Thm. 3.5).

Everything is computed in float64 (float32 on ``mps``, which has no float64) on the inputs'
device; all randomness comes from the explicit generator, or from explicit uniforms
(:class:`ChainUniforms`, :func:`verify_with_uniforms`) so that two implementations can be
coupled decision by decision.

Two paths give identical outputs for the same uniforms. When every batch row is the same
memory (the caller passed ``p.expand(B, k+1, V)`` and ``q.expand(B, k, V)``: stride 0 along the
batch), the acceptance ratios and the k+1 possible final laws are computed once, as tables,
and each row only gathers from them and binary-searches one cumulative table
(:func:`losslessness.reference.sampling.sample_inverse_cdf_from_tables`): ``O(k V + B k log V)``.
Otherwise every row gets its own tables, vectorised over rows: ``O(B k V)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from losslessness.protocol import InvalidInputError, validate_chain_inputs
from losslessness.reference.laws import residual_distribution
from losslessness.reference.output import accepted_lengths, emitted_tokens
from losslessness.reference.sampling import (
    compute_dtype,
    sample_inverse_cdf,
    sample_inverse_cdf_from_tables,
)


@dataclass(frozen=True)
class ChainUniforms:
    """The randomness of one chain verification step, passed in explicitly.

    Attributes:
        accept_uniforms: ``[B, k]`` float in ``[0, 1)``; draft i of row b is accepted iff
            ``accept_uniforms[b, i] < p_i(d_i) / q_i(d_i)`` (strict).
        sample_uniforms: ``[B]`` float in ``[0, 1)``; the one token drawn per row (the
            correction at the first rejection, or the bonus) inverts the CDF of its law here.

    Both are moved to the inputs' device by the verifier; the values are checked there
    (shape, floating dtype, in ``[0, 1)``), raising ``InvalidInputError``.
    """

    accept_uniforms: torch.Tensor
    sample_uniforms: torch.Tensor

    @classmethod
    def draw(cls, batch: int, k: int, generator: torch.Generator) -> ChainUniforms:
        """The uniforms :func:`verify` draws from ``generator``: ``B*k`` accept uniforms, then
        ``B`` sampling uniforms, float64 (float32 on ``mps``) on the generator's device.

        Args:
            batch: B >= 0.
            k: draft length >= 0.
            generator: the source of randomness (consumed exactly as :func:`verify` does).

        Returns:
            :class:`ChainUniforms` with ``[B, k]`` and ``[B]`` float64 tensors.
        """
        dtype = compute_dtype(generator.device)
        accept = torch.rand((batch, k), generator=generator, dtype=dtype, device=generator.device)
        sample = torch.rand((batch,), generator=generator, dtype=dtype, device=generator.device)
        return cls(accept, sample)


def verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
    *,
    uniforms: ChainUniforms | None = None,
) -> torch.Tensor:
    """One chain verification step by rejection sampling (the chain protocol).

    Args:
        target_probs: ``[B, k+1, V]`` float (any precision; computed in float64), p_0..p_k.
            Rows that share memory (``p.expand(B, k+1, V)``) take the shared-table path.
        draft_probs: ``[B, k, V]`` float, q_0..q_{k-1}, on the device of ``target_probs``.
        draft_token_ids: ``[B, k]`` int64, d_i ~ q_i, on the device of ``target_probs``.
        generator: source of all randomness unless ``uniforms`` is given; draws ``B*k``
            accept uniforms then ``B`` sampling uniforms, both float64 in ``[0, 1)``, on the
            generator's device (:meth:`ChainUniforms.draw`), moved to the inputs' device.
        uniforms: the same draws given explicitly (the coupling keyword of the chain
            protocol); ``generator`` is then left untouched.

    Returns:
        ``[B, k+1]`` int64 on the inputs' device, emitted tokens left-aligned and -1 after
        the last.

    Raises:
        InvalidInputError: see :func:`losslessness.protocol.validate_chain_inputs`; inputs on
            different devices; malformed ``uniforms`` (see :func:`verify_with_uniforms`).
    """
    batch, k, _ = validate_chain_inputs(target_probs, draft_probs, draft_token_ids, generator)
    _require_same_device(target_probs, draft_probs, draft_token_ids)
    device = target_probs.device
    if uniforms is None:
        # torch.rand draws in [0, 1) by construction: only the caller's uniforms are checked.
        drawn = ChainUniforms.draw(batch, k, generator)
        dtype = compute_dtype(device)
        accept = drawn.accept_uniforms.to(device=device, dtype=dtype)
        sample = drawn.sample_uniforms.to(device=device, dtype=dtype)
    elif isinstance(uniforms, ChainUniforms):
        accept, sample = _checked_uniforms(uniforms, batch, k, device)
    else:
        raise InvalidInputError(
            "uniforms", f"expected a ChainUniforms or None, got {type(uniforms).__name__}"
        )
    return _verify_validated(target_probs, draft_probs, draft_token_ids, accept, sample)


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
        draft_probs: ``[B, k, V]`` float, q, on the device of ``target_probs``.
        draft_token_ids: ``[B, k]`` int64, d ~ q, on the device of ``target_probs``.
        accept_uniforms: ``[B, k]`` float in ``[0, 1)`` (moved to the inputs' device).
        sample_uniforms: ``[B]`` float in ``[0, 1)`` (moved to the inputs' device).

    Returns:
        ``[B, k+1]`` int64 on the inputs' device, emitted tokens left-aligned and -1 after
        the last.

    Raises:
        InvalidInputError: for malformed probabilities or ids (see
            :func:`losslessness.protocol.validate_chain_inputs`), inputs on different devices,
            or uniforms of the wrong type or shape, NaN, or outside ``[0, 1)``.
    """
    batch, k, _ = validate_chain_inputs(target_probs, draft_probs, draft_token_ids)
    _require_same_device(target_probs, draft_probs, draft_token_ids)
    accept, sample = _checked_uniforms(
        ChainUniforms(accept_uniforms, sample_uniforms), batch, k, target_probs.device
    )
    return _verify_validated(target_probs, draft_probs, draft_token_ids, accept, sample)


def shares_rows(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> bool:
    """Whether every batch row of the inputs is the same memory (stride 0 along the batch).

    Such inputs come from ``p.expand(B, k+1, V)``; the verifier then computes its tables once.
    Rows that are equal but stored separately are not detected (that would cost a pass over
    ``B (2k+1) V`` entries); they take the per-row path, with identical results.

    Args:
        target_probs: ``[B, k+1, V]``.
        draft_probs: ``[B, k, V]``.

    Returns:
        True when ``B > 1`` and both tensors have stride 0 along dimension 0 (an empty
        ``draft_probs``, k = 0, shares trivially).
    """
    if target_probs.shape[0] <= 1 or target_probs.stride(0) != 0:
        return False
    return draft_probs.numel() == 0 or draft_probs.stride(0) == 0


def _require_same_device(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_token_ids: torch.Tensor
) -> None:
    device = target_probs.device
    for name, tensor in (("draft_probs", draft_probs), ("draft_token_ids", draft_token_ids)):
        if tensor.device != device:
            raise InvalidInputError(
                name, f"is on {tensor.device}, but target_probs is on {device}; use one device"
            )


def _validate_uniforms(name: str, uniforms: object, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(uniforms, torch.Tensor):
        raise InvalidInputError(name, f"expected a torch.Tensor, got {type(uniforms).__name__}")
    if tuple(uniforms.shape) != shape:
        raise InvalidInputError(name, f"expected shape {shape}, got {tuple(uniforms.shape)}")
    if not uniforms.is_floating_point():
        raise InvalidInputError(name, f"expected a floating-point dtype, got {uniforms.dtype}")
    if uniforms.numel() and not bool(((uniforms >= 0) & (uniforms < 1)).all()):
        raise InvalidInputError(name, "values must lie in [0, 1) (and not be NaN)")
    return uniforms


def _checked_uniforms(
    uniforms: ChainUniforms, batch: int, k: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate both uniform tensors; return them on ``device`` in the compute dtype."""
    dtype = compute_dtype(device)
    accept = _validate_uniforms("accept_uniforms", uniforms.accept_uniforms, (batch, k))
    sample = _validate_uniforms("sample_uniforms", uniforms.sample_uniforms, (batch,))
    return accept.to(device=device, dtype=dtype), sample.to(device=device, dtype=dtype)


def _final_laws(
    target_rows: torch.Tensor, draft_rows: torch.Tensor, bonus: torch.Tensor
) -> torch.Tensor:
    """Law of the token emitted after the accepted drafts, one row per draw.

    Args:
        target_rows: ``[N, V]`` p at the stopping position (unnormalised within 1e-5).
        draft_rows: ``[N, V]`` q at the stopping position (any row where ``bonus``).
        bonus: ``[N]`` bool, all k drafts accepted: the law is p_k itself.

    Returns:
        ``[N, V]`` in the compute dtype: norm(max(0, p - q)) at a rejection, p at the bonus.
    """
    dtype = compute_dtype(target_rows.device)
    p = target_rows.to(dtype)
    p = p / p.sum(dim=-1, keepdim=True)
    q = draft_rows.to(dtype)
    q = q / q.sum(dim=-1, keepdim=True)
    return torch.where(bonus.unsqueeze(1), p, residual_distribution(p, q).to(dtype))


def _verify_validated(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> torch.Tensor:
    if shares_rows(target_probs, draft_probs):
        return _verify_shared(
            target_probs, draft_probs, draft_token_ids, accept_uniforms, sample_uniforms
        )
    return _verify_per_row(
        target_probs, draft_probs, draft_token_ids, accept_uniforms, sample_uniforms
    )


def _verify_per_row(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> torch.Tensor:
    """Every row its own tables: ``[B, k+1, V]`` read once, ``O(B V)`` for the final draw."""
    batch, k = draft_token_ids.shape
    dtype = compute_dtype(target_probs.device)
    ids = draft_token_ids.to(torch.int64)
    rows = torch.arange(batch, device=target_probs.device)
    if k > 0:
        # Rows are valid to 1e-5; dividing by the row sums makes the law followed exactly
        # "row / row sum". Only the gathered entries and one row per step are converted, never
        # a float64 copy of the whole [B, k+1, V] input.
        p_sums = target_probs[:, :k].sum(dim=-1, dtype=dtype)
        q_sums = draft_probs.sum(dim=-1, dtype=dtype)
        p_draft = target_probs[:, :k].gather(-1, ids.unsqueeze(-1)).squeeze(-1).to(dtype)
        q_draft = draft_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1).to(dtype)
        n_accepted = accepted_lengths(accept_uniforms < (p_draft / p_sums) / (q_draft / q_sums))
        draft_rows = draft_probs[rows, n_accepted.clamp(max=k - 1)]
    else:
        n_accepted = torch.zeros(batch, dtype=torch.int64, device=target_probs.device)
        draft_rows = target_probs[:, 0]
    laws = _final_laws(target_probs[rows, n_accepted], draft_rows, n_accepted == k)
    return emitted_tokens(ids, n_accepted, sample_inverse_cdf(laws, sample_uniforms))


def _verify_shared(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> torch.Tensor:
    """Every row the same memory: tables from row 0, ``O(k V + B k log V)``.

    The same float operations as :func:`_verify_per_row`, applied to one row and gathered,
    so the outputs are identical for the same uniforms.
    """
    k = draft_token_ids.shape[1]
    dtype = compute_dtype(target_probs.device)
    ids = draft_token_ids.to(torch.int64)
    p = target_probs[0]
    positions = torch.arange(k + 1, device=target_probs.device)
    if k > 0:
        q = draft_probs[0]
        p_sums = p[:k].sum(dim=-1, dtype=dtype).unsqueeze(1)
        q_sums = q.sum(dim=-1, dtype=dtype).unsqueeze(1)
        # [k, V] acceptance ratios; only entries at drawn drafts (q > 0) are ever read.
        ratios = (p[:k].to(dtype) / p_sums) / (q.to(dtype) / q_sums)
        drafted = ratios.expand(ids.shape[0], k, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        n_accepted = accepted_lengths(accept_uniforms < drafted)
        laws = _final_laws(p, q[positions.clamp(max=k - 1)], positions == k)
    else:
        n_accepted = torch.zeros(ids.shape[0], dtype=torch.int64, device=target_probs.device)
        laws = _final_laws(p, p, positions == k)
    final_token = sample_inverse_cdf_from_tables(laws, n_accepted, sample_uniforms)
    return emitted_tokens(ids, n_accepted, final_token)
