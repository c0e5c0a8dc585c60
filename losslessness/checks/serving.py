"""The serving checks (issue 21): a serving verifier's outputs against its engine profile's law,
per row kind and position, the bonus position included.

For every row kind of a serving case (:class:`~losslessness.cases.ServingCase`):

- ``serving.law`` (statistical), per position i of a sampled request: among the steps that reach
  i, the emitted token follows p'_i, the profile's law at i given the accepted prefix d_<i
  (Leviathan et al. 2022, Thm. 3.5 applied position by position). When the request reads its
  history (penalties, ``min_tokens``), p'_i depends on d_<i: the steps are grouped by prefix
  and the test is a product-multinomial goodness of fit, the sum over groups of each group's
  Cressie-Read statistic (:func:`losslessness.stats.identity_test`, rare tokens pooled) referred
  to chi-square with the summed degrees of freedom (``scipy.stats.chi2``; groups are
  independent given their sizes). A token of law 0 is an exact failure.
- ``serving.greedy`` (exact), per greedy row kind: every output equals greedy verification of
  the profile's argmax token for token.
- ``serving.acceptance`` (statistical), per sampled row kind with drafts: the acceptance at
  position 0 against ``sum_x min(p'_0(x), q_0(x))`` (``p'_0(d_0)`` for a fixed draft): higher is
  LOSSY (no coupling of x ~ p' and d ~ q agrees more often), lower SUBOPTIMAL.

Sizing (:func:`serving_design`): each row kind's steps are the largest ``n_i / reach_i`` over its
positions, ``n_i`` from :func:`losslessness.stats.plan_identity_test` on the law at the empty
prefix (for history-dependent rows an approximation: their groups share the n); positions
reached with probability below :data:`MIN_REACH` do not drive the size and report the larger
minimum detectable TV they reach. Each result states the planned n and the minimum detectable
TV at it, decided before sampling (``details``), beside the one reached (for a test grouped by
prefix: the bound of its largest group alone, a per-group statement).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from losslessness.cases import ServingCase
from losslessness.checks.conditional_law import law_cells
from losslessness.checks.ids import (
    SERVING_ACCEPTANCE_CHECK_ID,
    SERVING_GREEDY_CHECK_ID,
    SERVING_LAW_CHECK_ID,
    SERVING_STRUCTURE_CHECK_ID,
)
from losslessness.protocol import PLACEHOLDER
from losslessness.reference.profiles import EngineProfile
from losslessness.reference.serving import ServingRowLaws
from losslessness.results import AcceptanceCounts, CheckContext, CheckKind, CheckResult, Verdict
from losslessness.samples import ServingSamples
from losslessness.stats import (
    acceptance_rate_minimum_detectable_shift,
    acceptance_rate_test,
    exact_check_minimum_detectable_rate,
    identity_minimum_detectable_tv,
    identity_test,
    plan_identity_test,
)

__all__ = [
    "MIN_REACH",
    "ServingDesign",
    "check_serving",
    "serving_assertion_count",
    "serving_design",
]

MIN_REACH = 0.05
"""Positions reached with a smaller probability do not drive a row kind's size."""


@dataclass(frozen=True)
class ServingDesign:
    """The steps one serving case needs on one profile, decided before sampling.

    Attributes:
        steps: verify calls' rows per kind (every kind gets this many, ``copies`` per call).
        needed_steps: what the design asked for before the cap.
        capped: the cap cut ``needed_steps``.
        planned: by (kind, position), the expected observations at ``steps`` and the minimum
            detectable TV there (``inf`` for an exact position).
    """

    steps: int
    needed_steps: int
    capped: bool
    planned: dict[tuple[int, int], tuple[int, float]]


def _row_laws(case: ServingCase, profile: EngineProfile) -> list[ServingRowLaws]:
    return [ServingRowLaws(profile, case, kind) for kind in range(case.n_rows)]


def serving_assertion_count(case: ServingCase) -> int:
    """Statistical assertions of ``case``: per sampled row kind one law test per position
    (``n + 1``) and one acceptance test when it drafts (greedy kinds are exact)."""
    count = 0
    for row in case.rows:
        if not row.request.greedy:
            count += row.num_draft_tokens + 1 + (1 if row.num_draft_tokens else 0)
    return count


def serving_design(
    case: ServingCase, profile: EngineProfile, tv: float, alpha: float, power: float,
    max_steps: int, min_steps: int,
) -> ServingDesign:
    """Size ``case`` on ``profile`` (see the module docstring).

    Args:
        case: the serving case.
        profile: the engine profile the target claims.
        tv, alpha, power: the design (per-assertion ``alpha``).
        max_steps: cap on the steps per kind.
        min_steps: fewest steps per kind.

    Returns:
        :class:`ServingDesign`.

    Raises:
        ValueError: what the profile raises for a row's request.
    """
    needed = min_steps
    laws = _row_laws(case, profile)
    for row_laws in laws:
        if row_laws.row.request.greedy:
            continue
        for i, reach in enumerate(row_laws.reach):
            if reach < MIN_REACH:
                continue
            n = plan_identity_test(
                row_laws.law(i, ()).numpy(), tv, alpha, power, max_n=max_steps
            ).n
            needed = max(needed, math.ceil((n + 3 * math.sqrt(n * (1 - reach))) / reach))
    steps = min(needed, max_steps)
    planned: dict[tuple[int, int], tuple[int, float]] = {}
    for kind, row_laws in enumerate(laws):
        for i, reach in enumerate(row_laws.reach):
            expected = int(steps * reach)
            if row_laws.row.request.greedy or expected < 1:
                bound = float("inf")
            else:
                law = row_laws.law(i, ()).numpy()
                bound = identity_minimum_detectable_tv(
                    law, expected, alpha, power
                ).minimum_detectable_tv
            planned[(kind, i)] = (expected, bound)
    return ServingDesign(steps, needed, needed > max_steps, planned)


def check_serving(
    samples: ServingSamples, profile: EngineProfile, context: CheckContext,
    design: ServingDesign | None = None,
) -> list[CheckResult]:
    """Every serving check on one case's samples (the module docstring).

    Args:
        samples: the case's drafts and outputs by row kind (their layout already validated by
            the sampler, :func:`losslessness.protocol.validate_serving_output`).
        profile: the engine profile whose law decides.
        context: the case's context (per-assertion level, power, seed).
        design: the sizing decided before sampling (its planned n and minimum detectable TV
            go into each result's details), or None.

    Returns:
        ``serving.structure`` (exact, passed: malformed outputs never reach here), then per
        row kind ``serving.greedy`` or its ``serving.law`` results and ``serving.acceptance``.
    """
    case = samples.case
    results = [
        context.result(
            SERVING_STRUCTURE_CHECK_ID,
            kind=CheckKind.EXACT,
            n=samples.n_steps,
            verdict=Verdict.PASS,
            statistic=0.0,
            p_value=1.0,
            min_detectable_tv=exact_check_minimum_detectable_rate(samples.n_steps, context.power),
            message=f"{samples.n_steps} rows well formed (ids in range, -1 layout, accepted "
            "prefix equal to the drafts, at most num_draft_tokens + 1 tokens)",
        )
    ]
    for kind, row_laws in enumerate(_row_laws(case, profile)):
        drafts, outputs = samples.drafts[kind], samples.outputs[kind]
        if row_laws.row.request.greedy:
            results.append(_greedy_result(context, kind, row_laws, drafts, outputs))
            continue
        for i in range(row_laws.row.num_draft_tokens + 1):
            planned = design.planned.get((kind, i)) if design is not None else None
            results.append(_law_result(context, kind, i, row_laws, drafts, outputs, planned))
        if row_laws.acceptance is not None:
            results.append(_acceptance_result(context, kind, row_laws, outputs))
    return results


def _greedy_result(
    context: CheckContext, kind: int, laws: ServingRowLaws, drafts: np.ndarray,
    outputs: np.ndarray,
) -> CheckResult:
    began = time.perf_counter()
    n = laws.row.num_draft_tokens
    wrong = 0
    example = ""
    for step in range(outputs.shape[0]):
        expected: list[int] = []
        for i in range(n + 1):
            best = int(np.argmax(laws.law(i, tuple(expected)).numpy()))
            if i < n and int(drafts[step, i]) == best:
                expected.append(best)
                continue
            expected.append(best)
            break
        got = [int(t) for t in outputs[step] if t != PLACEHOLDER]
        if got != expected:
            wrong += 1
            if not example:
                example = f"drafts {drafts[step, :n].tolist()}: got {got}, expected {expected}"
    label = laws.row.label
    return context.result(
        SERVING_GREEDY_CHECK_ID,
        kind=CheckKind.EXACT,
        n=int(outputs.shape[0]),
        verdict=Verdict.LOSSY if wrong else Verdict.PASS,
        row=kind,
        statistic=float(wrong),
        p_value=0.0 if wrong else 1.0,
        min_detectable_tv=exact_check_minimum_detectable_rate(int(outputs.shape[0]), context.power),
        wall_time_s=time.perf_counter() - began,
        message=(
            f"{label}: {wrong} of {outputs.shape[0]} rows differ from greedy verification of the "
            f"profile's argmax ({example})"
            if wrong
            else f"{label}: {outputs.shape[0]} rows equal greedy verification of the profile's "
            "argmax"
        ),
        details={"label": label},
    )


def _law_result(
    context: CheckContext, kind: int, position: int, laws: ServingRowLaws, drafts: np.ndarray,
    outputs: np.ndarray, planned: tuple[int, float] | None,
) -> CheckResult:
    began = time.perf_counter()
    vocab = laws.logits.shape[-1]
    reached = outputs[:, position] != PLACEHOLDER
    emitted = outputs[reached, position]
    if laws.history_dependent and position:
        prefixes, group = np.unique(drafts[reached, :position], axis=0, return_inverse=True)
        keys = [tuple(int(t) for t in prefix) for prefix in prefixes]
        group = group.reshape(-1)
    else:
        keys, group = [()], np.zeros(emitted.shape[0], dtype=np.int64)
    statistic, df, impossible = 0.0, 0, 0
    bad_tokens: list[int] = []
    largest: tuple[int, np.ndarray] = (0, laws.law(position, ()).numpy())
    total_counts = np.zeros(vocab, dtype=np.int64)
    expected_mass = np.zeros(vocab, dtype=np.float64)
    for index, prefix in enumerate(keys):
        chosen = emitted[group == index]
        law = laws.law(position, prefix).numpy()
        counts = np.bincount(chosen, minlength=vocab)
        test = identity_test(counts, law)
        statistic += test.statistic
        df += test.df
        impossible += test.zero_mass_count
        bad_tokens += list(test.zero_mass_tokens)
        total_counts += counts
        expected_mass += chosen.size * law
        if chosen.size > largest[0]:
            largest = (int(chosen.size), law)
    n = int(emitted.size)
    pvalue = float(scipy_stats.chi2.sf(statistic, df)) if df else 1.0
    bound = (
        identity_minimum_detectable_tv(largest[1], largest[0], context.alpha, context.power)
        .minimum_detectable_tv
        if largest[0]
        else float("inf")
    )
    label = laws.row.label
    where = f"{label}, position {position}" + (" (bonus)" if position == laws.row.num_draft_tokens
                                                else "")
    p = expected_mass / max(n, 1)
    if impossible:
        verdict = Verdict.LOSSY
        message = (
            f"{where}: {impossible} of {n} emitted tokens have law 0 (tokens {bad_tokens[:5]})"
        )
    elif pvalue <= context.alpha:
        verdict = Verdict.LOSSY
        observed = total_counts / max(n, 1)
        worst = int(np.argmax(np.abs(observed - p)))
        message = (
            f"{where}: the emitted token does not follow the profile's law: p-value {pvalue:.3g} "
            f"<= alpha {context.alpha:.3g}; largest gap at token {worst}: observed "
            f"{observed[worst]:.4f} vs law {p[worst]:.4f}"
        )
    else:
        verdict = Verdict.PASS
        message = f"{where}: the emitted token ~ the profile's law ({n} observations)"
    details: dict[str, object] = {
        "label": label,
        "prefix_groups": len(keys),
        "history_dependent": laws.history_dependent,
        "reach_probability": laws.reach[position],
        "zero_mass_count": impossible,
    }
    if planned is not None:
        details["planned_n"], details["planned_min_detectable_tv"] = planned
    return context.result(
        SERVING_LAW_CHECK_ID,
        kind=CheckKind.STATISTICAL,
        n=n,
        verdict=verdict,
        position=position,
        row=kind,
        statistic=statistic,
        df=df,
        p_value=0.0 if impossible else pvalue,
        min_detectable_tv=bound,
        wall_time_s=time.perf_counter() - began,
        message=message,
        details=details,
        cells=law_cells(total_counts, p) if n else None,
    )


def _acceptance_result(
    context: CheckContext, kind: int, laws: ServingRowLaws, outputs: np.ndarray
) -> CheckResult:
    began = time.perf_counter()
    assert laws.acceptance is not None
    n = int(outputs.shape[0])
    accepted = int((outputs[:, 1] != PLACEHOLDER).sum())
    test = acceptance_rate_test(accepted, n, laws.acceptance)
    label = laws.row.label
    if test.pvalue > context.alpha:
        verdict = Verdict.PASS
    else:
        verdict = Verdict.LOSSY if test.direction == "higher" else Verdict.SUBOPTIMAL
    shift = (
        acceptance_rate_minimum_detectable_shift(n, laws.acceptance, context.alpha, context.power)
        if n
        else float("inf")
    )
    return context.result(
        SERVING_ACCEPTANCE_CHECK_ID,
        kind=CheckKind.STATISTICAL,
        n=n,
        verdict=verdict,
        position=0,
        row=kind,
        statistic=test.statistic,
        p_value=test.pvalue,
        min_detectable_tv=shift,
        wall_time_s=time.perf_counter() - began,
        message=(
            f"{label}: acceptance at position 0 {accepted}/{n} vs sum min(p', q) "
            f"{laws.acceptance:.4f} (p-value {test.pvalue:.3g}, {test.direction})"
        ),
        details={"label": label},
        acceptance=AcceptanceCounts(laws.acceptance, accepted, n),
    )
