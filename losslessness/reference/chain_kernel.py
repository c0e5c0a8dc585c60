"""The reference chain verifier's CPU arithmetic, compiled (numba): one pass per row.

On CPU every chain verification of the reference (:mod:`losslessness.reference.chain`) is
computed here, on distinct rows by :func:`verify_rows` and on shared rows from the tables of
:func:`final_tables`, with the same float64 operations in both, so that the same uniforms give
the same tokens whatever the memory layout. The operations, per row of ``p [k+1, V]``,
``q [k, V]`` (float32 or float64 inputs, converted to float64 exactly):

- **Row sums** ``s = row_sum(x)``: four interleaved float64 accumulators over ``x[j]`` for
  ``j = 0, 1, 2, 3 (mod 4)``, combined as ``(a0 + a1) + (a2 + a3)``; a fixed order, so the
  result does not depend on the caller, and four times the additions per cycle of one
  sequential accumulator.
- **Acceptance**: draft ``d_i`` is accepted iff ``u_i < (p_i(d_i) s_q) / (q_i(d_i) s_p)``,
  the ratio ``(p_i(d_i) / s_p) / (q_i(d_i) / s_q)`` of the normalised rows.
- **Final token** after ``n`` accepted drafts: the weights ``r_j = max(0, p_n(j) s_q -
  q_n(j) s_p)`` (the residual ``norm(max(0, p - q))`` of the normalised rows, times
  ``s_p s_q``) at a rejection, or ``r_j = p_k(j)`` for the bonus, and a rejection whose
  weights have no mass (the ratio rounded below 1 where ``p == q``) takes p's. The token is
  the first ``j`` whose running sum ``r_0 + ... + r_j`` (one sequential accumulator) exceeds
  ``u * row_sum(r)``; should rounding leave none, the last ``j`` with ``r_j > 0``. So a token
  of zero weight, hence of ``p = 0``, is never drawn.

Source: Leviathan, Kalman, Matias 2022, Alg. 1; Chen et al. 2023, Alg. 2 (the rule);
issue 13, item 4 (one pass per row on distinct rows, replacing about fifty tensor operations
per chunk). Memory: the ``[B]`` outputs; nothing of size ``B k V`` is allocated.
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

from losslessness.protocol import PLACEHOLDER


@numba.njit(inline="always", error_model="numpy")
def row_sum(x: npt.NDArray[np.floating]) -> float:
    """The float64 sum of a ``[V]`` row in the order stated in the module docstring."""
    vocab = x.shape[0]
    a0 = a1 = a2 = a3 = 0.0
    j = 0
    while j + 4 <= vocab:
        a0 += np.float64(x[j])
        a1 += np.float64(x[j + 1])
        a2 += np.float64(x[j + 2])
        a3 += np.float64(x[j + 3])
        j += 4
    while j < vocab:
        a0 += np.float64(x[j])
        j += 1
    return (a0 + a1) + (a2 + a3)


@numba.njit(inline="always", error_model="numpy")
def _row_sum_and_min(x: npt.NDArray[np.floating], smallest: float) -> tuple[float, float]:
    """:func:`row_sum` of ``x`` and ``min(smallest, min(x))`` (NaN entries need no care here:
    they make the sum NaN, which fails the row-sum check)."""
    vocab = x.shape[0]
    a0 = a1 = a2 = a3 = 0.0
    m0 = m1 = x[0]
    j = 0
    while j + 4 <= vocab:
        x0, x1, x2, x3 = x[j], x[j + 1], x[j + 2], x[j + 3]
        a0 += np.float64(x0)
        a1 += np.float64(x1)
        a2 += np.float64(x2)
        a3 += np.float64(x3)
        m0 = min(m0, min(x0, x2))
        m1 = min(m1, min(x1, x3))
        j += 4
    while j < vocab:
        a0 += np.float64(x[j])
        m0 = min(m0, x[j])
        j += 1
    return (a0 + a1) + (a2 + a3), min(smallest, np.float64(min(m0, m1)))


@numba.njit(inline="always", error_model="numpy")
def _worse(worst: float, error: float) -> float:
    """The larger of two row-sum errors; NaN once either is NaN, and NaN stays."""
    if worst != worst or not error <= worst:
        return error if worst == worst else worst
    return worst


@numba.njit(inline="always", error_model="numpy")
def _final_weights(
    p_row: npt.NDArray[np.floating],
    q_row: npt.NDArray[np.floating],
    p_sum: float,
    q_sum: float,
    bonus: bool,
    out: npt.NDArray[np.float64],
) -> float:
    """Write the final token's weights ``r`` ``[V]`` into ``out``; return ``row_sum(r)``."""
    vocab = p_row.shape[0]
    if not bonus:
        for j in range(vocab):
            out[j] = max(np.float64(p_row[j]) * q_sum - np.float64(q_row[j]) * p_sum, 0.0)
        total = row_sum(out)
        if total > 0.0:
            return total
    for j in range(vocab):
        out[j] = np.float64(p_row[j])
    return p_sum


@numba.njit(inline="always", error_model="numpy")
def _search(weights: npt.NDArray[np.float64], target: float) -> int:
    """The first j whose running sum of ``weights`` exceeds ``target``, else the last j of
    positive weight."""
    vocab = weights.shape[0]
    running = 0.0
    for j in range(vocab):
        running += weights[j]
        if running > target:
            return j
    for j in range(vocab - 1, -1, -1):
        if weights[j] > 0.0:
            return j
    return int(vocab - 1)


@numba.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def verify_rows(
    target_probs: npt.NDArray[np.floating],
    draft_probs: npt.NDArray[np.floating],
    draft_token_ids: npt.NDArray[np.int64],
    accept_uniforms: npt.NDArray[np.float64],
    sample_uniforms: npt.NDArray[np.float64],
    emitted: npt.NDArray[np.int64],
) -> tuple[float, float, float]:
    """Verify every row on its own, in one pass over it, and collect the validator's facts.

    Args:
        target_probs: ``[B, k+1, V]`` C-contiguous float32/float64, V >= 1.
        draft_probs: ``[B, k, V]`` C-contiguous, the dtype of ``target_probs``.
        draft_token_ids: ``[B, k]`` int64 in ``[0, V)`` (not checked here: the caller has).
        accept_uniforms: ``[B, k]`` float64 in ``[0, 1)``.
        sample_uniforms: ``[B]`` float64 in ``[0, 1)``.
        emitted: ``[B, k+1]`` int64, written: the chain protocol's output, the accepted drafts
            of each row, then the token emitted after them, then ``PLACEHOLDER``.

    Returns:
        ``(smallest entry of both inputs, largest |row sum - 1| (NaN if a sum is NaN or an
        entry infinite), smallest drafted q_i(d_i) over all k positions)``, float64: the
        inputs are valid for :func:`losslessness.protocol.validate_chain_inputs` iff the
        first is >= 0, the second within ``ROW_SUM_TOLERANCE`` and the third > 0. On invalid
        inputs the outputs are meaningless (but written, and in ``[0, V)``).
    """
    batch, positions, vocab = target_probs.shape
    k = positions - 1
    p_sums = np.empty(positions)
    q_sums = np.empty(max(k, 1))
    weights = np.empty(vocab)
    smallest = np.inf
    worst_sum_error = 0.0
    smallest_drafted = np.inf
    for b in range(batch):
        for i in range(positions):
            total, smallest = _row_sum_and_min(target_probs[b, i], smallest)
            p_sums[i] = total
            worst_sum_error = _worse(worst_sum_error, abs(total - 1.0))
        for i in range(k):
            total, smallest = _row_sum_and_min(draft_probs[b, i], smallest)
            q_sums[i] = total
            worst_sum_error = _worse(worst_sum_error, abs(total - 1.0))
        n = k
        for i in range(k):
            token = draft_token_ids[b, i]
            drafted = np.float64(draft_probs[b, i, token])
            smallest_drafted = min(smallest_drafted, drafted)
            if n == k:
                ratio = (np.float64(target_probs[b, i, token]) * q_sums[i]) / (drafted * p_sums[i])
                if not accept_uniforms[b, i] < ratio:
                    n = i
        q_row = draft_probs[b, min(n, k - 1)] if k > 0 else target_probs[b, n]
        q_sum = q_sums[min(n, k - 1)] if k > 0 else p_sums[n]
        total = _final_weights(target_probs[b, n], q_row, p_sums[n], q_sum, n == k, weights)
        for i in range(n):
            emitted[b, i] = draft_token_ids[b, i]
        emitted[b, n] = _search(weights, sample_uniforms[b] * total)
        for i in range(n + 1, positions):
            emitted[b, i] = PLACEHOLDER
    return smallest, worst_sum_error, smallest_drafted


@numba.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def row_sums(probs: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    """:func:`row_sum` of every row: ``[R, V]`` C-contiguous float32/float64 -> ``[R]``."""
    out = np.empty(probs.shape[0])
    for i in range(probs.shape[0]):
        out[i] = row_sum(probs[i])
    return out


@numba.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def final_tables(
    target_probs: npt.NDArray[np.floating],
    draft_probs: npt.NDArray[np.floating],
    p_sums: npt.NDArray[np.float64],
    q_sums: npt.NDArray[np.float64],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """The k+1 possible final-token laws of one shared row, as search tables.

    Args:
        target_probs: ``[k+1, V]`` C-contiguous float32/float64, p_0..p_k.
        draft_probs: ``[k, V]``, q_0..q_{k-1} (the dtype of ``target_probs``).
        p_sums: ``[k+1]`` float64, :func:`row_sums` of ``target_probs``.
        q_sums: ``[k]`` float64, :func:`row_sums` of ``draft_probs``.

    Returns:
        ``(running [k+1, V], totals [k+1], last [k+1])``: row n's running sums of the weights
        after n accepted drafts (one sequential accumulator, as in :func:`verify_rows`), the
        :func:`row_sum` of those weights, and the last index of positive weight. A draw with
        uniform u from row n is the first j with ``running[n, j] > u * totals[n]``
        (``searchsorted(..., right=True)``), else ``last[n]``: the token :func:`verify_rows`
        draws.
    """
    positions, vocab = target_probs.shape
    k = positions - 1
    running = np.empty((positions, vocab))
    totals = np.empty(positions)
    last = np.empty(positions, dtype=np.int64)
    for n in range(positions):
        q_row = draft_probs[min(n, k - 1)] if k > 0 else target_probs[n]
        q_sum = q_sums[min(n, k - 1)] if k > 0 else p_sums[n]
        weights = running[n]
        totals[n] = _final_weights(target_probs[n], q_row, p_sums[n], q_sum, n == k, weights)
        last[n] = vocab - 1
        for j in range(vocab - 1, -1, -1):
            if weights[j] > 0.0:
                last[n] = j
                break
        acc = 0.0
        for j in range(vocab):
            acc += weights[j]
            weights[j] = acc
    return running, totals, last
