"""Unit tests of the checks on crafted samples: each violation kind is caught by the check
that owns it, with the verdict the design assigns (LOSSY vs SUBOPTIMAL), and clean samples
pass."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from losslessness.cases import ChainCase
from losslessness.checks import (
    check_acceptance,
    check_conditional_laws,
    check_row_independence,
    check_structure,
)
from losslessness.engine.draw import sample_chain
from losslessness.reference import verify
from losslessness.results import CheckContext, CheckKind, Verdict
from losslessness.samples import ChainSamples

P = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]], dtype=torch.float64)
Q = torch.tensor([[[0.25, 0.25, 0.5]]], dtype=torch.float64)
CASE = ChainCase("tiny", "V=3 k=1", P, Q)
CONTEXT = CheckContext(
    "t", "tiny", "V=3 k=1", CASE.case_hash, alpha=1e-3, power=0.9, tv=0.1, seed=1
)


@pytest.fixture(scope="module")
def clean() -> ChainSamples:
    """20000 reference steps on the tiny case (acceptance sum min(p, q) = 0.5)."""
    return sample_chain(verify, CASE, 20_000, seed=5)


def with_outputs(samples: ChainSamples, outputs: np.ndarray) -> ChainSamples:
    return dataclasses.replace(samples, outputs=outputs)


def test_clean_samples_pass_every_check(clean: ChainSamples) -> None:
    """The reference's samples pass structure, laws and acceptance."""
    results = [check_structure(clean, CONTEXT)]
    results += check_conditional_laws(clean, CONTEXT) + check_acceptance(clean, CONTEXT)
    assert {r.verdict for r in results} == {Verdict.PASS}


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ([3, -1], "token id outside [0, V)"),
        ([-1, 1], "token after a placeholder -1"),
        ([-1, -1], "no token emitted"),
    ],
)
def test_structure_flags_each_malformation(
    clean: ChainSamples, row: list[int], problem: str
) -> None:
    """One malformed row among 20000 makes ``structure`` LOSSY and is named."""
    outputs = clean.outputs.copy()
    outputs[0, 17] = row
    result = check_structure(with_outputs(clean, outputs), CONTEXT)
    assert result.verdict is Verdict.LOSSY
    assert result.details["violations"][problem] == 1
    assert "step 17" in result.message


def test_structure_flags_an_accepted_token_that_is_not_the_draft(clean: ChainSamples) -> None:
    """Emitting a token other than the draft while continuing the chain is a violation."""
    outputs, drafts = clean.outputs.copy(), clean.drafts
    step = int(np.flatnonzero(outputs[0, :, 1] != -1)[0])
    outputs[0, step, 0] = (drafts[0, step, 0] + 1) % 3
    result = check_structure(with_outputs(clean, outputs), CONTEXT)
    assert result.details["violations"]["accepted token differs from the draft"] == 1


def test_law_flags_a_single_zero_probability_token(clean: ChainSamples) -> None:
    """One emission of a p = 0 token at position 0 makes ``law`` LOSSY exactly."""
    outputs = clean.outputs.copy()
    step = int(np.flatnonzero(outputs[0, :, 1] == -1)[0])
    outputs[0, step, 0] = 2
    results = check_conditional_laws(with_outputs(clean, outputs), CONTEXT)
    position0 = next(r for r in results if r.position == 0)
    assert position0.verdict is Verdict.LOSSY
    assert "p = 0" in position0.message


def test_law_flags_a_biased_bonus_token(clean: ChainSamples) -> None:
    """Bonus tokens drawn from the wrong law are caught at position k, with its p-value."""
    outputs = clean.outputs.copy()
    bonus = outputs[0, :, 1] != -1
    outputs[0, bonus, 1] = np.where(np.arange(int(bonus.sum())) % 2 == 0, 0, 2)
    results = check_conditional_laws(with_outputs(clean, outputs), CONTEXT)
    bonus_result = next(r for r in results if r.position == 1)
    assert bonus_result.verdict is Verdict.LOSSY and bonus_result.kind is CheckKind.STATISTICAL
    assert bonus_result.p_value is not None and bonus_result.p_value <= CONTEXT.alpha


def _acceptance_with_rate(clean: ChainSamples, rate: float) -> ChainSamples:
    outputs = clean.outputs.copy()
    n = outputs.shape[1]
    accept = np.random.default_rng(0).random(n) < rate
    outputs[0, :, 0] = np.where(accept, clean.drafts[0, :, 0], outputs[0, :, 0])
    outputs[0, :, 1] = np.where(accept, 0, -1)
    return with_outputs(clean, outputs)


def test_acceptance_above_sum_min_is_lossy(clean: ChainSamples) -> None:
    """Accepting more often than sum min(p, q) proves loss."""
    (result,) = check_acceptance(_acceptance_with_rate(clean, 0.6), CONTEXT)
    assert result.verdict is Verdict.LOSSY and result.details["direction"] == "higher"


def test_acceptance_below_sum_min_is_suboptimal_only(clean: ChainSamples) -> None:
    """Accepting less often than sum min(p, q) is a SUBOPTIMAL warning, not a loss."""
    (result,) = check_acceptance(_acceptance_with_rate(clean, 0.4), CONTEXT)
    assert result.verdict is Verdict.SUBOPTIMAL and result.details["direction"] == "lower"


def test_case_rejects_invalid_tensors() -> None:
    """A ChainCase validates its tensors like a verifier call would."""
    with pytest.raises(ValueError, match="target_probs"):
        ChainCase("bad", "", P * 2, Q)


def test_independence_flags_paired_rows_that_copy_each_other() -> None:
    """Identical rows of one call that emit the same first token (shared randomness) make
    ``independence`` LOSSY; the clean samples pass it."""
    case = ChainCase(
        "dense",
        "V=6 k=1",
        torch.full((1, 2, 6), 1 / 6, dtype=torch.float64),
        torch.tensor([[[0.5, 0.1, 0.1, 0.1, 0.1, 0.1]]], dtype=torch.float64),
    )
    samples = sample_chain(verify, case, 4000, seed=9)
    (clean,) = check_row_independence(samples, CONTEXT)
    assert clean.verdict is Verdict.PASS
    copied = samples.outputs.copy()
    copied[0, 1::2] = copied[0, 0::2]
    (result,) = check_row_independence(with_outputs(samples, copied), CONTEXT)
    assert result.verdict is Verdict.LOSSY and "dependent" in result.message
