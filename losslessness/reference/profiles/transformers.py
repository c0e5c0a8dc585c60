"""Hugging Face transformers (``transformers``): the law ``generate`` samples from, as
``GenerationMixin._get_logits_processor`` orders its processors, transformers 5.24.0.

A request maps onto ``generate`` as follows (the mapping the engine test builds):
``logit_bias`` -> ``GenerationConfig.sequence_bias`` of one-token sequences;
``repetition_penalty``; ``bad_token_ids`` -> ``bad_words_ids`` of one token;
``stop_token_ids`` -> ``eos_token_id``; ``min_tokens`` -> ``min_new_tokens``;
``allowed_token_ids`` -> ``generate(prefix_allowed_tokens_fn=...)``; ``temperature == 0`` ->
``do_sample=False``; ``top_k``, ``top_p``, ``min_p`` as they are.

Order (``transformers/generation/utils.py``, ``_get_logits_processor``; processors in
``generation/logits_process.py``):

1. ``SequenceBiasLogitsProcessor``: ``+= bias`` (its bias tensor is float32);
2. ``RepetitionPenaltyLogitsProcessor``: on every id in ``input_ids`` (prompt and output):
   ``where(s < 0, s * r, s / r)``;
3. ``NoBadWordsLogitsProcessor``: ``-inf`` on the bad ids, *except* those equal to an
   ``eos_token_id`` (its ``__init__`` filters them out): a bad token that is also a stop token
   is not masked;
4. ``MinNewTokensLengthLogitsProcessor``: the eos ids ``-inf`` while fewer than
   ``min_new_tokens`` tokens were generated;
5. ``PrefixConstrainedLogitsProcessor``: every id outside the allowed ones ``-inf``;
6. sampling only (``do_sample=True``), the former warpers: ``TemperatureLogitsWarper``
   (``/ T``), ``TopKLogitsWarper`` (ties at the ``k``-th logit kept), ``TopPLogitsWarper``,
   ``MinPLogitsWarper`` (after top-k and top-p, on their renormalised probabilities: the
   opposite of vLLM v1's order);
7. ``torch.multinomial(softmax(scores))``, or ``argmax`` of steps 1-5 when greedy
   (``GenerationMixin._sample``).

The warpers are :mod:`losslessness.reference.processing`'s temperature, top-k and min-p. Its
top-p keeps every token tied with the last kept one; ``TopPLogitsWarper`` instead sorts the
logits ascending and removes the prefix whose cumulative mass is ``<= 1 - top_p``, so at a tie
straddling the cut it removes the tied tokens the sort puts first:
:func:`~losslessness.reference.profiles.steps.top_p_ascending_cut` states that (lower ids
first, as a stable sort; ``torch.sort`` is stable on CPU for short rows only). The two rules
agree everywhere but there.

``frequency_penalty`` and ``presence_penalty`` have no transformers processor: a request that
sets them raises :class:`~losslessness.requests.UnsupportedRequest`. ``seed`` does not change
the law.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from losslessness.reference.profiles import steps
from losslessness.reference.profiles.registry import register
from losslessness.requests import Request

__all__ = ["TRANSFORMERS", "TransformersProfile"]

ENGINE = "transformers 5.24.0"


@dataclass(frozen=True)
class TransformersProfile:
    """transformers' non-speculative law (module docstring).

    Attributes:
        name: ``transformers``.
        source: the engine version and files.
    """

    name: str = "transformers"
    source: str = (
        "transformers 5.24.0: generation/utils.py (GenerationMixin._get_logits_processor, "
        "_sample), generation/logits_process.py (SequenceBias, RepetitionPenalty, NoBadWords, "
        "MinNewTokensLength, PrefixConstrained, Temperature, TopK, TopP, MinP)"
    )

    def law(self, logits: torch.Tensor, request: Request, history: Sequence[int]) -> torch.Tensor:
        """The distribution ``generate`` samples from (see :class:`EngineProfile`).

        Args:
            logits: ``[V]`` float logits.
            request: the request.
            history: output tokens before the position.

        Returns:
            ``[V]`` float64 law; the one-hot of the first argmax of steps 1-5 when greedy.

        Raises:
            ValueError: malformed inputs.
            losslessness.requests.UnsupportedRequest: a frequency or presence penalty.
        """
        for field in ("frequency_penalty", "presence_penalty"):
            if getattr(request, field) != 0.0:
                raise steps.unsupported(ENGINE, field, "no logits processor implements it")
        scores = steps.check_position(logits, request, history)
        scores = steps.add_logit_bias(scores, request.logit_bias)
        if request.repetition_penalty != 1.0:
            seen = steps.token_counts([*request.prompt_token_ids, *history], scores.shape[0]) > 0
            scores = steps.repetition_penalty(scores, seen, request.repetition_penalty)
        stops = set(request.stop_token_ids)
        scores = steps.mask_tokens(scores, (t for t in request.bad_token_ids if t not in stops))
        scores = steps.mask_min_tokens(scores, request, len(history))
        scores = steps.keep_only(scores, request.allowed_token_ids)
        if request.greedy:
            return steps.greedy_one_hot(scores)
        scores = scores / request.temperature
        if request.top_k is not None:
            scores = steps.top_k_filter(scores, request.top_k)
        if request.top_p is not None:
            scores = steps.top_p_ascending_cut(scores, request.top_p)
        if request.min_p is not None:
            scores = steps.min_p_filter(scores, request.min_p)
        return steps.finish(scores)


TRANSFORMERS = register(TransformersProfile())
"""The registered ``transformers`` profile."""
