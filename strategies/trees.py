"""Strategies for draft trees: topologies, whole tree cases and greedy tree cases.

Shapes follow the tree protocols of :mod:`losslessness.protocol`: a tree of ``N`` drafted nodes
is its ``parents`` tuple (``parents[j]`` is the parent of node ``j+1`` and is ``< j+1``; node 0
is the root context), ``D`` its depth, ``V`` the vocabulary.

Topologies (:data:`TREE_SHAPES`), every one with at most :data:`MAX_TREE_NODES` nodes, depth at
most :data:`MAX_TREE_DEPTH` and at most :data:`MAX_SIBLINGS` children per node:

``chain``
    ``parents = (0, 1, ..., k-1)``, k in 1..5: the chain protocol seen as a tree.
``star``
    ``n`` children of the root, n in 2..8: multi-draft speculative sampling (SpecTr, Sun et al.
    2023; the multi-draft setting of Chen et al. and of Jeon et al. 2024).
``balanced``
    every node above the last level has ``b`` children (b in 1..8), ``d`` levels.
``eagle``
    EAGLE-2's dynamic tree (Li et al. 2024, "EAGLE-2", section 4): level by level, at most
    ``top_k`` nodes of the last level are expanded, each by 1..``top_k`` children (the
    reranking keeps a prefix of each expansion), nodes numbered level by level.
``medusa``
    Medusa's static ``tree_choices`` (Cai et al. 2024, "Medusa", section 2.1.2): a
    prefix-closed set of paths ``(c_1, .., c_i)`` of top-``w_i`` ranks of head i, numbered as
    Medusa sorts them (by length, then lexicographically); sibling ranks are contiguous from 0.
``random``
    each node's parent any earlier node of depth ``< 5`` with fewer than 8 children.

Every draw is built so that shrinking goes to small trees: sizes and parent choices shrink to
their minimum (a chain of one node, a star of two), and :func:`tree_topologies` draws the shape
from :data:`TREE_SHAPES` in that order (``chain`` first).

:func:`tree_cases` builds :class:`losslessness.cases.TreeCase` s from a topology, a draft scheme
(:data:`losslessness.protocol.DRAFT_SCHEMES`) and a Markov model of p and q per depth and
token whose (p, q) pairs come from :func:`strategies.distributions.target_draft_pairs`'s
relations (``near``, ``far``, ``disjoint``, ``identical`` (p == q), zero masses, ...) over
:data:`strategies.distributions.REGIMES` (``one-hot``, ``sparse``, ``tiny-masses``, ...).
:func:`greedy_tree_cases` builds :class:`losslessness.cases.GreedyTreeCase` s with exact ties,
``-inf`` masks and duplicate sibling tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy
from numpy.typing import NDArray

from losslessness.cases import GreedyTreeCase, TreeCase
from losslessness.protocol import DRAFT_SCHEMES
from strategies._common import (
    batch_window,
    check_choices,
    check_float,
    check_int,
    int_between,
    label,
    quiet,
)
from strategies.cases import GREEDY_MAX_TIES, _greedy_draft
from strategies.distributions import (
    _RELATIONS_NEEDING_TWO_TOKENS,
    REGIMES,
    RELATIONS,
    _draw_pair,
    _normalise,
)
from strategies.logits import DEFAULT_MAX_LOGIT_MAGNITUDE, MAX_LOGIT_MAGNITUDE, draw_logits

__all__ = [
    "MAX_ROW_TYPES",
    "MAX_SIBLINGS",
    "MAX_STAR_DRAFTS",
    "MAX_TREE_DEPTH",
    "MAX_TREE_NODES",
    "SUPPORT_WIDENING_MASS",
    "TREE_SHAPES",
    "TreeTopology",
    "greedy_tree_cases",
    "tree_cases",
    "tree_topologies",
]

TREE_SHAPES: tuple[str, ...] = ("chain", "star", "balanced", "eagle", "medusa", "random")
"""Named topologies (see the module docstring), in shrinking order."""

MAX_TREE_NODES = 32
"""Largest N of a drawn tree."""

MAX_TREE_DEPTH = 5
"""Largest depth D of a drawn tree."""

MAX_SIBLINGS = 8
"""Most children of one node (also the largest multi-draft ``n``)."""

MAX_STAR_DRAFTS = 8
"""Largest ``n`` of a ``star`` (multi-draft with ``n`` drafts); the smallest is 2."""

MAX_EAGLE_TOP_K = 4
"""Largest ``top_k`` of an ``eagle`` tree."""

MAX_MEDUSA_WIDTH = 4
"""Largest top-k width of one Medusa head."""

MAX_ROW_TYPES = 4
"""Distinct (p, q) rows drawn per depth of a tree case: token ``x`` at depth ``d`` uses row
``x mod R_d`` with ``R_d`` in ``[1, min(V, MAX_ROW_TYPES)]`` (shrinks to 1: one law per depth),
so a case costs at most ``1 + D * MAX_ROW_TYPES`` pair draws whatever ``V``."""

SUPPORT_WIDENING_MASS = 0.05
"""Under ``without-replacement`` and ``top-k`` a node with ``m`` children needs ``m`` tokens
with ``q > 0``; a drawn q with fewer gets this much mass (before renormalising) on the missing
tokens, those with ``p == 0`` first (so ``disjoint`` pairs stay disjoint where V allows)."""


@dataclass(frozen=True)
class TreeTopology:
    """A drawn tree topology.

    Attributes:
        shape: one of :data:`TREE_SHAPES`.
        parents: length-N tuple, ``parents[j] < j + 1`` the parent of node ``j+1``.
    """

    shape: str
    parents: tuple[int, ...]

    @property
    def n_nodes(self) -> int:
        """N, the drafted nodes."""
        return len(self.parents)

    @property
    def depths(self) -> tuple[int, ...]:
        """Depth of nodes ``0..N`` (root 0)."""
        depths = [0]
        for parent in self.parents:
            depths.append(depths[parent] + 1)
        return tuple(depths)

    @property
    def depth(self) -> int:
        """D, the deepest node's depth."""
        return max(self.depths)

    @property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Children of nodes ``0..N``, in index order."""
        table: list[list[int]] = [[] for _ in range(self.n_nodes + 1)]
        for j, parent in enumerate(self.parents):
            table[parent].append(j + 1)
        return tuple(tuple(row) for row in table)

    @property
    def max_siblings(self) -> int:
        """Most children of one node."""
        return max(len(row) for row in self.children)

    def describe(self) -> str:
        """The tree as text, ``"root -> 1, 2; 1 -> 3"``."""
        parts = []
        for node, row in enumerate(self.children):
            if row:
                name = "root" if node == 0 else str(node)
                parts.append(f"{name} -> {', '.join(str(child) for child in row)}")
        return "; ".join(parts)


def _star(draw: st.DrawFn, max_siblings: int) -> tuple[int, ...]:
    n = int(draw(st.integers(2, min(MAX_STAR_DRAFTS, max_siblings))))
    return (0,) * n


def _chain(draw: st.DrawFn, max_nodes: int, max_depth: int) -> tuple[int, ...]:
    k = int(draw(st.integers(1, min(max_nodes, max_depth))))
    return tuple(range(k))


def _balanced(
    draw: st.DrawFn, max_nodes: int, max_depth: int, max_siblings: int
) -> tuple[int, ...]:
    branching = int(draw(st.integers(1, min(max_siblings, max_nodes))))
    levels = 1
    while levels < max_depth and sum(branching**i for i in range(1, levels + 2)) <= max_nodes:
        levels += 1
    depth = int(draw(st.integers(1, levels)))
    parents: list[int] = []
    layer = [0]
    for _ in range(depth):
        next_layer = []
        for node in layer:
            for _ in range(branching):
                parents.append(node)
                next_layer.append(len(parents))
        layer = next_layer
    return tuple(parents)


def _eagle(draw: st.DrawFn, max_nodes: int, max_depth: int, max_siblings: int) -> tuple[int, ...]:
    top_k = int(draw(st.integers(1, min(MAX_EAGLE_TOP_K, max_siblings))))
    depth = int(draw(st.integers(1, max_depth)))
    parents: list[int] = [0] * min(top_k, max_nodes)
    layer = list(range(1, len(parents) + 1))
    for _ in range(depth - 1):
        # Expand at most top_k nodes of the last level (those of highest score: a drawn
        # subset), each by a drawn prefix 1..top_k of its top_k candidates.
        n_expanded = int_between(draw, 1, min(top_k, len(layer)))
        expanded = sorted(
            {layer[int_between(draw, 0, len(layer) - 1)] for _ in range(n_expanded)}
        )
        next_layer = []
        for node in expanded:
            for _ in range(int_between(draw, 1, top_k)):
                if len(parents) >= max_nodes:
                    break
                parents.append(node)
                next_layer.append(len(parents))
        if not next_layer:
            break
        layer = next_layer
    return tuple(parents)


def _medusa(draw: st.DrawFn, max_nodes: int, max_depth: int, max_siblings: int) -> tuple[int, ...]:
    heads = int(draw(st.integers(1, max_depth)))
    widths = [int_between(draw, 1, min(MAX_MEDUSA_WIDTH, max_siblings)) for _ in range(heads)]
    # The first head's top choice is always there (Medusa's trees all start with [0]).
    paths: list[tuple[int, ...]] = [(), (0,)]
    used: dict[tuple[int, ...], int] = {(): 1, (0,): 0}
    extra = int_between(draw, 0, max_nodes - 1)
    for _ in range(extra):
        base = paths[int_between(draw, 0, len(paths) - 1)]
        if len(base) >= heads or used[base] >= widths[len(base)]:
            continue
        child = (*base, used[base])
        used[base] += 1
        used[child] = 0
        paths.append(child)
    ordered = sorted(paths[1:], key=lambda path: (len(path), path))
    index = {path: i + 1 for i, path in enumerate(ordered)}
    index[()] = 0
    return tuple(index[path[:-1]] for path in ordered)


def _random(draw: st.DrawFn, max_nodes: int, max_depth: int, max_siblings: int) -> tuple[int, ...]:
    capacity = sum(max_siblings**d for d in range(1, max_depth + 1))
    n = int(draw(st.integers(1, min(max_nodes, capacity))))
    depths = [0]
    counts = [0]
    parents: list[int] = []
    for _ in range(n):
        candidates = [
            node
            for node in range(len(depths))
            if depths[node] < max_depth and counts[node] < max_siblings
        ]
        parent = candidates[int_between(draw, 0, len(candidates) - 1)]
        parents.append(parent)
        counts[parent] += 1
        depths.append(depths[parent] + 1)
        counts.append(0)
    return tuple(parents)


def tree_topologies(
    shapes: Sequence[str] | None = None,
    *,
    max_nodes: int = MAX_TREE_NODES,
    max_depth: int = MAX_TREE_DEPTH,
    max_siblings: int = MAX_SIBLINGS,
) -> SearchStrategy[TreeTopology]:
    """Tree topologies of the named shapes (see the module docstring).

    Each draw reports ``event("tree shape=...")``; the shape is drawn from ``shapes`` in
    :data:`TREE_SHAPES` order, so shrinking tries ``chain`` first, then ``star``.

    Args:
        shapes: names from :data:`TREE_SHAPES`, or None for all (``star`` needs
            ``max_siblings >= 2`` and is left out otherwise).
        max_nodes: largest N, an int in ``[1, MAX_TREE_NODES]``.
        max_depth: largest depth, an int in ``[1, MAX_TREE_DEPTH]``.
        max_siblings: most children of a node, an int in ``[1, MAX_SIBLINGS]``.

    Returns:
        A strategy of :class:`TreeTopology` with ``1 <= N <= max_nodes`` nodes, depth at most
        ``max_depth``, at most ``max_siblings`` children per node (a ``star`` has 2..
        ``min(8, max_siblings)``).

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming ``shapes``, ``max_nodes``,
            ``max_depth`` or ``max_siblings``.
    """
    chosen = check_choices(shapes, "shapes", TREE_SHAPES) or TREE_SHAPES
    nodes = check_int(max_nodes, "max_nodes", 1, MAX_TREE_NODES)
    depth = check_int(max_depth, "max_depth", 1, MAX_TREE_DEPTH)
    siblings = check_int(max_siblings, "max_siblings", 1, MAX_SIBLINGS)
    allowed = tuple(
        shape for shape in chosen if shape != "star" or min(siblings, nodes) >= 2
    ) or ("chain",)

    @st.composite
    def topologies(draw: st.DrawFn) -> TreeTopology:
        shape = draw(st.sampled_from(allowed))
        label(f"tree shape={shape}")
        if shape == "chain":
            parents = _chain(draw, nodes, depth)
        elif shape == "star":
            parents = _star(draw, min(siblings, nodes))
        elif shape == "balanced":
            parents = _balanced(draw, nodes, depth, siblings)
        elif shape == "eagle":
            parents = _eagle(draw, nodes, depth, siblings)
        elif shape == "medusa":
            parents = _medusa(draw, nodes, depth, siblings)
        else:
            parents = _random(draw, nodes, depth, siblings)
        return TreeTopology(shape, parents)

    return topologies()


def _widen_support(
    q: NDArray[np.float64], p: NDArray[np.float64], needed: int
) -> NDArray[np.float64]:
    """q with at least ``needed`` positive tokens (see :data:`SUPPORT_WIDENING_MASS`)."""
    missing = needed - int((q > 0).sum())
    if missing <= 0:
        return q
    zeros = np.flatnonzero(q == 0)
    order = zeros[np.argsort(p[zeros] > 0, kind="stable")][:missing]
    widened = q.copy()
    widened[order] = SUPPORT_WIDENING_MASS
    label("tree: q support widened")
    return _normalise(widened)


@st.composite
def _pair_span(
    draw: st.DrawFn,
    vocab: int,
    needed: int,
    relations: tuple[str, ...],
    regimes: tuple[str, ...],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    p, q = _draw_pair(draw, vocab, None, relations, regimes)
    return p, _widen_support(q, p, needed)


def _scheme_and_topology(
    draw: st.DrawFn,
    schemes: tuple[str, ...],
    shapes: tuple[str, ...],
    max_nodes: int,
    max_vocab: int,
) -> tuple[str, TreeTopology]:
    scheme = draw(st.sampled_from(schemes))
    # Siblings without replacement or top-k need distinct tokens with q > 0.
    siblings = MAX_SIBLINGS if scheme == "iid" else max(1, min(MAX_SIBLINGS, max_vocab))
    topology = draw(tree_topologies(shapes, max_nodes=max_nodes, max_siblings=siblings))
    return scheme, topology


def tree_cases(
    max_vocab: int = 16,
    *,
    min_vocab: int = 1,
    max_nodes: int = MAX_TREE_NODES,
    shapes: Sequence[str] | None = None,
    schemes: Sequence[str] | None = None,
    regimes: Sequence[str] | None = None,
    relations: Sequence[str] | None = None,
    batch_size: int = 64,
) -> SearchStrategy[TreeCase]:
    """Whole tree verifier cases: a draft scheme, a topology and a Markov model of p and q.

    Draws, in order (each shrinking to its first or smallest value): the scheme from
    ``schemes`` (``iid`` first), a topology (:func:`tree_topologies`), ``V`` in
    ``[min_vocab, max_vocab]`` raised to the most children of a node under ``without-replacement``
    and ``top-k``, the root's ``(p, q)`` and, for every depth ``d`` in ``1..D``, ``R_d`` pairs
    (:data:`MAX_ROW_TYPES`; token x uses pair ``x mod R_d``), each pair in one of ``relations``
    over ``regimes`` (:mod:`strategies.distributions`). Under the two schemes that draft
    distinct tokens q's support is widened where it is too small
    (:data:`SUPPORT_WIDENING_MASS`). Under ``iid`` with a small V siblings often repeat a token
    (``V = 2`` and two siblings: with probability ``q_0^2 + q_1^2 >= 1/2``).

    Reports ``event("tree scheme=...")``, ``event("tree shape=...")`` and the regime and
    relation events of its rows.

    Args:
        max_vocab: largest drawn ``V``, an int ``>= 1``.
        min_vocab: smallest drawn ``V``, an int in ``[1, max_vocab]``.
        max_nodes: largest N, an int in ``[1, MAX_TREE_NODES]``.
        shapes: names from :data:`TREE_SHAPES`, or None for all.
        schemes: names from :data:`losslessness.protocol.DRAFT_SCHEMES`, or None for all.
        regimes: names from :data:`strategies.distributions.REGIMES`, or None for all.
        relations: names from :data:`strategies.distributions.RELATIONS`, or None for all
            (those needing two tokens are left out at ``V == 1``).
        batch_size: the cases' ``batch_size`` (trees per verifier call), an int ``>= 1``.

    Returns:
        A strategy of valid :class:`TreeCase` (float64 tables) with ``case_id
        "hypothesis"``, tags ``{shape, scheme}`` and a summary such as
        ``"star N=2 D=1 V=2 iid"``.

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming the first invalid argument.
    """
    vocab_high = check_int(max_vocab, "max_vocab", 1)
    vocab_low = check_int(min_vocab, "min_vocab", 1, vocab_high)
    nodes = check_int(max_nodes, "max_nodes", 1, MAX_TREE_NODES)
    chosen_shapes = check_choices(shapes, "shapes", TREE_SHAPES) or TREE_SHAPES
    chosen_schemes = check_choices(schemes, "schemes", DRAFT_SCHEMES) or DRAFT_SCHEMES
    chosen_regimes = check_choices(regimes, "regimes", REGIMES) or REGIMES
    chosen_relations = check_choices(relations, "relations", RELATIONS) or RELATIONS
    batch = check_int(batch_size, "batch_size", 1)
    if vocab_high < 2 and set(chosen_relations) <= _RELATIONS_NEEDING_TWO_TOKENS:
        raise InvalidArgument(
            f"max_vocab={max_vocab!r} must be at least 2 when every relation in "
            f"{chosen_relations} needs two tokens"
        )

    @st.composite
    def cases(draw: st.DrawFn) -> TreeCase:
        scheme, topology = _scheme_and_topology(
            draw, chosen_schemes, chosen_shapes, nodes, vocab_high
        )
        label(f"tree scheme={scheme}")
        needed = 1 if scheme == "iid" else topology.max_siblings
        vocab = max(int(draw(st.integers(vocab_low, vocab_high))), needed)
        depth = topology.depth
        root_p, root_q = draw(_pair_span(vocab, needed, chosen_relations, chosen_regimes))
        target = np.zeros((depth, vocab, vocab))
        draft = np.zeros((depth, vocab, vocab))
        for d in range(depth):
            row_types = int_between(draw, 1, min(vocab, MAX_ROW_TYPES))
            pairs = [
                draw(_pair_span(vocab, needed, chosen_relations, chosen_regimes))
                for _ in range(row_types)
            ]
            for x in range(vocab):
                target[d, x], draft[d, x] = pairs[x % row_types]
        summary = (
            f"{topology.shape} N={topology.n_nodes} D={depth} V={vocab} {scheme}"
        )
        return TreeCase(
            "hypothesis",
            summary,
            topology.parents,
            torch.from_numpy(root_p),
            torch.from_numpy(root_q),
            torch.from_numpy(target),
            torch.from_numpy(draft),
            scheme,
            batch_size=batch,
            tags=frozenset({topology.shape, scheme}),
        )

    return cases()


@st.composite
def _greedy_tree_row(
    draw: st.DrawFn, topology: TreeTopology, vocab: int, magnitude: float
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """One tree of a greedy case: ``[N+1, V]`` logits, then ``[N]`` tokens, each chosen from
    its parent's logits by :data:`strategies.cases.GREEDY_DRAFT_MODES` (so siblings repeat
    the parent's argmax now and then: duplicate tokens)."""
    logits = np.stack(
        [
            draw_logits(draw, vocab, max_magnitude=magnitude, max_ties=GREEDY_MAX_TIES)
            for _ in range(topology.n_nodes + 1)
        ]
    )
    tokens = np.array(
        [_greedy_draft(draw, logits[parent]) for parent in topology.parents], dtype=np.int64
    )
    return logits, tokens


def _has_duplicate_siblings(parents: tuple[int, ...], tokens: NDArray[np.int64]) -> bool:
    seen = set()
    for parent, token in zip(parents, tokens.tolist(), strict=True):
        if (parent, token) in seen:
            return True
        seen.add((parent, token))
    return False


def greedy_tree_cases(
    max_vocab: int = 16,
    max_batch: int = 4,
    *,
    min_vocab: int = 1,
    max_nodes: int = MAX_TREE_NODES,
    shapes: Sequence[str] | None = None,
    max_logit_magnitude: float = DEFAULT_MAX_LOGIT_MAGNITUDE,
) -> SearchStrategy[GreedyTreeCase]:
    """Greedy tree verifier cases with exact ties, ``-inf`` masks and duplicate siblings.

    One topology (:func:`tree_topologies`) for the whole batch, ``V`` in
    ``[min_vocab, max_vocab]``, ``B`` in ``[1, max_batch]`` (a batch window, so ``B`` shrinks
    to 1 whichever row matters). Every node's logits row is drawn as by
    :func:`strategies.logits.logits_vectors` (1..3 tokens tied at the maximum, masked tokens,
    large magnitudes); every node's token from its parent's row as greedy drafts are
    (:data:`strategies.cases.GREEDY_DRAFT_MODES`: usually the lowest argmax, so paths go deep
    and siblings repeat it; sometimes a tied maximum that is not the lowest; sometimes any
    token). Tags: the shape, ``ties``, ``masked`` and ``duplicates`` where they occur; each
    reports ``event("greedy tree: duplicate siblings")`` when some siblings repeat a token.

    Args:
        max_vocab: largest ``V``, an int ``>= 1``.
        max_batch: largest ``B``, an int ``>= 1``.
        min_vocab: smallest ``V``, an int in ``[1, max_vocab]``.
        max_nodes: largest N, an int in ``[1, MAX_TREE_NODES]``.
        shapes: names from :data:`TREE_SHAPES`, or None for all.
        max_logit_magnitude: bound on ``|logit|`` of finite logits, in ``[1, 2**22]``.

    Returns:
        A strategy of :class:`GreedyTreeCase`: ``target_logits [B, N+1, V]`` float64,
        ``parents`` and ``token_ids`` ``[B, N]`` int64.

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming the first invalid argument.
    """
    vocab_high = check_int(max_vocab, "max_vocab", 1)
    vocab_low = check_int(min_vocab, "min_vocab", 1, vocab_high)
    batch_high = check_int(max_batch, "max_batch", 1)
    nodes = check_int(max_nodes, "max_nodes", 1, MAX_TREE_NODES)
    chosen_shapes = check_choices(shapes, "shapes", TREE_SHAPES) or TREE_SHAPES
    magnitude = check_float(max_logit_magnitude, "max_logit_magnitude", 1.0, MAX_LOGIT_MAGNITUDE)

    @st.composite
    def cases(draw: st.DrawFn) -> GreedyTreeCase:
        topology = draw(tree_topologies(chosen_shapes, max_nodes=nodes))
        vocab = int(draw(st.integers(vocab_low, vocab_high)))
        batch, start = batch_window(draw, batch_high)
        rows = []
        for index in range(start + batch):
            with quiet(index < start):
                rows.append(draw(_greedy_tree_row(topology, vocab, magnitude)))
        rows = rows[start:]
        logits = np.stack([row[0] for row in rows])
        tokens = np.stack([row[1] for row in rows])
        tags = {topology.shape}
        finite = np.where(np.isfinite(logits), logits, -np.inf)
        if ((finite == finite.max(axis=-1, keepdims=True)).sum(axis=-1) > 1).any():
            tags.add("ties")
        if np.isneginf(logits).any():
            tags.add("masked")
        if any(_has_duplicate_siblings(topology.parents, row) for row in tokens):
            tags.add("duplicates")
            label("greedy tree: duplicate siblings")
        parents = torch.tensor(topology.parents, dtype=torch.int64).expand(batch, -1).clone()
        summary = (
            f"{topology.shape} N={topology.n_nodes} D={topology.depth} V={vocab} B={batch}"
        )
        return GreedyTreeCase(
            "hypothesis",
            summary,
            torch.from_numpy(logits),
            parents,
            torch.from_numpy(tokens),
            tags=frozenset(tags),
        )

    return cases()
