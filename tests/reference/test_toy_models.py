"""Toy Markov language models and the exact law of their first L tokens: the law is the product
of next-token laws (checked against brute force over all V^L sequences), sampling parameters
enter it, plain autoregressive sampling follows it, and bad input is named."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from losslessness.laws import acceptance_probability
from losslessness.protocol import InvalidInputError
from losslessness.reference.decoding import sample_autoregressive
from losslessness.reference.processing import SamplingParameters
from losslessness.reference.sequences import exact_sequence_law
from losslessness.reference.toy import MarkovLM
from losslessness.stats import identity_test

SEED = 7
"""Seed of every random draw in this file (tables and samples)."""


def test_order_two_model_conditions_on_the_last_two_tokens_only() -> None:
    """Prefixes sharing their last two tokens get the same law; the start symbol pads short
    prefixes, so the empty prefix and a one-token prefix have laws of their own."""
    model = MarkovLM.random(5, order=2, sharpness=2.0, seed=SEED)
    assert torch.equal(model.next_token_logits([0, 3, 1, 2]), model.next_token_logits([4, 1, 2]))
    assert not torch.equal(model.next_token_logits([1, 2]), model.next_token_logits([2, 2]))
    assert model.state([]) == 5 * 6 + 5
    assert model.state([3]) == 5 * 6 + 3
    assert model.state([2, 3]) == 2 * 6 + 3


def test_sharpness_lowers_the_entropy_of_next_token_laws() -> None:
    """Adjustable sharpness: a larger logit scale gives a more deterministic model (mean
    entropy strictly decreasing), 0 the uniform one."""
    entropies = []
    for sharpness in (0.0, 1.0, 3.0, 8.0):
        probs = MarkovLM.random(6, 1, sharpness, seed=SEED).processed_table(SamplingParameters())
        entropies.append(float(-(probs * probs.log()).sum(dim=1).mean()))
    assert entropies[0] == pytest.approx(np.log(6))
    assert entropies == sorted(entropies, reverse=True) and len(set(entropies)) == 4


def test_perturbed_draft_moves_away_from_the_target_as_noise_grows() -> None:
    """The draft's mean acceptance rate sum min(p, q) is 1 at noise 0 and falls with noise."""
    target = MarkovLM.random(6, 2, 1.5, seed=SEED)
    p = target.processed_table(SamplingParameters())
    rates = []
    for noise in (0.0, 0.3, 1.0, 3.0):
        q = target.perturbed(noise, seed=SEED + 1).processed_table(SamplingParameters())
        rates.append(float(acceptance_probability(p, q).mean()))
    assert rates[0] == pytest.approx(1.0)
    assert rates == sorted(rates, reverse=True) and rates[-1] < 0.7


@pytest.mark.parametrize(
    "sampling",
    [None, SamplingParameters(temperature=0.7), SamplingParameters(top_k=2, top_p=0.8)],
    ids=["plain", "temperature", "top-k-top-p"],
)
def test_sequence_law_equals_the_product_of_next_token_laws(
    sampling: SamplingParameters | None,
) -> None:
    """Brute force over all V^L sequences: P(x) = prod_t p(x_t | prompt, x_<t); the enumerated
    law lists exactly the positive ones, sums to 1, and calls the law once per prefix."""
    model = MarkovLM.random(4, 2, 2.0, seed=SEED)

    def law_of(prefix: list[int]) -> torch.Tensor:
        return model.next_token_probs(prefix, sampling)

    law = exact_sequence_law(law_of, [2], 3, 4)
    expected = {}
    for sequence in itertools.product(range(4), repeat=3):
        probability = 1.0
        for t in range(3):
            probability *= float(law_of([2, *sequence[:t]])[sequence[t]])
        if probability > 0:
            expected[sequence] = probability
    assert dict(zip(law.sequences, law.probs.tolist(), strict=True)) == pytest.approx(expected)
    assert list(law.sequences) == sorted(law.sequences)
    assert law.probs.sum() == pytest.approx(1.0)
    if sampling is not None and sampling.top_k is not None:
        assert law.n_cells < 4**3
    assert law.law_calls == 1 + len({s[:1] for s in law.sequences}) + len(
        {s[:2] for s in law.sequences}
    )


def test_plain_autoregressive_sampling_follows_the_exact_law() -> None:
    """Identity test at level 1e-3 (seeded): 4000 sequences of 3 tokens sampled token by token
    match the enumerated law (a check of the enumeration and of the sampler together)."""
    model = MarkovLM.random(4, 2, 1.0, seed=SEED)
    sampling = SamplingParameters(temperature=0.8)

    def law_of(prefix: list[int]) -> torch.Tensor:
        return model.next_token_probs(prefix, sampling)

    law = exact_sequence_law(law_of, [1, 3], 3, 4)
    generator = torch.Generator().manual_seed(SEED)
    index = law.index()
    draws = [index[tuple(sample_autoregressive(law_of, [1, 3], 3, generator))] for _ in range(4000)]
    result = identity_test(np.bincount(draws, minlength=law.n_cells), law.probs)
    assert result.pvalue > 1e-3, (result, SEED)


def test_law_with_too_many_cells_is_refused_naming_new_tokens() -> None:
    """V^L beyond max_cells raises instead of enumerating for minutes."""
    model = MarkovLM.random(8, 1, 1.0, seed=SEED)
    with pytest.raises(ValueError, match=r"^new_tokens: .* 512 positive-probability"):
        exact_sequence_law(lambda prefix: model.next_token_probs(prefix), [0], 4, 8, max_cells=500)


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (torch.tensor([0.5, 0.5]), "expected a \\[3\\] tensor"),
        (torch.tensor([0.5, 0.6, 0.0], dtype=torch.float64), "sums to"),
        (torch.tensor([1.5, -0.5, 0.0], dtype=torch.float64), "negative mass"),
        (torch.tensor([1, 0, 0]), "expected floats"),
    ],
)
def test_malformed_next_token_law_is_named(row: torch.Tensor, problem: str) -> None:
    """A next_token_probs returning a wrong shape, unnormalised, negative or integer row raises
    InvalidInputError naming next_token_probs."""
    with pytest.raises(InvalidInputError, match=rf"^next_token_probs: .*{problem}"):
        exact_sequence_law(lambda prefix: row, [0], 2, 3)


@pytest.mark.parametrize(
    ("build", "argument"),
    [
        (lambda: MarkovLM.random(1), "vocab_size"),
        (lambda: MarkovLM.random(4, order=3), "order"),
        (lambda: MarkovLM.random(4, sharpness=-1.0), "sharpness"),
        (lambda: MarkovLM(torch.zeros(4, 3), order=2), "logits"),
        (lambda: MarkovLM(torch.full((4, 3), float("nan")), order=1), "logits"),
        (lambda: MarkovLM(torch.full((4, 3), -float("inf")), order=1), "logits"),
        (lambda: MarkovLM.random(4).perturbed(float("inf"), 0), "noise"),
        (lambda: MarkovLM.random(4).next_token_logits([4]), "prefix_ids"),
        (lambda: exact_sequence_law(lambda p: torch.ones(2) / 2, [], 0, 2), "new_tokens"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(build: object, argument: str) -> None:
    """Every constructor and query names the offending argument."""
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        build()  # type: ignore[operator]
