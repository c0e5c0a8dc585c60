"""The serving tree property suite run as a user runs it (:mod:`tests.suite.runner`,
``--losslessness-protocol=serving-tree``): the reference serving tree verifier passes its
witnesses and the whole suite; a serving tree mutant fails at a witness with the tree check, the
case, the seed and a replay line carrying the protocol; the budget counts the witnesses; the
strategy draws requests the profile implements, penalties excepted."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from losslessness.reference.profiles import get_profile
from losslessness.suite import TREE_ASSERTIONS_PER_EXAMPLE, suite_budget
from losslessness.suite.support import SERVING_TREE_WITNESS_EXAMPLES
from losslessness.suite.tree_support import (
    SERVING_TREE_WITNESSES,
    serving_tree_witness,
    suite_serving_tree_cases,
)
from tests.suite.runner import run_suite

SERVING_TREE = ("--losslessness-protocol=serving-tree",)
REFERENCE = "--losslessness-target=mutant/serving-tree-reference"


def test_suite_budget_counts_every_serving_tree_witness() -> None:
    """Each serving tree witness is counted at the tree test's assertions, and every witness
    exists for vLLM's profile (an unknown id raises naming ``name``)."""
    assert len(SERVING_TREE_WITNESSES) == SERVING_TREE_WITNESS_EXAMPLES
    for name in SERVING_TREE_WITNESSES:
        assert serving_tree_witness(name, get_profile("vllm-v1")) is not None
    assert suite_budget().assertions >= SERVING_TREE_WITNESS_EXAMPLES * TREE_ASSERTIONS_PER_EXAMPLE
    with pytest.raises(ValueError, match="name: 'v8-b1'"):
        serving_tree_witness("v8-b1", get_profile("vllm-v1"))


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_drawn_serving_tree_cases_hold_the_profiles_law_of_requests_it_implements(
    data: st.DataObject,
) -> None:
    """A drawn case carries a request without penalties and, for SGLang's profile, without
    allowed or bad ids; its target tables are the profile's law of its raw logits."""
    profile = get_profile(data.draw(st.sampled_from(["vllm-v1", "sglang-torch"])))
    case = data.draw(suite_serving_tree_cases(profile))
    spec = case.serving
    assert spec is not None and spec.profile == profile.name
    request = spec.request
    assert (request.frequency_penalty, request.presence_penalty) == (0.0, 0.0)
    assert request.repetition_penalty == 1.0
    if profile.name == "sglang-torch":
        assert request.allowed_token_ids is None and not request.bad_token_ids
    law = profile.law(spec.root_logits, request, list(request.output_token_ids))
    assert bool((law - case.root_target).abs().max() <= 1e-12)


def test_reference_passes_the_serving_tree_witnesses(tmp_path: Path) -> None:
    """The reference serving tree verifier passes the three witnesses on vLLM's profile
    (named by the adapter); neither the chain nor the serving module is collected."""
    result = run_suite(
        tmp_path, "--losslessness-profile=ci", REFERENCE, *SERVING_TREE, "-k", "witness",
    )
    assert result.returncode == 0, result.output
    assert "3 passed" in result.stdout, result.stdout
    assert "test_chain" not in result.stdout and "test_serving.py" not in result.stdout


def test_serving_tree_suite_fails_on_a_mutant_with_a_replayable_message(tmp_path: Path) -> None:
    """The tree path that ignores min-p fails at the min-p witness: the message names the tree
    law check, the case, the seed and a replay line with the protocol option."""
    target = "mutant/serving-tree-ignores-min-p"
    result = run_suite(
        tmp_path, "--losslessness-profile=ci", f"--losslessness-target={target}",
        *SERVING_TREE, "-k", "witness",
    )
    output = result.stdout
    assert result.returncode == 1, result.output
    assert "1 failed, 2 passed" in output, output
    assert "LOSSY tree.law" in output and "stree-min-p" in output, output
    assert (
        f"replay: pytest --losslessness-target={target} --losslessness-protocol=serving-tree "
        "--losslessness-profile=ci --losslessness-in-process -k test_serving_tree_verifier"
    ) in output, output


@pytest.mark.slow
def test_reference_passes_the_serving_tree_suite(tmp_path: Path) -> None:
    """The whole serving tree suite (witnesses and 25 generated cases) passes on the reference
    under ``ci``: no false alarm on a correct verifier (about 3 minutes on 2 cores)."""
    result = run_suite(
        tmp_path, "--losslessness-profile=ci", REFERENCE, *SERVING_TREE,
    )
    assert result.returncode == 0, result.output
    assert "4 passed" in result.stdout, result.stdout
