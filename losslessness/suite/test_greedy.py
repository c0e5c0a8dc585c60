"""Greedy verifier property (docs/architecture.md, 'What lossless means', item 6), run on the
target named by ``--losslessness-greedy``: token-for-token equality with argmax decoding, ties
included."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from losslessness.cases import GreedyCase
from losslessness.engine.draw import ProtocolViolation, call_target, coerce_output
from losslessness.pytest_plugin import SuiteTarget
from losslessness.reference import verify_greedy
from losslessness.suite.support import greedy_failure
from strategies import greedy_cases


@settings(deadline=None)
@given(case=greedy_cases(max_vocab=64, max_k=4, max_batch=8))
def test_greedy_verifier_equals_argmax_decoding(
    case: GreedyCase, losslessness_target: SuiteTarget
) -> None:
    """The target's greedy output equals the reference's on logits with exact ties at the
    maximum and -inf masks (ties go to the lowest index)."""
    verifier = losslessness_target.greedy()
    logits, drafts = case.target_logits, case.draft_token_ids
    expected = verify_greedy(logits, drafts).numpy()
    try:
        returned = call_target(
            verifier, logits.clone(), drafts.clone(), timeout_s=losslessness_target.call_timeout_s
        )
        got = coerce_output(returned, *drafts.shape)
    except ProtocolViolation as violation:
        pytest.fail(f"losslessness: LOSSY greedy structure: {violation}")
    message = greedy_failure(
        logits, drafts, expected, got, losslessness_target.replay("test_greedy_verifier")
    )
    assert message is None, message
