"""``losslessness list``: registered adapters, checks, the battery's cases and the mutant zoo."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from losslessness.adapters import registered_adapters
from losslessness.checks import ALL_CHECK_IDS
from losslessness.engine.battery import default_chain_battery, default_greedy_battery


@click.command(name="list")
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
    console.print("checks: " + ", ".join(ALL_CHECK_IDS))
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
