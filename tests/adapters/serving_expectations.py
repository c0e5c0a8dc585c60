"""The engines' expected serving verdicts per row kind (``tox -e engines``, issue 21).

A real engine's serving audit is LOSSY wherever the engine's speculative path departs from its
own non-speculative law: those row kinds are findings about the engine, documented in its
adapter's docstring, and :data:`EXPECTED_LOSSY` lists them with the mechanism;
:data:`MAY_BE_LOSSY` lists the kinds the mechanism affects that the run's n need not decide.
Every other row kind must PASS, and the seed contract must hold unless
:data:`EXPECTED_IRREPRODUCIBLE` names the engine's mechanism for breaking it.
``python -m tests.adapters.serving_expectations RECORD.json ...`` prints, per target and row
kind, the verdict with the rows tested at position 0, the smallest p-value and the minimum
detectable TV at position 0, plus the seed-contract result, and exits 1 naming every row kind
whose verdict is not the expected one.

A row kind is ``(case id, row label)``; its verdict is LOSSY when any of its checks is LOSSY,
PASS when all pass, else the first other verdict (ERROR, SKIPPED, ...). Structure checks (one
per case, no label), the seed contract and each serving tree case (one request; its tree
checks) are rows of their own (label ``""``).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from losslessness.batteries.serving_tree import SERVING_TREE_CASE_IDS

_V42744 = (
    "vLLM #42744 (fix PR #42802 open): vllm/v1/sample/rejection_sampler.py, "
    "RejectionSampler.apply_logits_processors applies only MinTokensLogitsProcessor of the "
    "logits processors on draft positions: {what} is dropped there"
)
_MIN_P = _V42744.format(what="min-p (MinPLogitsProcessor)")
_BIAS = _V42744.format(what="logit bias (LogitBiasLogitsProcessor)")
_BOTH = _V42744.format(what="logit bias and min-p")

EXPECTED_LOSSY: dict[str, dict[tuple[str, str], str]] = {
    "vllm": {
        ("serving-filters", "min-p 0.15"): _MIN_P,
        ("serving-filters", "logit bias"): _BIAS,
        ("serving-filters", "logit bias + min-p 0.1"): _BOTH,
        ("serving-distinct-b12", "distinct 10: greedy bias"): _BIAS,
    },
}
"""Per target, the row kinds expected LOSSY and why (vLLM 0.33.0 file and function). Rows
without drafts (``distinct 4: min-p 0.2``, ``distinct 8``) reach only the bonus position, where
vLLM's whole ``Sampler`` runs: they are expected to PASS."""

MAY_BE_LOSSY: dict[str, dict[tuple[str, str], str]] = {
    "vllm": {
        ("serving-distinct-b12", "distinct 9: bias"): _BIAS
        + " (one draft, +2 on one token: not decided at the run's n)",
        ("serving-filters", "T 0.7 top-k 6 top-p 0.8 min-p 0.1"): _MIN_P
        + " (after top-k 6 and top-p 0.8 min-p 0.1 removes little: not decided at the run's n)",
        ("serving-min-tokens", "min_tokens inside the block"): (
            "vllm/v1/sample/logits_processor/builtin.py, MinTokensLogitsProcessor.apply at the "
            "bonus position (RejectionSampler.forward -> Sampler, predict_bonus_token=True) "
            "counts the committed output only, not the accepted drafts: stop tokens stay masked "
            "at a bonus past the boundary (pinned exactly by tests/adapters/test_vllm_serving.py; "
            "the bonus is reached too rarely to decide at the run's n)"
        ),
    },
}
"""Per target, row kinds the engine's mechanism affects but the run's n need not detect: either
verdict is accepted (printed with the reason)."""

_SGLANG = "sglang 0.5.23, srt/speculative/eagle_utils.py, eagle_sample: {what}"
_SG_MIN_P = _SGLANG.format(
    what="the verify path applies temperature, top-k and top-p only (lines 697-745): min-p is "
    "ignored"
)
_SG_ORDER = _SGLANG.format(
    what="top-p is cut after the top-k renormalisation (lines 728-743; SGLang #36173, closed "
    "unmerged), where the normal sampler cuts it on the unfiltered probabilities"
)
_SG_PENALTIES = _SGLANG.format(
    what="penalties are computed once for the step (lines 562-585, 'a relaxed version of "
    "penalties'): accepted drafts do not count at later positions"
)
EXPECTED_LOSSY["sglang"] = {
    ("serving-filters", "min-p 0.15"): _SG_MIN_P,
    ("serving-filters", "logit bias + min-p 0.1"): _SG_MIN_P,
    ("serving-filters", "top-k 5 + top-p 0.6"): _SG_ORDER,
    ("serving-filters", "T 0.7 top-k 6 top-p 0.8 min-p 0.1"): _SG_ORDER + "; " + _SG_MIN_P,
    ("serving-penalties", "frequency 0.8 + presence 0.5 + top-k 8"): _SG_PENALTIES,
}
EXPECTED_LOSSY["sglang"][("stree-greedy-min-tokens", "")] = _SGLANG.format(
    what="min_new_tokens is accumulated once for the step and repeated to every node of the "
    "tree (lines 562-585): a greedy request's stop tokens stay masked below the boundary's "
    "depth (greedy tree verify, pinned token for token by "
    "tests/adapters/test_sglang_serving_tree.py)"
)
MAY_BE_LOSSY["sglang"] = {
    (case, label): _SG_PENALTIES + " (the gap lies at positions the run's n cannot resolve)"
    for case, label in (
        ("serving-penalties", "frequency 1.2"),
        ("serving-penalties", "presence 1.5"),
        ("serving-penalties", "repetition 1.8"),
    )
}

SEED_CONTRACT = ("seed-contract", "")
"""The seed contract's row kind in :func:`row_kinds`."""

EXPECTED_IRREPRODUCIBLE: dict[str, str] = {
    "sglang": "sglang 0.5.23, srt/sampling/sampling_batch_info.py, "
    "SamplingBatchInfo.from_schedule_batch: sampling_seed is None unless "
    "--enable-deterministic-inference, so a seeded request draws the batch's shared coins "
    "(SGLang #30822)",
}
"""Per target, why its seed contract is expected broken (verdict IRREPRODUCIBLE)."""


@dataclass
class RowKind:
    """One row kind's checks in a record: their verdicts, n, p-values and TVs."""

    verdicts: list[str] = field(default_factory=list)
    n: int = 0
    p_value: float = 1.0
    min_tv: float = math.inf

    def add(self, check: dict[str, Any]) -> None:
        """Count one check result (a record's JSON object)."""
        self.verdicts.append(check["verdict"])
        if check.get("p_value") is not None:
            self.p_value = min(self.p_value, float(check["p_value"]))
        if check.get("position") in (0, None):
            self.n = max(self.n, int(check.get("n") or 0))
            tv = check.get("min_detectable_tv")
            self.min_tv = min(self.min_tv, math.inf if tv is None else float(tv))

    @property
    def verdict(self) -> str:
        """LOSSY if any check is, PASS if all are, else the first other verdict."""
        if "LOSSY" in self.verdicts:
            return "LOSSY"
        others = [v for v in self.verdicts if v != "PASS"]
        return others[0] if others else "PASS"


def row_kinds(record: dict[str, Any]) -> dict[str, dict[tuple[str, str], RowKind]]:
    """Per target of an audit record, its serving, serving tree and seed-contract row kinds."""
    kinds: dict[str, dict[tuple[str, str], RowKind]] = {}
    for target in record["targets"]:
        rows = kinds.setdefault(target["name"], {})
        for check in target["checks"]:
            serving_tree = check["case_id"] in SERVING_TREE_CASE_IDS
            if not (serving_tree or check["check_id"].startswith(("serving.", "seed."))):
                continue
            label = (check.get("details") or {}).get("label") or ""
            rows.setdefault((check["case_id"], label), RowKind()).add(check)
    return kinds


def merged(
    records: Iterable[dict[str, dict[tuple[str, str], RowKind]]],
) -> dict[str, dict[tuple[str, str], RowKind]]:
    """The row kinds of several records' :func:`row_kinds`, a target's kinds from every record
    that audits it (one engine's serving cases may run in two audits at different n).

    Raises:
        ValueError: a row kind of one target in two records (which n would it be?).
    """
    kinds: dict[str, dict[tuple[str, str], RowKind]] = {}
    for record in records:
        for target, rows in record.items():
            into = kinds.setdefault(target, {})
            for key in rows.keys() & into.keys():
                raise ValueError(f"{target} {key[0]}[{key[1]}] is in two records")
            into.update(rows)
    return kinds


def surprises(
    kinds: dict[str, dict[tuple[str, str], RowKind]],
    expected: dict[str, dict[tuple[str, str], str]],
    undecided: dict[str, dict[tuple[str, str], str]] | None = None,
    irreproducible: dict[str, str] | None = None,
) -> list[str]:
    """Every row kind whose verdict is not the expected one (LOSSY where ``expected`` lists
    it, PASS or LOSSY where ``undecided`` does, IRREPRODUCIBLE for the seed contract of a
    target ``irreproducible`` lists, else PASS), and every row kind ``expected`` lists that
    the record lacks."""
    found = []
    for target, rows in kinds.items():
        lossy = expected.get(target, {})
        either = (undecided or {}).get(target, {})
        for key, row in rows.items():
            if key in either and row.verdict in ("PASS", "LOSSY"):
                continue
            want = "LOSSY" if key in lossy else "PASS"
            if key == SEED_CONTRACT and target in (irreproducible or {}):
                want = "IRREPRODUCIBLE"
            if row.verdict != want:
                found.append(f"{target} {key[0]}[{key[1]}]: expected {want}, got {row.verdict}")
        found += [
            f"{target} {case}[{label}]: expected LOSSY, not in the record"
            for case, label in lossy
            if (case, label) not in rows
        ]
    return found


def table(kinds: dict[str, dict[tuple[str, str], RowKind]]) -> str:
    """The per-target, per-row-kind table printed by :func:`main`."""
    lines = []
    for target, rows in kinds.items():
        lines.append(f"{target}: row kind | verdict | n (pos 0) | min p-value | min TV (pos 0)")
        for (case, label), row in rows.items():
            name = f"{case}[{label}]" if label else case
            lines.append(
                f"  {name} | {row.verdict} | {row.n} | {row.p_value:.3g} | {row.min_tv:.3g}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    """Print the table of the records named in ``argv``; 1 on any surprise, else 0."""
    kinds = merged(row_kinds(json.loads(Path(path).read_text())) for path in argv)
    print(table(kinds))
    found = surprises(kinds, EXPECTED_LOSSY, MAY_BE_LOSSY, EXPECTED_IRREPRODUCIBLE)
    for line in found:
        print("UNEXPECTED:", line)
    for heading, listed in (("expected LOSSY", EXPECTED_LOSSY), ("may be LOSSY", MAY_BE_LOSSY)):
        for target, rows in listed.items():
            for (case, label), why in rows.items():
                if target in kinds:
                    print(f"{heading} {target} {case}[{label}]: {why}")
    for target, why in EXPECTED_IRREPRODUCIBLE.items():
        if target in kinds:
            print(f"expected IRREPRODUCIBLE {target} seed contract: {why}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
