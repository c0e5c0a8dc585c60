"""llama.cpp's default sampler chain (``llama.cpp``): the law ``common_sampler`` draws from.

Sources (no release tag could be pinned: the project's source index holds master commits of
``ggml-org/llama.cpp``, and none could be matched to a tag):

- ``common/sampling.cpp`` at ``00efb3e184262872916bf136b3df63c1822a19bd``,
  ``common_sampler_init``: a ``logit_bias`` sampler first (when the request has biases), then
  the samplers of ``params.samplers`` in order, then ``dist``;
- ``common/common.h`` at ``001d906a6d86e2490e394361e7cc6f478b100088``,
  ``common_params_sampling::samplers``, the default order: penalties, DRY, top-n-sigma, top-k,
  typical-p, top-p, min-p, XTC, temperature (DRY, top-n-sigma, typical-p and XTC are off by
  default: ``dry_multiplier = 0``, ``top_n_sigma = -1``, ``typ_p = 1``,
  ``xtc_probability = 0``); ``penalty_last_n = 64``;
- the samplers in ``src/llama-sampling.cpp`` (the index's copy; its commit is not recorded):
  ``llama_sampler_penalties_apply`` (for each token among the last ``penalty_last_n`` accepted:
  ``logit <= 0`` times ``penalty_repeat``, else divided, then
  ``-= count * freq + (count > 0) * present``, counts over that window),
  ``llama_sampler_top_k_impl`` (keeps exactly ``k``: ``std::partial_sort`` or a bucket sort,
  ties at the ``k``-th unspecified), ``llama_sampler_top_p_apply`` (softmax of the *surviving*
  candidates, sorted descending, kept until the cumulative sum first reaches ``p``),
  ``llama_sampler_min_p_apply`` (keeps ``logit >= max logit + log(min_p)`` among the
  survivors), ``llama_sampler_temp_impl`` (``logit / T``; ``T <= 0`` keeps only the first
  maximal logit: greedy), ``llama_sampler_dist_apply`` (softmax of the survivors, one draw).

The order differs from vLLM's and transformers': the temperature comes *last*, so top-p and
min-p see the ``T = 1`` probabilities (renormalised over the top-k survivors), and the
penalties see every token the sampler accepted in its window of 64, which in the server
includes the prompt (``common_sampler_accept`` of the prompt tokens: read in forks of the
server, not verified at the commit above); the profile counts the last 64 tokens of
``prompt_token_ids + history``.

Ties the engine leaves unspecified are broken toward the lower id (stable sorts):
:func:`~losslessness.reference.profiles.steps.top_k_by_rank` and
:func:`~losslessness.reference.profiles.steps.top_p_descending_cut`.

``bad_token_ids`` map to a ``logit_bias`` of ``-inf`` (the server's ``[id, false]``).
``min_tokens`` and ``allowed_token_ids`` have no llama.cpp sampler: they raise
:class:`~losslessness.requests.UnsupportedRequest`. ``seed`` does not change the law.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from losslessness.reference.profiles import steps
from losslessness.reference.profiles.registry import register
from losslessness.requests import Request

__all__ = ["LLAMA_CPP", "PENALTY_LAST_N", "LlamaCppProfile"]

ENGINE = "llama.cpp (common_sampler default chain)"

PENALTY_LAST_N = 64
"""``common_params_sampling::penalty_last_n``: the penalties' window of accepted tokens."""


@dataclass(frozen=True)
class LlamaCppProfile:
    """llama.cpp's non-speculative law (module docstring).

    Attributes:
        name: ``llama.cpp``.
        source: the files and commits read.
    """

    name: str = "llama.cpp"
    source: str = (
        "ggml-org/llama.cpp: common/sampling.cpp 00efb3e1 (common_sampler_init), "
        "common/common.h 001d906a (common_params_sampling::samplers), src/llama-sampling.cpp "
        "(llama_sampler_penalties_apply, top_k_impl, top_p_apply, min_p_apply, temp_impl, "
        "dist_apply); no release tag verified"
    )

    def law(self, logits: torch.Tensor, request: Request, history: Sequence[int]) -> torch.Tensor:
        """The distribution llama.cpp's default chain samples from (see
        :class:`EngineProfile`).

        Args:
            logits: ``[V]`` float logits.
            request: the request.
            history: output tokens before the position.

        Returns:
            ``[V]`` float64 law; the one-hot of the first maximal logit when greedy.

        Raises:
            ValueError: malformed inputs.
            losslessness.requests.UnsupportedRequest: ``min_tokens`` or ``allowed_token_ids``.
        """
        if request.min_tokens > 0:
            raise steps.unsupported(ENGINE, "min_tokens", "no sampler implements it")
        if request.allowed_token_ids is not None:
            raise steps.unsupported(ENGINE, "allowed_token_ids", "no sampler implements it")
        scores = steps.check_position(logits, request, history)
        scores = steps.add_logit_bias(scores, request.logit_bias)
        scores = steps.mask_tokens(scores, request.bad_token_ids)
        window = [*request.prompt_token_ids, *history][-PENALTY_LAST_N:]
        counts = steps.token_counts(window, scores.shape[0])
        if request.repetition_penalty != 1.0:
            penalised = torch.where(
                scores <= 0,
                scores * request.repetition_penalty,
                scores / request.repetition_penalty,
            )
            scores = torch.where(counts > 0, penalised, scores)
        scores = steps.frequency_presence_penalties(
            scores, counts, request.frequency_penalty, request.presence_penalty
        )
        if request.top_k is not None:
            scores = steps.top_k_by_rank(scores, request.top_k)
        if request.top_p is not None and request.top_p < 1.0:
            keep = steps.top_p_descending_cut(steps.finish(scores), request.top_p, inclusive=False)
            scores = torch.where(keep, scores, steps.MINUS_INF)
        if request.min_p is not None and request.min_p > 0:
            floor = scores.max() + math.log(request.min_p)
            scores = torch.where(scores >= floor, scores, steps.MINUS_INF)
        if request.greedy:
            return steps.greedy_one_hot(scores)
        return steps.finish(scores / request.temperature)


LLAMA_CPP = register(LlamaCppProfile())
"""The registered ``llama.cpp`` profile."""
