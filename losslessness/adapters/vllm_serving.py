"""vLLM's model-runner-v1 speculative sampling path as a serving verifier (issue 21, item 5).

Checked against vLLM 0.33.0. The verifier builds, for one call's batch of
:class:`~losslessness.requests.Request`\\ s, what vLLM's model runner builds for a batch of
requests with drafts, and runs vLLM's own code on it:

- one ``vllm.SamplingParams`` per request (temperature, top-k, top-p, min-p, logit bias,
  penalties, ``min_tokens`` with its stop ids, allowed ids; a one-token bad word stored as
  ``SamplingParams.update_from_tokenizer`` stores it, ``_bad_words_token_ids``), wrapped in a
  ``CachedRequestState`` with the prompt and the output history, and added to a real
  ``vllm.v1.worker.gpu_input_batch.InputBatch`` with vLLM's built-in logits processors
  (``MinTokensLogitsProcessor``, ``LogitBiasLogitsProcessor``, ``MinPLogitsProcessor``, through
  their ``BatchUpdate`` machinery); each row's drafts are scheduled with
  ``InputBatch.update_req_spec_token_ids``, as ``GPUModelRunner._update_states`` does, and
  ``InputBatch.refresh_metadata`` gives the ``SamplingMetadata``;
- a seeded request gets the generator ``GPUModelRunner._update_states`` gives it
  (``gpu_model_runner.py``: ``torch.Generator(device).manual_seed(sampling_params.seed)``), as
  at the request's first step: its randomness is a function of its seed alone (the seed
  contract holds for vLLM's real per-request generators, whatever the batch). Unseeded rows
  draw from the global torch RNG, which runs inside ``torch.random.fork_rng`` seeded from the
  protocol's generator;
- the logits of each row's ``num_draft_tokens[b] + 1`` positions, in the served dtype (vLLM
  casts them to float32), laid out ``[sum(n_b + 1), V]`` request by request with the bonus
  position last, ``SpecDecodeMetadata`` pointing at them, the draft probabilities
  ``[sum n_b, V]`` float32 or None (n-gram drafts);
- then the unmodified ``RejectionSampler.forward``: the bonus token from vLLM's ``Sampler``
  (``predict_bonus_token=True``), the target rows through ``RejectionSampler.
  apply_logits_processors`` and ``apply_sampling_constraints``, then ``rejection_sample``.

Under Triton's interpreter the call runs inside :func:`on_cpu`: vLLM's PyTorch top-k/top-p path
instead of its Triton kernel (which the interpreter cannot run), no pinned memory.

What vLLM 0.33.0 does on the speculative path, row kind by row kind (the findings the serving
audit measures; ``vllm/v1/sample/rejection_sampler.py``, ``RejectionSampler.forward`` and
``apply_logits_processors``): the draft positions get allowed ids, bad words, penalties (with
the drafts before each position appended to the history) and ``MinTokensLogitsProcessor.
apply_with_spec_decode``, then temperature, top-k and top-p; they do *not* get the other
logits processors: ``LogitBiasLogitsProcessor`` (non-argmax-invariant) and
``MinPLogitsProcessor`` (argmax-invariant) are skipped on every draft position, so a row with
``logit_bias`` or ``min_p`` follows the unbiased, unfiltered law wherever a draft is verified
(vLLM issue #42744, fix PR #42802 open at 0.33.0). The bonus position runs the whole
``Sampler`` (bias and min-p included), but its ``MinTokensLogitsProcessor.apply`` counts only
the committed output tokens (``min_toks[index][1]``, the request's ``output_token_ids``), not the
drafts accepted before the bonus: a request whose ``min_tokens`` boundary falls inside the
draft block still has its stop tokens masked at the bonus position.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType, SimpleNamespace
from typing import Any

import torch

from losslessness.adapters.base import seed_global_rng
from losslessness.protocol import PLACEHOLDER, validate_serving_inputs
from losslessness.requests import Request, UnsupportedRequest

__all__ = ["V1_SERVING_MODULES", "VllmV1Serving", "on_cpu", "vllm_sampling_params"]

V1_SERVING_MODULES = {
    "params": "vllm.sampling_params",
    "builtin": "vllm.v1.sample.logits_processor.builtin",
    "logits_state": "vllm.v1.sample.logits_processor.state",
    "input_batch": "vllm.v1.worker.gpu_input_batch",
    "topk_topp": "vllm.v1.sample.ops.topk_topp_sampler",
}
"""The modules the v1 serving verifier imports beside the chain adapter's."""

BLOCK_SIZE = 16
"""KV-cache block size given to ``InputBatch`` (its block table is never read here)."""

_PATCH_LOCK = threading.Lock()


@contextmanager
def on_cpu(device: torch.device, patches: Sequence[tuple[Any, str, object]]) -> Iterator[None]:
    """For the duration of a call under the interpreter (CPU tensors, no accelerator): the
    attribute values of ``patches`` (``(object, name, value)``), and no pinned host memory
    (``vllm.utils.torch_utils.PIN_MEMORY``, which each vLLM module imports by name, is False:
    pinning needs an accelerator, and it only speeds host-to-device copies). Restored on exit,
    under one lock (the attributes are process-wide). Nothing is changed on CUDA.

    ``HAS_TRITON`` of ``vllm.v1.sample.ops.topk_topp_sampler`` is what both serving verifiers
    patch: vLLM's Triton top-k/top-p kernel fails under Triton's interpreter (an
    ``InterpreterError``; :mod:`tests.adapters.test_engine_profiles`), so vLLM takes its PyTorch
    path, ``apply_top_k_top_p_pytorch``, the one it takes without Triton; the two paths differ
    only at tied logits (the ``vllm-v1`` profile's tie rules), a null event on continuous logits.
    """
    if device.type != "cpu":
        yield
        return
    patched = list(patches)
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm") and getattr(module, "PIN_MEMORY", None) is True:
            patched.append((module, "PIN_MEMORY", False))
    with _PATCH_LOCK:
        originals = [(target, name, getattr(target, name)) for target, name, _ in patched]
        try:
            for target, name, value in patched:
                setattr(target, name, value)
            yield
        finally:
            for target, name, value in originals:
                setattr(target, name, value)


def vllm_sampling_params(params_class: type, request: Request) -> Any:
    """``vllm.SamplingParams`` for ``request`` (vLLM's names; ``top_k=0``, ``top_p=1``,
    ``min_p=0`` are vLLM's "off"); one-token bad words set as ``update_from_tokenizer`` sets
    them (``_bad_words_token_ids``).

    Raises:
        UnsupportedRequest: a field vLLM cannot take: a seed outside ``[-2**63, 2**64)``,
            which ``torch.Generator.manual_seed`` (what ``GPUModelRunner._update_states`` seeds
            a request's generator with) refuses.
    """
    if request.seed is not None and not -(2**63) <= request.seed < 2**64:
        raise UnsupportedRequest(
            f"vllm: seed={request.seed} outside [-2**63, 2**64), which torch.Generator."
            "manual_seed refuses (GPUModelRunner._update_states seeds the request with it)"
        )
    params = params_class(
        temperature=request.temperature,
        top_k=request.top_k or 0,
        top_p=request.top_p or 1.0,
        min_p=request.min_p or 0.0,
        logit_bias=dict(request.logit_bias) or None,
        frequency_penalty=request.frequency_penalty,
        presence_penalty=request.presence_penalty,
        repetition_penalty=request.repetition_penalty,
        min_tokens=request.min_tokens,
        stop_token_ids=list(request.stop_token_ids),
        allowed_token_ids=list(request.allowed_token_ids) if request.allowed_token_ids else None,
        seed=request.seed,
    )
    params._bad_words_token_ids = [[token] for token in request.bad_token_ids]
    return params


class VllmV1Serving:
    """vLLM v1's ``RejectionSampler.forward`` on a real ``InputBatch`` (the serving protocol,
    :class:`losslessness.protocol.ServingVerifier`; module docstring).

    Args:
        modules: the chain adapter's vLLM modules (``rejection_sampler``, ``sampler``,
            ``spec_metadata``) and :data:`V1_SERVING_MODULES`.
        device: ``cpu`` under the interpreter, else ``cuda``.
    """

    engine_profile = "vllm-v1"
    """The profile whose law the verifier claims."""

    def __init__(self, modules: dict[str, ModuleType], device: torch.device) -> None:
        self.modules = modules
        self.device = device
        self.sampler = modules["rejection_sampler"].RejectionSampler(modules["sampler"].Sampler())

    def _input_batch(
        self, requests: Sequence[Request], drafts: list[list[int]], vocab: int
    ) -> Any:
        """A real ``InputBatch`` holding ``requests`` with their drafts scheduled; returns its
        refreshed ``SamplingMetadata``."""
        m = self.modules
        batch_size = len(requests)
        longest = max(len(r.prompt_token_ids) + len(r.output_token_ids) for r in requests)
        model_len = longest + max(len(d) for d in drafts) + 2
        blocks = -(-model_len // BLOCK_SIZE)
        config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=batch_size))
        builtin = m["builtin"]
        processors = m["logits_state"].LogitsProcessors(
            ctor(config, self.device, False)
            for ctor in (
                builtin.MinTokensLogitsProcessor,
                builtin.LogitBiasLogitsProcessor,
                builtin.MinPLogitsProcessor,
            )
        )
        batch = m["input_batch"].InputBatch(
            max_num_reqs=batch_size,
            max_model_len=model_len,
            max_num_batched_tokens=model_len * batch_size,
            device=self.device,
            vocab_size=vocab,
            block_sizes=[BLOCK_SIZE],
            max_num_blocks_per_req=[blocks],
            logitsprocs=processors,
            num_spec_tokens=max(len(d) for d in drafts),
        )
        states = []
        for index, request in enumerate(requests):
            params = vllm_sampling_params(m["params"].SamplingParams, request)
            generator = None
            if request.seed is not None:
                generator = torch.Generator(device=self.device).manual_seed(request.seed)
            state = m["input_batch"].CachedRequestState(
                req_id=str(index),
                prompt_token_ids=list(request.prompt_token_ids),
                mm_features=[],
                sampling_params=params,
                generator=generator,
                block_ids=([0],),
                num_computed_tokens=len(request.prompt_token_ids)
                + len(request.output_token_ids),
                output_token_ids=list(request.output_token_ids),
            )
            batch.add_request(state)
            states.append(state)
        for index, state in enumerate(states):
            batch.update_req_spec_token_ids(state, {str(index): drafts[index]})
        batch.refresh_metadata()
        return batch.sampling_metadata

    def _spec_metadata(self, drafts: list[list[int]]) -> Any:
        """``SpecDecodeMetadata`` for rows laid out request by request, bonus row last."""
        spec = self.modules["spec_metadata"].SpecDecodeMetadata.make_dummy(drafts, self.device)
        target: list[int] = []
        bonus: list[int] = []
        start = 0
        for row in drafts:
            target.extend(range(start, start + len(row)))
            bonus.append(start + len(row))
            start += len(row) + 1
        spec.target_logits_indices = torch.tensor(target, dtype=torch.int32, device=self.device)
        spec.bonus_logits_indices = torch.tensor(bonus, dtype=torch.int32, device=self.device)
        spec.logits_indices = torch.arange(start, dtype=torch.int32, device=self.device)
        return spec

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft_probs: torch.Tensor | None,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: torch.Tensor,
        requests: Sequence[Request],
        generator: torch.Generator,
    ) -> torch.Tensor:
        """One verify step of the batch (serving protocol); ``[B, k+1]`` int64 on CPU.

        Raises:
            InvalidInputError: malformed inputs (naming the argument).
            UnsupportedRequest: a request vLLM cannot express (:func:`vllm_sampling_params`).
        """
        batch, k, vocab = validate_serving_inputs(
            target_logits, draft_probs, draft_token_ids, num_draft_tokens, requests, generator
        )
        counts = [int(n) for n in num_draft_tokens]
        drafts = [[int(t) for t in draft_token_ids[b, : counts[b]]] for b in range(batch)]
        spec = self._spec_metadata(drafts)
        logits = torch.cat([target_logits[b, : counts[b] + 1] for b in range(batch)])
        probs = None
        if draft_probs is not None:
            probs = torch.cat([draft_probs[b, : counts[b]] for b in range(batch)])
            probs = probs.to(self.device, torch.float32).contiguous()
        seed = int(torch.randint(0, 2**62, (), generator=generator))
        devices = [self.device] if self.device.type == "cuda" else []
        patches = [(self.modules["topk_topp"], "HAS_TRITON", False)]
        with torch.random.fork_rng(devices=devices), on_cpu(self.device, patches):
            metadata = self._input_batch(requests, drafts, vocab)
            seed_global_rng(seed, self.device)
            output = self.sampler(spec, probs, logits.to(self.device).contiguous(), metadata)
        tokens = output.sampled_token_ids.to(torch.int64).cpu()
        out = torch.full((batch, k + 1), PLACEHOLDER, dtype=torch.int64)
        width = min(tokens.shape[1], k + 1)
        out[:, :width] = tokens[:, :width]
        return out
