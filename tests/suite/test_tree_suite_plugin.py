"""The tree property suite run as a user runs it (:mod:`tests.suite.runner`): the reference tree
verifiers pass; every lossy tree mutant of the zoo (:data:`losslessness.zoo.tree.TREE_ZOO`)
fails it with the check, a small shrunk tree and a one-line replay command; shown in
detail for a tree verifier that judges siblings against p instead of the running residual, and
a greedy one taking its final token from the parent."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from losslessness.suite.tree_support import TREE_SMALL_VOCAB
from losslessness.zoo import Mutant
from losslessness.zoo.tree import TREE_ZOO
from tests.suite.runner import run_suite

MUTANTS_MODULE = "losslessness.zoo.tree"
WRONG_TREE = f"{MUTANTS_MODULE}:iid_siblings_against_p"
WRONG_GREEDY_TREE = f"{MUTANTS_MODULE}:greedy_final_from_parent"
LOSSY_TREE_MUTANTS = [
    spec
    for spec in TREE_ZOO
    if spec.lossy
    and f"{MUTANTS_MODULE}:{spec.verifier.__name__}" not in (WRONG_TREE, WRONG_GREEDY_TREE)
]
"""The lossy tree mutants not already shown, in detail, by the two tests on ``wrong_run``."""

BEYOND_SUITE_VOCAB: dict[str, pytest.MarkDecorator | list[pytest.MarkDecorator]] = {
    "tree-residual-top-10-only": pytest.mark.xfail(
        strict=True,
        reason="known gap: the suite's tree strategies draw V <= 16, where a residual kept to "
        "its 10 most likely tokens loses too little mass to show; the audit's V = 1024 tree "
        "cases catch it (tests/adapters/test_tree_mutants.py). Strict: a suite that starts "
        "catching it fails here, so this mark is removed then.",
    ),
    "tree-deep-nodes-top-10-only": [
        pytest.mark.xfail(
            strict=True,
            reason="known gap: the suite's tree strategies draw V <= 16, where a law cut to its "
            "10 most likely tokens at depth >= 2 loses too little mass to show; the audit's "
            "V = 1024 EAGLE-like tree catches it by the pooled PIT law test "
            "(tests/checks/test_tree.py). Strict: a suite that starts catching it fails here, "
            "so this mark is removed then.",
        ),
        # The same gap as the top-10 residual's, shown by default above: 10 s more of tox.
        pytest.mark.slow,
    ],
}
"""Lossy tree mutants whose mechanism needs a vocabulary the suite does not draw."""


def test_tree_suite_passes_on_the_reference(tmp_path: Path) -> None:
    """``--losslessness-tree`` and ``--losslessness-tree-greedy`` on the reference collect only
    the tree module and pass (ci profile)."""
    result = run_suite(
        tmp_path, "--losslessness-profile=ci",
        "--losslessness-tree=losslessness.reference.tree:verify_tree",
        "--losslessness-tree-greedy=losslessness.reference.tree:verify_tree_greedy",
    )
    assert result.returncode == 0, result.output
    assert "2 passed" in result.stdout and "skipped" not in result.stdout


@pytest.fixture(scope="module")
def wrong_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The suite's output on both wrong tree verifiers (one run, ci profile; about 10 s)."""
    result = run_suite(
        tmp_path_factory.mktemp("wrong-tree"), "--losslessness-profile=ci",
        f"--losslessness-tree={WRONG_TREE}", f"--losslessness-tree-greedy={WRONG_GREEDY_TREE}",
    )
    assert result.returncode == 1, result.output
    assert "2 failed" in result.stdout, result.stdout
    return result.stdout


def test_suite_fails_on_iid_siblings_against_p_with_a_shrunk_tree(wrong_run: str) -> None:
    """The law check fails; the message shows a shrunk multi-draft tree (a node with two or
    three children, V at most TREE_SMALL_VOCAB + 1), p, q, the seed and a replay line."""
    match = re.search(
        r"losslessness: LOSSY tree\.law (?:at the root|after a depth-1 node with token \d+) "
        r"\((\w+) N=(\d+) D=(\d+) V=(\d+) ([\w-]+)\)\n[E ]*tree: parents \[([\d, ]+)\]",
        wrong_run,
    )
    assert match, wrong_run
    shape, nodes, _, vocab, scheme, parents = match.groups()
    print(f"iid_siblings_against_p: shrunk to {shape} parents [{parents}] V={vocab} {scheme}")
    assert 2 <= int(nodes) <= 3 and int(vocab) <= TREE_SMALL_VOCAB + 1
    assert re.search(r"seed \d+ \(derived from the case hash [0-9a-f]{12}\)", wrong_run)
    assert f"replay: pytest --losslessness-tree={WRONG_TREE} " in wrong_run
    assert "-k test_tree_verifier" in wrong_run


def test_suite_fails_on_greedy_final_from_parent_with_a_shrunk_tree(wrong_run: str) -> None:
    """The greedy equality fails on one small tree (B = 1, at most 3 nodes), showing the tree,
    the logits, what greedy tree verification gives and what was obtained, and a replay line."""
    match = re.search(
        r"losslessness: LOSSY tree\.greedy \((\w+) N=(\d+) D=(\d+) V=(\d+) B=(\d+)\)\n"
        r"[E ]*tree: parents \[([\d, ]+)\]",
        wrong_run,
    )
    assert match, wrong_run
    shape, nodes, _, vocab, batch, parents = match.groups()
    print(f"greedy_final_from_parent: shrunk to {shape} parents [{parents}] V={vocab} B={batch}")
    assert 1 <= int(nodes) <= 3 and int(batch) == 1
    assert re.search(r"greedy tree verification gives tokens \[.*\]\n[E ]*got tokens \[", wrong_run)
    assert "-k test_greedy_tree_verifier" in wrong_run


def test_tree_target_without_a_tree_verifier_is_a_usage_error(tmp_path: Path) -> None:
    """A tree option naming something that is not callable stops the run with the option
    named."""
    result = run_suite(tmp_path, "--losslessness-tree=losslessness.protocol:DRAFT_SCHEMES")
    assert result.returncode != 0
    assert "--losslessness-tree=losslessness.protocol:DRAFT_SCHEMES" in result.output


MIRRORED_TREE_MUTANTS = ("tree-replacement-rule-on-distinct-drafts", "tree-final-from-root-row")
"""Lossy tree mutants whose mirror image runs by default (the distinct rule on replacement
drafts, the final token from the parent's row): these run in ``tox -e slow`` (the default
audit catches every tree mutant: tests/adapters/test_tree_mutants.py)."""


@pytest.mark.parametrize(
    "spec",
    [
        # The greedy mutants' shrink takes minutes on 2 cores; the greedy shrink and its
        # message are pinned above (greedy_final_from_parent), these run in ``tox -e slow``.
        pytest.param(spec, id=spec.name, marks=pytest.mark.slow)
        if spec.protocol == "greedy-tree" or spec.name in MIRRORED_TREE_MUTANTS
        else pytest.param(spec, id=spec.name, marks=BEYOND_SUITE_VOCAB[spec.name])
        if spec.name in BEYOND_SUITE_VOCAB
        else pytest.param(spec, id=spec.name)
        for spec in LOSSY_TREE_MUTANTS
    ],
)
def test_suite_fails_on_every_lossy_tree_mutant_with_a_shrunk_tree_and_a_replay_line(
    spec: object, tmp_path: Path
) -> None:
    """Each lossy tree mutant of the zoo, given alone to its option (``--losslessness-tree``, or
    ``--losslessness-tree-greedy`` for the greedy ones), fails the suite (ci profile) with a
    LOSSY tree check, the shrunk tree's parents and a replay line naming it (5-10 s each;
    a greedy one, whose failure Hypothesis shrinks for minutes, only in ``tox -e slow``)."""
    assert isinstance(spec, Mutant)
    greedy = spec.protocol == "greedy-tree"
    option = "--losslessness-tree-greedy" if greedy else "--losslessness-tree"
    target = f"{MUTANTS_MODULE}:{spec.verifier.__name__}"  # type: ignore[union-attr]
    result = run_suite(tmp_path, "--losslessness-profile=ci", f"{option}={target}")
    output = result.output
    assert result.returncode == 1, output
    assert "1 failed" in result.stdout, output
    assert re.search(r"losslessness: LOSSY tree\.\w+", output), output
    assert re.search(r"tree: parents \[[\d, ]+\]", output), output
    assert f"replay: pytest {option}={target} " in output, output


LOSSLESS_TREE_CONTROLS = [spec for spec in TREE_ZOO if not spec.lossy]


SLOW_TREE_CONTROLS = (
    "tree-exponential-race-final",
    "tree-log-space-acceptance",
    "tree-sample-and-match",
    "tree-exact-top-k-fast-path",
)
"""Sampling tree controls the default tests leave to ``tox -e slow`` (about 9 s each through
the suite; the default audit passes every tree control: tests/adapters/test_tree_mutants.py)."""


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(spec, marks=pytest.mark.slow if spec.name in SLOW_TREE_CONTROLS else ())
        for spec in LOSSLESS_TREE_CONTROLS
    ],
    ids=[s.name for s in LOSSLESS_TREE_CONTROLS],
)
def test_suite_passes_every_lossless_tree_control(spec: object, tmp_path: Path) -> None:
    """Each lossless control of the tree zoo (published rules that look different: siblings
    tried in reverse, an exponential-race final draw, log-space acceptance, sample-and-match,
    SGLang's one-coin rule at thresholds 1, greedy walks that follow another duplicate or
    stop early) passes the suite (ci profile, explicit witnesses included): calling a correct
    algorithm LOSSY would be as wrong as missing a bug (2-9 s each; those in
    :data:`SLOW_TREE_CONTROLS` run in ``tox -e slow``)."""
    assert isinstance(spec, Mutant)
    greedy = spec.protocol == "greedy-tree"
    option = "--losslessness-tree-greedy" if greedy else "--losslessness-tree"
    target = f"{MUTANTS_MODULE}:{spec.verifier.__name__}"  # type: ignore[union-attr]
    result = run_suite(tmp_path, "--losslessness-profile=ci", f"{option}={target}")
    assert result.returncode == 0, result.output
    assert "1 passed" in result.stdout, result.stdout
