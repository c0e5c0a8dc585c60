"""Engine versions in reports and trends (issue 12, item 4): the Markdown and HTML reports name
the engine versions a run recorded in its ``environment``, and the trends flag a check whose
verdict changed since the previous night while an engine version changed too, naming the
versions; a verdict that changed with no version change, or a version change with every
verdict unchanged, raises no such flag.

The runs are one real, small audit of the reference (seed 5, 400 steps of v2-tilted, all PASS)
with its environment and verdicts edited to stand for two nights.
"""

from __future__ import annotations

import dataclasses

import pytest

from losslessness.config import AuditConfig
from losslessness.engine import run_audit
from losslessness.results import AuditResult, TargetVerdict, Verdict
from losslessness.targets import resolve_adapter
from reports import audit_from_dict, audit_to_dict, compute_trends, render_markdown
from reports.html import render_html
from reports.trends import BASE_ENVIRONMENT, engine_version_changes

ENGINES_BEFORE = {"vllm": "0.32.0", "sglang": "0.5.23"}
ENGINES_NOW = {"vllm": "0.33.0", "sglang": "0.5.23"}


@pytest.fixture(scope="module")
def night() -> AuditResult:
    """A real audit of the reference: every check PASS."""
    config = AuditConfig(cases=("v2-tilted",), seed=5, steps=400)
    run = run_audit([resolve_adapter("reference")], config)
    assert run.verdict is TargetVerdict.LOSSLESS
    return run


def _night(run: AuditResult, started_at: str, engines: dict[str, str]) -> AuditResult:
    copy = audit_from_dict(audit_to_dict(run))
    # Only the given engines: the real run may have recorded others that other tests imported.
    base = {key: value for key, value in copy.environment.items() if key in BASE_ENVIRONMENT}
    environment = {**base, **engines}
    return dataclasses.replace(copy, started_at=started_at, environment=environment)


def _fail_first_law(run: AuditResult) -> AuditResult:
    law = next(c for c in run.targets[0].checks if c.check_id == "law")
    law.verdict = Verdict.LOSSY
    return run


def test_engine_version_changes_name_old_and_new_versions_of_engines_only() -> None:
    """Only entries outside the base environment count; a missing one reads 'absent'."""
    before = {"torch": "2.12.0", "vllm": "0.32.0", "sglang": "0.5.23"}
    now = {"torch": "2.13.0", "vllm": "0.33.0", "sglang": "0.5.23", "flashinfer": "0.7.2"}
    assert engine_version_changes(before, now) == (
        "flashinfer absent -> 0.7.2",
        "vllm 0.32.0 -> 0.33.0",
    )
    assert engine_version_changes(before, before) == ()


def test_verdict_changed_with_an_engine_version_is_flagged_naming_the_versions(
    night: AuditResult,
) -> None:
    """Last night PASS under vLLM 0.32.0, tonight LOSSY under 0.33.0: the check is flagged
    'verdict changed with vllm 0.32.0 -> 0.33.0' (and new failure), in the trends, the
    Markdown summary and the HTML report; the checks whose verdict held are not."""
    before = _night(night, "2020-01-01T00:00:00+00:00", ENGINES_BEFORE)
    now = _fail_first_law(_night(night, "2020-01-02T00:00:00+00:00", ENGINES_NOW))
    trends = compute_trends(now, [before])
    changed = trends.version_changes
    assert [(t.key[1], t.points[-1].verdict) for t in changed] == [("law", Verdict.LOSSY)]
    assert changed[0].version_change == ("vllm 0.32.0 -> 0.33.0",)
    assert "verdict changed with vllm 0.32.0 -> 0.33.0" in changed[0].flags
    assert all(not t.flagged for t in trends.checks if t is not changed[0])
    markdown = render_markdown(now, trends)
    assert "verdict changed with vllm 0.32.0 -&gt; 0.33.0" in markdown
    assert "1 verdicts changed with an engine version" in markdown
    html = render_html(now, trends)
    assert "verdict changed with vllm 0.32.0 -&gt; 0.33.0" in html


def test_no_version_flag_without_a_version_change_or_without_a_verdict_change(
    night: AuditResult,
) -> None:
    """Same engines and a new failure: a new failure only. New engines and the same verdicts:
    nothing flagged."""
    before = _night(night, "2020-01-01T00:00:00+00:00", ENGINES_NOW)
    now = _fail_first_law(_night(night, "2020-01-02T00:00:00+00:00", ENGINES_NOW))
    trends = compute_trends(now, [before])
    assert not trends.version_changes and len(trends.new_failures) == 1
    upgraded = _night(night, "2020-01-02T00:00:00+00:00", ENGINES_NOW)
    steady = compute_trends(upgraded, [_night(night, "2020-01-01T00:00:00+00:00", ENGINES_BEFORE)])
    assert not any(t.flagged for t in steady.checks)


def test_reports_show_the_engine_versions_of_the_run(night: AuditResult) -> None:
    """The Markdown summary and the HTML report both name every engine version recorded in the
    run's environment."""
    run = _night(night, "2020-01-02T00:00:00+00:00", ENGINES_NOW)
    markdown = render_markdown(run)
    assert "engines: sglang 0.5.23, vllm 0.33.0" in markdown
    html = render_html(run)
    assert "vllm 0.33.0" in html and "sglang 0.5.23" in html
