"""The property suite as part of a night: one pytest subprocess per target.

It runs ``python -m pytest --losslessness-target=NAME --losslessness-greedy=NAME
--losslessness-profile=PROFILE --junitxml=...`` (the plugin of :mod:`losslessness.pytest_plugin`
collects the suite's modules) in its own working directory, with pytest-xdist (``-n auto``)
when it is installed. Each junit test case becomes one :class:`CheckResult` (check id
``suite``): a failure is LOSSY (the suite fails only on a violated losslessness property), an
error is ERROR, a skip is SKIPPED. The suite's false-alarm rate is its own
(:data:`losslessness.stats.SUITE_FAMILY_WISE_ALPHA` per run), recorded as each result's alpha.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from losslessness.adapters import Adapter
from losslessness.checks.ids import SUITE_CHECK_ID
from losslessness.results import CheckKind, CheckResult, Verdict
from losslessness.stats import SUITE_FAMILY_WISE_ALPHA

SUITE_TESTS = 2
"""Test functions in the suite (one per module of :data:`losslessness.pytest_plugin.SUITE_MODULES`):
more pytest-xdist workers than this would idle."""

OUTPUT_TAIL = 4000
"""Characters of the pytest output kept when the suite errors without test cases."""


@dataclass
class SuiteOutcome:
    """One suite run.

    Attributes:
        target: the target's name.
        command: the pytest command line.
        returncode: pytest's exit status (0 passed, 1 tests failed, others: errors).
        junit_xml: pytest's junit XML report ("" when none was written).
        checks: one result per test case.
        wall_time_s: seconds the subprocess took.
        output_tail: the end of pytest's output.
    """

    target: str
    command: list[str]
    returncode: int
    junit_xml: str
    checks: list[CheckResult]
    wall_time_s: float
    output_tail: str


def pytest_command(adapter: Adapter, profile: str, junit_path: Path) -> list[str]:
    """The pytest command that runs the suite on ``adapter`` (chain and/or greedy).

    Raises:
        ValueError: the adapter has neither a chain nor a greedy verifier.
    """
    if adapter.chain is None and adapter.greedy is None:
        raise ValueError(f"target: {adapter.name!r} has no chain or greedy verifier to test")
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE"]
    if adapter.chain is not None:
        command.append(f"--losslessness-target={adapter.name}")
    if adapter.greedy is not None:
        command.append(f"--losslessness-greedy={adapter.name}")
    command += [f"--losslessness-profile={profile}", f"--junitxml={junit_path}"]
    if importlib.util.find_spec("xdist") is not None:
        command += ["-n", "auto", "--maxprocesses", str(SUITE_TESTS)]
    return command


SUITE_INSTALL_COMMAND = "pip install 'losslessness[nightly]'"
"""What installs the property suite's runner (pytest, pytest-xdist)."""


def suite_unavailable_reason() -> str | None:
    """Why the property suite cannot run here (pytest or Hypothesis missing, with the command
    that installs them), or None when it can."""
    missing = [name for name in ("pytest", "hypothesis") if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return (
        f"the property suite needs {' and '.join(missing)}, which is not installed: "
        f"{SUITE_INSTALL_COMMAND}"
    )


def _suite_result(
    target: str, name: str, verdict: Verdict, seconds: float, message: str, profile: str
) -> CheckResult:
    alpha = SUITE_FAMILY_WISE_ALPHA
    return CheckResult(
        check_id=SUITE_CHECK_ID,
        target=target,
        case_id=name,
        case_summary=f"property suite, Hypothesis profile {profile!r}",
        case_hash="",
        position=None,
        row=None,
        kind=CheckKind.STATISTICAL,
        n=0,
        statistic=None,
        df=None,
        p_value=None,
        alpha=alpha,
        power=0.0,
        min_detectable_tv=float("inf"),
        verdict=verdict,
        seed=0,
        wall_time_s=seconds,
        message=message,
        details={"family_wise_alpha_of_suite": alpha, "profile": profile},
    )


def parse_junit(junit_xml: str, target: str, profile: str) -> list[CheckResult]:
    """One :class:`CheckResult` per test case of pytest's junit XML.

    Raises:
        xml.etree.ElementTree.ParseError: malformed XML.
    """
    root = ElementTree.fromstring(junit_xml)
    results = []
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        seconds = float(case.get("time", "0") or 0)
        verdict, message = Verdict.PASS, "passed"
        for tag, outcome in (
            ("failure", Verdict.LOSSY),
            ("error", Verdict.ERROR),
            ("skipped", Verdict.SKIPPED),
        ):
            element = case.find(tag)
            if element is not None:
                verdict = outcome
                message = (element.get("message") or element.text or tag).strip()
                break
        results.append(_suite_result(target, name, verdict, seconds, message, profile))
    return results


def run_suite(adapter: Adapter, profile: str, work_dir: Path) -> SuiteOutcome:
    """Run the property suite on ``adapter`` in ``work_dir`` (created; the Hypothesis example
    database of the ``nightly`` profile lives there).

    The working directory is put first on ``PYTHONPATH`` so that ``pkg.module:callable``
    targets import as they did in the calling process.

    Returns:
        :class:`SuiteOutcome`; a run that wrote no test cases gives one ERROR result with the
        end of pytest's output.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    junit_path = work_dir / "suite-junit.xml"
    junit_path.unlink(missing_ok=True)
    command = pytest_command(adapter, profile, junit_path)
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        part for part in (os.getcwd(), environment.get("PYTHONPATH", "")) if part
    )
    began = time.perf_counter()
    completed = subprocess.run(
        command, cwd=work_dir, env=environment, capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - began
    output = (completed.stdout + completed.stderr)[-OUTPUT_TAIL:]
    junit_xml = junit_path.read_text(encoding="utf-8") if junit_path.exists() else ""
    checks = parse_junit(junit_xml, adapter.name, profile) if junit_xml else []
    if not checks:
        checks = [
            _suite_result(
                adapter.name,
                "pytest",
                Verdict.ERROR,
                seconds,
                f"pytest exited {completed.returncode} without test results: {output}",
                profile,
            )
        ]
    elif completed.returncode != 0 and all(
        check.verdict in (Verdict.PASS, Verdict.SKIPPED) for check in checks
    ):
        checks.append(
            _suite_result(
                adapter.name,
                "pytest",
                Verdict.ERROR,
                seconds,
                f"pytest exited {completed.returncode} although no test failed: {output}",
                profile,
            )
        )
    return SuiteOutcome(
        adapter.name, command, completed.returncode, junit_xml, checks, seconds, output
    )
