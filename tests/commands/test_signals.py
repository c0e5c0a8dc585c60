"""SIGINT and SIGTERM in ``losslessness audit`` (a subprocess on a slowed-down target): in the
warm-up of a time budget and during sampling, once or twice, the command writes its JSON record
(parsable, with the checks of what finished), prints the table with the target INCOMPLETE, and
exits 130 for SIGINT or 143 for SIGTERM (the first signal decides), never 0 or 1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from losslessness.commands.signals import SignalGuard

CASES = ("--case", "v2-tilted", "--case", "v8-far")
"""Two small chain cases: sampled interleaved, so both have finished calls when a signal
comes."""

STARTUP_TIMEOUT_S = 120.0
"""Seconds the audit may take to import and reach its target (a loaded machine)."""


def _calls(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _interrupt_audit(
    tmp_path: Path, options: list[str], seconds_per_call: float, after_calls: int,
    signals: list[signal.Signals],
) -> tuple[int, str, dict]:
    """Run the audit on the slow target, send ``signals`` (0.2 s apart) once the target was
    called ``after_calls`` times, and return (exit code, output, the JSON record)."""
    calls, record = tmp_path / "calls", tmp_path / "audit.json"
    environment = dict(os.environ, SLOW_TARGET_CALLS=str(calls),
                       SLOW_TARGET_SECONDS=str(seconds_per_call))
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(Path.cwd()), *filter(None, [environment.get("PYTHONPATH")])]
    )
    audit = subprocess.Popen(
        [sys.executable, "-m", "losslessness.cli", "audit",
         "tests.commands.slow_targets:slow_verify", *CASES, *options,
         "--no-progress", "--json", str(record)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment,
    )
    began = time.monotonic()
    while _calls(calls) < after_calls:
        assert audit.poll() is None, audit.communicate()[0]
        assert time.monotonic() - began < STARTUP_TIMEOUT_S, "the target was never called"
        time.sleep(0.02)
    for number, signum in enumerate(signals):
        if number:
            time.sleep(0.2)
        audit.send_signal(signum)
    output, _ = audit.communicate(timeout=STARTUP_TIMEOUT_S)
    assert record.exists(), output
    return audit.returncode, output, json.loads(record.read_text())


def _finished_checks(data: dict) -> list[dict]:
    return [check for check in data["targets"][0]["checks"]
            if check["n"] and check["verdict"] == "PASS"]


@pytest.mark.parametrize(
    ("signals", "code"),
    [
        ([signal.SIGTERM], 143),
        ([signal.SIGINT, signal.SIGINT], 130),
        ([signal.SIGTERM, signal.SIGINT], 143),
    ],
    ids=["sigterm", "two-sigints", "sigterm-then-sigint"],
)
def test_signal_during_sampling_writes_the_finished_checks_and_exits_with_its_code(
    tmp_path: Path, signals: list[signal.Signals], code: int
) -> None:
    """During sampling: the record is written and parses, holds the checks of the calls that
    finished, the target is INCOMPLETE in it and in the table, and the exit code is the first
    signal's (130 SIGINT, 143 SIGTERM); a later signal loses nothing."""
    returncode, output, data = _interrupt_audit(tmp_path, [], 0.01, 12, signals)
    assert returncode == code, output
    assert data["targets"][0]["verdict"] == "INCOMPLETE"
    assert "INCOMPLETE" in output and f"wrote {tmp_path / 'audit.json'}" in output
    assert _finished_checks(data), data["targets"][0]["checks"]


def test_signal_during_a_parallel_run_stops_it_and_starts_no_more_shards(tmp_path: Path) -> None:
    """``--jobs 2`` on a run large enough to split (2 x 60000 planned steps: two processes,
    each taking shards in turn), a target at 0.2 s per call: a SIGTERM during a chain call ends
    the run with the target INCOMPLETE and exit 143, and the target is called at most a few
    more times (calls already on their way), not through the shards not yet begun. (The parent
    once read its interrupted chain shard as finished and took the next one, the signal spent:
    the run went on to its end.)"""
    after = 4
    returncode, output, data = _interrupt_audit(
        tmp_path, ["--jobs", "2", "--steps", "60000"], 0.2, after, [signal.SIGTERM]
    )
    assert returncode == 143, output
    assert data["targets"][0]["verdict"] == "INCOMPLETE"
    assert _calls(tmp_path / "calls") <= after + 4, output


@pytest.mark.parametrize(
    ("signals", "code"),
    [([signal.SIGINT, signal.SIGINT], 130), ([signal.SIGTERM], 143)],
    ids=["two-sigints", "sigterm"],
)
def test_signal_during_the_time_budget_warm_up_keeps_the_warm_up_checks(
    tmp_path: Path, signals: list[signal.Signals], code: int
) -> None:
    """In the warm-up of ``--time-budget`` (the target called a few times, no sampling yet):
    nothing more is sampled, the record holds the checks of the warm-up calls that finished,
    the target is INCOMPLETE and the exit code is the signal's, not 1 (LOSSY)."""
    returncode, output, data = _interrupt_audit(
        tmp_path, ["--time-budget", "60"], 0.2, 3, signals
    )
    assert returncode == code, output
    assert "interrupted during the" in output
    assert data["targets"][0]["verdict"] == "INCOMPLETE"
    assert _finished_checks(data), data["targets"][0]["checks"]


@pytest.mark.parametrize(
    ("received", "code", "expected"),
    [
        (None, 0, 0),
        (signal.SIGINT, 0, 130),
        (signal.SIGTERM, 130, 143),
        (signal.SIGTERM, 3, 143),
        (signal.SIGINT, 1, 1),
        (signal.SIGTERM, 2, 2),
    ],
)
def test_exit_code_is_the_signals_unless_the_run_is_lossy_or_refused(
    received: int | None, code: int, expected: int
) -> None:
    """Once a signal came, the command exits 128 + its number, whatever it would have exited
    (LOSSLESS, ERROR, INCOMPLETE from Ctrl-C), except LOSSY (finished evidence of loss stands)
    and a usage error."""
    guard = SignalGuard()
    guard.received = received
    assert guard.exit_code(code) == expected
