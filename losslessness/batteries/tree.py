"""The tree battery of the default audit: tree and multi-draft cases for every draft scheme,
and greedy tree cases (issue 11).

Mostly small and fast (N <= 14, V <= 8, so the exact laws enumerate): per draft scheme
(``iid``, ``without-replacement``, ``top-k``) a chain written as a
tree, a star (multi-draft speculative sampling: 2 iid drafts, 4 without replacement, the top
8), a balanced binary tree of depth 3, an EAGLE-like dynamic shape (wide near the root,
narrowing with depth; Li et al. 2024, EAGLE-2), a Medusa-like static tree (Cai et al. 2024,
Medusa's sparse tree of top-k heads), a case whose p has exact zeros where q is positive; for
``iid``, duplicates-heavy cases at V = 2 and 3 (siblings repeat tokens). Greedy tree cases
(V <= 16): ties at the maximum, masked (``-inf``) logits and duplicate sibling tokens.

Two cases at a language model's scale, V = :data:`LM_VOCAB` (1024), with softmax-of-random-
logits laws whose tail outside the top 10 holds about a third of the mass: a star of 4 i.i.d.
drafts and the EAGLE-like top-k tree (issue 21: a verifier sampling the residual among the
target's top 10 only is exact at V <= 10 and passed every small case). Their exact laws do
not enumerate for i.i.d. drafts (``tree.acceptance`` is SKIPPED there); ``tree.law`` identity-
tests the root and the classes the pilot reaches often, with the cells of small expected count
pooled (:func:`losslessness.stats.identity_test`, as the chain checks do), at the CI cap of
:data:`TREE_CI_MAX_STEPS` trees: minimum detectable TV about 0.19 at the roots and 0.32 at the
star's depth-1 class (design power 0.9, default alpha); the top-10 residual moves the root's
law by more than 0.3 on both. Every case is built from :data:`TREE_BATTERY_SEED`, so its hash
is the same everywhere.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch

from losslessness.batteries.builders import (
    batched_parents,
    markov_tables,
    softmax_markov_tables,
    tree_depth,
)
from losslessness.cases import GreedyTreeCase, TreeCase
from losslessness.protocol import DRAFT_SCHEMES

TREE_BATTERY_SEED = 20230518
"""Seed of the tree battery's construction (SpecInfer's first arXiv version, 2023-05-16,
plus two)."""

TREE_BATCH = 512
"""Trees per verifier call of the battery's tree cases."""

TREE_CI_MAX_STEPS = 8192
"""Cap on the trees per case of the CI plan (step multiplier 1), so that the default audit stays
fast; results of a capped case state the larger minimum detectable TV they reach, and
``--budget`` (the step multiplier) scales the trees like every other case's steps."""

CHAIN = (0, 1, 2)
BINARY_DEPTH_3 = (0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6)
EAGLE_LIKE = (0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 5, 5, 11)
"""Wide near the root, narrowing with depth (the shape EAGLE-2's dynamic trees take: the
root's top-4, three then two then one grandchildren, two and then one deeper)."""
MEDUSA_LIKE = (0, 0, 0, 1, 1, 2, 2, 4)
"""A sparse static tree of top-k heads (Medusa's shape in miniature: top-3 of head 1, top-2 of
head 2 under its two best, top-1 of head 3 under the best)."""


def _tree_case(
    rng: np.random.Generator,
    case_id: str,
    shape_name: str,
    parents: tuple[int, ...],
    scheme: str,
    vocab: int,
    closeness: float = 0.6,
    zeros: int = 0,
    tags: frozenset[str] = frozenset(),
) -> TreeCase:
    root_p, root_q, target, draft = markov_tables(rng, vocab, tree_depth(parents), closeness, zeros)
    extra = f", {zeros} zero-mass tokens per p row" if zeros else ""
    summary = f"{shape_name} N={len(parents)} V={vocab} {scheme}{extra}"
    return TreeCase(
        case_id, summary, parents, root_p, root_q, target, draft, scheme, TREE_BATCH,
        frozenset({shape_name.split()[0], scheme, *tags}),
    )


def default_tree_battery() -> list[TreeCase]:
    """The tree-verifier battery of the default audit (deterministic).

    Returns:
        :class:`TreeCase` objects, ids ``tree-<shape>-<scheme>``.
    """
    return list(_default_tree_battery())


@functools.cache
def _default_tree_battery() -> tuple[TreeCase, ...]:
    """Built once per process (cases are immutable; targets get copies of their tensors)."""
    rng = np.random.default_rng(TREE_BATTERY_SEED)
    short = {"iid": "iid", "without-replacement": "wor", "top-k": "topk"}
    cases = []
    stars = {"iid": 2, "without-replacement": 4, "top-k": 8}
    for scheme in DRAFT_SCHEMES:
        name = short[scheme]
        n_star = stars[scheme]
        cases += [
            _tree_case(rng, f"tree-chain-{name}", "chain", CHAIN, scheme, 4),
            _tree_case(rng, f"tree-star{n_star}-{name}", f"star of {n_star}", (0,) * n_star,
                       scheme, 8, 0.4),
            _tree_case(rng, f"tree-binary-{name}", "binary depth 3", BINARY_DEPTH_3, scheme, 4),
            _tree_case(rng, f"tree-eagle-{name}", "EAGLE-like dynamic", EAGLE_LIKE, scheme, 4),
            _tree_case(rng, f"tree-medusa-{name}", "Medusa-like static", MEDUSA_LIKE, scheme, 4),
            _tree_case(rng, f"tree-zeros-{name}", "star of 3 then chain", (0, 0, 0, 1), scheme,
                       6, zeros=2, tags=frozenset({"zeros"})),
        ]
    cases += [
        _tree_case(rng, "tree-dup-v2-iid", "star of 4, duplicates", (0,) * 4, "iid", 2,
                   tags=frozenset({"duplicates"})),
        _tree_case(rng, "tree-dup-v3-iid", "binary depth 2, duplicates", (0, 0, 1, 1, 2, 2),
                   "iid", 3, tags=frozenset({"duplicates"})),
    ]
    cases += _vocab_cases(LM_VOCAB)
    return tuple(cases)


LM_VOCAB = 1024
"""V of the battery's language-model-like tree cases: large enough that the tokens outside the
target's top 10 hold real mass (a verifier that samples the residual among the top 10 only
is lossy there; at V <= 10 it is exact), small enough that a ``[D, V, V]`` Markov table costs
8 MB per depth."""

LM_LOGIT_SCALE = 3.0
"""sd of the target's logits (:func:`~losslessness.batteries.builders.softmax_markov_tables`):
at V = 1024 the top token holds about 0.25, the tokens outside the top 10 about 0.37."""

LM_DRAFT_NOISE = 1.5
"""sd of the noise between the target's and the draft's logits: q differs from p enough that
siblings are often rejected and the residual is drawn."""

LM_SHAPES: tuple[tuple[str, str, tuple[int, ...], str], ...] = (
    ("star4", "star of 4", (0,) * 4, "iid"),
    ("eagle", "EAGLE-like dynamic", EAGLE_LIKE, "top-k"),
)
"""The language-model-like cases (id part, shape, parents, scheme): multi-draft sampling with
i.i.d. drafts (EAGLE-style sampled drafting, SpecInfer's multi-step rule) and EAGLE-2's dynamic
top-k tree."""


TABLE_CELLS = 1 << 18
"""Cells of one depth of a Markov table of :func:`tree_cases_at_vocab` (2 MB of float64): the
table rows per depth are ``max(1, min(V, TABLE_CELLS // V))`` (256 rows at V = 1024, one row,
p depending on the depth only, at V >= 262144 / 2), token x on row ``x mod rows``."""

CALL_CELLS = 1 << 22
"""Largest ``trees x (N+1) x V`` of one verifier call of :func:`tree_cases_at_vocab` (32 MB
per float64 tensor): its trees per call are ``min(TREE_BATCH, CALL_CELLS // ((N+1) V))``, at
least 2 (the independence test needs two trees in a call)."""


def trees_per_call(parents: tuple[int, ...], vocab_size: int) -> int:
    """Trees per verifier call of a sampled tree case at ``vocab_size``: ``min(TREE_BATCH,
    CALL_CELLS // ((N+1) V))``, at least 2 (:data:`CALL_CELLS`)."""
    return max(2, min(TREE_BATCH, CALL_CELLS // ((len(parents) + 1) * vocab_size)))

VOCAB_SHAPES: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("chain", "chain", CHAIN),
    ("star4", "star of 4", (0,) * 4),
    ("binary", "binary depth 3", BINARY_DEPTH_3),
    ("eagle", "EAGLE-like dynamic", EAGLE_LIKE),
    ("medusa", "Medusa-like static", MEDUSA_LIKE),
)
"""The shapes :func:`tree_cases_at_vocab` rebuilds under every draft scheme."""


def tree_cases_at_vocab(vocab_size: int) -> list[TreeCase]:
    """The battery's sampled tree shapes rebuilt at a user's vocabulary (``--vocab-size``).

    Every shape of :data:`VOCAB_SHAPES` under every draft scheme, with the language-model-like
    laws of the battery's V = 1024 cases (softmax of random logits,
    :func:`~losslessness.batteries.builders.softmax_markov_tables`), tables of
    ``min(V, TABLE_CELLS // V)`` rows per depth shared by tokens (``token_rows``: x mod rows),
    so V = 152k needs about 2 MB per depth and table, and :data:`CALL_CELLS`-bounded verifier
    calls. Deterministic (seeded from :data:`TREE_BATTERY_SEED` and V).

    Args:
        vocab_size: V >= 4 (the largest sibling group, drafted without replacement, needs 4
            distinct tokens).

    Returns:
        15 :class:`TreeCase` objects, ids ``tree-<shape>-v<V>-<scheme>``.

    Raises:
        ValueError: ``vocab_size`` < 4 (named in the message).
    """
    if vocab_size < 4:
        raise ValueError(f"vocab_size: must be >= 4 (4 siblings without replacement), got "
                         f"{vocab_size}")
    rng = np.random.default_rng([TREE_BATTERY_SEED, vocab_size])
    rows = max(1, min(vocab_size, TABLE_CELLS // vocab_size))
    token_rows = torch.arange(vocab_size, dtype=torch.int64) % rows
    short = {"iid": "iid", "without-replacement": "wor", "top-k": "topk"}
    cases = []
    for scheme in DRAFT_SCHEMES:
        for name, shape, parents in VOCAB_SHAPES:
            root_p, root_q, target, draft = softmax_markov_tables(
                rng, vocab_size, tree_depth(parents), LM_LOGIT_SCALE, LM_DRAFT_NOISE, rows
            )
            batch = trees_per_call(parents, vocab_size)
            cases.append(TreeCase(
                f"tree-{name}-v{vocab_size}-{short[scheme]}",
                f"{shape} N={len(parents)} V={vocab_size} {scheme}, softmax of random logits "
                f"({rows} table rows per depth), {batch} trees per call",
                parents, root_p, root_q, target, draft, scheme, batch,
                frozenset({shape.split()[0], scheme, "vocab"}), token_rows,
            ))
    return cases


def tree_case_in_dtype(case: TreeCase, dtype: torch.dtype) -> TreeCase:
    """``case`` with its p and q given to the verifier in ``dtype`` (``--dtype``).

    The tables are rounded to ``dtype`` and kept in float64, so the verifier receives exactly
    the case's values and the exact laws (class p, reach probabilities) are computed from them
    in float64: a correct verifier stays LOSSLESS, whatever the rounding did to the rows (a
    float32 row of a normalised float64 row sums to 1 within about V * 6e-8).

    Args:
        case: a tree case (float64 inputs).
        dtype: ``torch.float32`` or ``torch.float64`` (the case itself).

    Returns:
        A :class:`TreeCase` with id ``<id>-float32`` and :attr:`TreeCase.input_dtype` ``dtype``.

    Raises:
        InvalidInputError: ``dtype`` other than float32 and float64 (``input_dtype``); bfloat16
            rows miss the protocol's row-sum tolerance (1e-5) by orders of magnitude.
    """
    if dtype == torch.float64:
        return case
    def rounded(table: torch.Tensor) -> torch.Tensor:
        return table.to(dtype).to(torch.float64)
    return dataclasses.replace(
        case,
        case_id=f"{case.case_id}-{str(dtype).removeprefix('torch.')}",
        root_target=rounded(case.root_target),
        root_draft=rounded(case.root_draft),
        target_table=rounded(case.target_table),
        draft_table=rounded(case.draft_table),
        input_dtype=dtype,
    )


def _vocab_cases(vocab: int) -> list[TreeCase]:
    """The language-model-like sampled tree cases at V = ``vocab`` (ids ``tree-<shape>-v<V>-
    <scheme>``), built from their own generator so the small cases do not depend on them."""
    rng = np.random.default_rng(TREE_BATTERY_SEED + 2)
    short = {"iid": "iid", "without-replacement": "wor", "top-k": "topk"}
    cases = []
    for name, shape, parents, scheme in LM_SHAPES:
        root_p, root_q, target, draft = softmax_markov_tables(
            rng, vocab, tree_depth(parents), LM_LOGIT_SCALE, LM_DRAFT_NOISE
        )
        cases.append(TreeCase(
            f"tree-{name}-v{vocab}-{short[scheme]}",
            f"{shape} N={len(parents)} V={vocab} {scheme}, softmax of random logits (LM-like)",
            parents, root_p, root_q, target, draft, scheme, TREE_BATCH,
            frozenset({shape.split()[0], scheme, "vocab"}),
        ))
    return cases


def _greedy_tree_case(
    rng: np.random.Generator,
    case_id: str,
    summary: str,
    parents: tuple[int, ...],
    vocab: int,
    batch: int,
    tie_levels: int,
    masked: float,
    follow: float,
    tags: frozenset[str],
) -> GreedyTreeCase:
    """Logits on ``tie_levels`` integer levels (ties at the maximum), a share ``masked`` of
    cells ``-inf`` (never a whole row), and trees whose tokens are the argmax of their parent's
    row with probability ``follow`` (so paths go deep), duplicates allowed."""
    nodes = len(parents)
    logits = rng.integers(0, tie_levels, size=(batch, nodes + 1, vocab)).astype(np.float64)
    mask = rng.random(logits.shape) < masked
    mask[..., 0] &= ~mask.all(axis=-1)
    logits[mask] = -np.inf
    tokens = np.empty((batch, nodes), dtype=np.int64)
    for j, parent in enumerate(parents):
        best = logits[:, parent].argmax(axis=-1)
        random = rng.integers(0, vocab, size=batch)
        tokens[:, j] = np.where(rng.random(batch) < follow, best, random)
    return GreedyTreeCase(
        case_id,
        summary,
        torch.from_numpy(logits),
        batched_parents(parents, batch),
        torch.from_numpy(tokens),
        tags,
    )


def default_greedy_tree_battery() -> list[GreedyTreeCase]:
    """The greedy-tree-verifier battery of the default audit (deterministic).

    Returns:
        :class:`GreedyTreeCase` objects: ties at the maximum, masked logits, duplicate sibling
        tokens, on the battery's shapes.
    """
    return list(_default_greedy_tree_battery())


@functools.cache
def _default_greedy_tree_battery() -> tuple[GreedyTreeCase, ...]:
    """Built once per process (cases are immutable; targets get copies of their tensors)."""
    rng = np.random.default_rng(TREE_BATTERY_SEED + 1)
    return (
        _greedy_tree_case(rng, "greedy-tree-ties", "binary depth 3, V=8, 3-level logits (ties)",
                          BINARY_DEPTH_3, 8, 128, 3, 0.0, 0.7, frozenset({"ties"})),
        _greedy_tree_case(rng, "greedy-tree-masked", "EAGLE-like, V=16, 40% -inf logits",
                          EAGLE_LIKE, 16, 128, 50, 0.4, 0.6, frozenset({"masked"})),
        _greedy_tree_case(rng, "greedy-tree-duplicates", "star of 4 then chains, V=3, duplicate "
                          "siblings, ties", (0, 0, 0, 0, 1, 2, 5), 3, 128, 2, 0.2, 0.8,
                          frozenset({"duplicates", "ties", "masked"})),
    )
