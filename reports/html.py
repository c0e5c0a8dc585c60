"""Self-contained HTML report of an audit (jinja2, autoescape on; figures inlined as PNG
data URIs; CSS inline; no external resources).

Sections: the run's design and budget, the verdict per target, the failing checks with their
replay commands, trends over earlier runs (when given), then per target its figures
(:mod:`reports.figures`) and the table of every check. Every string an expression of the
template prints goes through :func:`reports.text.html_finalize` (control characters visible,
length bounded) and then jinja2's autoescape (markupsafe): no text from a target or the record
becomes markup. Only the figures' data URIs, made here, are passed as
:class:`~markupsafe.Markup`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from losslessness.results import AuditResult, CheckKind, CheckResult, Verdict
from reports.style import MAX_LAW_FIGURES, MAX_LAW_FIGURES_TOTAL, VERDICT_COLORS
from reports.terminal import format_number, verdict_line
from reports.text import html_finalize
from reports.trends import CheckTrend, Trends

HISTORY_COLUMNS = 10
"""Most recent runs shown per check in the trends table."""

_SHORT_VERDICTS = {
    Verdict.PASS: "PASS",
    Verdict.LOSSY: "LOSSY",
    Verdict.SUBOPTIMAL: "SUBOPT",
    Verdict.ERROR: "ERROR",
    Verdict.SKIPPED: "SKIP",
}

_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("reports", "templates"),
    autoescape=True,
    finalize=html_finalize,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


@dataclass(frozen=True)
class _CheckRow:
    check: CheckResult
    alpha: str
    p_value: str
    statistic: str
    min_tv: str
    underpowered: bool
    replay: str


def _check_row(result: AuditResult, check: CheckResult) -> _CheckRow:
    return _CheckRow(
        check=check,
        alpha="exact" if check.kind is CheckKind.EXACT else format_number(check.alpha, 2),
        p_value=format_number(check.p_value),
        statistic=format_number(check.statistic),
        min_tv=format_number(check.min_detectable_tv),
        underpowered=check.kind is CheckKind.STATISTICAL
        and check.min_detectable_tv > result.config.tv * 1.0001,
        replay=check.replay or "",
    )


@dataclass(frozen=True)
class _TrendRow:
    trend: CheckTrend
    cells: list[dict[str, str] | None]
    ratio: str


def _flag_order(trend: CheckTrend) -> tuple[bool, bool, bool]:
    """Sort key: new failures, then verdicts changed with a version, then power drops."""
    return (not trend.new_failure, not trend.verdict_changed_with_version, not trend.power_drop)


def _trend_view(trends: Trends) -> dict[str, Any]:
    runs = trends.runs[-HISTORY_COLUMNS:]
    first_run = len(trends.runs) - len(runs)
    rows = []
    for trend in sorted(trends.checks, key=_flag_order):
        by_run = {point.run: point for point in trend.points}
        cells: list[dict[str, str] | None] = []
        for run in range(first_run, len(trends.runs)):
            point = by_run.get(run)
            cells.append(
                None
                if point is None
                else {
                    "verdict": point.verdict.value,
                    "label": _SHORT_VERDICTS[point.verdict],
                    "title": f"p-value {format_number(point.p_value)}, min TV "
                    f"{format_number(point.min_detectable_tv)}",
                    "min_tv": format_number(point.min_detectable_tv, 2),
                }
            )
        rows.append(_TrendRow(trend, cells, format_number(trend.tv_ratio)))
    return {
        "trends": trends,
        "runs": runs,
        "rows": rows,
        "flagged": [row for row in rows if row.trend.flagged],
        "new_failures": len(trends.new_failures),
        "power_drops": len(trends.power_drops),
        "version_changes": len(trends.version_changes),
    }


def render_html(
    result: AuditResult,
    trends: Trends | None = None,
    max_law_figures: int = MAX_LAW_FIGURES,
    max_law_figures_total: int = MAX_LAW_FIGURES_TOTAL,
) -> str:
    """The HTML report of ``result``.

    Args:
        result: the audit.
        trends: :func:`reports.trends.compute_trends` of the run, or None (no history).
        max_law_figures: law figures per target (failures first, then an even sample).
        max_law_figures_total: law figures in the whole report.

    Returns:
        One self-contained HTML5 document.
    """
    targets = []
    # Here, not at import: matplotlib is for rendering only (reports/style.py).
    from reports.figures import report_figures

    all_figures = report_figures(result, max_law_figures, max_law_figures_total)
    for target, figures in zip(result.targets, all_figures, strict=True):
        targets.append(
            {
                "target": target,
                "verdict_line": verdict_line(result, target),
                "expected": "-" if target.expected is None else target.expected.value,
                "figures": [
                    dataclasses.replace(figure, data_uri=Markup(figure.data_uri))
                    for figure in figures
                ],
                "rows": [_check_row(result, check) for check in target.checks],
                "counts": {
                    verdict.value: sum(check.verdict is verdict for check in target.checks)
                    for verdict in Verdict
                },
            }
        )
    failing = [
        _check_row(result, check)
        for verdict in (Verdict.LOSSY, Verdict.ERROR, Verdict.SUBOPTIMAL)
        for target in result.targets
        for check in target.checks
        if check.verdict is verdict
    ]
    template = _ENVIRONMENT.get_template("report.html.j2")
    return template.render(
        result=result,
        config=result.config,
        overall=result.verdict.value,
        targets=targets,
        failing=failing,
        verdicts=[verdict.value for verdict in Verdict],
        colors={verdict.value: color for verdict, color in VERDICT_COLORS.items()},
        trends=None if trends is None else _trend_view(trends),
        number=format_number,
    )


def write_html(
    result: AuditResult,
    path: str | Path,
    trends: Trends | None = None,
    max_law_figures: int = MAX_LAW_FIGURES,
    max_law_figures_total: int = MAX_LAW_FIGURES_TOTAL,
) -> None:
    """Write :func:`render_html` of ``result`` to ``path`` (UTF-8)."""
    html = render_html(result, trends, max_law_figures, max_law_figures_total)
    Path(path).write_text(html, encoding="utf-8")
