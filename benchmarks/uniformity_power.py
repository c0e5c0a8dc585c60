"""Power of the run-level uniformity check against the mutant zoo, and its false alarms on the
controls (issue 13, item 5).

Audits every chain-protocol entry of :data:`losslessness.zoo.MUTANTS` and of
:data:`~losslessness.zoo.PRECISION_MUTANTS` (greedy and tree entries have no
``law`` p-values: the check is SKIPPED for them; ``--all`` audits them too) with the default
design
(``run_audit``, ``RunConfig(seed=s)``), then applies
:func:`losslessness.checks.pvalues.check_pvalue_uniformity` to each target's checks post hoc at
the run's per-assertion alpha, and prints one row per (mutant, seed): lossy?, caught by the
existing checks?, m (p-values used), the uniformity p-value (KS / HC parts) and whether it
catches the mutant. Summary lines: false alarms of the uniformity check on the controls,
detections on the lossy mutants, and the ones only it catches.

Run: ``.venv/bin/python benchmarks/uniformity_power.py [--seeds 0 1 2] [--names a b] [--all]``
(5 to 40 s per target and seed on two cores).

Measured (default design, per-assertion alpha 1.4e-5, m = 29 usable p-values for most chain
mutants, df >= 2 rule): lossy zoo entries, seeds 0-2 (12 of the 15 chain mutants; not run for
time: draft-sampled-in-bfloat16, match-count-accepts-all, block-verification-wrong-residual):
the existing checks catch 36 of 36 audits, the uniformity check 30 of 36 (missed:
residual-nan-when-p-equals-q, whose loss is exact, and padded-draft-id-used-as-index, m = 11);
it catches nothing the existing checks miss. Controls, seed 0: 0 false alarms in 5 audits
(p-values 0.13, 0.22, 0.80, 0.22, 1.0). Precision mutants, missed by the existing checks every
time: laws-from-float16-logits (TV 0.001-0.003): p 0.077, 0.51 (seeds 0, 1);
laws-from-offset-float16-logits (TV 0.004-0.013): p 1.5e-4, 0.045, 0.030 (seeds 0-2), leaning
towards 0 but above alpha 1.4e-5: not caught at the default design.
"""

from __future__ import annotations

import argparse
import time

from losslessness.cases import ChainCase
from losslessness.checks.pvalues import check_pvalue_uniformity
from losslessness.config import RunConfig
from losslessness.engine.audit import run_audit
from losslessness.results import CheckContext, Verdict
from losslessness.zoo import MUTANTS, PRECISION_MUTANTS, Mutant


def audit_one(entry: Mutant, seed: int) -> dict[str, object]:
    """Audit ``entry`` at the default design with run seed ``seed``; the uniformity check's
    outcome beside the existing checks' verdict."""
    began = time.perf_counter()
    audit = run_audit([entry.adapter], RunConfig(seed=seed))
    target = audit.targets[0]
    caught = any(check.verdict is Verdict.LOSSY for check in target.checks)
    context = CheckContext(
        target=target.name,
        case_id="run",
        case_summary="every case of the run",
        case_hash="",
        alpha=audit.per_assertion_alpha,
        power=audit.config.power,
        tv=audit.config.tv,
        seed=seed,
    )
    result = check_pvalue_uniformity(target.checks, context)
    return {
        "name": entry.name,
        "seed": seed,
        "lossy": entry.lossy,
        "caught": caught,
        "m": result.n,
        "p": result.p_value,
        "ks_p": result.details.get("ks_pvalue"),
        "hc_p": result.details.get("hc_pvalue"),
        "uniformity": result.verdict.value,
        "alpha": audit.per_assertion_alpha,
        "seconds": time.perf_counter() - began,
    }


def _fmt(value: object) -> str:
    return "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def main() -> None:
    """Parse the options, audit, print the table and the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--names", nargs="+", default=None, help="mutant names (default all)")
    parser.add_argument("--all", action="store_true", help="greedy and tree entries too")
    args = parser.parse_args()
    zoo = {**MUTANTS, **PRECISION_MUTANTS}
    names = args.names or [
        name for name, entry in zoo.items() if args.all or isinstance(entry.case, ChainCase)
    ]
    rows = []
    header = "mutant | seed | lossy | caught by checks | m | uniformity p (KS p, HC p) | verdict"
    print(header)
    print("-" * len(header))
    for name in names:
        for seed in args.seeds:
            row = audit_one(zoo[name], seed)
            rows.append(row)
            print(
                f"{row['name']} | {seed} | {row['lossy']} | {row['caught']} | {row['m']} | "
                f"{_fmt(row['p'])} ({_fmt(row['ks_p'])}, {_fmt(row['hc_p'])}) | "
                f"{row['uniformity']}  [{row['seconds']:.0f} s, alpha {row['alpha']:.2g}]",
                flush=True,
            )
    controls = [row for row in rows if not row["lossy"]]
    lossy = [row for row in rows if row["lossy"]]
    tested = [row for row in rows if row["uniformity"] != Verdict.SKIPPED.value]
    print(
        f"controls: {sum(row['uniformity'] == 'LOSSY' for row in controls)} false alarms of "
        f"the uniformity check in {len(controls)} audits "
        f"({sum(row['uniformity'] == 'SKIPPED' for row in controls)} SKIPPED)"
    )
    print(
        f"lossy: uniformity catches {sum(row['uniformity'] == 'LOSSY' for row in lossy)} of "
        f"{len(lossy)} audits, the existing checks {sum(bool(row['caught']) for row in lossy)}; "
        "caught only by uniformity: "
        + ", ".join(
            f"{row['name']}@{row['seed']}"
            for row in lossy
            if row["uniformity"] == "LOSSY" and not row["caught"]
        )
    )
    print(f"{len(tested)} of {len(rows)} audits had >= 10 usable p-values")


if __name__ == "__main__":
    main()
