"""Calibration of the whole pipeline (audit sampling -> checks -> tests) on a correct verifier.

Over many seeds, the reference verifier's identity-test p-values must be uniform (KS test)
and the false-alarm rate at nominal levels must not exceed the level; the acceptance tests
(exact binomial, conservative) must not exceed theirs either. Each assertion here is itself
a test at level 1e-3 (5 assertions: this file's own false-alarm budget is 5e-3, and with fixed
seeds it is deterministic). Measured rates are printed (``pytest -s``) for the closing note.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats

from losslessness.batteries import default_chain_battery
from losslessness.checks import check_acceptance, check_conditional_laws
from losslessness.config import AuditConfig
from losslessness.engine import run_audit
from losslessness.engine.draw import sample_chain
from losslessness.reference import verify
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.targets import resolve_adapter

SEEDS = 400
STEPS = 3000
LEVEL = 1e-3


@pytest.fixture(scope="module")
def null_pvalues() -> dict[str, np.ndarray]:
    """p-values of every law and acceptance assertion of the v16-near-k4 case (k = 4, five
    positions) over SEEDS independent runs of the reference verifier."""
    case = next(c for c in default_chain_battery() if c.case_id == "v16-near-k4")
    law, acceptance = [], []
    for seed in range(SEEDS):
        samples = sample_chain(verify, case, STEPS, seed=10_000 + seed)
        context = CheckContext(
            "reference",
            case.case_id,
            case.summary,
            case.case_hash,
            alpha=0.05,
            power=0.9,
            tv=0.05,
            seed=seed,
        )
        law += [r.p_value for r in check_conditional_laws(samples, context)]
        acceptance += [r.p_value for r in check_acceptance(samples, context)]
    return {"law": np.array(law, dtype=float), "acceptance": np.array(acceptance, dtype=float)}


@pytest.mark.parametrize("nominal", [0.05, 0.01])
def test_identity_false_alarm_rate_is_within_nominal_level(
    null_pvalues: dict[str, np.ndarray], nominal: float
) -> None:
    """The law checks' false-alarm rate on the reference is not significantly above nominal."""
    pvalues = null_pvalues["law"]
    alarms = int((pvalues <= nominal).sum())
    print(f"law checks: {alarms}/{pvalues.size} = {alarms / pvalues.size:.4f} at level {nominal}")
    assert stats.binomtest(alarms, pvalues.size, nominal, alternative="greater").pvalue > LEVEL


def test_identity_pvalues_are_uniform_under_the_null(null_pvalues: dict[str, np.ndarray]) -> None:
    """KS test of the law checks' p-values against Uniform(0, 1)."""
    result = stats.kstest(null_pvalues["law"], "uniform")
    print(f"law p-values: KS statistic {result.statistic:.4f}, p {result.pvalue:.3g}")
    assert result.pvalue > LEVEL


@pytest.mark.parametrize("nominal", [0.05, 0.01])
def test_acceptance_false_alarm_rate_is_within_nominal_level(
    null_pvalues: dict[str, np.ndarray], nominal: float
) -> None:
    """The exact binomial acceptance tests do not alarm more often than their level."""
    pvalues = null_pvalues["acceptance"]
    alarms = int((pvalues <= nominal).sum())
    print(f"acceptance: {alarms}/{pvalues.size} = {alarms / pvalues.size:.4f} at level {nominal}")
    assert stats.binomtest(alarms, pvalues.size, nominal, alternative="greater").pvalue > LEVEL


def test_budget_is_split_over_exactly_the_statistical_assertions() -> None:
    """Bonferroni bookkeeping: the run's statistical results (the run-level p-value test of
    each target counted even when too few p-values let it run) number n_assertions, each at
    family_wise_alpha / n_assertions (its fixed-n level plus its sequential level), so their
    levels sum to the family-wise rate."""
    config = AuditConfig(cases=("v2-tilted", "v64-zeros", "edge-one-hot", "edge-disjoint"))
    reference = resolve_adapter("reference")
    twin = dataclasses.replace(reference, name="reference-twin")
    result = run_audit([reference, twin], config)
    statistical = [
        c
        for t in result.targets
        for c in t.checks
        if c.kind is CheckKind.STATISTICAL
        and (c.verdict is not Verdict.SKIPPED or c.check_id == "pvalues")
    ]
    assert len(statistical) == result.n_assertions
    assert sum(c.check_id == "pvalues" for c in statistical) == 2

    def level(check: CheckResult) -> float:
        return check.alpha + (check.sequential.alpha if check.sequential is not None else 0.0)

    assert all(
        level(c) == pytest.approx(config.family_wise_alpha / result.n_assertions)
        for c in statistical
    )
    assert sum(level(c) for c in statistical) == pytest.approx(config.family_wise_alpha)


def test_default_audit_meets_its_design_power_on_every_identity_test() -> None:
    """Every identity test of the default audit of the reference reaches the design TV: its
    reported minimum detectable TV is at most --tv (0.05), so a LOSSLESS verdict covers
    every deviation of TV >= 0.05 at every position, with power >= 0.9."""
    result = run_audit([resolve_adapter("reference")], AuditConfig())
    laws = [
        c
        for c in result.targets[0].checks
        if c.check_id == "law" and c.kind is CheckKind.STATISTICAL
    ]
    assert laws
    worst = max(laws, key=lambda c: c.min_detectable_tv)
    print(f"largest minimum detectable TV: {worst.min_detectable_tv:.4f} at {worst.where}")
    assert worst.min_detectable_tv <= 0.05 + 1e-9, worst.where
