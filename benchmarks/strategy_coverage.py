"""Print how often the strategies reach each regime, relation, dtype and sampling filter.

Usage::

    python benchmarks/strategy_coverage.py [--examples 200] [--seed 0] [--tolerances]

For each strategy the suite uses (``chain_cases()``, ``verify_cases()``, and the single-vector
and single-pair strategies over ``V`` in [2, 64]), draws ``--examples`` examples with a fixed
Hypothesis seed (:func:`strategies.label_frequencies`: generate phase only, no database) and
prints, per label, the share of examples that reached it and its share of all reports of its
kind (a chain case draws many vectors, each reporting one regime). ``--tolerances`` also
measures the largest ``|sum - 1|`` (summed in float64) of cast rows per dtype, over every
regime, at V = 64 and V = 150,000, next to the bound :func:`strategies.row_sum_tolerance`.
"""

from __future__ import annotations

import argparse

import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from strategies import (
    PROBABILITY_DTYPES,
    REGIMES,
    chain_cases,
    label_frequencies,
    probability_vectors,
    row_sum_tolerance,
    target_draft_pairs,
    verify_cases,
)
from strategies.coverage import LabelFrequencies

PREFIXES = ("regime=", "relation=", "dtype=", "sampling", "logits")


def _print_table(title: str, frequencies: LabelFrequencies) -> None:
    print(f"\n{title}: {frequencies.examples} examples")
    print(f"  {'label':34s} {'examples':>9s} {'share':>7s} {'reports':>8s} {'of kind':>8s}")
    for prefix in PREFIXES:
        for name, with_, share, reports, of_kind in frequencies.table(prefix):
            print(f"  {name:34s} {with_:9d} {share:7.1%} {reports:8d} {of_kind:8.1%}")


def coverage(examples: int, seed_value: int) -> None:
    """Print the label tables of the four strategies."""
    small = st.integers(2, 64)
    for title, strategy in (
        ("chain_cases() [V<=64, k<=4, B<=3]", chain_cases()),
        ("verify_cases() [V<=64, k<=8, B<=3]", verify_cases()),
        ("probability_vectors(V in [2, 64])", probability_vectors(small)),
        ("target_draft_pairs(V in [2, 64])", target_draft_pairs(small)),
    ):
        _print_table(title, label_frequencies(strategy, examples=examples, seed_value=seed_value))


def _largest_row_sum_error(vocab_size: int, dtype: torch.dtype, examples: int) -> float:
    worst = [0.0]

    @seed(0)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def measure(data: st.DataObject) -> None:
        for regime in REGIMES:
            vector = data.draw(probability_vectors(vocab_size, regime, dtype))
            error = abs(float(vector.to(torch.float64).sum()) - 1.0)
            worst[0] = max(worst[0], error)

    measure()
    return worst[0]


def tolerances(examples: int) -> None:
    """Print the largest measured row-sum error per dtype next to the stated bound."""
    print("\nrow sums of cast vectors (summed in float64), every regime")
    print(f"  {'dtype':10s} {'V':>7s} {'measured max':>13s} {'bound':>10s}")
    for dtype in PROBABILITY_DTYPES:
        for vocab_size, n in ((64, examples), (150_000, max(examples // 20, 3))):
            measured = _largest_row_sum_error(vocab_size, dtype, n)
            bound = row_sum_tolerance(dtype, vocab_size)
            name = str(dtype).removeprefix("torch.")
            print(f"  {name:10s} {vocab_size:7d} {measured:13.2e} {bound:10.2e}")


def main() -> None:
    """Parse the arguments and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerances", action="store_true")
    args = parser.parse_args()
    coverage(args.examples, args.seed)
    if args.tolerances:
        tolerances(args.examples)


if __name__ == "__main__":
    main()
