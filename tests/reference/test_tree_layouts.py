"""Tree layout conversions (:mod:`losslessness.reference.tree_layouts`) are lossless.

Round trips under Hypothesis (the active profile from ``tests/conftest.py``): protocol parents
-> SGLang linked lists -> parents is the identity; an SGLang layout with its nodes shuffled and
its sibling lists in any order converts to the same tree (isomorphic, with the kernels' sibling
order); parents -> ``tree_choices`` -> parents is the identity up to Medusa's renumbering.
Worked examples from the engines reproduced: the two trees of SGLang's
``sgl-kernel/tests/test_speculative_sampling.py`` (commit 929cdb97) through the reference
greedy verifier give the kernel test's ``predicts``/``accept_index``; Medusa's buffers for
``[[0], [0, 0], [1], [0, 1]]`` as ``generate_medusa_buffers`` (commit 2b898144) computes them.
Bad layouts raise :class:`InvalidInputError` naming the argument.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from losslessness.protocol import InvalidInputError
from losslessness.reference.tree import verify_tree, verify_tree_greedy
from losslessness.reference.tree_layouts import (
    from_sglang,
    medusa_buffers,
    parents_to_tree_choices,
    to_sglang,
    tree_choices_to_parents,
)


@st.composite
def parent_rows(draw: st.DrawFn, max_nodes: int = 12, max_batch: int = 3) -> torch.Tensor:
    """``[B, N]`` int64 protocol parents (``parents[b, j]`` in ``[0, j]``)."""
    nodes = draw(st.integers(1, max_nodes))
    batch = draw(st.integers(1, max_batch))
    rows = [[draw(st.integers(0, j)) for j in range(nodes)] for _ in range(batch)]
    return torch.tensor(rows, dtype=torch.int64)


def _tokens(parents: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, parents.shape, generator=generator)
    roots = torch.randint(0, 50, (parents.shape[0],), generator=generator)
    return ids, roots


def _children(parents: list[int]) -> dict[int, list[int]]:
    table: dict[int, list[int]] = {n: [] for n in range(len(parents) + 1)}
    for j, parent in enumerate(parents):
        table[parent].append(j + 1)
    return table


def _ordered_tree(parents: list[int], tokens: list[int], node: int = 0) -> tuple[object, ...]:
    """The tree below ``node`` as nested tuples (token, children in try order): equal for two
    layouts exactly when they are the same ordered tree."""
    kids = _children(parents)[node]
    return tuple((tokens[child - 1], _ordered_tree(parents, tokens, child)) for child in kids)


@given(parent_rows(), st.integers(0, 2**31))
def test_parents_to_sglang_and_back_is_the_identity(parents: torch.Tensor, seed: int) -> None:
    """to_sglang then from_sglang returns the same parents, tokens and root tokens, slots the
    identity and rows ``b*(N+1)+n``; SGLang's lists link children in increasing slot order."""
    ids, roots = _tokens(parents, seed)
    layout = to_sglang(parents, ids, roots)
    back = from_sglang(*layout)
    assert torch.equal(back.parents, parents)
    assert torch.equal(back.token_ids, ids)
    assert torch.equal(back.root_tokens, roots)
    batch, width = layout.candidates.shape
    assert torch.equal(back.slots, torch.arange(width).expand(batch, width))
    assert torch.equal(back.rows, torch.arange(batch * width).reshape(batch, width))
    for b in range(batch):
        for node, kids in _children(parents[b].tolist()).items():
            walked = []
            child = int(layout.retrive_next_token[b, node])
            while child != -1:
                walked.append(child)
                child = int(layout.retrive_next_sibling[b, child])
            assert walked == kids


@given(parent_rows(max_batch=1), st.integers(0, 2**31))
def test_shuffled_sglang_layout_converts_to_the_same_ordered_tree(
    parents: torch.Tensor, seed: int
) -> None:
    """An SGLang layout whose slots are permuted (root kept at 0) and whose sibling lists are
    in an arbitrary order converts to the same ordered tree (tokens, children in the lists'
    order), with parents before children, and the slots/rows say where each node was."""
    rng = random.Random(seed)
    ids, roots = _tokens(parents, seed)
    nodes = parents.shape[1]
    plist = parents[0].tolist()
    # Random sibling order, then a random slot for every node.
    kids = {n: rng.sample(c, len(c)) for n, c in _children(plist).items()}
    slot_of = [0, *rng.sample(range(1, nodes + 1), nodes)]
    first = [-1] * (nodes + 1)
    sibling = [-1] * (nodes + 1)
    candidates = [int(roots[0])] + [0] * nodes
    for node, children in kids.items():
        if children:
            first[slot_of[node]] = slot_of[children[0]]
        for a, b in itertools.pairwise(children):
            sibling[slot_of[a]] = slot_of[b]
    for node in range(1, nodes + 1):
        candidates[slot_of[node]] = int(ids[0, node - 1])
    index = [100 + 7 * s for s in range(nodes + 1)]
    back = from_sglang(
        torch.tensor([candidates]), torch.tensor([index]), torch.tensor([first]),
        torch.tensor([sibling]),
    )
    expected_tokens = [int(t) for t in ids[0]]
    reordered_parents = [0] * nodes
    for node, children in kids.items():
        for child in children:
            reordered_parents[child - 1] = node

    def ordered(node: int) -> tuple[object, ...]:
        return tuple((expected_tokens[c - 1], ordered(c)) for c in kids[node])

    got = _ordered_tree(back.parents[0].tolist(), back.token_ids[0].tolist())
    assert got == ordered(0)
    assert all(p <= j for j, p in enumerate(back.parents[0].tolist()))
    assert [candidates[s] for s in back.slots[0].tolist()[1:]] == back.token_ids[0].tolist()
    assert back.rows[0].tolist() == [index[s] for s in back.slots[0].tolist()]


@given(parent_rows(max_batch=1), st.integers(0, 2**31))
def test_parents_to_tree_choices_and_back_is_the_identity_up_to_medusa_order(
    parents: torch.Tensor, seed: int
) -> None:
    """parents -> tree_choices (default ranks: sibling slots) -> parents gives the same tree:
    relabelled by ``source_index`` it is the original, and Medusa's order (depth, then
    lexicographic) puts parents first; tree_choices -> parents -> tree_choices is the sorted
    input."""
    plist = parents[0].tolist()
    choices = parents_to_tree_choices(parents[0])
    layout = tree_choices_to_parents(choices)
    original_node = [0] + [int(i) + 1 for i in layout.source_index]
    for i, parent in enumerate(layout.parents.tolist()):
        assert plist[original_node[i + 1] - 1] == original_node[parent]
        assert parent <= i
    assert layout.choices == sorted(choices, key=lambda p: (len(p), p))
    shuffled = random.Random(seed).sample(choices, len(choices))
    again = tree_choices_to_parents(shuffled)
    assert again.choices == layout.choices and torch.equal(again.parents, layout.parents)
    assert parents_to_tree_choices(layout.parents, layout.ranks) == layout.choices
    # In Medusa order with default ranks the conversion is the identity.
    assert parents_to_tree_choices(layout.parents) == layout.choices


def _sglang_kernel_test_layout() -> tuple[torch.Tensor, ...]:
    candidates = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    retrive_index = torch.tensor([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]])
    next_token = torch.tensor([[1, 2, -1, 4, 5, -1], [4, 2, 3, -1, 5, -1]])
    next_sibling = torch.tensor([[-1, 3, -1, -1, -1, -1], [-1, -1, -1, -1, 1, -1]])
    logits = torch.zeros((2, 6, 20), dtype=torch.float64)
    logits[0, 0, 3] = logits[0, 3, 4] = logits[0, 4, 5] = 10
    logits[1, 0, 11] = logits[1, 4, 12] = 10
    for b in range(2):
        for t in range(6):
            if float(logits[b, t].max()) < 10:
                logits[b, t, 18] = 10
    return candidates, retrive_index, next_token, next_sibling, logits


def _kernel_outputs(tree: object, tokens: torch.Tensor, accepted: torch.Tensor) -> tuple[
    list[int], list[list[int]], list[int]
]:
    """SGLang's (predicts, accept_index, accept_token_num) from a protocol TreeOutput."""
    rows = tree.rows  # type: ignore[attr-defined]
    predicts = [-1] * 12
    accept_index = []
    counts = []
    for b in range(2):
        path = [0] + [int(n) for n in accepted[b] if n >= 0]
        flat = [int(rows[b, n]) for n in path]
        emitted = [int(t) for t in tokens[b] if t >= 0]
        for row, token in zip(flat, emitted, strict=True):
            predicts[row] = token
        accept_index.append(flat + [-1] * (4 - len(flat)))
        counts.append(len(path) - 1)
    return predicts, accept_index, counts


def test_sglang_kernel_test_trees_verified_greedily_give_the_kernel_tests_outputs() -> None:
    """The two trees of SGLang's ``test_tree_speculative_sampling_target_only`` (row 1 lists
    the root's children as slot 4 then slot 1), converted and verified by the reference greedy
    tree verifier, give the kernel test's asserted ``predicts``, ``accept_index`` and
    ``accept_token_num``."""
    candidates, index, first, sibling, logits = _sglang_kernel_test_layout()
    tree = from_sglang(candidates, index, first, sibling)
    assert tree.slots.tolist() == [[0, 1, 2, 3, 4, 5], [0, 4, 1, 2, 3, 5]]
    target = logits.gather(1, tree.slots.unsqueeze(-1).expand(-1, -1, 20))
    out = verify_tree_greedy(target, tree.parents, tree.token_ids)
    predicts, accept_index, counts = _kernel_outputs(tree, out.tokens, out.accepted_nodes)
    assert predicts == [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18]
    assert accept_index == [[0, 3, 4, 5], [6, 10, 11, -1]]
    assert counts == [3, 2]


def test_sglang_kernel_test_trees_sampled_top_k_give_the_kernel_tests_outputs() -> None:
    """The same trees at the kernel test's temperature 0.01 (target laws one-hot to within
    e^-1000), sampled by the reference top-k tree verifier (each node's children declared the
    top tokens of a draft law uniform over them), give the kernel test's outputs for any
    seed."""
    candidates, index, first, sibling, logits = _sglang_kernel_test_layout()
    tree = from_sglang(candidates, index, first, sibling)
    target = torch.softmax(logits / 0.01, dim=-1).gather(
        1, tree.slots.unsqueeze(-1).expand(-1, -1, 20)
    )
    draft = torch.zeros_like(target)
    for b in range(2):
        for j, parent in enumerate(tree.parents[b].tolist()):
            draft[b, parent, int(tree.token_ids[b, j])] = 1.0
    draft = draft / draft.sum(-1, keepdim=True).clamp(min=1)
    for seed in range(5):
        out = verify_tree(
            target, draft, tree.parents, tree.token_ids, "top-k",
            torch.Generator().manual_seed(seed),
        )
        predicts, accept_index, counts = _kernel_outputs(tree, out.tokens, out.accepted_nodes)
        assert predicts == [3, -1, -1, 4, 5, 18, 11, -1, -1, -1, 12, 18]
        assert accept_index == [[0, 3, 4, 5], [6, 10, 11, -1]]
        assert counts == [3, 2]


def test_medusa_buffers_of_a_small_tree_match_generate_medusa_buffers() -> None:
    """``[[0], [0, 0], [1], [0, 1]]``: Medusa sorts it to ``[[0], [1], [0, 0], [0, 1]]``; the
    mask, tree indices (TOPK 10), position ids and retrieve indices are the ones
    ``generate_medusa_buffers`` builds (worked by hand from its code)."""
    tree = tree_choices_to_parents([[0], [0, 0], [1], [0, 1]])
    assert tree.choices == [[0], [1], [0, 0], [0, 1]]
    assert tree.parents.tolist() == [0, 0, 1, 1]
    assert tree.source_index.tolist() == [0, 2, 1, 3]
    buffers = medusa_buffers([[0], [0, 0], [1], [0, 1]])
    assert buffers.medusa_attn_mask.tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 0, 1],
    ]
    assert buffers.tree_indices.tolist() == [0, 1, 2, 11, 12]
    assert buffers.medusa_position_ids.tolist() == [0, 1, 1, 2, 2]
    assert buffers.retrieve_indices.tolist() == [[0, 1, 4], [0, 1, 3], [0, 2, -1]]


def test_medusa_buffers_of_a_deeper_tree() -> None:
    """A depth-3 tree: node 5 ([0, 0, 0]) hangs under node 3 ([0, 0]); topk 4."""
    buffers = medusa_buffers([[0], [1], [0, 0], [0, 1], [0, 0, 0]], topk=4)
    assert buffers.tree_indices.tolist() == [0, 1, 2, 5, 6, 9]
    assert buffers.medusa_position_ids.tolist() == [0, 1, 1, 2, 2, 3]
    assert buffers.medusa_attn_mask[5].tolist() == [1, 1, 0, 1, 0, 1]
    assert buffers.retrieve_indices.tolist() == [[0, 1, 3, 5], [0, 1, 4, -1], [0, 2, -1, -1]]


def test_eagle_tree_indices_use_one_top_k_block_per_parent() -> None:
    """EAGLE-1 (``generate_tree_buffers``): ``[[0], [1], [0, 0], [1, 0]]`` puts the two depth-2
    nodes in different blocks (parents [0] and [1]: groups 1 and 2), where Medusa puts them in
    the same depth block; the other buffers are Medusa's."""
    choices = [[0], [1], [0, 0], [1, 0]]
    eagle = medusa_buffers(choices, per_parent=True)
    medusa = medusa_buffers(choices)
    assert eagle.tree_indices.tolist() == [0, 1, 2, 11, 21]
    assert medusa.tree_indices.tolist() == [0, 1, 2, 11, 11]
    assert torch.equal(eagle.medusa_attn_mask, medusa.medusa_attn_mask)
    assert torch.equal(eagle.retrieve_indices, medusa.retrieve_indices)


# EAGLE's mc_sim_7b_63 tree (SafeAILab/EAGLE, eagle/model/choices.py, commit 08dc06cc).
MC_SIM_7B_63 = [
    [0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1],
]


def test_eagle_mc_sim_tree_converts_round_trips_and_has_one_retrieve_row_per_leaf() -> None:
    """EAGLE's 25-node ``mc_sim_7b_63``: already in Medusa order (identity ``source_index``),
    depth 5, its children ranks 0..c-1 (a valid top-k tree), parents -> choices gives it back,
    and the retrieve indices have one row per leaf (15), each a root-to-leaf path."""
    tree = tree_choices_to_parents(MC_SIM_7B_63)
    assert tree.choices == MC_SIM_7B_63
    assert tree.source_index.tolist() == list(range(25))
    assert parents_to_tree_choices(tree.parents) == MC_SIM_7B_63
    siblings: dict[int, list[int]] = {}
    for parent, rank in zip(tree.parents.tolist(), tree.ranks.tolist(), strict=True):
        siblings.setdefault(parent, []).append(rank)
    assert all(ranks == list(range(len(ranks))) for ranks in siblings.values())
    buffers = medusa_buffers(MC_SIM_7B_63)
    plist = [-1, *tree.parents.tolist()]
    leaves = set(range(1, 26)) - set(plist)
    assert len(leaves) == 15 and buffers.retrieve_indices.shape == (15, 6)
    for row in buffers.retrieve_indices.tolist():
        path = [n for n in row if n >= 0]
        assert path[0] == 0 and path[-1] in leaves
        assert all(plist[b] == a for a, b in itertools.pairwise(path))
    assert int(buffers.medusa_attn_mask.sum()) == sum(len(p) + 1 for p in MC_SIM_7B_63) + 1


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: to_sglang(torch.tensor([[1]]), torch.tensor([[0]]), torch.tensor([0])),
         "parents"),
        (lambda: to_sglang(torch.tensor([[0]]), torch.tensor([[0, 1]]), torch.tensor([0])),
         "token_ids"),
        (lambda: to_sglang(torch.tensor([[0]]), torch.tensor([[0]]), torch.tensor([0, 1])),
         "root_tokens"),
        (lambda: to_sglang(torch.tensor([[0.0]]), torch.tensor([[0]]), torch.tensor([0])),
         "parents"),
        (lambda: from_sglang(torch.tensor([[0, 1]]), torch.tensor([[0, 1]]),
                             torch.tensor([[1, -1]]), torch.tensor([[-1, 1]])),
         "retrive_next_sibling"),
        (lambda: from_sglang(torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 2]]),
                             torch.tensor([[1, -1, -1]]), torch.tensor([[-1, -1, -1]])),
         "retrive_next_token"),
        (lambda: from_sglang(torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 2]]),
                             torch.tensor([[1, 2, 1]]), torch.tensor([[-1, -1, -1]])),
         "retrive_next_sibling"),
        (lambda: from_sglang(torch.tensor([[0, 1]]), torch.tensor([[0, 1]]),
                             torch.tensor([[0, -1]]), torch.tensor([[-1, -1]])),
         "retrive_next_token"),
        (lambda: from_sglang(torch.tensor([[0, 1]]), torch.tensor([[0]]),
                             torch.tensor([[1, -1]]), torch.tensor([[-1, -1]])),
         "retrive_index"),
        (lambda: from_sglang(torch.tensor([[0]]), torch.tensor([[0]]),
                             torch.tensor([[-1]]), torch.tensor([[-1]])),
         "candidates"),
        (lambda: tree_choices_to_parents([]), "tree_choices"),
        (lambda: tree_choices_to_parents([[0, 1]]), "tree_choices"),
        (lambda: tree_choices_to_parents([[0], [0]]), "tree_choices"),
        (lambda: tree_choices_to_parents([[0], [-1]]), "tree_choices"),
        (lambda: tree_choices_to_parents([[0], []]), "tree_choices"),
        (lambda: medusa_buffers([[0], [3]], topk=3), "tree_choices"),
        (lambda: medusa_buffers([[0]], topk=0), "topk"),
        (lambda: parents_to_tree_choices(torch.tensor([0, 2])), "parents"),
        (lambda: parents_to_tree_choices(torch.tensor([0, 0]), torch.tensor([1, 1])), "ranks"),
        (lambda: parents_to_tree_choices(torch.tensor([0, 0]), torch.tensor([1])), "ranks"),
    ],
)
def test_bad_layouts_raise_invalid_input_naming_the_argument(call: object, argument: str) -> None:
    """Each malformed layout raises InvalidInputError whose ``argument`` is the culprit."""
    with pytest.raises(InvalidInputError) as caught:
        call()  # type: ignore[operator]
    assert caught.value.argument == argument
