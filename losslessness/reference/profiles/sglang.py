"""SGLang's sampler (``sglang-torch`` and ``sglang-flashinfer``): the law of
``sglang.srt.layers.sampler.Sampler`` for one request, sglang 0.5.23.

Order (read in the 0.5.23 wheel):

1. ``SamplingBatchInfo.apply_logits_bias`` (``srt/sampling/sampling_batch_info.py``, called by
   ``ModelRunner`` before the sampler): the penalizer orchestrator
   (``srt/sampling/penaltylib/``), then the grammar mask (none here), then ``+= logit_bias``.
   SGLang adds the bias *after* the penalties (vLLM and transformers before);
2. the penalizers read the *output* tokens only (``_cumulate_output_tokens``): frequency
   (``-= frequency * count``), presence (``-= presence`` once), min-new-tokens (stop tokens
   ``-inf`` while ``len_output_tokens < min_new_tokens``; its stop set is the request's stop ids
   with the EOS ids), and repetition (``apply_scaling_penalties``: ``where(s < 0, s * r,
   s / r)``; SGLang's repetition penalty ignores the prompt, vLLM's and transformers' do not);
3. greedy: ``SamplingParams`` turns ``0 <= T < 1e-6`` into ``T = 1, top_k = 1``; an all-greedy
   batch takes ``torch.argmax``, a mixed one samples with ``top_k = 1``; both give the first
   maximal processed logit (the sort behind ``top_k = 1`` is the first index on CPU);
4. ``logits / T`` then ``softmax`` (``Sampler.forward``);
5. the filters, on the probabilities of step 4:

   - ``sglang-torch`` (``--sampling-backend pytorch``,
     ``top_k_top_p_min_p_sampling_from_probs_torch``): one descending sort; a token is kept iff
     its rank is ``< top_k`` *and* the mass ranked strictly before it is ``<= top_p`` (computed
     on the unfiltered probabilities: top-p does not see the top-k cut) *and* its probability
     is ``>= min_p * max p``; ``torch.multinomial`` renormalises;
   - ``sglang-flashinfer`` (the default backend): with ``min_p > 0`` in the batch,
     ``top_k_renorm_prob`` then ``top_p_renorm_prob`` then ``min_p_sampling_from_probs``
     (sequential, each on the renormalised output of the last); otherwise
     ``top_k_top_p_sampling_from_probs(..., filter_apply_order="joint")``: a token is kept iff
     fewer than ``top_k`` tokens are strictly more likely *and* the mass of the strictly more
     likely tokens is ``< top_p``, both on the unfiltered probabilities. The FlashInfer rules
     are :mod:`~losslessness.reference.profiles.flashinfer`'s (read from FlashInfer's source,
     not from the 0.7.2 wheel SGLang pins: see that module).

Findings stated here, not hidden in the profile:

- The penalizers run in the iteration order of a Python *set* of classes
  (``penalizers={BatchedFrequencyPenalizer, ...}`` in ``SamplingBatchInfo.from_schedule_batch``,
  kept by the dict comprehension in ``BatchedPenalizerOrchestrator.__init__``). A class's hash
  is its address, so whether the repetition penalty runs before or after the frequency and
  presence penalties can change from one process to the next. The profile applies the additive
  penalties first, then the repetition penalty: the order SGLang itself uses in its speculative
  path (``BatchedPenalizerOrchestrator.apply(..., repeat=...)``) and its overlap mode. Observed:
  two runs of ``tests/adapters/test_engine_profiles.py`` on the same machine took the two
  orders (logit 3, repetition 2, frequency 1: 1.0 in one process, 0.5 in the other).
- ``need_min_p_sampling`` is a batch flag: under the FlashInfer backend a request without min-p
  gets the sequential top-k-then-top-p law when *another* request of the batch sets min-p, the
  joint law otherwise. The profile states the law of a batch whose other rows do not set min-p
  (for a request with ``min_p > 0``, the sequential one).

Ties: ``sglang-torch`` cuts a sort by rank (ties at the ``k``-th or at the top-p cut broken
toward the lower id here: the sort's order, stable only for short CPU rows); the FlashInfer
rules are by value (tied tokens kept or removed together).

``allowed_token_ids`` and ``bad_token_ids`` have no SGLang sampling parameter (SGLang
constrains tokens through grammars): they raise :class:`~losslessness.requests.UnsupportedRequest`.
``seed`` does not change the law.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from losslessness.reference.profiles import steps
from losslessness.reference.profiles.flashinfer import (
    joint_keep,
    min_p_keep,
    top_k_value_keep,
    top_p_value_keep,
)
from losslessness.reference.profiles.registry import register
from losslessness.requests import Request

__all__ = [
    "SGLANG_FLASHINFER",
    "SGLANG_TORCH",
    "SGLangProfile",
    "sglang_processed_logits",
]

ENGINE = "sglang 0.5.23"

SAMPLING_EPS = 1e-6
"""``sglang.srt.sampling.sampling_params._SAMPLING_EPS``: ``0 <= T`` below it is greedy."""


def sglang_processed_logits(
    logits: torch.Tensor, request: Request, history: Sequence[int]
) -> torch.Tensor:
    """Steps 1-2 of the module docstring: penalties (additive, then repetition), then the
    logit bias.

    Args:
        logits: ``[V]`` float logits.
        request: the request.
        history: output tokens before the position.

    Returns:
        ``[V]`` float64 processed logits.

    Raises:
        ValueError: malformed inputs.
        losslessness.requests.UnsupportedRequest: allowed or bad token ids.
    """
    if request.allowed_token_ids is not None:
        raise steps.unsupported(ENGINE, "allowed_token_ids", "no such sampling parameter")
    if request.bad_token_ids:
        raise steps.unsupported(ENGINE, "bad_token_ids", "no such sampling parameter")
    scores = steps.check_position(logits, request, history)
    counts = steps.token_counts(history, scores.shape[0])
    scores = steps.frequency_presence_penalties(
        scores, counts, request.frequency_penalty, request.presence_penalty
    )
    scores = steps.mask_min_tokens(scores, request, len(history))
    if request.repetition_penalty != 1.0:
        scores = steps.repetition_penalty(scores, counts > 0, request.repetition_penalty)
    return steps.add_logit_bias(scores, request.logit_bias)


def _torch_keep(probs: torch.Tensor, request: Request) -> torch.Tensor:
    keep = torch.ones_like(probs, dtype=torch.bool)
    if request.top_k is not None:
        keep &= steps.top_k_by_rank(probs, request.top_k) > steps.MINUS_INF
    if request.top_p is not None:
        keep &= steps.top_p_descending_cut(probs, request.top_p, inclusive=True)
    if request.min_p is not None and request.min_p > 0:
        keep &= probs >= request.min_p * probs.max()
    return keep


def _flashinfer_keep(probs: torch.Tensor, request: Request) -> torch.Tensor:
    if request.min_p is not None and request.min_p > 0:
        keep = torch.ones_like(probs, dtype=torch.bool)
        if request.top_k is not None:
            keep &= top_k_value_keep(probs, request.top_k)
        if request.top_p is not None:
            kept = torch.where(keep, probs, 0.0)
            keep &= top_p_value_keep(kept / kept.sum(), request.top_p)
        return keep & min_p_keep(torch.where(keep, probs, 0.0), request.min_p)
    return joint_keep(probs, request.top_k, request.top_p)


@dataclass(frozen=True)
class SGLangProfile:
    """SGLang's non-speculative law under one sampling backend (module docstring).

    Attributes:
        name: ``sglang-torch`` or ``sglang-flashinfer``.
        source: the engine version and files.
        backend: ``pytorch`` or ``flashinfer`` (``--sampling-backend``).
    """

    name: str
    source: str
    backend: str

    def law(self, logits: torch.Tensor, request: Request, history: Sequence[int]) -> torch.Tensor:
        """The distribution SGLang samples from (see :class:`EngineProfile`).

        Args:
            logits: ``[V]`` float logits.
            request: the request.
            history: output tokens before the position.

        Returns:
            ``[V]`` float64 law; the one-hot of the first argmax when greedy.

        Raises:
            ValueError: malformed inputs.
            losslessness.requests.UnsupportedRequest: allowed or bad token ids.
        """
        scores = sglang_processed_logits(logits, request, history)
        if request.temperature < SAMPLING_EPS or request.top_k == 1:
            return steps.greedy_one_hot(scores)
        probs = steps.finish(scores / request.temperature)
        if self.backend == "pytorch":
            keep = _torch_keep(probs, request)
        else:
            keep = _flashinfer_keep(probs, request)
        kept = torch.where(keep, probs, 0.0)
        return kept / kept.sum()


_SOURCE = (
    "sglang 0.5.23: srt/layers/sampler.py (Sampler.forward, _sample_from_probs, "
    "top_k_top_p_min_p_sampling_from_probs_torch), srt/sampling/sampling_batch_info.py "
    "(from_schedule_batch, apply_logits_bias), srt/sampling/penaltylib/ (orchestrator.py, "
    "frequency_penalty.py, presence_penalty.py, repetition_penalty.py, min_new_tokens.py), "
    "srt/sampling/sampling_params.py"
)

SGLANG_TORCH = register(
    SGLangProfile(name="sglang-torch", source=_SOURCE + "; backend pytorch", backend="pytorch")
)
"""The registered ``sglang-torch`` profile."""

SGLANG_FLASHINFER = register(
    SGLangProfile(
        name="sglang-flashinfer", source=_SOURCE + "; backend flashinfer", backend="flashinfer"
    )
)
"""The registered ``sglang-flashinfer`` profile."""
