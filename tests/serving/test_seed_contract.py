"""The seed contract (issue 21, item 4): the exact check, its runner on the reference and the
seed mutants, the IRREPRODUCIBLE verdict's precedence and exit code 6, and every report
showing it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from losslessness.checks.seed_contract import SeedObservation, check_seed_contract
from losslessness.config import RunConfig
from losslessness.engine import run_audit
from losslessness.engine.seed_contract import SEED_CONTRACT_CASE_ID, seed_contract_observations
from losslessness.reference.serving import ServingReference
from losslessness.results import (
    EXIT_CODES,
    CheckContext,
    CheckKind,
    TargetVerdict,
    Verdict,
    design_shortfalls,
    target_verdict,
)
from losslessness.zoo.seeds import seed_zoo
from losslessness.zoo.serving import serving_zoo
from tests.serving.profile import small_profile

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = CheckContext("target", SEED_CONTRACT_CASE_ID, "summary", "hash", 0.01, 0.9, 0.05, 7)


def test_check_passes_identical_outputs_and_counts_the_comparisons() -> None:
    """Outputs equal per request: PASS, exact, n = comparisons (observations less requests)."""
    observations = [
        SeedObservation("a", "alone", (1, 2, -1)),
        SeedObservation("a", "beside x", (1, 2, -1)),
        SeedObservation("b", "alone", (3, -1, -1)),
        SeedObservation("b", "beside y", (3, -1, -1)),
        SeedObservation("b", "beside z", (3, -1, -1)),
    ]
    result = check_seed_contract(observations, CONTEXT)
    assert result.verdict is Verdict.PASS and result.kind is CheckKind.EXACT
    assert result.n == 3 and result.alpha == 0.0 and result.p_value == 1.0


def test_check_names_the_request_the_compositions_and_both_outputs_of_a_difference() -> None:
    """One different output is IRREPRODUCIBLE (never LOSSY), naming the request, the two
    compositions and both outputs; a second different output of the same request is not
    counted twice."""
    observations = [
        SeedObservation("req-a", "alone (B=1)", (1, 2, -1)),
        SeedObservation("req-a", "row 2 of 5", (1, 4, -1)),
        SeedObservation("req-a", "last of 4", (5, -1, -1)),
        SeedObservation("req-b", "alone (B=1)", (3, -1, -1)),
    ]
    result = check_seed_contract(observations, CONTEXT)
    assert result.verdict is Verdict.IRREPRODUCIBLE
    assert "req-a gave [1, 2, -1] alone (B=1) but [1, 4, -1] row 2 of 5" in result.message
    assert result.statistic == 1.0 and result.details["irreproducible"] == ["req-a"]


def test_check_refuses_no_observations() -> None:
    """An empty list is an error naming the argument, not a vacuous PASS."""
    with pytest.raises(ValueError, match="observations"):
        check_seed_contract([], CONTEXT)


def test_reference_and_law_mutants_keep_the_contract() -> None:
    """The reference serving verifier, and every serving mutant whose bug is in the law, keep
    the seed contract: their seeded rows depend on their seed and history alone."""
    for entry in serving_zoo(small_profile()):
        observations = seed_contract_observations(entry.verifier, seed=3, timeout_s=None)
        assert check_seed_contract(observations, CONTEXT).verdict is Verdict.PASS, entry.name


@pytest.mark.parametrize("entry", seed_zoo(small_profile()), ids=lambda e: e.name)
def test_each_seed_mutant_breaks_the_contract_for_every_seeded_request(entry: object) -> None:
    """Each seed mutant (shared stream, one batch stream from the first seed, seed plus row
    index) is IRREPRODUCIBLE, on every seeded request, with float32 and bfloat16 logits."""
    verifier = entry.verifier  # type: ignore[attr-defined]
    result = check_seed_contract(seed_contract_observations(verifier, 3, None), CONTEXT)
    assert result.verdict is Verdict.IRREPRODUCIBLE
    assert result.details["irreproducible"] and len(result.details["irreproducible"]) == 6


def test_compositions_vary_position_neighbours_and_the_shared_generator() -> None:
    """Every seeded request is seen alone, beside unseeded, greedy and other-seeded rows, in
    copies of itself and under another shared-generator seed, at both dtypes."""
    observations = seed_contract_observations(ServingReference(small_profile()), 3, None)
    compositions = {o.composition for o in observations}
    for needed in ("alone (B=1)", "beside unseeded rows", "beside greedy rows",
                   "other seeds", "copies of itself", "shared generator seeded otherwise"):
        assert any(needed in c for c in compositions), needed
    assert {o.request.rsplit("[", 1)[1] for o in observations} == {
        "float32 logits]", "bfloat16 logits]"
    }


def test_irreproducible_ranks_below_lossy_and_error_and_above_inconclusive() -> None:
    """LOSSY > ERROR > IRREPRODUCIBLE > INCONCLUSIVE > LOSSLESS; its exit code is 6."""
    def check(verdict: Verdict) -> object:
        return CONTEXT.result("x", kind=CheckKind.EXACT, n=1, verdict=verdict,
                              min_detectable_tv=1.0)

    broken = check(Verdict.IRREPRODUCIBLE)
    assert target_verdict([broken, check(Verdict.PASS)]) is TargetVerdict.IRREPRODUCIBLE
    assert target_verdict([broken, check(Verdict.LOSSY)]) is TargetVerdict.LOSSY
    assert target_verdict([broken, check(Verdict.ERROR)]) is TargetVerdict.ERROR
    assert target_verdict([broken], shortfalls=["capped"]) is TargetVerdict.IRREPRODUCIBLE
    assert target_verdict([broken], complete=False) is TargetVerdict.INCOMPLETE
    assert EXIT_CODES[TargetVerdict.IRREPRODUCIBLE] == 6


def test_audit_of_a_seed_mutant_is_irreproducible_and_the_reference_keeps_the_contract() -> None:
    """Through run_audit (law case and seed contract): a seed mutant is IRREPRODUCIBLE with its
    law checks passing, exit code 6; the reference passes every check, the seed contract
    included. At 300 steps one of its law assertions (position 2 of a row kind, about 120
    rows) detects no TV distance, so the reference is INCONCLUSIVE, saying so, not LOSSLESS."""
    config = RunConfig(cases=("serving-seeded-ragged", SEED_CONTRACT_CASE_ID), steps=300)
    mutant = seed_zoo(small_profile())[0]
    reference = next(e for e in serving_zoo(small_profile()) if e.name == "serving-reference")
    result = run_audit([mutant.adapter, reference.adapter], config)
    broken, kept = result.targets
    assert broken.verdict is TargetVerdict.IRREPRODUCIBLE, [c.message for c in broken.checks]
    assert all(c.verdict is Verdict.PASS for c in broken.checks if c.check_id != "seed.contract")
    assert all(c.verdict in (Verdict.PASS, Verdict.SKIPPED) for c in kept.checks)
    assert any(c.check_id == "seed.contract" and c.verdict is Verdict.PASS for c in kept.checks)
    assert kept.verdict is TargetVerdict.INCONCLUSIVE
    assert design_shortfalls(kept.checks, result.config) == [
        "1 cases with assertions that detect no TV distance (minimum detectable TV >= 1: too "
        "few steps for any claim): serving-seeded-ragged"
    ]
    assert result.exit_code == 6


def test_cli_exits_6_and_every_report_shows_irreproducible(tmp_path: Path) -> None:
    """A ``pkg.module:callable`` serving target (in its worker) that drops its seeds: the audit
    exits 6, and the terminal table, JSON, Markdown, HTML and JUnit reports say
    IRREPRODUCIBLE."""
    target = "tests.serving.targets:seeded_from_shared_stream"
    record = tmp_path / "audit.json"
    command = [
        sys.executable, "-m", "losslessness.cli", "audit", target, "--protocol", "serving",
        "--case", SEED_CONTRACT_CASE_ID, "--no-progress", "--json", str(record),
    ]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 6, run.stdout + run.stderr
    assert "IRREPRODUCIBLE" in run.stdout
    data = json.loads(record.read_text())
    assert data["targets"][0]["verdict"] == "IRREPRODUCIBLE"
    out = tmp_path / "reports"
    report = subprocess.run(
        [sys.executable, "-m", "losslessness.cli", "report", str(record), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert report.returncode == 0, report.stdout + report.stderr
    for name in ("report.md", "report.html", "junit.xml"):
        assert "IRREPRODUCIBLE" in (out / name).read_text(), name
    assert 'type="IRREPRODUCIBLE"' in (out / "junit.xml").read_text()
