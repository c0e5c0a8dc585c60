"""ONNX Runtime GenAI 0.18.0 as an engine target (needs its environment built: ``python -m
losslessness.adapters.e2e.onnxruntime_genai``; skipped with that reason otherwise, except the
sampler-law tests, which need numpy only): the server stops with no process left, its law
agrees with transformers on the same weights, a seed reproduces a request, greedy decoding with
speculation is greedy decoding of the engine's own law, and both drafters draft and get drafts
accepted."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from losslessness.adapters import AdapterUnavailable
from losslessness.adapters.e2e.engine import LAW_TOLERANCE, Sampling
from losslessness.adapters.e2e.models import (
    TinyModels,
    continued_prompt_ids,
    transformers_next_token_probs,
)
from losslessness.adapters.e2e.onnxruntime_genai import (
    ORTGENAI_CASES,
    OrtGenAIClient,
    ortgenai_client,
)
from losslessness.adapters.e2e.process import EngineProcessError
from losslessness.adapters.e2e.shims.ortgenai_server import processed_law
from losslessness.reference.decoding import greedy_decode

FILTERED = Sampling(temperature=0.8, top_k=20, top_p=0.9)


# --------------------------------------------------------------------------- the sampler's law


def test_the_law_of_greedy_and_of_top_k_1_is_the_argmax() -> None:
    """Greedy decoding's law is the unprocessed softmax (argmax: the token taken); top_k 1
    with sampling is greedy in the engine (InitializeSamplingMethod), a point mass."""
    logits = np.array([0.5, 2.0, -1.0, 2.0], dtype=np.float32)
    law = processed_law(logits, None, None, None)
    expected = np.exp(logits - 2.0) / np.exp(logits - 2.0).sum()
    assert np.allclose(law, expected) and int(np.argmax(law)) == 1
    assert processed_law(logits, 0.7, 1, None).tolist() == [0.0, 1.0, 0.0, 0.0]


def test_top_k_then_top_p_keeps_the_shortest_prefix_reaching_top_p_of_the_tempered_law() -> None:
    """ComputeSampledCategorical: top-k of the logits, softmax at T, then the shortest prefix
    whose running sum is >= top_p, renormalised."""
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    law = processed_law(logits, 1.0, 3, 0.8)  # 0.5 + 0.3 / 0.95 >= 0.8: two kept
    assert np.allclose(law, [0.625, 0.375, 0.0, 0.0], atol=1e-6)
    law = processed_law(logits, 1.0, 3, None)
    assert np.allclose(law, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0], atol=1e-6)
    hot = processed_law(logits, 2.0, None, None)
    tempered = np.sqrt([0.5, 0.3, 0.15, 0.05])
    assert np.allclose(hot, tempered / tempered.sum(), atol=1e-6)


def test_with_top_p_off_the_nucleus_drops_only_weights_below_float32_rounding() -> None:
    """top_k 0, top_p 1 still goes through FindNucleus: tokens whose weight is below the
    float32 rounding of the running sum are dropped, nothing else."""
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(256) * 5).astype(np.float32)
    logits[:3] = -60.0
    law = processed_law(logits, 1.0, None, None)
    softmax = np.exp(logits.astype(np.float64) - logits.max())
    softmax /= softmax.sum()
    assert abs(law.sum() - 1.0) < 1e-12
    assert float(np.abs(law - softmax).max()) < 1e-6
    assert law[:3].tolist() == [0.0, 0.0, 0.0]


# --------------------------------------------------------------------------- the engine


def _client(mode: str) -> tuple[OrtGenAIClient, TinyModels]:
    try:
        return ortgenai_client(mode)
    except AdapterUnavailable as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def draft() -> Iterator[tuple[OrtGenAIClient, TinyModels]]:
    client, models = _client("draft")
    yield client, models
    client.close()


@pytest.fixture(scope="module")
def ngram() -> Iterator[tuple[OrtGenAIClient, TinyModels]]:
    client, models = _client("ngram")
    yield client, models
    client.close()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_server_stops_with_no_process_left() -> None:
    """close() stops the server process and its process group; a closed client starts a
    fresh server on its next request, which close() stops too."""
    client, _ = _client("ngram")
    try:
        first = int(client.health()["pid"])
        client.close()
        assert not client.server.alive and _gone(first)
        second = int(client.health()["pid"])
        assert second != first and client.server.alive
    finally:
        client.close()
    assert not client.server.alive and _gone(second)


def test_the_engines_law_agrees_with_transformers_on_the_same_weights(
    draft: tuple[OrtGenAIClient, TinyModels],
) -> None:
    """At temperature 1 without filters, get_logits() of the plain target, processed as the
    sampler does, is transformers' softmax within LAW_TOLERANCE at every prefix tried."""
    client, models = draft
    prompt = list(models.prompt_ids(ORTGENAI_CASES[0].prompt))
    for extra in ([], [40], [40, 7, 99]):
        law = torch.tensor(client.next_token_law(prompt + extra, Sampling()),
                           dtype=torch.float64)
        reference = transformers_next_token_probs(models.target, prompt + extra)
        assert float((law - reference).abs().max()) < LAW_TOLERANCE


def test_a_seed_reproduces_its_request_and_both_drafters_draft(
    draft: tuple[OrtGenAIClient, TinyModels], ngram: tuple[OrtGenAIClient, TinyModels],
) -> None:
    """The same seed twice gives the same tokens with speculation on, for both drafters and
    both sampled settings; over the requests the engine's own counters show drafts proposed
    and accepted (0 < accepted <= drafted)."""
    for (client, _), prompt_ids in ((draft, draft[1].prompt_ids),
                                    (ngram, continued_prompt_ids(ngram[1]))):
        prompt = list(prompt_ids(ORTGENAI_CASES[1].prompt))
        drafted = accepted = 0
        for sampling in (Sampling(), FILTERED):
            for seed in range(8):
                first, drafts, accepts = client.generate(prompt, 4, seed, sampling)
                again, _, _ = client.generate(prompt, 4, seed, sampling)
                assert first == again and len(first) == 4
                drafted, accepted = drafted + drafts, accepted + accepts
        assert 0 < accepted <= drafted, client.description


def test_greedy_with_speculation_equals_greedy_decoding_of_the_engines_law(
    draft: tuple[OrtGenAIClient, TinyModels], ngram: tuple[OrtGenAIClient, TinyModels],
) -> None:
    """Greedy requests with the draft model or n-grams on: plain greedy decoding of the
    engine's own law, whatever the seed."""
    for (client, _), prompt_ids in ((draft, draft[1].prompt_ids),
                                    (ngram, continued_prompt_ids(ngram[1]))):
        prompt = list(prompt_ids(ORTGENAI_CASES[3].prompt))
        expected = greedy_decode(
            lambda prefix, client=client: torch.tensor(
                client.next_token_law(prefix, Sampling(temperature=None))
            ),
            prompt, 6,
        )
        for seed in range(3):
            assert client.generate(prompt, 6, seed, Sampling(temperature=None))[0] == expected


def test_min_p_is_refused(draft: tuple[OrtGenAIClient, TinyModels]) -> None:
    """ONNX Runtime GenAI has no min-p filter: a request asking for one is refused, never
    served without it."""
    client, models = draft
    with pytest.raises(EngineProcessError, match="min_p"):
        client.generate(list(models.prompt_ids("Ba")), 2, 0, Sampling(min_p=0.05))
