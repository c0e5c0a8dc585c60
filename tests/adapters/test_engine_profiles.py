"""Engine profiles against the engines' own non-speculative samplers (``tox -e engines``).

Each test builds the engine's real per-request state for a batch of random requests (random
fields on and off, greedy and random rows mixed), runs the engine's own processing on float32
random logits and compares what it samples from with the profile's law, row by row: the
processed probabilities within float32 tolerance where the engine exposes them, the argmax for
greedy rows. Continuous random logits make ties at a cut-off (where engines' paths disagree by
design, see the profiles' tie rules) a null event. Tests skip, naming the missing engine, where
it is not installed. Each test prints its tally (rows, agreeing rows, largest TV).

vLLM: ``InputBatch`` with the built-in logits processors gives the real ``SamplingMetadata``;
``Sampler.apply_logits_processors``, ``Sampler.apply_temperature``, the argmax-invariant
processors and ``apply_top_k_top_p`` run in ``Sampler.sample``'s order. The Triton top-k/top-p
kernel fails under Triton's interpreter (an ``InterpreterError`` inside
``apply_top_k_top_p_triton``), so these tests run vLLM's PyTorch path
(``apply_top_k_top_p_pytorch``, the one vLLM takes without Triton). SGLang: its penalizer
orchestrator and ``SamplingBatchInfo.apply_logits_bias`` on a batch of real ``SamplingParams``,
then ``top_k_top_p_min_p_sampling_from_probs_torch(..., return_filtered_probs=True)`` (the
``pytorch`` sampling backend); their modules import torchvision at import time, which the
pinned environment lacks, so the test executes these functions' source verbatim from the
installed files; FlashInfer is not installed in the engines environment, so
``sglang-flashinfer`` is not compared. transformers: the ``LogitsProcessorList`` that
``GenerationMixin._get_logits_processor`` builds from a ``GenerationConfig``. vLLM's model
runner v2: its bias-state and penalty kernels (``apply_logit_bias``, ``apply_penalties``), then
its temperature and min-p kernels, all through Triton's interpreter, then the shared
``apply_top_k_top_p``; its bad-words kernel is not driven.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import sys
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import torch

from losslessness.adapters.sglang_serving import (
    sglang_penalizer_orchestrator,
    sglang_sampling_params,
)
from losslessness.adapters.vllm_serving import vllm_sampling_params
from losslessness.reference.profiles import get_profile
from losslessness.requests import Request

V = 32
BATCH = 4
BATCHES = 30
PROB_TOLERANCE = 2e-5
"""Float32 processing against the float64 profile: probabilities agree within this."""


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec(name) is not None


needs_vllm = pytest.mark.skipif(not _installed("vllm"), reason="vllm is not installed")
needs_sglang = pytest.mark.skipif(not _installed("sglang"), reason="sglang is not installed")
needs_transformers = pytest.mark.skipif(
    not _installed("transformers"), reason="transformers is not installed"
)


@dataclass
class Tally:
    """Agreement counts of one engine: rows compared, agreeing rows, the largest TV."""

    engine: str
    rows: int = 0
    agreed: int = 0
    max_tv: float = 0.0
    disagreements: list[str] = field(default_factory=list)

    def add(self, law: torch.Tensor, engine_law: torch.Tensor, request: Request) -> None:
        """Compare one row: every probability within :data:`PROB_TOLERANCE`, or a
        disagreement (kept with its TV and request)."""
        self.rows += 1
        tv = 0.5 * float((law - engine_law).abs().sum())
        self.max_tv = max(self.max_tv, tv)
        if float((law - engine_law).abs().max()) <= PROB_TOLERANCE:
            self.agreed += 1
        else:
            self.disagreements.append(f"TV {tv:.3g} for {request}")

    def report(self) -> str:
        """One line: engine, n, agreed, worst TV."""
        return (
            f"{self.engine}: {self.agreed}/{self.rows} rows agree, "
            f"max TV {self.max_tv:.2e}, {len(self.disagreements)} disagree"
        )


def _random_request(gen: torch.Generator, fields: set[str], history_length: int) -> Request:
    """A request with each of ``fields`` on with probability 1/2; a third of them greedy."""

    def on(name: str) -> bool:
        return name in fields and bool(torch.rand((), generator=gen) < 0.5)

    def uniform(low: float, high: float) -> float:
        return low + (high - low) * float(torch.rand((), generator=gen))

    def ids(count: int) -> tuple[int, ...]:
        return tuple(sorted({int(t) for t in torch.randint(0, V, (count,), generator=gen)}))

    values: dict[str, Any] = {}
    if torch.rand((), generator=gen) < 1 / 3:
        values["temperature"] = 0.0
    else:
        values["temperature"] = uniform(0.3, 1.5)
    if on("top_k"):
        values["top_k"] = int(torch.randint(1, V, (), generator=gen))
    if on("top_p"):
        values["top_p"] = uniform(0.2, 0.95)
    if on("min_p"):
        values["min_p"] = uniform(0.01, 0.3)
    if on("logit_bias"):
        values["logit_bias"] = {t: uniform(-3.0, 3.0) for t in ids(3)}
    for name in ("frequency_penalty", "presence_penalty"):
        if on(name):
            values[name] = uniform(-1.0, 1.0)
    if on("repetition_penalty"):
        values["repetition_penalty"] = uniform(0.7, 1.8)
    if on("min_tokens"):
        values["min_tokens"] = int(torch.randint(1, history_length + 3, (), generator=gen))
        values["stop_token_ids"] = ids(2)
    if on("allowed_token_ids"):
        values["allowed_token_ids"] = ids(V // 2)
    if on("bad_token_ids"):
        values["bad_token_ids"] = ids(3)
    values["prompt_token_ids"] = tuple(int(t) for t in torch.randint(0, V, (5,), generator=gen))
    history = torch.randint(0, V, (history_length,), generator=gen)
    values["output_token_ids"] = tuple(int(t) for t in history)
    return Request(**values)


def _compare_row(
    tally: Tally, name: str, row_logits: torch.Tensor, request: Request, engine: torch.Tensor
) -> None:
    """``engine`` is the engine's processed logits (greedy rows) or its law (random rows)."""
    law = get_profile(name).law(row_logits, request, request.output_token_ids)
    if request.greedy:
        tally.rows += 1
        if int(torch.argmax(law)) == int(torch.argmax(engine)):
            tally.agreed += 1
        else:
            tally.disagreements.append(f"greedy argmax differs for {request}")
        return
    tally.add(law, engine.to(torch.float64), request)


def _finish(tally: Tally) -> None:
    print(tally.report())
    assert not tally.disagreements, tally.report() + "\n" + "\n".join(tally.disagreements[:5])


VLLM_FIELDS = {
    "top_k",
    "top_p",
    "min_p",
    "logit_bias",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_tokens",
    "allowed_token_ids",
    "bad_token_ids",
}


def _vllm_modules() -> SimpleNamespace:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import vllm.v1.sample.ops.topk_topp_sampler as topk_topp
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
        MinTokensLogitsProcessor,
    )
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

    return SimpleNamespace(
        SamplingParams=SamplingParams,
        LogitsProcessors=LogitsProcessors,
        builtin=(MinTokensLogitsProcessor, LogitBiasLogitsProcessor, MinPLogitsProcessor),
        Sampler=Sampler,
        CachedRequestState=CachedRequestState,
        InputBatch=InputBatch,
        topk_topp=topk_topp,
    )


@pytest.fixture
def vllm_cpu(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """vLLM's modules on CPU: no pinned memory (no accelerator), the PyTorch top-k/top-p path
    (the Triton one fails under the interpreter)."""
    modules = _vllm_modules()
    for module in list(sys.modules.values()):
        if getattr(module, "PIN_MEMORY", None) is True:
            monkeypatch.setattr(module, "PIN_MEMORY", False)
    monkeypatch.setattr(modules.topk_topp, "HAS_TRITON", False)
    return modules


def _vllm_batch(vllm: SimpleNamespace, requests: list[Request]) -> Any:
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=BATCH))
    processors = vllm.LogitsProcessors(
        ctor(config, torch.device("cpu"), False) for ctor in vllm.builtin
    )
    batch = vllm.InputBatch(
        max_num_reqs=BATCH,
        max_model_len=64,
        max_num_batched_tokens=64,
        device=torch.device("cpu"),
        vocab_size=V,
        block_sizes=[16],
        max_num_blocks_per_req=[4],
        logitsprocs=processors,
    )
    for index, request in enumerate(requests):
        params = vllm_sampling_params(vllm.SamplingParams, request)
        batch.add_request(
            vllm.CachedRequestState(
                req_id=str(index),
                prompt_token_ids=list(request.prompt_token_ids),
                mm_features=[],
                sampling_params=params,
                generator=None,
                block_ids=([0],),
                num_computed_tokens=len(request.prompt_token_ids),
                output_token_ids=list(request.output_token_ids),
            )
        )
    batch.refresh_metadata()
    return batch.sampling_metadata


@needs_vllm
def test_vllm_v1_sampler_matches_the_vllm_v1_profile(vllm_cpu: SimpleNamespace) -> None:
    """vLLM v1's Sampler (real InputBatch metadata, built-in processors) samples from the
    ``vllm-v1`` profile's law on random mixed batches; greedy rows take its argmax."""
    gen = torch.Generator().manual_seed(20260221)
    tally = Tally("vllm-v1")
    sampler = vllm_cpu.Sampler()
    for _ in range(BATCHES):
        requests = [_random_request(gen, VLLM_FIELDS, 4) for _ in range(BATCH)]
        logits = torch.randn(BATCH, V, generator=gen) * 2.0
        md = _vllm_batch(vllm_cpu, requests)
        processed = sampler.apply_logits_processors(logits.clone(), md, False)
        scaled = processed.clone()
        if not md.all_greedy:
            scaled = sampler.apply_temperature(scaled, md.temperature, md.all_random)
            for processor in md.logitsprocs.argmax_invariant:
                scaled = processor.apply(scaled)
            scaled = vllm_cpu.topk_topp.apply_top_k_top_p(scaled, md.top_k, md.top_p)
        probs = scaled.softmax(dim=-1, dtype=torch.float32)
        for row, request in enumerate(requests):
            engine = processed[row] if request.greedy else probs[row]
            _compare_row(tally, "vllm-v1", logits[row], request, engine)
    _finish(tally)


VLLM_V2_FIELDS = VLLM_FIELDS - {"bad_token_ids"}
"""Model runner v2's bad-words kernel reads the whole token buffer of its request states: not
driven here (one-token bad words are a ``-inf`` either way)."""


def _int32_rows(rows: list[list[int]], width: int) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=torch.int32)
    for index, row in enumerate(rows):
        out[index, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return out


def _packed_bits(tokens: set[int]) -> list[int]:
    words = [0] * math.ceil(V / 32)
    for token in tokens:
        words[token // 32] |= 1 << (token % 32)
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


def _vllm_v2_processed(requests: list[Request], logits: torch.Tensor) -> torch.Tensor:
    """Model runner v2's Triton kernels, in ``Sampler.apply_sampling_params``'s order (bias
    state, penalties), on a copy of ``logits``: the processed logits before temperature."""
    from vllm.v1.worker.gpu.sample.logit_bias import apply_logit_bias
    from vllm.v1.worker.gpu.sample.penalties import apply_penalties

    rows = len(requests)
    mapping = torch.arange(rows, dtype=torch.int32)
    prompt_lens = [len(r.prompt_token_ids) for r in requests]
    pos = torch.tensor(
        [p + len(r.output_token_ids) - 1 for p, r in zip(prompt_lens, requests, strict=True)],
        dtype=torch.int64,
    )
    allowed = [list(r.allowed_token_ids or ()) for r in requests]
    stops = [list(r.stop_token_ids) if r.min_tokens > 0 else [] for r in requests]
    biases = torch.zeros(rows, V)
    for row, request in enumerate(requests):
        for column, (_, value) in enumerate(request.logit_bias):
            biases[row, column] = value
    min_lens = torch.tensor(
        [p + r.min_tokens for p, r in zip(prompt_lens, requests, strict=True)], dtype=torch.int32
    )
    out = logits.clone()
    apply_logit_bias(
        out,
        mapping,
        pos,
        torch.tensor([len(a) for a in allowed], dtype=torch.int32),
        _int32_rows(allowed, V),
        torch.tensor([len(r.logit_bias) for r in requests], dtype=torch.int32),
        _int32_rows([[t for t, _ in r.logit_bias] for r in requests], V),
        biases,
        min_lens,
        torch.tensor([len(s) for s in stops], dtype=torch.int32),
        torch.zeros(rows, dtype=torch.int32),
        _int32_rows(stops, V),
    )
    counts = torch.zeros(rows, V, dtype=torch.int32)
    for row, request in enumerate(requests):
        for token in request.output_token_ids:
            counts[row, token] += 1
    apply_penalties(
        out,
        mapping,
        torch.zeros(rows, dtype=torch.int64),
        torch.zeros(rows, dtype=torch.int32),
        torch.tensor([r.repetition_penalty for r in requests]),
        torch.tensor([r.frequency_penalty for r in requests]),
        torch.tensor([r.presence_penalty for r in requests]),
        torch.tensor([_packed_bits(set(r.prompt_token_ids)) for r in requests], dtype=torch.int32),
        counts,
    )
    return out


@needs_vllm
def test_vllm_v2_kernels_match_the_vllm_v2_profile(vllm_cpu: SimpleNamespace) -> None:
    """Model runner v2's bias and penalty kernels, then its temperature and min-p kernels and
    ``apply_top_k_top_p``, give the ``vllm-v2`` profile's law; greedy rows its argmax."""
    from vllm.v1.worker.gpu.sample.gumbel import apply_temperature
    from vllm.v1.worker.gpu.sample.min_p import apply_min_p

    gen = torch.Generator().manual_seed(20260224)
    tally = Tally("vllm-v2")
    for _ in range(BATCHES // 3):
        requests = [_random_request(gen, VLLM_V2_FIELDS, 4) for _ in range(BATCH)]
        logits = torch.randn(BATCH, V, generator=gen) * 2.0
        processed = _vllm_v2_processed(requests, logits)
        scaled = processed.clone()
        mapping = torch.arange(BATCH, dtype=torch.int32)
        # SamplingParams raises 0 < T < 1e-2 to 1e-2; greedy rows carry T = 0.
        temperature = torch.tensor(
            [0.0 if r.greedy else max(r.temperature, 1e-2) for r in requests]
        )
        apply_temperature(scaled, mapping, temperature)
        apply_min_p(scaled, mapping, torch.tensor([r.min_p or 0.0 for r in requests]))
        top_k = torch.tensor([r.top_k if r.top_k else V for r in requests], dtype=torch.int32)
        top_p = torch.tensor([r.top_p or 1.0 for r in requests])
        scaled = vllm_cpu.topk_topp.apply_top_k_top_p(scaled, top_k, top_p)
        probs = scaled.softmax(dim=-1, dtype=torch.float32)
        for row, request in enumerate(requests):
            engine = processed[row] if request.greedy else probs[row]
            _compare_row(tally, "vllm-v2", logits[row], request, engine)
    _finish(tally)


SGLANG_FIELDS = {
    "top_k",
    "top_p",
    "min_p",
    "logit_bias",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_tokens",
}


def _engine_source_function(module: str, qualname: str, namespace: dict[str, Any]) -> Any:
    """The function ``qualname`` of the installed ``module``'s file, executed verbatim in
    ``namespace`` without importing the module (whose import needs torchvision)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    source = Path(spec.origin).read_text()
    tree = ast.parse(source)
    nodes: list[ast.stmt] = list(tree.body)
    *owners, name = qualname.split(".")
    for owner in owners:
        nodes = next(n.body for n in nodes if isinstance(n, ast.ClassDef) and n.name == owner)
    node = next(n for n in nodes if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    code = ast.Module(body=[node], type_ignores=[])
    exec(compile(code, spec.origin, "exec"), namespace)
    return namespace[name]


def _sglang_modules() -> SimpleNamespace:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    from sglang.srt.sampling import penaltylib
    from sglang.srt.sampling.sampling_params import SamplingParams

    namespace: dict[str, Any] = {"torch": torch, "Optional": Optional}
    batch_info = "sglang.srt.sampling.sampling_batch_info"
    for method in (
        "_apply_pre_grammar_logits_transforms",
        "_apply_post_grammar_logits_transforms",
        "apply_logits_bias",
    ):
        _engine_source_function(batch_info, f"SamplingBatchInfo.{method}", namespace)
    sampler = _engine_source_function(
        "sglang.srt.layers.sampler", "top_k_top_p_min_p_sampling_from_probs_torch", namespace
    )
    return SimpleNamespace(
        penaltylib=penaltylib,
        SamplingParams=SamplingParams,
        apply_logits_bias=namespace["apply_logits_bias"],
        bias_steps=namespace,
        top_k_top_p_min_p_sampling_from_probs_torch=sampler,
    )


def _sglang_processed(
    sglang: SimpleNamespace, requests: list[Request], logits: torch.Tensor
) -> tuple[torch.Tensor, list[Any]]:
    """SGLang's penalties and logit bias on ``logits`` (in place on a copy), with the real
    orchestrator fed each row's output history token by token."""
    params = [sglang_sampling_params(sglang.SamplingParams, r) for r in requests]
    orchestrator, _batch = sglang_penalizer_orchestrator(sglang.penaltylib, params, V)
    steps = len(requests[0].output_token_ids)
    for step in range(steps):
        orchestrator.cumulate_output_tokens(
            torch.tensor([r.output_token_ids[step] for r in requests], dtype=torch.int64)
        )
    bias = torch.zeros(len(requests), V)
    for row, r in enumerate(requests):
        for token, value in r.logit_bias:
            bias[row, token] = value
    info = SimpleNamespace(
        acc_additive_penalties=None,
        acc_scaling_penalties=None,
        penalizer_orchestrator=orchestrator,
        grammar_mask=None,
        logit_bias=bias if any(r.logit_bias for r in requests) else None,
    )
    for method in ("_apply_pre_grammar_logits_transforms", "_apply_post_grammar_logits_transforms"):
        setattr(info, method, partial(sglang.bias_steps[method], info))
    out = logits.clone()
    sglang.apply_logits_bias(info, out)
    return out, params


@needs_sglang
def test_sglang_torch_sampler_matches_the_sglang_torch_profile() -> None:
    """SGLang's penalizers, logit bias and pytorch-backend filters give the ``sglang-torch``
    profile's law; greedy rows its argmax. Requests set the repetition penalty or the
    frequency/presence penalties, not both (their relative order is the set's: see
    :func:`test_sglang_penalizer_order_is_a_set_order`)."""
    sglang = _sglang_modules()
    gen = torch.Generator().manual_seed(20260222)
    tally = Tally("sglang-torch")
    for _ in range(BATCHES):
        requests = []
        for _ in range(BATCH):
            request = _random_request(gen, SGLANG_FIELDS, 4)
            if request.repetition_penalty != 1.0 and (
                request.frequency_penalty or request.presence_penalty
            ):
                request = Request(
                    **{**request.__dict__, "frequency_penalty": 0.0, "presence_penalty": 0.0}
                )
            requests.append(request)
        logits = torch.randn(BATCH, V, generator=gen) * 2.0
        processed, params = _sglang_processed(sglang, requests, logits)
        temperatures = torch.tensor([[p.temperature] for p in params])
        probs = torch.softmax(processed / temperatures, dim=-1)
        _, filtered, index, _ = sglang.top_k_top_p_min_p_sampling_from_probs_torch(
            probs,
            torch.tensor([p.top_k for p in params]),
            torch.tensor([p.top_p for p in params]),
            torch.tensor([p.min_p for p in params]),
            any(p.min_p > 0 for p in params),
            None,
            torch.zeros(BATCH, dtype=torch.int64),
            return_filtered_probs=True,
        )
        law = torch.zeros_like(probs).scatter(1, index.long(), filtered)
        law = law / law.sum(dim=-1, keepdim=True)
        for row, request in enumerate(requests):
            engine = processed[row] if request.greedy else law[row]
            _compare_row(tally, "sglang-torch", logits[row], request, engine)
    _finish(tally)


@needs_sglang
def test_sglang_penalizer_order_is_a_set_order() -> None:
    """With both a repetition and a frequency penalty, SGLang's result is one of the two
    orders (additive first, as the profile states, or repetition first), depending on the
    process's set iteration order; the test prints which one this process took."""
    sglang = _sglang_modules()
    request = Request(repetition_penalty=2.0, frequency_penalty=1.0, output_token_ids=(0,))
    logits = torch.zeros(1, V)
    logits[0, 0] = 3.0
    processed, _ = _sglang_processed(sglang, [request], logits)
    additive_first = (3.0 - 1.0) / 2.0
    repetition_first = 3.0 / 2.0 - 1.0
    value = float(processed[0, 0])
    order = "additive first" if math.isclose(value, additive_first) else "repetition first"
    print(f"sglang penalizer order in this process: {order} ({value})")
    assert math.isclose(value, additive_first) or math.isclose(value, repetition_first)


TRANSFORMERS_FIELDS = {
    "top_k",
    "top_p",
    "min_p",
    "logit_bias",
    "repetition_penalty",
    "min_tokens",
    "allowed_token_ids",
    "bad_token_ids",
}


def _transformers_processors(request: Request) -> Any:
    from transformers import GenerationConfig
    from transformers.generation.utils import GenerationMixin

    config = GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=not request.greedy,
        temperature=request.temperature if not request.greedy else 1.0,
        top_k=request.top_k if request.top_k is not None else 0,
        top_p=request.top_p if request.top_p is not None else 1.0,
        min_p=request.min_p,
        repetition_penalty=request.repetition_penalty,
        sequence_bias={(t,): b for t, b in request.logit_bias} or None,
        bad_words_ids=[[t] for t in request.bad_token_ids] or None,
        min_new_tokens=request.min_tokens or None,
        eos_token_id=list(request.stop_token_ids) or None,
        num_beams=1,
        num_return_sequences=1,
    )
    config._eos_token_tensor = (
        torch.tensor(list(request.stop_token_ids)) if request.stop_token_ids else None
    )
    class DecoderOnly(GenerationMixin):
        """What ``_get_logits_processor`` reads of a model: a decoder-only config."""

        config = SimpleNamespace(is_encoder_decoder=False)

    allowed = request.allowed_token_ids

    def prefix_allowed(batch_id: int, ids: torch.Tensor) -> list[int]:
        return list(allowed or ())

    return DecoderOnly()._get_logits_processor(  # type: ignore[misc]
        config,
        input_ids_seq_length=len(request.prompt_token_ids),
        prefix_allowed_tokens_fn=prefix_allowed if allowed is not None else None,
        device="cpu",
        model_kwargs={},
    )


@needs_transformers
def test_transformers_logits_processors_match_the_transformers_profile() -> None:
    """The ``LogitsProcessorList`` that ``_get_logits_processor`` builds from a
    ``GenerationConfig`` gives the ``transformers`` profile's law; greedy rows its argmax."""
    gen = torch.Generator().manual_seed(20260223)
    tally = Tally("transformers")
    for _ in range(BATCHES * BATCH):
        request = _random_request(gen, TRANSFORMERS_FIELDS, 4)
        logits = torch.randn(V, generator=gen) * 2.0
        processors = _transformers_processors(request)
        input_ids = torch.tensor([[*request.prompt_token_ids, *request.output_token_ids]])
        scores = processors(input_ids, logits.clone().unsqueeze(0))[0]
        engine = scores if request.greedy else torch.softmax(scores, dim=-1)
        _compare_row(tally, "transformers", logits, request, engine)
    _finish(tally)
