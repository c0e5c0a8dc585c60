"""The audit: one shard of a plan at the CI budget (fitted to a time budget when the config
has one), then the finish.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from losslessness.adapters import Adapter
from losslessness.config import RunConfig
from losslessness.engine.finish import finish_run
from losslessness.engine.parallel import ShardRunner, parallel_jobs, run_shards_in_processes
from losslessness.engine.plan import load_device_checks
from losslessness.engine.scheduler import run_shard
from losslessness.engine.shards import ShardSpec
from losslessness.engine.state import ProgressCallback
from losslessness.engine.time_budget import plan_within_budget
from losslessness.results import AuditResult
from losslessness.targets import UnavailableTarget


def run_audit(
    targets: Sequence[Adapter | UnavailableTarget],
    config: RunConfig | None = None,
    progress: ProgressCallback | None = None,
    work_dir: str | Path | None = None,
    announce: Callable[[str], None] | None = None,
    jobs: int = 1,
    shard_runner: ShardRunner | None = None,
) -> AuditResult:
    """Audit every target: plan (fitted to ``config.time_budget_s`` when set), run as one
    shard, or as ``jobs`` shards in parallel processes (:mod:`losslessness.engine.parallel`;
    without a time budget, with a ``shard_runner``, and for a plan of at least
    :data:`~losslessness.engine.parallel.MIN_PARALLEL_STEPS` steps), finish.

    Args:
        targets: adapters to audit, or :class:`UnavailableTarget` placeholders (recorded as
            ERROR so that the run's record says what could not be audited).
        config: the design; defaults to :class:`RunConfig` () (the CI budget, one chunk per
            case, no device checks or suite).
        progress: optional callback (steps done, steps planned, current label).
        work_dir: where suite units run, when the config has them.
        announce: called with the time budget's claim before sampling (with a budget).
        jobs: processes the run may use (>= 1); the result does not depend on it (count for
            count with ``early_stop`` off; with it on, as one process, only where each
            target stops may differ).
        shard_runner: runs shard ``i/jobs`` in a child process (it resolves the same targets
            again); without one the run stays in this process.

    Returns:
        :class:`AuditResult`; ``exit_code`` gives the CLI's exit status (its environment
        carries the time budget's claim under ``"time budget"``).

    Raises:
        ValueError: unknown case ids in ``config.cases``; ``jobs`` below 1.
    """
    began = time.perf_counter()
    config = config or RunConfig()
    note = load_device_checks()[1] if config.device_checks else None
    plan, deadline, claim = plan_within_budget(config, targets, note, announce)
    processes = parallel_jobs(plan, jobs)
    if processes > 1 and shard_runner is not None and config.time_budget_s is None:
        shards = run_shards_in_processes(plan, processes, shard_runner, work_dir, progress)
    else:
        shards = [run_shard(plan, ShardSpec(0, 1), work_dir, progress, deadline)]
    audit = finish_run(shards).audit
    if processes > 1 and len(shards) > 1:
        # The shards ran side by side: their times add up to CPU time, not to the run's.
        audit.wall_time_s = time.perf_counter() - began
        audit.environment["processes"] = str(processes)
    if claim is not None:
        audit.environment["time budget"] = claim
    return audit


