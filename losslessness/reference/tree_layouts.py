"""Lossless conversions between the protocol's tree layout and the layouts real engines use.

The protocol layout (:class:`losslessness.protocol.TreeVerifier`): ``parents [B, N]`` int64,
node 0 the root context (no drafted token), ``parents[b, j]`` the parent of node ``j+1`` and
``< j+1``; ``token_ids [B, N]`` the drafted tokens; the children of a node are tried in index
order.

SGLang (first-child / next-sibling linked lists)
------------------------------------------------
Source: sgl-project/sglang, ``sgl-kernel/csrc/speculative/eagle_utils.cu`` (commit
29bd4e859f6ef92f5248fd8c3d4ba681f8d19028: ``build_tree_efficient`` and ``VerifyTreeGreedy``),
``sgl-kernel/csrc/speculative/speculative_sampling.cuh`` (commit
b227f63247cdaf7fcbc4cfec8c3379120276ec82: ``TreeSpeculativeSamplingTargetOnly``) and
``sgl-kernel/tests/test_speculative_sampling.py`` (commit
929cdb97ba9d28dc9a901efa6b76ddc1d23291d8). Every tensor is ``[B, T]`` with ``T =
num_draft_tokens = N + 1``:

- slot 0 is the root, and *is* a node: ``candidates[b, 0]`` is the last verified token (the
  previous step's bonus/correction), whose logits give the law of the first drafted level;
- ``retrive_index[b, t]`` is the flat row of slot t in the batch's concatenated per-token
  outputs (``predicts``, ``accept_index``); ``build_tree_efficient`` writes ``b * T + t``;
- ``retrive_next_token[b, t]`` is slot t's first child, ``-1`` if it has none;
- ``retrive_next_sibling[b, t]`` is the next sibling of slot t, ``-1`` after the last (and for
  the root); the kernels try children by walking this list. ``build_tree_efficient`` links the
  children in increasing slot order; the kernels' test uses another order (row 1: the root's
  children are slot 4 then slot 1), so :func:`from_sglang` renumbers nodes when needed;
- the target rows of ``tree_speculative_sampling_target_only`` (``target_probs [B, T, V]``) are
  indexed by slot, its outputs (``predicts``, ``accept_index``) by ``retrive_index``.

Medusa / EAGLE ``tree_choices``
-------------------------------
Source: FasterDecoding/Medusa, ``medusa/model/utils.py`` (commit
2b8981448074423a09aec01f4c79a0c0c47f5317: ``generate_medusa_buffers``, ``generate_candidates``);
EAGLE (SafeAILab/EAGLE, ``eagle/model/choices.py`` and ``generate_tree_buffers``) uses the same
format. A tree is a list of paths, each a list of top-k ranks: ``[0, 1]`` is the rank-1 child of
the root's rank-0 child. Every proper prefix of a path must be a path too (Medusa looks each
prefix up with ``list.index``). Medusa's node order is ``sorted(choices, key=lambda p: (len(p),
p))`` (by depth, then lexicographically), node 0 being the root (the base model's token), and
builds from it:

- ``medusa_attn_mask [T, T]``: node i attends to itself, the root and its ancestors;
- ``tree_indices [T]``: node of path p at depth d reads candidate ``1 + TOPK * (d - 1) + p[-1]``
  of ``[root token, head-0 top-TOPK, head-1 top-TOPK, ...]`` (index 0 for the root): the
  token is the ``p[-1]``-th most likely token of Medusa head ``d - 1``;
- ``medusa_position_ids [T]``: the depth of each node;
- ``retrieve_indices [L, D + 1]``: one row per leaf (taken from the sorted list in reverse),
  the node indices of the root-to-leaf path, ``-1`` padded.

EAGLE-1's ``generate_tree_buffers`` (SafeAILab/EAGLE, ``eagle/model/utils_alpha.py``, commit
08dc06ccb428f2d3cf8380933ea50ed3e4178168; its trees, e.g. ``mc_sim_7b_63``, in
``eagle/model/choices.py``) sorts the same way and builds the same mask, position ids and
retrieve indices, but its draft model gives every *parent* its own top-TOPK (the draft runs at
each node's context), so a node's ``tree_indices`` entry is ``1 + TOPK * g + p[-1]`` with g the
index of its parent among the distinct parents in sorted order (the root's group 0):
``medusa_buffers(..., per_parent=True)``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import NamedTuple

import torch

from losslessness.protocol import PLACEHOLDER, InvalidInputError, tree_depths

__all__ = [
    "MEDUSA_TOPK",
    "MedusaBuffers",
    "ProtocolTree",
    "SglangTree",
    "TreeChoices",
    "from_sglang",
    "medusa_buffers",
    "parents_to_tree_choices",
    "to_sglang",
    "tree_choices_to_parents",
]

MEDUSA_TOPK = 10
"""Medusa's ``TOPK``: candidates read per head (``medusa/model/utils.py``)."""


class SglangTree(NamedTuple):
    """A batch of trees in SGLang's layout (module docstring); every tensor ``[B, N+1]`` int64.

    Attributes:
        candidates: slot t's token; slot 0 holds the root's (last verified) token.
        retrive_index: flat row of each slot (``b * (N+1) + t`` from :func:`to_sglang`).
        retrive_next_token: first child's slot, ``-1`` for a leaf.
        retrive_next_sibling: next sibling's slot, ``-1`` after the last child.
    """

    candidates: torch.Tensor
    retrive_index: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor


class ProtocolTree(NamedTuple):
    """A batch of trees in the protocol's layout, with the engine positions of its nodes.

    Attributes:
        parents: ``[B, N]`` int64, ``parents[b, j] < j + 1``.
        token_ids: ``[B, N]`` int64, node ``j+1``'s token.
        root_tokens: ``[B]`` int64, the root's token in the engine layout (not a draft).
        slots: ``[B, N+1]`` int64, the engine slot of protocol node n (identity when the engine
            layout already is in protocol order).
        rows: ``[B, N+1]`` int64, the engine's flat row of protocol node n
            (``retrive_index`` gathered by ``slots``).
    """

    parents: torch.Tensor
    token_ids: torch.Tensor
    root_tokens: torch.Tensor
    slots: torch.Tensor
    rows: torch.Tensor


def _int_matrix(name: str, value: object, rank: int = 2) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise InvalidInputError(name, f"expected a torch.Tensor, got {type(value).__name__}")
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise InvalidInputError(name, f"expected an integer dtype, got {value.dtype}")
    if value.dim() != rank:
        raise InvalidInputError(name, f"expected rank {rank}, got shape {tuple(value.shape)}")
    return value.long().cpu()


def _validate_parents(parents: object, token_ids: object) -> tuple[torch.Tensor, torch.Tensor]:
    tree = _int_matrix("parents", parents)
    ids = _int_matrix("token_ids", token_ids)
    if tree.shape[1] == 0:
        raise InvalidInputError("parents", "N = 0: a tree needs at least one drafted node")
    if tuple(ids.shape) != tuple(tree.shape):
        raise InvalidInputError(
            "token_ids", f"shape {tuple(ids.shape)} does not match parents {tuple(tree.shape)}"
        )
    limit = torch.arange(1, tree.shape[1] + 1)
    bad = (tree < 0) | (tree >= limit)
    if bool(bad.any()):
        b, j = torch.nonzero(bad)[0].tolist()
        raise InvalidInputError(
            "parents", f"row {b}: node {j + 1}'s parent {int(tree[b, j])} is not in [0, {j}]"
        )
    if bool((ids < 0).any()):
        raise InvalidInputError("token_ids", "negative token id")
    return tree, ids


def to_sglang(
    parents: torch.Tensor, token_ids: torch.Tensor, root_tokens: torch.Tensor
) -> SglangTree:
    """Protocol layout to SGLang's linked lists, slot t = protocol node t.

    Children are linked in increasing node order (as ``build_tree_efficient`` links them), so
    SGLang's kernels try them in the protocol's order.

    Args:
        parents: ``[B, N]`` int64, ``parents[b, j]`` in ``[0, j]``.
        token_ids: ``[B, N]`` int64, ids ``>= 0``.
        root_tokens: ``[B]`` int64, the last verified token of each row (SGLang's slot 0).

    Returns:
        :class:`SglangTree`, tensors ``[B, N+1]`` int64 on the CPU; ``retrive_index[b, t] =
        b * (N+1) + t``.

    Raises:
        InvalidInputError: naming ``parents``, ``token_ids`` or ``root_tokens`` (type, rank,
            shape, a parent not before its node, a negative id).
    """
    tree, ids = _validate_parents(parents, token_ids)
    roots = _int_matrix("root_tokens", root_tokens, rank=1)
    batch, nodes = tree.shape
    if roots.shape[0] != batch:
        raise InvalidInputError(
            "root_tokens", f"has {roots.shape[0]} entries for a batch of {batch} trees"
        )
    width = nodes + 1
    candidates = torch.cat([roots.unsqueeze(1), ids], dim=1)
    retrive_index = torch.arange(batch * width, dtype=torch.int64).reshape(batch, width)
    none = torch.iinfo(torch.int64).max
    node_ids = torch.arange(1, width, dtype=torch.int64)
    # child[b, n, j]: node j+1 is a child of node n; its first child is the lowest such j+1.
    child = tree.unsqueeze(1) == torch.arange(width).view(1, width, 1)
    first = torch.where(child, node_ids, none).min(dim=2).values
    next_token = torch.where(first == none, PLACEHOLDER, first)
    # later[b, i, j]: node j+1 is a later sibling of node i+1; the next one is the lowest.
    later = (tree.unsqueeze(2) == tree.unsqueeze(1)) & (
        node_ids.view(1, 1, nodes) > node_ids.view(1, nodes, 1)
    )
    following = torch.where(later, node_ids, none).min(dim=2).values
    next_sibling = torch.full((batch, width), PLACEHOLDER, dtype=torch.int64)
    next_sibling[:, 1:] = torch.where(following == none, PLACEHOLDER, following)
    return SglangTree(candidates, retrive_index, next_token, next_sibling)


def from_sglang(
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
) -> ProtocolTree:
    """SGLang's linked lists to the protocol layout, renumbering nodes only where needed.

    Every non-root slot must be reached exactly once from the root by the lists (a tree with
    no cycle and no orphan). Protocol node numbers are the order in which a topological sort
    (parent before child, sibling before its next sibling) takes the smallest available slot:
    the identity when the slots already satisfy both constraints (so :func:`to_sglang` output
    converts back unchanged), and otherwise the protocol's index order of siblings is SGLang's
    list order, so a verifier tries the children in the same order the kernels do.

    Args:
        candidates: ``[B, T]`` int64 tokens, ``T = N + 1 >= 2``; slot 0 the root's.
        retrive_index: ``[B, T]`` int64 flat rows, ``>= 0``.
        retrive_next_token: ``[B, T]`` int64 first child's slot or ``-1``.
        retrive_next_sibling: ``[B, T]`` int64 next sibling's slot or ``-1``; ``-1`` at slot 0.

    Returns:
        :class:`ProtocolTree` (CPU, int64).

    Raises:
        InvalidInputError: naming the argument: type, rank or shape, a slot out of ``[-1, T)``
            or pointing at the root, a sibling of the root, a slot reached twice (a cycle or a
            shared child) or never (an orphan), a negative token or row.
    """
    tokens = _int_matrix("candidates", candidates)
    index = _int_matrix("retrive_index", retrive_index)
    first = _int_matrix("retrive_next_token", retrive_next_token)
    sibling = _int_matrix("retrive_next_sibling", retrive_next_sibling)
    batch, width = tokens.shape
    if width < 2:
        raise InvalidInputError(
            "candidates", f"needs the root and >= 1 drafted slot, got T={width}"
        )
    for name, tensor in (
        ("retrive_index", index),
        ("retrive_next_token", first),
        ("retrive_next_sibling", sibling),
    ):
        if tuple(tensor.shape) != (batch, width):
            raise InvalidInputError(
                name, f"shape {tuple(tensor.shape)} does not match candidates {(batch, width)}"
            )
    if bool((tokens < 0).any()):
        raise InvalidInputError("candidates", "negative token id")
    if bool((index < 0).any()):
        raise InvalidInputError("retrive_index", "negative flat row")
    for name, tensor in (("retrive_next_token", first), ("retrive_next_sibling", sibling)):
        if bool(((tensor < PLACEHOLDER) | (tensor >= width) | (tensor == 0)).any()):
            raise InvalidInputError(
                name,
                f"entries must be -1 or a non-root slot in [1, {width}), got {tensor.tolist()}",
            )
    if bool((sibling[:, 0] != PLACEHOLDER).any()):
        raise InvalidInputError("retrive_next_sibling", "the root (slot 0) cannot have a sibling")
    parents_out = torch.empty((batch, width - 1), dtype=torch.int64)
    slots_out = torch.empty((batch, width), dtype=torch.int64)
    for b in range(batch):
        order = _sglang_order(b, first[b].tolist(), sibling[b].tolist(), width)
        slots_out[b] = torch.tensor(order)
        node_of = {slot: n for n, slot in enumerate(order)}
        parent_slot = _sglang_parent_slots(first[b].tolist(), sibling[b].tolist(), width)
        for n, slot in enumerate(order[1:], start=1):
            parents_out[b, n - 1] = node_of[parent_slot[slot]]
    ids_out = tokens.gather(1, slots_out[:, 1:])
    rows = index.gather(1, slots_out)
    return ProtocolTree(parents_out, ids_out, tokens[:, 0].clone(), slots_out, rows)


def _sglang_parent_slots(first: list[int], sibling: list[int], width: int) -> list[int]:
    parent = [PLACEHOLDER] * width
    for slot in range(width):
        child = first[slot]
        while child != PLACEHOLDER:
            if parent[child] != PLACEHOLDER or child == slot:
                raise InvalidInputError(
                    "retrive_next_sibling",
                    f"slot {child} is reached twice from the root (a cycle or a shared child)",
                )
            parent[child] = slot
            child = sibling[child]
    return parent


def _sglang_order(row: int, first: list[int], sibling: list[int], width: int) -> list[int]:
    parent = _sglang_parent_slots(first, sibling, width)
    orphans = [slot for slot in range(1, width) if parent[slot] == PLACEHOLDER]
    if orphans:
        raise InvalidInputError(
            "retrive_next_token",
            f"row {row}: slots {orphans} are not reachable from the root by the lists",
        )
    # Predecessors: the parent, and the previous sibling in the list.
    blockers = [0] * width
    successors: list[list[int]] = [[] for _ in range(width)]
    for slot in range(width):
        child = first[slot]
        previous = slot
        while child != PLACEHOLDER:
            successors[previous].append(child)
            blockers[child] += 1
            if previous != slot:
                successors[slot].append(child)
                blockers[child] += 1
            previous = child
            child = sibling[child]
    ready = [0]
    order: list[int] = []
    while ready:
        slot = heapq.heappop(ready)
        order.append(slot)
        for after in successors[slot]:
            blockers[after] -= 1
            if blockers[after] == 0:
                heapq.heappush(ready, after)
    if len(order) != width:
        # A cycle through the sibling lists that the parent pass did not see.
        raise InvalidInputError(
            "retrive_next_sibling", f"row {row}: the lists contain a cycle"
        )
    return order


class TreeChoices(NamedTuple):
    """A static tree from ``tree_choices``, in Medusa's node order (module docstring).

    Attributes:
        choices: the paths sorted as Medusa sorts them; node ``i+1`` is ``choices[i]``.
        parents: ``[N]`` int64, protocol parents (node 0 the root).
        ranks: ``[N]`` int64, node ``i+1``'s top-k rank (``choices[i][-1]``).
        depths: ``[N]`` int64, ``len(choices[i])``.
        source_index: ``[N]`` int64, position in the input list of node ``i+1``'s path.
    """

    choices: list[list[int]]
    parents: torch.Tensor
    ranks: torch.Tensor
    depths: torch.Tensor
    source_index: torch.Tensor


def tree_choices_to_parents(tree_choices: Sequence[Sequence[int]]) -> TreeChoices:
    """``tree_choices`` (Medusa/EAGLE) to protocol parents, in Medusa's sorted node order.

    Args:
        tree_choices: non-empty list of distinct non-empty paths of ranks ``>= 0``, closed
            under taking prefixes.

    Returns:
        :class:`TreeChoices`.

    Raises:
        InvalidInputError: naming ``tree_choices``: empty, a path that is empty, not a list of
            non-negative ints, repeated, or whose proper prefix is missing.
    """
    if isinstance(tree_choices, (str, bytes)) or not isinstance(tree_choices, Sequence):
        raise InvalidInputError("tree_choices", "expected a list of paths (lists of ranks)")
    if len(tree_choices) == 0:
        raise InvalidInputError("tree_choices", "empty: a tree needs at least one drafted node")
    paths: list[tuple[int, ...]] = []
    for position, path in enumerate(tree_choices):
        if isinstance(path, (str, bytes)) or not isinstance(path, Sequence) or len(path) == 0:
            raise InvalidInputError(
                "tree_choices", f"entry {position} ({path!r}) is not a non-empty list of ranks"
            )
        for rank in path:
            if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
                raise InvalidInputError(
                    "tree_choices", f"entry {position} ({list(path)!r}) has a rank that is not "
                    "an int >= 0"
                )
        paths.append(tuple(int(rank) for rank in path))
    seen: dict[tuple[int, ...], int] = {}
    for position, path in enumerate(paths):
        if path in seen:
            raise InvalidInputError(
                "tree_choices", f"path {list(path)} appears twice (entries {seen[path]} and "
                f"{position})"
            )
        seen[path] = position
    for path in paths:
        if len(path) > 1 and path[:-1] not in seen:
            raise InvalidInputError(
                "tree_choices", f"path {list(path)}'s prefix {list(path[:-1])} is missing"
            )
    ordered = sorted(paths, key=lambda path: (len(path), path))
    node_of = {path: i + 1 for i, path in enumerate(ordered)}
    parents = [node_of[path[:-1]] if len(path) > 1 else 0 for path in ordered]
    return TreeChoices(
        [list(path) for path in ordered],
        torch.tensor(parents, dtype=torch.int64),
        torch.tensor([path[-1] for path in ordered], dtype=torch.int64),
        torch.tensor([len(path) for path in ordered], dtype=torch.int64),
        torch.tensor([seen[path] for path in ordered], dtype=torch.int64),
    )


def parents_to_tree_choices(
    parents: torch.Tensor, ranks: torch.Tensor | None = None
) -> list[list[int]]:
    """Protocol parents of one tree to ``tree_choices``, path of node ``j+1`` at position j.

    Args:
        parents: ``[N]`` int64, ``parents[j]`` in ``[0, j]``.
        ranks: ``[N]`` int64 top-k rank of each node among its parent's draft tokens; None:
            the sibling slot in index order (the first child rank 0, the next rank 1, ...: the
            top-k scheme's children in decreasing q). Siblings must have distinct ranks.

    Returns:
        ``N`` paths; :func:`tree_choices_to_parents` of them gives back ``parents`` up to the
        renumbering in its ``source_index``.

    Raises:
        InvalidInputError: naming ``parents`` (type, rank, a parent not before its node) or
            ``ranks`` (shape, negative, two siblings with one rank).
    """
    tree = _int_matrix("parents", parents, rank=1)
    nodes = tree.shape[0]
    if nodes == 0:
        raise InvalidInputError("parents", "N = 0: a tree needs at least one drafted node")
    bad = (tree < 0) | (tree >= torch.arange(1, nodes + 1))
    if bool(bad.any()):
        j = int(torch.nonzero(bad)[0, 0])
        raise InvalidInputError(
            "parents", f"node {j + 1}'s parent {int(tree[j])} is not in [0, {j}]"
        )
    if ranks is None:
        counts = [0] * (nodes + 1)
        rank_list = []
        for parent in tree.tolist():
            rank_list.append(counts[parent])
            counts[parent] += 1
    else:
        given = _int_matrix("ranks", ranks, rank=1)
        if given.shape[0] != nodes:
            raise InvalidInputError("ranks", f"has {given.shape[0]} entries for {nodes} nodes")
        if bool((given < 0).any()):
            raise InvalidInputError("ranks", "negative rank")
        rank_list = given.tolist()
        pairs = list(zip(tree.tolist(), rank_list, strict=True))
        if len(set(pairs)) != len(pairs):
            raise InvalidInputError("ranks", "two siblings share a rank (the same path twice)")
    paths: list[list[int]] = [[]]
    for parent, rank in zip(tree.tolist(), rank_list, strict=True):
        paths.append(paths[parent] + [int(rank)])
    return paths[1:]


class MedusaBuffers(NamedTuple):
    """What Medusa's ``generate_medusa_buffers`` builds, recomputed from protocol parents.

    Attributes:
        medusa_attn_mask: ``[T, T]`` float (1 where node i attends to node j: itself, its
            ancestors, the root), ``T = N + 1`` (Medusa adds two leading unit axes).
        tree_indices: ``[T]`` int64 index of each node's token in ``[root token, head-0
            top-TOPK, head-1 top-TOPK, ...]``.
        medusa_position_ids: ``[T]`` int64 depths.
        retrieve_indices: ``[L, D+1]`` int64 root-to-leaf node paths, ``-1`` padded.
    """

    medusa_attn_mask: torch.Tensor
    tree_indices: torch.Tensor
    medusa_position_ids: torch.Tensor
    retrieve_indices: torch.Tensor


def medusa_buffers(
    tree_choices: Sequence[Sequence[int]], topk: int = MEDUSA_TOPK, per_parent: bool = False
) -> MedusaBuffers:
    """Medusa's buffers for ``tree_choices`` (the conventions of ``generate_medusa_buffers``,
    module docstring), derived from the protocol parents of :func:`tree_choices_to_parents`.

    Args:
        tree_choices: as :func:`tree_choices_to_parents` takes them.
        topk: candidates read per head (Medusa's ``TOPK`` = 10); every rank must be below it.
        per_parent: build EAGLE-1's ``tree_indices`` (one top-TOPK block per distinct parent)
            instead of Medusa's (one block per depth); the other buffers are the same.

    Returns:
        :class:`MedusaBuffers`.

    Raises:
        InvalidInputError: naming ``tree_choices`` (see :func:`tree_choices_to_parents`, or a
            rank ``>= topk``) or ``topk`` (< 1).
    """
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise InvalidInputError("topk", f"must be an int >= 1, got {topk!r}")
    tree = tree_choices_to_parents(tree_choices)
    if bool((tree.ranks >= topk).any()):
        raise InvalidInputError("tree_choices", f"a rank is >= topk = {topk}")
    nodes = tree.parents.shape[0]
    width = nodes + 1
    parent_of = [PLACEHOLDER, *tree.parents.tolist()]
    mask = torch.eye(width)
    mask[:, 0] = 1.0
    for node in range(1, width):
        ancestor = parent_of[node]
        while ancestor > 0:
            mask[node, ancestor] = 1.0
            ancestor = parent_of[ancestor]
    indices = torch.zeros(width, dtype=torch.int64)
    if per_parent:
        group: dict[int, int] = {}
        for parent in tree.parents.tolist():
            group.setdefault(parent, len(group))
        blocks = torch.tensor([group[parent] for parent in tree.parents.tolist()])
    else:
        blocks = tree.depths - 1
    indices[1:] = 1 + topk * blocks + tree.ranks
    positions = torch.zeros(width, dtype=torch.int64)
    positions[1:] = tree.depths
    is_parent = set(parent_of[1:])
    leaves = [node for node in range(width - 1, 0, -1) if node not in is_parent]
    depth = int(tree.depths.max())
    retrieve = torch.full((len(leaves), depth + 1), PLACEHOLDER, dtype=torch.int64)
    for row, leaf in enumerate(leaves):
        path = [leaf]
        while parent_of[path[-1]] > 0:
            path.append(parent_of[path[-1]])
        path.append(0)
        retrieve[row, : len(path)] = torch.tensor(path[::-1])
    return MedusaBuffers(mask, indices, positions, retrieve)


def root_to_leaf_paths(parents: torch.Tensor, *, lexicographic: bool = False) -> torch.Tensor:
    """One tree's root-to-leaf paths, the candidate layout of Medusa and EAGLE.

    Args:
        parents: ``[N]`` int64, validated (``parents[j]`` in ``[0, j]``).
        lexicographic: order the paths by their node ids (EAGLE: every node's children appear
            in index order) instead of by leaf index (Medusa's ``retrieve_indices`` order).

    Returns:
        ``[P, D]`` int64: row i the nodes (1..N) from a child of the root down to a leaf,
        :data:`PLACEHOLDER` after the leaf; D the tree's depth, P its number of leaves.
    """
    parents = parents.long().cpu()
    nodes = parents.numel()
    depth = int(tree_depths(parents.unsqueeze(0)).max())
    has_child = torch.zeros(nodes + 1, dtype=torch.bool)
    has_child[parents] = True
    chains = []
    for leaf in range(1, nodes + 1):
        if bool(has_child[leaf]):
            continue
        chain = []
        node = leaf
        while node != 0:
            chain.append(node)
            node = int(parents[node - 1])
        chains.append(chain[::-1])
    if lexicographic:
        chains.sort()
    paths = torch.full((len(chains), depth), PLACEHOLDER, dtype=torch.int64)
    for row, chain in enumerate(chains):
        paths[row, : len(chain)] = torch.tensor(chain, dtype=torch.int64)
    return paths
