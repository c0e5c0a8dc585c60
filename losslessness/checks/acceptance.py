"""Acceptance rate at every draft position (DESIGN.md section 4, items 3 and 4).

Among the steps that reach draft position i, d_i is accepted (the step goes on to i+1) with
probability sum min(p_i, q_i) under the standard algorithm. Significantly *higher* proves
loss: a lossless verifier emits x_i ~ p_i and continues only when x_i == d_i with d_i ~ q_i,
and no coupling of p and q agrees more often than 1 - TV(p, q) (Leviathan et al. 2022,
Thm. 3.5 and its optimality remark; Chen et al. 2023). Significantly *lower* is lossless but
suboptimal (e.g. sample-and-match verification): a warning, never LOSSY.

Where the acceptance probability is exactly 0 (disjoint supports) or 1 (p == q) the check is
exact: any acceptance of a draft with p = 0 is a loss (``edge.disjoint``), any rejection when
p == q is suboptimal (``edge.p-equals-q``).
"""

from __future__ import annotations

import time

from losslessness.checks.assertions import case_laws, exact_acceptance, is_reachable
from losslessness.checks.structure import emitted_counts
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.samples import ChainSamples
from losslessness.stats import (
    acceptance_rate_test,
    binomial_minimum_detectable_shift,
    exact_check_minimum_detectable_rate,
)

_EXACT_IDS = {0.0: ("disjoint", "edge.disjoint"), 1.0: ("p-equals-q", "edge.p-equals-q")}


def check_acceptance(samples: ChainSamples, context: CheckContext) -> list[CheckResult]:
    """Test the acceptance rate at every reachable draft position.

    Args:
        samples: outputs ``[R, n, k+1]`` of a case.
        context: the case's context.

    Returns:
        One :class:`CheckResult` per (row type, draft position): ``acceptance`` (exact binomial,
        two-sided, direction reported), or an exact ``edge.*`` check at rates 0 and 1.
    """
    case = samples.case
    counts = emitted_counts(samples.outputs)
    results = []
    for r, laws in enumerate(case_laws(case)):
        for i in range(case.k):
            if not is_reachable(laws, i):
                continue
            began = time.perf_counter()
            reached = int((counts[r] > i).sum())
            accepted = int((counts[r] > i + 1).sum())
            expected = float(laws.acceptance[i])
            exact = exact_acceptance(laws, i)
            details = {
                "n_rows": case.n_rows,
                "expected_rate": expected,
                "accepted": accepted,
                "observed_rate": accepted / reached if reached else None,
            }
            common = {"position": i, "row": r, "n": reached}
            if exact is not None:
                tag, edge_id = _EXACT_IDS[exact]
                deviations = accepted if exact == 0.0 else reached - accepted
                verdict = Verdict.PASS
                if deviations:
                    verdict = Verdict.LOSSY if exact == 0.0 else Verdict.SUBOPTIMAL
                what = "accepted although p(d) = 0" if exact == 0.0 else "rejected although p == q"
                results.append(
                    context.result(
                        edge_id if tag in case.tags else "acceptance",
                        kind=CheckKind.EXACT,
                        verdict=verdict,
                        statistic=float(deviations),
                        p_value=0.0 if deviations else 1.0,
                        min_detectable_tv=exact_check_minimum_detectable_rate(
                            reached, context.power
                        ),
                        wall_time_s=time.perf_counter() - began,
                        details=details,
                        message=f"{deviations} of {reached} drafts {what} at position {i}",
                        **common,
                    )
                )
                continue
            test = acceptance_rate_test(accepted, reached, expected)
            verdict = Verdict.PASS
            message = f"acceptance {test.statistic:.4f} vs sum min(p, q) = {expected:.4f}"
            if test.pvalue <= context.alpha:
                verdict = Verdict.LOSSY if test.direction == "higher" else Verdict.SUBOPTIMAL
                consequence = (
                    "accepts more often than any lossless verifier can"
                    if verdict is Verdict.LOSSY
                    else "lossless verifiers may do this, but it wastes drafts"
                )
                message = (
                    f"acceptance at position {i} is {test.direction} than sum min(p, q): "
                    f"{test.statistic:.4f} vs {expected:.4f} (p-value {test.pvalue:.3g}); "
                    f"{consequence}"
                )
            results.append(
                context.result(
                    "acceptance",
                    kind=CheckKind.STATISTICAL,
                    verdict=verdict,
                    statistic=test.statistic,
                    p_value=test.pvalue,
                    min_detectable_tv=binomial_minimum_detectable_shift(
                        reached, expected, context.alpha, context.power
                    ),
                    wall_time_s=time.perf_counter() - began,
                    message=message,
                    details={**details, "direction": test.direction},
                    **common,
                )
            )
    return results
