"""Tree verifier properties (issue 11), run on the targets named by ``--losslessness-tree`` (a
tree sampling verifier) and ``--losslessness-tree-greedy`` (a greedy tree verifier): the
output structure (a root path of the tree, its tokens, ``-1`` padding), the law of the first
emitted token at the root and of the token after each reached depth-1 class (no token with
p = 0 after any reached node), and, for greedy
tree verifiers, greedy decoding along the tree
(:func:`losslessness.checks.tree_greedy.check_tree_greedy`); decided by the engine's sampler and
tree checks (:mod:`losslessness.suite.tree_support`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, example, given, settings

from losslessness.cases import GreedyTreeCase, TreeCase
from losslessness.protocol import GreedyTreeVerifier, TreeVerifier
from losslessness.pytest_plugin import SuiteTarget
from losslessness.suite.tree_support import (
    TREE_WITNESS_CASES,
    greedy_tree_failure,
    run_tree_example,
    suite_greedy_tree_cases,
    suite_tree_cases,
)


# Resolved once, before Hypothesis runs: a missing option skips and a bad target stops the run
# at setup instead of failing (and being shrunk) inside every example.
@pytest.fixture(scope="module")
def tree_verifier(losslessness_target: SuiteTarget) -> TreeVerifier:
    """The ``--losslessness-tree`` verifier."""
    return losslessness_target.tree()


@pytest.fixture(scope="module")
def greedy_tree_verifier(losslessness_target: SuiteTarget) -> GreedyTreeVerifier:
    """The ``--losslessness-tree-greedy`` verifier."""
    return losslessness_target.greedy_tree()


def _with_witnesses(test: Callable[..., None]) -> Callable[..., None]:
    """``test`` with every :data:`TREE_WITNESS_CASES` case as an explicit example."""
    for case in reversed(TREE_WITNESS_CASES):
        test = example(case=case)(test)
    return test


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=suite_tree_cases())
@_with_witnesses
def test_tree_verifier_is_lossless(
    case: TreeCase, tree_verifier: TreeVerifier, losslessness_target: SuiteTarget
) -> None:
    """Outputs are root paths of the tree with their tokens and -1 padding; the first emitted
    token follows p at the root and the token after each reached depth-1 class follows its p,
    for every draft scheme, topology and regime of p and q (and first on the explicit witness
    cases, where the schemes' rules differ most)."""
    run_tree_example(
        tree_verifier, case, losslessness_target.replay("test_tree_verifier"),
        losslessness_target.call_timeout_s,
    )


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=suite_greedy_tree_cases())
def test_greedy_tree_verifier_is_greedy_decoding(
    case: GreedyTreeCase, greedy_tree_verifier: GreedyTreeVerifier,
    losslessness_target: SuiteTarget,
) -> None:
    """The target's greedy tree output is greedy decoding along the tree: every emitted token
    the argmax at its node (exact ties: lowest index), -inf masks never chosen, any duplicate
    sibling carrying the argmax a valid continuation, the final token the argmax at the last
    accepted node."""
    message = greedy_tree_failure(
        greedy_tree_verifier, case,
        losslessness_target.replay("test_greedy_tree_verifier"),
        losslessness_target.call_timeout_s,
    )
    assert message is None, message
