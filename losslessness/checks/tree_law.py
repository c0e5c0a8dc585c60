"""The tree law check (issue 11), the verdict of a tree verifier: the next emitted token at
every class of reached nodes follows that class's p.

Node 0 is the root context; a node of depth d >= 1 with token x has p = ``target_table[d-1,
x]`` (a Markov model), so the nodes of one (depth, token) class share one p row and are pooled
(:class:`~losslessness.checks.tree_assertions.NodeClass`). Given that the accepted path reached
a node, the next emitted token (an accepted child's token or the final token) follows p at that
node, for every lossless tree verifier (Miao et al. 2024, SpecInfer, Thm. 4.2; Jeon et al.
2024, Thm. 3.1): one identity test per tested class (Cressie-Read,
:func:`losslessness.stats.identity_test`, at the per-assertion level), and for every other
class an exact part: a token with p = 0 is never emitted. The audit tests the classes its pilot
reaches often enough (:func:`~losslessness.checks.tree_assertions.tree_assertions`), and every
other class together in one pooled test: the randomized probability integral transform of each
next token under its class's p is U(0, 1) (:mod:`losslessness.stats.pit`), so the histogram of
those u values is identity-tested against the uniform law
(:class:`~losslessness.checks.tree_assertions.PooledPit`; its minimum detectable TV is the
histogram's distance from uniform). A caller with its own design (the property suite) names its
classes and gets no pooled test.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from losslessness.checks.conditional_law import law_cells
from losslessness.checks.ids import TREE_LAW_CHECK_ID
from losslessness.checks.tree_assertions import (
    POOLED,
    NodeClass,
    PooledPit,
    class_p,
    tree_assertions,
    visited_classes,
)
from losslessness.checks.tree_structure import well_formed_rows
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.samples import TreeSamples
from losslessness.seeding import derive_seed
from losslessness.stats import (
    exact_check_minimum_detectable_rate,
    identity_minimum_detectable_tv,
    identity_test,
)
from losslessness.stats.pit import PIT_CELLS, pit_histogram

POOLED_SEED_LABEL = "tree.law.pooled"
"""Label of the seed of the pooled test's PIT uniforms (derived from the case's seed)."""


def check_tree_law(
    samples: TreeSamples, context: CheckContext, classes: Sequence[NodeClass] | None = None
) -> list[CheckResult]:
    """Identity-test the next emitted token at every tested class of reached nodes against its
    p, and check every other reached class exactly.

    Args:
        samples: the case's trees and outputs (rows that are not well formed are left to
            :func:`~losslessness.checks.tree_structure.check_tree_structure`).
        context: the case's context (per-assertion level, power, seed).
        classes: the classes to identity-test, in the order of the results; None tests the
            statistical classes of :func:`~losslessness.checks.tree_assertions.tree_assertions`
            (the audit's design).

    Returns:
        One statistical ``tree.law`` result per tested class (position = the class's depth,
        ``details`` its token), then, in the audit's design when the case makes it, the pooled
        PIT result over every other class (no position, ``details["pit"]``), then one exact
        ``tree.law`` result over every other reached class (no token with p = 0 emitted).
    """
    case = samples.case
    pooled = False
    if classes is None:
        assertions = tree_assertions(case)
        classes = [c for c in assertions.classes if c.statistical]
        pooled = assertions.pooled
    rows = well_formed_rows(samples)
    _, depth, token, emitted = visited_classes(
        samples.token_ids[rows], samples.tokens[rows], samples.accepted_nodes[rows],
        case.depths.numpy(),
    )
    vocab = case.vocab_size
    results = []
    tested: set[tuple[int, int]] = set()
    for node_class in classes:
        began = time.perf_counter()
        tested.add((node_class.depth, node_class.token))
        chosen = emitted[(depth == node_class.depth) & (token == node_class.token)]
        results.append(_law_result(context, node_class, chosen, vocab, began))
    if pooled:
        results.append(_pooled_result(samples, context, tested, depth, token, emitted))
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


def _pooled_result(
    samples: TreeSamples, context: CheckContext, tested: set[tuple[int, int]],
    depth: np.ndarray, token: np.ndarray, emitted: np.ndarray,
) -> CheckResult:
    """The pooled PIT test over the observations outside ``tested`` (module docstring)."""
    began = time.perf_counter()
    rng = np.random.default_rng(derive_seed(context.seed, POOLED_SEED_LABEL))
    u, classes = PooledPit(samples.case, tested).transform(depth, token, emitted, rng)
    counts = pit_histogram(u)
    uniform = np.full(PIT_CELLS, 1.0 / PIT_CELLS)
    test = identity_test(counts, uniform)
    bound = identity_minimum_detectable_tv(uniform, test.n, context.alpha, context.power)
    where = f"{classes} classes of nodes without an identity test"
    if test.n and test.pvalue <= context.alpha:
        verdict = Verdict.LOSSY
        observed = counts / test.n
        message = (
            f"the tokens emitted after {where} do not follow their p: the histogram of their "
            f"randomized PIT (tokens by decreasing p) is not uniform, p-value {test.pvalue:.3g} "
            f"<= alpha {context.alpha:.3g}; cell shares {np.round(observed, 3).tolist()} "
            f"(each {1 / PIT_CELLS:g} under p), histogram TV "
            f"{0.5 * float(np.abs(observed - uniform).sum()):.4f}"
        )
    else:
        verdict = Verdict.PASS
        message = (
            f"the tokens emitted after {where} follow their p: the randomized PIT's histogram "
            f"({PIT_CELLS} cells) is uniform ({test.n} observations)"
        )
    return context.result(
        TREE_LAW_CHECK_ID,
        kind=CheckKind.STATISTICAL,
        n=test.n,
        verdict=verdict,
        statistic=test.statistic,
        df=test.df,
        p_value=test.pvalue,
        min_detectable_tv=bound.minimum_detectable_tv,
        wall_time_s=time.perf_counter() - began,
        message=message,
        details={"token": POOLED, "pit": True, "classes": classes,
                 "pit_counts": counts.tolist()},
    )
