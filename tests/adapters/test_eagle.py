"""EAGLE's tree verification (eagle-llm 1.2.1) through the tree protocols.

The layout tests run everywhere (no eagle import); the others skip unless eagle-llm is
installed (``pip install --no-deps eagle-llm==1.2.1``, about 2 s; it needs transformers).
"""

from __future__ import annotations

import random
from importlib import metadata

import pytest
import torch

from losslessness.adapters import AdapterUnavailable
from losslessness.adapters.eagle import _drawn_probabilities
from losslessness.protocol import InvalidInputError
from losslessness.reference.tree import verify_tree_greedy
from losslessness.reference.tree_layouts import root_to_leaf_paths
from tests.adapters.test_medusa import _distinct_sibling_case


def _installed() -> bool:
    try:
        metadata.version("eagle-llm")
    except metadata.PackageNotFoundError:
        return False
    return True


needs_eagle = pytest.mark.skipif(not _installed(), reason="eagle-llm is not installed")


def test_eagle_paths_list_children_in_index_order() -> None:
    """Paths are sorted lexicographically by node ids, so a node's children appear in index
    order even when a later child is a leaf and an earlier one has a deep subtree."""
    paths = root_to_leaf_paths(torch.tensor([0, 0, 1]), lexicographic=True)
    assert paths.tolist() == [[1, 3], [2, -1]]
    assert root_to_leaf_paths(torch.tensor([0, 0, 1, 1, 2, 0]), lexicographic=True).tolist() == [
        [1, 3], [1, 4], [2, 5], [6, -1]
    ]


def test_drawn_probabilities_follow_sampling_without_replacement() -> None:
    """Sibling i's probability given the earlier ones is q(x_i) / (1 - their q), as EAGLE's
    draft computes it; a node's first child gets q(x)."""
    draft = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]], dtype=torch.float64)
    drawn = _drawn_probabilities(draft, torch.tensor([0, 0, 1]), torch.tensor([0, 1, 2]))
    assert torch.allclose(drawn, torch.tensor([1.0, 0.5, 0.6, 0.8], dtype=torch.float64))


def test_missing_eagle_is_unavailable_with_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without eagle-llm the target is UNAVAILABLE, giving the install command."""
    from losslessness.adapters import eagle

    monkeypatch.setattr(eagle, "installed_version", lambda name: None)
    with pytest.raises(AdapterUnavailable, match=r"pip install --no-deps eagle-llm==1\.2\.1"):
        eagle.adapter()


@needs_eagle
def test_eagle_greedy_tree_equals_reference_with_distinct_siblings() -> None:
    """EAGLE's evaluate_posterior without a logits processor, then the argmax of the logits it
    returns, emits the reference greedy tree tokens and accepted nodes (distinct siblings,
    ties, masked logits)."""
    from losslessness.adapters.eagle import adapter

    greedy_tree = adapter().greedy_tree
    assert greedy_tree is not None
    logits, parents, tokens = _distinct_sibling_case(23)
    out = greedy_tree(logits, parents, tokens)
    expected = verify_tree_greedy(logits, parents, tokens)
    assert torch.equal(out.tokens, expected.tokens)
    assert torch.equal(out.accepted_nodes, expected.accepted_nodes)


def _wr_inputs(batch: int, target_equals_draft: bool) -> tuple[torch.Tensor, ...]:
    """A root with two children (tokens 1, 2) and node 1 with one child (token 0), drawn
    without replacement from q; p equals q, or puts no mass on any drafted token."""
    q = torch.tensor([0.1, 0.5, 0.4], dtype=torch.float64)
    p = q.clone() if target_equals_draft else torch.tensor([0.0, 0.0, 1.0]).double()
    target = p.repeat(batch, 4, 1)
    if not target_equals_draft:
        target[:, 0] = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    draft = q.repeat(batch, 4, 1)
    parents = torch.tensor([0, 0, 1]).repeat(batch, 1)
    tokens = torch.tensor([1, 2, 0]).repeat(batch, 1)
    return target, draft, parents, tokens


@needs_eagle
def test_eagle_tree_sampler_accepts_every_first_child_when_p_equals_q() -> None:
    """Recursive rejection sampling accepts a first child with probability min(1, p/q) = 1
    when the target equals the draft, at every level; when p gives the drafted tokens no
    mass, nothing is accepted and the final token is p's only token. Python's random state
    is left as it was."""
    from losslessness.adapters.eagle import adapter

    tree = adapter().tree
    assert tree is not None
    state = random.getstate()
    out = tree(*_wr_inputs(40, True), "without-replacement", torch.Generator().manual_seed(1))
    assert random.getstate() == state
    assert bool((out.accepted_nodes == torch.tensor([1, 3])).all())
    assert bool((out.tokens[:, :2] == torch.tensor([1, 0])).all())
    out = tree(*_wr_inputs(40, False), "without-replacement", torch.Generator().manual_seed(2))
    assert bool((out.accepted_nodes == -1).all())
    assert bool((out.tokens[:, 0] == 0).all())


@needs_eagle
@pytest.mark.parametrize("scheme", ["iid", "top-k"])
def test_eagle_tree_sampler_refuses_schemes_other_than_without_replacement(scheme: str) -> None:
    """EAGLE divides by the without-replacement draw probability and skips repeated tokens, so
    it declares draft scheme without-replacement only and refuses the others."""
    from losslessness.adapters.eagle import adapter

    tree = adapter().tree
    assert tree is not None
    target, draft, parents, tokens = _wr_inputs(2, True)
    with pytest.raises(InvalidInputError, match="draft_scheme"):
        tree(target, draft, parents, tokens, scheme, torch.Generator().manual_seed(0))
