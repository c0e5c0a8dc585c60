"""Strategies for logits vectors: ``-inf`` masks, large magnitudes and exact ties at the maximum.

Every vector is a ``[V]`` float64 ``torch.Tensor`` with no NaN and no ``+inf``; ``-inf`` marks a
masked token and never fills a whole row. Every finite logit is a multiple of
:data:`LOGIT_GRID` (= 0.25) of magnitude at most ``max_magnitude <=`` :data:`MAX_LOGIT_MAGNITUDE`
(= 2**22), so it is exactly representable in float32 (24-bit significand): casting to float32
keeps every value, every tie and every order. (float16 and bfloat16 do not: above 2048 and 256
respectively their spacing exceeds 0.25, so casts may create new ties.)

Each row has 1..``max_ties`` tokens exactly tied at its maximum (``torch.argmax`` takes the
lowest index; a verifier that breaks ties otherwise is caught by greedy checks), ``0..V-ties``
masked tokens and the rest strictly below the maximum by a multiple of the grid.

Scales (:data:`LOGIT_SCALES`):

``unit``
    The maximum is one of :data:`UNIT_SCALE_TOP_LOGITS`; the others lie
    ``0.25 * (1 + floor(4 E))`` below it, ``E`` exponential(1): a typical softmax spread.
``large``
    The maximum is anywhere on the grid in ``(-max_magnitude, max_magnitude]``; the gaps below
    it are ``0.25 * (1 + floor(E * s / 0.25))`` with the spread ``s`` log-uniform in
    ``[1, 2 * max_magnitude]``, clipped at ``-max_magnitude``: magnitudes up to ``max_magnitude``
    (1e4 by default), gaps that make ``softmax`` underflow to exact zeros.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from strategies._common import (
    Vector,
    check_choice,
    check_float,
    check_int,
    check_vocab_size,
    draw_vocab_size,
    int_between,
    label,
    log_uniform,
    random_order,
    unit_floats,
)

__all__ = [
    "DEFAULT_MAX_LOGIT_MAGNITUDE",
    "LOGIT_GRID",
    "LOGIT_SCALES",
    "MAX_LOGIT_MAGNITUDE",
    "UNIT_SCALE_TOP_LOGITS",
    "logits_vectors",
]

LOGIT_GRID = 0.25
"""Every finite logit is an integer multiple of this (exact in float32 below 2**22)."""

MAX_LOGIT_MAGNITUDE = 2.0**22
"""Largest allowed ``max_magnitude``: up to it, multiples of :data:`LOGIT_GRID` are exact in
float32."""

DEFAULT_MAX_LOGIT_MAGNITUDE = 1e4
"""Default bound on ``|logit|`` (finite ones): large enough that ``softmax`` underflows."""

LOGIT_SCALES: tuple[str, ...] = ("unit", "large")
"""Named scales of a logits vector; see the module docstring."""

UNIT_SCALE_TOP_LOGITS: tuple[float, ...] = (0.0, 2.5, -1.0, 30.0)
"""Values the maximum logit takes in the ``unit`` scale (clipped into the magnitude bound)."""

DEFAULT_MAX_TIES = 3
"""Default most tokens sharing the maximum logit of a row."""

_UNIT_SPREAD = 1.0


def draw_logits(
    draw: st.DrawFn,
    size: int,
    *,
    max_magnitude: float = DEFAULT_MAX_LOGIT_MAGNITUDE,
    allow_masked: bool = True,
    max_ties: int = DEFAULT_MAX_TIES,
    scale: str | None = None,
) -> Vector:
    """``[size]`` float64 logits as documented in the module docstring (numpy, for internal use).

    Reports ``event("logits scale=...")``, ``"logits: tied maximum"`` and ``"logits: -inf
    masked"``.
    """
    if scale is None:
        scale = draw(st.sampled_from(LOGIT_SCALES))
    label(f"logits scale={scale}")
    steps = math.floor(max_magnitude / LOGIT_GRID)
    bound = LOGIT_GRID * steps  # largest grid value within max_magnitude
    n_ties = int_between(draw, 1, min(max_ties, size))
    n_masked = int_between(draw, 0, size - n_ties) if allow_masked else 0
    if scale == "unit":
        top = float(draw(st.sampled_from(UNIT_SCALE_TOP_LOGITS)))
        top = min(max(top, -bound + LOGIT_GRID), bound)
        spread = _UNIT_SPREAD
    else:
        top = LOGIT_GRID * draw(st.integers(-(steps - 1), steps))
        spread = log_uniform(draw, 1.0, 2.0 * max_magnitude)
    gaps = LOGIT_GRID * (1.0 + np.floor(-np.log(unit_floats(draw, size)) * (spread / LOGIT_GRID)))
    logits = np.maximum(top - gaps, -bound)
    order = random_order(draw, size)
    logits[order[:n_ties]] = top
    logits[order[n_ties : n_ties + n_masked]] = -np.inf
    if n_ties > 1:
        label("logits: tied maximum")
    if n_masked:
        label("logits: -inf masked")
    return logits


def logits_vectors(
    vocab_size: int | SearchStrategy[int],
    *,
    max_magnitude: float = DEFAULT_MAX_LOGIT_MAGNITUDE,
    allow_masked: bool = True,
    max_ties: int = DEFAULT_MAX_TIES,
    scale: str | None = None,
) -> SearchStrategy[torch.Tensor]:
    """Logits over ``vocab_size`` tokens with ``-inf`` masks, large magnitudes and argmax ties.

    Args:
        vocab_size: ``V``, an int ``>= 1`` or a strategy of such ints (drawn per example).
        max_magnitude: bound on ``|logit|`` of the finite logits, a float in
            ``[1, 2**22]`` (1e4 by default).
        allow_masked: whether some tokens may be ``-inf`` (never all of them).
        max_ties: most tokens exactly tied at the maximum, an int ``>= 1``.
        scale: one of :data:`LOGIT_SCALES` (see the module docstring), or None to draw one per
            example. Each draw reports ``event("logits scale=...")``.

    Returns:
        A strategy of ``[V]`` float64 CPU tensors: no NaN or ``+inf``; finite values on the
        0.25 grid within ``max_magnitude`` (exact in float32); at least one finite value.

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming ``vocab_size``, ``max_magnitude``,
            ``allow_masked``, ``max_ties`` or ``scale``; at draw time, naming ``vocab_size``
            when its strategy drew an invalid value.
    """
    check_vocab_size(vocab_size)
    magnitude = check_float(max_magnitude, "max_magnitude", 1.0, MAX_LOGIT_MAGNITUDE)
    if not isinstance(allow_masked, bool):
        raise InvalidArgument(f"allow_masked={allow_masked!r} must be a bool")
    ties = check_int(max_ties, "max_ties", 1)
    check_choice(scale, "scale", LOGIT_SCALES)

    @st.composite
    def vectors(draw: st.DrawFn) -> torch.Tensor:
        size = draw_vocab_size(draw, vocab_size, 1, "logits_vectors")
        return torch.from_numpy(
            draw_logits(
                draw,
                size,
                max_magnitude=magnitude,
                allow_masked=allow_masked,
                max_ties=ties,
                scale=scale,
            )
        )

    return vectors()
