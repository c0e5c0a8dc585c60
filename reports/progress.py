"""The progress bar the long-running commands (audit, nightly) draw on stderr. Its label
names targets and cases, so it is plain text (no rich markup), its control characters
visible (:func:`reports.text.visible`)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from reports.text import visible


@contextmanager
def progress_bar(unit: str, *, quiet: bool = False) -> Iterator[Callable[[int, int, str], None]]:
    """A transient rich progress bar counting ``unit`` on stderr.

    Args:
        unit: what is counted, shown after ``done/total`` (``"verify steps"``, ``"units"``).
        quiet: never draw it (``--no-progress``); it is not drawn either when stderr is not a
            terminal (pipes, CI logs).

    Yields:
        ``update(done, total, label)``: the progress callback of
        :func:`losslessness.engine.run_audit` and :func:`losslessness.engine.run_shard`.
    """
    progress = Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=quiet or not sys.stderr.isatty(),
    )
    task = progress.add_task("planning", total=None)

    def update(done: int, total: int, label: str) -> None:
        progress.update(task, completed=done, total=total, description=visible(label))

    with progress:
        yield update
