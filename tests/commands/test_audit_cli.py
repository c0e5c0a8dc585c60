"""The CLI end to end: wrong verifiers are caught at the default settings (exit 1, the failing
check and position named), the lossless-but-suboptimal control exits 0 as SUBOPTIMAL, crashes
exit 3 with the other cases still checked, usage errors exit 2, and reports replay.

Each audit here runs the full default battery on a vectorised verifier (a few seconds each).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from losslessness.cli import main


def run_cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def audit_json(tmp_path: Path, *args: str) -> tuple[Result, dict]:  # type: ignore[type-arg]
    path = tmp_path / "audit.json"
    result = run_cli("audit", "--no-progress", "--json", str(path), *args)
    return result, json.loads(path.read_text())


def lossy_checks(record: dict) -> set[tuple[str, int | None]]:  # type: ignore[type-arg]
    return {
        (check["check_id"], check["position"])
        for target in record["targets"]
        for check in target["checks"]
        if check["verdict"] == "LOSSY"
    }


FIXED_DESIGN_CASES = ("--case", "v2-tilted", "--case", "v32-mixed-batch")
"""A two-row-type-regime slice of the battery (V = 2 with three positions; three distinct row
types at V = 32) where each wrong verifier of the test below is LOSSY in its check."""


@pytest.mark.parametrize(
    ("verifier", "expected_check"),
    [
        ("residual_is_target", "law"),
        ("bonus_from_wrong_row", "law"),
        ("ratio_inverted", "law"),
        ("acceptance_never_stops", "law"),
        ("shared_random_stream", "independence"),
    ],
)
def test_wrong_verifier_is_caught_at_default_settings_and_exits_1(
    tmp_path: Path, verifier: str, expected_check: str
) -> None:
    """Power: each deliberately wrong verifier comes out LOSSY with exit code 1 at default
    settings, stopped early (the output says after how many steps); in the fixed design
    (``--no-early-stop``, on the two cases every one of these faults shows in, so that the
    test does not sample the whole battery to the end) the output names the check made for
    that fault and its position."""
    result, record = audit_json(tmp_path, f"tests.wrong_verifiers:{verifier}")
    assert result.exit_code == 1, result.output
    assert record["targets"][0]["verdict"] == "LOSSY"
    assert re.search(r"stopped early: LOSSY after \d+ verify steps", result.output), result.output
    assert record["targets"][0]["stopped_early"].startswith("LOSSY after")
    result, record = audit_json(
        tmp_path, f"tests.wrong_verifiers:{verifier}", "--no-early-stop", *FIXED_DESIGN_CASES
    )
    assert result.exit_code == 1, result.output
    failing = lossy_checks(record)
    assert any(check == expected_check for check, _ in failing), failing
    assert re.search(rf"LOSSY {expected_check} at \S+ pos \d", result.output), result.output
    assert "replay: losslessness audit" in result.output


def test_bonus_from_wrong_row_is_located_at_the_bonus_position(tmp_path: Path) -> None:
    """The off-by-one bonus row is reported at position k of the cases it breaks, and only
    there (every draft position still follows p)."""
    _, record = audit_json(tmp_path, "tests.wrong_verifiers:bonus_from_wrong_row")
    checks = record["targets"][0]["checks"]
    lossy = [c for c in checks if c["verdict"] == "LOSSY"]
    assert lossy
    for check in lossy:
        assert check["check_id"] in ("law", "edge.one-hot")
        positions = [
            c["position"]
            for c in checks
            if c["case_id"] == check["case_id"] and c["check_id"] == check["check_id"]
        ]
        assert check["position"] == max(positions), check


def test_sample_and_match_is_suboptimal_not_lossy(tmp_path: Path) -> None:
    """Sample-and-match (MLX-LM's verification) is lossless with lower acceptance: the audit
    says SUBOPTIMAL through the acceptance check, never LOSSY, and exits 0 (on the cases
    where its acceptance differs most and on p == q; the whole default battery runs in
    ``tests/adapters/test_mutants.py``'s slow control audits)."""
    result, record = audit_json(
        tmp_path,
        "tests.wrong_verifiers:sample_and_match",
        *("--case", "v2-tilted", "--case", "v8-far", "--case", "edge-p-equals-q"),
    )
    assert result.exit_code == 0, result.output
    target = record["targets"][0]
    assert target["verdict"] == "SUBOPTIMAL"
    assert not lossy_checks(record)
    suboptimal = {c["check_id"] for c in target["checks"] if c["verdict"] == "SUBOPTIMAL"}
    assert suboptimal <= {"acceptance", "edge.p-equals-q"} and suboptimal


def test_greedy_tie_breaking_to_highest_index_is_caught(tmp_path: Path) -> None:
    """A greedy verifier that breaks ties towards the highest index differs from argmax
    decoding on the tie cases (exit 1), and agrees on the tie-free random cases."""
    result, record = audit_json(
        tmp_path, "--greedy", "tests.wrong_verifiers:greedy_ties_to_highest"
    )
    assert result.exit_code == 1, result.output
    verdicts = {c["case_id"]: c["verdict"] for c in record["targets"][0]["checks"]}
    assert verdicts["greedy-v8-ties"] == "LOSSY"
    assert verdicts["greedy-v300-ties"] == "LOSSY"
    assert verdicts["greedy-v50-random"] == "PASS"


def test_reference_greedy_passes_the_greedy_battery(tmp_path: Path) -> None:
    """The reference greedy verifier, named as a module callable, equals argmax decoding."""
    result, record = audit_json(tmp_path, "--greedy", "losslessness.reference:verify_greedy")
    assert result.exit_code == 0, result.output
    assert {c["verdict"] for c in record["targets"][0]["checks"]} == {"PASS"}


def test_crashing_target_exits_3_and_the_other_cases_still_run(tmp_path: Path) -> None:
    """A target that raises on one case is recorded as ERROR there; every other case is
    still checked and passes (a case before it and one after it in the battery); the exit
    code is 3. (At design TV 0.2: how a crash is recorded does not depend on the design.)"""
    result, record = audit_json(
        tmp_path,
        "tests.wrong_verifiers:crashes_on_large_vocab", "--tv", "0.2",
        *("--case", "v2-tilted", "--case", "v4096-flat", "--case", "v32-mixed-batch"),
    )
    assert result.exit_code == 3, result.output
    checks = record["targets"][0]["checks"]
    # The run-level p-value test is ERROR too: the crashed case's p-values are missing.
    errors = {c["case_id"] for c in checks if c["verdict"] == "ERROR" and c["case_id"] != "run"}
    assert errors == {"v4096-flat"}
    assert all(
        "vocabulary too large" in c["message"]
        for c in checks
        if c["verdict"] == "ERROR" and c["case_id"] != "run"
    )
    others = {c["verdict"] for c in checks if c["case_id"] not in ("v4096-flat", "run")}
    assert others <= {"PASS", "SKIPPED"} and "PASS" in others


def test_malformed_output_is_a_structure_violation(tmp_path: Path) -> None:
    """Returning something that is not [B, k+1] is LOSSY at ``structure`` (exit 1)."""
    result, record = audit_json(
        tmp_path, "--case", "v8-far", "tests.wrong_verifiers:drops_placeholder"
    )
    assert result.exit_code == 1, result.output
    assert lossy_checks(record) == {("structure", None)}


@pytest.mark.parametrize(
    "args",
    [
        ("audit", "no_such_module_xyz:verify"),
        ("audit", "tests.wrong_verifiers:not_there"),
        ("audit", "not-an-adapter"),
        ("audit", "--tv", "0", "reference"),
        ("audit", "--alpha", "2", "reference"),
        ("audit", "--only", "nonsense", "reference"),
        ("audit", "--case", "no-such-case", "reference"),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...]) -> None:
    """Unknown targets, checks or cases and out-of-range design values are usage errors."""
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2, result.output


def test_replay_command_reproduces_the_p_value(tmp_path: Path) -> None:
    """The printed replay command (seed, case, check, steps) redraws the same samples: the
    replayed p-value equals the original one."""
    _, record = audit_json(tmp_path, "--case", "v16-near-k4", "--seed", "7", "reference")
    original = next(
        c for c in record["targets"][0]["checks"] if c["check_id"] == "law" and c["position"] == 2
    )
    replay_path = tmp_path / "replay.json"
    run_cli(
        "audit",
        "--no-progress",
        "--json",
        str(replay_path),
        "reference",
        "--seed",
        "7",
        "--case",
        "v16-near-k4",
        "--only",
        "law",
        "--steps",
        str(original["details"]["steps"]),
    )
    replayed = next(
        c for c in json.loads(replay_path.read_text())["targets"][0]["checks"] if c["position"] == 2
    )
    assert replayed["p_value"] == original["p_value"]
    assert replayed["seed"] == original["seed"]


def test_plan_prints_exactly_what_the_audit_then_does(tmp_path: Path) -> None:
    """``losslessness plan`` calls the run's own planner: the assertions, the per-assertion
    alpha and every case's steps it prints are those the audit with the same options uses."""
    options = ["reference", "--case", "v2-tilted", "--case", "v64-zeros", "--tv", "0.1"]
    plan = run_cli("plan", *options)
    assert plan.exit_code == 0, plan.output
    out = tmp_path / "audit.json"
    audit = run_cli("audit", *options, "--no-progress", "--json", str(out))
    assert audit.exit_code == 0, audit.output
    record = json.loads(out.read_text())
    assert f"{record['n_assertions']} statistical assertions" in plan.output
    assert f"alpha {record['per_assertion_alpha']:.3g} each" in plan.output
    steps = {
        c["case_id"]: c["details"]["steps"]
        for c in record["targets"][0]["checks"]
        if c["check_id"] != "pvalues"
    }
    rows = {
        cells[0]: cells
        for line in plan.output.splitlines()
        if (cells := [cell.strip() for cell in line.strip("│ ").split("│")])[0] in steps
    }
    for case_id, n in steps.items():
        assert rows[case_id][7:9] == [str(n), "1"], (case_id, rows[case_id])


def test_list_shows_adapters_and_cases() -> None:
    """``losslessness list`` shows the registered adapters and the battery, its serving
    cases included (every one, with its protocol)."""
    from losslessness.batteries import default_serving_battery

    result = CliRunner().invoke(main, ["list"], terminal_width=250)
    assert result.exit_code == 0
    for name in ("reference", "transformers", "v4096-flat", "greedy-v8-ties"):
        assert name in result.output
    for case in default_serving_battery():
        assert re.search(rf"│ {re.escape(case.case_id)} +│ serving +│", result.output), case



def test_audit_help_names_every_default_target() -> None:
    """``losslessness audit --help`` lists exactly the targets a bare ``losslessness audit``
    audits (:data:`losslessness.cli.DEFAULT_TARGETS`)."""
    from losslessness.cli import DEFAULT_TARGETS

    text = " ".join(run_cli("audit", "--help").output.split())
    listed = re.search(r"\(default: ([^)]*)\)", text)
    assert listed is not None
    assert listed.group(1).split() == list(DEFAULT_TARGETS)


def test_repeated_target_names_are_a_usage_error_naming_them() -> None:
    """Naming a target twice exits 2 with the repeated names, before anything is sampled."""
    result = CliRunner().invoke(main, ["audit", "reference", "reference"])
    assert result.exit_code == 2
    assert "names repeat" in result.output


@pytest.mark.parametrize(
    ("source", "raised"),
    [
        ("def verify(:\n", "SyntaxError"),
        ("raise RuntimeError('boom at import')\n", "RuntimeError"),
        ("import sys\nsys.exit(0)\n", "SystemExit"),
    ],
)
def test_a_target_module_failing_at_import_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, raised: str
) -> None:
    """Hostile targets whose module has a syntax error, raises or calls ``sys.exit(0)`` at
    import: exit 3 (ERROR) with the target and the exception named, never a traceback under
    the LOSSY code 1 or a silent exit 0 (before: 1, 1 and 0)."""
    module = f"hostile_import_{raised.lower()}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result, record = audit_json(tmp_path, f"{module}:verify")
    assert result.exit_code == 3
    assert f"{module}:verify" in result.output and raised in result.output
    assert [target["verdict"] for target in record["targets"]] == ["ERROR"]


def test_json_to_a_missing_folder_is_refused_before_anything_is_sampled(tmp_path: Path) -> None:
    """``--json`` into a folder that does not exist is a usage error naming the flag, given
    before the audit runs (before: a traceback after the whole audit, results lost)."""
    result = CliRunner().invoke(
        main, ["audit", "reference", "--json", str(tmp_path / "missing" / "a.json")]
    )
    assert result.exit_code == 2
    assert "--json" in result.output and "does not exist" in result.output
    assert "verify steps" not in result.output
