"""The engine targets' expected verdicts on ``tox -e e2e`` (issue 22), and the table its closing
note quotes.

A whole engine's audit is LOSSY where its speculative decoding departs from its own
non-speculative law: :data:`EXPECTED` names those targets with the mechanism in the engine's
source (file, function, version), and the targets lossy by design (positive controls). Every
other engine target must come out LOSSLESS. ``python -m tests.e2e.expectations REPORT.json``
prints, per target and case, the verdict, n, p-value, minimum detectable TV, the engine's
acceptance counters and the seed contract, and per target its time and engine version, then
exits 1 naming every target whose verdict is not the
expected one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from losslessness.adapters.e2e.openvino import DRAFT_LOSSY_REASON
from losslessness.adapters.e2e.vllm_cpu import SAMPLED_LOSSY_REASON

EXPECTED: dict[str, tuple[str, str]] = {
    "e2e/llama.cpp-synthetic": (
        "LOSSY",
        "by design: --spec-synth-len accepts drafts at a fixed rate "
        "(server_sample_and_accept_synth, tools/server/server-context.cpp)",
    ),
    "e2e/openvino-draft": ("LOSSY", f"finding: {DRAFT_LOSSY_REASON}"),
    **{
        f"e2e/vllm-{drafter}": ("LOSSY", f"finding: {SAMPLED_LOSSY_REASON}")
        for drafter in ("draft", "draft-probabilistic", "ngram", "eagle")
    },
}
"""Targets expected LOSSY, with why. Every other engine target is expected LOSSLESS."""


def expected_verdict(target: str) -> str:
    """The verdict ``target`` must get."""
    return EXPECTED.get(target, ("LOSSLESS", ""))[0]


def rows(record: dict[str, Any]) -> list[list[str]]:
    """One row per target and end-to-end case: target, case, check verdicts, n, p-value,
    minimum detectable TV, drafts accepted, the seed contract."""
    table = []
    for target in record["targets"]:
        by_case: dict[str, dict[str, Any]] = {}
        for check in target["checks"]:
            by_case.setdefault(check["case_id"], {})[check["check_id"]] = check
        for case, checks in sorted(by_case.items()):
            law = checks.get("sequence-law") or checks.get("sequence-greedy")
            drafts = checks.get("drafts-accepted")
            seeds = checks.get("seed.contract")
            if law is None:
                continue
            p_value, tv = law.get("p_value"), law.get("min_detectable_tv")
            table.append([
                target["name"], case.rsplit("/", 1)[-1],
                f"{law['check_id']} {law['verdict']}",
                "-" if law.get("n") is None else str(law["n"]),
                "-" if p_value is None else f"{p_value:.3g}",
                "-" if tv is None else f"{tv:.3g}",
                "-" if drafts is None else drafts["message"][:60],
                "-" if seeds is None else f"seeds {seeds['verdict']}",
            ])
    return table


def main(paths: list[str]) -> int:
    """Print the table of every record and return 1 if a verdict is not the expected one."""
    wrong = []
    for path in paths:
        record = json.loads(Path(path).read_text())
        print(f"{path}:")
        for row in rows(record):
            print("  " + " | ".join(row))
        for target in record["targets"]:
            name, verdict = target["name"], target["verdict"]
            expected = expected_verdict(name)
            reason = EXPECTED.get(name, ("", ""))[1]
            print(f"{name}: {verdict} (expected {expected}{'; ' + reason if reason else ''}; "
                  f"{target['wall_time_s']:.0f} s) -- {target['description']}")
            if verdict != expected:
                wrong.append(f"{name}: {verdict}, expected {expected}")
    for line in wrong:
        print("UNEXPECTED " + line)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
