"""Deliberately wrong tree verifiers, for showing that the tree property suite
(:mod:`losslessness.suite.test_tree`) catches them. Each is the reference algorithm
(:mod:`losslessness.reference.tree`) with one step changed; the docstring names the change.

Run one: ``pytest --losslessness-tree=tests.wrong_tree_verifiers:siblings_judged_against_p``.
"""

from __future__ import annotations

import torch

from losslessness.protocol import (
    PLACEHOLDER,
    TreeOutput,
    tree_depths,
    validate_greedy_tree_inputs,
    validate_tree_inputs,
)
from losslessness.reference.greedy import argmax_lowest_index
from losslessness.reference.laws import residual_distribution
from losslessness.reference.sampling import sample_inverse_cdf
from losslessness.reference.tree import child_table, verify_tree_greedy

__all__ = ["greedy_final_from_parent", "siblings_judged_against_p"]


def _renormalise(probs: torch.Tensor) -> torch.Tensor:
    total = probs.sum(dim=-1, keepdim=True)
    return probs / torch.where(total > 0, total, 1.0)


def siblings_judged_against_p(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """Every sibling is accepted with ``min(1, p(x) / q(x))`` (``p(x)`` under ``top-k``) against
    the node's original p instead of the residual left by the rejected siblings before it; the
    residual is still updated and the final token drawn from it. Lossy as soon as a node has
    two children (a chain is unaffected): the second sibling is accepted too often where the
    first one's rejection has removed mass."""
    batch, nodes, _ = validate_tree_inputs(
        target_probs, draft_probs, parents, token_ids, draft_scheme, generator
    )
    target, draft = target_probs.double(), draft_probs.double()
    parents, ids = parents.long(), token_ids.long()
    accept_u = torch.rand((batch, nodes), generator=generator, dtype=torch.float64)
    sample_u = torch.rand((batch,), generator=generator, dtype=torch.float64)
    depth = int(tree_depths(parents).max())
    table = child_table(parents)
    rows = torch.arange(batch)
    node_tokens = torch.cat([torch.zeros((batch, 1), dtype=torch.int64), ids], 1)
    node_u = torch.cat([torch.ones((batch, 1), dtype=torch.float64), accept_u], 1)
    tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64)
    accepted = torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64)
    current = torch.zeros(batch, dtype=torch.int64)
    active = torch.ones(batch, dtype=torch.bool)
    for level in range(depth + 1):
        original = target[rows, current]
        residual = original
        draft_law = draft[rows, current]
        chosen = torch.full((batch,), PLACEHOLDER, dtype=torch.int64)
        for slot in range(table.shape[2]):
            child = table[rows, current, slot]
            trying = active & (chosen < 0) & (child >= 0)
            if not bool(trying.any()):
                break
            safe_child = child.clamp(min=0)
            token = node_tokens[rows, safe_child].unsqueeze(1)
            p_x = original.gather(1, token).squeeze(1)  # the mistake: not residual
            if draft_scheme == "top-k":
                ratio = p_x
            else:
                q_x = draft_law.gather(1, token).squeeze(1)
                ratio = p_x / torch.where(q_x > 0, q_x, 1.0)
            accept = trying & (node_u[rows, safe_child] < ratio)
            chosen = torch.where(accept, child, chosen)
            reject = (trying & ~accept).unsqueeze(1)
            if draft_scheme == "top-k":
                updated = _renormalise(residual.scatter(1, token, 0.0))
            else:
                updated = residual_distribution(residual, draft_law).to(residual.dtype)
                if draft_scheme == "without-replacement":
                    draft_law = torch.where(
                        reject, _renormalise(draft_law.scatter(1, token, 0.0)), draft_law
                    )
            residual = torch.where(reject, updated, residual)
        moved = chosen >= 0
        if level < depth:
            tokens[:, level] = torch.where(moved, node_tokens[rows, chosen.clamp(min=0)],
                                           tokens[:, level])
            accepted[:, level] = torch.where(moved, chosen, accepted[:, level])
        stopping = active & ~moved
        if bool(stopping.any()):
            tokens[stopping, level] = sample_inverse_cdf(residual[stopping], sample_u[stopping])
        active = active & moved
        current = torch.where(moved, chosen, current)
        if not bool(active.any()):
            break
    return TreeOutput(tokens, accepted)


def greedy_final_from_parent(
    target_logits: torch.Tensor, parents: torch.Tensor, token_ids: torch.Tensor
) -> TreeOutput:
    """The reference greedy walk, but the final token is the argmax of the logits at the
    parent of the last accepted node instead of at that node itself (so it repeats the last
    accepted token). Wrong whenever a path stops below the root on a node whose argmax is not
    its own token."""
    validate_greedy_tree_inputs(target_logits, parents, token_ids)
    output = verify_tree_greedy(target_logits, parents, token_ids)
    tokens = output.tokens.clone()
    best = argmax_lowest_index(target_logits)
    lengths = (output.accepted_nodes >= 0).sum(dim=1)
    for b in torch.nonzero(lengths > 0).flatten().tolist():
        length = int(lengths[b])
        last = int(output.accepted_nodes[b, length - 1])
        parent = int(parents[b, last - 1])
        tokens[b, length] = best[b, parent]
    return TreeOutput(tokens, output.accepted_nodes)
