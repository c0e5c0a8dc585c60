"""``losslessness audit``: audit targets on the battery (one shard of the run engine at the CI
budget).

Exit codes: 0 lossless (also when only the SUBOPTIMAL warning fires), 1 lossy, 2 usage error,
3 a target crashed, hung or could not be loaded (recorded per check; the other checks still
run).
"""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console

from losslessness.adapters import Adapter, AdapterNotFound, AdapterUnavailable, resolve_adapter
from losslessness.commands.options import build_config, design_options
from losslessness.engine import UnavailableTarget, run_audit

DEFAULT_TARGETS = ("reference", "transformers", "transformers-generate")
"""What ``losslessness audit`` audits when no target is named."""


def resolve_named_targets(
    names: tuple[str, ...], greedy: bool
) -> list[Adapter | UnavailableTarget]:
    """The targets a user named (``DEFAULT_TARGETS`` when none): adapters, or placeholders for
    those that did not load.

    Raises:
        click.UsageError: a name that matches no adapter and no ``pkg.module:callable``.
    """
    resolved: list[Adapter | UnavailableTarget] = []
    for name in names or DEFAULT_TARGETS:
        try:
            resolved.append(resolve_adapter(name, greedy=greedy))
        except AdapterNotFound as error:
            raise click.UsageError(str(error)) from error
        except AdapterUnavailable as error:
            resolved.append(UnavailableTarget(name, str(error)))
    return resolved


def report_console() -> Console:
    """The console results are printed on: tables need ~150 columns, so a pipe or CI log gets
    that width instead of rich's 80."""
    return Console(width=None if sys.stdout.isatty() else 160)


@click.command(name="audit")
@click.argument("targets", nargs=-1)
@design_options
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the AuditResult as JSON to this path.",
)
@click.option(
    "--greedy",
    is_flag=True,
    help="pkg.module:callable targets follow the greedy protocol, not the chain one.",
)
@click.option("--no-progress", is_flag=True, help="Do not show a progress bar.")
def audit_command(
    targets: tuple[str, ...],
    json_path: str | None,
    greedy: bool,
    no_progress: bool,
    **options: Any,
) -> None:
    """Audit TARGETS (default: reference transformers transformers-generate) on the battery.

    A TARGET is a registered adapter (see 'losslessness list') or pkg.module:callable, a
    function in the chain protocol (or the greedy protocol with --greedy), imported as
    'python -m' would: the current directory first, then PYTHONPATH. Adapters with end-to-end
    targets (toy, transformers-generate) get the sequence-law checks.
    """
    from reports import print_audit, write_json
    from reports.progress import progress_bar

    config = build_config(options)
    resolved = resolve_named_targets(targets, greedy)
    console = report_console()
    try:
        with progress_bar("verify steps", quiet=no_progress) as update:
            result = run_audit(resolved, config, progress=update)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    print_audit(result, console)
    if json_path:
        write_json(result, json_path)
        console.print(f"wrote {json_path}")
    sys.exit(result.exit_code)
