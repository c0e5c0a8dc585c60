"""``losslessness audit``: audit targets on the battery (one shard of the run engine at
the CI plan's steps).

Exit codes: 0 lossless at the design stated in the verdict line (also when only the SUBOPTIMAL
warning fires), 1 lossy, 2 usage error, 3 a target crashed, hung or could not be loaded
(recorded per check; the other checks still run), 4 inconclusive (the design was not reached),
130 interrupted by SIGINT (Ctrl-C), 143 terminated by SIGTERM: the finished results are
written and printed first (:mod:`losslessness.commands.signals`).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from losslessness.adapters import Adapter
from losslessness.commands.options import (
    TARGET_ARGUMENT_FLAGS,
    build_config,
    check_output_file,
    design_options,
    usage_error,
)
from losslessness.commands.signals import handles_signals
from losslessness.config import RunConfig
from losslessness.engine import run_audit
from losslessness.engine.parallel import available_cpus
from losslessness.engine.plan import RunPlan, load_device_checks, plan_run
from losslessness.engine.scheduler import run_shard
from losslessness.engine.shards import ShardResult, ShardSpec
from losslessness.targets import UnavailableTarget, resolve_targets

DEFAULT_TARGETS = ("reference", "transformers", "transformers-generate", "toy-tree", "medusa")
"""What ``losslessness audit`` audits when no target is named: our reference (chain, greedy,
tree and greedy tree batteries), transformers' real sampler and generation loops, the toy
EAGLE/Medusa/SpecInfer tree decoding loops end to end, and medusa-llm's greedy tree verifier
(a third-party tree verifier from PyPI; UNAVAILABLE, not an error, when it is not installed)."""


def resolve_named_targets(
    names: tuple[str, ...],
    greedy: bool,
    tree: tuple[str, ...] = (),
    tree_greedy: tuple[str, ...] = (),
    in_process: bool = False,
    protocol: str | None = None,
    engine_profile: str | None = None,
) -> list[Adapter | UnavailableTarget]:
    """The targets a user named (:data:`DEFAULT_TARGETS` when none, and no ``--tree`` or
    ``--tree-greedy`` target either), through :func:`losslessness.targets.resolve_targets`
    (each in the audit's own process with ``in_process``, else where its rule says); bare
    functions follow ``protocol`` when given, and serving targets that name no engine profile
    get ``engine_profile``.

    Raises:
        click.UsageError: a name that matches no adapter and no ``pkg.module:callable``, a
            repeated name, or an ``engine_profile`` that contradicts the one a target names.
    """
    try:
        resolved = resolve_targets(
            names, greedy=greedy, tree=tree, tree_greedy=tree_greedy, default=DEFAULT_TARGETS,
            in_process=True if in_process else None, protocol=protocol,
        )
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    if engine_profile is None:
        return resolved
    named: list[Adapter | UnavailableTarget] = []
    for target in resolved:
        if isinstance(target, Adapter) and (
            target.serving is not None or target.serving_tree is not None
        ):
            if target.engine_profile not in (None, engine_profile):
                raise click.UsageError(
                    f"--engine-profile: {engine_profile!r} contradicts the profile "
                    f"{target.engine_profile!r} that {target.name} names"
                )
            target = dataclasses.replace(target, engine_profile=engine_profile)
        named.append(target)
    return named


@dataclasses.dataclass(frozen=True)
class TargetNames:
    """What the user named, as :func:`resolve_named_targets` takes it: a child process of
    ``--jobs`` resolves the same targets from it (it pickles; adapters do not)."""

    names: tuple[str, ...]
    greedy: bool
    tree: tuple[str, ...]
    tree_greedy: tuple[str, ...]
    in_process: bool
    protocol: str | None
    engine_profile: str | None

    def resolve(self) -> list[Adapter | UnavailableTarget]:
        """:func:`resolve_named_targets` of these names."""
        return resolve_named_targets(
            self.names, self.greedy, self.tree, self.tree_greedy, self.in_process,
            self.protocol, self.engine_profile,
        )


@functools.lru_cache(maxsize=1)
def _child_plan(config: RunConfig, targets: TargetNames) -> RunPlan:
    """The run's plan in a child of ``--jobs``, made once per child: resolving starts the
    targets' worker processes, which its later shards reuse."""
    note = load_device_checks()[1] if config.device_checks else None
    return plan_run(config, targets.resolve(), note)


def run_child_shard(config: RunConfig, targets: TargetNames, spec: ShardSpec) -> ShardResult:
    """Shard ``spec`` of an audit, in a child process of ``--jobs``
    (:data:`losslessness.engine.parallel.ShardRunner`): resolve the targets, plan the run as
    the parent did (no time budget: ``--jobs`` runs without one) and run the shard."""
    return run_shard(_child_plan(config, targets), spec)


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
@click.option(
    "--tree",
    "tree_targets",
    multiple=True,
    metavar="PKG.MODULE:FN",
    help="Audit this function as a tree verifier (the tree protocol) on the tree battery; "
    "repeatable.",
)
@click.option(
    "--tree-greedy",
    "tree_greedy_targets",
    multiple=True,
    metavar="PKG.MODULE:FN",
    help="Audit this function as a greedy tree verifier on the greedy tree cases; repeatable.",
)
@click.option(
    "--protocol",
    type=click.Choice(["chain", "greedy", "serving", "serving-tree"]),
    default=None,
    help="The protocol pkg.module:callable targets follow (default chain; 'serving': raw "
    "logits, draft_probs or None, drafts, num_draft_tokens, requests, generator, audited on "
    "the serving battery against its engine profile; 'serving-tree': raw logits at every "
    "node, draft_probs, parents, token_ids, draft_scheme, requests, generator, audited on the "
    "serving tree battery built for its engine profile).",
)
@click.option(
    "--engine-profile",
    default=None,
    metavar="NAME",
    help="The engine profile (the non-speculative law) a serving target claims, when the "
    "function has no engine_profile attribute.",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    envvar="LOSSLESSNESS_JOBS",
    help="Processes the audit runs its units in (default one per available CPU; also "
    "LOSSLESSNESS_JOBS): shards of the unit grid in child processes, merged exactly as one "
    "process's run, the CPUs' threads divided between them. A run planned below 100000 verify "
    "steps, a --time-budget and --in-process use one process.",
)
@click.option("--no-progress", is_flag=True, help="Do not show a progress bar.")
@handles_signals
def audit_command(
    targets: tuple[str, ...],
    json_path: str | None,
    greedy: bool,
    tree_targets: tuple[str, ...],
    tree_greedy_targets: tuple[str, ...],
    protocol: str | None,
    engine_profile: str | None,
    jobs: int | None,
    no_progress: bool,
    **options: Any,
) -> None:
    """Audit TARGETS (default: reference transformers transformers-generate toy-tree medusa) on
    the battery.

    A TARGET is a registered adapter (see 'losslessness list') or pkg.module:callable, a
    function in the chain protocol (or the greedy protocol with --greedy), imported as
    'python -m' would: the current directory first, then PYTHONPATH. Adapters with end-to-end
    targets (toy, transformers-generate) get the sequence-law checks. Adapters with a tree
    verifier (reference) get the tree battery; --tree and --tree-greedy audit a function in the
    tree or greedy tree protocol (then no default target is added). --protocol serving audits
    functions in the serving protocol on the serving battery, against the engine profile
    they name (an engine_profile attribute, or --engine-profile); --protocol serving-tree
    audits functions in the serving tree protocol on the serving tree battery of that profile.
    """
    from reports import print_audit, write_json
    from reports.progress import progress_bar

    config = build_config(options)
    if json_path:
        check_output_file(Path(json_path), "--json")
    names = TargetNames(
        targets, greedy, tree_targets, tree_greedy_targets, options["in_process"], protocol,
        engine_profile,
    )
    jobs = 1 if options["in_process"] else jobs or available_cpus()
    resolved = names.resolve()
    console = report_console()
    try:
        with progress_bar("verify steps", quiet=no_progress) as update:
            result = run_audit(
                resolved, config, progress=update,
                announce=lambda claim: console.print(f"time budget: {claim}"),
                jobs=jobs,
                shard_runner=functools.partial(run_child_shard, config, names),
            )
    except ValueError as error:
        raise usage_error(error, TARGET_ARGUMENT_FLAGS) from error
    if json_path:
        # The record first: printing can fail (a closed pipe), the JSON must not be lost.
        write_json(result, json_path)
    print_audit(result, console)
    if json_path:
        console.print(f"wrote {json_path}")
    sys.exit(result.exit_code)
