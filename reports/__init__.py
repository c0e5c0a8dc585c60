"""Renderers of :class:`losslessness.results.AuditResult`: terminal tables (rich), JSON, HTML with
plots, JUnit XML, a Markdown step summary, and trends over earlier runs.

``reports`` only reads AuditResult (docs/architecture.md, 'Layers'). :func:`write_reports` writes
the four files a nightly run publishes.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from losslessness.results import AuditResult
from reports.html import render_html, write_html
from reports.jsonio import audit_from_dict, audit_to_dict, read_json, write_json
from reports.junit import render_junit, write_junit
from reports.markdown import STEP_SUMMARY_LIMIT, render_markdown
from reports.terminal import print_audit
from reports.trends import (
    POWER_DROP_FACTOR,
    CheckTrend,
    TrendPoint,
    Trends,
    compute_trends,
    load_history,
)

REPORT_FILES = {
    "html": "report.html",
    "markdown": "report.md",
    "junit": "junit.xml",
    "json": "report.json",
}
"""File name of each report :func:`write_reports` writes, by format."""


def write_reports(
    result: AuditResult,
    out_dir: str | Path,
    history: Iterable[AuditResult | str | Path] = (),
) -> dict[str, Path]:
    """Write report.html, report.md, junit.xml and report.json of ``result`` into ``out_dir``.

    Args:
        result: the audit.
        out_dir: directory to write into (created if missing).
        history: earlier runs for the trends: records, JSON files, or directories searched
            recursively for audit records (see :func:`reports.trends.load_history`). With
            none, the reports have no trends section.

    Returns:
        The written paths by format: ``html``, ``markdown``, ``junit``, ``json``.

    Raises:
        FileNotFoundError: a history path does not exist.
        ValueError: a named history file is not an audit record of this schema version.
        NotADirectoryError: ``out_dir`` exists and is not a directory.
    """
    directory = Path(out_dir)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"out_dir: {directory} exists and is not a directory")
    runs, skipped = load_history(history)
    trends = compute_trends(result, runs, skipped_sources=skipped) if runs or skipped else None
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / filename for name, filename in REPORT_FILES.items()}
    write_html(result, paths["html"], trends)
    paths["markdown"].write_text(render_markdown(result, trends), encoding="utf-8")
    write_junit(result, paths["junit"])
    write_json(result, paths["json"])
    return paths


__all__ = [
    "POWER_DROP_FACTOR",
    "REPORT_FILES",
    "STEP_SUMMARY_LIMIT",
    "CheckTrend",
    "TrendPoint",
    "Trends",
    "audit_from_dict",
    "audit_to_dict",
    "compute_trends",
    "load_history",
    "print_audit",
    "read_json",
    "render_html",
    "render_junit",
    "render_markdown",
    "write_html",
    "write_json",
    "write_junit",
    "write_reports",
]
