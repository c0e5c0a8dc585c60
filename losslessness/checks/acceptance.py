"""Acceptance at every draft position (docs/architecture.md, 'What lossless means', items 3 and 4).

**Position 0.** d_0 ~ q_0 is accepted with probability sum min(p_0, q_0) under the standard
algorithm, and significantly *higher* proves loss: a lossless verifier's first token follows
p_0, an accepted d_0 is that token, and no coupling of p_0 and q_0 agrees more often than
1 - TV(p_0, q_0) (Leviathan et al. 2022, Thm. 3.5 and its optimality remark; Chen et al.
2023). Significantly *lower* is lossless but suboptimal (e.g. sample-and-match verification):
a warning, never LOSSY. One exact two-sided binomial test at the assertion's level.

**Positions i >= 1.** Given that position i was reached, d_i is no longer distributed as q_i
for verifiers that decide on the whole block: block verification (Sun et al. 2024,
arXiv:2403.10444, Alg. 2; :mod:`losslessness.reference.block`) is lossless and accepts d_i
more often than sum min(p_i, q_i). What holds for every lossless verifier is a bound on the
*prefix*: the first i+1 drafts are all accepted with probability at most
``sum over x^{i+1} of min(prod_j p_j(x_j), prod_j q_j(x_j))`` = 1 - TV of the joint laws of the
first i+1 tokens (the coupling inequality; :func:`losslessness.laws.prefix_acceptance_bound`,
exact by enumeration, or a valid looser bound it names). So the assertion at position i counts,
among all n steps of the row, those that accepted d_0..d_i, and makes two exact one-sided
binomial tests, each at half the assertion's level (so one assertion, as before, and its
false-alarm probability stays at most the level):

- **LOSSY** when the count is significantly *above* the joint bound;
- **SUBOPTIMAL** when it is significantly *below* the token-level value
  ``prod_{j <= i} sum min(p_j, q_j)`` (what Leviathan et al.'s algorithm achieves), or, for a
  verifier that declares block verification (:func:`losslessness.reference.declared_verification`;
  pass ``verification="block"``), below block verification's own exact value
  (:func:`losslessness.reference.block_laws`; the token-level value where it cannot be
  enumerated).

The reported p-value is twice the smaller one-sided p-value (capped at 1), so the verdict is
still ``p-value <= alpha``; the minimum detectable shift is the larger of the two tests'. The
record's ``n``, ``statistic`` and ``acceptance`` counts stay the conditional acceptance at
position i against sum min(p_i, q_i) (what reports plot); the prefix tests' counts are in the
``prefix_*`` details and the message.

Where the acceptance probability at a position is exactly 0 (disjoint supports) or 1
(p == q) the check is exact and conditional on reaching the position: any accepted draft with
p = 0 is a loss (``edge.disjoint``; the draft would be emitted at a position whose law is p),
any rejection when p == q is suboptimal (``edge.p-equals-q``; block verification never rejects
there either).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from losslessness.checks.assertions import case_laws, exact_acceptance, is_reachable
from losslessness.checks.ids import (
    ACCEPTANCE_CHECK_ID,
    EDGE_DISJOINT_CHECK_ID,
    EDGE_P_EQUALS_Q_CHECK_ID,
)
from losslessness.checks.structure import emitted_counts
from losslessness.laws import ChainLaws, PrefixAcceptanceBound, prefix_acceptance_bound
from losslessness.reference.block import BLOCK_VERIFICATION, TOKEN_VERIFICATION, block_laws
from losslessness.results import AcceptanceCounts, CheckContext, CheckKind, CheckResult, Verdict
from losslessness.samples import ChainCounts, ChainSamples, chain_counts
from losslessness.stats import (
    acceptance_rate_minimum_detectable_shift,
    acceptance_rate_test,
    exact_check_minimum_detectable_rate,
)
from losslessness.stats.binomial import rate_bound_minimum_detectable_shift, rate_bound_test

_EXACT_IDS = {
    0.0: ("disjoint", EDGE_DISJOINT_CHECK_ID),
    1.0: ("p-equals-q", EDGE_P_EQUALS_Q_CHECK_ID),
}

BOUND_TOLERANCE = 1e-12
"""Added to the computed joint bound before testing against it (float64 rounding of a sum of
up to millions of products must never turn a lossless verifier's rate into a violation)."""


def check_acceptance(
    samples: ChainSamples | ChainCounts,
    context: CheckContext,
    *,
    verification: str = TOKEN_VERIFICATION,
) -> list[CheckResult]:
    """Test the acceptance at every reachable draft position (see the module docstring).

    Args:
        samples: outputs ``[R, n, k+1]`` of a case, raw or counted
            (:class:`~losslessness.samples.ChainCounts`).
        context: the case's context.
        verification: how the audited verifier declares it verifies
            (:func:`losslessness.reference.declared_verification`): ``"token"`` (default) or
            ``"block"``; only the SUBOPTIMAL threshold at positions >= 1 depends on it.

    Returns:
        One :class:`CheckResult` per (row type, draft position): ``acceptance`` (position 0:
        exact two-sided binomial test against sum min(p_0, q_0); positions i >= 1: two exact
        one-sided tests of the prefix acceptance against the joint bound and the SUBOPTIMAL
        threshold), or an exact ``edge.*`` check at rates 0 and 1.

    Raises:
        ValueError: ``verification`` is neither ``"token"`` nor ``"block"``.
    """
    if verification not in (TOKEN_VERIFICATION, BLOCK_VERIFICATION):
        raise ValueError(
            f"verification: must be {TOKEN_VERIFICATION!r} or {BLOCK_VERIFICATION!r}, "
            f"got {verification!r}"
        )
    counted = chain_counts(samples)
    case, weights = counted.case, counted.weights
    counts = emitted_counts(counted.outputs)
    results = []
    for r, laws in enumerate(case_laws(case)):
        bound: PrefixAcceptanceBound | None = None
        block_reach: np.ndarray | None = None
        if case.k > 1:
            bound = prefix_acceptance_bound(case.law_target_probs[r], case.law_draft_probs[r])
            if verification == BLOCK_VERIFICATION:
                exact_block = block_laws(
                    case.law_target_probs[r], case.law_draft_probs[r], with_emitted=False
                )
                block_reach = None if exact_block is None else exact_block.reach
        for i in range(case.k):
            if not is_reachable(laws, i):
                continue
            began = time.perf_counter()
            reached = int(weights[counts[r] > i].sum())
            accepted = int(weights[counts[r] > i + 1].sum())
            expected = float(laws.acceptance[i])
            exact = exact_acceptance(laws, i)
            observed = AcceptanceCounts(expected, accepted, reached)
            common: dict[str, Any] = {"position": i, "row": r, "n": reached, "acceptance": observed}
            if exact is not None:
                tag, edge_id = _EXACT_IDS[exact]
                deviations = accepted if exact == 0.0 else reached - accepted
                verdict = Verdict.PASS
                if deviations:
                    verdict = Verdict.LOSSY if exact == 0.0 else Verdict.SUBOPTIMAL
                what = "accepted although p(d) = 0" if exact == 0.0 else "rejected although p == q"
                results.append(
                    context.result(
                        edge_id if tag in case.tags else ACCEPTANCE_CHECK_ID,
                        kind=CheckKind.EXACT,
                        verdict=verdict,
                        statistic=float(deviations),
                        p_value=0.0 if deviations else 1.0,
                        min_detectable_tv=exact_check_minimum_detectable_rate(
                            reached, context.power
                        ),
                        wall_time_s=time.perf_counter() - began,
                        message=f"{deviations} of {reached} drafts {what} at position {i}",
                        **common,
                    )
                )
                continue
            if i >= 1:
                assert bound is not None
                results.append(
                    _prefix_result(
                        context,
                        laws,
                        counts[r],
                        weights,
                        i,
                        r,
                        bound,
                        block_reach,
                        observed,
                        began,
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
                    ACCEPTANCE_CHECK_ID,
                    kind=CheckKind.STATISTICAL,
                    verdict=verdict,
                    statistic=test.statistic,
                    p_value=test.pvalue,
                    min_detectable_tv=acceptance_rate_minimum_detectable_shift(
                        reached, expected, context.alpha, context.power
                    ),
                    wall_time_s=time.perf_counter() - began,
                    message=message,
                    details={"direction": test.direction},
                    **common,
                )
            )
    return results


def _prefix_result(
    context: CheckContext,
    laws: ChainLaws,
    counts: np.ndarray,
    weights: np.ndarray,
    position: int,
    row: int,
    bound: PrefixAcceptanceBound,
    block_reach: np.ndarray | None,
    conditional: AcceptanceCounts,
    began: float,
) -> CheckResult:
    """The assertion at draft position ``position`` >= 1: the count of steps (of all steps)
    that accepted d_0..d_position, against the joint bound (LOSSY above) and the SUBOPTIMAL
    threshold (below), each by an exact one-sided binomial test at half the level. ``counts``
    ``[M]`` are the emitted tokens of the row's distinct steps, each standing for ``weights``
    ``[M]`` sampled steps.

    The record's ``n``, ``statistic`` and ``acceptance`` counts stay those of the acceptance
    at this position given that it was reached, against sum min(p_i, q_i) (what reports
    plot); ``p_value`` and ``min_detectable_tv`` are the prefix tests' (the larger of their
    two minimum detectable shifts, in units of the prefix rate), whose counts are in the
    ``prefix_*`` details and the message."""
    m = position + 1
    steps = int(weights.sum())
    accepted = int(weights[counts > m].sum())
    token_rate = float(laws.reach[m])
    # The token-level algorithm is lossless, so the bound is never below its rate: the max
    # only absorbs float rounding.
    upper = min(1.0, max(float(bound.bound[m]) + BOUND_TOLERANCE, token_rate))
    if block_reach is not None:
        lower, lower_name = min(float(block_reach[m]), upper), "block verification's exact rate"
    else:
        lower, lower_name = token_rate, "the token-level rate prod sum min(p_j, q_j)"
    level = context.alpha / 2
    high = rate_bound_test(accepted, steps, upper, "greater")
    low = rate_bound_test(accepted, steps, lower, "less")
    shift_high = rate_bound_minimum_detectable_shift(steps, upper, level, context.power, "greater")
    shift_low = rate_bound_minimum_detectable_shift(steps, lower, level, context.power, "less")
    observed = accepted / steps if steps else float("nan")
    prefix = f"d_0..d_{position}"
    verdict = Verdict.PASS
    message = (
        f"{prefix} all accepted in {observed:.4f} of {steps} steps, within "
        f"[{lower:.4f} ({lower_name}), {upper:.4f} (bound: {bound.describe(m)})]"
    )
    if high.pvalue <= level:
        verdict = Verdict.LOSSY
        message = (
            f"{prefix} all accepted in {observed:.4f} of {steps} steps, above {upper:.4f}, "
            f"{bound.describe(m)} (one-sided p-value {high.pvalue:.3g} <= {level:.3g}): no "
            "lossless verifier, block verification included, accepts that often"
        )
    elif low.pvalue <= level:
        verdict = Verdict.SUBOPTIMAL
        message = (
            f"{prefix} all accepted in {observed:.4f} of {steps} steps, below {lower:.4f}, "
            f"{lower_name} (one-sided p-value {low.pvalue:.3g} <= {level:.3g}): lossless "
            "verifiers may do this, but it wastes drafts"
        )
    # The record's n, statistic and acceptance counts stay those of acceptance at this position
    # given it was reached, against sum min(p_i, q_i), as reports plot them; the test that
    # decides is on the prefix over all steps, in "prefix_*".
    details = {
        "statistic": "conditional acceptance; verdict from the prefix tests (prefix_*)",
        "prefix_n": steps,
        "prefix_accepted": accepted,
        "prefix_observed_rate": observed,
        "lower_threshold": lower,
        "lower_threshold_kind": "block" if block_reach is not None else "token",
        "upper_bound": upper,
        "upper_bound_exact": bool(bound.exact[m]),
        "upper_bound_cells": bound.cells[m],
        "p_value_higher": high.pvalue,
        "p_value_lower": low.pvalue,
        "min_detectable_shift_higher": shift_high,
        "min_detectable_shift_lower": shift_low,
        "direction": "higher" if observed > upper else "lower" if observed < lower else "within",
    }
    reached = int(weights[counts > position].sum())
    return context.result(
        ACCEPTANCE_CHECK_ID,
        kind=CheckKind.STATISTICAL,
        verdict=verdict,
        statistic=conditional.observed_rate,
        p_value=min(1.0, 2.0 * min(high.pvalue, low.pvalue)),
        min_detectable_tv=max(shift_high, shift_low),
        wall_time_s=time.perf_counter() - began,
        message=message,
        details=details,
        position=position,
        row=row,
        n=reached,
        acceptance=conditional,
    )
