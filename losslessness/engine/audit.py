"""The audit: one shard of a plan at the CI budget (fitted to a time budget when the config
has one), then the finish.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from losslessness.adapters import Adapter
from losslessness.config import RunConfig
from losslessness.engine.finish import finish_run
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
) -> AuditResult:
    """Audit every target: plan (fitted to ``config.time_budget_s`` when set), run as one
    shard, finish.

    Args:
        targets: adapters to audit, or :class:`UnavailableTarget` placeholders (recorded as
            ERROR so that the run's record says what could not be audited).
        config: the design; defaults to :class:`RunConfig` () (the CI budget, one chunk per
            case, no device checks or suite).
        progress: optional callback (steps done, steps planned, current label).
        work_dir: where suite units run, when the config has them.
        announce: called with the time budget's claim before sampling (with a budget).

    Returns:
        :class:`AuditResult`; ``exit_code`` gives the CLI's exit status (its environment
        carries the time budget's claim under ``"time budget"``).

    Raises:
        ValueError: unknown case ids in ``config.cases``.
    """
    config = config or RunConfig()
    note = load_device_checks()[1] if config.device_checks else None
    plan, deadline, claim = plan_within_budget(config, targets, note, announce)
    audit = finish_run([run_shard(plan, ShardSpec(0, 1), work_dir, progress, deadline)]).audit
    if claim is not None:
        audit.environment["time budget"] = claim
    return audit


