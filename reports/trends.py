"""Trends over nightly runs: each check's history, new failures, power drops and verdicts that
changed with an engine version.

A check is identified across runs by :data:`CheckKey` (target, check id, case id, position,
row); case ids name fixed battery cases, so the same key means the same assertion on the same
exact tensors (the case hash is kept in every record for a stricter comparison by eye).

Three flags, all against the most recent earlier run that has the key:

- **new failure**: the check fails now (LOSSY or ERROR) and did not fail last time;
- **power drop**: the check's minimum detectable TV grew by more than ``power_drop_factor``
  (default :data:`POWER_DROP_FACTOR`), or became infinite: at the same design the run now
  misses violations it used to catch (fewer samples reached the position, a lowered step cap,
  a smaller step multiplier or time budget). Crashed and skipped checks have no power to
  compare and are not flagged;
- **verdict changed with a version**: the check's verdict differs from that run's and an engine
  version in the runs' ``environment`` (every entry but :data:`BASE_ENVIRONMENT`: vllm,
  sglang, flashinfer, transformers, ... as :func:`losslessness.results.run_environment`
  records them) differs too; the flag names the versions (``vllm 0.32.0 -> 0.33.0``), so a
  verdict that moved with an engine upgrade is told apart from one that moved on its own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from losslessness.results import AuditResult, CheckResult, Verdict
from reports.jsonio import audit_from_dict, audit_to_dict, read_json

POWER_DROP_FACTOR = 1.25
"""A minimum detectable TV more than this factor above last run's is flagged as a power drop."""

FAILING = frozenset({Verdict.LOSSY, Verdict.ERROR, Verdict.IRREPRODUCIBLE})
"""Verdicts that count as a failure for the new-failure flag (SUBOPTIMAL is a warning)."""

BASE_ENVIRONMENT = frozenset({"losslessness", "python", "torch", "numpy", "scipy", "platform"})
"""Entries of a run's ``environment`` that are not engines (every other entry is one)."""

ABSENT = "absent"
"""How :func:`engine_version_changes` names an engine a run did not record."""

CheckKey = tuple[str, str, str, int | None, int | None]
"""(target, check_id, case_id, position, row): one assertion across runs."""


def check_key(check: CheckResult) -> CheckKey:
    """The :data:`CheckKey` of ``check``."""
    return (check.target, check.check_id, check.case_id, check.position, check.row)


@dataclass(frozen=True)
class TrendPoint:
    """One run's outcome of one check.

    Attributes:
        run: index into :attr:`Trends.runs` (0 is the oldest run).
        verdict: the check's verdict in that run.
        p_value: its p-value, or None.
        min_detectable_tv: its minimum detectable TV (``inf``: nothing detectable).
    """

    run: int
    verdict: Verdict
    p_value: float | None
    min_detectable_tv: float


@dataclass(frozen=True)
class CheckTrend:
    """History of one check, oldest run first, ending with the current run.

    Attributes:
        key: the check's :data:`CheckKey`.
        where: short location (``case[row r] pos i``) for display.
        points: one :class:`TrendPoint` per run that has the check.
        new_failure: failing now, not failing in the previous run that had the check.
        power_drop: minimum detectable TV grew by more than the factor since that run.
        tv_ratio: current / previous minimum detectable TV, or None when not comparable.
        version_change: when the verdict changed since that run, the engine versions that
            changed too (``("vllm 0.32.0 -> 0.33.0",)``); empty otherwise.
    """

    key: CheckKey
    where: str
    points: tuple[TrendPoint, ...]
    new_failure: bool
    power_drop: bool
    tv_ratio: float | None
    version_change: tuple[str, ...] = ()

    @property
    def verdict_changed_with_version(self) -> bool:
        """Whether the verdict changed since the previous run while an engine version did."""
        return bool(self.version_change)

    @property
    def flags(self) -> list[str]:
        """The raised flags as text (``"verdict changed with vllm 0.32.0 -> 0.33.0"``)."""
        names = []
        if self.new_failure:
            names.append("new failure")
        if self.power_drop:
            names.append("power drop")
        if self.version_change:
            names.append("verdict changed with " + ", ".join(self.version_change))
        return names

    @property
    def flagged(self) -> bool:
        """Whether any flag is raised."""
        return self.new_failure or self.power_drop or self.verdict_changed_with_version


@dataclass(frozen=True)
class Trends:
    """Histories of every check of the current run.

    Attributes:
        runs: ``started_at`` of every run, oldest first; the last is the current run.
        checks: one :class:`CheckTrend` per check of the current run, in its order.
        power_drop_factor: the factor the power-drop flag used.
        skipped_sources: (source, reason) for history files that could not be used.
    """

    runs: tuple[str, ...]
    checks: tuple[CheckTrend, ...]
    power_drop_factor: float
    skipped_sources: tuple[tuple[str, str], ...] = ()

    @property
    def new_failures(self) -> list[CheckTrend]:
        """Checks flagged as new failures."""
        return [trend for trend in self.checks if trend.new_failure]

    @property
    def power_drops(self) -> list[CheckTrend]:
        """Checks flagged with a power drop."""
        return [trend for trend in self.checks if trend.power_drop]

    @property
    def version_changes(self) -> list[CheckTrend]:
        """Checks whose verdict changed while an engine version changed."""
        return [trend for trend in self.checks if trend.verdict_changed_with_version]


def engine_version_changes(before: dict[str, str], now: dict[str, str]) -> tuple[str, ...]:
    """The engine versions that differ between two runs' ``environment`` records.

    Args:
        before: the earlier run's :attr:`AuditResult.environment`.
        now: the later run's.

    Returns:
        ``"name old -> new"`` per engine (every key outside :data:`BASE_ENVIRONMENT`) whose
        version differs, sorted by name; a side that did not record it reads
        :data:`ABSENT`. Empty when no engine version changed.
    """
    engines = sorted((set(before) | set(now)) - BASE_ENVIRONMENT)
    return tuple(
        f"{name} {before.get(name, ABSENT)} -> {now.get(name, ABSENT)}"
        for name in engines
        if before.get(name) != now.get(name)
    )


def _power_dropped(
    previous: TrendPoint, current: TrendPoint, factor: float
) -> tuple[bool, float | None]:
    uncomparable = {Verdict.ERROR, Verdict.SKIPPED}
    if previous.verdict in uncomparable or current.verdict in uncomparable:
        return False, None
    before, now = previous.min_detectable_tv, current.min_detectable_tv
    if math.isinf(before):
        return False, None
    if math.isinf(now):
        return True, math.inf
    ratio = now / before if before > 0 else (1.0 if now == 0 else math.inf)
    return ratio > factor, ratio


def compute_trends(
    current: AuditResult,
    history: Sequence[AuditResult],
    power_drop_factor: float = POWER_DROP_FACTOR,
    skipped_sources: Sequence[tuple[str, str]] = (),
) -> Trends:
    """Each check's history over ``history`` then ``current``, with the three flags.

    Args:
        current: this run.
        history: earlier runs in any order; they are sorted by ``started_at``, and a run whose
            record equals ``current``'s (the current report.json found in a history
            directory) is dropped.
        power_drop_factor: flag a power drop above this ratio of minimum detectable TVs
            (> 1).
        skipped_sources: history files that could not be read, to show in the report.

    Returns:
        :class:`Trends`.

    Raises:
        ValueError: ``power_drop_factor`` is not > 1.
    """
    if not power_drop_factor > 1:
        raise ValueError(f"power_drop_factor: must be > 1, got {power_drop_factor}")
    current_record = audit_to_dict(current)
    earlier = sorted(
        (run for run in history if audit_to_dict(run) != current_record),
        key=lambda run: run.started_at,
    )
    runs = [*earlier, current]
    past: dict[CheckKey, list[TrendPoint]] = {}
    for index, run in enumerate(earlier):
        for target in run.targets:
            for check in target.checks:
                point = TrendPoint(index, check.verdict, check.p_value, check.min_detectable_tv)
                past.setdefault(check_key(check), []).append(point)
    trends = []
    for target in current.targets:
        for check in target.checks:
            key = check_key(check)
            now = TrendPoint(len(earlier), check.verdict, check.p_value, check.min_detectable_tv)
            before = past.get(key, [])
            new_failure, power_drop, ratio = False, False, None
            version_change: tuple[str, ...] = ()
            if before:
                previous = before[-1]
                new_failure = now.verdict in FAILING and previous.verdict not in FAILING
                power_drop, ratio = _power_dropped(previous, now, power_drop_factor)
                if now.verdict is not previous.verdict:
                    version_change = engine_version_changes(
                        earlier[previous.run].environment, current.environment
                    )
            trends.append(
                CheckTrend(
                    key,
                    check.where,
                    (*before, now),
                    new_failure,
                    power_drop,
                    ratio,
                    version_change,
                )
            )
    return Trends(
        runs=tuple(run.started_at for run in runs),
        checks=tuple(trends),
        power_drop_factor=power_drop_factor,
        skipped_sources=tuple(skipped_sources),
    )


def _is_audit_record(path: Path) -> tuple[dict[str, Any] | None, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return None, f"not readable as JSON: {error}"
    if not isinstance(data, dict) or "schema_version" not in data or "targets" not in data:
        return None, "not an audit record (no schema_version/targets)"
    return data, ""


def load_history(
    sources: Iterable[AuditResult | str | Path],
) -> tuple[list[AuditResult], list[tuple[str, str]]]:
    """Read earlier runs from records, JSON files and directories.

    A named file must be an audit record (:func:`reports.jsonio.write_json`); a directory
    contributes every ``*.json`` below it that is one, and files below it that are not, or
    that have another schema version, are skipped and listed (a nightly history directory
    outlives schema versions).

    Args:
        sources: :class:`AuditResult` objects, JSON files or directories.

    Returns:
        (runs, skipped): the records read, and (path, reason) for each file skipped.

    Raises:
        FileNotFoundError: a named path does not exist.
        ValueError: a named file is not an audit record of this schema version (the message
            names the file).
    """
    runs: list[AuditResult] = []
    skipped: list[tuple[str, str]] = []
    for source in sources:
        if isinstance(source, AuditResult):
            runs.append(source)
            continue
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"history: {path} does not exist")
        if path.is_file():
            try:
                runs.append(read_json(path))
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                raise ValueError(
                    f"history: {path} is not a usable audit record: {error}"
                ) from error
            continue
        for candidate in sorted(path.rglob("*.json")):
            data, reason = _is_audit_record(candidate)
            if data is None:
                skipped.append((str(candidate), reason))
                continue
            try:
                runs.append(audit_from_dict(data))
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                skipped.append((str(candidate), str(error)))
    return runs, skipped
