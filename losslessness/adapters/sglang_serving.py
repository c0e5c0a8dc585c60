"""SGLang's EAGLE verify step as a serving verifier
(:class:`~losslessness.protocol.ServingVerifier`) and as a serving tree verifier
(:class:`~losslessness.protocol.ServingTreeVerifier`, 'Trees' below), the way ``eagle_sample``
(``sglang/srt/speculative/eagle_utils.py``, SGLang 0.5.23) runs it with
``--speculative-use-rejection-sampling``, on CPU through Triton's interpreter.

What the adapter builds, per call, from the rows' :class:`~losslessness.requests.Request`\\ s
(SGLang's per-request sampling state, ``SamplingBatchInfo.from_schedule_batch`` in
``sglang/srt/sampling/sampling_batch_info.py``):

- one ``sglang.srt.sampling.sampling_params.SamplingParams`` per request (its own
  ``__post_init__`` turns ``0 <= T < 1e-6`` into ``T = 1, top_k = 1`` and ``top_k = -1`` into
  ``TOP_K_ALL``); ``temperatures [B, 1]``, ``top_ks``, ``top_ps`` from them; the batch flags
  ``is_all_greedy`` (every ``top_k <= 1``), ``need_top_k_sampling`` and ``need_top_p_sampling``;
- the penalizer orchestrator (``sglang/srt/sampling/penaltylib/orchestrator.py``,
  ``BatchedPenalizerOrchestrator``) with SGLang's four penalizers, fed the row's
  ``output_token_ids`` token by token (``cumulate_output_tokens``; one orchestrator per row,
  since rows' histories differ in length: the penalizers' state is per row, as after SGLang's
  ``merge_batch``), then ``SamplingBatchInfo.update_penalties``'s two accumulations
  (``accumulate_additive_penalties`` into zeros, ``accumulate_scaling_penalties``);
- the ``[B, V]`` logit bias.

Then ``eagle_sample``'s steps on ``next_token_logits [B*(k+1), V]`` float32 (lines 562-585 and
697-800 of ``eagle_utils.py``): ``+= repeat_interleave(acc_additive_penalties)``,
``apply_scaling_penalties`` (``penaltylib/repetition_penalty.py``), ``+= logit_bias``; an
all-greedy batch takes ``torch.argmax`` and ``verify_tree_greedy_triton``; otherwise
``sglang.kernels.ops.sampling.softmax(logits, temperatures)``, ``top_k_renorm_prob`` when the
batch needs top-k, then ``top_p_renorm_prob`` on *its output* when the batch needs top-p (the
ROCm Triton kernels ``sglang/kernels/ops/sampling/renorm_triton.py``, which follow FlashInfer's
``top_k_renorm_probs``/``top_p_renorm_probs`` used on CUDA), then
``chain_speculative_sampling_triton`` with the drafts' probabilities.

Conversions (none changes a law):

- The renorm kernels' wrappers refuse non-CUDA tensors (``_prepare_probs``); the adapter runs
  the wrappers' own code with a ``_prepare_probs`` that skips only that device check (same
  float32 contiguous copy), so the Triton kernels run under the interpreter.
- SGLang's coins come from ``torch.rand`` on the global generator (``_verify_coins``, the
  unseeded branch); the adapter draws the same shapes (``[B, k+1]`` then ``[B]`` float32) from
  the protocol's generator, so runs replay.
- ``draft_probs=None`` (a deterministic drafter): the protocol defines the draft law as
  one-hot at each draft, and the adapter hands the kernel that one-hot law (what a
  deterministic drafter's probabilities are); SGLang itself raises ``ValueError`` in
  ``eagle_sample`` when a drafter gives rejection sampling no probabilities.
- A row with fewer drafts than the batch's k: SGLang batches one ``draft_token_num`` for all
  rows, and its chain kernel rejects a proposal whose draft probability is 0
  (``q_is_prob``) and then samples the residual ``relu(p - q) = p`` there; the adapter gives
  the slots after a row's last draft token 0 and an all-zero draft row, so the row's bonus
  token is drawn from p at that position by the kernel itself. The greedy kernel walks
  ``retrive_next_token``, which ends after the row's last draft.

What SGLang's speculative path does differently from its own non-speculative sampler (the
``sglang-torch`` profile, :mod:`losslessness.reference.profiles.sglang`) is a finding about
SGLang, not corrected here:

- **min-p is ignored**: ``eagle_sample`` (``eagle_utils.py``, lines 697-745) applies
  temperature, top-k and top-p only; ``min_ps`` and ``need_min_p_sampling`` are never read.
- **top-p after the top-k renormalisation**: ``top_p_renorm_prob`` runs on
  ``top_k_renorm_prob``'s renormalised output (lines 728-743); the normal pytorch sampler
  (``top_k_top_p_min_p_sampling_from_probs_torch``, ``srt/layers/sampler.py``) cuts top-p on
  the unfiltered probabilities (SGLang #36173, closed unmerged).
- **penalties frozen for the step**: the penalties are accumulated once from the output
  before the step and repeated to every draft position ("a relaxed version of penalties for
  speculative decoding", lines 562-585): an accepted draft does not count for the positions
  after it (frequency, presence, repetition), nor for ``min_new_tokens``.
- **seeds ignored**: ``sampling_seed`` is None unless the server runs with
  ``--enable-deterministic-inference`` (``from_schedule_batch``), so a seeded request's coins
  are the batch's shared ``torch.rand`` draws (SGLang #30822's unseeded verify coins): the seed
  contract fails.

Requests SGLang cannot express (``allowed_token_ids``, ``bad_token_ids``) raise
:class:`~losslessness.requests.UnsupportedRequest`.

**Trees** (:class:`SglangServingTreeVerifier`): SGLang's default EAGLE verify, without
``--speculative-use-rejection-sampling`` (which SGLang allows for ``--speculative-eagle-topk 1``
only: ``srt/arg_groups/speculative_hook.py``). The same sampling state and the same frozen
penalties and bias (repeated to the tree's ``N+1`` nodes, ``draft_token_num``); then an
all-greedy batch takes ``torch.argmax`` and the greedy tree kernel on the tree in SGLang's
layout (``to_sglang``), and any other batch the same probabilities as above and
``tree_speculative_sampling_target_only`` with all-zero draft probabilities and ``[B, N+1]``
coins plus ``[B]`` final uniforms (``eagle_sample``, lines 713-784). That kernel is CUDA only
(``sglang/kernels/ops/speculative/verify_sampling.py`` resolves it to None elsewhere): the
``sglang`` target's serving tree verifier, under the interpreter, takes all-greedy batches and
raises :class:`~losslessness.adapters.NotApplicable` for the others; the ``sglang-tree`` target
(CUDA) runs both branches with the renormalisation ``eagle_sample`` imports there (FlashInfer's
``top_k_renorm_probs``/``top_p_renorm_probs``, ``sglang/kernels/ops/sampling/renorm.py``) and
SGLang's platform greedy verify (``spec_tree.verify_tree_greedy_func``), held to the
``sglang-flashinfer`` profile, SGLang's default sampling backend on CUDA. The findings above hold
on trees too; the frozen ``min_new_tokens`` shows on the greedy branch here (stop tokens stay
masked below the boundary's depth). Not run on a GPU yet: the CUDA branch's kernel call follows
:class:`losslessness.adapters.sglang.SglangTreeTargetOnly`'s, and its plumbing is tested on CPU
with the kernel replaced by a transcription of it (``tests/adapters/sglang_tree_kernel.py``).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch

from losslessness.adapters.base import KernelVerifier, NotApplicable
from losslessness.protocol import (
    PLACEHOLDER,
    TreeOutput,
    tree_depths,
    validate_serving_inputs,
    validate_serving_tree_inputs,
)
from losslessness.reference.profiles.steps import unsupported
from losslessness.reference.tree_layouts import SglangTree, to_sglang
from losslessness.requests import Request

__all__ = [
    "SglangEngineFunctions",
    "SglangServingTreeVerifier",
    "SglangServingVerifier",
    "SglangVerifyStep",
    "emitted_chain",
    "emitted_tree",
    "renorm_on_cpu",
    "sglang_penalizer_orchestrator",
    "sglang_sampling_params",
]

ENGINE = "sglang 0.5.23 (EAGLE verify)"


class _ScheduleBatch:
    """What the penalizer orchestrator reads of a ``ScheduleBatch``: its requests and device
    (a class: the orchestrator keeps a weak reference to it)."""

    def __init__(self, reqs: list[Any]) -> None:
        self.reqs = reqs
        self.device = "cpu"


def sglang_sampling_params(factory: Callable[..., Any], request: Request) -> Any:
    """SGLang's ``SamplingParams`` of ``request`` (sglang 0.5.23,
    ``python/sglang/srt/sampling/sampling_params.py``): unset top-k, top-p and min-p as SGLang's
    defaults (-1, 1.0, 0.0), ``min_tokens`` as ``min_new_tokens``, the logit bias keyed by
    token id strings, the seed as ``sampling_seed``.

    Args:
        factory: ``sglang.srt.sampling.sampling_params.SamplingParams``.
        request: the request.

    Raises:
        UnsupportedRequest: allowed or bad token ids (no such SGLang sampling parameter).
    """
    if request.allowed_token_ids is not None:
        raise unsupported(ENGINE, "allowed_token_ids", "no such sampling parameter")
    if request.bad_token_ids:
        raise unsupported(ENGINE, "bad_token_ids", "no such sampling parameter")
    return factory(
        temperature=request.temperature,
        top_k=request.top_k if request.top_k is not None else -1,
        top_p=request.top_p if request.top_p is not None else 1.0,
        min_p=request.min_p if request.min_p is not None else 0.0,
        frequency_penalty=request.frequency_penalty,
        presence_penalty=request.presence_penalty,
        repetition_penalty=request.repetition_penalty,
        min_new_tokens=request.min_tokens,
        stop_token_ids=list(request.stop_token_ids) or None,
        logit_bias={str(t): b for t, b in request.logit_bias} or None,
        sampling_seed=request.seed,
    )


def sglang_penalizer_orchestrator(
    penaltylib: ModuleType, params: Sequence[Any], vocab: int
) -> tuple[Any, Any]:
    """SGLang's ``BatchedPenalizerOrchestrator`` with its four penalizers (frequency, min new
    tokens, presence, repetition) over one request per ``params`` entry, with no output yet
    (``python/sglang/srt/sampling/penaltylib/orchestrator.py``, sglang 0.5.23).

    Returns:
        ``(orchestrator, batch)``: keep ``batch`` alive while the orchestrator is used (it
        holds only a weak reference to it).
    """
    tokenizer = types.SimpleNamespace(additional_stop_token_ids=None, eos_token_id=None)
    batch = _ScheduleBatch([
        types.SimpleNamespace(sampling_params=p, eos_token_ids=set(), tokenizer=tokenizer)
        for p in params
    ])
    orchestrator = penaltylib.BatchedPenalizerOrchestrator(
        vocab_size=vocab,
        batch=batch,
        penalizers={
            penaltylib.BatchedFrequencyPenalizer,
            penaltylib.BatchedMinNewTokensPenalizer,
            penaltylib.BatchedPresencePenalizer,
            penaltylib.BatchedRepetitionPenalizer,
        },
    )
    return orchestrator, batch


def _cpu_prepare_probs(probs: torch.Tensor) -> torch.Tensor:
    """``renorm_triton._prepare_probs`` (SGLang 0.5.23) without its CUDA/HIP device check."""
    if probs.ndim != 2:
        raise ValueError(f"probs must be 2D, got shape={tuple(probs.shape)}")
    return probs.float().contiguous()


def renorm_on_cpu(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """SGLang's Triton renorm wrapper ``function`` (``renorm_triton``) with its own code and
    globals, ``_prepare_probs`` replaced by :func:`_cpu_prepare_probs` (module docstring,
    'Conversions'), so that it runs on CPU tensors under the interpreter."""
    namespace = dict(function.__globals__, _prepare_probs=_cpu_prepare_probs)
    rebuilt = types.FunctionType(
        function.__code__, namespace, function.__name__, function.__defaults__,
        function.__closure__,
    )
    return rebuilt  # type: ignore[return-value]


class SglangEngineFunctions:
    """The SGLang 0.5.23 callables one serving verification step uses.

    Args:
        sampling_params: ``sglang.srt.sampling.sampling_params.SamplingParams``.
        penaltylib: ``sglang.srt.sampling.penaltylib`` (orchestrator and penalizers).
        apply_scaling_penalties: ``penaltylib.repetition_penalty.apply_scaling_penalties``.
        softmax: ``sglang.kernels.ops.sampling.softmax``.
        top_k_renorm: the top-k renormalisation ``eagle_sample`` calls (on CPU
            :func:`renorm_on_cpu` of ``renorm_triton.top_k_renorm_probs_triton``; on CUDA
            ``sglang.kernels.ops.sampling.renorm.top_k_renorm_prob``, FlashInfer's).
        top_p_renorm: the top-p renormalisation, likewise.
        chain: ``chain_speculative_sampling_triton``, or None (no chain serving verifier).
        greedy: ``verify_tree_greedy_triton`` (on CUDA ``spec_tree.verify_tree_greedy_func``),
            called with keyword arguments.
        top_k_all: ``sampling_params.TOP_K_ALL``, the ``top_k`` of a request without one.
        tree: ``tree_speculative_sampling_target_only`` (CUDA only), or None: the serving tree
            verifier then takes all-greedy batches only.
    """

    def __init__(
        self,
        sampling_params: type,
        penaltylib: types.ModuleType,
        apply_scaling_penalties: Callable[[torch.Tensor, torch.Tensor], None],
        softmax: Callable[..., torch.Tensor],
        top_k_renorm: Callable[..., torch.Tensor],
        top_p_renorm: Callable[..., torch.Tensor],
        chain: Callable[..., Any] | None,
        greedy: Callable[..., Any],
        top_k_all: int,
        tree: Callable[..., Any] | None = None,
    ) -> None:
        self.sampling_params = sampling_params
        self.penaltylib = penaltylib
        self.apply_scaling_penalties = apply_scaling_penalties
        self.softmax = softmax
        self.top_k_renorm = top_k_renorm
        self.top_p_renorm = top_p_renorm
        self.chain = chain
        self.greedy = greedy
        self.top_k_all = top_k_all
        self.tree = tree


class SglangVerifyStep(KernelVerifier):
    """What SGLang 0.5.23's ``eagle_sample`` does to the target logits of a verify step before
    any kernel runs (module docstring): the per-request sampling state, the penalties and bias
    (frozen for the step), then the probabilities of the sampled branch.

    Args:
        functions: the SGLang callables (:class:`SglangEngineFunctions`).
        device: where the kernels run (``cpu`` under the interpreter, else ``cuda``).
        kernel: the kernel this verifier's sampled branch calls.
    """

    engine_profile = "sglang-torch"
    """The profile whose law the verifier is held to: SGLang's pytorch sampling backend."""

    def __init__(
        self, functions: SglangEngineFunctions, device: torch.device,
        kernel: Callable[..., Any] | None,
    ) -> None:
        super().__init__(kernel if kernel is not None else functions.greedy, device)
        self.engine = functions

    def sampling_params(self, requests: Sequence[Request]) -> list[Any]:
        """One ``SamplingParams`` per request (:func:`sglang_sampling_params`).

        Raises:
            UnsupportedRequest: a request field SGLang does not have.
        """
        return [sglang_sampling_params(self.engine.sampling_params, r) for r in requests]

    def _penalties(
        self, params: Any, request: Request, vocab: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``update_penalties`` of one row: ``([1, V] additive, [1, V] scaling or None)``,
        from SGLang's orchestrator fed the row's output history."""
        # _batch stays referenced until the return: the orchestrator holds it weakly.
        orchestrator, _batch = sglang_penalizer_orchestrator(
            self.engine.penaltylib, [params], vocab
        )
        additive = torch.zeros((1, vocab), dtype=torch.float32)
        if not orchestrator.is_required:
            return additive, None
        for token in request.output_token_ids:
            orchestrator.cumulate_output_tokens(torch.tensor([token], dtype=torch.int64))
        orchestrator.accumulate_additive_penalties(additive)
        return additive, orchestrator.accumulate_scaling_penalties()

    def processed_logits(
        self, target_logits: torch.Tensor, params: Sequence[Any], requests: Sequence[Request]
    ) -> torch.Tensor:
        """``eagle_sample``'s logits after the penalties and the bias (lines 562-585).

        Args:
            target_logits: ``[B, T, V]`` raw logits, T the verify step's rows per request.
            params: the requests' ``SamplingParams``.
            requests: the B requests.

        Returns:
            ``[B*T, V]`` float32 on CPU: each request's penalties, accumulated from its output
            before the step, and its bias added to all T rows.
        """
        batch, nodes, vocab = target_logits.shape
        logits = target_logits.detach().to("cpu", torch.float32).reshape(batch * nodes, vocab)
        logits = logits.clone()
        penalties = [self._penalties(p, r, vocab) for p, r in zip(params, requests, strict=True)]
        logits.add_(torch.repeat_interleave(torch.cat([a for a, _ in penalties]), nodes, dim=0))
        if any(s is not None for _, s in penalties):
            scaling = torch.cat(
                [s if s is not None else torch.ones((1, vocab)) for _, s in penalties]
            )
            self.engine.apply_scaling_penalties(
                logits, torch.repeat_interleave(scaling, nodes, dim=0)
            )
        if any(r.logit_bias for r in requests):
            bias = torch.zeros((batch, vocab), dtype=torch.float32)
            for row, request in enumerate(requests):
                for token, value in request.logit_bias:
                    bias[row, token] = value
            logits.add_(torch.repeat_interleave(bias, nodes, dim=0))
        return logits

    def target_probs(self, logits: torch.Tensor, params: Sequence[Any]) -> torch.Tensor:
        """The sampled branch's target probabilities (``eagle_sample``, lines 697-745):
        temperature softmax, top-k renormalisation when a request sets top-k, then top-p
        renormalisation of *its output* when one sets top-p; min-p is never read.

        Args:
            logits: ``[B*T, V]`` float32 from :meth:`processed_logits`.
            params: the B requests' ``SamplingParams``.

        Returns:
            ``[B*T, V]`` float32 on the device the SGLang functions returned it on.
        """
        nodes = logits.shape[0] // len(params)
        device = self.device
        temperatures = torch.tensor([[p.temperature] for p in params], dtype=torch.float32)
        probs = self.engine.softmax(
            logits.to(device),
            temperatures=torch.repeat_interleave(temperatures, nodes, dim=0).to(device),
        )
        if any(p.top_k != self.engine.top_k_all for p in params):
            top_ks = torch.tensor([p.top_k for p in params], dtype=torch.int32)
            probs = self.engine.top_k_renorm(
                probs, torch.repeat_interleave(top_ks, nodes).to(device)
            )
        if any(p.top_p != 1.0 for p in params):
            top_ps = torch.tensor([p.top_p for p in params], dtype=torch.float32)
            probs = self.engine.top_p_renorm(
                probs, torch.repeat_interleave(top_ps, nodes).to(device)
            )
        return probs

    @staticmethod
    def all_greedy(params: Sequence[Any]) -> bool:
        """``SamplingBatchInfo.is_all_greedy``: every request's ``top_k <= 1``."""
        return all(p.top_k <= 1 for p in params)

    def kernel_step(
        self,
        layout: SglangTree,
        width: int,
        logits: torch.Tensor,
        params: Sequence[Any],
        draft_probs: Callable[[], torch.Tensor],
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``eagle_sample``'s branch on SGLang's layout (lines 638-784): for an all-greedy
        batch, the greedy kernel on the argmax of ``logits``; otherwise this verifier's kernel
        on :meth:`target_probs` with ``[B, T]`` float32 coins, then ``[B]`` final uniforms, from
        ``generator`` (SGLang's unseeded ``torch.rand`` shapes) and thresholds 1.

        Args:
            layout: the batch's slots, ``[B, T]`` int64 tensors.
            width: ``accept_index``'s columns (the levels the kernels walk, root included).
            logits: ``[B*T, V]`` from :meth:`processed_logits`.
            params: the B requests' ``SamplingParams``.
            draft_probs: builds the kernel's float32 ``draft_probs``, called on the sampled
                branch only (a ``[B, k, V]`` table is large at a serving vocabulary).
            generator: the coins' source.

        Returns:
            ``(predicts [B*T], accept_index [B, width], accept_token_num [B])`` int32 as the
            kernel wrote them.
        """
        batch, slots = layout.candidates.shape
        device = self.device
        predicts = torch.zeros(batch * slots, dtype=torch.int32, device=device)
        accept_index = torch.full((batch, width), PLACEHOLDER, dtype=torch.int32, device=device)
        accept_token_num = torch.zeros(batch, dtype=torch.int32, device=device)
        candidates, index, next_token, sibling = (t.to(device) for t in layout)
        if self.all_greedy(params):
            self.engine.greedy(
                predicts=predicts,
                accept_index=accept_index,
                accept_token_num=accept_token_num,
                candidates=candidates,
                retrieve_index=index,
                retrieve_next_token=next_token,
                retrieve_next_sibling=sibling,
                target_predict=torch.argmax(logits, dim=-1).reshape(batch, slots).to(device),
            )
            return predicts, accept_index, accept_token_num
        probs = self.target_probs(logits, params).reshape(batch, slots, -1)
        coins = torch.rand((batch, slots), dtype=torch.float32, generator=generator)
        final = torch.rand((batch,), dtype=torch.float32, generator=generator)
        self.function(
            predicts=predicts,
            accept_index=accept_index,
            accept_token_num=accept_token_num,
            candidates=candidates,
            retrive_index=index,
            retrive_next_token=next_token,
            retrive_next_sibling=sibling,
            uniform_samples=coins.to(device),
            uniform_samples_for_final_sampling=final.to(device),
            target_probs=probs.to(device).contiguous(),
            draft_probs=draft_probs().to(device),
            threshold_single=1.0,
            threshold_acc=1.0,
            deterministic=True,
        )
        return predicts, accept_index, accept_token_num


class SglangServingVerifier(SglangVerifyStep):
    """SGLang 0.5.23's EAGLE verify step on a serving batch, chain-shaped, with rejection
    sampling (module docstring).

    Args:
        functions: the SGLang callables (:class:`SglangEngineFunctions`, ``chain`` given).
        device: where the kernels run (``cpu`` under the interpreter).

    Raises:
        ValueError: ``functions.chain`` is None.
    """

    def __init__(self, functions: SglangEngineFunctions, device: torch.device) -> None:
        if functions.chain is None:
            raise ValueError("functions: the chain serving verifier needs the chain kernel")
        super().__init__(functions, device, functions.chain)

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft_probs: torch.Tensor | None,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: torch.Tensor,
        requests: Sequence[Request],
        generator: torch.Generator,
    ) -> torch.Tensor:
        """One serving verification step (:class:`~losslessness.protocol.ServingVerifier`);
        ``[B, k+1]`` int64 on CPU.

        Raises:
            InvalidInputError: malformed inputs (naming the argument).
            UnsupportedRequest: a request field SGLang does not have.
        """
        batch, k, vocab = validate_serving_inputs(
            target_logits, draft_probs, draft_token_ids, num_draft_tokens, requests, generator
        )
        params = self.sampling_params(requests)
        nodes = k + 1
        counts = num_draft_tokens.to(torch.int64).cpu()
        logits = self.processed_logits(target_logits, params, requests)
        candidates = torch.zeros((batch, nodes), dtype=torch.int64)
        drafted = torch.arange(k).unsqueeze(0) < counts.unsqueeze(1)
        candidates[:, 1:] = torch.where(drafted, draft_token_ids.to(torch.int64).cpu(), 0)
        retrive_index = torch.arange(batch * nodes, dtype=torch.int64).view(batch, nodes)
        next_token = torch.where(
            torch.arange(nodes).unsqueeze(0) < counts.unsqueeze(1),
            torch.arange(1, nodes + 1).unsqueeze(0),
            PLACEHOLDER,
        ).to(torch.int64)
        sibling = torch.full((batch, nodes), PLACEHOLDER, dtype=torch.int64)

        def draft() -> torch.Tensor:
            # A deterministic drafter's law is one-hot at its draft; no law after a row's drafts.
            q = torch.zeros((batch, k, vocab), dtype=torch.float32)
            if draft_probs is None:
                q[drafted] = torch.nn.functional.one_hot(candidates[:, 1:][drafted], vocab).float()
            else:
                q[drafted] = draft_probs.detach().to("cpu", torch.float32)[drafted]
            return q

        layout = SglangTree(candidates, retrive_index, next_token, sibling)
        return emitted_chain(
            *self.kernel_step(layout, nodes, logits, params, draft, generator)
        )


class SglangServingTreeVerifier(SglangVerifyStep):
    """SGLang 0.5.23's default EAGLE verify step (no ``--speculative-use-rejection-sampling``)
    on serving trees (:class:`~losslessness.protocol.ServingTreeVerifier`; module docstring,
    'Trees').

    An all-greedy batch: argmax of the processed logits, then the greedy tree kernel. Any
    other batch: :meth:`~SglangVerifyStep.target_probs`, then
    ``tree_speculative_sampling_target_only`` with all-zero draft probabilities (SGLang's own
    call), the ``top-k`` draft scheme only (the kernel ignores q; see
    :class:`losslessness.adapters.sglang.SglangTreeTargetOnly`). Randomness: ``[B, N+1]``
    float32 coins then ``[B]`` final uniforms from the generator, SGLang's unseeded
    ``torch.rand`` shapes.

    Args:
        functions: the SGLang callables; without ``functions.tree`` (no CUDA) a batch with a
            sampled request raises :class:`~losslessness.adapters.NotApplicable`.
        device: where the kernels run.
        engine_profile: the profile the verifier claims (``sglang-torch`` under the
            interpreter, ``sglang-flashinfer`` with CUDA's FlashInfer renormalisation).
    """

    draft_schemes: tuple[str, ...] = ("top-k",)
    """The draft schemes a batch with a sampled request may have (greedy batches: any)."""

    def __init__(
        self, functions: SglangEngineFunctions, device: torch.device, engine_profile: str
    ) -> None:
        super().__init__(functions, device, functions.tree)
        self.engine_profile = engine_profile

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft_probs: torch.Tensor,
        parents: torch.Tensor,
        token_ids: torch.Tensor,
        draft_scheme: str,
        requests: Sequence[Request],
        generator: torch.Generator,
    ) -> TreeOutput:
        """One serving tree verification step; :class:`TreeOutput` int64 on CPU.

        Raises:
            InvalidInputError: malformed inputs (naming the argument).
            UnsupportedRequest: a request field SGLang does not have.
            NotApplicable: a sampled request in the batch without the CUDA tree kernel, or
                with a draft scheme other than ``top-k`` (naming ``requests`` or
                ``draft_scheme``).
        """
        batch, nodes, vocab = validate_serving_tree_inputs(
            target_logits, draft_probs, parents, token_ids, draft_scheme, requests, generator
        )
        params = self.sampling_params(requests)
        if not self.all_greedy(params):
            self._require_sampled_path(draft_scheme)
        tree = parents.long().cpu()
        layout = to_sglang(tree, token_ids.long().cpu(), torch.zeros(batch, dtype=torch.int64))
        logits = self.processed_logits(target_logits, params, requests)

        def draft() -> torch.Tensor:
            # SGLang's target-only call: no draft law (the kernel overwrites rejected entries).
            return torch.zeros((batch, nodes + 1, vocab), dtype=torch.float32)

        width = int(tree_depths(tree).max()) + 1
        return emitted_tree(*self.kernel_step(layout, width, logits, params, draft, generator))

    def _require_sampled_path(self, draft_scheme: str) -> None:
        """Refuse what the sampled branch cannot run here (NotApplicable, with the reason)."""
        if self.engine.tree is None:
            raise NotApplicable(
                "the batch has a sampled request: SGLang verifies it with "
                "tree_speculative_sampling_target_only, which is CUDA only (the sglang-tree "
                "target on a GPU); only all-greedy batches run here",
                argument="requests",
            )
        if draft_scheme not in self.draft_schemes:
            raise NotApplicable(
                f"{draft_scheme!r} is not supported: SGLang's tree_speculative_sampling_"
                "target_only ignores q and accepts a child with the target's cumulative mass "
                "over its siblings (rejection sampling for deterministic drafts); it supports "
                "'top-k' only",
                argument="draft_scheme",
            )


def emitted_chain(
    predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor
) -> torch.Tensor:
    """The protocol's ``[B, k+1]`` int64 output (accepted drafts then one token, -1 padded)
    from SGLang's accepted slots (``accept_index [B, k+1]``, flat indices into ``predicts
    [B*(k+1)]``, the token emitted after each slot) and ``accept_token_num [B]``."""
    accepted = accept_token_num.to(torch.int64).cpu()
    index = accept_index.to(torch.int64).cpu()
    tokens = predicts.to(torch.int64).cpu()
    batch, nodes = index.shape
    out = torch.full((batch, nodes), PLACEHOLDER, dtype=torch.int64)
    emitted = torch.arange(nodes).unsqueeze(0) <= accepted.unsqueeze(1)
    out[emitted] = tokens[index.clamp(min=0)][emitted]
    return out


def emitted_tree(
    predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor
) -> TreeOutput:
    """The protocol's :class:`~losslessness.protocol.TreeOutput` from SGLang's accepted flat
    indices (``accept_index [B, D+1]``, column 0 the root) and ``predicts [B*(N+1)]`` (the
    token emitted after each accepted slot), slots numbered as by ``to_sglang``."""
    accepted = accept_token_num.to(torch.int64).cpu()
    index = accept_index.to(torch.int64).cpu()
    tokens = predicts.to(torch.int64).cpu()
    batch, width = index.shape
    slots = tokens.numel() // max(batch, 1)
    positions = torch.arange(width).unsqueeze(0)
    emitted = positions <= accepted.unsqueeze(1)
    out = torch.full((batch, width), PLACEHOLDER, dtype=torch.int64)
    out[emitted] = tokens[index.clamp(min=0)][emitted]
    nodes = index[:, 1:] - torch.arange(batch).unsqueeze(1) * slots
    on_path = positions[:, 1:] <= accepted.unsqueeze(1)
    accepted_nodes = torch.where(on_path, nodes, PLACEHOLDER)
    return TreeOutput(out, accepted_nodes)
