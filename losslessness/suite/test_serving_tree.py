"""Serving tree verifier properties (issue 21; docs/architecture.md, 'Serving tree protocol'),
run on the target named by ``--losslessness-target`` with
``--losslessness-protocol=serving-tree``: the tree suite's properties (outputs root paths of
the tree with their tokens and -1 padding; the first emitted token follows the law at the
root, the token after each reached depth-1 class its node's law; no token of law 0 after any
reached node), the laws being the engine profile's law of the raw logits the verifier receives
for a request drawn among the fields the profile implements (penalties excepted: they read a
node's path, which the tree checks do not pool by), the tree, scheme and tables drawn as the
tree suite draws them (:mod:`losslessness.suite.tree_support`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from losslessness.engine.draw import ServingTreeCall
from losslessness.protocol import ServingTreeVerifier
from losslessness.pytest_plugin import SuiteTarget
from losslessness.reference.profiles import EngineProfile
from losslessness.suite.serving_support import SERVING_SUITE_SETTINGS
from losslessness.suite.tree_support import (
    SERVING_TREE_WITNESSES,
    run_tree_example,
    serving_tree_witness,
    suite_serving_tree_cases,
)


# Resolved once, before Hypothesis runs: a missing option skips and a bad target or profile
# stops the run at setup instead of failing (and being shrunk) inside every example.
@pytest.fixture(scope="module")
def serving_tree_target(
    losslessness_target: SuiteTarget,
) -> tuple[ServingTreeVerifier, EngineProfile]:
    """The serving tree verifier and the engine profile it claims."""
    return losslessness_target.serving_tree()


@pytest.mark.parametrize("witness", SERVING_TREE_WITNESSES)
def test_serving_tree_verifier_on_witness(
    witness: str, serving_tree_target: tuple[ServingTreeVerifier, EngineProfile],
    losslessness_target: SuiteTarget,
) -> None:
    """On the explicit witness cases of the serving tree battery, built for the target's
    profile (min-p, the min_tokens boundary inside the tree, top-p on an EAGLE top-k tree),
    every tree property holds."""
    verifier, profile = serving_tree_target
    case = serving_tree_witness(witness, profile)
    if case is None:
        pytest.skip(f"{witness}: the {profile.name} profile does not implement its request")
    run_tree_example(
        ServingTreeCall(verifier, case), case,
        losslessness_target.replay("test_serving_tree_verifier"),
        losslessness_target.call_timeout_s,
    )


@SERVING_SUITE_SETTINGS
@given(data=st.data())
def test_serving_tree_verifier_is_lossless(
    data: st.DataObject, serving_tree_target: tuple[ServingTreeVerifier, EngineProfile],
    losslessness_target: SuiteTarget,
) -> None:
    """Outputs are root paths of the tree with their tokens and -1 padding; the first emitted
    token follows the profile's law of the root's raw logits for the drawn request, and the
    token after each reached depth-1 class its node's law, for every draft scheme, topology,
    regime of the tables and request the profile implements."""
    verifier, profile = serving_tree_target
    case = data.draw(suite_serving_tree_cases(profile), label="case")
    run_tree_example(
        ServingTreeCall(verifier, case), case,
        losslessness_target.replay("test_serving_tree_verifier"),
        losslessness_target.call_timeout_s,
    )
