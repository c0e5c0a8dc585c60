"""The tree acceptance check (issue 11): how often the accepted path reaches every depth.

The probability that the accepted path reaches depth d, against the declared scheme's exact
value ``depth_reach[d]`` (:func:`losslessness.reference.tree_laws.exact_tree_laws`):
significantly below it is SUBOPTIMAL (a lossless verifier may do that, but it wastes drafts);
at depth 1, significantly above ``root_bound`` (the largest acceptance any lossless verifier of
these drafts can have: SpecTr's optimal transport, Sun et al. 2023) is LOSSY. Exact one-sided
binomial tests (:func:`losslessness.stats.binomial.rate_bound_test`), each at half the
assertion's level at depth 1 (one assertion), at the full level at depths >= 2 (only the
SUBOPTIMAL side).
"""

from __future__ import annotations

import time

from losslessness.checks.assertions import RATE_TOLERANCE
from losslessness.checks.ids import TREE_ACCEPTANCE_CHECK_ID
from losslessness.checks.tree_assertions import tree_assertions
from losslessness.checks.tree_structure import unpadded_lengths
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.samples import TreeSamples
from losslessness.stats.binomial import rate_bound_minimum_detectable_shift, rate_bound_test


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
    accepted = unpadded_lengths(samples.accepted_nodes)
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
