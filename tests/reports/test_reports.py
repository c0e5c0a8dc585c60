"""Reports: the JSON record round-trips exactly (strict JSON, infinities as null) and the
terminal table shows n, alpha, power and minimum detectable TV for every check."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import pytest
from rich.console import Console

from losslessness.config import AuditConfig
from losslessness.engine import run_audit
from losslessness.results import SCHEMA_VERSION, AuditResult
from losslessness.targets import UnavailableTarget, resolve_adapter
from reports import audit_from_dict, audit_to_dict, print_audit, read_json, write_json


@pytest.fixture(scope="module")
def result() -> AuditResult:
    config = AuditConfig(cases=("v2-tilted", "edge-disjoint", "greedy-v8-ties"), seed=3)
    targets = [resolve_adapter("reference"), UnavailableTarget("missing", "not installed")]
    return run_audit(targets, config)


def test_json_round_trip_is_exact(result: AuditResult, tmp_path: Path) -> None:
    """write_json then read_json gives back the same record, field for field."""
    path = tmp_path / "audit.json"
    write_json(result, path)
    again = read_json(path)
    assert audit_to_dict(again) == audit_to_dict(result)
    assert again.config == result.config
    assert again.exit_code == result.exit_code == 3


def test_json_is_strict_and_keeps_infinities_as_null(result: AuditResult, tmp_path: Path) -> None:
    """No NaN/Infinity literals: an infinite minimum detectable TV is stored as null and
    read back as inf."""
    path = tmp_path / "audit.json"
    write_json(result, path)
    text = path.read_text()
    assert "Infinity" not in text and "NaN" not in text
    data = json.loads(text)
    skipped = [c for c in data["targets"][0]["checks"] if c["verdict"] == "SKIPPED"]
    assert skipped and all(c["min_detectable_tv"] is None for c in skipped)
    again = audit_from_dict(data)
    assert all(
        math.isinf(c.min_detectable_tv)
        for c in again.targets[0].checks
        if c.verdict.value == "SKIPPED"
    )


def test_wrong_schema_version_is_rejected(result: AuditResult) -> None:
    """Reading a record of another schema version fails with a clear error."""
    data = audit_to_dict(result)
    data["schema_version"] = "0"
    with pytest.raises(ValueError, match="schema_version"):
        audit_from_dict(data)


def test_a_version_2_record_reads_its_budget_as_the_step_multiplier(result: AuditResult) -> None:
    """A record of schema version 2 (``config.budget``, before the rename) reads into the
    current layout: the same record, ``step_multiplier`` from ``budget``, the current version."""
    data = audit_to_dict(result)
    config = dict(data["config"])
    config["budget"] = config.pop("step_multiplier") * 2
    old = {**data, "schema_version": "2", "config": config}
    again = audit_from_dict(old)
    assert again.schema_version == SCHEMA_VERSION
    assert again.config.step_multiplier == 2 * result.config.step_multiplier
    assert audit_to_dict(again) == {
        **data,
        "config": {**data["config"], "step_multiplier": 2 * result.config.step_multiplier},
    }


def test_terminal_table_shows_design_numbers(result: AuditResult) -> None:
    """The printed table has n, alpha, power and min TV columns, the per-assertion level,
    and the unavailable target's reason."""
    buffer = io.StringIO()
    print_audit(result, Console(file=buffer, width=200))
    text = buffer.getvalue()
    for column in ("n", "alpha", "power", "min TV", "verdict", "p-value"):
        assert column in text
    assert f"{result.per_assertion_alpha:.3g}" in text
    assert "not installed" in text
    assert "LOSSLESS" in text and "ERROR" in text


def test_terminal_table_names_serving_row_kinds_by_their_label(result: AuditResult) -> None:
    """A check with a row label (a serving row kind) prints ``case[label]``; one with only a
    row index ``case[row]``; a whole-case check of a multi-row case (row None) the bare case."""
    check = result.targets[0].checks[0]
    labelled = dataclasses.replace(check, case_id="serving-x", row=1, n_rows=2,
                                   details={"label": "top-k 4"})
    indexed = dataclasses.replace(check, case_id="case-y", row=1, n_rows=2, details={})
    whole = dataclasses.replace(check, case_id="case-z", row=None, n_rows=3,
                                details={"label": None})
    target = dataclasses.replace(result.targets[0], checks=[labelled, indexed, whole])
    buffer = io.StringIO()
    print_audit(dataclasses.replace(result, targets=[target]), Console(file=buffer, width=200))
    text = buffer.getvalue()
    assert "serving-x[top-k 4]" in text and "case-y[1]" in text
    assert "case-z " in text and "case-z[" not in text
