"""Markdown summary of an audit, sized for a GitHub Actions step summary.

GitHub caps a step summary at 1 MiB (workflow commands, "Step isolation and limits":
https://docs.github.com/en/actions/using-workflows/workflow-commands-for-github-actions
); the summary lists the verdict per target, verdict counts, the design and budget line, at most
:data:`MAX_ROWS` failing checks and trend flags, and is cut at :data:`STEP_SUMMARY_LIMIT`
bytes in any case. Every text from a target or the record (names, messages, case ids,
environment values) is literal Markdown through :func:`reports.text.markdown_text`.
"""

from __future__ import annotations

from losslessness.results import (
    AuditResult,
    CheckKind,
    CheckResult,
    TargetResult,
    Verdict,
    design_note,
)
from reports.terminal import verdict_line
from reports.text import markdown_text
from reports.trends import BASE_ENVIRONMENT, CheckTrend, Trends

STEP_SUMMARY_LIMIT = 1024 * 1024
"""GitHub's step-summary limit in bytes; the summary never exceeds it."""

MAX_ROWS = 50
"""Rows of failing checks (and of trend flags) listed before "... and N more"."""

MAX_MESSAGE = 240
"""Characters of a check's message kept in a table cell."""

def _cell(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` safe inside a GitHub table cell, at most ``limit`` characters of it."""
    return markdown_text(text, limit)


def _expected(target: TargetResult) -> str:
    """The expected-verdict cell: the expectation (``-`` for an unavailable target), marked
    when the verdict differs from it."""
    expected = target.expected
    if expected is None:
        return "-"
    return expected.value if target.as_expected else f"**{expected.value} (unexpected)**"


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}"


def _failing(result: AuditResult) -> list[CheckResult]:
    return [
        check
        for verdict in (Verdict.LOSSY, Verdict.ERROR, Verdict.IRREPRODUCIBLE, Verdict.SUBOPTIMAL)
        for target in result.targets
        for check in target.checks
        if check.verdict is verdict
    ]


def _underpowered(result: AuditResult) -> str:
    statistical = [
        check
        for target in result.targets
        for check in target.checks
        if check.kind is CheckKind.STATISTICAL and check.verdict is not Verdict.ERROR
    ]
    above = sum(check.min_detectable_tv > result.config.tv * 1.0001 for check in statistical)
    return (
        f"{above} of {len(statistical)} have a minimum detectable TV above it (steps are "
        "planned for the law tests; the other tests run on the same steps)"
    )


def _trend_rows(trends: Trends) -> list[str]:
    flagged: list[CheckTrend] = sorted(
        (trend for trend in trends.checks if trend.flagged),
        key=lambda trend: (not trend.new_failure, not trend.verdict_changed_with_version),
    )
    lines = [
        "",
        "## Trends",
        "",
        f"{len(trends.runs)} runs compared ({_cell(trends.runs[0])} to {_cell(trends.runs[-1])}): "
        f"{len(trends.new_failures)} new failures, {len(trends.power_drops)} power drops "
        f"(minimum detectable TV up by more than x{trends.power_drop_factor:g}), "
        f"{len(trends.version_changes)} verdicts changed with an engine version.",
    ]
    if flagged:
        lines += [
            "",
            "| flag | target | check | where | verdicts, oldest first | min TV before -> now |",
            "|---|---|---|---|---|---|",
        ]
        for trend in flagged[:MAX_ROWS]:
            flags = _cell(" + ".join(trend.flags))
            verdicts = " ".join(point.verdict.value for point in trend.points[-8:])
            before = trend.points[-2].min_detectable_tv if len(trend.points) > 1 else None
            now = trend.points[-1].min_detectable_tv
            lines.append(
                f"| {flags} | {_cell(trend.key[0])} | {_cell(trend.key[1])} | "
                f"{_cell(trend.where)} | {verdicts} | {_number(before)} -> {_number(now)} |"
            )
        if len(flagged) > MAX_ROWS:
            lines.append(f"\n... and {len(flagged) - MAX_ROWS} more flagged checks.")
    for source, reason in trends.skipped_sources[:MAX_ROWS]:
        lines.append(f"- skipped history file {_cell(source)}: {_cell(reason)}")
    return lines


def _engines(result: AuditResult) -> str:
    """``"; engines: sglang 0.5.23, vllm 0.33.0"`` from the run's environment, or ``""``."""
    engines = sorted(set(result.environment) - BASE_ENVIRONMENT)
    if not engines:
        return ""
    return "; engines: " + ", ".join(
        f"{_cell(name)} {_cell(result.environment[name])}" for name in engines
    )


def render_markdown(result: AuditResult, trends: Trends | None = None) -> str:
    """The step summary of ``result`` (and of ``trends`` when given).

    Args:
        result: the audit.
        trends: :func:`reports.trends.compute_trends` of the run, or None.

    Returns:
        GitHub-flavoured Markdown, at most :data:`STEP_SUMMARY_LIMIT` bytes in UTF-8.
    """
    config = result.config
    lines = [
        f"# losslessness audit: {result.verdict.value}",
        "",
        f"Seed {config.seed}, started {_cell(result.started_at)}, wall time "
        f"{result.wall_time_s:.1f} s, losslessness "
        f"{_cell(result.environment.get('losslessness', '?'))}{_engines(result)}.",
        "",
        f"**Budget**: family-wise false-alarm rate {config.family_wise_alpha:g} split "
        f"Bonferroni over {result.n_assertions} statistical assertions, alpha "
        f"{result.per_assertion_alpha:.3g} each; every statistical check is designed to detect "
        f"TV >= {config.tv:g} with power {config.power:g}; {_underpowered(result)}."
        + design_note(config),
        "",
        "| target | verdict | expected | "
        + " | ".join(verdict.value for verdict in Verdict)
        + " | verify steps | time (s) |",
        "|---|---|---|" + "---:|" * (len(Verdict) + 2),
    ]
    for target in result.targets:
        counts = [sum(c.verdict is verdict for c in target.checks) for verdict in Verdict]
        lines.append(
            f"| {_cell(target.name)} | **{target.verdict.value}** | {_expected(target)} | "
            + " | ".join(str(count) for count in counts)
            + f" | {target.verify_steps} | {target.wall_time_s:.1f} |"
        )
    lines += ["", "## Verdicts", ""]
    lines += [
        f"- {_cell(t.name)}: {_cell(verdict_line(result, t), 1000)}"
        for t in result.targets
        if t.error is None
    ]
    stopped = [target for target in result.targets if target.stopped_early]
    if stopped:
        lines += ["", "## Stopped early", ""]
        lines += [f"- {_cell(t.name)}: {_cell(t.stopped_early or '')}" for t in stopped]
    unavailable = [target for target in result.targets if target.error is not None]
    if unavailable:
        lines += ["", "## Not audited", ""]
        lines += [f"- {_cell(t.name)}: {_cell(t.error or '')}" for t in unavailable]
    failing = _failing(result)
    if failing:
        lines += [
            "",
            f"## Failing checks ({len(failing)})",
            "",
            "| verdict | target | check | where | p-value | message | replay |",
            "|---|---|---|---|---:|---|---|",
        ]
        for check in failing[:MAX_ROWS]:
            lines.append(
                f"| **{check.verdict.value}** | {_cell(check.target)} | {_cell(check.check_id)} "
                f"| {_cell(check.where)} | {_number(check.p_value)} | {_cell(check.message)} "
                f"| <code>{_cell(check.replay or '-', 1000)}</code> |"
            )
        if len(failing) > MAX_ROWS:
            lines.append(f"\n... and {len(failing) - MAX_ROWS} more (see report.html).")
    if trends is not None:
        lines += _trend_rows(trends)
    text = "\n".join(lines) + "\n"
    encoded = text.encode("utf-8")
    if len(encoded) > STEP_SUMMARY_LIMIT:
        note = "\n\n(summary cut at GitHub's step-summary limit; see report.html)\n"
        keep = STEP_SUMMARY_LIMIT - len(note.encode("utf-8"))
        text = encoded[:keep].decode("utf-8", errors="ignore") + note
    return text
