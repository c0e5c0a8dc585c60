"""Command line: ``losslessness audit | plan | list | nightly | merge | report | speedup``.

Each command lives in its own module of :mod:`losslessness.commands`; this module only groups
them.
"""

from __future__ import annotations

import click

from losslessness.commands.audit import DEFAULT_TARGETS, audit_command
from losslessness.commands.list import list_command
from losslessness.commands.nightly import merge_command, nightly_command
from losslessness.commands.plan import plan_command
from losslessness.commands.report import report_command
from losslessness.commands.speedup import speedup_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="losslessness")
def main() -> None:
    """Statistical verification that a speculative-decoding verifier is lossless."""


for _command in (
    audit_command,
    plan_command,
    list_command,
    nightly_command,
    merge_command,
    report_command,
    speedup_command,
):
    main.add_command(_command)

__all__ = ["DEFAULT_TARGETS", "main"]

if __name__ == "__main__":
    # ``python -m losslessness.cli`` runs the command line as the ``losslessness`` script does.
    main()
