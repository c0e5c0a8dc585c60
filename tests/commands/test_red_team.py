"""Red team (issue 20): ``losslessness audit`` against targets that exit, crash, hang, lie, write
into their inputs, monkeypatch the auditor, refuse cases, or are run under designs they cannot
reach. For each, the test pins the exit code and what the JSON record keeps: the finished
results of the other cases are never lost, and no run ends LOSSLESS without earning it.

The hostile targets are :mod:`tests.engine.hostile_targets` (each misbehaves on V = 2 only and is
the reference elsewhere, so the ``v8-far`` case must still PASS beside the faulty ``v2-tilted``)
and :mod:`tests.wrong_verifiers`; a module that exits or fails at import is written per test.
Signals are pinned in :mod:`tests.commands.test_signals`, the time budget's bound in
:mod:`tests.engine.test_time_budget`, hostile text in reports in
:mod:`tests.reports.test_hostile_text`.

The cases the engine-level tests of :mod:`tests.engine.test_worker` already pin run under the
``slow`` mark (``tox -e slow``). Exit codes: README's table (0 LOSSLESS, 1 LOSSY, 3 ERROR,
4 INCONCLUSIVE).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from losslessness.cli import main

HOSTILE = "tests.engine.hostile_targets"
CASES = ("--case", "v2-tilted", "--case", "v8-far")
"""The faulty case (V = 2) and one the hostile targets verify correctly."""


def _audit(tmp_path: Path, *args: str) -> tuple[int, dict, float]:
    """Run ``losslessness audit ARGS --json``; return (exit code, record, seconds)."""
    record = tmp_path / "record.json"
    began = time.perf_counter()
    result = CliRunner().invoke(
        main, ["audit", *args, "--no-progress", "--json", str(record)], catch_exceptions=False
    )
    elapsed = time.perf_counter() - began
    assert record.exists(), f"no JSON record; output:\n{result.output[-2000:]}"
    return result.exit_code, json.loads(record.read_text()), elapsed


def _verdicts_by_case(data: dict) -> dict[str, set[str]]:
    cases: dict[str, set[str]] = {}
    for check in data["targets"][0]["checks"]:
        cases.setdefault(check["case_id"], set()).add(check["verdict"])
    return cases


@pytest.mark.parametrize(
    ("function", "options", "failure"),
    [
        ("os_exits_on_small_vocab", (), "crashed"),
        pytest.param("sys_exits_on_small_vocab", (), "SystemExit", marks=pytest.mark.slow),
        ("segfaults_on_small_vocab", (), "crashed"),
        ("raises_keyboard_interrupt_on_small_vocab", (), "KeyboardInterrupt"),
        pytest.param("spins_on_small_vocab", ("--timeout", "3"), "hung", marks=pytest.mark.slow),
        ("spins_in_c_on_small_vocab", ("--timeout", "3"), "hung"),
    ],
)
def test_exit_crash_or_hang_is_error_for_its_case_and_the_other_case_passes(
    tmp_path: Path, function: str, options: tuple[str, ...], failure: str
) -> None:
    """A target that exits (``os._exit(0)``, ``sys.exit(0)``), segfaults, raises
    ``KeyboardInterrupt`` or hangs (a retry loop swallowing exceptions, an endless C call) on
    V = 2: exit 3 (ERROR, never 0), the V = 2 case is ERROR naming the failure, and the other
    case still ran and PASSED (before issue 20: exit 0 with no record, or -11, or a hang)."""
    code, data, elapsed = _audit(tmp_path, f"{HOSTILE}:{function}", *CASES, *options)
    assert code == 3
    target = data["targets"][0]
    assert target["verdict"] == "ERROR"
    by_case = _verdicts_by_case(data)
    assert by_case["v2-tilted"] == {"ERROR"}
    assert by_case["v8-far"] == {"PASS"}
    messages = " ".join(c["message"] for c in target["checks"] if c["case_id"] == "v2-tilted")
    assert failure in messages
    assert elapsed < 120


def test_target_writing_into_its_inputs_is_not_lossless(tmp_path: Path) -> None:
    """A verifier that writes q over p in its input buffer after each call (its outputs
    correct) is a protocol violation on every case, never LOSSLESS: exit 1."""
    code, data, _ = _audit(tmp_path, f"{HOSTILE}:writes_into_inputs", *CASES)
    assert code == 1
    assert data["targets"][0]["verdict"] == "LOSSY"
    assert "input" in json.dumps(data["targets"][0]["checks"])


def test_target_patching_the_auditor_at_import_is_still_lossy(tmp_path: Path) -> None:
    """A lossy verifier whose module makes every verdict LOSSLESS at import: the module is
    imported only in the worker, so the audit's verdict is LOSSY (exit 1)."""
    code, data, _ = _audit(tmp_path, f"{HOSTILE}:patches_the_auditor", *CASES)
    assert code == 1
    assert data["targets"][0]["verdict"] == "LOSSY"


def test_non_daemon_thread_of_the_target_does_not_keep_the_audit_alive(tmp_path: Path) -> None:
    """A correct verifier that leaves a non-daemon thread sleeping for an hour: LOSSLESS, exit
    0, and the command returns (before issue 20 the process never exited)."""
    code, data, elapsed = _audit(tmp_path, f"{HOSTILE}:leaves_a_thread", *CASES)
    assert code == 0
    assert data["targets"][0]["verdict"] == "LOSSLESS"
    assert elapsed < 120


@pytest.mark.parametrize(
    "source",
    [
        "import sys\nsys.exit(0)\n",
        pytest.param("import os\nos._exit(0)\n", marks=pytest.mark.slow),
        "def verify(:\n",
        pytest.param("raise RuntimeError('broken at import')\n", marks=pytest.mark.slow),
    ],
    ids=["sys-exit", "os-exit", "syntax-error", "exception"],
)
def test_module_failing_at_import_is_an_error_naming_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """A target module that exits, has a syntax error or raises while imported: exit 3 with
    the target named in the record (before: exit 0 with nothing, or a traceback under exit 1)."""
    (tmp_path / "hostile_import.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    code, data, _ = _audit(tmp_path, "hostile_import:verify", *CASES)
    assert code == 3
    assert data["targets"][0]["name"] == "hostile_import:verify"
    assert data["targets"][0]["verdict"] == "ERROR"


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (("tests.wrong_verifiers:residual_is_target", "--only", "greedy"), "no checks"),
        (("mutant/residual-zeroes-rejected-token", "--max-steps", "20", *CASES), "cap"),
        ((f"{HOSTILE}:refuses_small_vocab", *CASES), "not applicable"),
    ],
    ids=["zero-checks", "step-cap", "not-applicable"],
)
def test_design_not_reached_is_inconclusive(
    tmp_path: Path, args: tuple[str, ...], reason: str
) -> None:
    """No LOSSLESS from nothing or almost nothing: a chain target audited on no check, a lossy
    mutant capped at 20 steps, a target refusing a case its adapter does not declare: exit 4
    (INCONCLUSIVE), never 0 (before issue 20: exit 0, LOSSLESS)."""
    code, data, _ = _audit(tmp_path, *args)
    assert code == 4, data["targets"][0]["verdict"]
    assert data["targets"][0]["verdict"] == "INCONCLUSIVE"


def test_named_unavailable_target_never_exits_zero(tmp_path: Path) -> None:
    """A target named on the command line that cannot load here (vLLM, not installed in the
    test environment): exit 3, never 0."""
    code, data, _ = _audit(tmp_path, "vllm", *CASES)
    assert code == 3
    assert data["targets"][0]["verdict"] == "ERROR"
