"""Measure the identity test's false-alarm rate under the null, per pooling floor.

Reproduces the table behind ``losslessness.stats.identity.EXPECTED_COUNT_FLOOR``:

    PYTHONPATH=. python benchmarks/calibrate_expected_floor.py [--scale 1.0] [--jobs 2]

For each named regime (a null distribution p), sample size n and candidate floor, it draws
multinomial(n, p) replicates with numpy (fixed seeds), computes the identity test's p-value on
each (``identity_test_pvalues``: the same partition and statistic as ``identity_test``,
vectorised over replicates) and reports the false-alarm rate
at alpha = 1e-2, 1e-3, 1e-4 with a 95% Clopper-Pearson interval
(``statsmodels.stats.proportion.proportion_confint(method="beta")``) and the one-sided exact
binomial p-value of "rate > alpha" (``scipy.stats.binomtest(alternative="greater")``).

A floor *qualifies* at a level when no cell with df > 0 is significantly above nominal
(one-sided p < 1e-3; with about 50 cells per floor and level that keeps the chance of wrongly
disqualifying a calibrated floor near 5%). The chosen floor is the smallest that qualifies at
1e-3 and 1e-4.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import time

import numpy as np
import scipy.special
import scipy.stats
from numpy.typing import NDArray
from statsmodels.stats.proportion import proportion_confint

from losslessness.stats.identity import identity_test_pvalues, pooling_partition

FLOORS = (1.0, 5.0, 10.0, 20.0)
ALPHAS = (1e-2, 1e-3, 1e-4)
SAMPLE_SIZES = (50, 500, 5000, 50000)
SIGNIFICANCE = 1e-3
MAX_CELLS_PER_CHUNK = 2**24  # rows * V per multinomial draw, bounds memory near 128 MiB
SEED = 20240601


def _regimes() -> dict[str, tuple[NDArray[np.float64], int]]:
    """Named null distributions and their replicate counts (before --scale)."""
    rng = np.random.default_rng(SEED)
    dense8 = rng.dirichlet(np.ones(8))
    zeros64 = rng.dirichlet(np.ones(64))
    zeros64[rng.choice(64, size=16, replace=False)] = 0.0  # exact zeros: excluded, checked exactly
    zeros64 /= zeros64.sum()
    peaked = scipy.special.softmax(rng.standard_normal(1000) / 0.3)
    flat = rng.dirichlet(np.full(4096, 50.0))
    return {
        "V2 [0.3, 0.7]": (np.array([0.3, 0.7]), 1_000_000),
        "V2 [1e-4, 1-1e-4]": (np.array([1e-4, 1.0 - 1e-4]), 1_000_000),
        "V8 Dirichlet(1)": (dense8, 1_000_000),
        "V64 Dirichlet(1), 16 zeros": (zeros64, 1_000_000),
        "V1000 peaked (softmax N(0,1)/0.3)": (peaked, 1_000_000),
        "V4096 Dirichlet(50)": (flat, 50_000),
    }


@dataclasses.dataclass
class Cell:
    regime: str
    n: int
    floor: float
    df: int
    pooled_mass: float
    replicates: int
    alarms: dict[float, int]


def _run_task(
    regime: str, p: NDArray[np.float64], n: int, replicates: int, seed: int
) -> list[Cell]:
    rng = np.random.default_rng(seed)
    chunk = max(1, MAX_CELLS_PER_CHUNK // p.size)
    alarms = {floor: dict.fromkeys(ALPHAS, 0) for floor in FLOORS}
    done = 0
    while done < replicates:
        rows = min(chunk, replicates - done)
        counts = rng.multinomial(n, p, size=rows)
        for floor in FLOORS:
            pvalues = identity_test_pvalues(counts, p, expected_floor=floor)
            for alpha in ALPHAS:
                alarms[floor][alpha] += int(np.count_nonzero(pvalues <= alpha))
        done += rows
    cells = []
    for floor in FLOORS:
        _, df, pooled_mass = pooling_partition(p, n, floor)
        cells.append(Cell(regime, n, floor, df, pooled_mass, replicates, alarms[floor]))
    return cells


def _one_sided_pvalue(alarms: int, replicates: int, alpha: float) -> float:
    return float(scipy.stats.binomtest(alarms, replicates, alpha, alternative="greater").pvalue)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply replicate counts")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--only", default="", help="run only regimes whose name contains this")
    args = parser.parse_args()

    regimes = {name: spec for name, spec in _regimes().items() if args.only in name}
    tasks = []
    all_names = list(_regimes())
    seeds = np.random.SeedSequence(SEED).spawn(len(all_names) * len(SAMPLE_SIZES))
    for name, (p, replicates) in regimes.items():
        index = all_names.index(name)  # seeds do not depend on --only
        for j, n in enumerate(SAMPLE_SIZES):
            seed = int(seeds[index * len(SAMPLE_SIZES) + j].generate_state(1)[0])
            tasks.append((name, p, n, max(1, int(replicates * args.scale)), seed))

    start = time.perf_counter()
    cells: list[Cell] = []
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(_run_task, *task) for task in tasks]
        for future in futures:
            cells.extend(future.result())
    elapsed = time.perf_counter() - start

    print(f"# identity-test false-alarm rate under the null ({elapsed:.0f} s, seed {SEED})")
    print("# rate / alpha with 95% Clopper-Pearson interval; * = significantly above nominal")
    print(f"# (one-sided exact binomial p < {SIGNIFICANCE:g}); df 0 = nothing tested")
    header = f"{'regime':36s} {'n':>6s} {'floor':>5s} {'df':>5s} {'pooled':>7s} {'R':>8s}"
    for alpha in ALPHAS:
        header += f" {'alpha=' + format(alpha, 'g'):>24s}"
    print(header)
    worst: dict[tuple[float, float], float] = {}
    flagged: dict[tuple[float, float], int] = {}
    for cell in sorted(cells, key=lambda c: (c.floor, list(regimes).index(c.regime), c.n)):
        line = (
            f"{cell.regime:36s} {cell.n:6d} {cell.floor:5g} {cell.df:5d} "
            f"{cell.pooled_mass:7.4f} {cell.replicates:8d}"
        )
        for alpha in ALPHAS:
            alarms = cell.alarms[alpha]
            low, high = proportion_confint(alarms, cell.replicates, alpha=0.05, method="beta")
            significant = (
                cell.df > 0 and _one_sided_pvalue(alarms, cell.replicates, alpha) < SIGNIFICANCE
            )
            key = (cell.floor, alpha)
            flagged[key] = flagged.get(key, 0) + int(significant)
            if cell.df > 0:
                worst[key] = max(worst.get(key, 0.0), alarms / cell.replicates / alpha)
            line += (
                f" {alarms / cell.replicates / alpha:6.2f} [{low / alpha:5.2f},{high / alpha:6.2f}]"
                f"{'*' if significant else ' '}"
            )
        print(line)
    print()
    print("# summary: worst measured rate/alpha over cells with df > 0; cells flagged *")
    for floor in FLOORS:
        parts = [
            f"alpha={alpha:g}: worst {worst.get((floor, alpha), 0.0):.2f}, "
            f"flagged {flagged[(floor, alpha)]}"
            for alpha in ALPHAS
        ]
        print(f"floor {floor:4g}: " + "; ".join(parts))
    qualifying = [f for f in FLOORS if flagged[(f, 1e-3)] == 0 and flagged[(f, 1e-4)] == 0]
    chosen = min(qualifying) if qualifying else None
    print(f"# smallest floor qualifying at 1e-3 and 1e-4: {chosen}")


if __name__ == "__main__":
    main()
