"""Block verification (Sun et al. 2024, arXiv:2403.10444, Alg. 2) and the acceptance check's
bound for every lossless verifier (issue 12).

Pinned here: the reference block verifier is lossless (exact laws emit p at every position;
sampled laws pass identity tests at a stated level); its prefix acceptance matches its exact
law, exceeds token verification's (so the old per-position bound would have called it LOSSY)
and never exceeds the joint coupling bound; the acceptance check passes it, flags a prefix
acceptance above the bound as LOSSY, holds declared block verifiers to block verification's
rate; the one-sided bound test is calibrated and has its stated power; the property suite
fails the wrong-residual mutant (it passes the block verifier: tests/suite/test_suite_plugin.py).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from losslessness.cases import ChainCase
from losslessness.checks import check_acceptance
from losslessness.engine.draw import sample_chain
from losslessness.laws import chain_laws, prefix_acceptance_bound
from losslessness.protocol import InvalidInputError
from losslessness.reference import (
    BLOCK_VERIFICATION,
    TOKEN_VERIFICATION,
    VERIFICATION_ATTRIBUTE,
    block_laws,
    declared_verification,
    expected_accepted_drafts,
    verify,
    verify_block,
)
from losslessness.results import CheckContext, Verdict
from losslessness.samples import ChainSamples
from losslessness.stats import acceptance_rate_test, identity_test
from losslessness.stats.binomial import rate_bound_minimum_detectable_shift, rate_bound_test
from losslessness.zoo.chain import block_verification_wrong_residual
from tests.suite.runner import run_suite

# The battery's v2-tilted case (losslessness.checks.battery): block verification accepts both
# drafts with probability 0.52, token verification 0.48, the joint bound is 0.6.
TILTED_P = torch.tensor([[[0.3, 0.7], [0.6, 0.4], [0.45, 0.55]]], dtype=torch.float64)
TILTED_Q = torch.tensor([[[0.5, 0.5], [0.2, 0.8]]], dtype=torch.float64)
TILTED = ChainCase("v2-tilted", "V=2 k=2 dense", TILTED_P, TILTED_Q)

ALPHA = 1e-4
"""Per-assertion level of this module's statistical assertions (a few dozen in all: the
module's family-wise false-alarm probability is below 1e-2)."""

STEPS = 20_000


def _random_case(seed: int, vocab: int, k: int, concentration: float = 0.7) -> ChainCase:
    rng = np.random.default_rng([20240313, seed])
    target = rng.dirichlet(np.full(vocab, concentration), size=k + 1)
    draft = rng.dirichlet(np.full(vocab, concentration), size=k)
    draft = np.where(draft < 1e-3, 1e-3, draft)
    draft /= draft.sum(axis=-1, keepdims=True)
    return ChainCase(
        f"random-{seed}",
        f"V={vocab} k={k}",
        torch.from_numpy(target[None]),
        torch.from_numpy(draft[None]),
    )


SMALL_CASES = [_random_case(seed, 2 + seed % 3, 1 + seed % 3) for seed in range(12)]


def _context(case: ChainCase, alpha: float = ALPHA) -> CheckContext:
    return CheckContext.for_case("t", case, alpha=alpha, power=0.9, tv=0.05, seed=0)


@pytest.fixture(scope="module")
def tilted_block() -> ChainSamples:
    """20000 block-verification steps on v2-tilted."""
    return sample_chain(verify_block, TILTED, STEPS, seed=11)


def test_paper_example_block_accepts_eleven_ninths_token_ten_joint_bound_twelve() -> None:
    """Sun et al. 2024, Sec. 1: p = (1/3, 2/3), q = (2/3, 1/3), two drafts: token verification
    accepts 10/9 drafts per step, block verification 11/9, the joint coupling bound sums to
    12/9 (so block verification does not attain the joint bound)."""
    p = torch.tensor([[1 / 3, 2 / 3]] * 3, dtype=torch.float64)
    q = torch.tensor([[2 / 3, 1 / 3]] * 2, dtype=torch.float64)
    laws = block_laws(p, q)
    assert laws is not None
    assert expected_accepted_drafts(laws) == pytest.approx(11 / 9, abs=1e-12)
    assert float(chain_laws(p, q).reach[1:].sum()) == pytest.approx(10 / 9, abs=1e-12)
    bound = prefix_acceptance_bound(p, q)
    assert bool(bound.exact.all())
    assert float(bound.bound[1:].sum()) == pytest.approx(12 / 9, abs=1e-12)
    assert laws.reach[2] == pytest.approx(5 / 9, abs=1e-12)
    assert float(bound.bound[2]) == pytest.approx(6 / 9, abs=1e-12)


@pytest.mark.parametrize("case", SMALL_CASES, ids=lambda case: f"{case.case_id}-{case.summary}")
def test_exact_block_laws_emit_p_and_lie_between_token_rate_and_joint_bound(
    case: ChainCase,
) -> None:
    """Exactly (enumeration): the token emitted at each reached position follows p_i (Sun et
    al., Theorem 1); P(first m drafts accepted) is at least token verification's and at most
    the joint bound 1 - TV(p^m, q^m); the accepted lengths sum to 1."""
    p, q = case.target_probs[0], case.draft_probs[0]
    laws = block_laws(p, q)
    assert laws is not None
    reachable = laws.reach > 0
    np.testing.assert_allclose(laws.emitted[reachable], p.numpy()[reachable], atol=1e-12)
    token = chain_laws(p, q).reach.numpy()
    bound = prefix_acceptance_bound(p, q).bound.numpy()
    assert np.all(laws.reach >= token - 1e-12)
    assert np.all(laws.reach <= bound + 1e-12)
    assert laws.accepted_length.sum() == pytest.approx(1.0, abs=1e-12)


def test_block_verifier_emitted_law_follows_p_identity_test(tilted_block: ChainSamples) -> None:
    """Sampled: among steps that reach position i, the emitted token passes the identity test
    against p_i at level ALPHA, at every position of v2-tilted and of a V=8, k=3 case."""
    wide = _random_case(100, 8, 3, concentration=1.0)
    for samples in (tilted_block, sample_chain(verify_block, wide, STEPS, seed=12)):
        outputs = samples.outputs[0]
        lengths = (outputs >= 0).sum(axis=1)
        p = samples.case.target_probs[0].numpy()
        for i in range(samples.case.k + 1):
            tokens = outputs[lengths > i, i]
            result = identity_test(np.bincount(tokens, minlength=p.shape[1]), p[i])
            assert result.zero_mass_count == 0
            assert result.pvalue > ALPHA, (samples.case.case_id, i, result)


def test_block_prefix_acceptance_matches_its_law_and_beats_token_level(
    tilted_block: ChainSamples,
) -> None:
    """On v2-tilted the fraction of steps accepting both drafts matches block verification's
    exact 0.52 (two-sided binomial, level ALPHA); given position 1 was reached, d_1 is
    accepted at 0.65 > sum min(p_1, q_1) = 0.6, which the old per-position check calls LOSSY
    (p-value far below ALPHA, direction higher)."""
    lengths = (tilted_block.outputs[0] >= 0).sum(axis=1)
    laws = block_laws(TILTED_P[0], TILTED_Q[0])
    assert laws is not None
    both = int((lengths > 2).sum())
    assert acceptance_rate_test(both, STEPS, float(laws.reach[2])).pvalue > ALPHA
    reached = int((lengths > 1).sum())
    old = acceptance_rate_test(
        both, reached, float(chain_laws(TILTED_P[0], TILTED_Q[0]).acceptance[1])
    )
    assert old.direction == "higher" and old.pvalue < 1e-9


@pytest.mark.parametrize("seed", [200, 201, 202])
def test_block_prefix_acceptance_never_exceeds_joint_bound(seed: int) -> None:
    """Sampled: on V=4..6, k=3 cases the count of steps accepting the first m drafts is not
    significantly above the joint bound (one-sided test, level ALPHA), for every m."""
    case = _random_case(seed, 4 + seed % 3, 3)
    samples = sample_chain(verify_block, case, STEPS, seed=seed)
    lengths = (samples.outputs[0] >= 0).sum(axis=1)
    bound = prefix_acceptance_bound(case.target_probs[0], case.draft_probs[0]).bound
    for m in range(1, case.k + 1):
        test = rate_bound_test(int((lengths > m).sum()), STEPS, float(bound[m]), "greater")
        assert test.pvalue > ALPHA, (m, test)


def test_acceptance_check_passes_block_verifier_where_old_check_failed(
    tilted_block: ChainSamples,
) -> None:
    """The acceptance check passes block verification at every position (token or block
    declaration); at position 1 its message names the joint bound, and its details keep the
    conditional rate that exceeds sum min(p_1, q_1)."""
    for verification in (TOKEN_VERIFICATION, BLOCK_VERIFICATION):
        results = check_acceptance(tilted_block, _context(TILTED), verification=verification)
        assert [r.verdict for r in results] == [Verdict.PASS, Verdict.PASS]
    position1 = results[1]
    assert position1.details["prefix_n"] == STEPS and position1.alpha == ALPHA
    assert math.isfinite(position1.min_detectable_tv)
    assert "1 - TV of the joint laws of the first 2 tokens" in position1.message
    assert position1.details["upper_bound"] == pytest.approx(0.6, abs=1e-9)
    assert position1.acceptance is not None
    assert position1.acceptance.observed_rate is not None
    assert position1.acceptance.observed_rate > position1.acceptance.expected_rate + 0.03


def test_prefix_acceptance_above_joint_bound_is_lossy(tilted_block: ChainSamples) -> None:
    """Steps that accept both drafts in 70% of steps (bound 0.6) are LOSSY at position 1,
    whatever the declaration, with the bound named in the message."""
    outputs = tilted_block.outputs.copy()
    rng = np.random.default_rng(3)
    force = rng.random(STEPS) < 0.7
    drafts = tilted_block.drafts[0]
    outputs[0, force, :2] = drafts[force]
    outputs[0, force, 2] = 0
    forced = dataclasses.replace(tilted_block, outputs=outputs)
    for verification in (TOKEN_VERIFICATION, BLOCK_VERIFICATION):
        results = check_acceptance(forced, _context(TILTED), verification=verification)
        assert results[1].verdict is Verdict.LOSSY
        assert "no lossless verifier, block verification included" in results[1].message


def test_declared_block_verification_is_held_to_block_rate() -> None:
    """A verifier declaring block verification that accepts only what token verification
    accepts (the reference, 0.48 < 0.52 for both drafts) is SUBOPTIMAL at position 1, never
    LOSSY; undeclared, the same samples pass."""
    samples = sample_chain(verify, TILTED, STEPS, seed=13)
    declared = check_acceptance(samples, _context(TILTED), verification=BLOCK_VERIFICATION)
    assert [r.verdict for r in declared] == [Verdict.PASS, Verdict.SUBOPTIMAL]
    assert "block verification's exact rate" in declared[1].message
    plain = check_acceptance(samples, _context(TILTED))
    assert [r.verdict for r in plain] == [Verdict.PASS, Verdict.PASS]


def test_verifiers_declare_how_they_verify() -> None:
    """verify_block and the wrong-residual mutant declare block verification; the reference
    declares nothing (token); any other declared value is an error naming the attribute."""
    assert declared_verification(verify_block) == BLOCK_VERIFICATION
    assert declared_verification(block_verification_wrong_residual) == BLOCK_VERIFICATION
    assert declared_verification(verify) == TOKEN_VERIFICATION

    def odd() -> None: ...

    setattr(odd, VERIFICATION_ATTRIBUTE, "tree")
    with pytest.raises(ValueError, match=VERIFICATION_ATTRIBUTE):
        declared_verification(odd)
    with pytest.raises(ValueError, match="verification"):
        check_acceptance(
            sample_chain(verify, TILTED, 10, seed=1), _context(TILTED), verification="x"
        )


@pytest.mark.parametrize(("rate", "n"), [(0.6, 2000), (0.2, 5000), (0.97, 3000)])
def test_rate_bound_test_is_calibrated_and_has_its_stated_power(rate: float, n: int) -> None:
    """At the bound, the one-sided test rejects at most alpha of Binomial(n, bound) samples
    (plus 4 binomial standard errors over 20000 draws); at bound + its minimum detectable
    shift it rejects at least the stated power (minus 4 standard errors); the same for the
    lower side."""
    alpha, power, draws = 0.01, 0.9, 20_000
    rng = np.random.default_rng(int(rate * 1000) + n)
    for side, sign in (("greater", 1.0), ("less", -1.0)):
        shift = rate_bound_minimum_detectable_shift(n, rate, alpha, power, side)
        assert 0 < shift < 1
        for true_rate, claim in ((rate, alpha), (rate + sign * shift, power)):
            counts = rng.binomial(n, true_rate, size=draws)
            rejected = np.mean(
                [rate_bound_test(int(c), n, rate, side).pvalue <= alpha for c in counts]
            )
            slack = 4 * math.sqrt(claim * (1 - claim) / draws)
            if true_rate == rate:
                assert rejected <= alpha + slack, (side, rejected)
            else:
                assert rejected >= power - slack, (side, rejected)


def test_prefix_bound_fallback_is_never_below_the_exact_bound() -> None:
    """With too few cells allowed, the bound falls back to min(exact prefix bound, per-position
    sum min(p, q)), says so, and stays at or above the exact value."""
    case = _random_case(300, 6, 3)
    p, q = case.target_probs[0], case.draft_probs[0]
    exact = prefix_acceptance_bound(p, q)
    fallback = prefix_acceptance_bound(p, q, max_cells=10)
    assert bool(exact.exact.all()) and bool(fallback.exact[1])
    assert not bool(fallback.exact[2:].any())
    assert bool((fallback.bound >= exact.bound - 1e-12).all())
    assert "too many cells" in fallback.describe(3)
    with pytest.raises(ValueError, match="max_cells"):
        prefix_acceptance_bound(p, q, max_cells=0)


def test_block_verifier_validates_inputs_like_the_reference() -> None:
    """Malformed inputs raise InvalidInputError naming the argument; k = 0 emits the bonus."""
    generator = torch.Generator().manual_seed(0)
    p, q = TILTED_P.clone(), TILTED_Q.clone()
    with pytest.raises(InvalidInputError, match=r"^draft_probs"):
        verify_block(p, q[:, :1], torch.zeros((1, 2), dtype=torch.int64), generator)
    zero_q = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]], dtype=torch.float64)
    with pytest.raises(InvalidInputError, match=r"^draft_token_ids"):
        verify_block(p, zero_q, torch.tensor([[1, 0]]), generator)
    with pytest.raises(InvalidInputError, match=r"^generator"):
        verify_block(p, q, torch.tensor([[0, 0]]), None)  # type: ignore[arg-type]
    out = verify_block(p[:, :1], q[:, :0], torch.zeros((1, 0), dtype=torch.int64), generator)
    assert out.shape == (1, 1) and out.dtype == torch.int64


def test_property_suite_fails_block_verification_with_wrong_residual(tmp_path: Path) -> None:
    """The suite fails the wrong-residual mutant with a LOSSY law (ci profile). It needs V >= 3,
    k >= 2 and a prefix weight below 1 to show: the chain witness example has them; without it
    the ci profile's generated cases missed the mutant. (That block verification itself passes
    the suite is pinned with the zoo's other lossless controls, tests/suite/
    test_suite_plugin.py.)"""
    result = run_suite(
        tmp_path, "--losslessness-profile=ci",
        "--losslessness-target=losslessness.zoo.chain:block_verification_wrong_residual",
    )
    assert result.returncode == 1, result.output
    assert "LOSSY law at position" in result.stdout
