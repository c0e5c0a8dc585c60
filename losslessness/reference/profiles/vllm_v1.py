"""vLLM's v1 sampler (``vllm-v1``): the law of ``vllm.v1.sample.sampler.Sampler`` for one
request, vllm 0.33.0.

Order (``Sampler.forward`` -> ``apply_logits_processors`` -> ``sample``, read in
``vllm/v1/sample/sampler.py`` of the 0.33.0 wheel):

1. logits cast to float32 (the profile computes in float64);
2. ``allowed_token_ids``: every other token ``-inf`` (``allowed_token_ids_mask``);
3. bad words of one token: ``-inf`` (``ops/bad_words.py``, ``apply_bad_words``: a one-token bad
   word has an empty prefix, so it is always masked);
4. the non-argmax-invariant built-in processors in ``BUILTIN_LOGITS_PROCESSORS`` order
   (``logits_processor/__init__.py``): ``MinTokensLogitsProcessor`` (stop tokens ``-inf`` while
   ``len(output_token_ids) < min_tokens``), then ``LogitBiasLogitsProcessor`` (``+= bias``);
5. penalties (``ops/penalties.py``, ``apply_all_penalties`` ->
   ``model_executor/layers/utils.py``, ``apply_penalties``): the repetition penalty on tokens in
   the prompt *or* the output (``_custom_ops.apply_repetition_penalties_torch``: positive
   logits times ``1/r``, others times ``r``), then ``-= frequency * output count``, then
   ``-= presence * (output count > 0)``; frequency and presence read the output only;
6. greedy rows (``temperature < 1e-5``): ``argmax`` here (``Sampler.greedy_sample``: on CPU
   the custom op ``torch.ops._C.greedy_argmax``, whose tie rule the profile could not read:
   it assumes ``torch.argmax``'s first maximal index);
7. temperature: ``logits / T`` (``apply_temperature``). ``SamplingParams.__post_init__`` raises
   a temperature in ``(0, 1e-2)`` to ``1e-2`` (``_MAX_TEMP``, with a warning) *before* it
   tests for greedy, so only ``T == 0`` is greedy; the profile does the same;
8. the argmax-invariant processor ``MinPLogitsProcessor`` (``builtin.py``): softmax, remove
   ``p < min_p * max p``: min-p runs *before* top-k and top-p, on the tempered logits;
9. ``TopKTopPSampler`` (``ops/topk_topp_sampler.py``, ``apply_top_k_top_p``): top-k on the
   logits, then top-p on the probabilities renormalised over the top-k survivors; a token is
   kept by top-p iff the mass ranked strictly above it is ``< top_p``; then
   ``softmax`` and a draw (exponential race or Gumbel-max: the law is the softmax).

Tie rules (``apply_top_k_top_p``). With Triton importable (CUDA, and wherever
``vllm.triton_utils.HAS_TRITON``), the Qrita pivot kernel ``apply_top_k_top_p_triton``
(``ops/topk_topp_triton.py``) runs: it keeps exactly ``k`` tokens, and among tokens tied at the
top-k or top-p cut it keeps the lowest ids first (its "duplicate logit handling" counts them in
index order). The profile states that rule. Without Triton, ``apply_top_k_top_p_pytorch`` keeps
*every* token tied at the ``k``-th logit and, at the top-p cut, the order of ``logits.sort``
(not stable for long rows): the two paths of the same engine differ exactly at ties. The
Triton kernel's pivot search stops after 18 bisection steps or a 1e-9 bracket; the profile is
the exact cut it approximates.

``SamplingParams`` turns ``top_k=0`` or ``-1`` and ``top_k >= V`` off, like ``None`` here.
``seed`` does not change the law. Every request field is supported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from losslessness.reference.profiles import steps
from losslessness.reference.profiles.registry import register
from losslessness.requests import Request

__all__ = ["VLLM_V1", "VllmV1Profile", "vllm_processed_logits", "vllm_sampling_filters"]

MIN_TEMPERATURE = 1e-2
"""``vllm.sampling_params._MAX_TEMP``: a positive temperature below it is raised to it."""


def vllm_processed_logits(
    logits: torch.Tensor, request: Request, history: Sequence[int]
) -> torch.Tensor:
    """Steps 1-5 of the module docstring: the logits ``Sampler.apply_logits_processors``
    returns, the same for greedy and random rows.

    Args:
        logits: ``[V]`` float logits of one position.
        request: the request.
        history: output tokens before the position.

    Returns:
        ``[V]`` float64 processed logits (``-inf`` for masked tokens).

    Raises:
        ValueError: malformed ``logits``, ``history`` or token ids outside ``[0, V)``.
    """
    scores = steps.check_position(logits, request, history)
    vocab = scores.shape[0]
    scores = steps.keep_only(scores, request.allowed_token_ids)
    scores = steps.mask_tokens(scores, request.bad_token_ids)
    scores = steps.mask_min_tokens(scores, request, len(history))
    scores = steps.add_logit_bias(scores, request.logit_bias)
    if request.repetition_penalty != 1.0:
        seen = steps.token_counts([*request.prompt_token_ids, *history], vocab) > 0
        scores = steps.repetition_penalty(scores, seen, request.repetition_penalty)
    counts = steps.token_counts(history, vocab)
    return steps.frequency_presence_penalties(
        scores, counts, request.frequency_penalty, request.presence_penalty
    )


def vllm_sampling_filters(scores: torch.Tensor, request: Request) -> torch.Tensor:
    """Steps 7-9 of the module docstring on processed logits of a random row: temperature,
    min-p, top-k, top-p (ties to the lowest ids, as the Triton kernel).

    Args:
        scores: ``[V]`` float64 processed logits.
        request: a request with ``temperature > 0``.

    Returns:
        ``[V]`` float64 filtered, tempered logits (``-inf`` for removed tokens).
    """
    scores = scores / max(request.temperature, MIN_TEMPERATURE)
    if request.min_p is not None:
        scores = steps.min_p_filter(scores, request.min_p)
    if request.top_k is not None and request.top_k < scores.shape[0]:
        scores = steps.top_k_by_rank(scores, request.top_k)
    if request.top_p is not None and request.top_p < 1.0:
        keep = steps.top_p_descending_cut(
            steps.finish(scores), request.top_p, inclusive=False
        )
        scores = torch.where(keep, scores, steps.MINUS_INF)
    return scores


@dataclass(frozen=True)
class VllmV1Profile:
    """vLLM v1's non-speculative law (module docstring).

    Attributes:
        name: ``vllm-v1``.
        source: the engine version and files.
    """

    name: str = "vllm-v1"
    source: str = (
        "vllm 0.33.0: vllm/v1/sample/sampler.py (Sampler.forward, apply_logits_processors, "
        "sample), v1/sample/logits_processor/builtin.py, v1/sample/ops/penalties.py, "
        "model_executor/layers/utils.py (apply_penalties), "
        "v1/sample/ops/topk_topp_sampler.py (apply_top_k_top_p), "
        "v1/sample/ops/topk_topp_triton.py, sampling_params.py"
    )

    def law(self, logits: torch.Tensor, request: Request, history: Sequence[int]) -> torch.Tensor:
        """The distribution vLLM v1 samples from (see :class:`EngineProfile`).

        Args:
            logits: ``[V]`` float logits.
            request: the request.
            history: output tokens before the position.

        Returns:
            ``[V]`` float64 law; the one-hot of the first argmax of the processed logits for
            a greedy request.

        Raises:
            ValueError: malformed inputs.
        """
        scores = vllm_processed_logits(logits, request, history)
        if request.greedy:
            return steps.greedy_one_hot(scores)
        return steps.finish(vllm_sampling_filters(scores, request))


VLLM_V1 = register(VllmV1Profile())
"""The registered ``vllm-v1`` profile."""
