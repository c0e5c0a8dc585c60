"""Precision diagnostics and the tolerances derived from them (issue 6, part 4)."""

from __future__ import annotations

import pytest
import torch

from losslessness.batteries import default_chain_battery
from losslessness.checks.precision import (
    check_precision,
    decision_tolerance,
    law_after_cast,
    precision_report,
    sample_tolerance,
    summation_error_bound,
    unit_roundoff,
)
from losslessness.results import CheckContext, CheckKind, Verdict

CASES = {case.case_id: case for case in default_chain_battery()}


def test_precision_float64_cast_induces_no_tv() -> None:
    """Casting float64 inputs to float64 changes no ratio, and the laws only by the float64
    rounding of renormalisation."""
    report = precision_report(CASES["v16-near-k4"], 0, torch.float64)
    assert report.max_tv < 1e-14 and report.ratio_relative_error == 0.0


def test_precision_tv_grows_as_precision_drops() -> None:
    """float32 moves the laws by less than 1e-6 TV, float16 by more, bfloat16 by more still
    (q near p: the residual amplifies input rounding by 1 / TV(p, q))."""
    tvs = [
        precision_report(CASES["v16-near-k4"], 0, dtype).max_tv
        for dtype in (torch.float32, torch.float16, torch.bfloat16)
    ]
    assert tvs[0] < 1e-6 < tvs[1] < tvs[2]


def test_precision_float32_ratio_error_within_decision_tolerance() -> None:
    """On every battery case the float32 acceptance ratio is within the coupling check's
    decision tolerance of the float64 one."""
    for case in CASES.values():
        for row in range(case.n_rows):
            error = precision_report(case, row, torch.float32).ratio_relative_error
            assert error <= decision_tolerance(torch.float32), case.case_id


def test_precision_results_are_diagnostics_never_lossy() -> None:
    """check_precision reports one PASS diagnostic per (row type, dtype), flagging the
    deviations a statistical check at the design TV could see."""
    case = CASES["v16-near-k4"]
    context = CheckContext.for_case("precision", case, alpha=1e-3, power=0.9, tv=0.01, seed=0)
    results = check_precision(case, context)
    assert len(results) == 3
    assert all(r.verdict is Verdict.PASS and r.kind is CheckKind.EXACT for r in results)
    assert all(r.details["diagnostic"] == "precision" for r in results)
    visible = {r.details["dtype"]: r.details["above_design_tv"] for r in results}
    assert visible == {"torch.float32": False, "torch.float16": False, "torch.bfloat16": True}


def test_law_after_cast_keeps_zeros_and_sums_to_one() -> None:
    """The cast law keeps exact zeros, sums to 1, and falls back to the argmax for a row whose
    every mass underflows."""
    case = CASES["v64-zeros"]
    cast = law_after_cast(case.target_probs, torch.float16)
    assert torch.equal(cast == 0, case.target_probs == 0)
    assert torch.allclose(cast.sum(-1), torch.ones((), dtype=torch.float64), atol=1e-12)
    tiny = torch.tensor([[1e-30, 2e-30]], dtype=torch.float64) / 3e-30
    assert law_after_cast(tiny * 1e-40, torch.float16).tolist() == [[0.0, 1.0]]


def test_tolerances_follow_unit_roundoff_and_validate_arguments() -> None:
    """u = eps / 2; gamma_n is vacuous (1.0) once n u >= 1/2; the sample tolerance is vacuous
    at zero mass and rejects bad V and mass."""
    assert unit_roundoff(torch.float32) == 2.0**-24
    assert decision_tolerance(torch.float64) == 8 * 2.0**-53
    assert summation_error_bound(torch.bfloat16, 4096) == 1.0
    assert sample_tolerance(torch.float32, 4096, 0.0) == 1.0
    assert sample_tolerance(torch.float32, 8, 1.0) < 1e-5
    with pytest.raises(ValueError, match="vocab_size"):
        sample_tolerance(torch.float32, 0, 0.5)
    with pytest.raises(ValueError, match="mass"):
        sample_tolerance(torch.float32, 8, 1.5)
    with pytest.raises(ValueError, match="dtype"):
        unit_roundoff(torch.int64)
