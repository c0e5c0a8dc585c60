"""Time per verdict of each method of docs/detection-rates.md, at n = 1e4 verification steps.

Every method decides on the same samples: 1e4 steps of the lossless control
``gumbel-max-residual`` (V = 32, k = 2), drawn once per module with seed :data:`SEED`. Ours
is the whole chain battery of one case (``run_chain_checks``, including the
minimum-detectable-effect diagnostics every record carries); the peers are
:mod:`benchmarks.peers`. Sampling is excluded: it is shared by all methods. Run by
``tox -e bench``; ``extra_info`` holds the method and n.
"""

from __future__ import annotations

from typing import Any

import pytest
from detection_rates import METHODS, verdict

from losslessness.cases import ChainCase
from losslessness.engine.draw import sample_chain
from losslessness.samples import ChainSamples
from losslessness.zoo import MUTANTS

STEPS = 10_000
SEED = 4
ENTRY = "gumbel-max-residual"


@pytest.fixture(scope="module")
def samples() -> ChainSamples:
    """1e4 steps of the control's own case, seed :data:`SEED`."""
    entry = MUTANTS[ENTRY]
    assert isinstance(entry.case, ChainCase) and entry.adapter.chain is not None
    return sample_chain(entry.adapter.chain, entry.case, STEPS, SEED)


@pytest.mark.parametrize("method", METHODS)
def test_time_per_verdict_at_1e4_steps(benchmark: Any, samples: ChainSamples, method: str) -> None:
    """Seconds for one verdict of ``method`` on 1e4 steps of a lossless control."""
    benchmark.extra_info.update(method=method, steps=STEPS, entry=ENTRY)
    detected = benchmark(verdict, method, samples, f"mutant/{ENTRY}", SEED)
    assert isinstance(detected, bool)
