"""The reference spec-decode loop: its acceptance rate is sum min(p, q) at every context
(binomial tests), its mean accepted length inverts to that alpha, greedy loops equal plain
greedy decoding token for token, the n-gram proposer accepts far more on repetitive text than
on random text, and its counters add up."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from losslessness.laws import acceptance_probability
from losslessness.reference.decoding import (
    DecodingCounters,
    SpeculativeDecoder,
    VerifyStep,
    greedy_decode,
)
from losslessness.reference.processing import SamplingParameters
from losslessness.reference.proposers import (
    DraftModelProposer,
    NgramProposer,
    Proposal,
    one_hot_rows,
)
from losslessness.reference.toy import MarkovLM
from losslessness.stats import acceptance_rate_test
from losslessness.theory import alpha_from_mean_accepted_length, expected_tokens_per_verify
from losslessness.zoo.chain import sample_and_match

SEED = 3
"""Seed of the models and of every generate call here (sequence j uses SEED + j)."""

FAMILY_ALPHA = 1e-3
"""False-alarm rate of each statistical test function below (Bonferroni inside)."""

SAMPLING = SamplingParameters(temperature=0.8, top_k=4)


def draft_loop(verifier: object = None, k: int = 3) -> SpeculativeDecoder:
    target = MarkovLM.random(5, order=1, sharpness=1.5, seed=SEED)
    draft = target.perturbed(0.8, seed=SEED + 1)
    kwargs = {} if verifier is None else {"verifier": verifier}
    return SpeculativeDecoder(target, DraftModelProposer(draft, SAMPLING), k, SAMPLING, **kwargs)  # type: ignore[arg-type]


def acceptance_by_context(loop: SpeculativeDecoder, sequences: int) -> list[tuple[int, int, float]]:
    """Run the loop and return, per context state, (accepted, verified, exact rate)."""
    tallies: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    rates: dict[int, float] = {}

    def record(step: VerifyStep) -> None:
        context = list(step.context)
        for i in range(min(step.accepted_length + 1, len(step.draft_token_ids))):
            state = loop.target.state(context + list(step.draft_token_ids[:i]))  # type: ignore[attr-defined]
            rates[state] = float(acceptance_probability(step.target_probs[i], step.draft_probs[i]))
            tallies[state][0] += int(i < step.accepted_length)
            tallies[state][1] += 1

    for j in range(sequences):
        loop.generate([0], 12, SEED + j, on_step=record)
    return [(tallies[s][0], tallies[s][1], rates[s]) for s in sorted(tallies)]


def rejected_contexts(tallies: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """The contexts whose acceptance count a two-sided binomial test rejects at
    FAMILY_ALPHA / #contexts."""
    level = FAMILY_ALPHA / len(tallies)
    return [
        (accepted, verified, rate)
        for accepted, verified, rate in tallies
        if acceptance_rate_test(accepted, verified, rate).pvalue <= level
    ]


def test_acceptance_rate_matches_sum_min_p_q_at_every_context() -> None:
    """Per context (first-order models: the state is the last token), the drafts verified
    there are accepted at rate sum min(p_i, q_i) computed from the step's own rows; two-sided
    binomial tests at 1e-3 family-wise."""
    tallies = acceptance_by_context(draft_loop(), 400)
    assert len(tallies) >= 4 and min(verified for _, verified, _ in tallies) > 100
    assert not rejected_contexts(tallies), (tallies, SEED)


def test_acceptance_test_detects_a_suboptimal_sample_and_match_verifier() -> None:
    """Power control for the test above: sample-and-match (lossless, accepts sum p q) inside the
    same loop is rejected at some context."""
    tallies = acceptance_by_context(draft_loop(verifier=sample_and_match), 400)
    assert rejected_contexts(tallies), tallies


def test_loop_hands_the_verifier_the_models_processed_laws() -> None:
    """Row i of target_probs is the target's processed law after context + d_<i, and row i of
    draft_probs the draft's: the sampling parameters reach both."""
    loop = draft_loop()
    steps: list[VerifyStep] = []
    loop.generate([2], 8, SEED, on_step=steps.append)
    proposer = loop.proposer
    assert isinstance(proposer, DraftModelProposer)
    for step in steps:
        for i in range(len(step.draft_token_ids) + 1):
            prefix = list(step.context) + list(step.draft_token_ids[:i])
            assert torch.equal(step.target_probs[i], loop.target.next_token_probs(prefix, SAMPLING))
            if i < len(step.draft_token_ids):
                assert torch.equal(
                    step.draft_probs[i], proposer.model.next_token_probs(prefix, SAMPLING)
                )
                assert step.draft_probs[i, step.draft_token_ids[i]] > 0


def test_mean_accepted_length_inverts_to_the_acceptance_rate() -> None:
    """Context-free (order-0) models make acceptance i.i.d. with alpha = sum min(p, q): the mean
    accepted length per verify step is within 4.4 standard errors (two-sided 1e-5) of the
    model's E - 1, and alpha_from_mean_accepted_length recovers alpha within 0.03."""
    k = 4
    target = MarkovLM.random(6, order=0, sharpness=1.0, seed=SEED)
    draft = target.perturbed(0.7, seed=SEED + 1)
    loop = SpeculativeDecoder(target, DraftModelProposer(draft), k)
    alpha = float(acceptance_probability(target.next_token_probs([]), draft.next_token_probs([])))
    for j in range(100):
        loop.generate([], 40, SEED + j)
    counters = loop.counters
    lengths = torch.arange(k + 1, dtype=torch.float64)
    law = torch.tensor([alpha**j * (1 - alpha) for j in range(k)] + [alpha**k])
    mean, variance = float((lengths * law).sum()), float((lengths**2 * law).sum())
    standard_error = ((variance - mean**2) / counters.verify_steps) ** 0.5
    assert mean == pytest.approx(expected_tokens_per_verify(alpha, k) - 1)
    assert abs(counters.mean_accepted_length - mean) < 4.4 * standard_error, (counters, alpha)
    backed_out = alpha_from_mean_accepted_length(counters.mean_accepted_length, k)
    print(f"alpha {alpha:.4f}, backed out of the mean accepted length: {backed_out:.4f}")
    assert backed_out == pytest.approx(alpha, abs=0.03), (backed_out, alpha)


@pytest.mark.parametrize("prompt", [[0], [3, 1], [4, 4, 2]])
def test_greedy_draft_model_loop_equals_plain_greedy_decoding(prompt: list[int]) -> None:
    """Greedy: token for token equal to argmax decoding of the processed target law."""
    target = MarkovLM.random(6, order=2, sharpness=1.0, seed=SEED)
    loop = SpeculativeDecoder(
        target,
        DraftModelProposer(target.perturbed(2.0, seed=SEED + 1), SAMPLING, greedy=True),
        4,
        SAMPLING,
        greedy=True,
    )
    expected = greedy_decode(loop.next_token_probs, prompt, 40)
    assert loop.generate(prompt, 40, SEED) == expected
    assert loop.counters.accepted > 0 and loop.counters.rejected > 0


def ngram_tokens_per_step(model: MarkovLM, greedy: bool, prompt: list[int]) -> DecodingCounters:
    loop = SpeculativeDecoder(model, NgramProposer(5, max_ngram=2), 4, None, greedy=greedy)
    for j in range(20):
        output = loop.generate(prompt, 60, SEED + j)
        if greedy:
            assert output == greedy_decode(loop.next_token_probs, prompt, 60)
    return loop.counters


def test_ngram_proposer_accepts_far_more_on_repetitive_text_than_on_random_text() -> None:
    """Repetitive text (greedy decoding of a sharp model, which cycles) against random text
    (sampling a nearly uniform model): tokens per verify step (reported in the message) is
    far higher on the first; greedy output equals plain greedy decoding exactly."""
    repetitive = ngram_tokens_per_step(MarkovLM.random(5, 1, 3.0, seed=0), True, [0])
    random_text = ngram_tokens_per_step(MarkovLM.random(5, 1, 0.2, seed=0), False, [0])
    report = (
        f"tokens per verify step: repetitive {repetitive.tokens_per_step:.2f} (acceptance "
        f"{repetitive.acceptance_rate:.2f}), random {random_text.tokens_per_step:.2f} "
        f"(acceptance {random_text.acceptance_rate:.2f})"
    )
    print(report)
    assert repetitive.tokens_per_step > 3.5, report
    assert random_text.tokens_per_step < 1.5, report
    assert repetitive.acceptance_rate > 3 * random_text.acceptance_rate, report


@pytest.mark.parametrize("seed", range(5))
def test_greedy_ngram_loop_equals_plain_greedy_decoding_on_a_flat_model(seed: int) -> None:
    """Greedy n-gram on text with no useful repetition (drafts mostly rejected) still equals
    plain greedy decoding exactly."""
    model = MarkovLM.random(7, 2, 0.5, seed=seed)
    loop = SpeculativeDecoder(model, NgramProposer(7, max_ngram=3), 3, None, greedy=True)
    prompt = [1, 2, 3, 1, 2, 4]
    assert loop.generate(prompt, 30, seed) == greedy_decode(loop.next_token_probs, prompt, 30)


def test_ngram_lookup_takes_the_longest_ngram_and_its_earliest_match() -> None:
    """Longest n-gram first, earliest occurrence, up to k tokens; no match proposes nothing."""
    proposer = NgramProposer(10, max_ngram=2)
    assert proposer.lookup([5, 6, 7, 8, 1, 6, 9, 5, 6], 3) == [7, 8, 1]
    assert proposer.lookup([1, 2, 9, 3, 2], 2) == [9, 3]
    assert proposer.lookup([1, 2, 3], 3) == []
    proposal = proposer.propose([4, 4, 4, 4], 3, torch.Generator())
    assert proposal.token_ids == [4, 4]
    assert torch.equal(proposal.probs.argmax(dim=1), torch.tensor([4, 4]))
    assert torch.equal(proposal.probs.sum(dim=1), torch.ones(2, dtype=torch.float64))


def test_counters_add_up_and_generate_is_reproducible_per_seed() -> None:
    """drafted >= accepted + rejected; emitted = accepted + verify steps; the histogram sums to
    the verify steps; the same seed gives the same tokens, other seeds other tokens."""
    loop = draft_loop()
    outputs = [loop.generate([1], 20, seed) for seed in (5, 5, 6, 7)]
    counters = loop.counters
    assert outputs[0] == outputs[1] and len(outputs[0]) == 20
    assert len({tuple(output) for output in outputs}) == 3
    assert counters.drafted >= counters.accepted + counters.rejected
    assert counters.emitted == counters.accepted + counters.verify_steps
    assert sum(counters.accepted_lengths.values()) == counters.verify_steps
    assert counters.tokens_per_step == pytest.approx(1 + counters.mean_accepted_length)
    assert loop.accepted_length_counts() == dict(sorted(counters.accepted_lengths.items()))


def test_k_zero_is_plain_decoding_through_the_verifier() -> None:
    """With no drafts every verify step emits exactly one token."""
    target = MarkovLM.random(5, 1, 1.0, seed=SEED)
    loop = SpeculativeDecoder(target, DraftModelProposer(target), 0)
    assert len(loop.generate([0], 10, SEED)) == 10
    assert loop.counters.verify_steps == 10 and loop.counters.drafted == 0


def test_bad_arguments_are_named() -> None:
    """k < 0, a proposer over another vocabulary, bad n-gram sizes, negative max_new_tokens."""
    target = MarkovLM.random(5, 1, 1.0, seed=SEED)
    with pytest.raises(ValueError, match=r"^k:"):
        SpeculativeDecoder(target, DraftModelProposer(target), -1)
    with pytest.raises(ValueError, match=r"^proposer:"):
        SpeculativeDecoder(target, NgramProposer(6), 2)
    with pytest.raises(ValueError, match="max_ngram, min_ngram"):
        NgramProposer(5, max_ngram=1, min_ngram=2)
    with pytest.raises(ValueError, match=r"^max_new_tokens:"):
        SpeculativeDecoder(target, NgramProposer(5), 2).generate([0], -1, 0)


@pytest.mark.parametrize(
    "row",
    [[-1, 3, -1, -1], [4, 4, 4, 4], [0, 1, -1, 2]],
    ids=["hole-first", "not-the-drafts", "token-after-placeholder"],
)
def test_malformed_verifier_output_raises_instead_of_feeding_the_context(row: list[int]) -> None:
    """A verifier whose row is not 'accepted drafts, one token, then -1' stops the loop with a
    RuntimeError naming the row (drafts here are always [0, 1, 2])."""

    class FixedDrafts:
        vocab_size = 5

        def propose(self, context: object, k: int, generator: torch.Generator) -> Proposal:
            return Proposal([0, 1, 2], one_hot_rows([0, 1, 2], 5))

    def broken(*args: object) -> torch.Tensor:
        return torch.tensor([row])

    target = MarkovLM.random(5, 1, 1.0, seed=SEED)
    loop = SpeculativeDecoder(target, FixedDrafts(), 3, verifier=broken)
    with pytest.raises(RuntimeError, match="verifier emitted"):
        loop.generate([0], 4, SEED)
