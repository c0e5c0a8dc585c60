"""The pytest plugin and property suite, run as a user runs them (:mod:`tests.suite.runner`):
the reference passes; every wrong verifier fails with a replayable message naming the check,
the position and a small shrunk case; the lossless-but-suboptimal control passes with a
warning. Shrunk cases are printed (``pytest -s``) for the closing note."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from losslessness.suite import MAX_VOCAB, SMALL_VOCAB
from losslessness.zoo import MUTANTS
from tests.suite.runner import run_suite


@pytest.mark.parametrize(
    "profile", ["ci", "dev", pytest.param("nightly", marks=pytest.mark.slow)]
)
def test_suite_passes_on_the_reference(profile: str, tmp_path: Path) -> None:
    """``pytest --losslessness-target=losslessness.reference:verify`` (and the greedy option)
    collects both suite modules and passes, in every profile (the nightly profile's 1,000
    examples take about a minute: ``tox -e slow``); under the ci profile exactly as a user
    runs it, the reference in a worker process."""
    result = run_suite(
        tmp_path, f"--losslessness-profile={profile}",
        "--losslessness-target=losslessness.reference:verify",
        "--losslessness-greedy=losslessness.reference:verify_greedy",
        isolated=profile == "ci",
    )
    assert result.returncode == 0, result.output
    assert "2 passed" in result.stdout


@pytest.mark.parametrize(
    ("verifier", "check", "min_vocab"),
    [
        # The residual p can emit the rejected draft again: the exact structure check sees it.
        ("residual_is_target", "law|structure", 2),
        ("bonus_from_wrong_row", "law", 2),
        # On the chain witness (q peaked where p is small) the inverted ratio's output also
        # breaks the structure, which the exact check reports first.
        ("ratio_inverted", "law|structure", 2),
        ("acceptance_never_stops", "law|structure", 2),
        ("shared_random_stream", "law|independence", 2),
        # With bfloat16 inputs tiny masses round to 0, and the floor then emits a token of
        # law 0: the exact structure check may see it first.
        ("clamp_target_at_floor", "law|structure", 2),
        # Slow (about a minute on 2 cores): the failure needs V > 16, whose shrink is long.
        pytest.param("residual_truncated_to_top16", "law", 17, marks=pytest.mark.slow),
    ],
)
def test_suite_fails_on_each_wrong_verifier_with_a_replayable_message(
    verifier: str, check: str, min_vocab: int, tmp_path: Path
) -> None:
    """Each wrong verifier fails the suite: the message names the check and position, shows
    the shrunk case, its seed and a one-line replay command; the shrunk case is small. This
    pins the suite's power, so the verifiers run in-process (:func:`tests.suite.runner.
    run_suite`): in a worker process the ci profile's search and shrink for
    ``clamp_target_at_floor`` ran past 15 minutes on CI's 2 cores."""
    target = f"tests.wrong_verifiers:{verifier}"
    result = run_suite(
        tmp_path, "--losslessness-profile=ci", f"--losslessness-target={target}"
    )
    output = result.stdout
    assert result.returncode == 1, result.output
    match = re.search(
        rf"losslessness: LOSSY ({check})(?: at position \d+, row \d+)? \(V=(\d+) k=(\d+) B=(\d+)",
        output,
    )
    assert match, output
    vocab, k, batch = (int(x) for x in match.groups()[1:])
    print(f"{verifier}: shrunk to V={vocab} k={k} B={batch}")
    # Cases are drawn from V <= 16 or from V in 17..300. A failure found among the large ones
    # shrinks towards V = 17, but the top-16 truncation only shows where the residual spreads
    # over enough tokens, so its shrink may stop at a larger V (89 on one revision of the
    # strategies): there only B and k are pinned small.
    largest = MAX_VOCAB if min_vocab > SMALL_VOCAB else max(min_vocab, SMALL_VOCAB + 1) + 15
    assert min_vocab <= vocab <= largest and batch == 1 and k <= 2
    assert re.search(r"seed \d+ \(derived from the case hash [0-9a-f]{12}\)", output)
    assert (
        f"replay: pytest --losslessness-target={target} --losslessness-profile=ci "
        "--losslessness-in-process -k"
    ) in output


def test_suite_passes_sample_and_match_with_a_suboptimal_warning(tmp_path: Path) -> None:
    """Sample-and-match is lossless: the suite passes, warning that acceptance is too low."""
    result = run_suite(
        tmp_path, "--losslessness-profile=ci",
        "--losslessness-target=tests.wrong_verifiers:sample_and_match",
    )
    assert result.returncode == 0, result.output
    assert "SUBOPTIMAL" in result.stdout


def test_suite_fails_on_greedy_tie_breaking(tmp_path: Path) -> None:
    """A greedy verifier that breaks ties towards the highest index fails with the tie shown."""
    result = run_suite(
        tmp_path, "--losslessness-profile=ci",
        "--losslessness-greedy=tests.wrong_verifiers:greedy_ties_to_highest",
    )
    assert result.returncode == 1, result.output
    assert "LOSSY greedy at position" in result.stdout
    assert "tie at the maximum" in result.stdout


def test_unknown_target_is_a_usage_error(tmp_path: Path) -> None:
    """A target that does not resolve stops the run with the option named."""
    result = run_suite(tmp_path, "--losslessness-target=no_such_module_xyz:verify")
    assert result.returncode != 0
    assert "--losslessness-target=no_such_module_xyz:verify" in result.output


CHAIN_CONTROLS = [
    name
    for name, mutant in MUTANTS.items()
    if not mutant.lossy and mutant.adapter.chain is not None and not name.startswith("tree-")
]


DEFAULT_CHAIN_CONTROLS = ("gumbel-max-residual", "block-verification")
"""Chain controls the default tests run through the suite (a different residual draw, a
different verification rule); the others are slow-marked (the default audit passes every
control: tests/adapters/test_mutants.py)."""


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=() if name in DEFAULT_CHAIN_CONTROLS else pytest.mark.slow)
        for name in CHAIN_CONTROLS
    ],
)
def test_suite_passes_every_lossless_chain_control_of_the_zoo(
    name: str, tmp_path: Path
) -> None:
    """Each lossless chain control of the zoo (sample-and-match, a Gumbel-max residual,
    log-space acceptance, an unnormalised residual drawn by multinomial, block verification)
    passes the suite (ci profile, the chain witness included): calling a correct published
    algorithm LOSSY would be as wrong as missing a bug (about 11 s each, in-process; those
    outside :data:`DEFAULT_CHAIN_CONTROLS` run in ``tox -e slow``)."""
    chain = MUTANTS[name].adapter.chain
    assert chain is not None
    target = f"{chain.__module__}:{chain.__name__}"
    result = run_suite(
        tmp_path, "--losslessness-profile=ci", f"--losslessness-target={target}"
    )
    assert result.returncode == 0, result.output
    assert "1 passed" in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("mutant", "witness"),
    [
        ("small-batch-correction-from-target", "one row per call"),
        ("float32-residual-unnormalised", "float32 inputs"),
        ("distinct-rows-index-mixup", "every call two distinct rows"),
    ],
)
def test_suite_fails_on_each_call_condition_mutant_at_its_witness(
    mutant: str, witness: str, tmp_path: Path
) -> None:
    """A verifier wrong only in batches of fewer than 16 rows, only for float32 inputs or only
    when a call's rows all differ fails the chain suite: the suite calls it under those
    conditions (the witness cases ``witness-b1``, ``witness-float32``, ``witness-distinct``
    guarantee it whatever Hypothesis draws), and the message names the check, the case with
    its call conditions, the seed and a replay line (about 10 s each, in-process)."""
    chain = MUTANTS[mutant].adapter.chain
    assert chain is not None
    target = f"{chain.__module__}:{chain.__name__}"
    result = run_suite(
        tmp_path, "--losslessness-profile=ci", f"--losslessness-target={target}"
    )
    output = result.stdout
    assert result.returncode == 1, result.output
    assert re.search(rf"losslessness: LOSSY \S+.*witness: {witness}", output), output
    assert re.search(r"seed \d+ \(derived from the case hash [0-9a-f]{12}\)", output)
    assert f"replay: pytest --losslessness-target={target} --losslessness-profile=ci" in output
