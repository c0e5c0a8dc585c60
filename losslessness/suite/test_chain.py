"""Chain sampling verifier properties (docs/architecture.md, 'What lossless means', items 1-5), run
on the target named by ``--losslessness-target``: structure, the conditional law at every position
(bonus included), acceptance (too high is LOSSY; too low warns SUBOPTIMAL), the exact edge cases,
and the independence of identical rows in one batch."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings

from losslessness.cases import ChainCase
from losslessness.pytest_plugin import SuiteTarget
from losslessness.suite.support import CHAIN_WITNESS_CASES, run_chain_example, suite_chain_cases


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=suite_chain_cases())
@example(case=CHAIN_WITNESS_CASES[0])
@example(case=CHAIN_WITNESS_CASES[1])
@example(case=CHAIN_WITNESS_CASES[2])
@example(case=CHAIN_WITNESS_CASES[3])
@example(case=CHAIN_WITNESS_CASES[4])
def test_chain_verifier_is_lossless(case: ChainCase, losslessness_target: SuiteTarget) -> None:
    """Every emitted token follows p at its position, acceptance never exceeds sum min(p, q),
    outputs are well-formed, and identical rows of a batch are independent, whichever way the
    verifier is called (one row per call, distinct rows, small and full batches; float64,
    float32 and bfloat16 inputs); first on the explicit witness cases, where a wrong residual
    after an accepted prefix, a floor on tiny target masses, a small-batch path, a distinct-rows
    index mix-up and a float32-only residual show."""
    run_chain_example(
        losslessness_target.chain(), case, losslessness_target.replay("test_chain_verifier"),
        losslessness_target.call_timeout_s,
    )
