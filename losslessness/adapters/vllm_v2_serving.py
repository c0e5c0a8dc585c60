"""vLLM's model-runner-v2 speculative sampling path as a serving verifier (issue 21, item 5).

Checked against vLLM 0.33.0 (``vllm/v1/worker/gpu/``). For one call's batch of
:class:`~losslessness.requests.Request`\\ s the verifier builds the per-request state model
runner v2 keeps (``GPUModelRunner.add_requests`` and ``prepare_inputs`` in
``model_runner.py``) and runs vLLM's own code on it:

- a ``RequestState`` (``states.py``) and the ``Sampler`` (``sample/sampler.py``) with its
  ``SamplingStates``, ``LogitBiasState`` (allowed ids, logit bias, ``min_tokens`` with its stop
  ids), ``PenaltiesState`` and ``BadWordsState``; each request enters through
  ``RequestState.add_request`` and ``Sampler.add_request`` with its ``vllm.SamplingParams``
  (:func:`~losslessness.adapters.vllm_serving.vllm_sampling_params`), then
  ``apply_staged_writes``, as ``GPUModelRunner.add_requests`` does;
- its output history through ``input_batch.post_update``, the kernel that commits each step's
  sampled tokens (output token counts for the penalties, ``all_token_ids``, ``total_len``, the
  last sampled token): the request stands at a decode step, its last output token sampled and
  not yet computed (``num_computed_tokens = len(prompt) + len(output) - 1``);
- each row's drafts in ``RequestState.draft_tokens``, then vLLM's own ``expand_idx_mapping``,
  ``prepare_pos_seq_lens`` and ``combine_sampled_and_draft_tokens`` give the ``InputBatch``'s
  positions, input ids and logits indices, as ``GPUModelRunner.prepare_inputs`` does;
- the target logits ``[sum(n_b + 1), V]`` in the served dtype (float64 as float32: a model's
  logits are float32 at most), request by request, bonus row last; the draft laws as model
  runner v2 stores them, pre-temperature draft logits ``[B, k, V]`` at each request's state
  index (``draft_logits`` is divided by the request's temperature in the kernels, so a draft
  law q is stored as ``T * log q``), None without draft probabilities;
- then the unmodified ``RejectionSampler.__call__`` (``spec_decode/rejection_sampler.py``):
  ``Sampler.apply_sampling_params`` (bias state, penalties with the drafts before each
  position, bad words, temperature, min-p, top-k/top-p) on every position, bonus included, then
  ``rejection_sample``; a batch without drafts goes through ``Sampler.__call__``, as
  ``GPUModelRunner.sample`` does.

Randomness: model runner v2 hashes each request's seed with the token's position in its
kernels. A seeded request keeps its seed; an unseeded one gets ``np.random.randint`` in
``SamplingStates.add_request``, which here draws from numpy's global generator seeded from the
protocol's generator for the call (its state restored after).

A request whose output history is empty: model runner v2 verifies drafts only after the
request has sampled a token (``gather_draft_sampled`` turns the drafts of a step that starts
inside the prefill into rejected placeholders), so no state of model runner v2 verifies drafts
for a request's first output token. Such a request is placed after one sampled token its law
does not read, when its law reads no history (no penalties, ``min_tokens == 0``: the token is
then inert); one whose law reads the history raises
:class:`~losslessness.requests.UnsupportedRequest`.

Under Triton's interpreter the call runs inside
:func:`~losslessness.adapters.vllm_serving.on_cpu`, with two more settings for a machine with
no accelerator: ``buffer_utils.is_uva_available`` is False and vLLM's undetected platform names
the device ``cpu`` (its UVA buffers then fall back to plain tensors, ``NonUvaBuffer``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import torch

from losslessness.adapters.vllm_serving import on_cpu, vllm_sampling_params
from losslessness.protocol import PLACEHOLDER, validate_serving_inputs
from losslessness.reference.serving import reads_history
from losslessness.requests import Request, UnsupportedRequest

__all__ = ["V2_SERVING_MODULES", "VllmV2Serving", "v2_speculative_config"]

V2_SERVING_MODULES = {
    "params": "vllm.sampling_params",
    "config": "vllm.config",
    "platforms": "vllm.platforms",
    "buffer_utils": "vllm.v1.worker.gpu.buffer_utils",
    "states": "vllm.v1.worker.gpu.states",
    "input_batch": "vllm.v1.worker.gpu.input_batch",
    "sampler": "vllm.v1.worker.gpu.sample.sampler",
    "rejection_sampler": "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
    "topk_topp": "vllm.v1.sample.ops.topk_topp_sampler",
}
"""The vLLM modules the v2 serving verifier drives."""

SPECULATIVE_FIELDS = (
    "enable_adaptive_verification",
    "rejection_sample_method",
    "fly_entropy_threshold",
    "fly_entropy_top_k",
    "synthetic_acceptance_rates",
    "fly_window_size",
)
"""The ``SpeculativeConfig`` fields model runner v2's ``RejectionSampler`` reads, beside
``num_speculative_tokens``."""

MAX_TOKENS = 1 << 20
"""``max_tokens`` given to ``RequestState.add_request`` (only its bookkeeping reads it)."""

_CALL_LOCK = threading.Lock()


def _field_default(field: dataclasses.Field[Any]) -> Any:
    """A (pydantic) dataclass field's default value."""
    default = field.default
    return getattr(default, "default", default)


def v2_speculative_config(config_module: ModuleType, k: int) -> SimpleNamespace:
    """What ``RejectionSampler.__init__`` reads of a ``SpeculativeConfig`` at vLLM's defaults:
    :data:`SPECULATIVE_FIELDS` at ``SpeculativeConfig``'s field defaults (``"standard"``
    rejection sampling, no adaptive verification, no FLy), ``num_speculative_tokens = k``. A
    real ``SpeculativeConfig`` needs a model to build.

    Raises:
        KeyError: a field of :data:`SPECULATIVE_FIELDS` that vLLM no longer has.
    """
    fields = {field.name: field for field in dataclasses.fields(config_module.SpeculativeConfig)}
    values = {name: _field_default(fields[name]) for name in SPECULATIVE_FIELDS}
    return SimpleNamespace(num_speculative_tokens=k, **values)


def _history(request: Request) -> list[int]:
    """The output tokens the request's state holds (module docstring: an inert token before
    a first output token whose law reads no history).

    Raises:
        UnsupportedRequest: an empty history with penalties or ``min_tokens``; a seed outside
            int64 (``SamplingStates.seeds`` is an int64 tensor).
    """
    if request.seed is not None and not -(2**63) <= request.seed < 2**63:
        raise UnsupportedRequest(
            f"vllm-v2: seed={request.seed} outside int64, the dtype of model runner v2's "
            "SamplingStates.seeds"
        )
    if request.output_token_ids:
        return list(request.output_token_ids)
    if reads_history(request):
        raise UnsupportedRequest(
            "vllm-v2: a request with penalties or min_tokens and an empty output history: "
            "model runner v2 verifies drafts only after a request's first sampled token "
            "(gather_draft_sampled), so it has no state for this request"
        )
    return [0]


class VllmV2Serving:
    """vLLM model runner v2's ``RejectionSampler`` on its real per-request state (the serving
    protocol, :class:`losslessness.protocol.ServingVerifier`; module docstring).

    Args:
        modules: :data:`V2_SERVING_MODULES`, imported.
        device: ``cpu`` under the interpreter, else ``cuda``.
    """

    engine_profile = "vllm-v2"
    """The profile whose law the verifier claims."""

    def __init__(self, modules: dict[str, ModuleType], device: torch.device) -> None:
        self.modules = modules
        self.device = device

    def _admit(
        self, requests: Sequence[Request], drafts: list[list[int]], vocab: int, k: int
    ) -> tuple[Any, Any, torch.Tensor]:
        """The ``RequestState`` and ``Sampler`` holding ``requests`` at their decode step with
        ``drafts`` scheduled, and the batch's state indices ``[B]`` int64."""
        m = self.modules
        histories = [_history(request) for request in requests]
        batch = len(requests)
        model_len = max(
            len(r.prompt_token_ids) + len(h) for r, h in zip(requests, histories, strict=True)
        ) + k + 2
        states = m["states"].RequestState(
            batch, model_len, model_len * batch, k, vocab, self.device
        )
        sampler = m["sampler"].Sampler(
            SimpleNamespace(reasoning_config=None), batch, vocab, self.device, states,
            num_speculative_tokens=k,
        )
        indices = []
        for row, (request, history) in enumerate(zip(requests, histories, strict=True)):
            prompt = list(request.prompt_token_ids)
            states.add_request(
                str(row), len(prompt), prompt, len(prompt) + len(history) - 1, MAX_TOKENS
            )
            index = states.req_id_to_index[str(row)]
            sampler.add_request(index, vllm_sampling_params(m["params"].SamplingParams, request))
            indices.append(index)
        states.apply_staged_writes()
        sampler.apply_staged_writes()
        mapping = torch.tensor(indices, dtype=torch.int64, device=self.device)
        sampled = torch.zeros((batch, max(len(h) for h in histories)), dtype=torch.int64)
        for row, history in enumerate(histories):
            sampled[row, : len(history)] = torch.tensor(history)
        m["input_batch"].post_update(
            mapping.to(torch.int32),
            states.num_computed_tokens.gpu,
            states.last_sampled_tokens,
            sampler.penalties_state.output_bin_counts,
            sampled.to(self.device),
            torch.tensor([len(h) for h in histories], dtype=torch.int32, device=self.device),
            torch.zeros(batch, dtype=torch.int32, device=self.device),
            None,
            states.all_token_ids.gpu,
            states.total_len.gpu,
        )
        for row, index in enumerate(indices):
            if drafts[row]:
                states.draft_tokens[index, : len(drafts[row])] = torch.tensor(drafts[row])
        return states, sampler, mapping

    def _input_batch(self, states: Any, mapping: torch.Tensor, drafts: list[list[int]]) -> Any:
        """The step's ``InputBatch``, as ``GPUModelRunner.prepare_inputs`` builds it for a batch
        of decode requests with drafts (vLLM's own position, token and index kernels)."""
        ib = self.modules["input_batch"]
        batch = len(drafts)
        scheduled = np.array([len(d) + 1 for d in drafts], dtype=np.int32)
        cu = np.zeros(batch + 1, dtype=np.int32)
        np.cumsum(scheduled, out=cu[1:])
        total = int(cu[-1])
        buffers = ib.InputBuffers(batch, total, self.device)
        query_start = buffers.query_start_loc[: batch + 1]
        query_start.copy_(torch.from_numpy(cu))
        cu_num_logits = torch.from_numpy(cu.copy()).to(self.device)
        expanded, local = ib.expand_idx_mapping(
            mapping, total, cu_num_logits, int(scheduled.max())
        )
        ib.prepare_pos_seq_lens(
            mapping, query_start, states.num_computed_tokens.gpu, buffers.positions,
            buffers.seq_lens,
        )
        logits_indices = ib.combine_sampled_and_draft_tokens(
            buffers.input_ids, mapping, states.last_sampled_tokens, query_start,
            buffers.seq_lens[:batch], states.prefill_len.gpu, states.draft_tokens,
            cu_num_logits, total,
        )
        mapping_np = mapping.cpu().numpy().astype(np.intp)
        computed = states.num_computed_tokens_np[mapping_np]
        return ib.InputBatch(
            req_ids=[str(row) for row in range(batch)],
            num_reqs=batch,
            num_reqs_after_padding=batch,
            idx_mapping=mapping,
            idx_mapping_np=mapping_np,
            expanded_idx_mapping=expanded,
            expanded_local_pos=local,
            num_scheduled_tokens=scheduled,
            num_tokens=total,
            num_tokens_after_padding=total,
            num_draft_tokens=total - batch,
            num_draft_tokens_per_req=scheduled - 1,
            query_start_loc=query_start,
            query_start_loc_np=cu,
            seq_lens=buffers.seq_lens[:batch],
            seq_lens_cpu_upper_bound=torch.from_numpy(computed + scheduled),
            dcp_local_seq_lens=None,
            num_computed_tokens_np=computed,
            prefill_len_np=states.prefill_len.np[mapping_np],
            num_computed_prefill_tokens_np=states.num_computed_prefill_tokens[mapping_np],
            is_prefilling_np=np.zeros(batch, dtype=bool),
            has_prefill=False,
            decode_graph_eligible=True,
            input_ids=buffers.input_ids[:total],
            positions=buffers.positions[:total],
            is_padding=buffers.is_padding[:total],
            logits_indices=logits_indices,
            cu_num_logits=cu_num_logits,
            cu_num_logits_np=cu,
            has_structured_output_reqs=False,
            prompt_lens=None,
        )

    def _draft_logits(
        self, draft_probs: torch.Tensor, requests: Sequence[Request], mapping: torch.Tensor
    ) -> torch.Tensor:
        """``[B, k, V]`` float32 pre-temperature draft logits ``T * log q`` at each request's
        state index (``log q`` for greedy rows, whose draft logits the kernels do not read)."""
        logits = torch.empty(draft_probs.shape, dtype=torch.float32)
        for row, request in enumerate(requests):
            log_q = draft_probs[row].to(torch.float64).log()
            scaled = log_q if request.greedy else log_q * request.temperature
            logits[int(mapping[row])] = scaled.to(torch.float32)
        return logits.to(self.device)

    def _cpu_patches(self) -> list[tuple[Any, str, object]]:
        """The settings :func:`on_cpu` applies for this verifier (module docstring)."""
        m = self.modules
        return [
            (m["topk_topp"], "HAS_TRITON", False),
            (m["buffer_utils"], "is_uva_available", lambda: False),
            (m["platforms"].current_platform, "device_type", "cpu"),
        ]

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
            UnsupportedRequest: a request model runner v2 cannot hold (:func:`_history`,
                :func:`~losslessness.adapters.vllm_serving.vllm_sampling_params`).
        """
        batch, k, vocab = validate_serving_inputs(
            target_logits, draft_probs, draft_token_ids, num_draft_tokens, requests, generator
        )
        counts = [int(n) for n in num_draft_tokens]
        drafts = [[int(t) for t in draft_token_ids[b, : counts[b]]] for b in range(batch)]
        logits = torch.cat([target_logits[b, : counts[b] + 1] for b in range(batch)])
        if logits.dtype == torch.float64:
            logits = logits.to(torch.float32)
        numpy_seed = int(torch.randint(0, 2**32, (), generator=generator))
        with _CALL_LOCK, on_cpu(self.device, self._cpu_patches()):
            numpy_state = np.random.get_state()
            np.random.seed(numpy_seed)
            try:
                states, sampler, mapping = self._admit(requests, drafts, vocab, k)
            finally:
                np.random.set_state(numpy_state)
            step = self._input_batch(states, mapping, drafts)
            logits = logits.to(self.device).contiguous()
            if sum(counts) == 0:
                output = sampler(logits, step)
            else:
                rejection = self.modules["rejection_sampler"].RejectionSampler(
                    sampler, v2_speculative_config(self.modules["config"], k), self.device
                )
                draft_logits = None
                if draft_probs is not None:
                    draft_logits = self._draft_logits(draft_probs, requests, mapping)
                output = rejection(logits, step, draft_logits)
        tokens = output.sampled_token_ids.to(torch.int64).cpu()
        emitted = output.num_sampled.to(torch.int64).cpu()
        out = torch.full((batch, k + 1), PLACEHOLDER, dtype=torch.int64)
        for row in range(batch):
            out[row, : int(emitted[row])] = tokens[row, : int(emitted[row])]
        return out
