"""The CPU transcription of SGLang's ``TreeSpeculativeSamplingTargetOnly``
(``tests/adapters/sglang_tree_kernel.py``, used where CUDA is missing to test the plumbing of
the serving tree verifier's sampled branch) against the zoo's own vectorised reading of the
same kernel (:func:`losslessness.zoo.tree.duplicate_siblings_counted_twice`, the one-coin rule
at thresholds 1): two transcriptions written apart, in two layouts (SGLang's linked lists
through ``to_sglang`` and ``emitted_tree``, the protocol's parents), must emit the same tokens
and accept the same nodes from the same uniforms.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings

from losslessness.adapters.sglang_serving import emitted_tree
from losslessness.cases import TreeCase
from losslessness.protocol import PLACEHOLDER, tree_depths
from losslessness.reference.tree_layouts import to_sglang
from losslessness.zoo.steps import draw_uniforms
from losslessness.zoo.tree import duplicate_siblings_counted_twice
from strategies.trees import tree_cases
from tests.adapters.sglang_tree_kernel import tree_speculative_sampling_target_only

TREES = 32


@settings(max_examples=25, deadline=None)
@given(tree_cases(12, schemes=("top-k",)))
def test_kernel_transcription_matches_the_zoos_one_coin_rule_token_for_token(
    case: TreeCase,
) -> None:
    """On drafted top-k trees (distinct siblings) of any drawn shape and law, the SGLang-layout
    transcription and the zoo's rule, given the same coins ``[B, N+1]`` and final uniforms
    ``[B]``, emit the same tokens and accept the same nodes."""
    generator = torch.Generator().manual_seed(3)
    ids = case.draw_trees(TREES, generator)
    target, draft = case.inputs(ids)
    parents = torch.tensor(case.parents, dtype=torch.int64).expand(TREES, -1)
    expected = duplicate_siblings_counted_twice(
        target, draft, parents, ids, "top-k", torch.Generator().manual_seed(5)
    )
    uniforms = torch.Generator().manual_seed(5)
    coins = draw_uniforms(uniforms, TREES, case.n_nodes + 1)
    final = draw_uniforms(uniforms, TREES)
    layout = to_sglang(parents, ids, torch.zeros(TREES, dtype=torch.int64))
    depth = int(tree_depths(parents).max())
    predicts = torch.full((TREES * (case.n_nodes + 1),), PLACEHOLDER, dtype=torch.int32)
    accept_index = torch.full((TREES, depth + 1), PLACEHOLDER, dtype=torch.int32)
    accept_token_num = torch.zeros(TREES, dtype=torch.int32)
    tree_speculative_sampling_target_only(
        predicts, accept_index, accept_token_num, *layout, coins, final,
        target.to(torch.float32), torch.zeros_like(target, dtype=torch.float32),
    )
    got = emitted_tree(predicts, accept_index, accept_token_num)
    assert torch.equal(got.tokens, expected.tokens)
    assert torch.equal(got.accepted_nodes, expected.accepted_nodes)
