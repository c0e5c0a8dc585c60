"""``losslessness nightly`` and ``losslessness merge``: the long battery, split into shards
that merge exactly (the run engine, :mod:`losslessness.engine`, at a multiple of the CI
plan's steps, in chunks, with the device checks and the property suite).

One machine::

    losslessness nightly --out DIR                 # shard 0/1, merged, reports written

Several processes or machines (the same options on each)::

    losslessness nightly --shard 0/2 --out A       # writes A/shard-0-of-2.npz
    losslessness nightly --shard 1/2 --out B       # writes B/shard-1-of-2.npz
    losslessness merge A/shard-0-of-2.npz B/shard-1-of-2.npz --out DIR

On a Ray cluster (``pip install 'losslessness[ray]'``; one task per shard, one GPU each with
``--device cuda``)::

    losslessness nightly --ray --out DIR                   # a local Ray instance
    losslessness nightly --ray HOST:6379 --shards 8 --out DIR

which writes DIR/shard-i-of-N.npz for every shard, then merges them as ``losslessness merge``
does. All of them end in DIR/report.html, report.md, junit.xml, report.json, nightly.json
(plan, error budget, shards, suite runs) and suite-junit-<target>.xml (pytest's own report of
each suite run). Exit codes compare every target's verdict with its expectation (LOSSLESS, or
the verdict an adapter lossy by design declares, ``Adapter.expected_verdict``): 0 every target
as expected, else the audit's code of the unexpected ones (1 LOSSY, 3 ERROR, 4 INCONCLUSIVE,
130 interrupted) and 5 when the only surprises are targets expected to fail that passed (a
lossy-by-design target that suddenly passes keeps the night red); 2 usage error.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from losslessness.commands.audit import report_console
from losslessness.commands.options import (
    build_config,
    design_options,
    prepare_output_folder,
    usage_error,
)
from losslessness.commands.signals import handles_signals
from losslessness.config import DEVICE_DEFAULTS, DEVICES, SUITE_PROFILES, RunConfig
from losslessness.engine import (
    RunResult,
    ShardMergeError,
    finish_run,
    load_shard,
    parse_shard_spec,
    run_shard,
    save_shard,
)
from losslessness.engine.time_budget import make_budgeted_plan
from losslessness.results import AuditResult
from reports.progress import progress_bar

UNEXPECTED_PASS_EXIT_CODE = 5
"""Exit code of a night whose only surprises are targets expected to fail (lossy by design)
that came out LOSSLESS or SUBOPTIMAL."""

NIGHTLY_FILE = "nightly.json"
"""The night's own record next to the reports: plan, error budget, shards, suite runs."""


def write_night(
    result: RunResult, out_dir: Path, history: tuple[Path, ...] = ()
) -> dict[str, Path]:
    """Write the reports (``reports.write_reports``), ``nightly.json`` and each suite run's
    junit XML into ``out_dir``.

    Returns:
        The written paths by name.

    Raises:
        FileNotFoundError, ValueError: from the history (see ``reports.write_reports``).
    """
    from reports import write_reports

    paths = dict(write_reports(result.audit, out_dir, history))
    nightly = out_dir / NIGHTLY_FILE
    nightly.write_text(json.dumps(result.summary, indent=2, sort_keys=True), encoding="utf-8")
    paths["nightly"] = nightly
    for target, junit_xml in result.suite_junit.items():
        if junit_xml:
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", target)
            path = out_dir / f"suite-junit-{name}.xml"
            path.write_text(junit_xml, encoding="utf-8")
            paths[f"suite-junit:{target}"] = path
    return paths


def night_exit_code(audit: AuditResult) -> int:
    """The night's exit code: 0 when every target's verdict is its expected one
    (:attr:`~losslessness.results.TargetResult.as_expected`), else the audit's exit code over
    the unexpected targets alone (LOSSY 1, ERROR 3, INCONCLUSIVE 4, INCOMPLETE 130), or
    :data:`UNEXPECTED_PASS_EXIT_CODE` when each of them passed although it was expected to
    fail."""
    unexpected = audit.unexpected
    if not unexpected:
        return 0
    code = dataclasses.replace(audit, targets=unexpected).exit_code
    return code or UNEXPECTED_PASS_EXIT_CODE


def _finish(result: RunResult, out_dir: Path, history: tuple[Path, ...]) -> None:
    from reports import print_audit

    console = report_console()
    try:
        # The reports first: printing can fail (a closed pipe), the record must not be lost.
        paths = write_night(result, out_dir, history)
    except (FileNotFoundError, ValueError) as error:
        raise click.BadParameter(str(error), param_hint="--history") from error
    print_audit(result.audit, console)
    for name, path in paths.items():
        console.print(f"wrote {name}: {path}")
    for target in result.audit.unexpected:
        console.print(
            f"UNEXPECTED {target.name}: {target.verdict.value}, expected "
            f"{target.expected.value if target.expected else '-'}"
        )
    sys.exit(night_exit_code(result.audit))


_HISTORY = click.option(
    "--history",
    "history",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Earlier nights' report.json files, or directories searched for them (repeatable): "
    "the reports show each check's trend.",
)
_OUT = click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("nightly"),
    show_default=True,
    help="Directory for the reports (or, with --shard, the shard file).",
)


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


@click.command(name="nightly")
@click.option(
    "--device",
    type=click.Choice(DEVICES),
    default="cpu",
    show_default=True,
    help="Where the device (coupling, precision) checks run.",
)
@click.option(
    "--budget",
    type=float,
    default=None,
    help="Step multiplier: the multiple of the CI plan's verification steps "
    + ", ".join(f"(default {d.step_multiplier:g} on {name})" for name, d in DEVICE_DEFAULTS.items())
    + "; below 1 for quick runs.",
)
@_OUT
@click.option(
    "--shard",
    "shard_text",
    default=None,
    metavar="i/N",
    help="Run only shard i of N (zero-based) and write its sufficient statistics; "
    "'losslessness merge' joins the shards.",
)
@click.option(
    "--ray",
    "ray_address",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[ADDRESS]",
    help="Run every shard as a task on Ray (pip install 'losslessness[ray]'): alone, a new "
    "local Ray instance (unless RAY_ADDRESS or an earlier 'ray start' on this machine names "
    "a cluster); with ADDRESS (local, auto, HOST:PORT, ray://HOST:10001), that cluster. Each "
    "shard asks for one GPU with --device cuda. Writes every shard file, then merges them and "
    "writes the reports.",
)
@click.option(
    "--shards",
    "shard_count",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="With --ray: the number of shards (default one per CPU the cluster reports); the "
    "merged result does not depend on it.",
)
@click.option(
    "--targets",
    "targets",
    multiple=True,
    metavar="NAME[,NAME]",
    help="Targets (registered adapters or pkg.module:callable); default every registered "
    "adapter that loads.",
)
@design_options
@click.option("--no-suite", is_flag=True, help="Skip the property suite.")
@click.option(
    "--suite-profile",
    type=click.Choice(SUITE_PROFILES),
    default=None,
    help="Hypothesis profile of the property suite (default nightly on cuda, ci on cpu).",
)
@click.option(
    "--suite-targets",
    "suite_targets",
    multiple=True,
    metavar="NAME[,NAME]",
    help="Targets the property suite runs on (default every target on cuda, reference on cpu).",
)
@click.option("--no-device-checks", is_flag=True, help="Skip the device checks.")
@_HISTORY
@click.option("--no-progress", is_flag=True, help="Do not show a progress bar.")
@handles_signals
def nightly_command(
    device: str,
    budget: float | None,
    out_dir: Path,
    shard_text: str | None,
    ray_address: str | None,
    shard_count: int | None,
    targets: tuple[str, ...],
    no_suite: bool,
    suite_profile: str | None,
    suite_targets: tuple[str, ...],
    no_device_checks: bool,
    history: tuple[Path, ...],
    no_progress: bool,
    **options: Any,
) -> None:
    """The nightly battery: the CI plan's steps times --budget (the step multiplier) on every
    adapter that loads, the device checks, and the property suite; reports in --out DIR.

    Every shard of one night must get the same options (the plan they share is checked on
    merge); --shard i/N writes DIR/shard-i-of-N.npz instead of reports; --ray runs all
    shards as Ray tasks, writes their files and the reports.
    """
    if ray_address is not None and shard_text is not None:
        raise click.UsageError(
            "--ray runs every shard of the night itself; it cannot be combined with "
            "--shard i/N (use --shards N for the number of shards)"
        )
    if shard_count is not None and ray_address is None:
        raise click.UsageError(
            "--shards N needs --ray; without Ray, run each shard with --shard i/N and join "
            "them with 'losslessness merge'"
        )
    try:
        spec = parse_shard_spec(shard_text or "0/1")
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--shard") from error
    named_suite = _split(suite_targets)
    defaults = RunConfig.nightly(device)
    config = build_config(
        options,
        device=device,
        step_multiplier=budget if budget is not None else defaults.step_multiplier,
        chunk_steps=options["chunk_steps"] or defaults.chunk_steps,
        targets=_split(targets),
        device_checks=not no_device_checks,
        suite=not no_suite,
        suite_profile=suite_profile or defaults.suite_profile,
        suite_targets=named_suite or defaults.suite_targets,
    )
    if config.time_budget_s is not None and budget is not None:
        raise click.UsageError(
            "--budget multiplies the planned steps and --time-budget fits them to a time: "
            "give one of the two"
        )
    if config.time_budget_s is not None and (shard_text is not None or ray_address is not None):
        raise click.UsageError(
            "--time-budget fits one process's measured throughput; run the night in one "
            "process (no --shard or --ray), or give the shards --budget instead"
        )
    prepare_output_folder(out_dir, "--out")
    console = Console(stderr=True)
    try:
        plan, deadline, claim = make_budgeted_plan(
            config,
            announce=lambda text: console.print(f"time budget: {text}"),
            in_process=options["in_process"],
        )
    except ValueError as error:
        raise usage_error(error) from error
    loaded = {adapter.name for adapter in plan.adapters}
    unknown = [name for name in named_suite if name not in loaded]
    if unknown:
        raise click.BadParameter(
            f"{unknown} are not loaded night targets ({sorted(loaded)})",
            param_hint="--suite-targets",
        )
    if ray_address is not None:
        _run_on_ray(
            config,
            plan.fingerprint,
            len(plan.units),
            out_dir,
            ray_address or None,
            shard_count,
            no_progress,
            console,
            history,
        )
        return
    console.print(
        f"nightly plan {plan.fingerprint[:12]}: {len(plan.units)} units, steps "
        f"x{plan.config.step_multiplier:g} of the CI plan, seed {config.seed}; "
        f"running shard {spec}"
    )
    with progress_bar("verify steps", quiet=no_progress) as update:
        shard = run_shard(plan, spec, out_dir, progress=update, deadline=deadline)
    if shard_text is not None:
        path = save_shard(shard, out_dir / spec.file_name)
        console.print(
            f"wrote {path} ({len(shard.units)} units, {shard.wall_time_s:.1f} s); join all "
            f"{spec.count} shards with: losslessness merge SHARD_FILES... --out DIR"
        )
        return
    save_shard(shard, out_dir / spec.file_name)
    result = finish_run([shard])
    if claim is not None:
        result.audit.environment["time budget"] = claim
    _finish(result, out_dir, history)


def _run_on_ray(
    config: RunConfig,
    fingerprint: str,
    n_units: int,
    out_dir: Path,
    address: str | None,
    shard_count: int | None,
    no_progress: bool,
    console: Console,
    history: tuple[Path, ...],
) -> None:
    """``nightly --ray``: every shard as a Ray task, their files in ``out_dir``, then the merge
    of those files (as ``losslessness merge`` does) and the reports."""
    from losslessness.engine.cluster import (
        InsufficientResources,
        RayNotInstalled,
        run_shards_on_ray,
    )

    where = (
        f"the Ray cluster at {address}"
        if address
        else "Ray (a local instance unless RAY_ADDRESS or 'ray start' names a cluster)"
    )
    count = f"{shard_count} shards" if shard_count else "one shard per CPU"
    console.print(
        f"nightly plan {fingerprint[:12]}: {n_units} units, steps "
        f"x{config.step_multiplier:g} of the CI plan, seed {config.seed}; "
        f"running {count} on {where}"
    )
    began = time.perf_counter()
    try:
        with progress_bar("shards", quiet=no_progress) as update:
            shards = run_shards_on_ray(
                config,
                out_dir,
                shard_count,
                address=address,
                gpus_per_shard=1.0 if config.device == "cuda" else 0.0,
                progress=update,
            )
    except (RayNotInstalled, InsufficientResources) as error:
        raise click.UsageError(str(error)) from error
    except ConnectionError as error:
        raise click.BadParameter(str(error), param_hint="--ray") from error
    seconds = time.perf_counter() - began
    paths = [save_shard(shard, out_dir / shard.shard.file_name) for shard in shards]
    console.print(
        f"ran {len(shards)} shards on Ray in {seconds:.1f} s; wrote {out_dir}/"
        f"shard-{{0..{len(shards) - 1}}}-of-{len(shards)}.npz"
    )
    try:
        result = finish_run([load_shard(path) for path in paths])
    except (ShardMergeError, ValueError) as error:
        raise click.UsageError(str(error)) from error
    _finish(result, out_dir, history)


@click.command(name="merge")
@click.argument(
    "shard_files",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
)
@_OUT
@_HISTORY
@handles_signals
def merge_command(shard_files: tuple[Path, ...], out_dir: Path, history: tuple[Path, ...]) -> None:
    """Merge SHARD_FILES written by 'losslessness nightly --shard i/N' (the same plan, every
    unit exactly once), run the checks on the merged statistics and write the reports."""
    prepare_output_folder(out_dir, "--out")
    try:
        shards = [load_shard(path) for path in shard_files]
        result = finish_run(shards)
    except (ShardMergeError, ValueError) as error:
        raise click.UsageError(str(error)) from error
    _finish(result, out_dir, history)
