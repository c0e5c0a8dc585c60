"""The tree comparison (benchmarks.tree_detection_rates, benchmarks.tree_peers): our tree checks
detect a lossy tree mutant and pass a lossless control on tiny budgets; SGLang's structural test
passes every lossless reference and fails where its deterministic output changes; the
first-token chi-square holds its level and detects a gross deviation; the script rewrites only
its own section of the report. Every seed is fixed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch

from benchmarks.tree_detection_rates import (
    BEGIN_MARKER,
    END_MARKER,
    main,
    measure,
    splice_section,
)
from benchmarks.tree_peers import (
    first_token_chi_square,
    sglang_greedy_structural,
    sglang_structural,
)
from losslessness.protocol import DRAFT_SCHEMES
from losslessness.reference.tree import verify_tree, verify_tree_greedy
from losslessness.zoo import MUTANTS
from losslessness.zoo.tree import final_from_root_row, greedy_final_from_parent

LOSSY = "tree-final-from-root-row"
CONTROL = "tree-siblings-reversed"


def test_ours_detects_a_lossy_tree_mutant_and_passes_a_control_at_tiny_budgets() -> None:
    """On nested budgets of 300 and 1000 steps (2 and 1 seeds), ours reports the lossy mutant
    in every trial and the lossless control in none, grid and false-alarm run alike; the
    structural test fails the wrong final row on every seed."""
    m = measure(
        [MUTANTS[LOSSY], MUTANTS[CONTROL]],
        budgets=(1000, 300),
        seeds={300: 2, 1000: 1},
        false_alarm_seeds=2,
        false_alarm_budget=300,
        show_progress=False,
    )
    assert m.budgets == (300, 1000)
    for budget, trials in ((300, 2), (1000, 1)):
        lossy = m.grid[LOSSY, budget, "ours"]
        assert (lossy.detected, lossy.trials) == (trials, trials)
        control = m.grid[CONTROL, budget, "ours"]
        assert (control.detected, control.trials) == (0, trials)
        assert m.grid[LOSSY, budget, "sglang-structural"].detected == trials
    assert m.false_alarms[CONTROL, "ours"].trials == 2
    assert m.false_alarms[CONTROL, "ours"].detected == 0
    assert (LOSSY, "ours") not in m.false_alarms


@pytest.mark.parametrize("scheme", DRAFT_SCHEMES)
def test_sglang_structural_passes_the_lossless_reference_on_every_scheme(scheme: str) -> None:
    """One-hot targets fix every lossless verifier's output: the reference passes on every
    seed tried, and a verifier drawing its final token from the root's row fails."""
    for seed in range(5):
        generator = torch.Generator().manual_seed(seed)
        assert not sglang_structural(verify_tree, scheme, generator).detected
    failed = sglang_structural(final_from_root_row, scheme, torch.Generator().manual_seed(0))
    assert failed.detected and failed.statistic > 0


def test_sglang_structural_on_greedy_tree_verifiers() -> None:
    """Greedy reference passes; a final token from the parent's argmax fails; a verifier that
    raises fails (a crash fails the peer's test)."""
    assert not sglang_greedy_structural(verify_tree_greedy).detected
    assert sglang_greedy_structural(greedy_final_from_parent).detected

    def crash(*_: object) -> object:
        raise RuntimeError("boom")

    verdict = sglang_greedy_structural(crash)  # type: ignore[arg-type]
    assert verdict.detected and "RuntimeError" in verdict.where


def test_first_token_chi_square_holds_its_level_and_detects_a_gross_deviation() -> None:
    """Calibration at level 0.05 under the exact law (400 runs of n = 300, cells merged): the
    alarm count is not significantly above 5% (one-sided binomial p > 1e-3); power: a law at
    TV 0.2 is detected at level 1e-3; an emitted token with p = 0 whose merged bin expects
    nothing fails outright."""
    rng = np.random.default_rng(7)
    p = np.array([0.4, 0.3, 0.2, 0.09, 0.007, 0.003])
    runs, n = 400, 300
    alarms = sum(
        first_token_chi_square(rng.choice(6, size=n, p=p), p, level=0.05).detected
        for _ in range(runs)
    )
    assert scipy.stats.binomtest(alarms, runs, 0.05, alternative="greater").pvalue > 1e-3
    shifted = np.array([0.2, 0.3, 0.4, 0.09, 0.007, 0.003])
    assert first_token_chi_square(rng.choice(6, size=n, p=shifted), p).detected
    q = np.array([0.5, 0.5, 0.0])
    assert first_token_chi_square(np.array([0, 1] * 50 + [2]), q).detected
    assert not first_token_chi_square(np.array([0, 1] * 50), q).detected
    with pytest.raises(ValueError, match=r"^root_target:"):
        first_token_chi_square(np.array([0, 1]), np.array([0.5, 0.6]))


def test_splice_section_rewrites_only_its_own_section() -> None:
    """The chain text before the markers is kept byte for byte; a second splice replaces the
    first section instead of appending another; unbalanced markers are refused."""
    chain = "# Detection rates\n\nchain table\n"
    once = splice_section(chain, "## Tree verification: detection rates\n\nfirst\n")
    assert once.startswith(chain) and once.count(BEGIN_MARKER) == 1 and "first" in once
    twice = splice_section(once + "trailing\n", "## Tree verification: detection rates\n\nsecond")
    assert twice.startswith(chain) and "first" not in twice and "second" in twice
    assert twice.count(END_MARKER) == 1 and twice.endswith("trailing\n")
    with pytest.raises(ValueError, match=r"^document:"):
        splice_section(chain + END_MARKER, "x")


def test_main_appends_the_tree_section_and_keeps_the_chain_part(tmp_path: Path) -> None:
    """The script run on one lossy and one greedy control at 200 steps writes the tree section
    after the existing report, which it leaves untouched."""
    out = tmp_path / "detection-rates.md"
    chain = "# Detection and false-alarm rates\n\nchain part\n"
    out.write_text(chain)
    main(["--entries", LOSSY, "tree-greedy-path-marking", "--budgets", "200", "--seeds", "1",
          "--false-alarm-seeds", "0", "--out", str(out), "--no-progress"])
    text = out.read_text()
    assert text.startswith(chain)
    section = text[text.index(BEGIN_MARKER):]
    assert "## Tree verification: detection rates" in section
    assert f"| [{LOSSY}](" in section and section.rstrip().endswith(END_MARKER)
