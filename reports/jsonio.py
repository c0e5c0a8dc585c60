"""JSON form of an :class:`AuditResult` (schema version :data:`SCHEMA_VERSION`; the reader also
takes the versions of :data:`READABLE_SCHEMA_VERSIONS`).

Layout: the dataclass fields of AuditResult, AuditConfig, TargetResult and CheckResult as
JSON objects; enums as their string values; tuples as arrays; non-finite floats (an infinite
minimum detectable TV: nothing detectable at that n) as ``null``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from losslessness.config import RENAMED_FIELDS, AuditConfig
from losslessness.records import RecordError, validate_record
from losslessness.results import (
    JSON_NULL_FLOATS,
    SCHEMA_VERSION,
    AuditResult,
    TargetResult,
    TargetVerdict,
    check_from_dict,
)

READABLE_SCHEMA_VERSIONS = ("2", "3", SCHEMA_VERSION)
"""Schema versions :func:`audit_from_dict` reads. Version 3 differs from 4 only in lacking
``targets[].full_messages`` (read as empty). Version 2 differs from 3 only in the name of
``config.budget`` (now ``config.step_multiplier``), which
:meth:`~losslessness.config.RunConfig.from_json` reads under either name; so the trends still
compare against nights recorded before the rename."""


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "value") and isinstance(value.value, str):
        return value.value
    return value


def audit_to_dict(result: AuditResult) -> dict[str, Any]:
    """The JSON-able dictionary of ``result`` (see the module docstring for the layout)."""
    data: dict[str, Any] = _plain(dataclasses.asdict(result))
    return data


def _config_fields(data: Any) -> Any:
    """A record's ``config`` object with its old field names (:data:`RENAMED_FIELDS`) read as
    the current ones."""
    if not isinstance(data, dict):
        return data
    return {RENAMED_FIELDS.get(key, key): value for key, value in data.items()}


def audit_from_dict(data: Any) -> AuditResult:
    """Rebuild an :class:`AuditResult` from :func:`audit_to_dict`'s output, or from a record of
    an earlier readable version (:data:`READABLE_SCHEMA_VERSIONS`), which comes back in the
    current layout (``schema_version`` :data:`SCHEMA_VERSION`).

    The record is validated first, field by field, against the types of the dataclasses it is
    read into (:func:`losslessness.records.validate_record`): a record from disk is anyone's.

    Raises:
        RecordError: (a ValueError) ``data`` is not an object, the schema version is not one
            of :data:`READABLE_SCHEMA_VERSIONS`, or a field is missing, unknown, of the wrong
            type or out of range; the message starts with the field's path
            (``targets[0].checks[3].p_value: expected a number, got 'abc'``).
    """
    if not isinstance(data, dict):
        raise RecordError(f"the record: expected an object, got {type(data).__name__}")
    if data.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
        raise RecordError(
            f"schema_version: expected one of {READABLE_SCHEMA_VERSIONS!r}, "
            f"got {data.get('schema_version')!r}"
        )
    data = {**data, "config": _config_fields(data.get("config"))}
    validate_record(data, AuditResult, nullable_floats=JSON_NULL_FLOATS)
    targets = []
    for index, target in enumerate(data["targets"]):
        values = dict(target)
        values["verdict"] = TargetVerdict(values["verdict"])
        checks = []
        for number, check in enumerate(values["checks"]):
            try:
                checks.append(check_from_dict(check))
            except ValueError as error:
                raise RecordError(f"targets[{index}].checks[{number}].{error}") from error
        values["checks"] = checks
        targets.append(TargetResult(**values))
    values = dict(data)
    values["schema_version"] = SCHEMA_VERSION
    try:
        values["config"] = AuditConfig.from_json(data["config"])
    except ValueError as error:
        raise RecordError(f"config.{error}") from error
    values["targets"] = targets
    return AuditResult(**values)


def write_json(result: AuditResult, path: str | Path) -> None:
    """Write ``result`` to ``path`` as indented JSON (strict: no NaN or Infinity literals),
    atomically: a temporary file beside it, then a rename, so a reader (or an interrupted run)
    never sees half a record.

    Raises:
        OSError: the file cannot be written (missing folder, no permission, disk full); no
            partial file is left at ``path``.
    """
    target = Path(path)
    text = json.dumps(audit_to_dict(result), indent=2, allow_nan=False) + "\n"
    temporary = target.with_name(target.name + ".tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def _reject_constant(name: str) -> Any:
    raise RecordError(f"not strict JSON: {name} (the writer stores a non-finite number as null)")


def read_json(path: str | Path) -> AuditResult:
    """Read an :class:`AuditResult` written by :func:`write_json`.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not UTF-8 text (UnicodeDecodeError), not strict JSON
            (json.JSONDecodeError; :class:`RecordError` for NaN or Infinity), or not an audit
            record (:class:`RecordError`, naming the field, from :func:`audit_from_dict`).
    """
    text = Path(path).read_text(encoding="utf-8")
    return audit_from_dict(json.loads(text, parse_constant=_reject_constant))
