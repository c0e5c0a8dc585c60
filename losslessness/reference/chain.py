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

Two paths give identical outputs for the same uniforms, on each device. When every batch row
is the same memory (the caller passed ``p.expand(B, k+1, V)`` and ``q.expand(B, k, V)``:
stride 0 along the batch), the acceptance ratios and the k+1 possible final laws are computed
once, as tables, and each row only gathers from them and binary-searches one cumulative table:
``O(k V + B k log V)``. Otherwise every row gets its own: ``O(B k V)`` time, memory bounded
whatever B is.

- **On CPU** both paths use the compiled arithmetic of
  :mod:`losslessness.reference.chain_kernel` (its fixed-order float64 row sums, ratios, final
  weights and search): distinct rows are verified one pass per row (``_kernel_rows``, on up to
  ``torch.get_num_threads()`` threads), shared rows from its tables (``_verify_shared_cpu``).
  Contiguous float32/float64 rows with int64 ids are verified *screened*
  (``_verify_screened``): instead of validating first (two passes over the ``[B, 2k+1, V]``
  input) and then verifying (a third), the protocol's value checks are made on what the
  kernel reads anyway, and any failed check hands the call to ``validate_chain_inputs``,
  which raises the protocol's own error (issue 13, item 4: 5 million steps per second and
  more at V = 32, k = 4, see ``benchmarks/test_bench_reference.py``).
- **On accelerators** (CUDA, MPS) both use torch operations: ``_verify_shared`` and
  ``_verify_per_row`` (chunks of rows vectorised, one cumulative table per row), the same
  float operations in both.

The two arithmetics differ only in rounding (summation order, ``a / b / (c / d)`` against
``a d / (c b)``), so they can disagree only where a uniform falls within a few ulps of a
decision boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from losslessness.laws import residual_distribution
from losslessness.protocol import ROW_SUM_TOLERANCE, InvalidInputError, validate_chain_inputs
from losslessness.reference import chain_kernel
from losslessness.reference.output import accepted_lengths, emitted_tokens
from losslessness.reference.sampling import (
    compute_dtype,
    sample_inverse_cdf,
    sample_inverse_cdf_from_tables,
    search_grouped,
)
from losslessness.reference.threads import split_rows, worst_of


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
    if isinstance(generator, torch.Generator) and _screenable(
        target_probs, draft_probs, draft_token_ids
    ):
        return _verify_screened(target_probs, draft_probs, draft_token_ids, generator, uniforms)
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
    if _screenable(target_probs, draft_probs, draft_token_ids):
        return _verify_screened(
            target_probs,
            draft_probs,
            draft_token_ids,
            None,
            ChainUniforms(accept_uniforms, sample_uniforms),
        )
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


_SCREENED_DTYPES = (torch.float64, torch.float32)


def _screenable(target_probs: object, draft_probs: object, draft_token_ids: object) -> bool:
    """Whether a call may take the screened distinct-row path (:func:`_verify_screened`).

    Only cheap structural facts are looked at here (types, ranks, shapes, dtypes, devices,
    layout, and the ``[B, k]`` ids' range); the ``O(B k V)`` value checks of
    :func:`losslessness.protocol.validate_chain_inputs` are left to the path itself, which
    makes them on the way. Every call that fails this test takes the general path
    (``validate_chain_inputs``, then the shared or per-row path), so a malformed argument is
    always reported by the protocol's own validator.

    Returns:
        True for CPU ``target_probs [B, k+1, V]`` and ``draft_probs [B, k, V]``, contiguous,
        float32 or float64, with B >= 1, k >= 1, V >= 1, and int64
        ``draft_token_ids [B, k]`` in ``[0, V)`` on CPU.
    """
    if not (
        isinstance(target_probs, torch.Tensor)
        and isinstance(draft_probs, torch.Tensor)
        and isinstance(draft_token_ids, torch.Tensor)
    ):
        return False
    if target_probs.dim() != 3 or draft_probs.dim() != 3 or draft_token_ids.dim() != 2:
        return False
    batch, positions, vocab = target_probs.shape
    k = positions - 1
    if batch < 1 or k < 1 or vocab < 1:
        return False
    if tuple(draft_probs.shape) != (batch, k, vocab) or tuple(draft_token_ids.shape) != (batch, k):
        return False
    for probs in (target_probs, draft_probs):
        if (
            probs.dtype not in _SCREENED_DTYPES
            or probs.device.type != "cpu"
            or not probs.is_contiguous()
        ):
            return False
    if draft_token_ids.dtype != torch.int64 or draft_token_ids.device.type != "cpu":
        return False
    low, high = torch.aminmax(draft_token_ids)
    return int(low) >= 0 and int(high) < vocab


def _verify_screened(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator | None,
    uniforms: object,
) -> torch.Tensor:
    """:func:`verify` (``generator`` given) or :func:`verify_with_uniforms` (``generator``
    None, ``uniforms`` a :class:`ChainUniforms`) on inputs that pass :func:`_screenable`, with
    the input validation fused into the compiled per-row pass.

    The value checks of :func:`losslessness.protocol.validate_chain_inputs` (NaN/inf, negative
    mass, rows summing to 1 within ``ROW_SUM_TOLERANCE``, no draft on a zero of q) are made on
    the facts :func:`losslessness.reference.chain_kernel.verify_rows` collects while it
    verifies (:class:`_KernelFacts`: NaN and inf propagate into the row sums, the smallest
    entry and the drafted q entries are read on the way), so the ``[B, 2k+1, V]`` input is
    read from memory once instead of three times. A failed check (or malformed uniforms)
    hands the call to ``validate_chain_inputs``, which raises the protocol's error naming the
    argument (the first in the protocol's order), with the generator restored to its state
    before the call. The kernel's row sums may differ from the validator's in the last bit,
    so a row within one rounding of ``ROW_SUM_TOLERANCE`` can fail here and pass there: the
    tokens already drawn are then returned.

    Returns:
        ``[B, k+1]`` int64, as :func:`verify`.

    Raises:
        InvalidInputError: as :func:`verify` and :func:`verify_with_uniforms`.
    """
    batch, k = draft_token_ids.shape
    device = target_probs.device
    state = None
    # The reference is not differentiable; detached views let numpy read the inputs.
    target_probs, draft_probs = target_probs.detach(), draft_probs.detach()
    try:
        if generator is None or uniforms is not None:
            if not isinstance(uniforms, ChainUniforms):
                raise InvalidInputError(
                    "uniforms",
                    f"expected a ChainUniforms or None, got {type(uniforms).__name__}",
                )
            accept, sample = _checked_uniforms(uniforms, batch, k, device)
        else:
            state = generator.get_state()
            drawn = ChainUniforms.draw(batch, k, generator)
            dtype = compute_dtype(device)
            accept = drawn.accept_uniforms.to(device=device, dtype=dtype)
            sample = drawn.sample_uniforms.to(device=device, dtype=dtype)
    except InvalidInputError:
        # The protocol reports malformed probabilities before malformed uniforms.
        validate_chain_inputs(target_probs, draft_probs, draft_token_ids)
        raise
    tokens, facts = _kernel_rows(target_probs, draft_probs, draft_token_ids, accept, sample)
    if not facts.passed():
        try:
            validate_chain_inputs(target_probs, draft_probs, draft_token_ids)
        except InvalidInputError:
            if generator is not None and state is not None:
                generator.set_state(state)
            raise
    return tokens


@dataclass(frozen=True)
class _KernelFacts:
    """What :func:`losslessness.reference.chain_kernel.verify_rows` saw of its inputs: the
    smallest entry, the largest ``|row sum - 1|`` (NaN for any NaN or infinite entry) and the
    smallest drafted ``q_i(d_i)``, each over every thread's rows."""

    smallest: float
    worst_sum_error: float
    smallest_drafted: float

    def passed(self) -> bool:
        """True iff the inputs pass the validator's value checks: no entry below 0 (``-0.0``
        is not), every row sum within ``ROW_SUM_TOLERANCE`` of 1 (false for NaN or inf), no
        draft on a zero of q."""
        return (
            self.smallest >= 0
            and self.worst_sum_error <= ROW_SUM_TOLERANCE
            and self.smallest_drafted > 0
        )


def _kernel_dtype(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.dtype:
    """float32 when both inputs hold float32 or narrower (converted exactly), else float64."""
    narrow = (torch.float32, torch.float16, torch.bfloat16)
    both_narrow = target_probs.dtype in narrow and draft_probs.dtype in narrow
    return torch.float32 if both_narrow else torch.float64


def _kernel_rows(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, _KernelFacts]:
    """Every row verified by :func:`losslessness.reference.chain_kernel.verify_rows`, split
    over threads by :func:`losslessness.reference.threads.split_rows` (each row's tokens depend
    only on its own inputs and uniforms, so the split never changes them).

    Args:
        target_probs: ``[B, k+1, V]`` CPU float (converted, exactly, to a contiguous
            float32/float64 copy when it is not one already, see :func:`_kernel_dtype`).
        draft_probs: ``[B, k, V]`` CPU float.
        draft_token_ids: ``[B, k]`` CPU integer ids in ``[0, V)``.
        accept_uniforms: ``[B, k]`` CPU float64.
        sample_uniforms: ``[B]`` CPU float64.

    Returns:
        ``[B, k+1]`` int64 tokens as :func:`verify`, and what the kernel saw of the inputs.
    """
    dtype = _kernel_dtype(target_probs, draft_probs)
    p = target_probs.to(dtype).contiguous().numpy()
    q = draft_probs.to(dtype).contiguous().numpy()
    ids = draft_token_ids.to(torch.int64).contiguous()
    accept = accept_uniforms.to(torch.float64).contiguous().numpy()
    sample = sample_uniforms.to(torch.float64).contiguous().numpy()
    batch, k = ids.shape
    emitted = torch.empty((batch, k + 1), dtype=torch.int64)
    out = emitted.numpy()

    def run(rows: slice) -> tuple[float, float, float]:
        return chain_kernel.verify_rows(  # type: ignore[no-any-return]
            p[rows], q[rows], ids.numpy()[rows], accept[rows], sample[rows], out[rows]
        )

    seen = split_rows(batch, run)
    facts = _KernelFacts(
        smallest=min(s[0] for s in seen),
        worst_sum_error=worst_of(s[1] for s in seen),
        smallest_drafted=min(s[2] for s in seen),
    )
    return emitted, facts


def _verify_shared_cpu(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> torch.Tensor:
    """Every row the same memory, on CPU: tables from row 0 with the arithmetic of
    :func:`losslessness.reference.chain_kernel.verify_rows` (its row sums, ratios, weights and
    search), so the outputs equal the per-row kernel's for the same uniforms.
    ``O(k V + B k log V)``."""
    k = draft_token_ids.shape[1]
    dtype = _kernel_dtype(target_probs, draft_probs)
    p = target_probs[0].to(dtype).contiguous()
    q = draft_probs[0].to(dtype).contiguous()
    ids = draft_token_ids.to(torch.int64)
    p_sums = chain_kernel.row_sums(p.numpy())
    q_sums = chain_kernel.row_sums(q.numpy())
    if k > 0:
        # [k, V] acceptance ratios, the kernel's (p_d s_q) / (q_d s_p); only entries at
        # drawn drafts (q > 0) are ever read.
        p_sum = torch.from_numpy(p_sums[:k]).unsqueeze(1)
        q_sum = torch.from_numpy(q_sums).unsqueeze(1)
        ratios = (p[:k].to(torch.float64) * q_sum) / (q.to(torch.float64) * p_sum)
        drafted = ratios.expand(ids.shape[0], k, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        n_accepted = accepted_lengths(accept_uniforms < drafted)
    else:
        n_accepted = torch.zeros(ids.shape[0], dtype=torch.int64)
    running, totals, last = (
        torch.from_numpy(table)
        for table in chain_kernel.final_tables(p.numpy(), q.numpy(), p_sums, q_sums)
    )
    index = search_grouped(running, n_accepted, sample_uniforms * totals[n_accepted])
    overflow = index >= running.shape[1]
    if bool(overflow.any()):
        index = torch.where(overflow, last[n_accepted], index)
    return emitted_tokens(ids, n_accepted, index)


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
    # The reference is not differentiable (and its in-place steps refuse tensors with grad).
    target_probs, draft_probs = target_probs.detach(), draft_probs.detach()
    shared = shares_rows(target_probs, draft_probs)
    if target_probs.device.type == "cpu":
        if shared:
            return _verify_shared_cpu(
                target_probs, draft_probs, draft_token_ids, accept_uniforms, sample_uniforms
            )
        return _kernel_rows(
            target_probs, draft_probs, draft_token_ids, accept_uniforms, sample_uniforms
        )[0]
    if shared:
        return _verify_shared(
            target_probs, draft_probs, draft_token_ids, accept_uniforms, sample_uniforms
        )
    return _verify_per_row(
        target_probs, draft_probs, draft_token_ids, accept_uniforms, sample_uniforms
    )


_CPU = torch.device("cpu")

PER_ROW_CHUNK_ELEMENTS = 1 << 20
"""Input entries (``rows * (2k+1) * V``) per chunk of the torch per-row path when it runs on
CPU (the reference itself verifies CPU rows with the compiled kernel; the torch path runs there
in the tests that pin it and the benchmark that compares the two): 8 MiB of float64, so
a chunk's rows stay in the last-level cache from the pass that sums them to the gathers that
read them again, while a chunk is large enough that the ~50 tensor operations it costs are
paid a few dozen times per 1e5 rows, not hundreds (at V = 32, k = 4: 3,640 rows a chunk; the
CPU time per 1e5 rows is flat from 2^20 to 2^22 and 2.9x higher at 2^16). The chunk's
``[rows, V]`` temporaries stay below 8 MiB each whatever the batch is."""


ACCELERATOR_CHUNK_ELEMENTS = 1 << 24
"""The same bound off CPU (CUDA, MPS): there the chunks only bound memory (128 MiB of float64
input, temporaries below that), and fewer chunks mean fewer kernel launches and host syncs."""


def _rows_per_chunk(k: int, vocab: int, device: torch.device = _CPU) -> int:
    """Batch rows per chunk of :func:`_verify_per_row` on ``device``: at least 1, and at most
    ``PER_ROW_CHUNK_ELEMENTS / ((2k+1) V)`` on CPU (``ACCELERATOR_CHUNK_ELEMENTS`` elsewhere)
    when that is 1 or more."""
    budget = PER_ROW_CHUNK_ELEMENTS if device.type == "cpu" else ACCELERATOR_CHUNK_ELEMENTS
    return max(1, budget // ((2 * k + 1) * vocab))


@dataclass(frozen=True)
class _ChunkIndex:
    """Flat offsets shared by every chunk of :func:`_verify_per_row` (built once per call).

    Attributes:
        target_entries: ``[c, k]`` int64, ``b (k+1) V + i V``: the offset of row b, position
            i of a contiguous ``[c, k+1, V]`` chunk; adding the token id gives its entry.
        draft_entries: ``[c, k]`` int64, ``b k V + i V``, the same for ``[c, k, V]``.
        target_rows: ``[c]`` int64, ``b (k+1)``: row b's first row in ``[c * (k+1), V]``.
        draft_rows: ``[c]`` int64, ``b k``, the same for ``[c * k, V]``.
    """

    target_entries: torch.Tensor
    draft_entries: torch.Tensor
    target_rows: torch.Tensor
    draft_rows: torch.Tensor

    @classmethod
    def build(cls, rows: int, k: int, vocab: int, device: torch.device) -> _ChunkIndex:
        """Offsets for chunks of up to ``rows`` rows of ``[rows, k+1, V]`` / ``[rows, k, V]``."""
        batch = torch.arange(rows, device=device, dtype=torch.int64)
        position = torch.arange(k, device=device, dtype=torch.int64) * vocab
        return cls(
            target_entries=(batch * ((k + 1) * vocab)).unsqueeze(1) + position,
            draft_entries=(batch * (k * vocab)).unsqueeze(1) + position,
            target_rows=batch * (k + 1),
            draft_rows=batch * k,
        )


def _verify_per_row(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> torch.Tensor:
    """Every row its own tables, in chunks of rows: ``O(B k V)`` time, bounded memory.

    Each chunk of :func:`_rows_per_chunk` rows is read once from memory (the row sums), then
    its drafted entries and its two stopping rows are gathered while it is in cache, and one
    law per row (the residual or p_k) is built, summed into one cumulative table per row and
    searched, all vectorised over the chunk (:func:`_final_tokens`). The float operations are
    those of :func:`_verify_shared`, so the outputs equal it for the same uniforms. Memory:
    the ``[B, k+1]`` output and ``O(B)`` decisions, plus temporaries of a few ``[c, V]``
    rows per chunk (``c (2k+1) V <= PER_ROW_CHUNK_ELEMENTS`` on CPU, or one row when a row is
    larger), whatever B is.
    """
    batch, k = draft_token_ids.shape
    device = target_probs.device
    ids = draft_token_ids.to(torch.int64)
    n_accepted = torch.empty(batch, dtype=torch.int64, device=device)
    final = torch.empty(batch, dtype=torch.int64, device=device)
    step = _rows_per_chunk(k, target_probs.shape[-1], device)
    index = _ChunkIndex.build(min(step, batch), k, target_probs.shape[-1], device)
    for start in range(0, batch, step):
        rows = slice(start, min(batch, start + step))
        _verify_rows(
            target_probs[rows],
            draft_probs[rows],
            ids[rows],
            accept_uniforms[rows],
            sample_uniforms[rows],
            index,
            n_accepted[rows],
            final[rows],
        )
    return emitted_tokens(ids, n_accepted, final)


def _verify_rows(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    ids: torch.Tensor,
    accept_uniforms: torch.Tensor,
    sample_uniforms: torch.Tensor,
    index: _ChunkIndex,
    n_accepted: torch.Tensor,
    final: torch.Tensor,
) -> None:
    """One chunk of :func:`_verify_per_row`: fills ``n_accepted`` and ``final`` (``[c]``)."""
    k = ids.shape[1]
    dtype = compute_dtype(target_probs.device)
    if k > 0:
        # Rows are valid to 1e-5; dividing by the row sums makes the law followed exactly
        # "row / row sum". Only the gathered entries and two rows per step are converted,
        # never a float64 copy of the whole [B, k+1, V] input.
        p_sums = _row_sums(target_probs[:, :k], dtype)
        q_sums = _row_sums(draft_probs, dtype)
        # (p_d / p_sum) / (q_d / q_sum), in place on the freshly gathered entries.
        ratio = _entries_at(target_probs, ids, index.target_entries, dtype).div_(p_sums)
        ratio.div_(_entries_at(draft_probs, ids, index.draft_entries, dtype).div_(q_sums))
        n_accepted.copy_(accepted_lengths(accept_uniforms < ratio))
        draft_rows = _rows_at(draft_probs, n_accepted.clamp(max=k - 1), index.draft_rows)
    else:
        n_accepted.zero_()
    target_rows = _rows_at(target_probs, n_accepted, index.target_rows)
    if k == 0:
        draft_rows = target_rows  # every row is the bonus: q is never read
    final.copy_(_final_tokens(target_rows, draft_rows, n_accepted == k, sample_uniforms))


def _row_sums(probs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``probs.sum(dim=-1, dtype=dtype)`` (the shared path's form, to the bit), ``[..., V]`` ->
    ``[...]``. A narrower input on CPU is converted first: the same sums (pinned by
    ``tests/reference/test_reference_distinct_rows.py``), about 4x faster than the reduction's own
    conversion."""
    if probs.dtype == dtype or probs.device.type != "cpu":
        return probs.sum(dim=-1, dtype=dtype)
    return probs.to(dtype).sum(dim=-1)


def _entries_at(
    probs: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``probs[b, i, ids[b, i]]`` for ``i < k``: ``[c, m, V]``, ``[c, k]`` -> ``[c, k]`` in
    ``dtype``, always a fresh tensor (callers divide it in place). An index-select on the flat
    storage at ``offsets[:c] + ids`` when the chunk is contiguous (about twice as fast as a
    gather), else a gather."""
    batch, k = ids.shape
    if probs.is_contiguous():
        flat = offsets[:batch].add(ids).view(-1)
        entries = probs.view(-1).index_select(0, flat).view(batch, k)
    else:
        entries = probs[:, :k].gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return entries.to(dtype)


def _rows_at(probs: torch.Tensor, position: torch.Tensor, first_rows: torch.Tensor) -> torch.Tensor:
    """``probs[b, position[b]]``: ``[c, m, V]``, ``[c]`` -> ``[c, V]``, always a fresh tensor
    in the input dtype. An index-select of whole rows at ``first_rows[:c] + position`` when
    the batch and position axes flatten into one (``first_rows[b] = b m``), else a gather."""
    batch, positions, vocab = probs.shape
    if probs.stride(0) == positions * probs.stride(1):
        return probs.flatten(0, 1).index_select(0, first_rows[:batch].add(position))
    index = position.view(batch, 1, 1).expand(batch, 1, vocab)
    return probs.gather(1, index).squeeze(1)


def _final_tokens(
    target_rows: torch.Tensor,
    draft_rows: torch.Tensor,
    bonus: torch.Tensor,
    sample_uniforms: torch.Tensor,
) -> torch.Tensor:
    """The token emitted after the accepted drafts, one law per row, by inverse CDF.

    Equal, token for token, to
    ``sample_inverse_cdf(_final_laws(target_rows, draft_rows, bonus), sample_uniforms)``:
    the same float operations, done in place on the rows (rows that are the bonus, or whose
    residual has no mass, are overwritten with p afterwards instead of a ``where`` over every
    row; the residual is skipped when every row is the bonus).

    Args:
        target_rows: ``[N, V]`` p at the stopping position (unnormalised within 1e-5); a
            fresh tensor, overwritten.
        draft_rows: ``[N, V]`` q at the stopping position (any row where ``bonus``); a fresh
            tensor, overwritten.
        bonus: ``[N]`` bool, all k drafts accepted: the law is p_k itself.
        sample_uniforms: ``[N]`` float in ``[0, 1)`` in the compute dtype.

    Returns:
        ``[N]`` int64 token ids. Never a token of zero mass in its law, so never a token with
        p = 0 (the residual is at most p), and never a token of a residual without mass: such
        a row draws from p (a rejection there has probability 0; it happens only when the
        acceptance ratio rounds below 1, and p is then the law of the limit q -> p, as in
        :func:`losslessness.laws.residual_distribution`).
    """
    dtype = compute_dtype(target_rows.device)
    if dtype != torch.float64:
        # residual_distribution computes in float64: keep the exact composition off CPU/CUDA.
        return sample_inverse_cdf(_final_laws(target_rows, draft_rows, bonus), sample_uniforms)
    p = target_rows.to(dtype)
    p.div_(p.sum(dim=-1, keepdim=True))
    if bool(bonus.all()):
        return sample_inverse_cdf(p, sample_uniforms)
    q = draft_rows.to(dtype)
    q.div_(q.sum(dim=-1, keepdim=True))
    # The operations of laws.residual_distribution, in place on q.
    law = torch.sub(p, q, out=q).clamp_(min=0.0)
    peak = law.amax(dim=-1, keepdim=True)
    positive = peak > 0
    law.div_(torch.where(positive, peak, 1.0))
    law.div_(law.sum(dim=-1, keepdim=True))
    take_p = torch.nonzero(bonus | ~positive.squeeze(1)).squeeze(1)
    if take_p.numel():
        law.index_copy_(0, take_p, p.index_select(0, take_p))
    return sample_inverse_cdf(law, sample_uniforms)


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
