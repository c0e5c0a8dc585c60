"""Run-level check: are a target's statistical p-values uniform? (issue 13, item 5)

Every statistical assertion of a run is tested at a tiny per-assertion level (about 1e-3 / 200
= 5e-6), so a small deviation present at every position (a ratio p / q computed in float16:
about TV 0.006 per position) can pass every one of them while moving each p-value a little
towards 0. :func:`check_pvalue_uniformity` collects the p-values that are independent under
the null and tests them together against U(0, 1) with
:func:`losslessness.stats.uniformity.uniformity_test` (one-sided KS and higher criticism), as
one more assertion of the run's budget.

**Which p-values are independent under the null.** Kept:

- ``law`` checks (statistical, not SKIPPED or ERROR, ``df >= 2``: a real chi-square p-value
  on at least three cells, see below): one per (case, row type, position). Different cases and
  different row types use disjoint samples. Positions of one row type are sequentially
  independent: the law test at position i uses the tokens at i of the samples that reach i,
  and under a lossless token-level verifier the token emitted at a reached position i follows
  p_i whatever happened at earlier positions (the case's rows p_i do not depend on the prefix),
  so, given everything up to position i - 1 (which decides which samples reach i, hence the
  earlier p-values and the sample size at i), the p-value at i has the null law of a
  chi-square test of n_i fresh samples from p_i. Chaining these conditional laws makes the
  p-values independent (each uniform up to the chi-square approximation). The argument
  assumes token-level verification; block verification decides the accepted length jointly,
  and its control is measured empirically (``benchmarks/uniformity_power.py``).
- ``sequence-law`` checks (one per end-to-end target and case, on their own generated
  sequences), under the same ``df >= 2`` rule.

**Why not df = 1.** The uniformity test adds up small departures from U(0, 1), and so also the
error of the chi-square approximation itself. With two cells that error is largest (a skewed
binomial and a lattice of values): measured over 6,000 null sets of m = 100 chi-square p-values
of samples from the tested law (``tests/calibration/test_uniformity_calibration.py``), two cells
[0.05, 0.95] at n = 1000 raise 144 false alarms at nominal 1e-2 (60 expected) and 23 at 1e-3 (6
expected); at n = 4000 still 98 and 11, while three cells [0.02, 0.03, 0.95] at n = 1000 (69, 4)
and 16 cells of Dirichlet(0.3) at n = 2000 (75, 7) stay near nominal. The default design's
two-cell law tests (n 3,500 to 7,500) are therefore left out (5 of the reference's 34 p-values).

Dropped, and counted by check id in the result's ``details["dropped"]``: ``acceptance`` and
``independence`` checks and every ``tree.*`` check (they reuse the samples of the law tests, so
their p-values depend on the law p-values), exact checks and checks without a p-value, SKIPPED
and ERROR checks, and law / sequence-law checks with ``df < 2`` (``df == 0``: one pooled cell,
no test; ``df == 1``: see above).

Source of the statistics: Donoho, D. and Jin, J. (2004). Higher criticism for detecting sparse
heterogeneous mixtures. Ann. Statist. 32(3), 962-994; the one-sided Kolmogorov-Smirnov test.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from losslessness.checks.ids import LAW_CHECK_ID, PVALUES_CHECK_ID, SEQUENCE_LAW_CHECK_ID
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.stats.uniformity import uniformity_test

__all__ = [
    "INDEPENDENT_PVALUE_CHECK_IDS",
    "MIN_DF",
    "MIN_PVALUES",
    "check_pvalue_uniformity",
    "independent_pvalues",
]

INDEPENDENT_PVALUE_CHECK_IDS = (LAW_CHECK_ID, SEQUENCE_LAW_CHECK_ID)
"""Check ids whose p-values are independent under the null (module docstring)."""

MIN_PVALUES = 10
"""Fewest usable p-values the check tests; below it the result is SKIPPED."""

MIN_DF = 2
"""Smallest chi-square degrees of freedom whose p-values the check uses (module docstring)."""


def _usable(check: CheckResult) -> bool:
    return (
        check.check_id in INDEPENDENT_PVALUE_CHECK_IDS
        and check.kind is CheckKind.STATISTICAL
        and check.verdict not in (Verdict.SKIPPED, Verdict.ERROR)
        and check.df is not None
        and check.df >= MIN_DF
        and check.p_value is not None
    )


def independent_pvalues(
    checks: Sequence[CheckResult],
) -> tuple[list[float], dict[str, int], dict[str, int]]:
    """The p-values of ``checks`` that may be treated as independent under the null.

    Args:
        checks: one target's check results (any order, any check ids).

    Returns:
        ``(pvalues, used, dropped)``: the kept p-values in the order of ``checks``, and how many
        checks were kept / dropped, by check id.
    """
    pvalues: list[float] = []
    used: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    for check in checks:
        if _usable(check):
            assert check.p_value is not None
            pvalues.append(float(check.p_value))
            used[check.check_id] += 1
        else:
            dropped[check.check_id] += 1
    return pvalues, dict(sorted(used.items())), dict(sorted(dropped.items()))


def check_pvalue_uniformity(checks: Sequence[CheckResult], context: CheckContext) -> CheckResult:
    """Test one target's independent statistical p-values against U(0, 1), towards small values.

    Args:
        checks: every check result of one target (the selection is
            :func:`independent_pvalues`'s).
        context: the run-level context: ``target``, ``alpha`` the per-assertion level this
            assertion spends (one share of the run's budget), ``power``, ``seed``; its case
            fields name what the result is attached to (the engine's choice, e.g. ``case_id``
            ``"run"``).

    Returns:
        A STATISTICAL :class:`CheckResult` with check id ``pvalues``: LOSSY when the combined
        p-value ``min(1, 2 min(p_KS, p_HC))`` is ``<= context.alpha``, else PASS; SKIPPED (no
        test) when fewer than :data:`MIN_PVALUES` p-values are usable. ``statistic`` is the
        one-sided KS D+, ``n`` the number m of p-values, ``details`` holds ``m``, ``ks_d``,
        ``ks_pvalue``, ``hc``, ``hc_pvalue``, ``hc_index``, ``hc_terms`` and the ``used`` /
        ``dropped`` counts by check id. ``min_detectable_tv`` is ``inf``: the check has no
        design TV (its power is measured against the zoo, not planned).

    Raises:
        ValueError: a kept p-value is NaN or outside [0, 1] (from the uniformity test).
    """
    began = time.perf_counter()
    pvalues, used, dropped = independent_pvalues(checks)
    m = len(pvalues)
    counts = {"used": used, "dropped": dropped, "m": m}
    if m < MIN_PVALUES:
        return context.result(
            PVALUES_CHECK_ID,
            kind=CheckKind.STATISTICAL,
            n=m,
            verdict=Verdict.SKIPPED,
            min_detectable_tv=float("inf"),
            wall_time_s=time.perf_counter() - began,
            message=(
                f"only {m} independent p-values (law and sequence-law with df >= {MIN_DF}); the "
                f"uniformity test needs at least {MIN_PVALUES}"
            ),
            details=counts,
        )
    test = uniformity_test(pvalues)
    lossy = test.pvalue <= context.alpha
    message = (
        f"{m} independent p-values vs U(0, 1): KS D+ {test.ks_statistic:.4f} "
        f"(p {test.ks_pvalue:.3g}), higher criticism {test.hc_statistic:.3g} at rank "
        f"{test.hc_index} (p {test.hc_pvalue:.3g}); combined p-value {test.pvalue:.3g} "
        f"{'<=' if lossy else '>'} alpha {context.alpha:.3g}"
    )
    if lossy:
        message += ": the p-values lean towards 0, many small deviations add up"
    return context.result(
        PVALUES_CHECK_ID,
        kind=CheckKind.STATISTICAL,
        n=m,
        verdict=Verdict.LOSSY if lossy else Verdict.PASS,
        min_detectable_tv=float("inf"),
        statistic=test.ks_statistic,
        p_value=test.pvalue,
        wall_time_s=time.perf_counter() - began,
        message=message,
        details={
            **counts,
            "ks_d": test.ks_statistic,
            "ks_pvalue": test.ks_pvalue,
            "hc": test.hc_statistic,
            "hc_pvalue": test.hc_pvalue,
            "hc_index": test.hc_index,
            "hc_terms": test.hc_terms,
        },
    )
