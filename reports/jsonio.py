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

from losslessness.config import AuditConfig
from losslessness.results import (
    SCHEMA_VERSION,
    AuditResult,
    TargetResult,
    TargetVerdict,
    check_from_dict,
)

READABLE_SCHEMA_VERSIONS = ("2", SCHEMA_VERSION)
"""Schema versions :func:`audit_from_dict` reads. Version 2 differs from 3 only in the name of
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


def audit_from_dict(data: dict[str, Any]) -> AuditResult:
    """Rebuild an :class:`AuditResult` from :func:`audit_to_dict`'s output, or from a record of
    an earlier readable version (:data:`READABLE_SCHEMA_VERSIONS`), which comes back in the
    current layout (``schema_version`` :data:`SCHEMA_VERSION`).

    Raises:
        ValueError: the schema version is not one of :data:`READABLE_SCHEMA_VERSIONS`.
    """
    if data.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
        raise ValueError(
            f"schema_version: expected one of {READABLE_SCHEMA_VERSIONS!r}, "
            f"got {data.get('schema_version')!r}"
        )

    targets = []
    for target in data["targets"]:
        values = dict(target)
        values["verdict"] = TargetVerdict(values["verdict"])
        values["checks"] = [check_from_dict(check) for check in values["checks"]]
        targets.append(TargetResult(**values))
    values = dict(data)
    values["schema_version"] = SCHEMA_VERSION
    values["config"] = AuditConfig.from_json(data["config"])
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


def read_json(path: str | Path) -> AuditResult:
    """Read an :class:`AuditResult` written by :func:`write_json`."""
    loaded: dict[str, Any] = json.loads(Path(path).read_text())
    return audit_from_dict(loaded)
