"""vLLM's serving verifier (model runner v1, ``tox -e engines``): the conversion is exact.

The adapter builds a real ``InputBatch`` for the requests and runs the unmodified
``RejectionSampler.forward`` (:mod:`losslessness.adapters.vllm_serving`). These tests pin that
conversion where it can be compared exactly: greedy rows against the reference serving
verifier of the ``vllm-v1`` profile (token for token, ragged draft counts, with and without
draft probabilities); the processed target law vLLM hands its rejection kernels against the
profile's law at every draft position (history = output + the drafts before it); seeded rows
as a function of their seed alone (vLLM's per-request generators, whatever the batch). The
documented findings (logit bias and min-p dropped on draft positions, vLLM #42744) are pinned
as what vLLM 0.33.0 does, each with a control row that agrees. Everything skips without vLLM.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import pytest
import torch

from losslessness.reference.profiles import get_profile
from losslessness.reference.serving import ServingReference
from losslessness.requests import Request, UnsupportedRequest


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("triton") is not None


pytestmark = pytest.mark.skipif(not _installed("vllm"), reason="vllm is not installed")

V = 24
K = 3


@pytest.fixture(scope="module")
def serving() -> Any:
    """The ``vllm`` target's serving verifier."""
    from losslessness.adapters.vllm import adapter

    target = adapter()
    assert target.engine_profile == "vllm-v1"
    return target.serving


def _batch(
    requests: list[Request], counts: list[int], seed: int, probs: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Random logits ``[B, K+1, V]`` float32, draft laws and drafts d ~ q, -1 padded."""
    gen = torch.Generator().manual_seed(seed)
    batch = len(requests)
    logits = torch.randn(batch, K + 1, V, generator=gen) * 2.0
    q = torch.softmax(logits[:, :K] + torch.randn(batch, K, V, generator=gen), dim=-1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=gen).reshape(batch, K)
    for row, count in enumerate(counts):
        drafts[row, count:] = -1
    return logits, q if probs else None, drafts, torch.tensor(counts)


GREEDY_REQUESTS = [
    Request(temperature=0.0),
    Request(temperature=0.0, top_k=3, top_p=0.5),
    Request(temperature=0.0, frequency_penalty=1.5, presence_penalty=0.5,
            output_token_ids=(1, 2, 2)),
    Request(temperature=0.0, repetition_penalty=1.7, prompt_token_ids=(4, 5),
            output_token_ids=(6,)),
    Request(temperature=0.0, min_tokens=2, stop_token_ids=(0, 1), output_token_ids=(3,)),
    Request(temperature=0.0, allowed_token_ids=tuple(range(0, V, 2))),
    Request(temperature=0.0, bad_token_ids=(2, 3)),
    Request(temperature=0.0, min_p=0.3),
]
"""Greedy rows of every kind vLLM processes on draft positions (min-p: argmax-invariant)."""


def _greedy_drafts(logits: torch.Tensor, requests: list[Request], counts: list[int],
                   seed: int) -> torch.Tensor:
    """Drafts that follow the profile's argmax with probability 1/2 at each position, so that
    both acceptance and rejection occur."""
    gen = torch.Generator().manual_seed(seed)
    profile = get_profile("vllm-v1")
    drafts = torch.full((len(requests), K), -1, dtype=torch.int64)
    for row, request in enumerate(requests):
        history = list(request.output_token_ids)
        for i in range(counts[row]):
            best = int(profile.law(logits[row, i], request, history).argmax())
            token = best if torch.rand((), generator=gen) < 0.5 else (best + 1) % V
            drafts[row, i] = token
            history.append(token)
    return drafts


@pytest.mark.parametrize("with_probs", [True, False])
def test_vllm_v1_serving_greedy_rows_equal_the_reference_token_for_token(
    serving: Any, with_probs: bool
) -> None:
    """Greedy rows of every processed kind (penalties with histories, min_tokens, allowed and
    bad ids, top-k/top-p, min-p), 0..k drafts each, with and without draft probabilities: vLLM's
    output equals the ``vllm-v1`` reference serving verifier's exactly. A conversion that loses
    a row's history, its draft count or its request's field fails here."""
    reference = ServingReference("vllm-v1")
    for trial in range(4):
        counts = [(row + trial) % (K + 1) for row in range(len(GREEDY_REQUESTS))]
        logits, probs, _, n = _batch(GREEDY_REQUESTS, counts, 100 + trial, with_probs)
        drafts = _greedy_drafts(logits, GREEDY_REQUESTS, counts, trial)
        gen = torch.Generator().manual_seed(trial)
        got = serving(logits, probs, drafts, n, GREEDY_REQUESTS, gen)
        want = reference(logits, probs, drafts, n, GREEDY_REQUESTS, torch.Generator())
        assert torch.equal(got, want), (trial, got, want)


def test_vllm_v1_serving_drops_logit_bias_on_draft_positions_vllm_42744(serving: Any) -> None:
    """vLLM 0.33.0's finding #42744, pinned: a greedy row whose logit bias makes token t the
    argmax at position 0 rejects the draft t there (the bias is not applied on draft positions,
    ``RejectionSampler.apply_logits_processors``) and emits the unbiased argmax; the same bias
    at the bonus position (0 drafts) is applied (control)."""
    logits = torch.zeros(1, K + 1, V)
    logits[0, :, 5] = 2.0
    request = Request(temperature=0.0, logit_bias={7: 4.0})
    gen = torch.Generator().manual_seed(0)
    drafted = torch.tensor([[7, -1, -1]])
    out = serving(logits, None, drafted, torch.tensor([1]), [request], gen)
    assert out[0, 0].item() == 5, out
    bonus = serving(logits, None, torch.full((1, K), -1), torch.tensor([0]), [request], gen)
    assert bonus[0, 0].item() == 7, bonus


@pytest.fixture
def captured_target_logits(serving: Any) -> Iterator[list[torch.Tensor]]:
    """The processed ``target_logits`` vLLM passes to ``rejection_sample`` (its draft rows),
    captured by wrapping the module function for the test."""
    module = serving.modules["rejection_sampler"]
    original = module.rejection_sample
    seen: list[torch.Tensor] = []

    def capture(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[5].detach().clone())
        return original(*args, **kwargs)

    module.rejection_sample = capture
    try:
        yield seen
    finally:
        module.rejection_sample = original


LAW_REQUESTS = [
    Request(temperature=0.7, top_k=6),
    Request(top_p=0.6),
    Request(temperature=1.3, top_k=8, top_p=0.8),
    Request(frequency_penalty=1.1, presence_penalty=0.4, output_token_ids=(0, 1, 1)),
    Request(repetition_penalty=1.6, prompt_token_ids=(2, 3), output_token_ids=(4,)),
    Request(min_tokens=3, stop_token_ids=(0, 1), output_token_ids=(5,)),
    Request(allowed_token_ids=tuple(range(1, V, 3)), bad_token_ids=(4,)),
]
"""Sampled rows of the kinds vLLM processes on draft positions."""


def _target_rows(
    logits: torch.Tensor, drafts: torch.Tensor, counts: list[int], requests: list[Request]
) -> Iterator[tuple[torch.Tensor, Request, list[int]]]:
    """(logits, request, history) of every draft position, in vLLM's flattened order."""
    for row, request in enumerate(requests):
        for i in range(counts[row]):
            history = [*request.output_token_ids, *drafts[row, :i].tolist()]
            yield logits[row, i], request, history


def test_vllm_v1_serving_target_law_matches_the_vllm_v1_profile(
    serving: Any, captured_target_logits: list[torch.Tensor]
) -> None:
    """At every draft position of sampled rows with temperature, top-k, top-p, penalties (the
    drafts before the position counted), min_tokens, allowed and bad ids, the law vLLM's
    rejection kernels read (softmax of its processed target logits) is the ``vllm-v1``
    profile's law within float32 tolerance."""
    counts = [K, 2, K, K, 2, K, 1]
    logits, probs, drafts, n = _batch(LAW_REQUESTS, counts, 7)
    serving(logits, probs, drafts, n, LAW_REQUESTS, torch.Generator().manual_seed(1))
    processed = captured_target_logits[-1].softmax(dim=-1).to(torch.float64)
    rows = list(_target_rows(logits, drafts, counts, LAW_REQUESTS))
    assert processed.shape[0] == len(rows)
    profile = get_profile("vllm-v1")
    for index, (row_logits, request, history) in enumerate(rows):
        law = profile.law(row_logits, request, history)
        assert float((law - processed[index]).abs().max()) < 2e-5, (request, history)


@pytest.mark.parametrize(
    "request_", [Request(min_p=0.2), Request(logit_bias={3: 2.5, 9: -1.0})], ids=str
)
def test_vllm_v1_serving_target_law_omits_min_p_and_logit_bias_vllm_42744(
    serving: Any, captured_target_logits: list[torch.Tensor], request_: Request
) -> None:
    """vLLM 0.33.0's finding #42744, pinned on the law: for a min-p or logit-bias row the
    processed target law of its draft positions is the profile's law of the same request
    *without* that field, and differs from the request's own law."""
    counts = [K]
    logits, probs, drafts, n = _batch([request_], counts, 11)
    serving(logits, probs, drafts, n, [request_], torch.Generator().manual_seed(2))
    processed = captured_target_logits[-1].softmax(dim=-1).to(torch.float64)
    profile = get_profile("vllm-v1")
    plain = Request(temperature=request_.temperature)
    for i in range(K):
        dropped = profile.law(logits[0, i], plain, [])
        assert float((dropped - processed[i]).abs().max()) < 2e-5
        assert float((profile.law(logits[0, i], request_, []) - processed[i]).abs().max()) > 1e-3


SEEDED = Request(seed=1234, top_k=12, output_token_ids=(2,))


def _seeded_output(serving: Any, neighbours: list[Request], position: int,
                   generator_seed: int, seeded: Request = SEEDED) -> torch.Tensor:
    """The seeded request's output row, placed at ``position`` among ``neighbours``."""
    requests = [*neighbours[:position], seeded, *neighbours[position:]]
    gen = torch.Generator().manual_seed(99)
    fixed_logits = torch.randn(1, K + 1, V, generator=gen)
    fixed_q = torch.full((1, K, V), 1.0 / V)
    fixed_drafts = torch.tensor([[1, 2, 3]])
    logits, probs, drafts, _ = _batch(requests, [K] * len(requests), generator_seed)
    assert probs is not None
    logits[position], probs[position] = fixed_logits[0], fixed_q[0]
    drafts[position] = fixed_drafts[0]
    counts = torch.full((len(requests),), K)
    out = serving(logits, probs, drafts, counts, requests,
                  torch.Generator().manual_seed(generator_seed))
    return out[position]


def test_vllm_v1_serving_seeded_row_depends_only_on_its_seed(serving: Any) -> None:
    """A seeded row (vLLM's own per-request generator) gives the same output alone, first,
    last, beside greedy and seeded rows, under other shared generators; another seed gives
    another output in some of 8 tries (control: the output does read the seed)."""
    alone = _seeded_output(serving, [], 0, 1)
    others = [Request(), Request(temperature=0.0), Request(seed=7, top_p=0.9), Request(min_p=0.1)]
    for position in (0, 2, 4):
        for generator_seed in (3, 4):
            got = _seeded_output(serving, others, position, generator_seed)
            assert torch.equal(got, alone), (position, generator_seed, got, alone)
    reseeded = [
        _seeded_output(serving, [], 0, 1, Request(seed=s, top_k=12, output_token_ids=(2,)))
        for s in range(8)
    ]
    assert any(not torch.equal(row, alone) for row in reseeded)


def test_vllm_v1_serving_bonus_min_tokens_counts_committed_tokens_only(serving: Any) -> None:
    """vLLM 0.33.0, pinned: at the bonus position ``MinTokensLogitsProcessor.apply`` counts the
    committed output only, not the accepted drafts. A greedy row with ``min_tokens = 3``, one
    committed token and three accepted drafts reaches the bonus with 4 tokens emitted, where
    the profile no longer masks the stop token 0 (its argmax there); vLLM still masks it and
    emits the runner-up. Control: with ``min_tokens = 1`` (already met) vLLM emits token 0."""
    logits = torch.zeros(1, K + 1, V)
    for i in range(K):
        logits[0, i, 10 + i] = 3.0
    logits[0, K, 0] = 3.0
    logits[0, K, 6] = 2.0
    drafts = torch.tensor([[10, 11, 12]])
    counts = torch.tensor([K])
    gen = torch.Generator().manual_seed(0)
    stop = dict(stop_token_ids=(0,), output_token_ids=(5,), temperature=0.0)
    masked = serving(logits, None, drafts, counts, [Request(min_tokens=3, **stop)], gen)
    assert masked[0].tolist() == [10, 11, 12, 6], masked
    law = get_profile("vllm-v1").law(logits[0, K], Request(min_tokens=3, **stop), [5, 10, 11, 12])
    assert int(law.argmax()) == 0
    met = serving(logits, None, drafts, counts, [Request(min_tokens=1, **stop)], gen)
    assert met[0].tolist() == [10, 11, 12, 0], met


def test_vllm_v1_serving_refuses_a_seed_torch_cannot_take(serving: Any) -> None:
    """A seed outside ``[-2**63, 2**64)`` (``torch.Generator.manual_seed``'s range) raises
    UnsupportedRequest naming the seed; the largest accepted seed runs (control)."""
    logits, probs, drafts, n = _batch([Request()], [1], 3)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(UnsupportedRequest, match="seed=18446744073709551616"):
        serving(logits, probs, drafts, n, [Request(seed=2**64)], gen)
    out = serving(logits, probs, drafts, n, [Request(seed=2**64 - 1)], gen)
    assert out.shape == (1, K + 1)
