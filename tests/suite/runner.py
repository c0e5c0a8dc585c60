"""The property suite run as a user runs it, for the tests that pin its verdicts: a pytest
subprocess with the plugin's options, from an empty project directory, so that only the suite
modules the plugin adds are collected, imported from the same place as the plugin.

A subprocess, not ``pytest.main`` in this process (which would save the 4 s each run spends
importing torch, scipy and Hypothesis): Hypothesis draws some values from a pool of the
constants in every *local* module imported so far
(``hypothesis.internal.conjecture.providers._get_local_constants``), so an in-process run's
examples, its shrunk failures included, depended on what this session had imported before it,
and so on the order pytest-xdist gave the tests (seen: a greedy tree failure shrunk to 5 nodes
instead of 1, and a tree mutant the suite misses caught).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from strategies.profiles import PROFILE_ENV_VAR

ROOT = Path(__file__).resolve().parents[2]
"""The repository, on the run's PYTHONPATH (for ``tests.wrong_verifiers`` and the like)."""


@dataclass(frozen=True)
class SuiteRun:
    """One pytest run's exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        """stdout then stderr."""
        return self.stdout + "\n" + self.stderr


def run_suite(directory: Path, *options: str, isolated: bool = False) -> SuiteRun:
    """``python -m pytest -p no:cacheprovider -q *options`` in ``directory``, with
    ``LOSSLESSNESS_HYPOTHESIS_PROFILE`` unset (the plugin's own default applies) and one torch
    thread (the 2-core machine is shared with the other tests).

    Args:
        directory: an empty directory, the user's project (a test's ``tmp_path``).
        options: the plugin's options, as on a user's command line.
        isolated: run the targets in the plugin's worker process, as a user does by default;
            else in pytest's process (``--losslessness-in-process``): the suites' power is
            pinned with the targets in-process, the worker process in tests/engine/
            test_worker.py.

    Returns:
        The run's exit code and output.
    """
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *options]
    if not isolated:
        command.append("--losslessness-in-process")
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    environment.pop(PROFILE_ENV_VAR, None)
    completed = subprocess.run(
        command, cwd=directory, env=environment, capture_output=True, text=True, timeout=900,
        check=False,
    )
    return SuiteRun(completed.returncode, completed.stdout, completed.stderr)
