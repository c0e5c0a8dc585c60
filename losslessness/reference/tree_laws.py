"""Exact laws of tree verification: reach probabilities, accepted length, the multi-draft bound.

CONTRACT (filled in by the exact-laws work of issue 11; the signatures below are fixed, the
checks in :mod:`losslessness.checks.tree` are written against them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from losslessness.cases import TreeCase


@dataclass(frozen=True)
class TreeLaws:
    """Exact laws of the reference verifier of a :class:`TreeCase`'s declared draft scheme,
    over both the drafting and the verification randomness.

    Attributes:
        reach: ``[N+1]`` float64; ``reach[n]`` is the probability that node n is accepted in one
            step (``reach[0] = 1``, the root).
        depth_reach: ``[D+1]`` float64; ``depth_reach[d]`` the probability that at least d
            drafted tokens are accepted (``depth_reach[0] = 1``).
        expected_accepted: the expected number of accepted drafted tokens per step,
            ``depth_reach[1:].sum()``.
        root_bound: the largest probability, over every lossless verifier, of accepting one of
            the root's children, given how they were drafted (SpecTr's optimal transport, Sun
            et al. 2023, for ``iid`` and ``without-replacement``; the top-k set's target mass
            for ``top-k``).
    """

    reach: torch.Tensor
    depth_reach: torch.Tensor
    expected_accepted: float
    root_bound: float


def exact_tree_laws(case: TreeCase) -> TreeLaws:
    """The :class:`TreeLaws` of ``case`` by enumeration.

    Raises:
        ValueError: the enumeration would exceed its cell cap (the message names the case's V
            and N and the cap).
    """
    raise NotImplementedError("issue 11: exact laws")


def ot_acceptance_bound(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, n_drafts: int, draft_scheme: str
) -> float:
    """The largest acceptance probability of any lossless verifier of ``n_drafts`` drafts.

    Args:
        target_probs: ``[V]`` float, p.
        draft_probs: ``[V]`` float, q.
        n_drafts: n >= 1.
        draft_scheme: how the n drafts were drawn from q.

    Returns:
        ``max P(Y in {X_1..X_n})`` over couplings of ``Y ~ p`` with the drafts' joint law
        (SpecTr, Sun et al. 2023, the optimal-transport linear program, solved with
        ``scipy.optimize.linprog``).
    """
    raise NotImplementedError("issue 11: optimal-transport bound")
