"""Helpers shared by the strategy modules: argument checks, raw draws, labels and targeting.

Private to :mod:`strategies`; the public names are re-exported where they belong
(:func:`check_vocab_size` from :mod:`strategies.distributions`, :func:`recording_labels` from
:mod:`strategies.coverage`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import numpy as np
import torch
from hypothesis import event, target
from hypothesis import strategies as st
from hypothesis.control import current_build_context, currently_in_test_context
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy
from numpy.typing import NDArray

Vector = NDArray[np.float64]
"""A ``[V]`` numpy float64 array."""

DRAWN_FLOATS_MAX_VOCAB = 8
"""Vectors of at most this many tokens are built from Hypothesis-drawn values (see
:data:`DRAWN_RESOLUTION`); larger ones from a numpy Generator seeded by a drawn integer (cheap
for any V). See :func:`unit_floats`."""

DRAWN_RESOLUTION = 2**16
"""Drawn values in (0, 1) are ``(i + 1/2) / DRAWN_RESOLUTION`` for 16-bit ints ``i``, all
:data:`DRAWN_FLOATS_MAX_VOCAB` of them the base-65536 digits of one drawn integer (token 0 the
most significant). One choice instead of eight keeps drawing fast and spares the shrinker's
budget (Hypothesis stops after 500 successful shrinks): an irrelevant vector shrinks to
constant values in one step, a relevant one lowers its leading tokens first."""

SEED_MAX = 2**32 - 1
"""Largest seed drawn for a numpy Generator."""

SIZE_FREE_RANGE = 2**16
"""Counts and indices that depend on ``V`` are drawn in ``[0, SIZE_FREE_RANGE)`` and reduced
modulo their range (:func:`int_between`)."""

TV_TARGET_LABEL = "TV(p, q)"
"""``hypothesis.target`` label of the total variation of a drawn pair (the largest in a case)."""

SMALLEST_MASS_TARGET_LABEL = "-log10 smallest positive mass"
"""``hypothesis.target`` label of ``-log10`` of the smallest positive mass of a drawn vector
(the largest in a case)."""

_LABEL_RECORDERS: list[list[str]] = []
_QUIET: list[bool] = [False]
_DRAWN_PACKED = st.integers(0, DRAWN_RESOLUTION**DRAWN_FLOATS_MAX_VOCAB - 1)
_SEEDS = st.integers(0, SEED_MAX)
_SIZE_FREE_INTEGERS = st.integers(0, SIZE_FREE_RANGE - 1)


def check_int(value: object, name: str, minimum: int, maximum: int | None = None) -> int:
    """Eagerly validate an int argument in ``[minimum, maximum]``.

    Raises:
        hypothesis.errors.InvalidArgument: message starts with ``name=<value>``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name}={value!r} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise InvalidArgument(f"{name}={value!r} must be at least {minimum}")
    if maximum is not None and value > maximum:
        raise InvalidArgument(f"{name}={value!r} must be at most {maximum}")
    return value


def check_float(
    value: object, name: str, minimum: float, maximum: float, *, open_minimum: bool = False
) -> float:
    """Eagerly validate a finite real argument in ``[minimum, maximum]`` (or ``(minimum, ...]``).

    Raises:
        hypothesis.errors.InvalidArgument: message starts with ``name=<value>``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{name}={value!r} must be a float, got {type(value).__name__}")
    number = float(value)
    low_ok = number > minimum if open_minimum else number >= minimum
    if not (math.isfinite(number) and low_ok and number <= maximum):
        bracket = "(" if open_minimum else "["
        raise InvalidArgument(f"{name}={value!r} must lie in {bracket}{minimum}, {maximum}]")
    return number


def check_vocab_size(vocab_size: object, name: str = "vocab_size", *, minimum: int = 1) -> None:
    """Eagerly validate a vocabulary-size argument: an int ``>= minimum`` or a strategy.

    Args:
        vocab_size: the value passed by the user.
        name: the argument's name, used in the message.
        minimum: smallest allowed integer value.

    Raises:
        hypothesis.errors.InvalidArgument: message starts with ``name=<value>``.
    """
    if isinstance(vocab_size, SearchStrategy):
        return
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise InvalidArgument(
            f"{name}={vocab_size!r} must be an int or a strategy of ints, "
            f"got {type(vocab_size).__name__}"
        )
    if vocab_size < minimum:
        raise InvalidArgument(f"{name}={vocab_size!r} must be at least {minimum}")


def draw_vocab_size(
    draw: st.DrawFn, vocab_size: int | SearchStrategy[int], minimum: int, why: str
) -> int:
    """The vocabulary size, drawn if it is a strategy and then validated."""
    size = draw(vocab_size) if isinstance(vocab_size, SearchStrategy) else vocab_size
    if isinstance(size, bool) or not isinstance(size, int) or size < minimum:
        raise InvalidArgument(
            f"vocab_size: the strategy drew {size!r}, but {why} needs an int >= {minimum}"
        )
    return size


def check_choice(value: object, name: str, choices: tuple[str, ...]) -> None:
    """``value`` is None or one of ``choices``, else ``InvalidArgument`` naming ``name``."""
    if value is not None and value not in choices:
        raise InvalidArgument(f"{name}={value!r} must be None or one of {choices}")


def check_choices(value: object, name: str, choices: tuple[str, ...]) -> tuple[str, ...] | None:
    """``value`` is None or a non-empty collection of names from ``choices`` (order kept)."""
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise InvalidArgument(f"{name}={value!r} must be None or a tuple of names from {choices}")
    picked = tuple(name_ for name_ in choices if name_ in value)
    unknown = [item for item in value if item not in choices]
    if unknown or not picked:
        raise InvalidArgument(
            f"{name}={value!r} must be None or a non-empty tuple of names from {choices}"
        )
    return picked


def check_dtype(value: object, name: str, allowed: tuple[torch.dtype, ...]) -> torch.dtype:
    """``value`` is one of ``allowed`` torch dtypes, else ``InvalidArgument`` naming ``name``."""
    if not isinstance(value, torch.dtype) or value not in allowed:
        raise InvalidArgument(f"{name}={value!r} must be one of {allowed}")
    return value


def unit_floats(draw: st.DrawFn, size: int) -> Vector:
    """``[size]`` float64 values in the open interval (0, 1).

    Every call makes the same two draws whatever ``size``: one integer packing
    :data:`DRAWN_FLOATS_MAX_VOCAB` 16-bit values and one seed. Up to that many tokens the values
    are the packed ones (see :data:`DRAWN_RESOLUTION`); above it
    they come from a numpy Generator seeded by the seed, except that seed 0 (where shrinking
    takes it) gives the constant first drawn value, as fully shrunk drawn values do. Because
    the draws do not depend on ``size``, shrinking ``V`` (say from 9 to 2) leaves every later
    draw of the example in place instead of misaligning it, and a shrunk vector looks the same
    on both sides of :data:`DRAWN_FLOATS_MAX_VOCAB`.
    """
    packed = int(draw(_DRAWN_PACKED)).to_bytes(2 * DRAWN_FLOATS_MAX_VOCAB, "big")
    drawn = (np.frombuffer(packed, dtype=">u2").astype(np.float64) + 0.5) / DRAWN_RESOLUTION
    seed = draw(_SEEDS)
    if size <= DRAWN_FLOATS_MAX_VOCAB:
        values: Vector = drawn[:size]
        return values
    if seed == 0:  # the seed's shrink target: constant, like fully shrunk drawn values
        return np.full(size, drawn[0])
    rng = np.random.default_rng(seed)
    uniforms = rng.random(size)  # [0, 1)
    return np.where(uniforms > 0.0, uniforms, 0.5)


def int_between(draw: st.DrawFn, low: int, high: int) -> int:
    """An int in ``[low, high]`` whose draw does not depend on the bounds.

    Draws one int in ``[0, SIZE_FREE_RANGE)`` and reduces it modulo the span (spans larger
    than that are drawn directly). A count or index that depends on ``V`` therefore stays a
    valid, aligned choice when the shrinker lowers ``V``; it still shrinks towards ``low``.
    """
    span = high - low + 1
    if span <= 0:
        raise InvalidArgument(f"int_between: empty range [{low}, {high}]")
    if span > SIZE_FREE_RANGE:
        return low + int(draw(st.integers(0, span - 1)))
    return low + int(draw(_SIZE_FREE_INTEGERS)) % span


def batch_window(draw: st.DrawFn, max_batch: int) -> tuple[int, int]:
    """``(B, start)``: a batch of ``B`` in ``[1, max_batch]`` rows taken from drawn rows
    ``start .. start + B - 1`` (the rows before ``start`` are drawn and discarded).

    Why: Hypothesis shrinks a batch by truncating its last rows, and cannot delete a row of
    many choices from the front. With the window, lowering ``B`` while raising ``start`` by
    the same amount (its "redistribute" pass) moves the window onto whichever row matters, so
    a counterexample shrinks to ``B = 1``. ``start`` shrinks to 0.
    """
    batch = int(draw(st.integers(1, max_batch)))
    return batch, int_between(draw, 0, max_batch - batch)


def random_order(draw: st.DrawFn, size: int) -> NDArray[np.int64]:
    """A permutation of ``range(size)`` (the identity when the drawn floats shrink to equal)."""
    return np.argsort(unit_floats(draw, size), kind="stable").astype(np.int64)


def log_uniform(draw: st.DrawFn, low: float, high: float) -> float:
    """A float in ``[low, high]`` (``0 < low <= high``), uniform in ``log``; shrinks to ``low``."""
    exponent = draw(st.floats(math.log(low), math.log(high)))
    return min(max(math.exp(exponent), low), high)


def label(text: str) -> None:
    """``hypothesis.event(text)``, also appended to every active :func:`recording_labels` list
    (nothing inside :func:`quiet`)."""
    if _QUIET[0]:
        return
    event(text)
    for recorder in _LABEL_RECORDERS:
        recorder.append(text)


@contextmanager
def quiet(enabled: bool = True) -> Iterator[None]:
    """Silence :func:`label` and :func:`observe_hardness` while drawing something the example
    does not use (rows outside a case's batch window)."""
    previous = _QUIET[0]
    _QUIET[0] = previous or enabled
    try:
        yield
    finally:
        _QUIET[0] = previous


@contextmanager
def recording_labels() -> Iterator[list[str]]:
    """Collect, in order, every label (``"regime=..."``, ``"relation=..."``, ...) the strategies
    report with ``hypothesis.event`` while the block runs.

    Yields:
        The list the labels are appended to (one entry per report, repeats included).
    """
    recorder: list[str] = []
    _LABEL_RECORDERS.append(recorder)
    try:
        yield recorder
    finally:
        _LABEL_RECORDERS.remove(recorder)


def observe_hardness(label_: str, value: float) -> None:
    """``hypothesis.target(value, label=label_)``, keeping the largest value per test case.

    Only deterministic hardness measures of the drawn case go here (TV, smallest mass), never a
    p-value. ``target`` allows one observation per label and test case, but one case draws many
    vectors; later observations therefore raise the stored one to their maximum. Outside a
    test (``strategy.example()``) this does nothing.
    """
    if _QUIET[0] or not (currently_in_test_context() and math.isfinite(value)):
        return
    observations = getattr(current_build_context().data, "target_observations", None)
    if isinstance(observations, dict) and label_ in observations:
        observations[label_] = max(float(observations[label_]), value)
        return
    with suppress(InvalidArgument):  # already observed in this test case (internals changed)
        target(value, label=label_)
