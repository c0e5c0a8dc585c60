"""Shards of a night: selection, sufficient statistics, files, and the exact merge.

Shard ``i/N`` runs the units of the plan's grid whose index is ``i`` modulo ``N``. What a shard
keeps of a chain case is a *count table*: the distinct records of the case's steps and how
often each occurred. A record is a *pair* of consecutive steps (``2m``, ``2m+1``) of one
chunk, each step with every row type's output ``[k+1]`` and drafts ``[k]``::

    record = [out[0, 2m], d[0, 2m], out[0, 2m+1], d[0, 2m+1], ..., d[R-1, 2m+1]]

    width R * 2 * (2k+1), int64, -1 placeholders kept

Every chain check is a function of the multiset of records: structure, conditional laws and
acceptance read each step's output and drafts, whatever their order; the independence check
reads pairs of copies of a row type that shared a verifier call, and the chunk grid keeps each
pair inside one call (:class:`losslessness.nightly.plan.ChainCasePlan`). Merging sums the
tables (``np.unique(axis=0)`` of the union, counts added): the merged table of N shards equals
the table of one run of the same grid, count for count, whatever N and the merge order.

Files are ``.npz`` (numpy's own container, ``allow_pickle=False``) holding one records and one
counts array per (target, case) and a JSON metadata string: the format version, the plan's
description and fingerprint, the shard spec, the units run with their timings and failures,
and the results of the units that are not sampled in chunks (greedy, end-to-end, device,
suite).
"""

from __future__ import annotations

import dataclasses
import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from losslessness.checks import CheckResult, check_from_dict, check_to_dict

SHARD_FORMAT_VERSION = "1"
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


@dataclass(frozen=True)
class CountTable:
    """Distinct step-pair records of one chain case and their counts.

    Attributes:
        records: ``[M, R * 2 * (2k+1)]`` int64, distinct rows in ``np.unique`` order.
        counts: ``[M]`` int64, each >= 1.
    """

    records: np.ndarray
    counts: np.ndarray

    @property
    def n_pairs(self) -> int:
        """Number of step pairs counted."""
        return int(self.counts.sum())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CountTable):
            return NotImplemented
        return np.array_equal(self.records, other.records) and np.array_equal(
            self.counts, other.counts
        )

    __hash__ = None  # type: ignore[assignment]


def count_records(records: np.ndarray, counts: np.ndarray | None = None) -> CountTable:
    """The count table of ``records`` (each weighted by ``counts``, default 1).

    Args:
        records: ``[M, W]`` integer.
        counts: ``[M]`` nonnegative int64 weights, or None.

    Returns:
        :class:`CountTable` with distinct rows in lexicographic order.
    """
    records = np.asarray(records, dtype=np.int64)
    if records.ndim != 2:
        raise ValueError(f"records: expected a [M, W] array, got shape {records.shape}")
    weights = (
        np.ones(records.shape[0], dtype=np.int64)
        if counts is None
        else np.asarray(counts, dtype=np.int64)
    )
    if weights.shape != (records.shape[0],):
        raise ValueError(f"counts: expected shape ({records.shape[0]},), got {weights.shape}")
    unique, inverse = np.unique(records, axis=0, return_inverse=True)
    summed = np.zeros(unique.shape[0], dtype=np.int64)
    np.add.at(summed, inverse.reshape(-1), weights)
    keep = summed > 0
    return CountTable(unique[keep], summed[keep])


def merge_tables(tables: list[CountTable]) -> CountTable:
    """Sum count tables of the same case (same record width).

    Raises:
        ValueError: no tables, or tables of different widths.
    """
    if not tables:
        raise ValueError("tables: nothing to merge")
    widths = {table.records.shape[1] for table in tables}
    if len(widths) != 1:
        raise ValueError(f"tables: record widths differ: {sorted(widths)}")
    return count_records(
        np.concatenate([table.records for table in tables]),
        np.concatenate([table.counts for table in tables]),
    )


def pair_records(outputs: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """Step-pair records of one chunk (see the module docstring for the layout).

    Args:
        outputs: ``[R, n, k+1]`` int64 verifier outputs, ``n`` even.
        drafts: ``[R, n, k]`` int64 drafts.

    Returns:
        ``[n / 2, R * 2 * (2k+1)]`` int64.

    Raises:
        ValueError: ``n`` odd, or shapes that do not match.
    """
    rows, n, width = outputs.shape
    if n % 2:
        raise ValueError(f"outputs: the number of steps must be even, got {n}")
    if drafts.shape != (rows, n, width - 1):
        raise ValueError(f"drafts: expected shape {(rows, n, width - 1)}, got {drafts.shape}")
    steps = np.concatenate([outputs, drafts], axis=-1)
    paired = steps.reshape(rows, n // 2, 2 * (2 * width - 1)).transpose(1, 0, 2)
    return np.ascontiguousarray(paired.reshape(n // 2, -1), dtype=np.int64)


def expand_table(table: CountTable, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Outputs and drafts with every record repeated ``count`` times, pairs kept adjacent.

    Args:
        table: count table of a case with ``rows`` row types and draft length ``k``.
        rows: R.
        k: draft length.

    Returns:
        ``(outputs [R, 2P, k+1], drafts [R, 2P, k])`` int64, P = ``table.n_pairs``; steps
        ``2m`` and ``2m+1`` form pair m.

    Raises:
        ValueError: the record width is not ``R * 2 * (2k+1)``.
    """
    step_width = 2 * k + 1
    if table.records.shape[1] != rows * 2 * step_width:
        raise ValueError(
            f"table: records have width {table.records.shape[1]}, expected "
            f"R * 2 * (2k+1) = {rows * 2 * step_width}"
        )
    repeated = np.repeat(table.records, table.counts, axis=0)
    pairs = repeated.shape[0]
    steps = repeated.reshape(pairs, rows, 2 * step_width).transpose(1, 0, 2)
    steps = steps.reshape(rows, 2 * pairs, step_width)
    return np.ascontiguousarray(steps[..., : k + 1]), np.ascontiguousarray(steps[..., k + 1 :])


@dataclass
class UnitRecord:
    """What one unit produced besides its count table.

    Attributes:
        index, key, kind, target, case_id, chunk: the unit (see
            :class:`losslessness.nightly.plan.Unit`).
        wall_time_s: seconds the unit took.
        verify_steps: verification steps (batch rows) the target ran.
        verifier_calls: calls made to the target.
        verifier_time_s: seconds spent inside the target.
        failure_kind: ``protocol`` (malformed output) or ``error`` (the target raised), or None.
        failure: the message of the failure.
        checks: results of greedy, end-to-end, device and suite units.
        extra: JSON-able extras (device: unavailable adapters; suite: exit code, junit XML).
    """

    index: int
    key: str
    kind: str
    target: str
    case_id: str = ""
    chunk: int = 0
    wall_time_s: float = 0.0
    verify_steps: int = 0
    verifier_calls: int = 0
    verifier_time_s: float = 0.0
    failure_kind: str | None = None
    failure: str | None = None
    checks: list[CheckResult] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ShardResult:
    """One shard's output (in memory; :func:`save_shard` / :func:`load_shard` for files).

    Attributes:
        plan: the plan's description (:meth:`NightlyPlan.describe`).
        fingerprint: the plan's fingerprint.
        shard: which shard.
        units: the records of every unit run, by grid index.
        tables: count tables by (target, case id), summed over the shard's chunks.
        target_descriptions: description of each loaded target, by name.
        unavailable: reason each unavailable target did not load, by name.
        environment: versions where the shard ran.
        started_at: ISO 8601 UTC start.
        wall_time_s: seconds the shard took.
        source: the file it was loaded from, if any.
    """

    plan: dict[str, Any]
    fingerprint: str
    shard: ShardSpec
    units: dict[int, UnitRecord]
    tables: dict[tuple[str, str], CountTable]
    target_descriptions: dict[str, str]
    unavailable: dict[str, str]
    environment: dict[str, str]
    started_at: str
    wall_time_s: float
    source: str | None = None

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
    data = dataclasses.asdict(unit)
    data["checks"] = [check_to_dict(check) for check in unit.checks]
    return data


def _unit_from_dict(data: dict[str, Any]) -> UnitRecord:
    values = dict(data)
    values["checks"] = [check_from_dict(check) for check in values["checks"]]
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
        records = shard.tables[key].records
        # Token ids fit int32 unless a malformed output holds huge values; keep those exact.
        fits = records.size == 0 or (
            records.min() >= np.iinfo(np.int32).min and records.max() <= np.iinfo(np.int32).max
        )
        arrays[f"records_{i}"] = records.astype(np.int32 if fits else np.int64)
        arrays[f"counts_{i}"] = shard.tables[key].counts
    meta = {
        "format_version": SHARD_FORMAT_VERSION,
        "fingerprint": shard.fingerprint,
        "plan": shard.plan,
        "shard": [shard.shard.index, shard.shard.count],
        "tables": [list(key) for key in keys],
        "units": [_unit_to_dict(unit) for _, unit in sorted(shard.units.items())],
        "target_descriptions": shard.target_descriptions,
        "unavailable": shard.unavailable,
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
        ShardMergeError: not a shard file, or of another format version.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"][()]))
            arrays = {name: data[name] for name in data.files if name != "meta"}
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        raise ShardMergeError(f"{path}: not a nightly shard file ({error})") from error
    version = meta.get("format_version")
    if version != SHARD_FORMAT_VERSION:
        raise ShardMergeError(
            f"{path}: shard format version {version!r}, this losslessness reads "
            f"{SHARD_FORMAT_VERSION!r}"
        )
    tables = {
        (target, case_id): CountTable(
            arrays[f"records_{i}"].astype(np.int64), arrays[f"counts_{i}"].astype(np.int64)
        )
        for i, (target, case_id) in enumerate(meta["tables"])
    }
    units = [_unit_from_dict(unit) for unit in meta["units"]]
    return ShardResult(
        plan=meta["plan"],
        fingerprint=meta["fingerprint"],
        shard=ShardSpec(*meta["shard"]),
        units={unit.index: unit for unit in units},
        tables=tables,
        target_descriptions=meta["target_descriptions"],
        unavailable=meta["unavailable"],
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
        plan: the common plan description.
        fingerprint: its fingerprint.
        units: every unit's record, by grid index (complete, no duplicates).
        tables: count tables by (target, case id), summed over shards.
        shards: the shards merged, in the order given.
    """

    plan: dict[str, Any]
    fingerprint: str
    units: dict[int, UnitRecord]
    tables: dict[tuple[str, str], CountTable]
    shards: list[ShardResult]


def merge_shards(shards: list[ShardResult]) -> MergedShards:
    """Check that ``shards`` are parts of one night and sum them.

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
            differences = _differences(first.plan, other.plan) or ["(fingerprints only)"]
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
    expected = int(first.plan["units"])
    missing = sorted(set(range(expected)) - set(units))
    if missing:
        specs = sorted({str(shard.shard) for shard in shards})
        raise ShardMergeError(
            f"{len(missing)} of {expected} units were run by no shard given (shards "
            f"{', '.join(specs)}); first missing grid indices: {missing[:5]}"
        )
    grouped: dict[tuple[str, str], list[CountTable]] = {}
    for shard in shards:
        for key, table in shard.tables.items():
            grouped.setdefault(key, []).append(table)
    tables = {key: merge_tables(parts) for key, parts in sorted(grouped.items())}
    return MergedShards(first.plan, first.fingerprint, units, tables, list(shards))


__all__ = [
    "SHARD_FORMAT_VERSION",
    "CountTable",
    "MergedShards",
    "ShardMergeError",
    "ShardResult",
    "ShardSpec",
    "UnitRecord",
    "count_records",
    "expand_table",
    "load_shard",
    "merge_shards",
    "merge_tables",
    "pair_records",
    "parse_shard_spec",
    "save_shard",
]
