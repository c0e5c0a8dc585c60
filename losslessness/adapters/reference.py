"""The reference implementations as an adapter (the audit's own ground truth, audited like any
other target: it must come out LOSSLESS)."""

from __future__ import annotations

from losslessness.adapters.base import Adapter
from losslessness.reference import verify, verify_greedy
from losslessness.reference.tree import verify_tree, verify_tree_greedy

adapter = Adapter(
    name="reference",
    description="losslessness.reference: chain rejection sampling (Leviathan et al. 2022, "
    "Alg. 1), greedy verify, tree verification (SpecInfer multi-round, recursive rejection "
    "sampling without replacement, top-k) and greedy tree verify, float64",
    chain=verify,
    greedy=verify_greedy,
    tree=verify_tree,
    greedy_tree=verify_tree_greedy,
)
