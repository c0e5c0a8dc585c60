"""The command that replays one assertion alone: its samples redrawn exactly, its test
recomputed.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from losslessness.batteries.serving_tree import SERVING_TREE_CASE_IDS
from losslessness.checks.ids import (
    DEVICE_CHECK_IDS,
    GREEDY_CHECK_ID,
    PVALUES_CHECK_ID,
    SUITE_CHECK_ID,
    TREE_GREEDY_CHECK_ID,
)
from losslessness.engine.plan import PlanRecord
from losslessness.results import CheckResult, TargetResult

SUITE_PREFIX = "suite:"
"""Prefix of a property-suite run's target name (``suite:<target>``)."""


def replay_command(plan: PlanRecord, check: CheckResult, greedy: bool = False) -> str | None:
    """The command that redraws exactly the samples behind ``check`` and recomputes its test
    (its p-value; its significance level is that of a run of the replayed case alone), or None
    where no command can (device comparisons, suite runs replay with their pytest command).

    A chain check's command names the steps its case drew (fewer than planned when the case
    stopped early) and ``--no-early-stop``, so the replay draws all of them whatever its own
    level; a check made LOSSY by its sequential test gets back its samples and fixed-n p-value
    (its e-value is in the record)."""
    config = plan.config
    grid = plan.chain_cases.get(check.case_id)
    if (
        check.check_id in (*DEVICE_CHECK_IDS, SUITE_CHECK_ID, PVALUES_CHECK_ID)
        or "@" in check.target
    ):
        return None
    command = f"losslessness audit {check.target}"
    if greedy and check.check_id == GREEDY_CHECK_ID:
        command += " --greedy"
    if check.check_id.startswith("tree.") and greedy:
        # A pkg.module:callable audited as a tree verifier is named by its option.
        option = "--tree-greedy" if check.check_id == TREE_GREEDY_CHECK_ID else "--tree"
        command = f"losslessness audit {option} {check.target}"
    serving_tree = check.case_id in SERVING_TREE_CASE_IDS
    if (check.check_id.startswith("serving.") or serving_tree) and ":" in check.target:
        # A pkg.module:callable serving (tree) target is named with its protocol and the
        # profile its samples were checked against.
        protocol = "serving-tree" if serving_tree else "serving"
        command = f"losslessness audit --protocol {protocol} {check.target}"
        if check.details.get("engine_profile"):
            command += f" --engine-profile {check.details['engine_profile']}"
    command += f" --seed {config.seed} --case {check.case_id} --only {check.check_id}"
    # The conditions the case was built and called under (its id and hash depend on them).
    if config.vocab_size is not None:
        command += f" --vocab-size {config.vocab_size}"
    if config.batch_size is not None:
        command += f" --batch-size {config.batch_size}"
    if config.dtype is not None:
        command += f" --dtype {config.dtype}"
    if config.case_file is not None:
        # The file the run's own cases came from (its ids are known to --case only with it).
        command += f" --case-file {shlex.quote(config.case_file)}"
    tree_grid = plan.tree_cases.get(check.case_id)
    steps = (
        check.details.get("steps", grid.n_steps) if grid is not None
        else tree_grid.n_steps if tree_grid is not None
        else check.details.get("steps")
    )
    if steps:
        command += f" --steps {steps}"
    if grid is not None and grid.n_chunks > 1:
        command += f" --chunk-steps {grid.chunk_steps}"
    if grid is not None:
        # The steps the case drew, every one of them: a replay never stops on its own
        # evidence (its level, and so its stopping point, depends on what it selects).
        command += " --no-early-stop"
    return command


def attach_replays(
    plan: PlanRecord,
    targets: Sequence[TargetResult],
    suite_commands: Mapping[str, Sequence[str]],
) -> None:
    """Set the replay command of every check of ``targets``, in place, once the run is
    finished: a suite run's checks get its pytest command (``suite_commands``, by target),
    every other check :func:`replay_command`'s (a ``pkg.module:callable`` target is named by
    its option).

    Args:
        plan: the run's plan record.
        targets: the run's target results.
        suite_commands: the pytest command line of each suite run, by audited target.
    """
    greedy_callables = {name for name, _, _ in plan.targets if ":" in name}
    for target in targets:
        is_suite = target.name.startswith(SUITE_PREFIX)
        for check in target.checks:
            if is_suite:
                command = suite_commands.get(target.name.removeprefix(SUITE_PREFIX))
                check.replay = " ".join(command) if command else None
            else:
                check.replay = replay_command(plan, check, target.name in greedy_callables)
