"""Exact laws of tree verification: reach probabilities, accepted length, the multi-draft bound.

Method (:func:`exact_tree_laws`): exact computation, no sampling, over both the drafting
(:meth:`losslessness.cases.TreeCase.draw_trees`) and the verification randomness of the
reference verifier of the case's declared scheme (:func:`losslessness.reference.tree.verify_tree`,
whose docstring has the rules and their sources).

- Markov structure: p and q at a node depend only on its depth and token, and a node's children
  are drawn from q at the node alone, so the accepted path is a Markov chain over (node, token).
  :func:`token_reach` runs a forward dynamic programme over the nodes in index order (parents
  first): ``R[c, y] = sum_x R[n, x] * C[d, x, k][slot(c), y]`` where ``R[n, x]`` is the
  probability that node n is accepted with token x and ``C[d, x, k][i, y]`` the probability that
  the i-th of the k children of a node of depth d and token x is accepted with token y, given that
  node is reached. No ``V^N`` enumeration over whole trees.
- ``C`` enumerates one sibling group: every ordered k-tuple of tokens with its draft probability
  (``iid``: ``prod q(t_i)``; ``without-replacement``: ``prod q(t_i) / (1 - sum_{j<i} q(t_j))``,
  the sequential law of ``torch.multinomial`` without replacement; ``top-k``: the one tuple of
  the k largest q, ties to the lower id, probability 1) and, for each tuple, the verifier's
  residual recursion (deterministic given the tokens): child i is accepted with probability
  ``prod_{j<i} (1 - a_j) * a_i``, ``a_j = min(1, r_j(t_j) / q_j(t_j))`` (``r_j(t_j)`` for top-k),
  the residuals ``r_j``/``q_j`` updated as on a rejection. ``C`` is cached per (depth, token,
  group size), so nodes of the same depth and token share it.
- ``reach[n] = sum_x R[n, x]``; the accepted nodes form one root path with at most one node per
  depth, so ``depth_reach[d]`` is the sum of ``reach`` over the nodes of depth d.

Limits: the work is counted in cells (``states * tuples * V`` per distinct (depth, group size),
``states`` = 1 at the root and V below it, ``tuples`` = ``V^k`` for ``iid``, ``V!/(V-k)!`` for
``without-replacement``, 1 for ``top-k``) and capped at :data:`CELL_CAP` (``2^26``): e.g. V = 32
with up to 3 siblings per node at one depth below the root, V = 16 with 4, V = 8 with 6 (any N
whose groups fit), ValueError beyond. Tuples are processed in chunks, so memory stays below
about 100 MB. Measured (one core, loaded machine): V = 32 star of 3 iid (2^20 cells) 0.2 s CPU,
V = 16 star of 4 iid 0.15 s, 8-node binary tree at V = 32 without replacement 0.04 s.

:func:`ot_acceptance_bound`: SpecTr's optimal-transport linear program (Sun et al. 2023,
"SpecTr: Fast Speculative Decoding via Optimal Transport", sections 3-4: the optimal acceptance
probability of a draft selection with k drafts is the optimal transport between the drafts'
joint law and p under the cost ``1{y not in {x_1..x_k}}``), solved with
``scipy.optimize.linprog`` (HiGHS). Symmetry reduction: the objective depends on a draft tuple
only through its set of distinct tokens, so the tuples are aggregated by set (exact: any coupling
of tuples aggregates to one of sets with the same value and conversely by splitting
proportionally), and only the matched pairs (set s, y in s) are variables, with ``<=``
marginals (a sub-coupling on matched pairs extends to a full coupling because the unmatched row
and column masses have equal totals). Capped at :data:`OT_TUPLE_CAP` ordered tuples over q's
support (``2^22``: V = 32 with n = 4, V = 16 with n = 5, V = 8 with n = 7), ValueError beyond.
HiGHS's interior-point method (with crossover) solves these in seconds where its simplex takes
minutes: V = 32, n = 4 (160k variables) about 2.6 s CPU, V = 32, n = 3 0.1 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import sparse
from scipy.optimize import linprog

from losslessness.cases import TreeCase
from losslessness.protocol import DRAFT_SCHEMES, InvalidInputError

CELL_CAP = 1 << 26
"""Largest number of residual cells (states x sibling tuples x V) :func:`exact_tree_laws`
enumerates."""

OT_TUPLE_CAP = 1 << 22
"""Largest number of ordered draft tuples (over q's support) :func:`ot_acceptance_bound`
enumerates."""

_CHUNK_ROWS = 1 << 15


@dataclass(frozen=True)
class TreeLaws:
    """Exact laws of the reference verifier of a :class:`TreeCase`'s declared draft scheme,
    over both the drafting and the verification randomness.

    Attributes:
        reach: ``[N+1]`` float64; ``reach[n]`` is the probability that node n is accepted in one
            step (``reach[0] = 1``, the root).
        depth_reach: ``[D+1]`` float64; ``depth_reach[d]`` the probability that at least d
            drafted tokens are accepted (``depth_reach[0] = 1``).
        expected_accepted: the expected number of accepted drafted tokens per step,
            ``depth_reach[1:].sum()``.
        root_bound: the largest probability, over every lossless verifier, of accepting one of
            the root's children, given how they were drafted (SpecTr's optimal transport, Sun
            et al. 2023, for ``iid`` and ``without-replacement``; the top-k set's target mass
            for ``top-k``).
    """

    reach: torch.Tensor
    depth_reach: torch.Tensor
    expected_accepted: float
    root_bound: float


def _top_k_set(q: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` tokens of largest q, ties to the lower id, in decreasing q (the order of
    :func:`losslessness.protocol.sample_siblings`)."""
    return np.argsort(-q, kind="stable")[:count]


def _tuple_count(support: int, count: int, scheme: str) -> int:
    """Ordered sibling tuples a group of ``count`` siblings can take over ``support`` tokens."""
    if scheme == "top-k":
        return 1
    if scheme == "iid":
        return int(support**count)
    return math.perm(support, count) if count <= support else 0


def _sibling_tuples(q: np.ndarray, count: int, scheme: str) -> tuple[np.ndarray, np.ndarray]:
    """Every ordered token tuple of ``count`` siblings drafted from ``q`` and its probability.

    Args:
        q: ``[V]`` float64, the parent's draft law.
        count: k >= 1 siblings.
        scheme: a draft scheme.

    Returns:
        ``([M, k] int64, [M] float64)``: the tuples with positive probability and their
        probabilities (summing to 1 up to rounding).
    """
    if scheme == "top-k":
        return _top_k_set(q, count)[None, :].astype(np.int64), np.ones(1)
    support = np.flatnonzero(q > 0)
    grids = np.meshgrid(*([support] * count), indexing="ij")
    tuples = np.stack([g.reshape(-1) for g in grids], axis=1).astype(np.int64)
    if scheme == "iid":
        return tuples, q[tuples].prod(axis=1)
    distinct = np.ones(len(tuples), dtype=bool)
    for i in range(count):
        for j in range(i):
            distinct &= tuples[:, i] != tuples[:, j]
    tuples = tuples[distinct]
    taken = q[tuples]
    before = np.concatenate([np.zeros((len(tuples), 1)), np.cumsum(taken, axis=1)[:, :-1]], 1)
    return tuples, (taken / (q.sum() - before)).prod(axis=1)


def _renormalised(rows: np.ndarray) -> np.ndarray:
    total = rows.sum(axis=1, keepdims=True)
    return rows / np.where(total > 0, total, 1.0)


def _slot_acceptance(
    p: np.ndarray, q: np.ndarray, tuples: np.ndarray, scheme: str
) -> np.ndarray:
    """The probability that each child of each sibling tuple is the accepted one.

    Args:
        p: ``[V]`` float64, target law at the parent.
        q: ``[V]`` float64, draft law at the parent.
        tuples: ``[M, k]`` int64 sibling tokens in index order.
        scheme: the draft scheme (the rule of :func:`losslessness.reference.tree.verify_tree`).

    Returns:
        ``[M, k]`` float64: ``out[m, i]`` = P(children 0..i-1 rejected, child i accepted | the
        tokens ``tuples[m]``), by the residual recursion.
    """
    rows, count = tuples.shape
    index = np.arange(rows)
    residual = np.repeat(p[None, :], rows, axis=0)
    draft = np.repeat(q[None, :], rows, axis=0) if scheme == "without-replacement" else None
    surviving = np.ones(rows)
    out = np.empty((rows, count))
    for i in range(count):
        token = tuples[:, i]
        r_x = residual[index, token]
        if scheme == "top-k":
            ratio = r_x
        else:
            q_x = draft[index, token] if draft is not None else q[token]
            ratio = r_x / np.where(q_x > 0, q_x, 1.0)
        accept = np.clip(ratio, 0.0, 1.0)
        out[:, i] = surviving * accept
        surviving = surviving * (1.0 - accept)
        if i == count - 1:
            break
        if scheme == "top-k":
            residual[index, token] = 0.0
            residual = _renormalised(residual)
            continue
        law = draft if draft is not None else q[None, :]
        excess = np.maximum(residual - law, 0.0)
        mass = excess.sum(axis=1, keepdims=True)
        # No excess mass means no rejection is possible (surviving is 0 there): keep r.
        residual = np.where(mass > 0, excess / np.where(mass > 0, mass, 1.0), residual)
        if draft is not None:
            draft[index, token] = 0.0
            draft = _renormalised(draft)
    return out


def _group_law(p: np.ndarray, q: np.ndarray, count: int, scheme: str) -> np.ndarray:
    """``[k, V]`` float64: P(the i-th of ``count`` siblings is accepted with token y | parent
    reached), over the siblings' drafting and the verification."""
    vocab = p.shape[0]
    tuples, probs = _sibling_tuples(q, count, scheme)
    law = np.zeros((count, vocab))
    for start in range(0, len(tuples), _CHUNK_ROWS):
        chunk = tuples[start : start + _CHUNK_ROWS]
        weights = probs[start : start + _CHUNK_ROWS, None] * _slot_acceptance(p, q, chunk, scheme)
        for i in range(count):
            law[i] += np.bincount(chunk[:, i], weights=weights[:, i], minlength=vocab)
    return law


def _children(parents: tuple[int, ...]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for j, parent in enumerate(parents):
        groups.setdefault(parent, []).append(j + 1)
    return groups


def enumeration_cells(case: TreeCase) -> int:
    """The cells :func:`exact_tree_laws` enumerates for ``case`` (compared with
    :data:`CELL_CAP`): per distinct (depth, group size) of the tree's sibling groups, the parent
    states (1 at the root, V below) times the sibling tuples (``V^k``, ``V!/(V-k)!`` or 1) times
    V."""
    vocab = case.vocab_size
    depths = case.depths.tolist()
    groups = {(depths[parent], len(kids)) for parent, kids in _children(case.parents).items()}
    return sum(
        (1 if depth == 0 else vocab) * _tuple_count(vocab, count, case.draft_scheme) * vocab
        for depth, count in groups
    )


def token_reach(case: TreeCase) -> torch.Tensor:
    """The probability that each drafted node is accepted with each token, exactly.

    Args:
        case: the tree case (topology, Markov p/q tables, declared scheme).

    Returns:
        ``[N, V]`` float64; row ``j`` is node ``j+1``: ``P(node accepted and its token = y)``,
        over the drafting (:meth:`TreeCase.draw_trees`) and the reference verifier of the
        case's scheme. The method is in the module docstring.

    Raises:
        ValueError: :func:`enumeration_cells` exceeds :data:`CELL_CAP` (the message names V, N
            and the cap).
    """
    cells = enumeration_cells(case)
    if cells > CELL_CAP:
        raise ValueError(
            f"exact_tree_laws: case {case.case_id!r} (V = {case.vocab_size}, N = "
            f"{case.n_nodes}, scheme {case.draft_scheme!r}, largest sibling group "
            f"{max(len(k) for k in _children(case.parents).values())}) needs {cells} "
            f"enumeration cells, beyond the cap of {CELL_CAP}; use fewer siblings or a smaller V"
        )
    vocab = case.vocab_size
    scheme = case.draft_scheme
    depths = case.depths.tolist()
    root_p = case.root_target.to(torch.float64).numpy()
    root_q = case.root_draft.to(torch.float64).numpy()
    target = case.target_table.to(torch.float64).numpy()
    draft = case.draft_table.to(torch.float64).numpy()
    reach = np.zeros((case.n_nodes + 1, vocab))
    cache: dict[tuple[int, int, int], np.ndarray] = {}
    for parent, kids in sorted(_children(case.parents).items()):
        depth = depths[parent]
        if depth == 0:
            law = _group_law(root_p, root_q, len(kids), scheme)
        else:
            law = np.zeros((len(kids), vocab))
            for token in np.flatnonzero(reach[parent] > 0).tolist():
                key = (depth, token, len(kids))
                if key not in cache:
                    row = int(case.table_rows(torch.tensor(token)))
                    cache[key] = _group_law(
                        target[depth - 1, row], draft[depth - 1, row], len(kids), scheme
                    )
                law += reach[parent, token] * cache[key]
        for slot, child in enumerate(kids):
            reach[child] = law[slot]
    return torch.from_numpy(reach[1:])


def exact_tree_laws(case: TreeCase) -> TreeLaws:
    """The :class:`TreeLaws` of ``case`` by exact computation (the method in the module
    docstring: a dynamic programme over the nodes, each sibling group enumerated once per
    depth, token and size).

    Args:
        case: the tree case.

    Returns:
        :class:`TreeLaws`, every tensor float64 on the CPU; ``root_bound`` is
        :func:`ot_acceptance_bound` at the root with n = the root's number of children.

    Raises:
        ValueError: the enumeration would exceed :data:`CELL_CAP` (the message names the case's
            V and N and the cap), or the root's bound exceeds :data:`OT_TUPLE_CAP`.
    """
    per_token = token_reach(case)
    reach = torch.cat([torch.ones(1, dtype=torch.float64), per_token.sum(dim=1)])
    depths = case.depths
    depth_reach = torch.zeros(case.depth + 1, dtype=torch.float64)
    depth_reach.index_add_(0, depths, reach)
    root_children = sum(1 for parent in case.parents if parent == 0)
    bound = ot_acceptance_bound(case.root_target, case.root_draft, root_children,
                                case.draft_scheme)
    return TreeLaws(
        reach=reach,
        depth_reach=depth_reach,
        expected_accepted=float(depth_reach[1:].sum()),
        root_bound=bound,
    )


def _set_laws(
    q: np.ndarray, n_drafts: int, scheme: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The law of the set of distinct drafted tokens.

    Returns:
        ``(set_index [M], token [M], probs [S])``: the (set, member token) pairs of the S sets
        with positive probability, and each set's probability.
    """
    tuples, probs = _sibling_tuples(q, n_drafts, scheme)
    vocab = q.shape[0]
    if vocab <= 62:
        # A set as a bit mask: one 1-D unique instead of a row-wise one.
        masks = np.bitwise_or.reduce(np.left_shift(np.int64(1), tuples), axis=1)
        unique, inverse = np.unique(masks, return_inverse=True)
        members = ((unique[:, None] >> np.arange(vocab, dtype=np.int64)) & 1).astype(bool)
    else:
        ordered = np.sort(tuples, axis=1)
        rows = np.repeat(np.arange(len(ordered)), n_drafts)
        members_all = np.zeros((len(ordered), vocab), dtype=bool)
        members_all[rows, ordered.reshape(-1)] = True
        _, first, inverse = np.unique(
            np.packbits(members_all, axis=1), axis=0, return_index=True, return_inverse=True
        )
        members = members_all[first]
    set_probs = np.bincount(inverse.reshape(-1), weights=probs, minlength=len(members))
    set_index, token = np.nonzero(members)
    return set_index, token, set_probs


def ot_acceptance_bound(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, n_drafts: int, draft_scheme: str
) -> float:
    """The largest acceptance probability of any lossless verifier of ``n_drafts`` drafts.

    Args:
        target_probs: ``[V]`` float, p.
        draft_probs: ``[V]`` float, q.
        n_drafts: n >= 1.
        draft_scheme: how the n drafts were drawn from q (:data:`DRAFT_SCHEMES`).

    Returns:
        ``max P(Y in {X_1..X_n})`` over couplings of ``Y ~ p`` with the drafts' joint law
        (SpecTr, Sun et al. 2023, sections 3-4, the optimal-transport linear program, solved with
        ``scipy.optimize.linprog`` (HiGHS) after the symmetry reduction of the module
        docstring). For ``top-k`` the drafts are deterministic and the bound is the target mass
        of the top-n set (ties to the lower id). In ``[0, 1]``; 1 for ``p == q`` and n >= 1.

    Raises:
        InvalidInputError: shapes other than two equal ``[V]``, n < 1, an unknown scheme, more
            ``without-replacement`` drafts than tokens with q > 0, or more ``top-k`` drafts
            than V.
        ValueError: the ordered draft tuples over q's support exceed :data:`OT_TUPLE_CAP`
            (the message names V and n).
        RuntimeError: HiGHS reports no optimum.
    """
    p = target_probs.detach().to("cpu", torch.float64).numpy()
    q = draft_probs.detach().to("cpu", torch.float64).numpy()
    if p.ndim != 1 or q.shape != p.shape or p.shape[0] < 1:
        raise InvalidInputError(
            "draft_probs", f"expected two [V] vectors, got {tuple(p.shape)} and {tuple(q.shape)}"
        )
    if n_drafts < 1:
        raise InvalidInputError("n_drafts", f"must be >= 1, got {n_drafts}")
    if draft_scheme not in DRAFT_SCHEMES:
        raise InvalidInputError(
            "draft_scheme", f"{draft_scheme!r} is not one of {', '.join(DRAFT_SCHEMES)}"
        )
    vocab = p.shape[0]
    support = int((q > 0).sum())
    if draft_scheme == "top-k":
        if n_drafts > vocab:
            raise InvalidInputError("n_drafts", f"{n_drafts} top-k drafts exceed V = {vocab}")
        return float(min(1.0, p[_top_k_set(q, n_drafts)].sum()))
    if draft_scheme == "without-replacement" and n_drafts > support:
        raise InvalidInputError(
            "n_drafts", f"{n_drafts} drafts without replacement exceed q's support ({support})"
        )
    tuples = _tuple_count(support, n_drafts, draft_scheme)
    if tuples > OT_TUPLE_CAP:
        raise ValueError(
            f"ot_acceptance_bound: V = {vocab} (support {support}) and n = {n_drafts} give "
            f"{tuples} ordered draft tuples, beyond the cap of {OT_TUPLE_CAP}"
        )
    set_index, tokens, set_probs = _set_laws(q, n_drafts, draft_scheme)
    variables = len(tokens)
    rows = np.concatenate([set_index, len(set_probs) + tokens])
    columns = np.concatenate([np.arange(variables), np.arange(variables)])
    constraints = sparse.csr_matrix(
        (np.ones(2 * variables), (rows, columns)), shape=(len(set_probs) + vocab, variables)
    )
    result = linprog(
        -np.ones(variables), A_ub=constraints, b_ub=np.concatenate([set_probs, p]),
        bounds=(0, None), method="highs-ipm",
    )
    if not result.success:
        raise RuntimeError(f"ot_acceptance_bound: HiGHS found no optimum: {result.message}")
    return float(np.clip(-result.fun, 0.0, 1.0))
