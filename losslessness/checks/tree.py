"""Tree and multi-draft verification checks (issue 11): structure, conditional law at every
reached node, acceptance per depth, independence of the trees of one call, greedy exactness.

Pure like the chain checks: :class:`~losslessness.samples.TreeSamples` (or a greedy tree
verifier's outputs) and the case in, :class:`~losslessness.results.CheckResult` records out.

Which statistical assertions a tree case makes is decided before any sample is drawn
(:func:`tree_assertions`), from the case alone: the classes of nodes whose next-token law is
tested come from a fixed-seed pilot run of the reference verifier (the same on every machine and
for every target), the depths whose acceptance is tested from the exact laws of
:func:`losslessness.reference.tree_laws.exact_tree_laws`.

**Law** (the verdict). Node 0 is the root context; a node of depth d >= 1 with token x has p =
``target_table[d-1, x]`` (a Markov model), so the nodes of one (depth, token) class share one p
row and are pooled. Given that the accepted path reached a node, the next emitted token (an
accepted child's token or the final token) follows p at that node, for every lossless tree
verifier (Miao et al. 2024, SpecInfer, Thm. 4.2; Jeon et al. 2024, Thm. 3.1): one identity test
per class reached often enough (Cressie-Read, :func:`losslessness.stats.identity_test`, at the
per-assertion level), and for every class an exact part: a token with p = 0 is never emitted.

**Acceptance.** The probability that the accepted path reaches depth d, against the declared
scheme's exact value ``depth_reach[d]``: significantly below it is SUBOPTIMAL (a lossless
verifier may do that, but it wastes drafts); at depth 1, significantly above ``root_bound``
(the largest acceptance any lossless verifier of these drafts can have: SpecTr's optimal
transport, Sun et al. 2023) is LOSSY. Exact one-sided binomial tests
(:func:`losslessness.stats.binomial.rate_bound_test`), each at half the assertion's level at
depth 1 (one assertion), at the full level at depths >= 2 (only the SUBOPTIMAL side).

**Independence.** Trees ``2m`` and ``2m+1`` of one call carry the same p and q tables (drafted
independently): their first emitted tokens, each ~ p at the root, must be independent
(:func:`losslessness.checks.independence.pair_independence_test`, the chain check's method).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from losslessness.cases import GreedyTreeCase, TreeCase
from losslessness.checks.conditional_law import law_cells
from losslessness.checks.ids import (
    TREE_ACCEPTANCE_CHECK_ID,
    TREE_GREEDY_CHECK_ID,
    TREE_INDEPENDENCE_CHECK_ID,
    TREE_LAW_CHECK_ID,
    TREE_STRUCTURE_CHECK_ID,
)
from losslessness.checks.independence import pair_independence_test
from losslessness.protocol import PLACEHOLDER
from losslessness.reference import tree_laws as tree_laws_module
from losslessness.reference.greedy import argmax_lowest_index
from losslessness.reference.tree import verify_tree, verify_tree_greedy
from losslessness.reference.tree_laws import TreeLaws
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.samples import TreeSamples
from losslessness.seeding import derive_seed
from losslessness.stats import (
    chi_square_minimum_detectable_tv,
    exact_check_minimum_detectable_rate,
    identity_minimum_detectable_tv,
    identity_test,
)
from losslessness.stats.binomial import rate_bound_minimum_detectable_shift, rate_bound_test

PILOT_TREES = 2048
"""Trees of the reference pilot run that estimates how often each node class is reached."""

PILOT_SEED = 20240311
"""Seed of the pilot run (fixed: the assertions of a case are the same on every machine)."""

REACH_FLOOR = 0.2
"""A class of nodes gets an identity test when the pilot reaches it in at least this share of
steps (rarer classes keep the exact part of the law check; the budget stays small)."""

RATE_TOLERANCE = 1e-12
"""A reach probability within this of 0 or 1 is exactly 0 or 1 (float64 rounding)."""

ROOT = -1
"""The token of the root class (the root context has no token)."""


@dataclass(frozen=True)
class NodeClass:
    """Nodes sharing one target row p: the root, or every node of one depth and token.

    Attributes:
        depth: 0 for the root, else d >= 1.
        token: the nodes' token (:data:`ROOT` for the root).
        p: ``[V]`` float64, the target law of the next token at these nodes.
        reach: share of the pilot's steps whose accepted path reached the class.
        statistical: the class gets an identity test (reach >= :data:`REACH_FLOOR` and p has
            two or more positive cells).
    """

    depth: int
    token: int
    p: np.ndarray
    reach: float
    statistical: bool

    @property
    def label(self) -> str:
        """``root`` or ``depth d token x``."""
        return "root" if self.depth == 0 else f"depth {self.depth} token {self.token}"


@dataclass(frozen=True)
class TreeAssertions:
    """The statistical assertions of a tree case (decided before sampling).

    Attributes:
        classes: every node class the pilot reached (root first), statistical or not.
        laws: the case's exact laws, or None where they cannot be computed (then no acceptance
            assertion is made); ``laws_note`` says why.
        acceptance_depths: depths d >= 1 whose acceptance is tested statistically.
        independence: whether the root's p allows an independence test (two or more positive
            cells; the call must carry two trees or more).
    """

    classes: tuple[NodeClass, ...]
    laws: TreeLaws | None
    laws_note: str
    acceptance_depths: tuple[int, ...]
    independence: bool

    def count(self, check_ids: tuple[str, ...] = ()) -> int:
        """Statistical assertions of the checks in ``check_ids`` (all when empty)."""
        wanted = set(check_ids or (TREE_LAW_CHECK_ID, TREE_ACCEPTANCE_CHECK_ID,
                                   TREE_INDEPENDENCE_CHECK_ID))
        total = 0
        if TREE_LAW_CHECK_ID in wanted:
            total += sum(node_class.statistical for node_class in self.classes)
        if TREE_ACCEPTANCE_CHECK_ID in wanted:
            total += len(self.acceptance_depths)
        if TREE_INDEPENDENCE_CHECK_ID in wanted:
            total += self.independence
        return total


def class_p(case: TreeCase, depth: int, token: int) -> np.ndarray:
    """``[V]`` float64 p at the nodes of (``depth``, ``token``) (the root's p at depth 0)."""
    row = case.root_target if depth == 0 else case.target_table[depth - 1, token]
    array: np.ndarray = row.to(torch.float64).numpy()
    return array


def visited_classes(
    token_ids: np.ndarray, tokens: np.ndarray, accepted_nodes: np.ndarray, depths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (reached node, next emitted token) observation of a batch of steps.

    Args:
        token_ids: ``[n, N]`` int64 drafted trees.
        tokens: ``[n, D+1]`` int64 emitted tokens.
        accepted_nodes: ``[n, D]`` int64 accepted nodes (rows assumed well formed; structure
            checks them).
        depths: ``[N+1]`` int64 node depths.

    Returns:
        (step, class depth, class token (:data:`ROOT` at the root), next token), each ``[M]``
        int64: level i of a step with L accepted nodes, for i <= L, is reached at the root
        (i = 0) or at its i-th accepted node, and emitted ``tokens[:, i]`` next.
    """
    n, width = tokens.shape
    node_tokens = np.concatenate([np.full((n, 1), ROOT, dtype=np.int64), token_ids], axis=1)
    reached_nodes = np.concatenate(
        [np.zeros((n, 1), dtype=np.int64), np.where(accepted_nodes > 0, accepted_nodes, -1)],
        axis=1,
    )
    present = (reached_nodes >= 0) & (tokens != PLACEHOLDER)
    safe = np.clip(reached_nodes, 0, depths.size - 1)
    steps = np.broadcast_to(np.arange(n)[:, None], (n, width))
    class_token = np.take_along_axis(node_tokens, safe, axis=1)
    return (
        steps[present],
        depths[safe][present],
        class_token[present],
        tokens[present],
    )


def _pilot_reach(case: TreeCase) -> dict[tuple[int, int], float]:
    generator = torch.Generator().manual_seed(derive_seed(PILOT_SEED, case.case_hash))
    ids = case.draw_trees(PILOT_TREES, generator)
    target, draft = case.inputs(ids)
    parents = case.parents_tensor.expand(PILOT_TREES, -1).contiguous()
    output = verify_tree(target, draft, parents, ids, case.draft_scheme, generator)
    _, depth, token, _ = visited_classes(
        ids.numpy(), output.tokens.numpy(), output.accepted_nodes.numpy(), case.depths.numpy()
    )
    keys, counts = np.unique(np.stack([depth, token], axis=1), axis=0, return_counts=True)
    return {
        (int(d), int(x)): float(c) / PILOT_TREES
        for (d, x), c in zip(keys, counts, strict=True)
    }


def case_tree_laws(case: TreeCase) -> tuple[TreeLaws | None, str]:
    """The case's exact laws, or None and why they are not available (not implemented yet, or
    over the enumeration's cap)."""
    try:
        return tree_laws_module.exact_tree_laws(case), ""
    except (NotImplementedError, ValueError) as error:
        return None, f"exact tree laws unavailable: {error}"


def tree_assertions(case: TreeCase) -> TreeAssertions:
    """The statistical assertions ``case`` makes (see the module docstring); cached by the
    case's hash (and the exact-laws function, which tests may replace)."""
    key = (case.case_hash, tree_laws_module.exact_tree_laws)
    if key not in _ASSERTIONS:
        _ASSERTIONS[key] = _tree_assertions(case)
    return _ASSERTIONS[key]


_ASSERTIONS: dict[tuple[str, object], TreeAssertions] = {}
_PILOTS: dict[str, dict[tuple[int, int], float]] = {}


def _tree_assertions(case: TreeCase) -> TreeAssertions:
    if case.case_hash not in _PILOTS:
        _PILOTS[case.case_hash] = _pilot_reach(case)
    reach = _PILOTS[case.case_hash]
    classes = []
    for (depth, token), share in sorted(reach.items()):
        p = class_p(case, depth, token)
        statistical = share >= REACH_FLOOR and int((p > 0).sum()) >= 2
        classes.append(NodeClass(depth, token, p, share, statistical))
    laws, note = case_tree_laws(case)
    depths: list[int] = []
    if laws is not None:
        for d in range(1, case.depth + 1):
            rate = float(laws.depth_reach[d])
            if RATE_TOLERANCE < rate < 1.0 - RATE_TOLERANCE:
                depths.append(d)
    root_p = class_p(case, 0, ROOT)
    independence = int((root_p > 0).sum()) >= 2 and case.batch_size >= 2
    return TreeAssertions(tuple(classes), laws, note, tuple(depths), independence)


def tree_steps(
    case: TreeCase, tv: float, alpha: float, power: float, max_steps: int, min_steps: int
) -> tuple[int, int]:
    """Trees to verify so that every identity test of ``case`` detects TV >= ``tv``.

    The class of a test is reached in a share r of steps (the pilot's), so it needs about
    ``(n + 3 sqrt(n (1 - r))) / r`` steps for the n samples of its identity test
    (:func:`losslessness.stats.plan_identity_test`), as :func:`losslessness.engine.plan.
    plan_case` sizes a chain position; exact checks need ``log(1 - power) / log(1 - tv)``;
    never fewer than ``min_steps``.

    Returns:
        (steps, capped at ``max_steps``; steps the design asks for).
    """
    from losslessness.stats import plan_identity_test

    needed = max(min_steps, math.ceil(math.log1p(-power) / math.log1p(-min(tv, 1 - 1e-12))))
    for node_class in tree_assertions(case).classes:
        if not node_class.statistical:
            continue
        plan = plan_identity_test(node_class.p, tv, alpha, power, max_n=max_steps)
        r = node_class.reach
        needed = max(needed, math.ceil((plan.n + 3 * math.sqrt(plan.n * (1 - r))) / r))
    return min(needed, max_steps), needed


def _emitted(array: np.ndarray) -> np.ndarray:
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
    accepted = _emitted(nodes)
    emitted = _emitted(tokens)
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


def _well_formed(samples: TreeSamples) -> np.ndarray:
    """``[n]`` bool: rows whose accepted nodes are in range and whose token count fits (the law
    check reads only those; structure reports the others)."""
    nodes = samples.accepted_nodes
    accepted = _emitted(nodes)
    positions = np.arange(nodes.shape[1])[None, :] < accepted[:, None]
    in_range = ~positions | ((nodes >= 1) & (nodes <= samples.case.n_nodes))
    ok: np.ndarray = in_range.all(axis=1) & (_emitted(samples.tokens) == accepted + 1)
    return ok


def check_tree_law(samples: TreeSamples, context: CheckContext) -> list[CheckResult]:
    """Identity-test the next emitted token at every class of reached nodes against its p.

    Returns:
        One statistical ``tree.law`` result per class of :func:`tree_assertions` that gets an
        identity test (position = the class's depth, ``details`` its token), and one exact
        ``tree.law`` result over every other class (no token with p = 0 emitted).
    """
    case = samples.case
    assertions = tree_assertions(case)
    rows = _well_formed(samples)
    _, depth, token, emitted = visited_classes(
        samples.token_ids[rows], samples.tokens[rows], samples.accepted_nodes[rows],
        case.depths.numpy(),
    )
    vocab = case.vocab_size
    results = []
    tested: set[tuple[int, int]] = set()
    for node_class in assertions.classes:
        if not node_class.statistical:
            continue
        began = time.perf_counter()
        tested.add((node_class.depth, node_class.token))
        chosen = emitted[(depth == node_class.depth) & (token == node_class.token)]
        results.append(_law_result(context, node_class, chosen, vocab, began))
    began = time.perf_counter()
    keys = set(zip(depth.tolist(), token.tolist(), strict=True))
    impossible = 0
    examples: list[str] = []
    observed = 0
    for d, x in sorted(keys - tested):
        chosen = emitted[(depth == d) & (token == x)]
        observed += int(chosen.size)
        p = class_p(case, d, x)
        bad = (chosen < 0) | (chosen >= vocab)
        bad[~bad] = p[chosen[~bad]] == 0
        if bad.any():
            impossible += int(bad.sum())
            label = "root" if d == 0 else f"depth {d} token {x}"
            examples.append(f"{label}: {sorted(set(chosen[bad].tolist()))[:5]}")
    message = (
        f"no token with p = 0 emitted after {len(keys - tested)} classes of nodes without an "
        f"identity test ({observed} observations)"
    )
    if impossible:
        message = f"{impossible} emitted tokens have p = 0 at their node: " + "; ".join(
            examples[:5]
        )
    results.append(
        context.result(
            TREE_LAW_CHECK_ID,
            kind=CheckKind.EXACT,
            n=observed,
            verdict=Verdict.LOSSY if impossible else Verdict.PASS,
            statistic=float(impossible),
            p_value=0.0 if impossible else 1.0,
            min_detectable_tv=exact_check_minimum_detectable_rate(observed, context.power),
            wall_time_s=time.perf_counter() - began,
            message=message,
            details={"classes": len(keys - tested), "exact_only": True},
        )
    )
    return results


def _law_result(
    context: CheckContext, node_class: NodeClass, chosen: np.ndarray, vocab: int, began: float
) -> CheckResult:
    p = node_class.p
    in_vocab = (chosen >= 0) & (chosen < vocab)
    out_of_vocab = int((~in_vocab).sum())
    counts = np.bincount(chosen[in_vocab], minlength=vocab)
    test = identity_test(counts, p)
    impossible = test.zero_mass_count + out_of_vocab
    bound = identity_minimum_detectable_tv(p, test.n, context.alpha, context.power)
    where = node_class.label
    if impossible:
        verdict = Verdict.LOSSY
        message = (
            f"{impossible} of {chosen.size} tokens emitted after the {where} have p = 0 "
            f"(tokens {list(test.zero_mass_tokens[:5])}"
            f"{' and ids outside the vocabulary' if out_of_vocab else ''})"
        )
    elif test.pvalue <= context.alpha:
        verdict = Verdict.LOSSY
        observed = counts / max(int(counts.sum()), 1)
        worst = int(np.argmax(np.abs(observed - p)))
        message = (
            f"the token emitted after the {where} does not follow its p: p-value "
            f"{test.pvalue:.3g} <= alpha {context.alpha:.3g}; largest gap at token {worst}: "
            f"observed {observed[worst]:.4f} vs p {p[worst]:.4f}; empirical TV "
            f"{0.5 * float(np.abs(observed - p).sum()):.4f}"
        )
    else:
        verdict = Verdict.PASS
        message = f"the token emitted after the {where} ~ p ({test.n} observations)"
    return context.result(
        TREE_LAW_CHECK_ID,
        kind=CheckKind.STATISTICAL,
        n=int(chosen.size),
        verdict=verdict,
        position=node_class.depth,
        statistic=test.statistic,
        df=test.df,
        p_value=0.0 if impossible else test.pvalue,
        min_detectable_tv=bound.minimum_detectable_tv,
        wall_time_s=time.perf_counter() - began,
        message=message,
        details={
            "depth": node_class.depth,
            "token": node_class.token,
            "reach_probability": node_class.reach,
            "pooled_cells": test.pooled_cells,
            "pooled_mass": test.pooled_mass,
            "zero_mass_count": test.zero_mass_count,
            "out_of_vocab": out_of_vocab,
        },
        cells=law_cells(counts, p),
    )


def check_tree_acceptance(samples: TreeSamples, context: CheckContext) -> list[CheckResult]:
    """Test the share of steps whose accepted path reaches every depth d >= 1.

    Returns:
        One ``tree.acceptance`` result per depth of :func:`tree_assertions` (statistical), or
        one SKIPPED result naming why when the exact laws are unavailable.
    """
    case = samples.case
    assertions = tree_assertions(case)
    laws = assertions.laws
    if laws is None:
        return [context.untested(TREE_ACCEPTANCE_CHECK_ID, Verdict.SKIPPED, assertions.laws_note)]
    accepted = _emitted(samples.accepted_nodes)
    steps = int(accepted.size)
    results = []
    for d in assertions.acceptance_depths:
        began = time.perf_counter()
        reached = int((accepted >= d).sum())
        observed = reached / steps if steps else float("nan")
        lower = float(laws.depth_reach[d])
        upper = float(laws.root_bound) + RATE_TOLERANCE if d == 1 else None
        level = context.alpha / 2 if upper is not None else context.alpha
        low = rate_bound_test(reached, steps, min(lower, upper or 1.0), "less")
        shifts = [rate_bound_minimum_detectable_shift(steps, lower, level, context.power, "less")]
        pvalues = [low.pvalue]
        verdict = Verdict.PASS
        message = (
            f"depth {d} reached in {observed:.4f} of {steps} steps (declared scheme's exact "
            f"rate {lower:.4f}"
            + (f", lossless bound {upper:.4f})" if upper is not None else ")")
        )
        if upper is not None:
            upper = min(upper, 1.0)
            high = rate_bound_test(reached, steps, upper, "greater")
            pvalues.append(high.pvalue)
            shifts.append(
                rate_bound_minimum_detectable_shift(steps, upper, level, context.power, "greater")
            )
            if high.pvalue <= level:
                verdict = Verdict.LOSSY
                message = (
                    f"a root child accepted in {observed:.4f} of {steps} steps, above "
                    f"{upper:.4f}, the most any lossless verifier of these drafts accepts "
                    f"(one-sided p-value {high.pvalue:.3g} <= {level:.3g})"
                )
        if verdict is Verdict.PASS and low.pvalue <= level:
            verdict = Verdict.SUBOPTIMAL
            message = (
                f"depth {d} reached in {observed:.4f} of {steps} steps, below {lower:.4f}, the "
                f"{case.draft_scheme} scheme's exact rate (one-sided p-value {low.pvalue:.3g} "
                f"<= {level:.3g}): lossless verifiers may do this, but it wastes drafts"
            )
        results.append(
            context.result(
                TREE_ACCEPTANCE_CHECK_ID,
                kind=CheckKind.STATISTICAL,
                n=steps,
                verdict=verdict,
                position=d,
                statistic=observed,
                p_value=min(1.0, len(pvalues) * min(pvalues)),
                min_detectable_tv=max(shifts),
                wall_time_s=time.perf_counter() - began,
                message=message,
                details={
                    "depth": d,
                    "reached": reached,
                    "exact_rate": lower,
                    "upper_bound": upper,
                    "p_value_lower": low.pvalue,
                    "p_value_higher": pvalues[1] if len(pvalues) > 1 else None,
                },
            )
        )
    return results


def check_tree_independence(samples: TreeSamples, context: CheckContext) -> list[CheckResult]:
    """Test that paired trees of one call emit independent first tokens.

    Returns:
        One statistical ``tree.independence`` result when the case makes the assertion
        (:func:`tree_assertions`): LOSSY when independence is rejected at the per-assertion
        level, SKIPPED when too few pairs make two categories; no result otherwise.
    """
    if not tree_assertions(samples.case).independence or samples.steps_per_call < 2:
        return []
    began = time.perf_counter()
    first_tokens = samples.tokens[:, 0]
    first = first_tokens[samples.pairs[:, 0]]
    second = first_tokens[samples.pairs[:, 1]]
    p0 = class_p(samples.case, 0, ROOT)
    test = pair_independence_test(first, second, p0)
    common: dict[str, Any] = {"n": test.n_pairs, "details": {"categories": test.categories}}
    if test.categories < 2:
        return [
            context.result(
                TREE_INDEPENDENCE_CHECK_ID,
                kind=CheckKind.STATISTICAL,
                verdict=Verdict.SKIPPED,
                min_detectable_tv=float("inf"),
                message="too few pairs for two categories of the first token",
                **common,
            )
        ]
    verdict = Verdict.LOSSY if test.pvalue <= context.alpha else Verdict.PASS
    message = f"paired trees of one call emit independent first tokens ({test.n_pairs} pairs)"
    if verdict is Verdict.LOSSY:
        message = (
            f"trees of one call are dependent: p-value {test.pvalue:.3g} <= alpha "
            f"{context.alpha:.3g}; paired trees emit the same first token in "
            f"{float((first == second).mean()):.3f} of {test.n_pairs} pairs, "
            f"{float((p0**2).sum()):.3f} if independent (shared randomness?)"
        )
    return [
        context.result(
            TREE_INDEPENDENCE_CHECK_ID,
            kind=CheckKind.STATISTICAL,
            verdict=verdict,
            statistic=test.statistic,
            df=test.df,
            p_value=test.pvalue,
            min_detectable_tv=chi_square_minimum_detectable_tv(
                test.n_pairs, test.df, context.alpha, context.power
            ),
            wall_time_s=time.perf_counter() - began,
            message=message,
            **common,
        )
    ]


def run_tree_checks(samples: TreeSamples, context: CheckContext) -> list[CheckResult]:
    """Every tree check on one case's samples: structure, law, acceptance, independence."""
    return [
        check_tree_structure(samples, context),
        *check_tree_law(samples, context),
        *check_tree_acceptance(samples, context),
        *check_tree_independence(samples, context),
    ]


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
        One exact ``tree.greedy`` result: LOSSY with the first bad row, SUBOPTIMAL, or PASS.

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
    )
