"""The run engine: plan (select cases, count assertions, split the budget, size every case,
lay out the unit grid) -> sample into count tables -> checks on the tables -> AuditResult.

One engine serves the audit (one shard at the CI budget), the nightly (a multiple of the
budget, chunked, in shards merged exactly, with device-check and property-suite units) and the
property suite's plugin. Modules:

- :mod:`~losslessness.engine.plan`: the plan, its budget and its unit grid;
- :mod:`~losslessness.engine.draw`: every call of a target (drafts drawn, time bounded);
- :mod:`~losslessness.engine.tables`: count tables, the chain cases' sufficient statistics;
- :mod:`~losslessness.engine.shards`: shard selection, unit records, files, exact merge;
- :mod:`~losslessness.engine.end_to_end`: end-to-end units (sequence laws);
- :mod:`~losslessness.engine.device`: the device-check unit (coupling, precision);
- :mod:`~losslessness.engine.suite`: the property-suite unit (a pytest subprocess);
- :mod:`~losslessness.engine.state`: what a shard's units share while it runs;
- :mod:`~losslessness.engine.chains`: the chain units of a target, interleaved call by call;
- :mod:`~losslessness.engine.units`: one runner per other unit kind;
- :mod:`~losslessness.engine.scheduler`: running a shard (:func:`run_shard`);
- :mod:`~losslessness.engine.finish`: finishing a run (:func:`finish_run`), verdicts, summary;
- :mod:`~losslessness.engine.replay`: the command that replays one assertion;
- :mod:`~losslessness.engine.time_budget`: fitting a plan into a time budget;
- :mod:`~losslessness.engine.interrupts`: where an interruption may stop the engine;
- :mod:`~losslessness.engine.audit`: :func:`run_audit`, one shard then the finish.
"""

from losslessness.engine.audit import run_audit
from losslessness.engine.finish import RunResult, finish_run
from losslessness.engine.plan import (
    PlanRecord,
    RunPlan,
    make_plan,
    plan_run,
)
from losslessness.engine.scheduler import run_shard
from losslessness.engine.shards import (
    ShardMergeError,
    ShardResult,
    ShardSpec,
    load_shard,
    merge_shards,
    parse_shard_spec,
    save_shard,
)

__all__ = [
    "PlanRecord",
    "RunPlan",
    "RunResult",
    "ShardMergeError",
    "ShardResult",
    "ShardSpec",
    "finish_run",
    "load_shard",
    "make_plan",
    "merge_shards",
    "parse_shard_spec",
    "plan_run",
    "run_audit",
    "run_shard",
    "save_shard",
]
