"""Shared builders for the tree-verifier tests: random Markov tree cases and Monte Carlo runs."""

from __future__ import annotations

import torch

from losslessness.cases import TreeCase
from losslessness.protocol import TreeOutput
from losslessness.reference.tree import verify_tree


def dirichlet(shape: tuple[int, ...], generator: torch.Generator,
              concentration: float = 1.0) -> torch.Tensor:
    """Rows drawn from Dirichlet(concentration), float64, shape ``[..., V]``."""
    gamma = torch._standard_gamma(
        torch.full(shape, concentration, dtype=torch.float64), generator=generator
    )
    return gamma / gamma.sum(dim=-1, keepdim=True)


def random_tree_case(parents: tuple[int, ...], vocab: int, scheme: str, seed: int,
                     concentration: float = 1.0) -> TreeCase:
    """A :class:`TreeCase` with Dirichlet p and q at the root and in every (depth, token) row."""
    generator = torch.Generator().manual_seed(seed)
    depths = [0]
    for parent in parents:
        depths.append(depths[parent] + 1)
    depth = max(depths)
    return TreeCase(
        case_id=f"test-{scheme}-{seed}",
        summary="random Markov tree",
        parents=parents,
        root_target=dirichlet((vocab,), generator, concentration),
        root_draft=dirichlet((vocab,), generator, concentration),
        target_table=dirichlet((depth, vocab, vocab), generator, concentration),
        draft_table=dirichlet((depth, vocab, vocab), generator, concentration),
        draft_scheme=scheme,
    )


def run_case(case: TreeCase, count: int, seed: int) -> tuple[torch.Tensor, TreeOutput]:
    """Draft ``count`` trees of ``case`` and verify them with the reference: (token_ids
    ``[count, N]``, the :class:`TreeOutput`)."""
    generator = torch.Generator().manual_seed(seed)
    ids = case.draw_trees(count, generator)
    target, draft = case.inputs(ids)
    parents = case.parents_tensor.expand(count, -1)
    return ids, verify_tree(target, draft, parents, ids, case.draft_scheme, generator)


def node_frequencies(output: TreeOutput, nodes: int) -> torch.Tensor:
    """``[N+1]`` float64: the fraction of rows that accepted each node (column 0: 1)."""
    counts = torch.zeros(nodes + 1, dtype=torch.float64)
    accepted = output.accepted_nodes[output.accepted_nodes >= 0]
    counts += torch.bincount(accepted, minlength=nodes + 1).to(torch.float64)
    counts[0] = output.accepted_nodes.shape[0]
    return counts / output.accepted_nodes.shape[0]
