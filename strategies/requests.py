"""Strategies for serving requests (:class:`losslessness.requests.Request`) and for the
``(logits [V], request, history)`` triples an engine profile takes.

:func:`requests` turns each field on or off independently (a field's "off" is its default), so
shrinking turns fields off one at a time and a failure names the fewest fields that cause it;
:data:`REQUEST_FIELDS` lists the switchable fields. Token ids (bias, stop, allowed, bad,
prompt, output) are drawn inside the vocabulary. :func:`profile_inputs` adds logits from
:func:`strategies.logits.logits_vectors` (ties at the maximum, masks) and a history that
starts with the request's ``output_token_ids``. Each draw reports
``event("request: <field>")`` for every field it turned on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from losslessness.requests import Request
from strategies._common import check_float, check_int, check_vocab_size, draw_vocab_size
from strategies.logits import MAX_LOGIT_MAGNITUDE, logits_vectors
from strategies.parameters import MIN_P_RANGE, SAMPLING_TEMPERATURE_RANGE, TOP_P_RANGE

__all__ = ["DEFAULT_VOCAB_SIZES", "REQUEST_FIELDS", "ProfileInput", "profile_inputs", "requests"]

REQUEST_FIELDS: tuple[str, ...] = (
    "temperature",
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
    "seed",
)
"""The fields :func:`requests` switches on and off (the history fields are always drawn)."""

DEFAULT_VOCAB_SIZES: SearchStrategy[int] = st.integers(2, 24)
"""The vocabulary sizes :func:`profile_inputs` draws by default."""

ProfileInput = tuple[torch.Tensor, Request, tuple[int, ...]]
"""``(logits [V] float64, request, history)``: one position's input to an engine profile."""


def _check_fields(fields: Sequence[str] | None) -> frozenset[str]:
    if fields is None:
        return frozenset(REQUEST_FIELDS)
    if isinstance(fields, str):
        raise InvalidArgument(f"fields={fields!r} must be a sequence of field names")
    unknown = sorted(set(fields) - set(REQUEST_FIELDS))
    if unknown:
        raise InvalidArgument(
            f"fields names unknown request fields {unknown}; known: {REQUEST_FIELDS}"
        )
    return frozenset(fields)


def _check_request_arguments(
    fields: Sequence[str] | None, greedy: bool | None, max_history: int
) -> tuple[frozenset[str], int]:
    chosen = _check_fields(fields)
    if greedy is not None and not isinstance(greedy, bool):
        raise InvalidArgument(f"greedy={greedy!r} must be None or a bool")
    return chosen, check_int(max_history, "max_history", 0)


def requests(
    vocab_size: int | SearchStrategy[int],
    *,
    fields: Sequence[str] | None = None,
    greedy: bool | None = None,
    max_history: int = 8,
) -> SearchStrategy[Request]:
    """Requests over a vocabulary of ``vocab_size`` tokens, each field on or off.

    Args:
        vocab_size: ``V >= 2``, an int or a strategy of ints.
        fields: the fields that may be turned on (a subset of :data:`REQUEST_FIELDS`; None:
            all); the others keep their defaults.
        greedy: True for ``temperature == 0`` only, False for ``temperature > 0`` only, None
            for either (``temperature`` must then be in ``fields`` to vary).
        max_history: the longest prompt and output history, an int ``>= 0``.

    Returns:
        A strategy of valid :class:`Request` objects whose token ids lie in ``[0, V)``;
        temperatures in :data:`strategies.parameters.SAMPLING_TEMPERATURE_RANGE` or 0, top-p in
        ``TOP_P_RANGE``, min-p in ``MIN_P_RANGE``, penalties in their valid ranges.

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming ``vocab_size``, ``fields``,
            ``greedy`` or ``max_history``.
    """
    check_vocab_size(vocab_size, minimum=2)
    chosen, longest = _check_request_arguments(fields, greedy, max_history)

    @st.composite
    def draw_request(draw: st.DrawFn) -> Request:
        size = draw_vocab_size(draw, vocab_size, 2, "requests")
        token = st.integers(0, size - 1)
        most = min(4, size)
        ids = st.sets(token, max_size=most).map(lambda found: tuple(sorted(found)))
        some_ids = st.sets(token, min_size=1, max_size=most).map(
            lambda found: tuple(sorted(found))
        )
        on = {name for name in sorted(chosen) if draw(st.booleans())}
        values: dict[str, object] = {}
        if greedy is True or (greedy is None and "temperature" in on and draw(st.booleans())):
            values["temperature"] = 0.0
        elif "temperature" in on:
            low, high = SAMPLING_TEMPERATURE_RANGE
            values["temperature"] = draw(st.floats(low, high))
        if "top_k" in on:
            values["top_k"] = draw(st.integers(1, size))
        if "top_p" in on:
            values["top_p"] = draw(st.floats(*TOP_P_RANGE))
        if "min_p" in on:
            values["min_p"] = draw(st.floats(*MIN_P_RANGE))
        if "logit_bias" in on:
            bias = st.floats(-5.0, 5.0, allow_nan=False)
            values["logit_bias"] = draw(st.dictionaries(token, bias, min_size=1, max_size=3))
        for name in ("frequency_penalty", "presence_penalty"):
            if name in on:
                values[name] = draw(st.floats(-2.0, 2.0))
        if "repetition_penalty" in on:
            values["repetition_penalty"] = draw(st.floats(0.5, 2.0))
        if "min_tokens" in on:
            values["min_tokens"] = draw(st.integers(1, longest + 2))
            values["stop_token_ids"] = draw(some_ids)
        if "allowed_token_ids" in on:
            values["allowed_token_ids"] = draw(some_ids)
        if "bad_token_ids" in on:
            values["bad_token_ids"] = draw(ids)
        if "seed" in on:
            values["seed"] = draw(st.integers(0, 2**31 - 1))
        history = st.lists(token, max_size=longest).map(tuple)
        values["prompt_token_ids"] = draw(history)
        values["output_token_ids"] = draw(history)
        for name in sorted(on):
            event(f"request: {name}")
        return Request(**values)  # type: ignore[arg-type]

    return draw_request()


def profile_inputs(
    vocab_size: int | SearchStrategy[int] = DEFAULT_VOCAB_SIZES,
    *,
    fields: Sequence[str] | None = None,
    greedy: bool | None = None,
    max_history: int = 8,
    max_magnitude: float = 30.0,
) -> SearchStrategy[ProfileInput]:
    """``(logits, request, history)`` triples for :meth:`EngineProfile.law`.

    Args:
        vocab_size: ``V >= 2``, an int or a strategy of ints (2..24 by default).
        fields, greedy, max_history: as :func:`requests`.
        max_magnitude: bound on the finite logits (as :func:`logits_vectors`).

    Returns:
        A strategy of triples: ``[V]`` float64 logits (ties at the maximum, ``-inf`` masks),
        a request over ``V`` tokens, and a history: the request's ``output_token_ids`` then up
        to 3 more ids (drafts accepted before the position).

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, as :func:`requests` and
            :func:`logits_vectors`.
    """
    check_vocab_size(vocab_size, minimum=2)
    _check_request_arguments(fields, greedy, max_history)
    check_float(max_magnitude, "max_magnitude", 1.0, MAX_LOGIT_MAGNITUDE)

    @st.composite
    def draw_input(draw: st.DrawFn) -> ProfileInput:
        size = draw_vocab_size(draw, vocab_size, 2, "profile_inputs")
        logits = draw(logits_vectors(size, max_magnitude=max_magnitude))
        request = draw(requests(size, fields=fields, greedy=greedy, max_history=max_history))
        drafts = draw(st.lists(st.integers(0, size - 1), max_size=3))
        return logits, request, (*request.output_token_ids, *drafts)

    return draw_input()
