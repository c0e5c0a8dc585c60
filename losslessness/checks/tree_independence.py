"""The tree independence check (issue 11): trees of one verifier call use independent
randomness.

Trees ``2m`` and ``2m+1`` of one call carry the same p and q tables (drafted independently):
their first emitted tokens, each ~ p at the root, must be independent
(:func:`losslessness.checks.independence.pair_independence_test`, the chain check's method).
"""

from __future__ import annotations

import time
from typing import Any

from losslessness.checks.ids import TREE_INDEPENDENCE_CHECK_ID
from losslessness.checks.independence import pair_independence_test
from losslessness.checks.tree_assertions import ROOT, class_p, tree_assertions
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.samples import TreeSamples
from losslessness.stats import chi_square_minimum_detectable_tv


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
