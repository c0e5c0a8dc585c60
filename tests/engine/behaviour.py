"""Pinned behaviour of the run engine: what the audit decides on fixed seeds, as one canonical
record, so that a refactor that moves code can prove it changed nothing.

Each scenario runs through the public engine (plan, shards, finish) and keeps everything the
audit decides: every target's verdict, why it stopped early, its verify steps and calls, and
every check's id, case, verdict, statistic, p-value, n, significance level, minimum detectable
TV, details, sequential evidence, law cells and replay line. Timings, dates and the machine's
environment are dropped; floats are kept to 10 significant digits (a refactor may reorder a
sum, never change a decision).

Scenarios:

- ``reference``: the default audit of the reference (chain, greedy and tree batteries).
- ``chain-mutant``: the zoo's ``residual-zeroes-rejected-token``, fixed design; with early
  stopping (``chain-mutant-early-stop``) its verdict only.
- ``tree-mutant``: the zoo's ``tree-iid-siblings-against-p``.
- ``sharded``: a nightly-style grid (several chunks per case, fixed design) run as two shards
  and merged, on the reference and a wrong verifier.
- ``suite``: the property suite's chain and tree tests on the reference, profile ``ci``
  (derandomised), each test's outcome.

Regenerate the pinned record (only when a behaviour change is intended, and say why in the
commit)::

    python -m tests.engine.behaviour --write
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from losslessness.adapters import Adapter
from losslessness.config import RunConfig
from losslessness.engine import ShardSpec, finish_run, plan_run, run_audit, run_shard
from losslessness.engine.tables import CountTable
from losslessness.targets import resolve_adapter
from reports.jsonio import audit_to_dict
from tests import wrong_verifiers

PINNED = Path(__file__).with_name("behaviour.json")
"""The pinned record: one entry per scenario."""

SIGNIFICANT_DIGITS = 10

_DROPPED_KEYS = {"started_at", "environment", "wall_time_s", "verifier_time_s"}


def _canonical(value: Any) -> Any:
    """``value`` without timings, with floats to :data:`SIGNIFICANT_DIGITS` digits."""
    if isinstance(value, float):
        if not math.isfinite(value) or value == 0.0:
            return value if math.isfinite(value) else repr(value)
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    if isinstance(value, dict):
        return {
            key: _canonical(item)
            for key, item in value.items()
            if key not in _DROPPED_KEYS and not str(key).endswith("_time_s")
        }
    if isinstance(value, (list, tuple)):
        return [_canonical(item) for item in value]
    return value


def _table_digest(table: CountTable) -> str:
    digest = hashlib.sha256(np.ascontiguousarray(table.records, dtype=np.int64).tobytes())
    digest.update(np.ascontiguousarray(table.counts, dtype=np.int64).tobytes())
    return digest.hexdigest()


def _audit(targets: list[str], **config: Any) -> dict[str, Any]:
    adapters = [resolve_adapter(name) for name in targets]
    with tempfile.TemporaryDirectory() as work_dir:
        result = run_audit(adapters, RunConfig(**config), work_dir=work_dir)
    record: dict[str, Any] = _canonical(audit_to_dict(result))
    return record


def reference() -> dict[str, Any]:
    """The default audit of the reference."""
    return _audit(["reference"])


def chain_mutant() -> dict[str, Any]:
    """A lossy chain mutant of the zoo at a tenth of the CI plan's steps, fixed design (with
    early stopping the cases are interleaved by the time each has spent, so where the others
    stop depends on the machine's speed)."""
    return _audit(
        ["mutant/residual-zeroes-rejected-token"], step_multiplier=0.1, early_stop=False
    )


def chain_mutant_early_stop() -> dict[str, Any]:
    """The same mutant with early stopping (the default): its verdict only (see above)."""
    record = _audit(["mutant/residual-zeroes-rejected-token"])
    return {"verdicts": [target["verdict"] for target in record["targets"]]}


def tree_mutant() -> dict[str, Any]:
    """A lossy tree mutant of the zoo."""
    return _audit(["mutant/tree-iid-siblings-against-p"])


def sharded() -> dict[str, Any]:
    """Two shards of a chunked fixed-design grid, merged."""
    config = RunConfig(
        step_multiplier=0.05,
        cases=("v2-tilted", "v8-far", "v32-mixed-batch", "edge-disjoint", "greedy-v8-ties"),
        suite=False,
        device_checks=False,
        chunk_steps=64,
        seed=11,
        early_stop=False,
    )
    lossy = Adapter(
        "residual-is-target",
        "wrong verifier: residual distribution is p instead of norm(max(0, p - q))",
        chain=wrong_verifiers.residual_is_target,
    )
    plan = plan_run(config, [resolve_adapter("reference"), lossy])
    with tempfile.TemporaryDirectory() as work_dir:
        shards = [run_shard(plan, ShardSpec(index, 2), work_dir) for index in range(2)]
    run = finish_run(shards)
    record: dict[str, Any] = _canonical(audit_to_dict(run.audit))
    record["tables"] = {
        f"{target}/{case_id}": {
            "records": table.n_records,
            "sha256": _table_digest(table.canonical()),
        }
        for (target, case_id), table in sorted(run.tables.items())
    }
    return record


def suite() -> dict[str, Any]:
    """The property suite on the reference (chain, greedy and tree), profile ``ci``."""
    from losslessness.engine.suite import run_suite

    adapter = resolve_adapter("reference")
    with tempfile.TemporaryDirectory() as work_dir:
        outcome = run_suite(adapter, "ci", Path(work_dir))
    return {
        "returncode": outcome.returncode,
        "tests": sorted(
            [check.case_id, check.verdict.value, check.message] for check in outcome.checks
        ),
    }


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "reference": reference,
    "chain-mutant": chain_mutant,
    "chain-mutant-early-stop": chain_mutant_early_stop,
    "tree-mutant": tree_mutant,
    "sharded": sharded,
    "suite": suite,
}


def pinned() -> dict[str, Any]:
    """The pinned record, by scenario."""
    data: dict[str, Any] = json.loads(PINNED.read_text())
    return data


def main(argv: list[str]) -> int:
    """``--write``: run every scenario and write the pinned record."""
    if argv != ["--write"]:
        print(__doc__)
        return 2
    record = {name: scenario() for name, scenario in SCENARIOS.items()}
    PINNED.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINNED}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
