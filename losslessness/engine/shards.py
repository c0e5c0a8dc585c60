"""Shards of a run: selection, unit records, files, and the exact merge.

Shard ``i/N`` runs the units of the plan's grid whose index is ``i`` modulo ``N``. What a shard
keeps of a chain case is its count table (:mod:`losslessness.engine.tables`); of the other
units (greedy, tree, end-to-end, device, suite), their check results. Every shard also carries
the plan's chain cases themselves (their exact tensors), so that the finish runs the checks on
the cases that were sampled, whatever battery the finishing process has.

Files are ``.npz`` (numpy's own container, ``allow_pickle=False``) holding one records and one
counts array per (target, case), the p and q tensors of every chain case, and a JSON metadata
string: the format version, the plan record and its fingerprint, the shard spec, the chain
cases' ids, summaries and tags, the units run with their timings and failures, and the results
of the units that are not count tables.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from losslessness.cases import ChainCase
from losslessness.checks.sequential import evidence_from_json, evidence_to_json
from losslessness.engine.plan import PlanRecord, Unit, UnitKind
from losslessness.engine.tables import CountTable, merge_tables
from losslessness.records import validate_record
from losslessness.results import (
    JSON_NULL_FLOATS,
    AssertionKey,
    CheckResult,
    SequentialEvidence,
    check_from_dict,
    check_to_dict,
    shorten_message,
)

SHARD_FORMAT_VERSION = "5"
"""Version of the shard file layout; :func:`load_shard` rejects other versions."""

_SHARD_PATTERN = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


class ShardMergeError(ValueError):
    """Shards that cannot be merged: different plans, duplicate or missing units."""


@dataclass(frozen=True)
class ShardSpec:
    """Shard ``index`` of ``count``: it runs the units whose grid index is ``index`` mod
    ``count``.

    Raises:
        ValueError: naming ``shard``, unless ``0 <= index < count``.
    """

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(
                f"shard: expected i/N with N >= 1 and 0 <= i < N, got {self.index}/{self.count}"
            )

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def takes(self, unit_index: int) -> bool:
        """Whether this shard runs grid unit ``unit_index``."""
        return unit_index % self.count == self.index

    @property
    def file_name(self) -> str:
        """``shard-<i>-of-<N>.npz``."""
        return f"shard-{self.index}-of-{self.count}.npz"


def parse_shard_spec(text: str) -> ShardSpec:
    """Parse ``i/N`` (zero-based ``i``).

    Raises:
        ValueError: naming ``shard`` and what was wrong (``'2/2'``: i must be below N).
    """
    match = _SHARD_PATTERN.match(text)
    if match is None:
        raise ValueError(f"shard: expected i/N such as 0/4, got {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1:
        raise ValueError(f"shard: N must be >= 1, got {text!r}")
    if index >= count:
        raise ValueError(f"shard: i must lie in [0, N) (zero-based), got {text!r}")
    return ShardSpec(index, count)


class FailureKind(str, enum.Enum):
    """Why a unit did not finish as planned (:attr:`UnitRecord.failure_kind`); the values are
    what shard files hold.

    PROTOCOL: the target returned malformed output (LOSSY). ERROR: the target raised or hung.
    NOT_APPLICABLE: the target raised :class:`~losslessness.adapters.NotApplicable` for the
    case (its checks are SKIPPED with ``not applicable: <reason>``). UNAVAILABLE: the unit's
    optional package is missing here. STOPPED: a chain chunk or tree unit not sampled because
    its case or target was already decided LOSSY (sequential early stop) or the time budget
    was spent: not an error, the case's checks run on what was sampled. INCOMPLETE: the run was
    interrupted (SIGINT, SIGTERM) before the unit finished.
    """

    PROTOCOL = "protocol"
    ERROR = "error"
    NOT_APPLICABLE = "not-applicable"
    UNAVAILABLE = "unavailable"
    STOPPED = "stopped"
    INCOMPLETE = "incomplete"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SuiteRun:
    """What a property-suite unit's pytest subprocess left besides its check results.

    Attributes:
        command: the pytest command line (it replays the suite run).
        returncode: pytest's exit status.
        junit_xml: pytest's junit XML report ("" when none was written).
        output_tail: the end of pytest's output.
    """

    command: list[str]
    returncode: int
    junit_xml: str
    output_tail: str


@dataclass
class UnitRecord:
    """What one unit produced besides its count table.

    Attributes:
        index, key, kind, target, case_id, chunk: the unit (see
            :class:`losslessness.engine.plan.Unit`).
        wall_time_s: seconds the unit took.
        verify_steps: verification steps (batch rows) the target ran.
        verifier_calls: calls made to the target.
        verifier_time_s: seconds spent inside the target.
        failure_kind: why the unit did not finish as planned (:class:`FailureKind`), or None.
        failure: the message of the failure (for ``unavailable``: the reason and the command
            that installs what is missing), at most about
            :data:`~losslessness.results.MESSAGE_LIMIT` characters (:meth:`fail`).
        failure_text: the failure's full text when ``failure`` is shortened, else None (kept
            once here; the finished record keeps it once per target,
            :attr:`~losslessness.results.TargetResult.full_messages`).
        checks: results of greedy, tree, end-to-end, device and suite units.
        sequential: the sequential monitor's evidence by assertion (chain chunks and tree
            units of a run that stops early on evidence), else None.
        stopped: why a chain chunk or tree unit stopped before its planned steps (``LOSSY:
            <reason>``, the time budget, an interrupt), else None.
        planned_steps: the steps a stopped chain chunk had planned, else None.
        interrupted: Ctrl-C came while the unit's stream ran (its target cannot be LOSSLESS).
        unavailable: a device unit's adapters missing on the device, as (name, reason).
        suite_run: a suite unit's pytest run, else None.
    """

    index: int
    key: str
    kind: UnitKind
    target: str
    case_id: str = ""
    chunk: int = 0
    wall_time_s: float = 0.0
    verify_steps: int = 0
    verifier_calls: int = 0
    verifier_time_s: float = 0.0
    failure_kind: FailureKind | None = None
    failure: str | None = None
    failure_text: str | None = None
    checks: list[CheckResult] = field(default_factory=list)
    sequential: dict[AssertionKey, SequentialEvidence] | None = None
    stopped: str | None = None
    planned_steps: int | None = None
    interrupted: bool = False
    unavailable: list[tuple[str, str]] = field(default_factory=list)
    suite_run: SuiteRun | None = None

    @classmethod
    def of(
        cls, unit: Unit, failure_kind: FailureKind | None = None, failure: str | None = None
    ) -> UnitRecord:
        """The record of ``unit``, empty or with a failure."""
        return cls(
            unit.index, unit.key, unit.kind, unit.target, unit.case_id, unit.chunk,
            failure_kind=failure_kind, failure=failure,
        )

    def fail(self, kind: FailureKind, text: str) -> None:
        """Record that the unit failed with ``kind``: ``failure`` is ``text`` shortened once
        (:func:`~losslessness.results.shorten_message`; what every check and report repeats),
        ``failure_text`` the full text when it was longer."""
        self.failure_kind = kind
        self.failure = shorten_message(text)
        self.failure_text = text if self.failure != text else None


@dataclass
class ShardResult:
    """One shard's output (in memory; :func:`save_shard` / :func:`load_shard` for files).

    Attributes:
        plan: the plan record (the same on every shard of a run).
        shard: which shard.
        units: the records of every unit run, by grid index.
        tables: count tables by (target, case id): the shard's chunks in grid order (in memory)
            or canonical (loaded from a file).
        cases: the plan's chain cases, by case id (their hashes are the plan's).
        environment: versions where the shard ran.
        started_at: ISO 8601 UTC start.
        wall_time_s: seconds the shard took.
        source: the file it was loaded from, if any.
    """

    plan: PlanRecord
    shard: ShardSpec
    units: dict[int, UnitRecord]
    tables: dict[tuple[str, str], CountTable]
    cases: dict[str, ChainCase]
    environment: dict[str, str]
    started_at: str
    wall_time_s: float
    source: str | None = None

    @property
    def fingerprint(self) -> str:
        """The plan's fingerprint."""
        return self.plan.fingerprint

    @property
    def label(self) -> str:
        """The file name, or ``shard i/N``."""
        return self.source or f"shard {self.shard}"


def _json_default(value: object) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def _unit_to_dict(unit: UnitRecord) -> dict[str, Any]:
    data = {
        field.name: getattr(unit, field.name)
        for field in dataclasses.fields(unit)
        if field.name not in ("checks", "sequential", "suite_run")
    }
    data["checks"] = [check_to_dict(check) for check in unit.checks]
    data["sequential"] = None if unit.sequential is None else evidence_to_json(unit.sequential)
    data["suite_run"] = None if unit.suite_run is None else dataclasses.asdict(unit.suite_run)
    return data


def _unit_from_dict(data: Any, path: str) -> UnitRecord:
    """The unit record of a shard file's ``data`` at ``path`` (``units[3]``), validated first.

    Raises:
        RecordError: naming the wrong field's path.
    """
    validate_record(
        data, UnitRecord, path=path, nullable_floats=JSON_NULL_FLOATS, opaque=("sequential",)
    )
    values = dict(data)
    values["kind"] = UnitKind(values["kind"])
    if values["failure_kind"] is not None:
        values["failure_kind"] = FailureKind(values["failure_kind"])
    values["checks"] = [check_from_dict(check) for check in values["checks"]]
    if values["sequential"] is not None:
        values["sequential"] = evidence_from_json(values["sequential"])
    if values["suite_run"] is not None:
        values["suite_run"] = SuiteRun(**values["suite_run"])
    values["unavailable"] = [(str(name), str(reason)) for name, reason in values["unavailable"]]
    return UnitRecord(**values)


def save_shard(shard: ShardResult, path: str | Path) -> Path:
    """Write ``shard`` to ``path`` (``.npz``; see the module docstring).

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = sorted(shard.tables)
    arrays: dict[str, Any] = {}
    for i, key in enumerate(keys):
        table = shard.tables[key].canonical()
        records = table.records
        # Token ids fit int32 unless a malformed output holds huge values; keep those exact.
        fits = records.size == 0 or (
            records.min() >= np.iinfo(np.int32).min and records.max() <= np.iinfo(np.int32).max
        )
        arrays[f"records_{i}"] = records.astype(np.int32 if fits else np.int64)
        arrays[f"counts_{i}"] = table.counts
    case_ids = sorted(shard.cases)
    for j, case_id in enumerate(case_ids):
        case = shard.cases[case_id]
        arrays[f"case_target_{j}"] = case.target_probs.detach().cpu().numpy()
        arrays[f"case_draft_{j}"] = case.draft_probs.detach().cpu().numpy()
    meta = {
        "format_version": SHARD_FORMAT_VERSION,
        "fingerprint": shard.fingerprint,
        "plan": shard.plan.to_json(),
        "shard": [shard.shard.index, shard.shard.count],
        "tables": [list(key) for key in keys],
        "cases": [
            [
                case_id,
                shard.cases[case_id].summary,
                sorted(shard.cases[case_id].tags),
                shard.cases[case_id].call_batch_size,
                shard.cases[case_id].dtype,
            ]
            for case_id in case_ids
        ],
        "units": [_unit_to_dict(unit) for _, unit in sorted(shard.units.items())],
        "environment": shard.environment,
        "started_at": shard.started_at,
        "wall_time_s": shard.wall_time_s,
    }
    arrays["meta"] = np.array(json.dumps(meta, default=_json_default))
    with path.open("wb") as handle:
        np.savez_compressed(handle, **arrays)
    return path


def load_shard(path: str | Path) -> ShardResult:
    """Read a shard file written by :func:`save_shard`.

    Raises:
        FileNotFoundError: no such file.
        ShardMergeError: not a shard file, of another format version, or malformed (a unit
            record's wrong field named by its path, ``units[3].checks[0].p_value: ...``).
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"][()]))
            arrays = {name: data[name] for name in data.files if name != "meta"}
        if not isinstance(meta, dict):
            raise ValueError(f"its metadata is not a JSON object but {type(meta).__name__}")
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        raise ShardMergeError(f"{path}: not a shard file ({error})") from error
    version = meta.get("format_version")
    if version != SHARD_FORMAT_VERSION:
        raise ShardMergeError(
            f"{path}: shard format version {version!r}, this losslessness reads "
            f"{SHARD_FORMAT_VERSION!r}"
        )
    try:
        tables = {
            (target, case_id): CountTable(
                arrays[f"records_{i}"].astype(np.int64), arrays[f"counts_{i}"].astype(np.int64)
            )
            for i, (target, case_id) in enumerate(meta["tables"])
        }
        units = [_unit_from_dict(unit, f"units[{i}]") for i, unit in enumerate(meta["units"])]
        plan = PlanRecord.from_json(meta["plan"])
    except (KeyError, TypeError, ValueError) as error:
        # A shard file comes from disk: a malformed one is reported, never a traceback.
        raise ShardMergeError(f"{path}: {error}") from error
    if plan.fingerprint != meta["fingerprint"]:
        raise ShardMergeError(f"{path}: the plan does not match its fingerprint (altered file?)")
    try:
        cases = {
            case_id: ChainCase(
                case_id,
                summary,
                torch.from_numpy(arrays[f"case_target_{j}"]),
                torch.from_numpy(arrays[f"case_draft_{j}"]),
                frozenset(tags),
                call_batch_size,
                dtype,
            )
            for j, (case_id, summary, tags, call_batch_size, dtype) in enumerate(meta["cases"])
        }
    except (KeyError, TypeError, ValueError) as error:
        raise ShardMergeError(f"{path}: malformed chain case ({error})") from error
    recorded = {case_id: case.case_hash for case_id, case in cases.items()}
    planned = {case_id: grid.case_hash for case_id, grid in plan.chain_cases.items()}
    if recorded != planned:
        raise ShardMergeError(f"{path}: the chain cases do not match the plan's (altered file?)")
    return ShardResult(
        plan=plan,
        shard=ShardSpec(*meta["shard"]),
        units={unit.index: unit for unit in units},
        tables=tables,
        cases=cases,
        environment=meta["environment"],
        started_at=meta["started_at"],
        wall_time_s=meta["wall_time_s"],
        source=str(path),
    )


def _differences(left: Any, right: Any, prefix: str = "") -> list[str]:
    if isinstance(left, dict) and isinstance(right, dict):
        found = []
        # The left description's order: the config comes before the derived grid.
        for key in [*left, *(key for key in right if key not in left)]:
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in left or key not in right:
                found.append(f"{name} present in only one")
            else:
                found += _differences(left[key], right[key], name)
        return found
    return [] if left == right else [f"{prefix}: {left!r} vs {right!r}"]


@dataclass
class MergedShards:
    """The union of compatible shards.

    Attributes:
        plan: the common plan record.
        units: every unit's record, by grid index (complete, no duplicates).
        tables: count tables by (target, case id): summed over shards (canonical), or one
            shard's own tables as they are.
        shards: the shards merged, in the order given.
    """

    plan: PlanRecord
    units: dict[int, UnitRecord]
    tables: dict[tuple[str, str], CountTable]
    shards: list[ShardResult]

    @property
    def cases(self) -> dict[str, ChainCase]:
        """The plan's chain cases, by case id (every shard carries the same: their hashes are
        the plan's)."""
        return self.shards[0].cases

    @property
    def fingerprint(self) -> str:
        """The plan's fingerprint."""
        return self.plan.fingerprint


def merge_shards(shards: list[ShardResult]) -> MergedShards:
    """Check that ``shards`` are parts of one run and sum them.

    Raises:
        ShardMergeError: no shards; plans that differ (naming the first differences and the
            files); a unit run by two shards (naming it and both files); units no shard ran
            (naming how many and the first few).
    """
    if not shards:
        raise ShardMergeError("shards: nothing to merge")
    first = shards[0]
    for other in shards[1:]:
        if other.fingerprint != first.fingerprint:
            differences = _differences(first.plan.to_json(), other.plan.to_json())
            differences = differences or ["(fingerprints only)"]
            shown = "; ".join(differences[:5])
            more = f" (and {len(differences) - 5} more)" if len(differences) > 5 else ""
            raise ShardMergeError(
                f"{first.label} and {other.label} are shards of different plans: {shown}{more}"
            )
    units: dict[int, UnitRecord] = {}
    owner: dict[int, str] = {}
    for shard in shards:
        for index, unit in shard.units.items():
            if index in units:
                raise ShardMergeError(
                    f"unit {unit.key} (grid index {index}) appears in both {owner[index]} and "
                    f"{shard.label}: the same shard given twice, or shard counts that overlap"
                )
            units[index] = unit
            owner[index] = shard.label
    expected = len(first.plan.units)
    missing = sorted(set(range(expected)) - set(units))
    if missing:
        specs = sorted({str(shard.shard) for shard in shards})
        raise ShardMergeError(
            f"{len(missing)} of {expected} units were run by no shard given (shards "
            f"{', '.join(specs)}); first missing grid indices: {missing[:5]}"
        )
    if len(shards) == 1:
        return MergedShards(first.plan, units, dict(first.tables), list(shards))
    grouped: dict[tuple[str, str], list[CountTable]] = {}
    for shard in shards:
        for key, table in shard.tables.items():
            grouped.setdefault(key, []).append(table)
    tables = {key: merge_tables(parts) for key, parts in sorted(grouped.items())}
    return MergedShards(first.plan, units, tables, list(shards))


__all__ = [
    "SHARD_FORMAT_VERSION",
    "FailureKind",
    "MergedShards",
    "ShardMergeError",
    "ShardResult",
    "ShardSpec",
    "SuiteRun",
    "UnitRecord",
    "load_shard",
    "merge_shards",
    "parse_shard_spec",
    "save_shard",
]
