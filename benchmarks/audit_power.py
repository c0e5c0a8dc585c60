"""Measure the default audit's verdicts over many run seeds: false alarms of the correct
verifiers (reference, and the lossless-but-suboptimal sample-and-match control) and detection
of the deliberately wrong verifiers of ``tests/wrong_verifiers.py``.

    PYTHONPATH=. python benchmarks/audit_power.py --seeds 10

Prints, per target, how many runs ended LOSSLESS / SUBOPTIMAL / LOSSY / ERROR and the wall
time per audit. Run from the repository root (the wrong verifiers live in ``tests``).
"""

from __future__ import annotations

import argparse
import collections
import time

from losslessness.config import AuditConfig
from losslessness.engine import run_audit
from losslessness.targets import resolve_adapter

TARGETS = (
    "reference",
    "tests.wrong_verifiers:sample_and_match",
    "tests.wrong_verifiers:residual_is_target",
    "tests.wrong_verifiers:bonus_from_wrong_row",
    "tests.wrong_verifiers:ratio_inverted",
    "tests.wrong_verifiers:acceptance_never_stops",
)


def main() -> None:
    """Parse arguments, run the audits, print one line per target."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=10, help="run seeds 0..N-1 per target")
    parser.add_argument("--targets", nargs="*", default=list(TARGETS))
    arguments = parser.parse_args()
    for name in arguments.targets:
        adapter = resolve_adapter(name)
        verdicts: collections.Counter[str] = collections.Counter()
        began = time.perf_counter()
        for seed in range(arguments.seeds):
            result = run_audit([adapter], AuditConfig(seed=seed))
            verdicts[result.targets[0].verdict.value] += 1
        per_audit = (time.perf_counter() - began) / arguments.seeds
        counts = ", ".join(f"{verdict} {count}" for verdict, count in sorted(verdicts.items()))
        print(f"{name}: {counts} of {arguments.seeds} runs; {per_audit:.1f} s per audit")


if __name__ == "__main__":
    main()
