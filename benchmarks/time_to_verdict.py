"""Time to a LOSSY verdict for every lossy mutant of the zoo: the sequential design (early stop,
the default) against the fixed design (``--no-early-stop``: every planned step sampled).

Each mutant is audited in-process as ``losslessness audit mutant/<name>`` would audit it (the
default design: TV 0.05, power 0.9, family-wise alpha 1e-3, seed 0), once per design; the time
is the run's wall time (planning, sampling and checks; not the interpreter's start-up). Prints
a markdown table, the median and the worst ratio, and writes them as JSON with ``--json``.

Run: ``python benchmarks/time_to_verdict.py [--json FILE] [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from losslessness.config import RunConfig
from losslessness.engine import run_audit
from losslessness.results import TargetVerdict
from losslessness.targets import resolve_adapter
from losslessness.zoo import MUTANTS


def time_to_verdict(name: str, early_stop: bool) -> tuple[float, str, int, str | None]:
    """(seconds, verdict, verify steps, why it stopped early) of one audit of a mutant."""
    adapter = resolve_adapter(f"mutant/{name}")
    began = time.perf_counter()
    result = run_audit([adapter], RunConfig(early_stop=early_stop))
    seconds = time.perf_counter() - began
    target = result.targets[0]
    return seconds, target.verdict.value, target.verify_steps, target.stopped_early


def main() -> None:
    """Measure every lossy mutant (or ``--only`` ones) and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    names = [name for name, entry in MUTANTS.items() if entry.lossy]
    if args.only:
        names = [name for name in names if name in args.only]
    rows = []
    print("| mutant | fixed: s | fixed: steps | sequential: s | sequential: steps | ratio | "
          "stopped on |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name in names:
        fixed_s, fixed_verdict, fixed_steps, _ = time_to_verdict(name, early_stop=False)
        seq_s, seq_verdict, seq_steps, stopped = time_to_verdict(name, early_stop=True)
        if TargetVerdict.LOSSY.value not in (fixed_verdict, seq_verdict):
            raise SystemExit(f"{name}: not LOSSY ({fixed_verdict}, {seq_verdict})")
        ratio = seq_s / fixed_s
        rows.append(
            {
                "mutant": name,
                "fixed_s": fixed_s,
                "fixed_steps": fixed_steps,
                "fixed_verdict": fixed_verdict,
                "sequential_s": seq_s,
                "sequential_steps": seq_steps,
                "sequential_verdict": seq_verdict,
                "ratio": ratio,
                "stopped": stopped,
            }
        )
        where = (stopped or "not stopped").split("(", 1)[-1].split(":", 1)[0]
        print(f"| {name} | {fixed_s:.2f} | {fixed_steps} | {seq_s:.2f} | {seq_steps} | "
              f"{ratio:.3f} | {where} |", flush=True)
    ratios = [row["ratio"] for row in rows]
    summary = {"median_ratio": statistics.median(ratios), "worst_ratio": max(ratios),
               "mutants": len(rows)}
    print(f"\nmedian ratio {summary['median_ratio']:.3f}, worst {summary['worst_ratio']:.3f} "
          f"over {len(rows)} lossy mutants")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, **summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
