"""The reference tree verifier's CPU arithmetic, compiled (numba): one walk per row.

:func:`verify_tree_rows` applies the rules of :mod:`losslessness.reference.tree` (SpecInfer's
multi-step speculative sampling for ``iid`` siblings, Miao et al. 2024, Alg. 2; recursive
rejection sampling for ``without-replacement`` siblings, Jeon et al. 2024, Alg. 2; the
deterministic ``top-k`` rule) to each batch row on its own, reading its ``[N+1, V]`` rows of p
and q once for the protocol's value checks and again, from cache, for the walk. Per row, from
the root, with the running target law r (first p at the node, as given) and running draft law
q' (first q at the node):

- the children of the current node are tried in index order; child x is accepted iff
  ``u < r(x) / q'(x)`` (``u < r(x)`` for ``top-k``; ``r(x)`` itself where ``q'(x) = 0``);
- on a rejection, ``r <- max(0, r - q')`` divided by its sum (r unchanged if that has no
  mass), and ``q'(x) <- 0`` renormalised for ``without-replacement``; for ``top-k``,
  ``r(x) <- 0`` renormalised;
- an accepted child becomes the current node; when every child is rejected (or the node is a
  leaf) the final token is the first j whose running sum of r exceeds ``u * row_sum(r)``
  (:func:`losslessness.reference.chain_kernel.row_sum`), else the last j of positive mass.

The torch implementation (:func:`losslessness.reference.tree._verify_tree_validated`, used off
CPU) computes the same rule with torch's roundings; the two agree except where a uniform
falls within a few ulps of a decision boundary. Memory: the outputs and ``O(V)`` per call.
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

from losslessness.protocol import PLACEHOLDER
from losslessness.reference.chain_kernel import _row_sum_and_min, _search, _worse, row_sum

IID, WITHOUT_REPLACEMENT, TOP_K = 0, 1, 2
"""The draft schemes' codes, in the order of :data:`losslessness.protocol.DRAFT_SCHEMES`."""


@numba.njit(inline="always", error_model="numpy")
def _normalise(law: npt.NDArray[np.float64]) -> None:
    """Divide ``law`` by its sum in place when that is positive."""
    total = row_sum(law)
    if total > 0.0:
        for j in range(law.shape[0]):
            law[j] /= total


@numba.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def verify_tree_rows(
    target_probs: npt.NDArray[np.floating],
    draft_probs: npt.NDArray[np.floating],
    parents: npt.NDArray[np.int64],
    token_ids: npt.NDArray[np.int64],
    scheme: int,
    accept_uniforms: npt.NDArray[np.float64],
    sample_uniforms: npt.NDArray[np.float64],
    tokens: npt.NDArray[np.int64],
    accepted: npt.NDArray[np.int64],
) -> tuple[float, float, float, float, float, bool, bool]:
    """Verify every row's tree on its own and collect the validator's facts.

    Args:
        target_probs: ``[B, N+1, V]`` float32/float64 (any strides), p at every node.
        draft_probs: ``[B, N+1, V]`` float32/float64, q at every node.
        parents: ``[B, N]`` int64, ``parents[b, j]`` in ``[0, j]`` (checked by the caller).
        token_ids: ``[B, N]`` int64 in ``[0, V)`` (checked by the caller).
        scheme: :data:`IID`, :data:`WITHOUT_REPLACEMENT` or :data:`TOP_K`.
        accept_uniforms: ``[B, N]`` float64 in ``[0, 1)``; node j+1's decision uses column j.
        sample_uniforms: ``[B]`` float64 in ``[0, 1)``.
        tokens: ``[B, D+1]`` int64, written: the accepted path's tokens, the final token, then
            ``PLACEHOLDER`` (D at least every row's depth).
        accepted: ``[B, D]`` int64, written: the accepted nodes, then ``PLACEHOLDER``.

    Returns:
        ``(smallest p entry, largest |p row sum - 1|, smallest q entry, largest |q row sum - 1|
        over nodes with children, smallest drafted q at a node's parent, siblings repeat a
        token, a top-k child is beaten by a token its parent did not expand)``; the two sum
        errors are NaN once a sum is NaN or infinite, and the q one covers every node for that.
        The inputs are valid for :func:`losslessness.protocol.validate_tree_inputs` iff the
        smallest entries are >= 0, the sum errors within ``ROW_SUM_TOLERANCE`` (the q sums of
        childless nodes need only be finite), the drafted q > 0, and neither flag is set
        (the flags count only for the schemes that forbid them).
    """
    batch, positions, vocab = target_probs.shape
    nodes = positions - 1
    depth = accepted.shape[1]
    law = np.empty(vocab)
    draft_law = np.empty(vocab)
    marked = np.zeros(vocab, dtype=np.bool_)
    has_children = np.zeros(positions, dtype=np.bool_)
    q_sums = np.empty(positions)
    smallest_p = smallest_q = smallest_drafted = np.inf
    worst_p = worst_q = 0.0
    repeated = beaten = False
    for b in range(batch):
        for n in range(positions):
            total, smallest_p = _row_sum_and_min(target_probs[b, n], smallest_p)
            worst_p = _worse(worst_p, abs(total - 1.0))
            total, smallest_q = _row_sum_and_min(draft_probs[b, n], smallest_q)
            q_sums[n] = total
            has_children[n] = False
        for j in range(nodes):
            parent = parents[b, j]
            has_children[parent] = True
            drafted = np.float64(draft_probs[b, parent, token_ids[b, j]])
            smallest_drafted = min(smallest_drafted, drafted)
            for i in range(j):
                if parents[b, i] == parent and token_ids[b, i] == token_ids[b, j]:
                    repeated = True
        for n in range(positions):
            error = abs(q_sums[n] - 1.0)
            if has_children[n] or not np.isfinite(q_sums[n]):
                worst_q = _worse(worst_q, error)
            if scheme == TOP_K and has_children[n]:
                for j in range(nodes):
                    if parents[b, j] == n:
                        marked[token_ids[b, j]] = True
                best = 0.0
                for t in range(vocab):
                    if not marked[t]:
                        best = max(best, np.float64(draft_probs[b, n, t]))
                for j in range(nodes):
                    if parents[b, j] == n:
                        marked[token_ids[b, j]] = False
                        if np.float64(draft_probs[b, n, token_ids[b, j]]) < best:
                            beaten = True
        node = 0
        level = 0
        while True:
            materialised = False
            child = -1
            for j in range(nodes):
                if parents[b, j] != node:
                    continue
                token = token_ids[b, j]
                if materialised:
                    r_x, q_x = law[token], draft_law[token]
                else:
                    r_x = np.float64(target_probs[b, node, token])
                    q_x = np.float64(draft_probs[b, node, token])
                ratio = r_x
                if scheme != TOP_K and q_x > 0.0:
                    ratio = r_x / q_x
                if accept_uniforms[b, j] < ratio:
                    child = j + 1
                    break
                if not materialised:
                    for t in range(vocab):
                        law[t] = np.float64(target_probs[b, node, t])
                        draft_law[t] = np.float64(draft_probs[b, node, t])
                    materialised = True
                if scheme == TOP_K:
                    law[token] = 0.0
                    _normalise(law)
                    continue
                excess_total = 0.0
                for t in range(vocab):
                    excess_total += max(law[t] - draft_law[t], 0.0)
                if excess_total > 0.0:
                    for t in range(vocab):
                        law[t] = max(law[t] - draft_law[t], 0.0)
                    _normalise(law)
                if scheme == WITHOUT_REPLACEMENT:
                    draft_law[token] = 0.0
                    _normalise(draft_law)
            if child > 0 and level < depth:
                tokens[b, level] = token_ids[b, child - 1]
                accepted[b, level] = child
                node = child
                level += 1
                continue
            if not materialised:
                for t in range(vocab):
                    law[t] = np.float64(target_probs[b, node, t])
            tokens[b, level] = _search(law, sample_uniforms[b] * row_sum(law))
            for i in range(level + 1, depth + 1):
                tokens[b, i] = PLACEHOLDER
            for i in range(level, depth):
                accepted[b, i] = PLACEHOLDER
            break
    return smallest_p, worst_p, smallest_q, worst_q, smallest_drafted, repeated, beaten
