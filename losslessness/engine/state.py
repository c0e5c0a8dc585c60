"""What the units of one shard share while it runs: the plan, the progress tracker, the targets
that hung or were already decided LOSSY, the chain chunks' count tables; and the helpers every
unit runner uses to record a target's failure and the checks it could not run.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from losslessness.adapters import NotApplicable
from losslessness.engine.draw import TargetCrashed, TargetRaised, TargetTimeout
from losslessness.engine.plan import PlanRecord, RunPlan
from losslessness.engine.shards import FailureKind, ShardSpec, UnitRecord
from losslessness.engine.tables import CountTable
from losslessness.results import CheckContext, CheckResult, Verdict

INTERRUPTED_MESSAGE = "not run: the run was interrupted (a signal) before this unit finished"

ProgressCallback = Callable[[int, int, str], None]
"""Called with (steps done, steps planned, label of the current unit)."""


def failure_message(error: BaseException) -> str:
    """What a unit record says of a target's exception: a hang, a crash of its worker process,
    or the exception and where it was raised (in full: :meth:`UnitRecord.fail` shortens it
    once, where it is recorded)."""
    if isinstance(error, TargetTimeout):
        return f"target hung: {error}"
    if isinstance(error, TargetCrashed):
        return f"target crashed: {error}"
    if isinstance(error, TargetRaised):
        location = f" at {error.location}" if error.location else ""
        return f"target raised {error.type_name}: {error.message}{location}"
    where = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    location = f" at {where.filename}:{where.lineno}" if where else ""
    try:
        text = str(error)
    except Exception:  # an exception's own __str__ is target code and may raise too
        text = "<its message could not be converted to text>"
    return f"target raised {type(error).__name__}: {text}{location}"


@dataclass
class ProgressTracker:
    """The shard's progress: steps done of those planned, the current unit's label, and the
    callback told of every advance."""

    callback: ProgressCallback | None
    planned: int
    done: int = 0
    label: str = ""
    began: float = field(default_factory=time.perf_counter)

    def seconds_left(self, deadline: float | None) -> float | None:
        """Seconds to the deadline, else extrapolated from the pace so far (None before
        any step)."""
        now = time.perf_counter()
        if deadline is not None:
            return max(0.0, deadline - now)
        if not self.done:
            return None
        return (now - self.began) / self.done * max(0, self.planned - self.done)

    def advance(self, steps: int) -> None:
        """Count ``steps`` more steps done and tell the callback."""
        self.done += steps
        if self.callback is not None:
            self.callback(self.done, self.planned, self.label)


@dataclass
class ShardState:
    """What the units of one shard share while it runs.

    Attributes:
        plan: the run's plan.
        tracker: the shard's progress.
        work_dir: where suite units run.
        spec: which shard.
        deadline: ``time.perf_counter()`` value at which chain sampling stops, or None.
        hung: in-process targets that outlasted ``config.timeout_s``, with the failure (never
            called again).
        decided: targets already LOSSY on evidence (early stop), with the reason.
        chunks: the chain chunks' count tables, by (target, case id), in chunk order.
    """

    plan: RunPlan
    tracker: ProgressTracker
    work_dir: Path
    spec: ShardSpec = field(default_factory=lambda: ShardSpec(0, 1))
    deadline: float | None = None
    hung: dict[str, str] = field(default_factory=dict)
    decided: dict[str, str] = field(default_factory=dict)
    chunks: dict[tuple[str, str], list[CountTable]] = field(default_factory=dict)


def record_target_error(state: ShardState, record: UnitRecord, error: BaseException) -> None:
    """Record in ``record`` that its target raised ``error``: not applicable (its checks
    SKIPPED), else an error. A hang of an in-process target also marks the target hung for the
    rest of the shard (its call may still be running in the audit's thread); a target in a
    worker process was killed and restarts at its next call, so its other cases still run."""
    if isinstance(error, NotApplicable):
        record.fail(FailureKind.NOT_APPLICABLE, error.skip_message)
        return
    record.fail(FailureKind.ERROR, failure_message(error))
    if isinstance(error, TargetTimeout) and not error.worker_killed:
        state.hung[record.target] = str(record.failure)


def untested_results(
    context: CheckContext, record: UnitRecord, check_ids: Sequence[str]
) -> list[CheckResult]:
    """The results of checks a failed unit could not run: SKIPPED when the target refused the
    case as not applicable, ERROR otherwise, with the unit's failure as the message."""
    verdict = (
        Verdict.SKIPPED if record.failure_kind is FailureKind.NOT_APPLICABLE else Verdict.ERROR
    )
    return [context.untested(check_id, verdict, str(record.failure)) for check_id in check_ids]


def check_context(
    plan: PlanRecord,
    target: str,
    case_id: str,
    summary: str,
    case_hash: str,
    seed: int,
    n_rows: int = 1,
) -> CheckContext:
    """The context of one case of ``target`` at the plan's per-assertion level, design power
    and TV."""
    config = plan.config
    return CheckContext(
        target=target,
        case_id=case_id,
        case_summary=summary,
        case_hash=case_hash,
        alpha=plan.per_assertion_alpha,
        power=config.power,
        tv=config.tv,
        seed=seed,
        n_rows=n_rows,
    )


