"""The run-level uniformity check (losslessness.checks.pvalues): which p-values it keeps (law
and sequence-law with a real chi-square test) and drops (checks sharing samples, exact,
SKIPPED, ERROR, df 0), its verdicts, and its SKIPPED result below 10 p-values."""

from __future__ import annotations

import numpy as np
import pytest

from losslessness.checks.ids import (
    ACCEPTANCE_CHECK_ID,
    ALL_CHECK_IDS,
    INDEPENDENCE_CHECK_ID,
    LAW_CHECK_ID,
    PVALUES_CHECK_ID,
    SEQUENCE_LAW_CHECK_ID,
    TREE_LAW_CHECK_ID,
)
from losslessness.checks.pvalues import MIN_PVALUES, check_pvalue_uniformity, independent_pvalues
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict

CONTEXT = CheckContext(
    target="t",
    case_id="run",
    case_summary="every case",
    case_hash="",
    alpha=1e-3,
    power=0.9,
    tv=0.05,
    seed=0,
)


def _check(
    check_id: str,
    p_value: float | None,
    *,
    df: int | None = 3,
    kind: CheckKind = CheckKind.STATISTICAL,
    verdict: Verdict = Verdict.PASS,
) -> CheckResult:
    return CONTEXT.result(
        check_id,
        kind=kind,
        n=100,
        verdict=verdict,
        min_detectable_tv=0.1,
        df=df,
        p_value=p_value,
    )


def test_selection_keeps_law_and_sequence_law_and_drops_shared_sample_checks() -> None:
    """Kept: statistical law and sequence-law checks with df >= 2 (LOSSY ones too). Dropped:
    acceptance, independence and tree.law (they share the law tests' samples), exact checks,
    SKIPPED and ERROR results, df 0 and df 1 (two-cell chi-square p-values, biased) and missing
    p-values; counts by check id."""
    checks = [
        _check(LAW_CHECK_ID, 0.3),
        _check(LAW_CHECK_ID, 1e-9, verdict=Verdict.LOSSY),
        _check(SEQUENCE_LAW_CHECK_ID, 0.7),
        _check(LAW_CHECK_ID, 1.0, df=0),
        _check(LAW_CHECK_ID, 0.4, df=1),
        _check(SEQUENCE_LAW_CHECK_ID, 0.4, df=1),
        _check(LAW_CHECK_ID, 0.6, df=2),
        _check(LAW_CHECK_ID, None, df=None, kind=CheckKind.EXACT, verdict=Verdict.SKIPPED),
        _check(LAW_CHECK_ID, 0.5, verdict=Verdict.ERROR),
        _check("edge.one-hot", 1.0, df=None, kind=CheckKind.EXACT),
        _check(ACCEPTANCE_CHECK_ID, 0.01, df=None),
        _check(INDEPENDENCE_CHECK_ID, 0.02),
        _check(TREE_LAW_CHECK_ID, 0.03),
        _check(SEQUENCE_LAW_CHECK_ID, 0.0, df=None, verdict=Verdict.LOSSY),
    ]
    pvalues, used, dropped = independent_pvalues(checks)
    assert pvalues == [0.3, 1e-9, 0.7, 0.6]
    assert used == {LAW_CHECK_ID: 3, SEQUENCE_LAW_CHECK_ID: 1}
    assert dropped == {
        ACCEPTANCE_CHECK_ID: 1,
        "edge.one-hot": 1,
        INDEPENDENCE_CHECK_ID: 1,
        LAW_CHECK_ID: 4,
        SEQUENCE_LAW_CHECK_ID: 2,
        TREE_LAW_CHECK_ID: 1,
    }


def test_fewer_than_ten_usable_pvalues_is_skipped_with_the_reason() -> None:
    """Nine usable p-values (plus any number of dropped ones) give SKIPPED, no p-value, and the
    counts in the details."""
    checks = [_check(LAW_CHECK_ID, 1e-12)] * (MIN_PVALUES - 1)
    checks += [_check(ACCEPTANCE_CHECK_ID, 1e-12)] * 20
    result = check_pvalue_uniformity(checks, CONTEXT)
    assert result.verdict is Verdict.SKIPPED
    assert result.p_value is None and result.n == MIN_PVALUES - 1
    assert "at least 10" in result.message
    assert result.details["dropped"] == {ACCEPTANCE_CHECK_ID: 20}


def test_ten_uniform_pvalues_pass_and_the_result_carries_the_parts() -> None:
    """Evenly spread p-values PASS; the result is a statistical ``pvalues`` check with the KS
    statistic, the combined p-value and the parts (m, KS, HC) in the details."""
    checks = [_check(LAW_CHECK_ID, (i + 0.5) / 10) for i in range(10)]
    result = check_pvalue_uniformity(checks, CONTEXT)
    assert result.check_id == PVALUES_CHECK_ID
    assert result.kind is CheckKind.STATISTICAL and result.alpha == CONTEXT.alpha
    assert result.verdict is Verdict.PASS
    assert result.n == 10 and result.details["m"] == 10
    assert result.p_value == pytest.approx(
        min(1.0, 2 * min(result.details["ks_pvalue"], result.details["hc_pvalue"]))
    )
    assert result.statistic == result.details["ks_d"]
    assert {"hc", "hc_index", "hc_terms", "used", "dropped"} <= set(result.details)


def test_many_small_shifts_that_pass_one_by_one_are_lossy_together() -> None:
    """Forty law p-values drawn from Beta(0.25, 1), every one above alpha = 1e-3 (each law
    check PASSes), together give a combined p-value <= alpha: LOSSY."""
    rng = np.random.default_rng(5)
    values = rng.beta(0.25, 1.0, size=200)
    values = values[values > 1e-3][:40]
    checks = [_check(LAW_CHECK_ID, float(v)) for v in values]
    result = check_pvalue_uniformity(checks, CONTEXT)
    assert result.verdict is Verdict.LOSSY, result.message
    assert result.p_value is not None and result.p_value <= CONTEXT.alpha


def test_pvalues_check_id_is_declared_last_among_all_check_ids() -> None:
    """``pvalues`` is a declared check id (``--only`` and the reports know it)."""
    assert PVALUES_CHECK_ID == "pvalues" and ALL_CHECK_IDS[-1] == PVALUES_CHECK_ID
