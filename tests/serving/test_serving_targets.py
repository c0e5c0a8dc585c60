"""A ``pkg.module:fn`` serving target: resolved with ``--protocol serving``, run in a worker
process (Request objects and None draft probabilities cross it), its engine profile named by
its attribute or by ``--engine-profile``."""

from __future__ import annotations

import dataclasses
import re

import pytest
from click.testing import CliRunner

from losslessness.cli import main
from losslessness.config import RunConfig
from losslessness.engine import run_audit
from losslessness.results import TargetVerdict, Verdict
from losslessness.targets import resolve_targets
from losslessness.worker import RemoteCallable
from tests.serving.profile import PROFILE_NAME, small_profile


def test_serving_target_in_a_worker_receives_requests_and_none_draft_probs() -> None:
    """The target, isolated in its worker, raises unless it gets Request objects and None
    draft probabilities; the audit of the no-draft-probabilities case is LOSSLESS, and its
    replay lines name the protocol and the profile."""
    small_profile()
    [adapter] = resolve_targets(["tests.serving.targets:records_call"], protocol="serving")
    assert not isinstance(adapter, str) and isinstance(adapter.serving, RemoteCallable)  # type: ignore[union-attr]
    assert adapter.engine_profile == PROFILE_NAME  # type: ignore[union-attr]
    result = run_audit([adapter], RunConfig(cases=("serving-no-draft-probs",), steps=200))
    target = result.targets[0]
    assert target.verdict is TargetVerdict.LOSSLESS, [c.message for c in target.checks][:3]
    replay = target.checks[-1].replay or ""
    assert replay.startswith(
        "losslessness audit --protocol serving tests.serving.targets:records_call "
        f"--engine-profile {PROFILE_NAME} --seed"
    ), replay


def test_audit_cli_takes_protocol_serving_and_engine_profile() -> None:
    """``audit --protocol serving --engine-profile NAME pkg:fn`` audits a function without the
    attribute (exit 0); a profile that contradicts the function's own is a usage error (2)."""
    small_profile()
    common = ["--in-process", "--case", "serving-b1", "--steps", "300", "--no-progress"]
    ok = CliRunner().invoke(
        main,
        ["audit", "--protocol", "serving", "--engine-profile", PROFILE_NAME,
         "tests.serving.targets:unnamed", *common],
    )
    assert ok.exit_code == 0, ok.output
    clash = CliRunner().invoke(
        main,
        ["audit", "--protocol", "serving", "--engine-profile", "other",
         "tests.serving.targets:reference", *common],
    )
    assert clash.exit_code == 2 and "--engine-profile" in clash.output


def test_serving_target_without_a_profile_is_an_error_naming_the_fix() -> None:
    """No attribute and no option: the serving units are ERROR, saying how to name one."""
    small_profile()
    [adapter] = resolve_targets(
        ["tests.serving.targets:unnamed"], protocol="serving", in_process=True
    )
    result = run_audit([adapter], RunConfig(cases=("serving-b1",), steps=50))
    target = result.targets[0]
    assert target.verdict is TargetVerdict.ERROR
    assert any("--engine-profile" in check.message for check in target.checks)


def test_serving_case_with_a_field_the_profile_lacks_is_not_applicable() -> None:
    """The transformers profile has no frequency or presence penalty: the penalty case is
    SKIPPED as not applicable for a target claiming it (never ERROR, never PASS)."""
    [adapter] = resolve_targets(
        ["tests.serving.targets:unnamed"], protocol="serving", in_process=True
    )
    adapter = dataclasses.replace(adapter, engine_profile="transformers")  # type: ignore[arg-type]
    result = run_audit([adapter], RunConfig(cases=("serving-penalties",), steps=50))
    checks = result.targets[0].checks
    assert checks and all(c.verdict is Verdict.SKIPPED for c in checks)
    assert all(c.message.startswith("not applicable: ") for c in checks)


@pytest.mark.parametrize("target", ["exits_at_batch_of_one", "hangs_at_batch_of_one"])
def test_a_serving_target_that_exits_or_hangs_is_an_error_and_the_rest_still_runs(
    target: str,
) -> None:
    """A serving target in its worker that exits, or hangs past ``--timeout``, on the B = 1
    case: that case's checks and the seed contract (whose compositions include a request
    alone) are ERROR naming what happened; the B = 8 case, run by a restarted worker, is
    still checked and passes; the exit code is 3 (never LOSSY, never IRREPRODUCIBLE)."""
    small_profile()
    result = CliRunner().invoke(
        main,
        ["audit", "--protocol", "serving", f"tests.serving.targets:{target}", "--case",
         "serving-b1", "--case", "serving-temperatures", "--case", "seed-contract",
         "--steps", "200", "--timeout", "5", "--no-progress"],
    )
    assert result.exit_code == 3, result.output
    assert "IRREPRODUCIBLE" not in result.output and "LOSSY" not in result.output
    assert re.search(r"ERROR +tests\.serving\.targets:" + target, result.output), result.output
    word = "exited" if target.startswith("exits") else "timed out|took longer|hung"
    assert re.search(word, result.output), result.output
    assert re.search(r"serving\.law +│ serving-temperatures\[[^]]*\] +│.*│ PASS", result.output), (
        result.output
    )
    assert re.search(r"seed\.contract +│ seed-contract +│.*│ ERROR", result.output), result.output


def test_a_serving_target_that_lies_about_its_output_shape_is_lossy_at_structure() -> None:
    """[B, k] returned for [B, k+1]: LOSSY at serving.structure (exit 1), not a crash."""
    small_profile()
    result = CliRunner().invoke(
        main,
        ["audit", "--protocol", "serving", "tests.serving.targets:drops_the_last_column",
         "--case", "serving-temperatures", "--steps", "100", "--no-progress"],
    )
    assert result.exit_code == 1, result.output
    assert re.search(r"serving\.structure.*LOSSY", result.output), result.output
