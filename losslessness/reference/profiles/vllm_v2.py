"""vLLM's model runner v2 sampler (``vllm-v2``): ``vllm.v1.worker.gpu.sample.sampler.Sampler``,
vllm 0.33.0. Its law is vLLM v1's (:mod:`~losslessness.reference.profiles.vllm_v1`), reached in
another order.

Order (``Sampler.apply_sampling_params`` and ``Sampler.sample`` in
``vllm/v1/worker/gpu/sample/sampler.py``; its ``logits_processors`` list is "pipeline order"):

1. logits copied to float32;
2. ``LogitBiasState`` (``sample/logit_bias.py``, ``_bias_kernel``): allowed token ids (every
   other token ``-inf``), then ``+= logit_bias``, then the stop tokens ``-inf`` while
   ``pos + 1 < prompt_len + min_tokens``, i.e. while fewer than ``min_tokens`` output tokens
   precede the position (v1: bad words and min_tokens *before* the bias);
3. ``PenaltiesState`` (``sample/penalties.py``, ``_penalties_kernel``): repetition penalty on
   tokens of the prompt or the output (positive logits times ``1/r``, others times ``r``), then
   ``-= frequency * output count``, ``-= presence * (count > 0)``: v1's formulas;
4. ``BadWordsState`` (``sample/bad_words.py``): one-token bad words ``-inf`` (v1: before the
   penalties);
5. temperature (``gumbel.py``, ``_temperature_kernel``: skipped at ``T == 0`` and ``T == 1``);
6. min-p (``sample/min_p.py``, ``_min_p_kernel``): removes ``logit < max logit + log(min_p)``,
   v1's ``p < min_p * max p`` in exact arithmetic;
7. top-k/top-p through the same ``apply_top_k_top_p`` as v1 (Triton kernel, ties to the lower
   ids), then ``gumbel_sample``: Gumbel-max on the tempered logits, a plain argmax at
   ``T == 0`` (``gumbel_noised_argmax``; first maximal index per block, then the first block).

The reordering changes nothing: ``-inf`` masks commute with adding a bias and with the
penalties (``-inf`` times ``r`` or minus a count stays ``-inf``), and the bias precedes the
repetition penalty in both. The profile is therefore v1's law under its own name and
citations; the two are tested equal on random requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from losslessness.reference.profiles import steps
from losslessness.reference.profiles.registry import register
from losslessness.reference.profiles.vllm_v1 import vllm_processed_logits, vllm_sampling_filters
from losslessness.requests import Request

__all__ = ["VLLM_V2", "VllmV2Profile"]


@dataclass(frozen=True)
class VllmV2Profile:
    """vLLM model runner v2's non-speculative law (module docstring: v1's law).

    Attributes:
        name: ``vllm-v2``.
        source: the engine version and files.
    """

    name: str = "vllm-v2"
    source: str = (
        "vllm 0.33.0: vllm/v1/worker/gpu/sample/sampler.py (Sampler.apply_sampling_params, "
        "sample, _sample_random), sample/logit_bias.py (_bias_kernel), sample/penalties.py "
        "(_penalties_kernel), sample/bad_words.py, sample/min_p.py (_min_p_kernel), "
        "sample/gumbel.py, v1/sample/ops/topk_topp_sampler.py (apply_top_k_top_p)"
    )

    def law(self, logits: torch.Tensor, request: Request, history: Sequence[int]) -> torch.Tensor:
        """The distribution vLLM's v2 model runner samples from (see :class:`EngineProfile`).

        Args:
            logits: ``[V]`` float logits.
            request: the request.
            history: output tokens before the position.

        Returns:
            ``[V]`` float64 law; the one-hot of the first argmax when greedy.

        Raises:
            ValueError: malformed inputs.
        """
        scores = vllm_processed_logits(logits, request, history)
        if request.greedy:
            return steps.greedy_one_hot(scores)
        return steps.finish(vllm_sampling_filters(scores, request))


VLLM_V2 = register(VllmV2Profile())
"""The registered ``vllm-v2`` profile."""
