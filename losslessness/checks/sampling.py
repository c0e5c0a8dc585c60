"""Drawing samples from a chain verifier: the audit draws d ~ q, the target verifies."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from losslessness.checks.cases import ChainCase
from losslessness.protocol import ChainVerifier
from losslessness.reference.sampling import sample_inverse_cdf
from losslessness.seeding import derive_seed

BATCH_ELEMENT_BUDGET = 1 << 22
"""Upper bound on ``B * (2k+1) * V`` per verifier call (32 MiB of float64 inputs), so that a
call's inputs stay small whatever V is, while small-V cases still get batches of thousands."""


class ProtocolViolation(Exception):
    """The verifier returned something that is not a ``[B, k+1]`` integer array."""


@dataclass
class ChainSamples:
    """Outputs of ``n_steps`` verification steps for every row type of a case.

    Attributes:
        case: the case that was sampled.
        outputs: ``[R, n_steps, k+1]`` int64, as returned by the verifier.
        drafts: ``[R, n_steps, k]`` int64, the drafts the audit drew (d_i ~ q_i).
        seed: the seed that reproduces drafts and verifier randomness.
        wall_time_s: seconds spent, verifier calls included.
        verifier_time_s: seconds spent inside the verifier.
        calls: number of verifier calls.
        steps_per_call: copies of each row type per call (steps ``j`` and ``j'`` shared a call
            iff ``j // steps_per_call == j' // steps_per_call``).
    """

    case: ChainCase
    outputs: np.ndarray
    drafts: np.ndarray
    seed: int
    wall_time_s: float
    verifier_time_s: float
    calls: int
    steps_per_call: int


def rows_per_call(case: ChainCase) -> int:
    """How many copies of each row type one verifier call carries (see BATCH_ELEMENT_BUDGET)."""
    per_row = case.n_rows * (2 * case.k + 1) * case.vocab_size
    return max(1, BATCH_ELEMENT_BUDGET // per_row)


def coerce_output(value: object, batch: int, k: int) -> np.ndarray:
    """Turn a verifier's return value into a ``[batch, k+1]`` int64 array.

    Raises:
        ProtocolViolation: not array-like, wrong shape, or not integer.
    """
    try:
        array = np.asarray(value.cpu() if isinstance(value, torch.Tensor) else value)
    except Exception as error:
        raise ProtocolViolation(f"output is not array-like: {error}") from error
    if array.shape != (batch, k + 1):
        raise ProtocolViolation(
            f"output has shape {array.shape}, expected [B, k+1] = {(batch, k + 1)}"
        )
    if not np.issubdtype(array.dtype, np.integer):
        raise ProtocolViolation(f"output dtype is {array.dtype}, expected int64 token ids")
    return array.astype(np.int64, copy=False)


def _draw_drafts(case: ChainCase, m: int, generator: torch.Generator) -> torch.Tensor:
    """``[m * R, k]`` int64 drafts d_i ~ q_i for ``m`` copies of every row type, interleaved
    (row ``b`` has type ``b % R``): one shared cumulative table per (row type, position)."""
    rows, k = case.n_rows, case.k
    uniforms = torch.rand((rows, k, m), generator=generator, dtype=torch.float64)
    draft_ids = torch.empty((m, rows, k), dtype=torch.int64)
    for r in range(rows):
        for i in range(k):
            draft_ids[:, r, i] = sample_inverse_cdf(case.draft_probs[r, i], uniforms[r, i])
    return draft_ids.reshape(m * rows, k)


def _inputs_intact(case: ChainCase, target: torch.Tensor, draft: torch.Tensor) -> bool:
    """Whether the reused input buffers still hold ``m`` copies of the case's rows."""
    m = target.shape[0] // case.n_rows
    return torch.equal(
        target.view(m, *case.target_probs.shape), case.target_probs.expand(m, -1, -1, -1)
    ) and torch.equal(
        draft.view(m, *case.draft_probs.shape), case.draft_probs.expand(m, -1, -1, -1)
    )


def sample_chain(
    verifier: ChainVerifier,
    case: ChainCase,
    n_steps: int,
    seed: int,
    progress: Callable[[int], None] | None = None,
) -> ChainSamples:
    """Run ``n_steps`` verification steps per row type of ``case``.

    Each call carries every row type, interleaved (row ``b`` has type ``b % R``), with fresh
    drafts d_i ~ q_i drawn by inverse CDF from a generator seeded with ``seed``; the verifier
    gets its own generator seeded from ``seed`` too. The ``target_probs`` and ``draft_probs``
    a call gets are contiguous (kernels that assume a dense layout read them correctly) and
    built once per case: every call gets a view of the same buffers, so the audit adds no
    ``O(B k V)`` work per call to the verifier's own. A verifier that writes into its inputs
    is detected after the last call (one comparison pass) and the case is sampled again with a
    fresh copy per call, so its samples never come from altered p or q.

    Args:
        verifier: a chain verifier (the protocol of :mod:`losslessness.protocol`).
        case: the case to sample.
        n_steps: verification steps per row type (>= 1).
        seed: replays the drafts and the verifier's randomness exactly.
        progress: called with the number of steps done after each call.

    Returns:
        :class:`ChainSamples`.

    Raises:
        ValueError: ``n_steps`` < 1.
        ProtocolViolation: the verifier returned a malformed output.
        Exception: whatever the verifier raised, unchanged.
    """
    if n_steps < 1:
        raise ValueError(f"n_steps: must be >= 1, got {n_steps}")
    samples = _sample(verifier, case, n_steps, seed, progress, fresh_inputs=False)
    if samples is None:
        # The progress callback has already been told every step once.
        samples = _sample(verifier, case, n_steps, seed, None, fresh_inputs=True)
        assert samples is not None
    return samples


def _sample(
    verifier: ChainVerifier,
    case: ChainCase,
    n_steps: int,
    seed: int,
    progress: Callable[[int], None] | None,
    fresh_inputs: bool,
) -> ChainSamples | None:
    """:func:`sample_chain`'s loop; None when reused inputs were found altered afterwards."""
    rows, k = case.n_rows, case.k
    draft_generator = torch.Generator().manual_seed(seed)
    verifier_generator = torch.Generator().manual_seed(derive_seed(seed, "verifier"))
    chunk = rows_per_call(case)
    outputs = np.empty((rows, n_steps, k + 1), dtype=np.int64)
    drafts = np.empty((rows, n_steps, k), dtype=np.int64)
    start = time.perf_counter()
    target_buffer = case.target_probs.repeat(min(chunk, n_steps), 1, 1)
    draft_buffer = case.draft_probs.repeat(min(chunk, n_steps), 1, 1)
    verifier_time = 0.0
    calls = 0
    done = 0
    while done < n_steps:
        m = min(chunk, n_steps - done)
        batch = m * rows
        draft_ids = _draw_drafts(case, m, draft_generator)
        if fresh_inputs:
            target, draft = case.target_probs.repeat(m, 1, 1), case.draft_probs.repeat(m, 1, 1)
        else:
            target, draft = target_buffer[:batch], draft_buffer[:batch]
        began = time.perf_counter()
        result = verifier(target, draft, draft_ids, verifier_generator)
        verifier_time += time.perf_counter() - began
        calls += 1
        array = coerce_output(result, batch, k).reshape(m, rows, k + 1)
        outputs[:, done : done + m] = array.transpose(1, 0, 2)
        drafts[:, done : done + m] = draft_ids.reshape(m, rows, k).numpy().transpose(1, 0, 2)
        done += m
        if progress is not None:
            progress(m)
    if not fresh_inputs and not _inputs_intact(case, target_buffer, draft_buffer):
        return None
    return ChainSamples(
        case, outputs, drafts, seed, time.perf_counter() - start, verifier_time, calls, chunk
    )
