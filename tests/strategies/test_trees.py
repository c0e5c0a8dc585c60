"""Tree strategies: every drawn case is valid, each named topology has the shape it claims,
duplicate siblings occur under ``iid`` at small V, and shrinking reaches small trees and V."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, find, given, settings
from hypothesis.errors import InvalidArgument

from losslessness.cases import GreedyTreeCase, TreeCase
from losslessness.protocol import DRAFT_SCHEMES, validate_tree_inputs
from strategies.coverage import label_frequencies
from strategies.trees import (
    MAX_SIBLINGS,
    MAX_TREE_DEPTH,
    MAX_TREE_NODES,
    TREE_SHAPES,
    TreeTopology,
    greedy_tree_cases,
    tree_cases,
    tree_topologies,
)

FAST = settings(max_examples=30, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


def _has_duplicate_siblings(parents: tuple[int, ...], tokens: list[int]) -> bool:
    pairs = list(zip(parents, tokens, strict=True))
    return len(set(pairs)) < len(pairs)


@pytest.mark.parametrize("scheme", DRAFT_SCHEMES)
def test_every_tree_case_validates_and_its_drafts_are_valid_inputs(scheme: str) -> None:
    """Each drawn TreeCase passes its own validation, and a batch of trees drafted from it is
    a valid tree verifier input for its scheme (distinct siblings, top-k siblings, q > 0)."""

    @FAST
    @given(tree_cases(schemes=(scheme,)))
    def check(case: TreeCase) -> None:
        assert case.draft_scheme == scheme
        assert 1 <= case.n_nodes <= MAX_TREE_NODES and 1 <= case.depth <= MAX_TREE_DEPTH
        ids = case.draw_trees(16, torch.Generator().manual_seed(1))
        target, draft = case.inputs(ids)
        parents = case.parents_tensor.expand(16, -1)
        assert validate_tree_inputs(target, draft, parents, ids, scheme) == (
            16, case.n_nodes, case.vocab_size)

    check()


def _is_balanced(topology: TreeTopology) -> bool:
    widths = {len(row) for row in topology.children if row}
    leaf_depths = {
        topology.depths[node] for node, row in enumerate(topology.children) if not row
    }
    return len(widths) == 1 and len(leaf_depths) == 1


@pytest.mark.parametrize("shape", TREE_SHAPES)
def test_each_topology_has_the_shape_it_claims(shape: str) -> None:
    """chain: (0, 1, .., k-1) with k <= 5; star: n in 2..8 children of the root; balanced:
    every inner node has the same number of children and every leaf the same depth; eagle and
    medusa: nodes numbered level by level, at most 4 children each; every shape within 32
    nodes, depth 5 and 8 children per node."""

    @FAST
    @given(tree_topologies((shape,)))
    def check(topology: TreeTopology) -> None:
        parents, depths = topology.parents, topology.depths
        assert topology.shape == shape
        assert all(0 <= parent <= j for j, parent in enumerate(parents))
        assert topology.n_nodes <= MAX_TREE_NODES and topology.depth <= MAX_TREE_DEPTH
        assert topology.max_siblings <= MAX_SIBLINGS
        if shape == "chain":
            assert parents == tuple(range(len(parents))) and len(parents) <= 5
        elif shape == "star":
            assert set(parents) == {0} and 2 <= len(parents) <= 8
        elif shape == "balanced":
            assert _is_balanced(topology)
        elif shape in ("eagle", "medusa"):
            assert list(depths[1:]) == sorted(depths[1:])
            assert topology.max_siblings <= 4

    check()


def test_every_shape_is_reached() -> None:
    """Unrestricted topologies reach every shape of TREE_SHAPES."""
    frequencies = label_frequencies(tree_topologies(), examples=120)
    for shape in TREE_SHAPES:
        assert frequencies.examples_with[f"tree shape={shape}"] > 0, shape


def test_duplicate_siblings_occur_under_iid_at_small_vocab() -> None:
    """With V <= 3 and iid siblings every multi-draft case repeats a sibling token in some of
    64 drafted trees (each tree of n >= 2 siblings repeats one with probability >= 1/3)."""

    @FAST
    @given(tree_cases(3, schemes=("iid",), shapes=("star",)))
    def check(case: TreeCase) -> None:
        ids = case.draw_trees(64, torch.Generator().manual_seed(2))
        assert any(_has_duplicate_siblings(case.parents, row) for row in ids.tolist())

    check()


def test_tree_cases_shrink_to_the_smallest_multi_draft_tree() -> None:
    """The minimal case with a node of two children is the star (0, 0) with V = 1 under iid
    and V = 2 under top-k (which needs two tokens of positive q)."""

    def siblings(case: TreeCase) -> bool:
        return max(torch.bincount(case.parents_tensor).tolist()) >= 2

    iid = find(tree_cases(), siblings, settings=settings(database=None, max_examples=500))
    assert iid.parents == (0, 0) and iid.vocab_size == 1 and iid.draft_scheme == "iid"
    top_k = find(tree_cases(schemes=("top-k",)), siblings,
                 settings=settings(database=None, max_examples=500))
    assert top_k.parents == (0, 0) and top_k.vocab_size == 2


def test_greedy_tree_cases_have_ties_masks_and_duplicate_siblings() -> None:
    """Greedy tree cases validate and reach exact ties, -inf masks and duplicate siblings."""
    frequencies = label_frequencies(greedy_tree_cases(3), examples=60)
    for name in ("greedy tree: duplicate siblings", "logits: tied maximum",
                 "logits: -inf masked"):
        assert frequencies.examples_with[name] > 0, name

    @FAST
    @given(greedy_tree_cases())
    def check(case: GreedyTreeCase) -> None:
        batch, nodes = case.parents.shape
        assert case.target_logits.shape[:2] == (batch, nodes + 1)
        assert ("duplicates" in case.tags) == any(
            _has_duplicate_siblings(tuple(p), t)
            for p, t in zip(case.parents.tolist(), case.token_ids.tolist(), strict=True)
        )

    check()


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: tree_topologies(("ring",)), "shapes"),
        (lambda: tree_topologies(max_nodes=33), "max_nodes"),
        (lambda: tree_topologies(max_depth=0), "max_depth"),
        (lambda: tree_cases(0), "max_vocab"),
        (lambda: tree_cases(schemes=("beam",)), "schemes"),
        (lambda: tree_cases(batch_size=0), "batch_size"),
        (lambda: greedy_tree_cases(max_batch=0), "max_batch"),
    ],
)
def test_bad_arguments_are_rejected_eagerly(call: object, argument: str) -> None:
    """Invalid arguments raise InvalidArgument naming the argument when the strategy is made."""
    with pytest.raises(InvalidArgument, match=argument):
        call()  # type: ignore[operator]
