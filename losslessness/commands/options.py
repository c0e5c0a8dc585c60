"""Options the run commands (``audit``, ``plan``, ``nightly``) share, declared once, and the
:class:`~losslessness.config.RunConfig` they build."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from losslessness.batteries.case_file import read_case_file
from losslessness.cases import CHAIN_INPUT_DTYPES
from losslessness.checks import ALL_CHECK_IDS
from losslessness.config import CLI_FLAGS, DEFAULT_TIMEOUT_S, RunConfig, flag_of_error
from losslessness.stats import DEFAULT_FAMILY_WISE_ALPHA

_F = TypeVar("_F", bound=Callable[..., Any])

_DESIGN_OPTIONS = (
    click.option(
        "--tv",
        type=float,
        default=0.05,
        show_default=True,
        help="Design TV distance: each identity test detects TV >= this with --power.",
    ),
    click.option(
        "--alpha",
        type=float,
        default=DEFAULT_FAMILY_WISE_ALPHA,
        show_default=True,
        help="Family-wise false-alarm rate of the whole run (split Bonferroni).",
    ),
    click.option("--power", type=float, default=0.9, show_default=True, help="Design power."),
    click.option("--seed", type=int, default=0, show_default=True, help="Run seed."),
    click.option(
        "--case",
        "cases",
        multiple=True,
        metavar="CASE",
        help="Run only this battery case, --case-file case or end-to-end target "
        "(repeatable); see 'losslessness list'.",
    ),
    click.option(
        "--only",
        multiple=True,
        metavar="CHECK",
        help=f"Run only this check (repeatable): {', '.join(ALL_CHECK_IDS)}, or 'edge' for "
        "every edge case, 'tree' for every tree check.",
    ),
    click.option(
        "--max-steps",
        type=int,
        default=200_000,
        show_default=True,
        help="Cap on the CI plan's verify steps per case and row type, and on sequences per "
        "end-to-end target.",
    ),
    click.option(
        "--steps",
        type=int,
        default=None,
        help="Use exactly this many steps per case, sequences per end-to-end target (replays).",
    ),
    click.option(
        "--chunk-steps",
        type=int,
        default=None,
        help="Most steps per chain chunk (replays of a nightly's chunked cases); default one "
        "chunk per case for an audit.",
    ),
    click.option(
        "--early-stop/--no-early-stop",
        default=None,
        help="Sequential LOSSY detection: each chain assertion splits its level between an "
        "e-process looked at after every call and the fixed-n test, and a target stops as "
        "soon as one crosses or an exact check fires. --no-early-stop samples every planned "
        "step with the whole level on the fixed-n tests. Default: on for an audit, off for a "
        "nightly (whose shards merge exactly and whose trends want every planned step).",
    ),
    click.option(
        "--time-budget",
        "time_budget_s",
        type=float,
        default=None,
        metavar="SECONDS",
        help="Fit the run into this many seconds of sampling: a warm-up measures each "
        "target's throughput, the design TV is raised until the plan fits (said before "
        "sampling), and sampling stops at the budget.",
    ),
    click.option(
        "--timeout",
        "timeout_s",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        show_default=True,
        help="Seconds one call of a target may take; a longer call is an ERROR for its case "
        "(exit code 3): a target in a worker process is killed and restarted for its other "
        "cases, an in-process one has its remaining checks skipped.",
    ),
    click.option(
        "--vocab-size",
        "vocab_size",
        type=int,
        default=None,
        help="Build the chain cases at this vocabulary size V (LM-like: peaked softmax of "
        "random logits, q near and far from p, k = 1..4) instead of the battery's.",
    ),
    click.option(
        "--batch-size",
        "batch_size",
        type=int,
        default=None,
        help="Rows per verifier call of every chain case (1 allowed) and trees per call of "
        "every tree case.",
    ),
    click.option(
        "--dtype",
        "dtype",
        type=click.Choice(list(CHAIN_INPUT_DTYPES)),
        default=None,
        help="Precision of the p and q every chain case hands the verifier (the laws are "
        "those of the values it receives).",
    ),
    click.option(
        "--case-file",
        "case_file",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        metavar="FILE.toml",
        help="Add the chain, tree and serving cases of this TOML file to the battery's, "
        "planned in the run's one error budget; --case selects among all (docs/case-file.md).",
    ),
    click.option(
        "--in-process",
        is_flag=True,
        help="Debugging: run every target in the audit's own process (by default every target "
        "but the reference, the toy loops and the zoo runs in a worker process, where an exit, "
        "a crash, a hang or a monkeypatch cannot touch the audit).",
    ),
)


def design_options(function: _F) -> _F:
    """Add the shared design options to a click command."""
    for option in reversed(_DESIGN_OPTIONS):
        function = option(function)
    return function


def build_config(values: dict[str, Any], **extra: Any) -> RunConfig:
    """The :class:`RunConfig` of the shared options in ``values`` (a command's keyword
    arguments) plus ``extra`` fields (None keeps the default). ``--in-process`` is not part of
    the design: the commands pass it to :func:`losslessness.targets.resolve_targets`.

    Raises:
        click.BadParameter: an unknown check id in ``--only``.
        click.BadParameter: a value out of range, naming its flag (``--alpha``, not the
            config field ``family_wise_alpha``; :data:`~losslessness.config.CLI_FLAGS`).
        click.UsageError: a value out of range whose field has no flag.
        click.BadParameter: an invalid ``--case-file`` (naming the file, the table and the
            field).
    """
    known = (*ALL_CHECK_IDS, "edge", "tree")
    for name in values["only"]:
        if name not in known:
            raise click.BadParameter(
                f"unknown check {name!r}; known: {', '.join(known)}", param_hint="--only"
            )
    fields: dict[str, Any] = {
        "tv": values["tv"],
        "family_wise_alpha": values["alpha"],
        "power": values["power"],
        "seed": values["seed"],
        "only": tuple(values["only"]),
        "cases": tuple(values["cases"]),
        "max_steps": values["max_steps"],
        "steps": values["steps"],
        "chunk_steps": values["chunk_steps"],
        "timeout_s": values["timeout_s"],
        "time_budget_s": values["time_budget_s"],
        "vocab_size": values["vocab_size"],
        "batch_size": values["batch_size"],
        "dtype": values["dtype"],
        "case_file": str(Path(values["case_file"]).resolve()) if values["case_file"] else None,
    }
    if values["early_stop"] is not None:
        fields["early_stop"] = values["early_stop"]
    fields.update({key: value for key, value in extra.items() if value is not None})
    try:
        config = RunConfig(**fields)
        if values["case_file"]:
            # A bad file is refused before any target loads, named as the user typed it (the
            # plan reads it again, by its absolute path, which replay lines carry).
            read_case_file(values["case_file"])
    except ValueError as error:
        raise usage_error(error) from error
    return config


TARGET_ARGUMENT_FLAGS = {field: flag for field, flag in CLI_FLAGS.items() if field != "targets"}
"""The flags of ``audit`` and ``plan``, whose targets are arguments (no ``--targets``)."""


def usage_error(error: ValueError, flags: Mapping[str, str] = CLI_FLAGS) -> click.UsageError:
    """The usage error (exit 2) a command raises for a configuration or planning error: a
    message that starts with a config field (``dtype: ...``, ``cases: ...``, ``case_file:
    ...``) names the command-line flag the user typed instead (``--dtype``, ``--case``,
    ``--case-file``; ``flags`` maps fields to flags, :data:`~losslessness.config.CLI_FLAGS`).

    Args:
        error: the error of :class:`RunConfig`, the planner or a case file.
        flags: field -> flag of the command (a command whose targets are its arguments maps
            ``targets`` to none).
    """
    flag, text = flag_of_error(str(error), flags)
    if flag is None:
        return click.UsageError(text)
    return click.BadParameter(text, param_hint=flag)


def check_output_file(path: Path, flag: str) -> None:
    """Refuse, before anything is sampled, an output file that could not be written at the end
    of a run (its folder missing or not writable, or the path a folder).

    Raises:
        click.BadParameter: naming ``flag`` and what is wrong.
    """
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise click.BadParameter(f"{path} is a directory, not a file", param_hint=flag)
    if not folder.is_dir():
        raise click.BadParameter(f"folder {folder} does not exist", param_hint=flag)
    if not os.access(folder, os.W_OK):
        raise click.BadParameter(f"folder {folder} is not writable", param_hint=flag)


def prepare_output_folder(path: Path, flag: str) -> None:
    """Create the output folder (and its parents) before anything is sampled, and check that it
    is writable, so a run never loses its results to a folder it cannot write at the end.

    Raises:
        click.BadParameter: naming ``flag`` and what is wrong.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise click.BadParameter(f"cannot create {path}: {error}", param_hint=flag) from error
    if not os.access(path, os.W_OK):
        raise click.BadParameter(f"folder {path} is not writable", param_hint=flag)
