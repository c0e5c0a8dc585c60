"""The nightly run: 10-100x the CI sample budget on every adapter that loads, the device
checks, and the property suite under the ``nightly`` Hypothesis profile, split into shards
whose sufficient statistics merge exactly (``losslessness nightly --shard i/N`` and
``losslessness merge``).

- :mod:`losslessness.nightly.plan`: the budget, the targets and the chunk grid of one night;
- :mod:`losslessness.nightly.shards`: shard selection, count tables, shard files, the merge;
- :mod:`losslessness.nightly.suite`: the property suite as a pytest subprocess;
- :mod:`losslessness.nightly.run`: running a shard, and checking the merged statistics.
"""

from losslessness.nightly.plan import (
    CHUNK_STEPS,
    DEVICE_DEFAULTS,
    ChainCasePlan,
    NightlyConfig,
    NightlyPlan,
    Unit,
    make_plan,
    plan_night,
    resolve_targets,
)
from losslessness.nightly.run import NightlyResult, case_seed, finish_night, run_shard
from losslessness.nightly.shards import (
    CountTable,
    ShardMergeError,
    ShardResult,
    ShardSpec,
    load_shard,
    merge_shards,
    parse_shard_spec,
    save_shard,
)

__all__ = [
    "CHUNK_STEPS",
    "DEVICE_DEFAULTS",
    "ChainCasePlan",
    "CountTable",
    "NightlyConfig",
    "NightlyPlan",
    "NightlyResult",
    "ShardMergeError",
    "ShardResult",
    "ShardSpec",
    "Unit",
    "case_seed",
    "finish_night",
    "load_shard",
    "make_plan",
    "merge_shards",
    "parse_shard_spec",
    "plan_night",
    "resolve_targets",
    "run_shard",
    "save_shard",
]
