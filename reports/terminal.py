"""Terminal rendering of an audit: one verdict table per target (rich), then the failures
with their replay commands, then a one-line summary per target.

Every text from a target or the record is a :func:`reports.text.terminal_text` (a rich Text,
never parsed as markup, its control characters visible); nothing is printed as a markup
string."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table
from rich.text import Text

from losslessness.results import AuditResult, CheckKind, TargetVerdict, Verdict, design_note
from reports.text import terminal_text

_STYLES = {
    Verdict.PASS: "green",
    Verdict.LOSSY: "bold red",
    Verdict.SUBOPTIMAL: "yellow",
    Verdict.ERROR: "bold magenta",
    Verdict.SKIPPED: "dim",
    TargetVerdict.LOSSLESS: "bold green",
    TargetVerdict.LOSSY: "bold red",
    TargetVerdict.SUBOPTIMAL: "bold yellow",
    TargetVerdict.ERROR: "bold magenta",
    TargetVerdict.UNAVAILABLE: "dim",
    TargetVerdict.INCOMPLETE: "bold yellow",
}


def format_number(value: float | None, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits for a report cell: ``-`` for None (no such
    number, e.g. the p-value of an exact check), ``inf`` for an infinite one."""
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value:.{digits}g}"


def _table(result: AuditResult, index: int) -> Table:
    target = result.targets[index]
    table = Table(
        title=Text.assemble(
            terminal_text(target.name), ": ", (target.verdict.value, _STYLES[target.verdict])
        ),
        caption=terminal_text(target.description),
        title_justify="left",
        caption_justify="left",
    )
    for column, justify in (
        ("check", "left"),
        ("case", "left"),
        ("pos", "right"),
        ("n", "right"),
        ("statistic", "right"),
        ("df", "right"),
        ("p-value", "right"),
        ("alpha", "right"),
        ("power", "right"),
        ("min TV", "right"),
        ("verdict", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for check in target.checks:
        case = terminal_text(check.case_id + (f"[{check.row}]" if check.n_rows > 1 else ""))
        underpowered = check.kind is CheckKind.STATISTICAL and (
            check.min_detectable_tv > result.config.tv * 1.0001
        )
        table.add_row(
            terminal_text(check.check_id),
            case,
            "-" if check.position is None else str(check.position),
            str(check.n),
            format_number(check.statistic),
            "-" if check.df is None else str(check.df),
            format_number(check.p_value),
            "exact" if check.kind is CheckKind.EXACT else format_number(check.alpha, 2),
            format_number(check.power, 2),
            Text(format_number(check.min_detectable_tv), style="yellow" if underpowered else ""),
            Text(check.verdict.value, style=_STYLES[check.verdict]),
        )
    return table


def print_audit(result: AuditResult, console: Console | None = None) -> None:
    """Print the verdict tables, the failures (with replay commands) and the summary.

    Args:
        result: the audit.
        console: where to print (default: standard output).
    """
    console = console or Console()
    config = result.config
    console.print(
        Text.assemble(
            ("losslessness audit", "bold"),
            f" seed {config.seed}: every statistical check detects TV >= {config.tv:g} with "
            f"power {config.power:g}; family-wise false-alarm rate "
            f"{config.family_wise_alpha:g} split over {result.n_assertions} assertions -> "
            f"alpha {result.per_assertion_alpha:.3g} each (Bonferroni). Exact checks have no "
            "false alarms; 'min TV' for them is the smallest violation rate caught with that "
            "power, for acceptance the smallest shift of the rate." + design_note(config),
        )
    )
    if "time budget" in result.environment:
        console.print(
            Text.assemble("time budget: ", terminal_text(result.environment["time budget"]))
        )
    for index, target in enumerate(result.targets):
        if target.error is not None:
            console.print(
                Text.assemble(
                    terminal_text(target.name),
                    ": ",
                    (target.verdict.value, _STYLES[target.verdict]),
                    " - could not be audited: ",
                    terminal_text(target.error),
                )
            )
            continue
        console.print(_table(result, index))
        for check in target.checks:
            if check.verdict in (Verdict.LOSSY, Verdict.SUBOPTIMAL, Verdict.ERROR):
                console.print(
                    Text.assemble(
                        (f"{check.verdict.value} ", _STYLES[check.verdict]),
                        terminal_text(f"{check.check_id} at {check.where} ({check.case_summary})"),
                        ": ",
                        terminal_text(check.message),
                    )
                )
                if check.replay:
                    console.print(terminal_text(f"  replay: {check.replay}", style="dim"))
    for target in result.targets:
        counts = {verdict: sum(c.verdict is verdict for c in target.checks) for verdict in Verdict}
        summary = ", ".join(
            f"{count} {verdict.value}" for verdict, count in counts.items() if count
        )
        console.print(
            Text.assemble(
                (f"{target.verdict.value:<10} ", _STYLES[target.verdict]),
                terminal_text(target.name),
                f": {summary or 'no checks'}; {target.verify_steps} verify steps in "
                f"{target.wall_time_s:.1f} s",
            )
        )
        if target.stopped_early:
            console.print(
                terminal_text(f"           stopped early: {target.stopped_early}", style="dim")
            )
    console.print(Text(f"wall time {result.wall_time_s:.1f} s"))
