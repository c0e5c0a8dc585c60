"""Command line: ``losslessness audit | list | plan``.

Exit codes of ``audit``: 0 lossless (also when only the SUBOPTIMAL warning fires), 1 lossy,
2 usage error, 3 a target crashed or could not be loaded (recorded per check; the other checks
still run).
"""

from __future__ import annotations

import math
import sys

import click
from rich.console import Console
from rich.table import Table

from losslessness.adapters import (
    Adapter,
    AdapterNotFound,
    AdapterUnavailable,
    registered_adapters,
    resolve_adapter,
)
from losslessness.audit import AuditConfig, UnavailableTarget, run_audit
from losslessness.checks import (
    CHAIN_CHECK_IDS,
    GREEDY_CHECK_IDS,
    SEQUENCE_CHECK_IDS,
    default_chain_battery,
    default_greedy_battery,
)
from losslessness.commands.nightly import merge_command, nightly_command
from losslessness.commands.progress import progress_bar
from losslessness.commands.report import report_command
from losslessness.commands.speedup import speedup_command
from losslessness.stats import (
    DEFAULT_FAMILY_WISE_ALPHA,
    binomial_minimum_detectable_shift,
    plan_identity_test,
)

DEFAULT_TARGETS = ("reference", "transformers", "transformers-generate")
"""What ``losslessness audit`` audits when no target is named."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="losslessness")
def main() -> None:
    """Statistical verification that a speculative-decoding verifier is lossless."""


@main.command()
@click.argument("targets", nargs=-1)
@click.option(
    "--tv",
    type=float,
    default=0.05,
    show_default=True,
    help="Design TV distance: each identity test detects TV >= this with --power.",
)
@click.option(
    "--alpha",
    type=float,
    default=DEFAULT_FAMILY_WISE_ALPHA,
    show_default=True,
    help="Family-wise false-alarm rate of the whole run (split Bonferroni).",
)
@click.option("--power", type=float, default=0.9, show_default=True, help="Design power 1-beta.")
@click.option("--seed", type=int, default=0, show_default=True, help="Run seed.")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the AuditResult as JSON to this path.",
)
@click.option(
    "--only",
    multiple=True,
    metavar="CHECK",
    help="Run only this check (repeatable): "
    f"{', '.join(CHAIN_CHECK_IDS + GREEDY_CHECK_IDS + SEQUENCE_CHECK_IDS)}"
    ", or 'edge' for every edge case.",
)
@click.option(
    "--case",
    "cases",
    multiple=True,
    metavar="CASE",
    help="Run only this battery case or end-to-end target (repeatable); see 'losslessness list'.",
)
@click.option(
    "--greedy",
    is_flag=True,
    help="pkg.module:callable targets follow the greedy protocol, not the chain one.",
)
@click.option(
    "--max-steps",
    type=int,
    default=200_000,
    show_default=True,
    help="Cap on verify steps per case and row type, and on sequences per end-to-end target.",
)
@click.option(
    "--steps",
    type=int,
    default=None,
    help="Use exactly this many steps per case, sequences per end-to-end target (replays).",
)
@click.option("--no-progress", is_flag=True, help="Do not show a progress bar.")
def audit(
    targets: tuple[str, ...],
    tv: float,
    alpha: float,
    power: float,
    seed: int,
    json_path: str | None,
    only: tuple[str, ...],
    cases: tuple[str, ...],
    greedy: bool,
    max_steps: int,
    steps: int | None,
    no_progress: bool,
) -> None:
    """Audit TARGETS (default: reference transformers transformers-generate) on the battery.

    A TARGET is a registered adapter (see 'losslessness list') or pkg.module:callable, a
    function in the chain protocol (or the greedy protocol with --greedy), imported as
    'python -m' would: the current directory first, then PYTHONPATH. Adapters with end-to-end
    targets (toy, transformers-generate) get the sequence-law checks.
    """
    known_checks = (*CHAIN_CHECK_IDS, *GREEDY_CHECK_IDS, *SEQUENCE_CHECK_IDS, "edge")
    for name in only:
        if name not in known_checks:
            raise click.BadParameter(
                f"unknown check {name!r}; known: {', '.join(known_checks)}", param_hint="--only"
            )
    try:
        config = AuditConfig(
            tv=tv,
            family_wise_alpha=alpha,
            power=power,
            seed=seed,
            only=only,
            cases=cases,
            max_steps=max_steps,
            steps=steps,
        )
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    resolved: list[Adapter | UnavailableTarget] = []
    for name in targets or DEFAULT_TARGETS:
        try:
            resolved.append(resolve_adapter(name, greedy=greedy))
        except AdapterNotFound as error:
            raise click.UsageError(str(error)) from error
        except AdapterUnavailable as error:
            resolved.append(UnavailableTarget(name, str(error)))
    # Tables need ~150 columns; a pipe or CI log gets that width instead of rich's 80.
    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        with progress_bar("verify steps", quiet=no_progress) as update:
            result = run_audit(resolved, config, progress=update)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    from reports import print_audit, write_json

    print_audit(result, console)
    if json_path:
        write_json(result, json_path)
        console.print(f"wrote {json_path}")
    sys.exit(result.exit_code)


@main.command(name="list")
def list_command() -> None:
    """List registered adapters, checks, the battery's cases and the mutant zoo."""
    console = Console()
    adapters = Table(
        title="adapters (entry-point group losslessness.adapters)", title_justify="left"
    )
    adapters.add_column("name")
    adapters.add_column("entry point")
    for name, point in sorted(registered_adapters().items()):
        adapters.add_row(name, point.value)
    console.print(adapters)
    console.print("checks: " + ", ".join((*CHAIN_CHECK_IDS, *GREEDY_CHECK_IDS)))
    cases = Table(title="battery cases", title_justify="left")
    cases.add_column("case")
    cases.add_column("protocol")
    cases.add_column("summary")
    cases.add_column("hash")
    for case in default_chain_battery():
        cases.add_row(case.case_id, "chain", case.summary, case.case_hash)
    for greedy_case in default_greedy_battery():
        cases.add_row(greedy_case.case_id, "greedy", greedy_case.summary, greedy_case.case_hash)
    console.print(cases)
    from losslessness.adapters.mutants import MUTANTS

    zoo = Table(title="Mutant zoo (audit as mutant/<name>)", title_justify="left")
    zoo.add_column("name", no_wrap=True)
    zoo.add_column("kind")
    zoo.add_column("mechanism", overflow="fold")
    zoo.add_column("source", overflow="fold")
    for entry in MUTANTS.values():
        zoo.add_row(
            entry.name, "lossy" if entry.lossy else "control", entry.mechanism, entry.source
        )
    console.print(zoo)


@main.command()
@click.option("--tv", type=float, default=0.05, show_default=True, help="Design TV distance.")
@click.option("--vocab", type=click.IntRange(min=2), required=True, help="Vocabulary size V.")
@click.option("--k", "k", type=click.IntRange(min=0), required=True, help="Draft length k.")
@click.option(
    "--alpha",
    type=float,
    default=DEFAULT_FAMILY_WISE_ALPHA,
    show_default=True,
    help="Family-wise false-alarm rate, split over the 2k+1 assertions of one case.",
)
@click.option("--power", type=float, default=0.9, show_default=True, help="Design power.")
@click.option(
    "--acceptance",
    type=float,
    default=0.8,
    show_default=True,
    help="Acceptance rate per position, which sets how often deep positions are reached.",
)
def plan(tv: float, vocab: int, k: int, alpha: float, power: float, acceptance: float) -> None:
    """Print the sample sizes one case of (V, k) needs: identity tests of every position
    against a uniform p over V (the most cells, so the most samples), plus acceptance tests."""
    if not 0 < tv <= 1 or not 0 < alpha < 1 or not 0 < power < 1 or not 0 < acceptance <= 1:
        raise click.UsageError(
            "--tv in (0, 1], --alpha and --power in (0, 1), --acceptance in (0, 1]"
        )
    n_assertions = 2 * k + 1 if acceptance < 1 else k + 1
    alpha_each = alpha / n_assertions
    console = Console()
    console.print(
        f"V={vocab}, k={k}: {n_assertions} statistical assertions, alpha {alpha_each:.3g} each "
        f"(family-wise {alpha:g}); identity tests detect TV >= {tv:g} with power {power:g}"
    )
    identity = plan_identity_test([1.0 / vocab] * vocab, tv, alpha_each, power)
    reach = [acceptance**position for position in range(k + 1)]
    steps_needed = max(math.ceil(identity.n / r) for r in reach)
    table = Table()
    for column in (
        "position",
        "samples needed",
        "df",
        "P(reach)",
        "verify steps",
        "acceptance shift detected",
    ):
        table.add_column(column, justify="right")
    for position in range(k + 1):
        reached = math.floor(steps_needed * reach[position])
        shift = (
            "-"
            if position == k or acceptance >= 1
            else (
                f"{binomial_minimum_detectable_shift(reached, acceptance, alpha_each, power):.3g}"
            )
        )
        label = f"{position} (bonus)" if position == k else str(position)
        table.add_row(
            label,
            str(identity.n),
            str(identity.df),
            f"{reach[position]:.3g}",
            str(math.ceil(identity.n / reach[position])),
            shift,
        )
    console.print(table)
    console.print(f"verify steps needed: {steps_needed} (the deepest position decides)")


main.add_command(speedup_command)
main.add_command(report_command)
main.add_command(nightly_command)
main.add_command(merge_command)
