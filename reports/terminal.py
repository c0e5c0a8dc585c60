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

from losslessness.results import (
    AuditResult,
    CheckKind,
    CheckResult,
    TargetResult,
    TargetVerdict,
    Verdict,
    design_note,
    design_shortfalls,
    is_not_applicable,
    reached_tv,
)
from reports.text import terminal_text

_STYLES = {
    Verdict.PASS: "green",
    Verdict.LOSSY: "bold red",
    Verdict.SUBOPTIMAL: "yellow",
    Verdict.ERROR: "bold magenta",
    Verdict.SKIPPED: "dim",
    Verdict.IRREPRODUCIBLE: "bold cyan",
    TargetVerdict.LOSSLESS: "bold green",
    TargetVerdict.LOSSY: "bold red",
    TargetVerdict.SUBOPTIMAL: "bold yellow",
    TargetVerdict.ERROR: "bold magenta",
    TargetVerdict.UNAVAILABLE: "dim",
    TargetVerdict.INCOMPLETE: "bold yellow",
    TargetVerdict.INCONCLUSIVE: "bold yellow",
    TargetVerdict.IRREPRODUCIBLE: "bold cyan",
}


def design_statement(result: AuditResult, target: TargetResult) -> str:
    """What a LOSSLESS (or SUBOPTIMAL) verdict rests on: ``every assertion at TV >= x, power
    y`` with x the worst TV the target's statistical assertions reached
    (:func:`losslessness.results.reached_tv`), then the design the run chose when it is not
    the default one (another ``--tv``, a step multiplier, a time budget's claim) and the cases
    the adapter declares it does not take."""
    config = result.config
    reached = reached_tv(target.checks)
    if reached is None:
        text = "exact checks only, no statistical assertion"
    else:
        text = f"every assertion at TV >= {format_number(reached)}, power {config.power:g}"
    chosen = [f"design TV {config.tv:g}"]
    if config.step_multiplier != 1:
        chosen.append(f"steps x{config.step_multiplier:g} of the CI plan")
    if "time budget" in result.environment:
        chosen.append(f"TV chosen by --time-budget {config.time_budget_s:g} s")
    excluded = sum(is_not_applicable(check) for check in target.checks)
    if target.exclusions is not None and excluded:
        chosen.append(
            f"{excluded} checks not applicable by the adapter's declaration: "
            f"{target.exclusions}"
        )
    return f"{text} ({'; '.join(chosen)})"


def verdict_line(result: AuditResult, target: TargetResult) -> str:
    """The verdict with what it rests on: ``LOSSLESS: every assertion at TV >= ...``
    (:func:`design_statement`), ``INCONCLUSIVE: design not reached: ...`` (why, from
    :func:`losslessness.results.design_shortfalls`), or the verdict alone; then the expected
    verdict when the adapter declares one (``UNEXPECTED`` when the verdict differs)."""
    text = target.verdict.value
    if target.verdict in (TargetVerdict.LOSSLESS, TargetVerdict.SUBOPTIMAL):
        text += ": " + design_statement(result, target)
    elif target.verdict is TargetVerdict.INCONCLUSIVE:
        reasons = design_shortfalls(target.checks, result.config, target.exclusions)
        text += ": design not reached: " + "; ".join(reasons)
    expected = target.expected
    if expected is not None and target.expected_verdict is not None:
        text += f" [expected {expected.value}: {target.expected_reason}"
        text += "]" if target.as_expected else "; UNEXPECTED]"
    return text


def format_number(value: float | None, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits for a report cell: ``-`` for None (no such
    number, e.g. the p-value of an exact check), ``inf`` for an infinite one."""
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value:.{digits}g}"


def _row_suffix(check: CheckResult) -> str:
    """``[label]`` of a serving row kind (``details["label"]``, what the row is, e.g.
    ``[top-k 4]``), else ``[row]`` of a case with several row types, else nothing (a check of
    the whole case, such as its structure)."""
    label = check.details.get("label")
    if isinstance(label, str) and label:
        return f"[{label}]"
    return f"[{check.row}]" if check.n_rows > 1 and check.row is not None else ""


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
        case = terminal_text(check.case_id + _row_suffix(check))
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
            f" seed {config.seed}: design TV {config.tv:g} with power {config.power:g} (each "
            "target's verdict line states the TV its assertions reached); family-wise "
            f"false-alarm rate {config.family_wise_alpha:g} split over {result.n_assertions} "
            f"assertions -> alpha {result.per_assertion_alpha:.3g} each (Bonferroni). Exact "
            "checks have no false alarms; 'min TV' for them is the smallest violation rate "
            "caught with that power, for acceptance the smallest shift of the rate."
            + design_note(config),
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
            if check.verdict in (
                Verdict.LOSSY, Verdict.SUBOPTIMAL, Verdict.ERROR, Verdict.IRREPRODUCIBLE
            ):
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
                (f"{target.verdict.value:<12} ", _STYLES[target.verdict]),
                terminal_text(target.name),
                f": {summary or 'no checks'}; {target.verify_steps} verify steps in "
                f"{target.wall_time_s:.1f} s",
            )
        )
        if target.error is None:
            console.print(terminal_text(f"             {verdict_line(result, target)}"))
        if target.stopped_early:
            console.print(
                terminal_text(f"             stopped early: {target.stopped_early}", style="dim")
            )
    console.print(Text(f"wall time {result.wall_time_s:.1f} s"))
