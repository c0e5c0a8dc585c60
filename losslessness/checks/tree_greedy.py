"""The greedy tree check (issue 11): a greedy tree verifier's outputs are greedy decoding
along each tree, ties to the lowest index as :func:`losslessness.reference.tree.
verify_tree_greedy`.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from losslessness.cases import GreedyTreeCase
from losslessness.checks.ids import TREE_GREEDY_CHECK_ID
from losslessness.protocol import PLACEHOLDER
from losslessness.reference.greedy import argmax_lowest_index
from losslessness.reference.tree import verify_tree_greedy
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.stats import exact_check_minimum_detectable_rate


def greedy_violation(
    tokens: np.ndarray,
    nodes: np.ndarray,
    best: np.ndarray,
    parents: np.ndarray,
    ids: np.ndarray,
) -> tuple[str, str]:
    """How one tree's greedy output breaks greedy decoding (``"lossy"``), merely stops early
    (``"suboptimal"``) or neither (``""``), with the reason (see :func:`check_tree_greedy`).

    Args:
        tokens: ``[D+1]`` int64, the emitted tokens. nodes: ``[D]`` int64, the accepted nodes.
        best: ``[N+1]`` int64, the argmax (lowest index on ties) at every node.
        parents: ``[N]`` int64. ids: ``[N]`` int64, the nodes' tokens.

    Returns:
        ``(kind, reason)``.
    """
    current, position = 0, 0
    for node in nodes:
        if node == PLACEHOLDER:
            break
        if not 1 <= node <= ids.shape[0] or parents[node - 1] != current:
            return "lossy", f"accepted node {node} is not a child of node {current}"
        if tokens[position] != ids[node - 1]:
            return "lossy", f"token {tokens[position]} at position {position} is not node {node}'s"
        if ids[node - 1] != best[current]:
            return "lossy", (
                f"node {node} (token {ids[node - 1]}) accepted, but the argmax at node "
                f"{current} is {best[current]}"
            )
        current, position = int(node), position + 1
    if (nodes[position:] != PLACEHOLDER).any():
        return "lossy", "accepted nodes continue after a -1"
    if tokens[position] != best[current]:
        return "lossy", (
            f"final token {tokens[position]} is not the argmax {best[current]} at node {current}"
        )
    if (tokens[position + 1 :] != PLACEHOLDER).any():
        return "lossy", "tokens continue after the final token"
    children = np.flatnonzero(parents == current)
    matching = children[ids[children] == best[current]]
    if matching.size:
        return "suboptimal", (
            f"stopped at node {current} although its child {int(matching[0]) + 1} carries the "
            "argmax"
        )
    return "", ""


def check_tree_greedy(
    tokens: np.ndarray, accepted_nodes: np.ndarray, case: GreedyTreeCase, context: CheckContext
) -> CheckResult:
    """Check a greedy tree verifier's outputs against greedy decoding along each tree of ``case``.

    Greedy decoding fixes the emitted tokens, not which node carries them: where siblings repeat
    the argmax token, any of them is a correct continuation (a real model gives both the same
    logits), so the check follows the verifier's own accepted nodes. A row is LOSSY when its
    accepted nodes are not a root path of the tree, a token is not its node's, an accepted
    token is not the argmax (lowest index on ties, as :func:`losslessness.reference.tree.
    verify_tree_greedy`) at its parent, or the final token is not the argmax at the last
    accepted node; it is SUBOPTIMAL (lossless, wasting drafts) when the walk stopped at a node
    one of whose children carries that argmax.

    Args:
        tokens: ``[B, D+1]`` int64, what the verifier under audit emitted.
        accepted_nodes: ``[B, D]`` int64, the nodes it accepted.
        case: logits ``[B, N+1, V]``, parents and tokens ``[B, N]``.
        context: the case's context.

    Returns:
        One exact ``tree.greedy`` result: LOSSY with the first bad row, SUBOPTIMAL (the first
        tree that stopped early), or PASS; when not PASS, ``details["first_row"]`` holds that
        tree's index, the reason, what it returned and what greedy tree verification gives.

    Raises:
        ValueError: naming ``tokens`` or ``accepted_nodes``, when a shape is not the
            protocol's ``[B, D+1]`` / ``[B, D]``.
    """
    began = time.perf_counter()
    expected = verify_tree_greedy(case.target_logits, case.parents, case.token_ids)
    for name, got, want in (("tokens", tokens, expected.tokens),
                            ("accepted_nodes", accepted_nodes, expected.accepted_nodes)):
        if tuple(got.shape) != tuple(want.shape):
            raise ValueError(f"{name}: expected shape {tuple(want.shape)}, got {got.shape}")
    best = argmax_lowest_index(case.target_logits).numpy()
    parents, ids = case.parents.numpy(), case.token_ids.numpy()
    found = [
        greedy_violation(tokens[b], accepted_nodes[b], best[b], parents[b], ids[b])
        for b in range(case.batch_size)
    ]
    lossy = [b for b, (kind, _) in enumerate(found) if kind == "lossy"]
    slow = [b for b, (kind, _) in enumerate(found) if kind == "suboptimal"]
    batch = case.batch_size
    verdict, message, bad = Verdict.PASS, f"all {batch} trees follow greedy decoding", 0
    details: dict[str, Any] = {}
    for rows, name, outcome in ((slow, "stop early", Verdict.SUBOPTIMAL),
                                (lossy, "break greedy decoding", Verdict.LOSSY)):
        if rows:
            b = rows[0]
            verdict, bad = outcome, len(rows)
            message = (
                f"{len(rows)} of {batch} trees {name}. First: tree {b}, parents "
                f"{parents[b].tolist()}, tokens {ids[b].tolist()}: {found[b][1]}; got nodes "
                f"{accepted_nodes[b].tolist()} tokens {tokens[b].tolist()}, greedy tree "
                f"verification gives nodes {expected.accepted_nodes[b].tolist()} tokens "
                f"{expected.tokens[b].tolist()}"
            )
            details["first_row"] = {
                "tree": b,
                "reason": found[b][1],
                "accepted_nodes": accepted_nodes[b].tolist(),
                "tokens": tokens[b].tolist(),
                "greedy_accepted_nodes": expected.accepted_nodes[b].tolist(),
                "greedy_tokens": expected.tokens[b].tolist(),
            }
    return context.result(
        TREE_GREEDY_CHECK_ID,
        kind=CheckKind.EXACT,
        n=batch,
        verdict=verdict,
        statistic=float(bad),
        p_value=0.0 if verdict is Verdict.LOSSY else 1.0,
        min_detectable_tv=exact_check_minimum_detectable_rate(batch, context.power),
        wall_time_s=time.perf_counter() - began,
        message=message,
        details=details,
    )
