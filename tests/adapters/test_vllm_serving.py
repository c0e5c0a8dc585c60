"""vLLM's serving verifiers (model runners v1 and v2, ``tox -e engines``): the conversion is exact.

The adapters build vLLM's real per-request state for the requests and run its unmodified
rejection samplers (:mod:`losslessness.adapters.vllm_serving`: v1's ``InputBatch`` and
``RejectionSampler.forward``; :mod:`losslessness.adapters.vllm_v2_serving`: model runner v2's
``RequestState``, ``Sampler`` and ``RejectionSampler``). These tests pin that conversion where
it can be compared exactly: greedy rows against the reference serving verifier of the engine's
profile (token for token, ragged draft counts, with and without draft probabilities); the
processed target law vLLM hands its rejection kernels against the profile's law at every draft
position (history = output + the drafts before it; model runner v2 at the bonus position too);
seeded rows as a function of their seed alone, whatever the batch. Model runner v1's documented
findings (logit bias and min-p dropped on draft positions, vLLM #42744; the bonus position's
min_tokens counting committed tokens only) are pinned as what vLLM 0.33.0 does, each with a
control row that agrees; model runner v2 gets both right, pinned too. Everything skips without
vLLM.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from losslessness.reference.profiles import get_profile
from losslessness.reference.serving import ServingReference
from losslessness.requests import Request, UnsupportedRequest
from tests.adapters.installed import needs_engine

pytestmark = needs_engine("vllm")

V = 24
K = 3


@pytest.fixture(scope="module")
def serving() -> Any:
    """The ``vllm`` target's serving verifier."""
    from losslessness.adapters.vllm import adapter

    target = adapter()
    assert target.engine_profile == "vllm-v1"
    return target.serving


@pytest.fixture(scope="module")
def serving_v2() -> Any:
    """The ``vllm-v2`` target's serving verifier."""
    from losslessness.adapters.vllm import v2_default_adapter

    target = v2_default_adapter()
    assert target.engine_profile == "vllm-v2"
    return target.serving


@pytest.fixture(params=["vllm-v1", "vllm-v2"])
def verifier(request: pytest.FixtureRequest) -> tuple[str, Any]:
    """``(profile name, serving verifier)`` of each model runner."""
    fixture = {"vllm-v1": "serving", "vllm-v2": "serving_v2"}[request.param]
    return request.param, request.getfixturevalue(fixture)


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
                   seed: int, profile_name: str = "vllm-v1") -> torch.Tensor:
    """Drafts that follow the profile's argmax with probability 1/2 at each position, so that
    both acceptance and rejection occur."""
    gen = torch.Generator().manual_seed(seed)
    profile = get_profile(profile_name)
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
def test_vllm_serving_greedy_rows_equal_the_reference_token_for_token(
    verifier: tuple[str, Any], with_probs: bool
) -> None:
    """Greedy rows of every processed kind (penalties with histories, min_tokens, allowed and
    bad ids, top-k/top-p, min-p), 0..k drafts each, with and without draft probabilities: each
    model runner's output equals its profile's reference serving verifier's exactly. A
    conversion that loses a row's history, its draft count or its request's field fails here."""
    profile, serving = verifier
    reference = ServingReference(profile)
    for trial in range(4):
        counts = [(row + trial) % (K + 1) for row in range(len(GREEDY_REQUESTS))]
        logits, probs, _, n = _batch(GREEDY_REQUESTS, counts, 100 + trial, with_probs)
        drafts = _greedy_drafts(logits, GREEDY_REQUESTS, counts, trial, profile)
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


@contextmanager
def _capturing(module: Any, argument: int) -> Iterator[list[torch.Tensor]]:
    """Every call's positional ``argument`` of ``module.rejection_sample``, captured by
    wrapping the function the module holds for the block."""
    original = module.rejection_sample
    seen: list[torch.Tensor] = []

    def capture(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[argument].detach().clone())
        return original(*args, **kwargs)

    module.rejection_sample = capture
    try:
        yield seen
    finally:
        module.rejection_sample = original


@pytest.fixture
def captured_target_logits(serving: Any) -> Iterator[list[torch.Tensor]]:
    """The processed ``target_logits`` vLLM passes to ``rejection_sample`` (its draft rows)."""
    with _capturing(serving.modules["rejection_sampler"], 5) as seen:
        yield seen


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


def test_vllm_serving_seeded_row_depends_only_on_its_seed(verifier: tuple[str, Any]) -> None:
    """A seeded row (v1: vLLM's own per-request generator; v2: its seed hashed with the
    position in the kernels) gives the same output alone, first, last, beside greedy and seeded
    rows, under other shared generators; another seed gives another output in some of 8 tries
    (control: the output does read the seed)."""
    _, serving = verifier
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


def test_vllm_serving_bonus_min_tokens_after_accepted_drafts(verifier: tuple[str, Any]) -> None:
    """A greedy row with one committed token and three accepted drafts reaches the bonus with 4
    tokens emitted, where the stop token 0 is the argmax. ``min_tokens = 3`` is met there, so
    the profile no longer masks token 0. vLLM 0.33.0's model runner v1, pinned: its bonus
    ``MinTokensLogitsProcessor.apply`` counts the committed output only, still masks it and
    emits the runner-up 6. Model runner v2 masks by position (``LogitBiasState``: ``pos + 1 <
    prompt_len + min_tokens``) and emits 0. Controls, both runners: ``min_tokens = 1`` (met
    before the block) emits 0, ``min_tokens = 5`` (not met at the bonus) emits 6."""
    profile, serving = verifier
    logits = torch.zeros(1, K + 1, V)
    for i in range(K):
        logits[0, i, 10 + i] = 3.0
    logits[0, K, 0] = 3.0
    logits[0, K, 6] = 2.0
    drafts = torch.tensor([[10, 11, 12]])
    counts = torch.tensor([K])
    gen = torch.Generator().manual_seed(0)

    def bonus(min_tokens: int) -> int:
        request = Request(min_tokens=min_tokens, stop_token_ids=(0,), output_token_ids=(5,),
                          temperature=0.0)
        out = serving(logits, None, drafts, counts, [request], gen)
        assert out[0, :K].tolist() == [10, 11, 12], out
        return int(out[0, K])

    law = get_profile(profile).law(
        logits[0, K], Request(min_tokens=3, stop_token_ids=(0,)), [5, 10, 11, 12]
    )
    assert int(law.argmax()) == 0
    assert bonus(3) == (6 if profile == "vllm-v1" else 0)
    assert (bonus(1), bonus(5)) == (0, 6)


def test_vllm_v1_serving_refuses_a_seed_torch_cannot_take(serving: Any) -> None:
    """A seed outside ``[-2**63, 2**64)`` (``torch.Generator.manual_seed``'s range) raises
    UnsupportedRequest naming the seed; the largest accepted seed runs (control)."""
    logits, probs, drafts, n = _batch([Request()], [1], 3)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(UnsupportedRequest, match="seed=18446744073709551616"):
        serving(logits, probs, drafts, n, [Request(seed=2**64)], gen)
    out = serving(logits, probs, drafts, n, [Request(seed=2**64 - 1)], gen)
    assert out.shape == (1, K + 1)


V2_LAW_REQUESTS = [
    *LAW_REQUESTS,
    Request(min_p=0.2),
    Request(logit_bias={3: 2.5, 9: -1.0}),
    Request(temperature=0.8, logit_bias={5: 1.5}, min_p=0.1, output_token_ids=(6, 7)),
    Request(temperature=0.0, logit_bias={7: 4.0}),
]
"""Sampled rows of every kind model runner v2 processes, min-p and logit bias included, and a
greedy row with a bias."""


@pytest.fixture
def captured_v2_logits(serving_v2: Any) -> Iterator[list[torch.Tensor]]:
    """The processed target logits model runner v2's ``RejectionSampler._verify`` passes to
    ``rejection_sample`` (every position, bonus included)."""
    with _capturing(serving_v2.modules["rejection_sampler"], 0) as seen:
        yield seen


def test_vllm_v2_serving_target_law_matches_the_vllm_v2_profile_at_every_position(
    serving_v2: Any, captured_v2_logits: list[torch.Tensor]
) -> None:
    """At every position of every row, bonus included (temperature, top-k, top-p, penalties
    with the drafts before the position counted, min_tokens, allowed and bad ids, min-p, logit
    bias), the law model runner v2's rejection kernels read (softmax of its processed logits)
    is the ``vllm-v2`` profile's law within float32 tolerance; a greedy row's argmax is the
    profile's. Model runner v2 applies min-p and the logit bias on draft positions, where v1
    drops them (vLLM #42744)."""
    counts = [K, 2, K, K, 2, K, 1, K, K, 2, K]
    logits, probs, drafts, n = _batch(V2_LAW_REQUESTS, counts, 7)
    serving_v2(logits, probs, drafts, n, V2_LAW_REQUESTS, torch.Generator().manual_seed(1))
    processed = captured_v2_logits[-1].to(torch.float64)
    profile = get_profile("vllm-v2")
    index = 0
    for row, request in enumerate(V2_LAW_REQUESTS):
        for i in range(counts[row] + 1):
            history = [*request.output_token_ids, *drafts[row, :i].tolist()]
            law = profile.law(logits[row, i], request, history)
            if request.greedy:
                assert int(processed[index].argmax()) == int(law.argmax()), (request, i)
            else:
                got = processed[index].softmax(dim=-1)
                assert float((law - got).abs().max()) < 2e-5, (request, history)
            index += 1
    assert index == processed.shape[0]


def test_vllm_v2_serving_refuses_states_model_runner_v2_never_builds(serving_v2: Any) -> None:
    """A request whose law reads its history (a penalty, ``min_tokens``) with an empty output
    history and drafts has no model-runner-v2 state (drafts are verified only after a first
    sampled token): UnsupportedRequest naming the reason; so does a seed outside int64. The
    same request with a one-token history runs, and so does an empty-history request whose law
    reads no history (controls)."""
    logits, probs, drafts, n = _batch([Request()], [2], 5)
    gen = torch.Generator().manual_seed(0)
    for request in (Request(frequency_penalty=0.5), Request(min_tokens=2, stop_token_ids=(0,))):
        with pytest.raises(UnsupportedRequest, match="empty output history"):
            serving_v2(logits, probs, drafts, n, [request], gen)
    with pytest.raises(UnsupportedRequest, match="seed=9223372036854775808"):
        serving_v2(logits, probs, drafts, n, [Request(seed=2**63)], gen)
    for request in (Request(frequency_penalty=0.5, output_token_ids=(1,)), Request(top_k=4),
                    Request(seed=2**63 - 1)):
        assert serving_v2(logits, probs, drafts, n, [request], gen).shape == (1, K + 1)
