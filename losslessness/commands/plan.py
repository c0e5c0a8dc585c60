"""``losslessness plan``: print what a run would do, from the same planner the run uses
(:func:`losslessness.engine.plan_run`), without drawing a sample."""

from __future__ import annotations

import math
from typing import Any

import click
from rich.table import Table

from losslessness.checks import STATISTICAL_CHAIN_CHECK_IDS, count_statistical_assertions
from losslessness.checks.assertions import case_laws, law_is_statistical
from losslessness.commands.audit import report_console, resolve_named_targets
from losslessness.commands.options import (
    TARGET_ARGUMENT_FLAGS,
    build_config,
    design_options,
    usage_error,
)
from losslessness.engine import RunPlan, plan_run
from losslessness.stats import identity_minimum_detectable_tv
from reports.text import terminal_text


def expected_minimum_detectable_tv(plan: RunPlan, case_id: str) -> float:
    """The largest minimum detectable TV among the case's identity tests, at the number of
    samples each position gets in expectation (steps times its reach probability)."""
    case = next(case for case in plan.chain_cases if case.case_id == case_id)
    grid = plan.record.chain_cases[case_id]
    worst = 0.0
    for laws in case_laws(case):
        for i in range(case.k + 1):
            if not law_is_statistical(laws, i):
                continue
            n = math.floor(grid.n_steps * float(laws.reach[i]))
            p = laws.emitted[i].numpy()
            bound = identity_minimum_detectable_tv(p, n, plan.record.per_assertion_alpha,
                                                   plan.config.power)
            worst = max(worst, bound.minimum_detectable_tv)
    return worst


@click.command(name="plan")
@click.argument("targets", nargs=-1)
@design_options
@click.option(
    "--budget",
    type=float,
    default=None,
    help="Step multiplier: the multiple of the CI plan's steps.",
)
@click.option(
    "--greedy",
    is_flag=True,
    help="pkg.module:callable targets follow the greedy protocol, not the chain one.",
)
def plan_command(
    targets: tuple[str, ...], budget: float | None, greedy: bool, **options: Any
) -> None:
    """Print the plan of a run of TARGETS (default: those of 'losslessness audit'): the error
    budget, every chain case's steps and chunks, the end-to-end sequences, the unit grid."""
    config = build_config(options, step_multiplier=budget)
    try:
        plan = plan_run(
            config, resolve_named_targets(targets, greedy, in_process=options["in_process"])
        )
    except ValueError as error:
        raise usage_error(error, TARGET_ARGUMENT_FLAGS) from error
    record = plan.record
    console = report_console()
    console.print(
        f"{record.n_assertions} statistical assertions, alpha {record.per_assertion_alpha:.3g} "
        f"each (family-wise {record.battery_alpha:g}); identity tests sized for TV >= "
        f"{config.tv:g} with power {config.power:g}; "
        f"steps x{config.step_multiplier:g} of the CI plan; "
        f"seed {config.seed}; plan {record.fingerprint[:12]}"
    )
    selected = tuple(c for c in STATISTICAL_CHAIN_CHECK_IDS if config.selects(c))
    table = Table(title="chain cases (every chain target)", title_justify="left")
    for column in ("case", "V", "k", "rows", "assertions", "CI steps", "needed", "steps",
                   "chunks", "min TV (expected)"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for case in plan.chain_cases:
        grid = record.chain_cases[case.case_id]
        table.add_row(
            case.case_id,
            str(case.vocab_size),
            str(case.k),
            str(case.n_rows),
            str(count_statistical_assertions(case, grid.steps_per_call, selected)),
            str(grid.ci_steps),
            str(grid.needed_steps) + (" (capped)" if grid.capped else ""),
            str(grid.n_steps),
            str(grid.n_chunks),
            f"{expected_minimum_detectable_tv(plan, case.case_id):.3g}",
        )
    console.print(table)
    for name, entries in plan.end_to_end.items():
        for entry in entries:
            if entry.error is not None:
                detail = f"planning failed: {type(entry.error).__name__}: {entry.error}"
            elif entry.plan is None:
                detail = f"{entry.planned_runs} greedy runs (exact)"
            else:
                detail = (
                    f"{entry.plan.n} sequences over {entry.plan.law.n_cells} cells, min TV "
                    f"{entry.plan.min_detectable_tv:.3g}"
                    + (" (capped)" if entry.plan.capped else "")
                )
            console.print(terminal_text(f"end-to-end {name} {entry.target.name}: {detail}"))
    for name, reason, _ in record.unavailable:
        console.print(terminal_text(f"unavailable {name}: {reason}"))
    kinds: dict[str, int] = {}
    for unit in record.units:
        kinds[unit.kind] = kinds.get(unit.kind, 0) + 1
    console.print(
        f"{len(record.units)} units ({', '.join(f'{n} {k}' for k, n in kinds.items())}); "
        f"{plan.planned_steps()} verify steps and sequences in all"
    )
