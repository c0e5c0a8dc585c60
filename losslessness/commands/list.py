"""``losslessness list``: registered adapters (with the installed version of the engine each
wraps), checks, the battery's cases, a case file's cases and the mutant zoo."""

from __future__ import annotations

from importlib import metadata

import click
from rich.console import Console
from rich.table import Table

from losslessness.batteries import (
    default_chain_battery,
    default_greedy_battery,
    default_greedy_tree_battery,
    default_serving_battery,
    default_tree_battery,
)
from losslessness.batteries.case_file import read_case_file
from losslessness.batteries.serving_tree import default_serving_tree_battery
from losslessness.cases import ChainCase, ServingCase, TreeCase
from losslessness.checks import ALL_CHECK_IDS
from losslessness.targets import registered_adapters
from losslessness.zoo import MUTANTS

ENGINE_DISTRIBUTIONS = {
    "losslessness.adapters.vllm": "vllm",
    "losslessness.adapters.sglang": "sglang",
    "losslessness.adapters.flashinfer": "flashinfer-python",
    "losslessness.adapters.transformers": "transformers",
    "losslessness.adapters.transformers_generate": "transformers",
    "losslessness.adapters.transformers_cuda": "transformers",
    "losslessness.adapters.medusa": "medusa-llm",
    "losslessness.adapters.eagle": "eagle-llm",
}
"""The PyPI distribution of the engine each built-in adapter module wraps (flashinfer's import
name is ``flashinfer``, its distribution ``flashinfer-python``)."""

LISTED_TREE_PROFILE = "vllm-v1"
"""The engine profile the serving tree cases are listed as built for."""

NOT_INSTALLED = "not installed"
"""What :func:`engine_version` says for an engine whose distribution is missing."""


def engine_distribution(entry_point_value: str) -> str | None:
    """The engine distribution an adapter entry point wraps, or None (reference, toy, mutants,
    third-party adapters).

    Args:
        entry_point_value: the entry point's ``module:attribute`` (``"losslessness.adapters.
            vllm:adapter"``).
    """
    module = entry_point_value.partition(":")[0].strip()
    return ENGINE_DISTRIBUTIONS.get(module)


def engine_version(distribution: str) -> str:
    """``"vllm 0.33.0"`` or ``"vllm not installed"``: the installed version from the package
    metadata (:func:`importlib.metadata.version`), without importing the engine (vLLM's import
    alone takes seconds)."""
    try:
        return f"{distribution} {metadata.version(distribution)}"
    except metadata.PackageNotFoundError:
        return f"{distribution} {NOT_INSTALLED}"


def case_file_table(path: str) -> Table:
    """The cases of a case file (``list --case-file``): id, protocol, summary and hash, each
    built as a run builds it (a serving tree case for the table's ``profile``; without one
    its laws wait for a target's profile, and it is listed unbuilt).

    Raises:
        click.BadParameter: an invalid file, naming ``--case-file``, the table and the field.
    """
    try:
        file = read_case_file(path)
        built: list[tuple[str, ChainCase | TreeCase | ServingCase]] = [
            *(("chain", case) for case in file.chain_cases()),
            *(("tree", case) for case in file.tree_cases()),
            *(("serving", case) for case in file.serving_cases()),
        ]
        built += [
            ("serving-tree", file.serving_tree_case(spec, spec.profile))
            for spec in file.serving_tree if spec.profile is not None
        ]
    except ValueError as error:
        raise click.BadParameter(
            str(error).removeprefix("case_file: "), param_hint="--case-file"
        ) from error
    table = _case_table(f"cases of {path}")
    for protocol, case in built:
        table.add_row(case.case_id, protocol, case.summary, case.case_hash)
    for spec in file.serving_tree:
        if spec.profile is None:
            table.add_row(spec.case_id, "serving-tree",
                          f"{spec.label}; built for each target's engine profile", "-")
    return table


def _case_table(title: str) -> Table:
    """An empty table of cases: id, protocol, summary, hash."""
    table = Table(title=title, title_justify="left")
    # Ids and hashes are what --case and replay lines take: never cut; the summary wraps.
    table.add_column("case", no_wrap=True)
    table.add_column("protocol", no_wrap=True)
    table.add_column("summary")
    table.add_column("hash", no_wrap=True)
    return table


@click.command(name="list")
@click.option(
    "--case-file",
    "case_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    metavar="FILE.toml",
    help="Also list the cases of this case file (docs/case-file.md).",
)
def list_command(case_file: str | None) -> None:
    """List registered adapters (and the installed version of each engine they wrap), checks,
    the battery's cases, a case file's cases (--case-file) and the mutant zoo."""
    console = Console()
    if case_file is not None:
        # Refused before anything is printed, like a run's --case-file.
        file_cases = case_file_table(case_file)
    adapters = Table(
        title="adapters (entry-point group losslessness.adapters)", title_justify="left"
    )
    adapters.add_column("name")
    adapters.add_column("entry point")
    adapters.add_column("engine installed")
    versions: dict[str, str] = {}
    for name, point in sorted(registered_adapters().items()):
        distribution = engine_distribution(point.value)
        if distribution is not None and distribution not in versions:
            versions[distribution] = engine_version(distribution)
        adapters.add_row(name, point.value, "-" if distribution is None else versions[distribution])
    console.print(adapters)
    console.print("checks: " + ", ".join(ALL_CHECK_IDS))
    cases = _case_table("battery cases")
    for case in default_chain_battery():
        cases.add_row(case.case_id, "chain", case.summary, case.case_hash)
    for greedy_case in default_greedy_battery():
        cases.add_row(greedy_case.case_id, "greedy", greedy_case.summary, greedy_case.case_hash)
    for tree_case in default_tree_battery():
        cases.add_row(tree_case.case_id, "tree", tree_case.summary, tree_case.case_hash)
    for greedy_tree in default_greedy_tree_battery():
        cases.add_row(
            greedy_tree.case_id, "greedy-tree", greedy_tree.summary, greedy_tree.case_hash
        )
    for serving_case in default_serving_battery():
        cases.add_row(serving_case.case_id, "serving", serving_case.summary, serving_case.case_hash)
    # Serving tree cases hold a profile's law: listed as built for LISTED_TREE_PROFILE (each
    # serving tree target's profile builds its own; the summary names the profile).
    for serving_tree in default_serving_tree_battery(LISTED_TREE_PROFILE):
        cases.add_row(
            serving_tree.case_id, "serving-tree", serving_tree.summary, serving_tree.case_hash
        )
    console.print(cases)
    if case_file is not None:
        console.print(file_cases)
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
