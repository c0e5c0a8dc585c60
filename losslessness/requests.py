"""A serving request: the per-request sampling parameters an engine applies to target logits.

A speculative verifier inside a serving engine does not see a distribution p; it sees raw target
logits and, per row of the batch, the request's sampling parameters and output history. The
engine's *non-speculative* sampler turns (logits, request, history) into the law it draws from;
an engine profile (:mod:`losslessness.reference.profiles`) states that function for one engine,
and a speculative verifier is lossless for a request when its emitted tokens follow that law at
every position, the bonus position included.

The fields are the union of what vLLM (``vllm.SamplingParams``), SGLang
(``sglang.srt.sampling.sampling_params.SamplingParams``), llama.cpp (``common_params_sampling``)
and transformers (``GenerationConfig``) accept per request; a profile raises
:class:`UnsupportedRequest` for a field its engine does not have. Position-dependent fields
(penalties, ``min_tokens``) read the history: the prompt, the tokens already emitted before the
draft block (:attr:`Request.output_token_ids`), then the drafts accepted before the position.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Request", "UnsupportedRequest"]


class UnsupportedRequest(ValueError):
    """An engine profile was asked for a request field its engine does not implement (the
    message names the field and the engine)."""


def _ids(name: str, value: Sequence[int] | None, allow_none: bool) -> tuple[int, ...] | None:
    if value is None:
        if allow_none:
            return None
        raise ValueError(f"{name} must be a sequence of token ids, got None")
    ids = tuple(value)
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise ValueError(f"{name} must hold non-negative int token ids, got {token!r}")
    return ids


def _finite(name: str, value: object, low: float | None = None, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite float")
    if low is not None and value < low:
        raise ValueError(f"{name}={value!r} must be >= {low}")
    if high is not None and value > high:
        raise ValueError(f"{name}={value!r} must be <= {high}")
    return float(value)


@dataclass(frozen=True)
class Request:
    """One request's sampling parameters and history, as a serving engine receives them.

    Attributes:
        temperature: ``T >= 0``; ``0`` is greedy decoding (the argmax of the processed
            logits).
        top_k: keep the ``k`` largest logits, an int ``>= 1``, or None (off).
        top_p: nucleus mass in ``(0, 1]``, or None (off).
        min_p: keep tokens with at least ``min_p`` times the top probability, in ``[0, 1]``,
            or None (off).
        logit_bias: ``(token id, bias)`` pairs, an additive bias on the logit (OpenAI's
            ``logit_bias``); a mapping is accepted and stored as pairs sorted by id, so that a
            request is hashable.
        frequency_penalty: subtracted from a token's logit once per occurrence in the output
            history (OpenAI semantics), in ``[-2, 2]``.
        presence_penalty: subtracted once from the logit of every token present in the output
            history, in ``[-2, 2]``.
        repetition_penalty: ``> 0``; CTRL's penalty (Keskar et al. 2019, eq. 2): a positive
            logit of a token in the prompt or output is divided by it, a negative one
            multiplied. ``1`` is off.
        min_tokens: the stop tokens are masked while fewer than ``min_tokens`` tokens were
            emitted (the history's output part counts).
        stop_token_ids: token ids that end the request (EOS included where the engine adds
            it); masked under ``min_tokens``.
        allowed_token_ids: only these ids may be sampled (vLLM's ``allowed_token_ids``), or
            None (all).
        bad_token_ids: ids never sampled (vLLM's ``bad_words`` of one token).
        seed: the request's own random seed, or None (the engine's shared stream).
        prompt_token_ids: the prompt (the repetition penalty reads it).
        output_token_ids: tokens emitted before the draft block (penalties and ``min_tokens``
            read them).

    Raises:
        ValueError: at construction, naming the first invalid field.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    bad_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    prompt_token_ids: tuple[int, ...] = ()
    output_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _finite("temperature", self.temperature, low=0.0)
        top_k = self.top_k
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1
        ):
            raise ValueError(f"top_k={top_k!r} must be None or an int >= 1")
        if self.top_p is not None:
            top_p = _finite("top_p", self.top_p, high=1.0)
            if top_p <= 0:
                raise ValueError(f"top_p={self.top_p!r} must lie in (0, 1] or be None")
        if self.min_p is not None:
            _finite("min_p", self.min_p, low=0.0, high=1.0)
        raw = self.logit_bias
        pairs = raw.items() if isinstance(raw, Mapping) else raw
        bias = {}
        for token, value in pairs:
            _ids("logit_bias", (token,), allow_none=False)
            bias[token] = _finite(f"logit_bias[{token}]", value)
        object.__setattr__(self, "logit_bias", tuple(sorted(bias.items())))
        _finite("frequency_penalty", self.frequency_penalty, low=-2.0, high=2.0)
        _finite("presence_penalty", self.presence_penalty, low=-2.0, high=2.0)
        if _finite("repetition_penalty", self.repetition_penalty) <= 0:
            raise ValueError(f"repetition_penalty={self.repetition_penalty!r} must be > 0")
        min_tokens = self.min_tokens
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
            raise ValueError(f"min_tokens={min_tokens!r} must be an int >= 0")
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed={seed!r} must be None or an int")
        for name in ("stop_token_ids", "bad_token_ids", "prompt_token_ids", "output_token_ids"):
            object.__setattr__(self, name, _ids(name, getattr(self, name), allow_none=False))
        allowed = _ids("allowed_token_ids", self.allowed_token_ids, allow_none=True)
        if allowed is not None and not allowed:
            raise ValueError("allowed_token_ids must be None or name at least one token")
        object.__setattr__(self, "allowed_token_ids", allowed)

    @property
    def greedy(self) -> bool:
        """Temperature 0: the engine emits the argmax of the processed logits."""
        return self.temperature == 0.0

    def max_token_id(self) -> int:
        """The largest token id any field names (-1 when none): a vocabulary must exceed it.

        Returns:
            An int ``>= -1``.
        """
        ids = [
            *(token for token, _ in self.logit_bias),
            *self.stop_token_ids,
            *(self.allowed_token_ids or ()),
            *self.bad_token_ids,
            *self.prompt_token_ids,
            *self.output_token_ids,
        ]
        return max(ids, default=-1)

    def check_vocabulary(self, vocab_size: int) -> None:
        """Raise when a field names a token outside ``[0, vocab_size)``.

        Raises:
            ValueError: naming the vocabulary size and the largest id found.
        """
        largest = self.max_token_id()
        if largest >= vocab_size:
            raise ValueError(
                f"request names token id {largest}, outside the vocabulary of V={vocab_size}"
            )
