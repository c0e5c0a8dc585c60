"""OpenVINO GenAI as an engine target (``e2e/openvino-draft``, ``e2e/openvino-lookup``).

Without the OpenVINO environment (``python -m losslessness.adapters.e2e.openvino``, which
``tox -e e2e`` runs) the engine tests skip with that reason, before anything is built; the
adapters are then unavailable, naming the command. The server's sampler law and its draft
counters are pure functions of the shim, tested here always (numpy only). With the
environment: the server starts and stops with no process left behind, its law is
transformers' at temperature 1, its filtered law is the one the engine samples its first token
from, a seed reproduces its request, greedy decoding with speculation is plain greedy decoding
of the engine's law, and both drafters show accepted drafts.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from losslessness.adapters import AdapterUnavailable
from losslessness.adapters.e2e import openvino
from losslessness.adapters.e2e.engine import LAW_TOLERANCE, PROMPTS, Sampling
from losslessness.adapters.e2e.models import (
    BUILD_VARIABLE,
    TinyModels,
    build_tiny_models,
    transformers_next_token_probs,
)
from losslessness.adapters.e2e.openvino import OpenVinoClient
from losslessness.adapters.e2e.shims import openvino_server as shim
from losslessness.reference.decoding import greedy_decode
from losslessness.stats import identity_test
from tests.e2e.processes import gone

FILTERED = Sampling(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05)


# --------------------------------------------------------------------------- always


def test_without_the_environment_the_adapters_are_unavailable_and_build_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty cache and no LOSSLESSNESS_E2E_BUILD: unavailable, naming the build command,
    and nothing is created."""
    monkeypatch.setenv("LOSSLESSNESS_E2E_CACHE", str(tmp_path))
    monkeypatch.delenv(BUILD_VARIABLE, raising=False)
    for make in (openvino.draft_adapter, openvino.lookup_adapter):
        with pytest.raises(AdapterUnavailable, match=re.escape(openvino.BUILD_COMMAND)):
            make()
    assert list(tmp_path.iterdir()) == []


def test_the_law_at_temperature_1_without_filters_is_the_softmax_and_greedy_too() -> None:
    logits = np.array([2.0, -1.0, 0.5, 0.5, -3.0], dtype=np.float32)
    softmax = np.exp(logits.astype(np.float64) - 2.0)
    softmax /= softmax.sum()
    for temperature in (1.0, None):
        law = shim.processed_law(logits, temperature, None, None, None)
        assert np.allclose(law, softmax, atol=1e-7) and law.dtype == np.float64


def test_top_k_then_temperature_then_min_p_then_top_p_without_renormalising() -> None:
    """The engine's order and cut-offs (logit_processor.hpp, logit_transformers.hpp): after
    temperature the probabilities are (0.5, 0.3, 0.15, 0.05); min_p 0.2 drops 0.05 (below
    0.1) without renormalising, so top_p 0.82 keeps three tokens (0.5, 0.8, 0.95: the first
    running sum above 0.82), where a renormalised nucleus (0.526, 0.842) would keep two."""
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probs).astype(np.float32)
    law = shim.processed_law(logits, 1.0, None, 0.82, 0.2)
    assert np.allclose(law, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0], atol=1e-6)
    law = shim.processed_law(logits, 1.0, None, 0.82, None)
    assert np.count_nonzero(law) == 3
    law = shim.processed_law(logits, 1.0, 2, None, None)
    assert np.allclose(law, [0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0], atol=1e-6)
    # top_k first: 2 survivors renormalised to (0.625, 0.375), then temperature 0.5 sharpens
    # them (ratio squared), then min_p 0.5 keeps only the first (0.735 * 0.5 > 0.265).
    law = shim.processed_law(logits, 0.5, 2, None, 0.5)
    assert np.allclose(law, [1.0, 0.0, 0.0, 0.0])
    hot = shim.processed_law(logits, 2.0, None, None, None)
    assert np.allclose(hot, np.sqrt(probs) / np.sqrt(probs).sum(), atol=1e-6)


def test_the_draft_counters_reading_of_real_step_counts() -> None:
    """Counts seen from the engine: greedy with the target as its own draft (all accepted),
    sampling with rejections, and the short step a rejection is sometimes followed by."""
    assert shim.draft_model_counts([1, 4, 3], 8, 3, greedy=True) == (5, 5, 0)
    assert shim.draft_model_counts([1, 1, 1, 1, 1, 1, 1, 1], 8, 3, greedy=True) == (15, 0, 0)
    assert shim.draft_model_counts([1, 4, 2, 2], 8, 3, greedy=False) == (6, 4, 0)
    assert shim.draft_model_counts([1, 3, 2, 4], 8, 3, greedy=False) == (9, 4, 0)
    assert shim.draft_model_counts([1, 2, 1, 1], 4, 3, greedy=False) == (2, 0, 1)
    with pytest.raises(shim.CounterError):
        shim.draft_model_counts([2, 1], 3, 3, greedy=False)
    with pytest.raises(shim.CounterError):
        shim.draft_model_counts([1, 5], 4, 3, greedy=False)


def test_every_history_of_draft_steps_is_read_back_exactly() -> None:
    """Every way a request of L <= 9 tokens can go with K <= 3 (all accepted or a rejection
    at each draft position, each step), greedy and sampling, is read back to its own
    drafted and accepted totals with no short step."""
    for greedy, k, length in itertools.product((True, False), (1, 2, 3), range(1, 10)):

        def histories(
            generated: int, counts: list[int], drafted: int, accepted: int, k: int = k,
            length: int = length, greedy: bool = greedy,
        ) -> Iterator[tuple[list[int], int, int]]:
            if generated == length:
                yield counts, drafted, accepted
                return
            proposed = min(k, length - generated - 1)
            if proposed == 0:
                yield from histories(generated + 1, [*counts, 1], drafted, accepted)
                return
            yield from histories(generated + proposed + 1, [*counts, proposed + 1],
                                 drafted + proposed, accepted + proposed)
            for j in range(proposed):
                count = j + 1 if greedy else j + 2
                yield from histories(generated + j + 1, [*counts, count],
                                     drafted + proposed, accepted + j)

        for counts, drafted, accepted in histories(1, [1], 0, 0):
            assert shim.draft_model_counts(counts, length, k, greedy) == (drafted, accepted, 0)


def test_prompt_lookup_candidates_and_counters_are_replayed_from_the_output() -> None:
    """The earliest earlier occurrence of the longest matching n-gram gives the candidates;
    a step accepts the candidates' prefix and emits the target's token after it."""
    assert shim.lookup_candidates([3, 4, 9, 3, 5, 3], 2, 3) == [4, 9]
    assert shim.lookup_candidates([3, 4, 9, 3, 4], 3, 3) == [9, 3, 4]
    assert shim.lookup_candidates([3, 4, 9], 3, 3) == []
    prompt = [1, 5, 6, 7, 8]
    assert shim.prompt_lookup_counts(prompt, [5, 6, 7, 9], [1, 3], 3, 3) == (2, 2)
    assert shim.prompt_lookup_counts(prompt, [5, 6, 8, 9], [1, 2, 1], 3, 3) == (2, 1)
    with pytest.raises(shim.CounterError):
        shim.prompt_lookup_counts(prompt, [5, 6, 8, 9], [1, 3], 3, 3)


# --------------------------------------------------------------------------- the engine


Built = tuple[openvino.OpenVinoEnvironment, TinyModels, openvino.ConvertedModels]


@pytest.fixture(scope="module")
def built() -> Built:
    try:
        environment = openvino.ensure_openvino_environment(build=False)
        models = build_tiny_models()
        converted = openvino.convert_tiny_models(environment, models, build=False)
    except AdapterUnavailable as error:
        pytest.skip(str(error))
    return environment, models, converted


def _client(built: Built, mode: str) -> OpenVinoClient:
    environment, models, converted = built
    return openvino.OpenVinoClient(mode, environment, converted, models.vocab_size)


@pytest.fixture(scope="module")
def draft(built: Built) -> Iterator[OpenVinoClient]:
    client = _client(built, "draft")
    yield client
    client.close()


@pytest.fixture(scope="module")
def lookup(built: Built) -> Iterator[OpenVinoClient]:
    client = _client(built, "lookup")
    yield client
    client.close()


def test_the_server_starts_answers_and_stops_with_no_process_left_behind(built: Built) -> None:
    """The shim runs under the OpenVINO environment's Python, reports the versions the
    environment recorded, and close() ends it."""
    environment, models, _ = built
    client = _client(built, "lookup")
    try:
        health = client.health()
        assert health["status"] == "ok" and health["vocab_size"] == models.vocab_size
        assert health["openvino_genai"].startswith(environment.versions["openvino-genai"])
        pid = health["pid"]
        assert client.server.alive
    finally:
        client.close()
    assert not client.server.alive and gone(pid)


def test_the_engines_law_is_transformers_at_temperature_1(
    built: Built, lookup: OpenVinoClient
) -> None:
    """The directly compiled IR (f32) gives transformers' softmax within LAW_TOLERANCE."""
    _, models, _ = built
    for text, extra in ((PROMPTS[0], []), (PROMPTS[1], [40]), (PROMPTS[0], [40, 7, 99])):
        prefix = [*models.prompt_ids(text), *extra]
        law = torch.tensor(lookup.next_token_law(prefix, Sampling()), dtype=torch.float64)
        reference = transformers_next_token_probs(models.target, prefix)
        assert float((law - reference).abs().max()) < LAW_TOLERANCE


def test_the_filtered_law_is_the_one_the_engine_samples_its_first_token_from(
    built: Built, lookup: OpenVinoClient
) -> None:
    """The first token comes from the prefill, no candidate involved: 600 first tokens at
    temperature 0.8, top-k 20, top-p 0.9, min-p 0.05 all lie in the law's support and pass
    the identity test (the test's false-alarm rate 1e-4)."""
    _, models, _ = built
    prompt = list(models.prompt_ids(PROMPTS[0]))
    law = np.array(lookup.next_token_law(prompt, FILTERED))
    assert 1 < np.count_nonzero(law) < 20
    firsts = Counter(lookup.generate(prompt, 1, seed, FILTERED)[0][0] for seed in range(600))
    counts = np.zeros(law.size, dtype=np.int64)
    for token, count in firsts.items():
        counts[token] = count
    result = identity_test(counts, law)
    assert result.zero_mass_count == 0 and result.pvalue > 1e-4


def test_a_seed_reproduces_its_request(
    built: Built, draft: OpenVinoClient, lookup: OpenVinoClient
) -> None:
    """The same seed twice gives the same tokens with speculation on; other seeds differ."""
    _, models, _ = built
    prompt = list(models.prompt_ids(PROMPTS[1]))
    for client in (draft, lookup):
        first = [client.generate(prompt, 6, seed, Sampling())[0] for seed in range(4)]
        again = [client.generate(prompt, 6, seed, Sampling())[0] for seed in range(4)]
        assert first == again and len({tuple(tokens) for tokens in first}) > 1


def test_greedy_with_speculation_is_plain_greedy_decoding_of_the_engines_law(
    built: Built, draft: OpenVinoClient, lookup: OpenVinoClient
) -> None:
    """Greedy decoding with a draft model or prompt lookup gives the tokens of plain greedy
    decoding of the engine's own law (lowest index on ties), on a prompt where lookup
    accepts candidates."""
    _, models, _ = built
    cases = openvino.lookup_cases(models)
    greedy = Sampling(temperature=None)
    for client in (draft, lookup):
        for text in (PROMPTS[0], cases[3].prompt):
            prompt = list(models.prompt_ids(text))
            tokens, drafted, accepted = client.generate(prompt, 8, 0, greedy)

            def law(prefix: list[int], client: OpenVinoClient = client) -> torch.Tensor:
                return torch.tensor(client.next_token_law(prefix, greedy), dtype=torch.float64)

            expected = greedy_decode(law, prompt, 8)
            assert tokens == expected and 0 <= accepted <= drafted


def test_both_drafters_show_accepted_drafts(
    built: Built, draft: OpenVinoClient, lookup: OpenVinoClient
) -> None:
    """The counters are consistent per request (0 <= accepted <= drafted) and positive in
    total: the draft model on a default prompt, prompt lookup on its repetitive prompt."""
    _, models, _ = built
    repetitive = openvino.lookup_cases(models)[0].prompt
    for client, text in ((draft, PROMPTS[0]), (lookup, repetitive)):
        prompt = list(models.prompt_ids(text))
        drafted = accepted = 0
        for seed in range(30):
            tokens, step_drafted, step_accepted = client.generate(prompt, 8, seed, Sampling())
            assert len(tokens) == 8 and 0 <= step_accepted <= step_drafted
            drafted, accepted = drafted + step_drafted, accepted + step_accepted
        assert accepted > 0, f"{client.mode}: {accepted} of {drafted} drafts accepted"
        assert math.isfinite(accepted / drafted)


def test_the_adapters_hold_the_engine_cases(built: Built) -> None:
    """Four end-to-end targets each, speculation required; neither adapter declares a verdict
    (the draft model's LOSSY is a finding, kept in tests/e2e/expectations.py, not a design);
    lookup's prompts carry the target's own continuation."""
    for make, name in ((openvino.draft_adapter, "e2e/openvino-draft"),
                       (openvino.lookup_adapter, "e2e/openvino-lookup")):
        adapter = make()
        assert adapter.name == name and len(adapter.end_to_end) == 4
        assert all(target.requires_speculation for target in adapter.end_to_end)
        assert adapter.end_to_end[3].greedy
        assert adapter.expected_verdict is None
    lookup_prompts = {case.prompt for case in openvino.lookup_cases(built[1])}
    assert all(any(prompt.startswith(text) for text in PROMPTS) for prompt in lookup_prompts)
