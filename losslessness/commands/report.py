"""``losslessness report``: render a saved audit record as HTML, Markdown, JUnit XML and JSON,
with trends against earlier records."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape


@click.command(name="report")
@click.argument("result_json", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--history",
    "history",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Earlier audit records for the trends: a JSON file, or a directory searched "
    "recursively for them (repeatable).",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory to write report.html, report.md, junit.xml and report.json into.",
)
def report_command(result_json: Path, history: tuple[Path, ...], out_dir: Path) -> None:
    """Render RESULT_JSON (written by 'losslessness audit --json') into --out DIR.

    With --history, the reports show each check's history and flag new failures (LOSSY or
    ERROR now, not in the previous run) and power drops (minimum detectable TV grown by more
    than x1.25). RESULT_JSON itself is ignored when found among the history.
    """
    from reports import read_json, write_reports

    try:
        result = read_json(result_json)
    except (OSError, ValueError) as error:
        # Malformed input is a usage error (exit 2), its message naming the wrong field.
        raise click.BadParameter(
            f"{result_json} is not an audit record: {error}", param_hint="RESULT_JSON"
        ) from error
    if out_dir.exists() and not out_dir.is_dir():
        raise click.BadParameter(f"{out_dir} is not a directory", param_hint="--out")
    try:
        paths = write_reports(result, out_dir, history)
    except (FileNotFoundError, ValueError) as error:
        raise click.BadParameter(str(error), param_hint="--history") from error
    console = Console()
    for name, path in paths.items():
        console.print(f"wrote {name}: {escape(str(path))}")
