"""Medusa's tree verification (medusa-llm 0.1) through the tree protocols.

The layout tests run everywhere (no medusa import); the others skip unless medusa-llm is
installed (``pip install --no-deps medusa-llm==0.1``, about 2 s).
"""

from __future__ import annotations

from importlib import metadata

import pytest
import torch

from losslessness.adapters import AdapterUnavailable
from losslessness.adapters.medusa import _path_inputs
from losslessness.protocol import InvalidInputError
from losslessness.reference.tree import verify_tree, verify_tree_greedy
from losslessness.reference.tree_layouts import root_to_leaf_paths


def _installed() -> bool:
    try:
        metadata.version("medusa-llm")
    except metadata.PackageNotFoundError:
        return False
    return True


needs_medusa = pytest.mark.skipif(not _installed(), reason="medusa-llm is not installed")


def test_medusa_paths_are_the_root_to_leaf_paths_in_leaf_order() -> None:
    """A tree becomes one path per leaf (leaves in increasing index), each the nodes from the
    root's child down to the leaf, padded with -1."""
    paths = root_to_leaf_paths(torch.tensor([0, 0, 1, 1, 2, 0]))
    assert paths.tolist() == [[1, 3], [1, 4], [2, 5], [6, -1]]


def test_padding_token_is_never_likely_and_repeats_the_leaf_row() -> None:
    """Padding positions hold the extra token V, whose logit is -inf in every row (so neither
    greedy nor typical acceptance can take it), and repeat the leaf's logits; real positions
    hold the path's tokens and their nodes' rows."""
    logits = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    paths = root_to_leaf_paths(torch.tensor([0, 0]))
    path_logits, candidates = _path_inputs(logits, torch.tensor([2, 3]), paths)
    assert candidates.tolist() == [[0, 2], [0, 3]]
    assert path_logits.shape == (2, 2, 5)
    assert bool((path_logits[..., 4] == float("-inf")).all())
    assert torch.equal(path_logits[1, 1, :4], logits[2])
    deep = root_to_leaf_paths(torch.tensor([0, 1, 0]))
    path_logits, candidates = _path_inputs(
        torch.zeros(4, 4, dtype=torch.float64), torch.tensor([1, 2, 3]), deep
    )
    assert candidates.tolist() == [[0, 1, 2], [0, 3, 4]]


def test_missing_medusa_is_unavailable_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without medusa-llm both targets are UNAVAILABLE, giving the install command."""
    from losslessness.adapters import medusa

    monkeypatch.setattr(medusa, "installed_version", lambda name: None)
    for load in (medusa.adapter, medusa.typical_adapter):
        with pytest.raises(AdapterUnavailable, match=r"pip install --no-deps medusa-llm==0\.1"):
            load()


def _distinct_sibling_case(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """48 random 10-node trees over V = 12 whose siblings have distinct tokens (Medusa's
    top-k trees), tied integer logits, masked tokens, and the parent's argmax among the
    children of 70% of the nodes so greedy paths go deep."""
    generator = torch.Generator().manual_seed(seed)
    batch, nodes, vocab = 48, 10, 12
    draws = torch.rand((batch, nodes), generator=generator, dtype=torch.float64)
    parents = (draws * torch.arange(1, nodes + 1)).floor().to(torch.int64)
    logits = torch.randint(0, 3, (batch, nodes + 1, vocab), generator=generator).double()
    masked = torch.rand((batch, nodes + 1, vocab), generator=generator) < 0.25
    masked[..., 0] = False
    logits = logits.masked_fill(masked, float("-inf"))
    best = logits.argmax(dim=-1)
    tokens = torch.zeros((batch, nodes), dtype=torch.int64)
    for b in range(batch):
        for parent in range(nodes + 1):
            children = [j for j in range(nodes) if int(parents[b, j]) == parent]
            if not children:
                continue
            chosen = torch.randperm(vocab, generator=generator)[: len(children)]
            wanted = int(best[b, parent])
            if wanted not in chosen.tolist() and float(torch.rand(1, generator=generator)) < 0.7:
                chosen[int(torch.randint(len(children), (1,), generator=generator))] = wanted
            tokens[b, children] = chosen
    return logits, parents, tokens


@needs_medusa
@pytest.mark.parametrize("seed", [21, 22])
def test_medusa_greedy_tree_equals_reference_with_distinct_siblings(seed: int) -> None:
    """Medusa's evaluate_posterior at temperature 0 (longest path of drafts equal to the
    parent's argmax) and generate_candidates' argmax emit exactly the reference greedy tree
    tokens and accepted nodes on trees with distinct sibling tokens (ties, masked logits)."""
    from losslessness.adapters.medusa import adapter

    greedy_tree = adapter().greedy_tree
    assert greedy_tree is not None
    logits, parents, tokens = _distinct_sibling_case(seed)
    out = greedy_tree(logits, parents, tokens)
    expected = verify_tree_greedy(logits, parents, tokens)
    assert bool((expected.accepted_nodes[:, 1] >= 0).any())
    assert torch.equal(out.tokens, expected.tokens)
    assert torch.equal(out.accepted_nodes, expected.accepted_nodes)


@needs_medusa
def test_medusa_greedy_keeps_the_deepest_of_repeated_siblings() -> None:
    """With two root children repeating the argmax token, the reference keeps the
    lowest-index one (node 1, a leaf) while Medusa keeps the longest accepted path (through
    node 2, whose child also matches): a documented difference of tie rules, not of tokens
    along the kept path."""
    from losslessness.adapters.medusa import adapter

    greedy_tree = adapter().greedy_tree
    assert greedy_tree is not None
    logits = torch.tensor([[[0.0, 5.0, 0.0], [9.0, 0.0, 0.0], [0.0, 0.0, 7.0],
                            [3.0, 0.0, 0.0]]])
    parents = torch.tensor([[0, 0, 2]])
    tokens = torch.tensor([[1, 1, 2]])
    out = greedy_tree(logits, parents, tokens)
    expected = verify_tree_greedy(logits, parents, tokens)
    assert expected.tokens.tolist() == [[1, 0, -1]]
    assert out.tokens.tolist() == [[1, 2, 0]]
    assert out.accepted_nodes.tolist() == [[2, 3]]


def _star_inputs(batch: int) -> tuple[torch.Tensor, ...]:
    """A root with three top-k children (tokens 0, 1, 2 of q) and the same p at every node,
    under which every child is typical (p(x) >= 0.2 > min(0.09, 0.3 exp(-H(p))) = 0.076)."""
    target = torch.tensor([0.3, 0.25, 0.25, 0.2], dtype=torch.float64).repeat(batch, 4, 1)
    draft = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64).repeat(batch, 4, 1)
    parents = torch.zeros((batch, 3), dtype=torch.int64)
    tokens = torch.tensor([0, 1, 2]).repeat(batch, 1)
    return target, draft, parents, tokens


@needs_medusa
def test_medusa_typical_acceptance_emits_the_argmax_not_a_sample_of_p() -> None:
    """Medusa's typical acceptance is deterministic: on the same inputs every row emits the
    same token (here the root's argmax after accepting the typical draft 0), where the
    lossless reference emits tokens following p; it refuses schemes other than top-k."""
    from losslessness.adapters.medusa import typical_adapter

    tree = typical_adapter().tree
    assert tree is not None
    target, draft, parents, tokens = _star_inputs(120)
    out = tree(target, draft, parents, tokens, "top-k", torch.Generator().manual_seed(1))
    assert out.tokens[:, 0].unique().numel() == 1
    reference = verify_tree(target, draft, parents, tokens, "top-k",
                            torch.Generator().manual_seed(1))
    assert reference.tokens[:, 0].unique().numel() == 4
    with pytest.raises(InvalidInputError, match="draft_scheme"):
        tree(target, draft, parents, tokens, "iid", torch.Generator().manual_seed(1))
