"""Serving verifier properties (issue 21; docs/architecture.md, 'Serving protocol'), run on the
target named by ``--losslessness-target`` with ``--losslessness-protocol=serving``: outputs well
formed (accepted drafts then one token, -1 padded, at most ``num_draft_tokens + 1`` tokens), the
emitted token at every position of a sampled row follows the engine profile's law for the
row's request and history (bonus included), greedy rows equal greedy verification of the
profile's argmax, acceptance at position 0 never above ``sum min(p', q)``; for batches that mix
requests, drafts per row, draft probabilities or none, B and logits dtypes
(:mod:`losslessness.suite.serving_support`)."""

from __future__ import annotations

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from losslessness.protocol import ServingVerifier
from losslessness.pytest_plugin import SuiteTarget
from losslessness.reference.profiles import EngineProfile
from losslessness.suite.serving_support import (
    SERVING_SUITE_SETTINGS,
    SERVING_WITNESSES,
    run_serving_example,
    serving_seed,
    suite_serving_cases,
    witness_case,
)


# Resolved once, before Hypothesis runs: a missing option skips and a bad target or profile
# stops the run at setup instead of failing (and being shrunk) inside every example.
@pytest.fixture(scope="module")
def serving_target(losslessness_target: SuiteTarget) -> tuple[ServingVerifier, EngineProfile]:
    """The serving verifier and the engine profile it claims."""
    return losslessness_target.serving()


@pytest.mark.parametrize("witness", sorted(SERVING_WITNESSES))
def test_serving_verifier_on_witness(
    witness: str, serving_target: tuple[ServingVerifier, EngineProfile],
    losslessness_target: SuiteTarget,
) -> None:
    """On the explicit witness batches (filters and temperatures with far drafts beside a
    greedy row; penalties, min_tokens and a seeded row beside unseeded rows, without draft
    probabilities), restricted to the rows the profile implements, every serving check
    passes."""
    verifier, profile = serving_target
    case = witness_case(witness, profile)
    if case is None:
        pytest.skip(f"{witness}: the {profile.name} profile implements none of its requests")
    run_serving_example(
        verifier, profile, case, losslessness_target.replay("test_serving_verifier"),
        losslessness_target.call_timeout_s,
    )


@SERVING_SUITE_SETTINGS
@given(data=st.data())
def test_serving_verifier_is_lossless(
    data: st.DataObject, serving_target: tuple[ServingVerifier, EngineProfile],
    losslessness_target: SuiteTarget,
) -> None:
    """Every serving check passes on batches Hypothesis draws for the target's engine profile
    (requests mixing every field the profile implements, 0..k drafts per row, B from 1, float32,
    bfloat16 and float64 logits)."""
    verifier, profile = serving_target
    case = data.draw(suite_serving_cases(profile), label="case")
    note(f"case {case.summary}, hash {case.case_hash}, seed {serving_seed(case)}")
    run_serving_example(
        verifier, profile, case, losslessness_target.replay("test_serving_verifier"),
        losslessness_target.call_timeout_s,
    )
