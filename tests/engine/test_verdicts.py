"""No verdict that was not earned (issue 20, items 2 and 6): a target whose planned assertions
did not all run at the design's power is INCONCLUSIVE (exit 4), never LOSSLESS; LOSSLESS is
printed with the design it reached; a verdict is derived from the record alone (a saved record
gives the same one); an adapter lossy by design declares its expected verdict, and the
nightly's exit code says whether any verdict differs from its expectation.

The CLI runs here use one or two small cases (or a step cap), a second or two each.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from losslessness.adapters import Adapter
from losslessness.cli import main
from losslessness.commands.nightly import UNEXPECTED_PASS_EXIT_CODE, night_exit_code
from losslessness.config import RunConfig, flag_of_error
from losslessness.reference import verify
from losslessness.results import (
    SCHEMA_VERSION,
    AuditResult,
    CheckContext,
    CheckKind,
    CheckResult,
    TargetResult,
    TargetVerdict,
    Verdict,
    design_shortfalls,
    reached_tv,
    target_verdict,
)
from reports.jsonio import audit_from_dict, audit_to_dict

LOSSLESS_DECLARED_LOSSY = Adapter(
    name="declared-lossy",
    description="the reference chain verifier, wrongly declared lossy by design",
    chain=verify,
    expected_verdict="LOSSY",
    expected_reason="a test double: declared lossy, actually lossless",
)
"""A target named ``tests.engine.test_verdicts:LOSSLESS_DECLARED_LOSSY``: a lossy-by-design
declaration on a lossless verifier, so the night must stay red when it passes."""


def run_cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _context() -> CheckContext:
    return CheckContext("t", "c", "", "h", 1e-4, 0.9, 0.05, 0)


def _check(
    verdict: Verdict = Verdict.PASS,
    *,
    min_tv: float = 0.04,
    message: str = "",
    **details: Any,
) -> CheckResult:
    context = _context()
    result = context.result(
        "law",
        kind=CheckKind.STATISTICAL,
        n=100,
        verdict=verdict,
        min_detectable_tv=min_tv,
        message=message,
        details=details,
    )
    return result


def _audit(*targets: TargetResult, config: RunConfig | None = None) -> AuditResult:
    return AuditResult(SCHEMA_VERSION, config or RunConfig(), 1, 1e-3, list(targets), 0.0, "", {})


def test_design_shortfalls_name_every_way_the_design_was_not_reached() -> None:
    """No checks; a cap at the run's ``max_steps``; fewer steps than planned; unsampled and
    undeclared not-applicable cases; cases a time budget dropped: each is a shortfall. A cap
    the battery builds into the CI plan (tree cases below ``max_steps``) and declared
    exclusions are not."""
    config = RunConfig(max_steps=20)
    assert design_shortfalls([], config) == ["no checks ran"]
    assert design_shortfalls([_check(capped=True, ci_steps=20)], config)[0].startswith(
        "1 cases capped at 20 steps"
    )
    assert design_shortfalls([_check(capped=True, ci_steps=8192)], RunConfig()) == []
    assert "fewer steps than planned" in design_shortfalls(
        [_check(steps=10, planned_steps=20)], config
    )[0]
    unsampled = _check(Verdict.SKIPPED, message="not sampled: the time budget was spent")
    assert "not sampled" in design_shortfalls([_check(), unsampled], config)[0]
    refused = _check(Verdict.SKIPPED, message="not applicable: k = 1")
    assert "undeclared" in design_shortfalls([_check(), refused], config)[0]
    assert design_shortfalls([_check(), refused], config, exclusions="k = 1") == []
    dropped = RunConfig(dropped_cases=("v4096-flat",))
    assert design_shortfalls([_check()], dropped) == [
        "cases dropped by the time budget: v4096-flat"
    ]


def test_an_assertion_that_detects_no_tv_distance_is_a_shortfall_never_lossless() -> None:
    """A passing statistical assertion whose minimum detectable TV is 1 or more (TV is at most
    1: its samples can detect nothing) leaves the target INCONCLUSIVE, naming the case; an
    infinite one (an assertion with no LOSSY side, such as an acceptance bound of 1) and a
    LOSSY one do not count, nor does an assertion just below 1."""
    config = RunConfig()
    blind = design_shortfalls([_check(), _check(min_tv=1.08)], config)
    assert len(blind) == 1 and "detect no TV distance" in blind[0] and blind[0].endswith(": c")
    assert design_shortfalls([_check(min_tv=1.0)], config) == blind
    assert design_shortfalls([_check(min_tv=0.99)], config) == []
    assert design_shortfalls([_check(min_tv=math.inf)], config) == []
    assert design_shortfalls([_check(Verdict.LOSSY, min_tv=1.08)], config) == []
    assert target_verdict([_check(min_tv=1.08)], shortfalls=blind) is TargetVerdict.INCONCLUSIVE


@pytest.mark.parametrize(
    ("verdicts", "complete", "shortfalls", "expected"),
    [
        ((Verdict.LOSSY,), False, ["capped"], TargetVerdict.LOSSY),
        ((Verdict.PASS,), False, ["capped"], TargetVerdict.INCOMPLETE),
        ((Verdict.ERROR,), True, ["capped"], TargetVerdict.ERROR),
        ((Verdict.SUBOPTIMAL,), True, ["capped"], TargetVerdict.INCONCLUSIVE),
        ((), True, ["no checks ran"], TargetVerdict.INCONCLUSIVE),
        ((Verdict.SKIPPED,), True, ["undeclared"], TargetVerdict.INCONCLUSIVE),
        ((Verdict.SKIPPED,), True, [], TargetVerdict.UNAVAILABLE),
        ((Verdict.SUBOPTIMAL, Verdict.PASS), True, [], TargetVerdict.SUBOPTIMAL),
        ((Verdict.PASS,), True, [], TargetVerdict.LOSSLESS),
    ],
)
def test_target_verdict_precedence_puts_inconclusive_below_error_above_suboptimal(
    verdicts: tuple[Verdict, ...],
    complete: bool,
    shortfalls: list[str],
    expected: TargetVerdict,
) -> None:
    """LOSSY > INCOMPLETE > ERROR > INCONCLUSIVE > SUBOPTIMAL > LOSSLESS for one target."""
    checks = [_check(verdict) for verdict in verdicts]
    assert target_verdict(checks, complete, shortfalls) is expected


@pytest.mark.parametrize(
    ("verdicts", "code"),
    [
        ((TargetVerdict.LOSSLESS, TargetVerdict.INCONCLUSIVE), 4),
        ((TargetVerdict.INCONCLUSIVE, TargetVerdict.ERROR), 3),
        ((TargetVerdict.INCONCLUSIVE, TargetVerdict.LOSSY), 1),
        ((TargetVerdict.INCONCLUSIVE, TargetVerdict.INCOMPLETE), 130),
        ((TargetVerdict.SUBOPTIMAL, TargetVerdict.UNAVAILABLE), 0),
        ((TargetVerdict.UNAVAILABLE,), 0),
        ((), 4),
    ],
)
def test_run_exit_code_follows_the_verdict_precedence(
    verdicts: tuple[TargetVerdict, ...], code: int
) -> None:
    """Over targets: 1 LOSSY, 130 interrupted, 3 ERROR, 4 INCONCLUSIVE, else 0; a run of
    unnamed UNAVAILABLE targets only (a night's missing engines) exits 0, a run without any
    target is INCONCLUSIVE (nothing audited)."""
    audit = _audit(*(TargetResult(f"t{i}", "", v) for i, v in enumerate(verdicts)))
    assert audit.exit_code == code


def test_a_named_target_that_does_not_load_never_exits_0() -> None:
    """A named target that cannot load is ERROR (exit 3) even when it is the only target; the
    same target tried by a night on its own is UNAVAILABLE and decides nothing (exit 0)."""
    from losslessness.engine import run_audit
    from losslessness.targets import UnavailableTarget

    named = run_audit([UnavailableTarget("vllm", "not installed", named=True)], RunConfig())
    assert named.targets[0].verdict is TargetVerdict.ERROR and named.exit_code == 3
    unnamed = run_audit([UnavailableTarget("vllm", "not installed", named=False)], RunConfig())
    assert unnamed.targets[0].verdict is TargetVerdict.UNAVAILABLE and unnamed.exit_code == 0


def test_reached_tv_is_the_worst_finite_tv_of_the_statistical_assertions_that_ran() -> None:
    """The largest minimum detectable TV among statistical assertions that ran; skipped,
    crashed and nothing-detectable (infinite) assertions state no TV."""
    checks = [
        _check(min_tv=0.04),
        _check(min_tv=0.07),
        _check(min_tv=float("inf")),
        _check(Verdict.SKIPPED, min_tv=0.5),
        _check(Verdict.ERROR, min_tv=0.5),
    ]
    assert reached_tv(checks) == 0.07
    assert reached_tv([]) is None


def test_a_saved_record_gives_the_same_verdict_and_older_records_still_load() -> None:
    """The verdict's inputs (checks, config, declarations) survive the JSON record, so
    re-deriving the shortfalls from a read record gives the same INCONCLUSIVE; a record
    written before the new fields (no ``exclusions``, ``expected_*``, ``dropped_cases``)
    reads with them unset."""
    config = RunConfig(max_steps=20)
    checks = [_check(capped=True, ci_steps=20)]
    shortfalls = design_shortfalls(checks, config)
    target = TargetResult("t", "", target_verdict(checks, True, shortfalls), checks)
    data = json.loads(json.dumps(audit_to_dict(_audit(target, config=config))))
    read = audit_from_dict(data)
    assert design_shortfalls(read.targets[0].checks, read.config) == shortfalls
    assert read.targets[0].verdict is TargetVerdict.INCONCLUSIVE and read.exit_code == 4
    for old in data["targets"]:
        for key in ("exclusions", "expected_verdict", "expected_reason"):
            del old[key]
    del data["config"]["dropped_cases"]
    older = audit_from_dict(data)
    assert older.targets[0].expected_verdict is None and older.config.dropped_cases == ()


@pytest.mark.parametrize(
    ("expected", "observed", "as_expected"),
    [
        (None, TargetVerdict.LOSSLESS, True),
        (None, TargetVerdict.SUBOPTIMAL, True),
        (None, TargetVerdict.INCONCLUSIVE, False),
        (None, TargetVerdict.UNAVAILABLE, True),
        ("LOSSY", TargetVerdict.LOSSY, True),
        ("LOSSY", TargetVerdict.LOSSLESS, False),
        ("LOSSY", TargetVerdict.ERROR, False),
    ],
)
def test_a_verdict_is_as_expected_only_when_it_meets_the_declaration(
    expected: str | None, observed: TargetVerdict, as_expected: bool
) -> None:
    """Undeclared targets are expected LOSSLESS (SUBOPTIMAL meets it); a lossy-by-design
    target is expected LOSSY and a pass is a surprise; UNAVAILABLE decides nothing."""
    target = TargetResult(
        "t", "", observed, expected_verdict=expected, expected_reason="why" if expected else None
    )
    assert target.as_expected is as_expected


@pytest.mark.parametrize(
    ("targets", "code"),
    [
        ([("ref", TargetVerdict.LOSSLESS, None), ("typ", TargetVerdict.LOSSY, "LOSSY")], 0),
        ([("ref", TargetVerdict.LOSSLESS, None), ("typ", TargetVerdict.UNAVAILABLE, "LOSSY")], 0),
        ([("ref", TargetVerdict.LOSSY, None), ("typ", TargetVerdict.LOSSY, "LOSSY")], 1),
        ([("ref", TargetVerdict.INCONCLUSIVE, None), ("typ", TargetVerdict.LOSSY, "LOSSY")], 4),
        (
            [("ref", TargetVerdict.LOSSLESS, None), ("typ", TargetVerdict.LOSSLESS, "LOSSY")],
            UNEXPECTED_PASS_EXIT_CODE,
        ),
    ],
)
def test_night_exit_code_says_whether_any_verdict_differs_from_its_expectation(
    targets: list[tuple[str, TargetVerdict, str | None]], code: int
) -> None:
    """0 when every target is as expected (a lossy-by-design target LOSSY); a surprise exits
    with the audit's code of the unexpected targets, or 5 when a lossy-by-design target
    passed."""
    audit = _audit(
        *(
            TargetResult(name, "", verdict, expected_verdict=expected,
                         expected_reason="by design" if expected else None)
            for name, verdict, expected in targets
        )
    )
    assert night_exit_code(audit) == code


def test_max_steps_cap_on_a_lossy_mutant_is_inconclusive_exit_4(tmp_path: Path) -> None:
    """``--max-steps 20`` on a lossy zoo mutant: too few steps to find it, and the header's
    design (TV >= 0.05, power 0.9) not reached: INCONCLUSIVE, exit 4, the cap named."""
    path = tmp_path / "a.json"
    result = run_cli(
        "audit", "--no-progress", "--json", str(path),
        "mutant/residual-zeroes-rejected-token", "--max-steps", "20",
    )
    assert result.exit_code == 4, result.output
    assert json.loads(path.read_text())["targets"][0]["verdict"] == "INCONCLUSIVE"
    assert "INCONCLUSIVE: design not reached" in result.output
    assert "capped at 20 steps" in result.output


@pytest.mark.parametrize(
    "selection", [("--only", "greedy"), ("--case", "greedy-v8-ties")]
)
def test_zero_checks_are_inconclusive_exit_4(selection: tuple[str, str]) -> None:
    """A chain target with only greedy checks or cases selected has nothing to test: never
    LOSSLESS with 'no checks', but INCONCLUSIVE (exit 4)."""
    result = run_cli(
        "audit", "--no-progress", "tests.wrong_verifiers:residual_is_target", *selection
    )
    assert result.exit_code == 4, result.output
    assert "no checks ran" in result.output


def test_lossless_is_printed_with_the_design_it_reached() -> None:
    """The verdict line of a LOSSLESS target states the worst TV its assertions reached and
    the power; a user-chosen weaker design (``--tv 0.2``) is stated in that line."""
    result = run_cli("audit", "--no-progress", "reference", "--case", "v2-tilted")
    assert result.exit_code == 0, result.output
    assert "LOSSLESS: every assertion at TV >= 0.0" in result.output
    assert "power 0.9 (design TV 0.05)" in result.output
    weaker = run_cli("audit", "--no-progress", "reference", "--case", "v2-tilted", "--tv", "0.2")
    assert weaker.exit_code == 0, weaker.output
    assert "(design TV 0.2)" in weaker.output


@pytest.mark.parametrize(
    ("flag", "value"), [("--alpha", "2"), ("--tv", "0"), ("--time-budget", "-1")]
)
def test_out_of_range_options_are_usage_errors_naming_the_flag(flag: str, value: str) -> None:
    """An out-of-range design value exits 2 naming the flag, not the config field."""
    result = CliRunner().invoke(main, ["audit", "--no-progress", flag, value])
    assert result.exit_code == 2, result.output
    assert flag in result.output
    assert "family_wise_alpha" not in result.output and "time_budget_s" not in result.output


def test_config_messages_map_fields_to_flags() -> None:
    """:func:`flag_of_error` names the flag of the field a message starts with, and the flags
    of the fields it mentions."""
    assert flag_of_error("family_wise_alpha: must lie in (0, 1)") == (
        "--alpha", "must lie in (0, 1)"
    )
    assert flag_of_error("time_budget_s: cannot be combined with steps (a replay)") == (
        "--time-budget", "cannot be combined with --steps (a replay)"
    )
    assert flag_of_error("something else") == (None, "something else")


def test_nightly_exits_0_as_expected_and_5_when_a_lossy_by_design_target_passes(
    tmp_path: Path,
) -> None:
    """A small night (one case, a twentieth of the CI plan's steps, no suite or device checks):
    the reference alone exits 0; beside a target declared lossy by design that passes, the
    night stays red (exit 5) and the reports show the expectation."""
    options = ["--budget", "0.05", "--case", "v2-tilted", "--no-suite", "--no-device-checks"]
    options += ["--no-progress"]
    good = run_cli("nightly", "--targets", "reference", *options, "--out", str(tmp_path / "a"))
    assert good.exit_code == 0, good.output
    out = tmp_path / "b"
    red = run_cli(
        "nightly",
        "--targets", "reference,tests.engine.test_verdicts:LOSSLESS_DECLARED_LOSSY",
        *options, "--out", str(out),
    )
    assert red.exit_code == UNEXPECTED_PASS_EXIT_CODE, red.output
    assert "UNEXPECTED declared-lossy: LOSSLESS, expected LOSSY" in red.output
    markdown = (out / "report.md").read_text()
    assert "**LOSSY (unexpected)**" in markdown
    record = json.loads((out / "report.json").read_text())
    declared = next(t for t in record["targets"] if t["name"] == "declared-lossy")
    assert declared["expected_verdict"] == "LOSSY"
    assert "expected" in (out / "report.html").read_text()


def test_vllm_benchmark_options_declare_they_are_lossy_by_design() -> None:
    """vLLM's synthetic acceptance and FLy (v1 and v2 targets alike) declare LOSSY with the
    reason; FLy also declares that it does not take k = 1; the default options declare
    nothing (no vLLM import needed)."""
    from losslessness.adapters.vllm import V1_OPTIONS, V2_OPTIONS

    for options in (*V1_OPTIONS.values(), *V2_OPTIONS.values()):
        exclusions, expected, reason = options.declarations()
        assert (expected == "LOSSY") is (options.synthetic or options.fly)
        assert (reason is None) is (expected is None)
        assert (exclusions is not None) is options.fly


@pytest.mark.slow
def test_medusa_typical_is_expected_lossy_and_declares_its_draft_schemes() -> None:
    """medusa-typical on a top-k and an i.i.d. tree case: LOSSY as its adapter declares (the
    night's expectation met), the i.i.d. case not applicable by its declared exclusion (slow:
    importing medusa-llm takes about 20 s here)."""
    pytest.importorskip("medusa.model.utils")
    from losslessness.adapters.medusa import TYPICAL_EXCLUSIONS, typical_adapter
    from losslessness.engine import run_audit

    result = run_audit(
        [typical_adapter()], RunConfig(cases=("tree-star8-topk", "tree-chain-iid"), steps=512)
    )
    target = result.targets[0]
    assert target.verdict is TargetVerdict.LOSSY and target.as_expected
    assert target.exclusions == TYPICAL_EXCLUSIONS
    refused = [c for c in target.checks if c.case_id == "tree-chain-iid"]
    assert refused and all(c.message.startswith("not applicable: ") for c in refused)
    assert night_exit_code(result) == 0
