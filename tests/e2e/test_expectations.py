"""``tests/e2e/expectations.py``, which decides ``tox -e e2e``: its table prints a case whose
check crashed (no n, no p-value, no minimum detectable TV), and it fails a night whose target
got another verdict than expected, and only then."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.expectations import expected_verdict, main, rows


def _record(verdict: str) -> dict[str, object]:
    crashed = {"case_id": "e2e/vllm-draft/t1-prompt0", "check_id": "sequence-law",
               "verdict": "ERROR", "n": None, "p_value": None, "min_detectable_tv": None}
    passed = {"case_id": "e2e/vllm-draft/greedy-prompt3", "check_id": "sequence-greedy",
              "verdict": "PASS", "n": 32, "p_value": 1.0, "min_detectable_tv": 0.0694}
    drafts = {"case_id": "e2e/vllm-draft/greedy-prompt3", "check_id": "drafts-accepted",
              "verdict": "PASS", "message": "128 of 192 draft tokens accepted (66.7%)"}
    return {"targets": [{"name": "e2e/vllm-draft", "verdict": verdict, "wall_time_s": 1.0,
                         "description": "vLLM", "checks": [crashed, passed, drafts]}]}


def test_a_crashed_check_prints_dashes_and_the_others_their_numbers() -> None:
    """A crashed law check has no n, p-value or minimum detectable TV: '-' in their columns."""
    table = {row[1]: row for row in rows(_record("LOSSY"))}
    assert table["t1-prompt0"][2:6] == ["sequence-law ERROR", "-", "-", "-"]
    assert table["greedy-prompt3"][3:6] == ["32", "1", "0.0694"]
    assert table["greedy-prompt3"][6].startswith("128 of 192")


def test_the_night_fails_only_when_a_verdict_is_not_the_expected_one(tmp_path: Path) -> None:
    """vllm-draft is expected LOSSY (a finding): a LOSSY night passes, a LOSSLESS one fails."""
    assert expected_verdict("e2e/vllm-draft") == "LOSSY"
    assert expected_verdict("e2e/onnxruntime-genai-draft") == "LOSSLESS"
    for verdict, code in (("LOSSY", 0), ("LOSSLESS", 1)):
        path = tmp_path / f"{verdict}.json"
        path.write_text(json.dumps(_record(verdict)))
        assert main([str(path)]) == code
