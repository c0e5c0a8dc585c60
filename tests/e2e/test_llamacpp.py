"""llama.cpp's llama-server as an engine target (needs the server built: ``python -m
losslessness.adapters.e2e.llamacpp``, which ``tox -e e2e`` runs; skipped with that reason
otherwise): its law agrees with transformers on the same weights, a seed reproduces a
request, greedy drafting is the target's own sampling (same seed, same tokens as the server
without a draft), and the servers stop with the client."""

from __future__ import annotations

import pytest
import torch

from losslessness.adapters import AdapterUnavailable
from losslessness.adapters.e2e.engine import LAW_TOLERANCE, Sampling
from losslessness.adapters.e2e.llamacpp import (
    DRAFT_FLAGS,
    LlamaCppClient,
    LlamaCppInstall,
    installed,
)
from losslessness.adapters.e2e.models import transformers_next_token_probs
from losslessness.reference.decoding import greedy_decode


@pytest.fixture(scope="module")
def install() -> LlamaCppInstall:
    try:
        return installed()
    except AdapterUnavailable as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def client(install: LlamaCppInstall):  # type: ignore[no-untyped-def]
    flags = ["-md", str(install.draft), "--spec-type", "draft-simple", *DRAFT_FLAGS]
    engine = LlamaCppClient(install, "draft", flags)
    yield engine
    engine.close()
    assert not engine.speculative.alive and not engine.plain.alive


def test_the_servers_law_agrees_with_transformers_on_the_same_weights(
    install: LlamaCppInstall, client: LlamaCppClient
) -> None:
    """At temperature 1 without filters, the server's float32 law (f32 KV cache, no flash
    attention) is transformers' softmax within LAW_TOLERANCE at every prefix tried."""
    prompt = list(install.models.prompt_ids("Ba ko tenu rasi"))
    for extra in ([], [40], [40, 7, 99]):
        law = torch.tensor(client.next_token_law(prompt + extra, Sampling()), dtype=torch.float64)
        reference = transformers_next_token_probs(install.models.target, prompt + extra)
        assert float((law - reference).abs().max()) < LAW_TOLERANCE


def test_a_seed_reproduces_its_request_and_greedy_drafting_is_the_targets_own_sampling(
    install: LlamaCppInstall, client: LlamaCppClient
) -> None:
    """The same seed twice gives the same tokens with speculation on; and draft-simple's
    greedy drafts are checked by sampling the target (common_sampler_sample_and_accept_n), so
    the tokens equal the server's without a draft for the same seed, exactly."""
    prompt = list(install.models.prompt_ids("Mira sulo ke"))
    plain = LlamaCppClient(install, "none", [])
    try:
        for seed in range(12):
            first, drafted, _ = client.generate(prompt, 6, seed, Sampling())
            again, _, _ = client.generate(prompt, 6, seed, Sampling())
            assert first == again and len(first) == 6 and drafted > 0
            assert plain.generate(prompt, 6, seed, Sampling())[0] == first
    finally:
        plain.close()


def test_greedy_with_speculation_equals_greedy_decoding_of_the_servers_law(
    install: LlamaCppInstall, client: LlamaCppClient
) -> None:
    """Temperature 0 with the draft on: plain greedy decoding of the engine's own law."""
    prompt = list(install.models.prompt_ids("Ba ko tenu rasi"))
    expected = greedy_decode(
        lambda prefix: torch.tensor(client.next_token_law(prefix, Sampling())), prompt, 6
    )
    for seed in range(3):
        assert client.generate(prompt, 6, seed, Sampling(temperature=None))[0] == expected
