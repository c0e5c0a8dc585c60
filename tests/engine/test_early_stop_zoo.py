"""Early stopping cannot change a verdict: for every entry of the zoo (lossy mutants and
lossless controls, chain, greedy and tree), an audit with early stopping and one without give
the same target verdict on fixed seeds. The whole zoo (about 9 minutes on 2 shared cores) is
marked slow; a fast subset, one entry per kind of unit and verdict, runs by default."""

from __future__ import annotations

import pytest

from losslessness.config import RunConfig
from losslessness.engine import run_audit
from losslessness.zoo import MUTANT_NAMES, mutant

STEPS = 1000
"""Verify steps per case: enough for all but three lossy entries to be LOSSY in both modes
(``block-verification-wrong-residual`` and the two tree scheme swaps need more), few enough
for the whole zoo to run in minutes."""

FAST = (
    "replacement-from-next-row",
    "shared-random-stream",
    "greedy-ties-to-highest",
    "tree-greedy-first-matching-path",
    "tree-greedy-first-child-only",
    "tree-greedy-path-marking",
)
"""The default run's entries (about 25 s): lossy chain mutants that stop early, a lossy greedy
mutant, a lossy greedy tree mutant, a SUBOPTIMAL and a LOSSLESS greedy tree control."""


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=() if name in FAST else pytest.mark.slow) for name in MUTANT_NAMES],
)
def test_early_stopping_gives_every_zoo_entry_the_verdict_of_the_fixed_design(name: str) -> None:
    """The zoo entry's verdict with early stopping equals its verdict without (the whole
    battery at :data:`STEPS` steps per case, seed 0): a sequential stop only ever ends an
    audit the fixed-n tests would also call LOSSY, and never closes a target as LOSSY while
    the verdict says otherwise."""
    adapter = mutant(name).adapter
    verdicts = [
        run_audit([adapter], RunConfig(steps=STEPS, early_stop=early_stop)).targets[0].verdict
        for early_stop in (True, False)
    ]
    assert verdicts[0] is verdicts[1], verdicts
