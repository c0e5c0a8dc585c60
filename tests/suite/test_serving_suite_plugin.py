"""The serving property suite run as a user runs it (:mod:`tests.suite.runner`,
``--losslessness-protocol=serving``): the reference serving verifier passes on its own profile
and on others named by ``--losslessness-engine-profile``; the serving mutants of the zoo
(:func:`losslessness.zoo.serving.serving_zoo`) fail with the check, the row kind's request, the
seed and a replay line; the lossless control passes; a serving target without a profile is a
usage error. The explicit witness tests (``-k witness``) take a few seconds of work; the full
Hypothesis runs (about 30 s of a Python-loop reference verifier per profile) are slow."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from losslessness.reference.profiles import get_profile
from losslessness.suite import SERVING_ASSERTIONS_PER_EXAMPLE, suite_budget
from losslessness.suite.serving_support import (
    SERVING_WITNESSES,
    supported_fields,
    witness_case,
)
from losslessness.suite.support import SERVING_WITNESS_EXAMPLES
from losslessness.zoo.serving import serving_zoo
from tests.suite.runner import run_suite

SERVING = ("--losslessness-protocol=serving",)


LOSSY_SERVING = [entry.name for entry in serving_zoo() if entry.lossy]
FAST_LOSSY = (
    "serving-top-p-before-top-k",
    "serving-ignores-frequency-penalty",
    "serving-stale-noise-unseeded-rows",
)
"""Serving mutants run in the default tests (one per mechanism family: filters, penalties,
per-row randomness); the others are slow-marked."""


def test_suite_budget_counts_every_serving_witness() -> None:
    """The suite's budget counts each serving witness at the serving test's assertions (a
    witness added without counting it would spend alpha the budget does not state)."""
    assert len(SERVING_WITNESSES) == SERVING_WITNESS_EXAMPLES
    for name in SERVING_WITNESSES:
        case = witness_case(name, get_profile("vllm-v1"))
        assert case is not None
        counted = sum(
            row.num_draft_tokens + 1 + (1 if row.num_draft_tokens else 0)
            for row in case.rows if not row.request.greedy
        )
        assert counted <= SERVING_ASSERTIONS_PER_EXAMPLE
    assert suite_budget().assertions >= SERVING_WITNESS_EXAMPLES * SERVING_ASSERTIONS_PER_EXAMPLE


def test_supported_fields_leave_out_what_the_engine_lacks() -> None:
    """The strategy asks the profile: FlashInfer has no greedy sampler and no penalties,
    biases or masks, vLLM v1 has every field, SGLang no allowed or bad token ids (a request
    the profile refuses would be an error, not a test)."""
    fields, greedy = supported_fields(get_profile("flashinfer"))
    assert not greedy
    assert {"top_k", "top_p", "min_p", "temperature"} <= fields
    assert not fields & {"frequency_penalty", "logit_bias", "bad_token_ids", "min_tokens"}
    fields, greedy = supported_fields(get_profile("vllm-v1"))
    assert greedy and "min_tokens" in fields and "allowed_token_ids" in fields
    fields, _ = supported_fields(get_profile("sglang-torch"))
    assert not fields & {"allowed_token_ids", "bad_token_ids"}


@pytest.mark.parametrize(
    ("target", "options"),
    [
        ("mutant/serving-reference", ()),
        ("tests.suite.serving_targets:reference_sglang_torch",
         ("--losslessness-engine-profile=sglang-torch",)),
    ],
    ids=["vllm-v1-from-the-adapter", "sglang-torch-from-the-option"],
)
def test_reference_passes_the_serving_witnesses(
    target: str, options: tuple[str, ...], tmp_path: Path
) -> None:
    """The reference serving verifier passes both witness batches, its profile named by the
    adapter or by ``--losslessness-engine-profile``; the chain module is not collected for a
    serving target."""
    result = run_suite(
        tmp_path, "--losslessness-profile=ci", f"--losslessness-target={target}", *SERVING,
        *options, "-k", "witness",
    )
    assert result.returncode == 0, result.output
    assert "2 passed" in result.stdout, result.stdout
    assert "test_chain" not in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("profile", "target", "options"),
    [
        ("ci", "mutant/serving-reference", ()),
        ("dev", "mutant/serving-reference", ()),
        ("ci", "tests.suite.serving_targets:reference_flashinfer",
         ("--losslessness-engine-profile=flashinfer",)),
    ],
)
def test_reference_passes_the_serving_suite(
    profile: str, target: str, options: tuple[str, ...], tmp_path: Path
) -> None:
    """The whole serving suite (witnesses and generated batches) passes on the reference
    serving verifier under ``ci`` and ``dev`` (and on a profile without greedy rows or
    penalties): no false alarm on a correct verifier (about a minute each)."""
    result = run_suite(
        tmp_path, f"--losslessness-profile={profile}", f"--losslessness-target={target}", *SERVING,
        *options,
    )
    assert result.returncode == 0, result.output
    # FlashInfer implements none of the history witness's requests: that witness skips.
    assert "passed" in result.stdout and "failed" not in result.stdout, result.stdout


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=() if name in FAST_LOSSY else pytest.mark.slow)
        for name in LOSSY_SERVING
    ],
)
def test_serving_suite_fails_on_each_serving_mutant_with_a_replayable_message(
    name: str, tmp_path: Path
) -> None:
    """Each lossy serving mutant fails the serving suite (at a witness batch, whatever
    Hypothesis draws): the message names the serving check and position, the row kind with
    its request, the seed and a replay line carrying the protocol option."""
    target = f"mutant/{name}"
    result = run_suite(
        tmp_path, "--losslessness-profile=ci", f"--losslessness-target={target}", *SERVING,
        "-k", "witness",
    )
    output = result.stdout
    assert result.returncode == 1, result.output
    assert re.search(
        r"losslessness: LOSSY serving\.(law|greedy|acceptance|structure) at position \d+, "
        r"row kind \d+ \(V=\d+ k=\d+ witness", output
    ), output
    assert re.search(r"row kind \d+ \([^)]*\): Request\(", output), output
    assert re.search(r"seed \d+ \(derived from the case hash [0-9a-f]{12}\)", output), output
    assert (
        f"replay: pytest --losslessness-target={target} --losslessness-protocol=serving "
        "--losslessness-profile=ci --losslessness-in-process -k test_serving_verifier"
    ) in output, output


@pytest.mark.slow
def test_serving_suite_shrinks_a_generated_failure(tmp_path: Path) -> None:
    """Without the witnesses (``-k is_lossless``), Hypothesis's own batches find a serving
    mutant (the target law at temperature 1 without top-p, vLLM #9834) and shrink it to one
    request without drafts (V=9 k=0, ``Request(top_p=0.5)`` at one revision, about three
    minutes on the loaded 2-core machine) with a replay line. The top-k/top-p order swap is
    not found this way in the ci profile's 25 batches: its witness is what catches it."""
    target = "mutant/serving-default-sampling-params"
    result = run_suite(
        tmp_path, "--losslessness-profile=ci", f"--losslessness-target={target}", *SERVING,
        "-k", "is_lossless",
    )
    output = result.stdout
    assert result.returncode == 1, result.output
    match = re.search(
        r"losslessness: LOSSY serving\.\w+ .*\(V=(\d+) k=(\d+) (\d+) row kind", output
    )
    assert match, output
    vocab, k, kinds = (int(x) for x in match.groups())
    print(f"shrunk to V={vocab} k={k} kinds={kinds}")
    assert kinds == 1 and k <= 1
    assert "replay: pytest" in output


def test_serving_control_passes_the_serving_witnesses(tmp_path: Path) -> None:
    """The lossless control (sampling from the gathered support of the law only) passes the
    witnesses: a correct variant is not called LOSSY."""
    result = run_suite(
        tmp_path, "--losslessness-profile=ci",
        "--losslessness-target=mutant/serving-sparse-support", *SERVING, "-k", "witness",
    )
    assert result.returncode == 0, result.output
    assert "2 passed" in result.stdout, result.stdout


@pytest.mark.slow
def test_serving_control_passes_the_serving_suite(tmp_path: Path) -> None:
    """The lossless control passes the whole serving suite under ``ci``."""
    result = run_suite(
        tmp_path, "--losslessness-profile=ci",
        "--losslessness-target=mutant/serving-sparse-support", *SERVING,
    )
    assert result.returncode == 0, result.output


def test_serving_target_without_a_profile_is_a_usage_error(tmp_path: Path) -> None:
    """A serving function without ``engine_profile`` and no ``--losslessness-engine-profile``
    stops the run naming the option."""
    result = run_suite(
        tmp_path, "--losslessness-target=tests.suite.serving_targets:reference_sglang_torch",
        *SERVING,
    )
    assert result.returncode != 0
    assert "--losslessness-engine-profile" in result.output
