"""The exact structure check of a tree verifier's outputs (issue 11): every row a root-to-node
path of its drafted tree, with its tokens, one final token and placeholder padding.

Also the row layout the other tree checks read: :func:`unpadded_lengths` (accepted nodes,
emitted tokens) and :func:`well_formed_rows` (the rows the law check may read).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from losslessness.checks.ids import TREE_STRUCTURE_CHECK_ID
from losslessness.protocol import PLACEHOLDER
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.samples import TreeSamples
from losslessness.stats import exact_check_minimum_detectable_rate


def unpadded_lengths(array: np.ndarray) -> np.ndarray:
    """Entries before the first placeholder of every row.

    Args:
        array: ``[..., W]`` int64 tokens or accepted nodes, :data:`~losslessness.protocol.
            PLACEHOLDER` padded.

    Returns:
        ``[...]`` int64: the number of emitted tokens (accepted nodes) of each row.
    """
    counts: np.ndarray = np.cumprod(array != PLACEHOLDER, axis=-1).sum(axis=-1)
    return counts


def check_tree_structure(samples: TreeSamples, context: CheckContext) -> CheckResult:
    """Exact structural check of every output row.

    Every row must: accept nodes in ``1..N`` forming a root-to-node path of the drafted tree
    (the first a child of the root, each next a child of the previous), left-aligned with -1
    after; emit exactly one token more than it accepts (the final token), left-aligned with -1
    after; emit at every accepted position that node's drafted token; and emit ids in [0, V).

    Returns:
        One exact :class:`CheckResult`: LOSSY with the first offending row (its tree, accepted
        nodes and tokens) when any row violates the structure, else PASS.
    """
    began = time.perf_counter()
    case = samples.case
    tokens, nodes, ids = samples.tokens, samples.accepted_nodes, samples.token_ids
    n, depth = nodes.shape
    n_nodes = case.n_nodes
    accepted = unpadded_lengths(nodes)
    emitted = unpadded_lengths(tokens)
    node_positions = np.arange(depth)[None, :] < accepted[:, None]
    token_positions = np.arange(depth + 1)[None, :] < emitted[:, None]
    in_range = (nodes >= 1) & (nodes <= n_nodes)
    safe = np.clip(nodes, 1, n_nodes)
    parent_of = np.array([PLACEHOLDER, *case.parents], dtype=np.int64)
    previous = np.concatenate([np.zeros((n, 1), dtype=np.int64), nodes[:, :-1]], axis=1)
    on_path = parent_of[safe] == previous
    drafted = np.take_along_axis(ids, safe - 1, axis=1)
    problems = {
        "accepted node outside 1..N": (node_positions & ~in_range).any(axis=1),
        "accepted nodes do not form a root-to-node path of the tree": (
            node_positions & in_range & ~on_path
        ).any(axis=1),
        "accepted node after a placeholder -1": (~node_positions & (nodes != PLACEHOLDER)).any(
            axis=1
        ),
        "token after a placeholder -1": (~token_positions & (tokens != PLACEHOLDER)).any(axis=1),
        "not exactly one token more than accepted nodes (the final token)": emitted
        != accepted + 1,
        "token at an accepted position differs from the node's drafted token": (
            node_positions & (tokens[:, :depth] != drafted)
        ).any(axis=1),
        "token id outside [0, V)": (
            token_positions & ((tokens < 0) | (tokens >= case.vocab_size))
        ).any(axis=1),
    }
    violating = np.zeros(n, dtype=bool)
    for mask in problems.values():
        violating |= mask
    n_bad = int(violating.sum())
    message = (
        f"every row of {n}: accepted nodes form a root-to-node path, tokens equal their drafted "
        "tokens, one final token, ids in [0, V), -1 padding"
    )
    details: dict[str, Any] = {
        "violations": {name: int(mask.sum()) for name, mask in problems.items()}
    }
    if n_bad:
        kinds = [
            f"{name} ({int(mask.sum())} rows)" for name, mask in problems.items() if mask.any()
        ]
        b = int(np.flatnonzero(violating)[0])
        details["first_row"] = {
            "step": b,
            "parents": list(case.parents),
            "token_ids": ids[b].tolist(),
            "accepted_nodes": nodes[b].tolist(),
            "tokens": tokens[b].tolist(),
        }
        message = (
            f"{n_bad} of {n} rows malformed: {'; '.join(kinds)}. First: step {b}, parents "
            f"{list(case.parents)}, tree tokens {ids[b].tolist()} -> accepted nodes "
            f"{nodes[b].tolist()}, tokens {tokens[b].tolist()}"
        )
    return context.result(
        TREE_STRUCTURE_CHECK_ID,
        kind=CheckKind.EXACT,
        n=n,
        statistic=float(n_bad),
        p_value=0.0 if n_bad else 1.0,
        verdict=Verdict.LOSSY if n_bad else Verdict.PASS,
        min_detectable_tv=exact_check_minimum_detectable_rate(n, context.power),
        wall_time_s=time.perf_counter() - began,
        message=message,
        details=details,
    )


def well_formed_rows(samples: TreeSamples) -> np.ndarray:
    """``[n]`` bool: rows whose accepted nodes are in range and whose token count fits (the law
    check reads only those; :func:`check_tree_structure` reports the others)."""
    nodes = samples.accepted_nodes
    accepted = unpadded_lengths(nodes)
    positions = np.arange(nodes.shape[1])[None, :] < accepted[:, None]
    in_range = ~positions | ((nodes >= 1) & (nodes <= samples.case.n_nodes))
    ok: np.ndarray = in_range.all(axis=1) & (unpadded_lengths(samples.tokens) == accepted + 1)
    return ok
