"""Strategies for probability vectors and target/draft pairs over a vocabulary of size ``V``.

Every vector is a ``[V]`` float64 ``torch.Tensor``, non-negative, normalised in float64 by one
division (its sum is 1 within a few ulps, far inside 1e-12). Values come from Hypothesis-drawn
floats when ``V <= DRAWN_FLOATS_MAX_VOCAB`` (so small counterexamples shrink to readable
vectors) and from a ``numpy.random.Generator`` seeded by a drawn integer otherwise (so a
150k-token vocabulary costs one draw; shrinking then goes to seed 0 and to small ``V``).

Regimes (:data:`REGIMES`) of :func:`probability_vectors`:

``dense``
    Every token has positive mass: normalised ``(-log u) ** gamma`` with ``u`` in (0, 1)
    (``gamma = 1`` and uniform ``u`` is Dirichlet(1, ..., 1)) and ``gamma`` drawn in
    :data:`DENSE_EXPONENT_RANGE` (larger is less even).
``peaked``
    ``softmax(beta * z)`` with inverse temperature ``beta`` in
    :data:`PEAKED_INVERSE_TEMPERATURE_RANGE` and logits ``z`` in [0, 1] (half rank, half value,
    the top token at 1). Every token ranked at or below the median gets mass below
    :data:`PEAKED_TAIL_MASS_BOUND` (= exp(-10) < 1e-3), so at least half the tokens do.
``sparse``
    Exact zeros: a support of 1..V-1 tokens carrying ``dense`` mass. Needs ``V >= 2``.
``one-hot``
    All mass on one token.
``uniform``
    ``1 / V`` everywhere.

Relations (:data:`RELATIONS`) of :func:`target_draft_pairs`, for ``(p, q)``:

``identical``
    ``q == p`` elementwise.
``near``
    ``q = (1 - t) p + t r`` with ``t`` in :data:`NEAR_MIX_RANGE` and ``r`` another vector, so
    ``TV(p, q) <= t``.
``far``
    ``TV(p, q) >= FAR_MIN_TV``: q puts at most :data:`FAR_MAX_DRAFT_HEAD_MASS` on the smallest
    set of p's most likely tokens that holds half of p's mass. Needs ``V >= 2``.
``disjoint``
    ``sum min(p, q) == 0`` exactly: p and q live on disjoint token sets. Needs ``V >= 2``.
``q-zero-where-p-positive``
    Some token has ``p > 0`` and ``q == 0`` exactly (the draft can never propose it, the target
    still emits it). Needs ``V >= 2``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy
from numpy.typing import NDArray

__all__ = [
    "DENSE_EXPONENT_RANGE",
    "DRAWN_FLOATS_MAX_VOCAB",
    "FAR_MAX_DRAFT_HEAD_MASS",
    "FAR_MIN_TV",
    "NEAR_MIX_RANGE",
    "PEAKED_INVERSE_TEMPERATURE_RANGE",
    "PEAKED_TAIL_MASS_BOUND",
    "REGIMES",
    "RELATIONS",
    "probability_vectors",
    "target_draft_pairs",
]

REGIMES: tuple[str, ...] = ("dense", "peaked", "sparse", "one-hot", "uniform")
"""Named shapes of a probability vector; see the module docstring."""

RELATIONS: tuple[str, ...] = ("identical", "near", "far", "disjoint", "q-zero-where-p-positive")
"""Named relations between a target p and a draft q; see the module docstring."""

DRAWN_FLOATS_MAX_VOCAB = 8
"""Vectors of at most this many tokens are built from Hypothesis-drawn floats; larger ones from
a numpy Generator seeded by a drawn integer (cheap for any V)."""

DENSE_EXPONENT_RANGE = (0.5, 4.0)
"""Range of the exponent ``gamma`` applied to exponential weights in the ``dense`` regime."""

PEAKED_INVERSE_TEMPERATURE_RANGE = (40.0, 100.0)
"""Range of ``beta = 1 / temperature`` in the ``peaked`` regime; ``beta >= 40`` is what makes
:data:`PEAKED_TAIL_MASS_BOUND` hold."""

PEAKED_TAIL_MASS_BOUND = math.exp(-10.0)
"""Upper bound on the mass of every token ranked at or below the median in a ``peaked`` vector:
such a token's logit is at most 0.75 and the top one's is 1, so its mass is at most
``exp(-beta / 4) <= exp(-10)``."""

NEAR_MIX_RANGE = (1e-6, 0.5)
"""Range of the mixing weight ``t`` of the ``near`` relation: ``q = (1 - t) p + t r``."""

FAR_MAX_DRAFT_HEAD_MASS = 0.2
"""Most mass a ``far`` draft puts on the target's head (the most likely tokens holding half of
p's mass)."""

FAR_MIN_TV = 0.25
"""Guaranteed lower bound on ``TV(p, q)`` for the ``far`` relation (``0.5 - 0.2``, rounded down)."""

_REGIMES_NEEDING_TWO_TOKENS = frozenset({"sparse"})
_RELATIONS_NEEDING_TWO_TOKENS = frozenset({"far", "disjoint", "q-zero-where-p-positive"})
_SEED_MAX = 2**32 - 1
_FAR_HEAD_MASS = 0.5 - 1e-9  # half of p's mass, less a margin for float round-off


Vector = NDArray[np.float64]


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


def _draw_vocab_size(
    draw: st.DrawFn, vocab_size: int | SearchStrategy[int], minimum: int, why: str
) -> int:
    """The vocabulary size, drawn if it is a strategy and then validated."""
    size = draw(vocab_size) if isinstance(vocab_size, SearchStrategy) else vocab_size
    if isinstance(size, bool) or not isinstance(size, int) or size < minimum:
        raise InvalidArgument(
            f"vocab_size: the strategy drew {size!r}, but {why} needs an int >= {minimum}"
        )
    return size


def _normalise(weights: Vector) -> Vector:
    """``weights / weights.sum()`` in float64; ``weights`` non-negative with a positive sum."""
    normalised: Vector = weights / weights.sum()
    return normalised


def _unit_floats(draw: st.DrawFn, size: int) -> Vector:
    """``[size]`` float64 values in the open interval (0, 1)."""
    if size <= DRAWN_FLOATS_MAX_VOCAB:
        values = draw(
            st.lists(
                st.floats(0.0, 1.0, exclude_min=True, exclude_max=True),
                min_size=size,
                max_size=size,
            )
        )
        return np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(draw(st.integers(0, _SEED_MAX)))
    uniforms = rng.random(size)  # [0, 1)
    return np.where(uniforms > 0.0, uniforms, 0.5)


def _random_order(draw: st.DrawFn, size: int) -> NDArray[np.int64]:
    """A permutation of ``range(size)`` (the identity when the drawn floats shrink to equal)."""
    return np.argsort(_unit_floats(draw, size), kind="stable").astype(np.int64)


def _dense(draw: st.DrawFn, size: int) -> Vector:
    """``[size]`` vector with every entry positive (the ``dense`` regime)."""
    exponent = draw(st.floats(*DENSE_EXPONENT_RANGE))
    weights = (-np.log(_unit_floats(draw, size))) ** exponent
    # -log(u) > 0 for u < 1, and a power of a positive double stays positive above 1e-300.
    return _normalise(np.maximum(weights, 1e-300))


def _peaked(draw: st.DrawFn, size: int) -> Vector:
    """``[size]`` softmax at low temperature; see :data:`PEAKED_TAIL_MASS_BOUND`."""
    beta = draw(st.floats(*PEAKED_INVERSE_TEMPERATURE_RANGE))
    u = _unit_floats(draw, size)
    raw = np.log(u) - np.log1p(-u)  # logistic quantiles: finite logits
    rank = np.argsort(np.argsort(raw, kind="stable"), kind="stable").astype(np.float64)
    spread = float(raw.max() - raw.min())
    value = (raw - raw.min()) / spread if spread > 0 else np.zeros(size)
    logits = 0.5 * rank / max(size - 1, 1) + 0.5 * value  # in [0, 1], top token exactly 1
    return _normalise(np.exp(beta * (logits - logits.max())))


def _one_hot(draw: st.DrawFn, size: int) -> Vector:
    vector = np.zeros(size)
    vector[draw(st.integers(0, size - 1))] = 1.0
    return vector


def _sparse(draw: st.DrawFn, size: int) -> Vector:
    support_size = draw(st.integers(1, size - 1))
    support = _random_order(draw, size)[:support_size]
    vector = np.zeros(size)
    vector[support] = _dense(draw, support_size)
    return vector


def _draw_vector(draw: st.DrawFn, size: int, regime: str | None) -> Vector:
    """A ``[size]`` probability vector (numpy float64) in ``regime`` (drawn when None)."""
    if regime is None:
        allowed = (
            REGIMES
            if size >= 2
            else tuple(name for name in REGIMES if name not in _REGIMES_NEEDING_TWO_TOKENS)
        )
        regime = draw(st.sampled_from(allowed))
    event(f"regime={regime}")
    if size == 1:
        return np.ones(1)
    if regime == "dense":
        return _dense(draw, size)
    if regime == "peaked":
        return _peaked(draw, size)
    if regime == "sparse":
        return _sparse(draw, size)
    if regime == "one-hot":
        return _one_hot(draw, size)
    return np.full(size, 1.0 / size)


def _check_choice(value: object, name: str, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise InvalidArgument(f"{name}={value!r} must be None or one of {choices}")


def probability_vectors(
    vocab_size: int | SearchStrategy[int], regime: str | None = None
) -> SearchStrategy[torch.Tensor]:
    """Probability vectors over ``vocab_size`` tokens.

    Args:
        vocab_size: ``V``, an int ``>= 1`` or a strategy of such ints (drawn per example).
        regime: one of :data:`REGIMES` (see the module docstring), or None to draw one per
            example (``sparse`` is left out when ``V == 1``). With ``V == 1`` every regime
            gives ``[1.0]``. Each draw reports ``event("regime=...")``.

    Returns:
        A strategy of ``[V]`` float64 CPU tensors, non-negative, summing to 1 within 1e-12.

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming ``vocab_size`` (not an int or
            strategy, or ``< 1``; ``< 2`` for ``sparse``) or ``regime`` (not in
            :data:`REGIMES`); at draw time, naming ``vocab_size`` when its strategy drew an
            invalid value.
    """
    _check_choice(regime, "regime", REGIMES)
    minimum = 2 if regime in _REGIMES_NEEDING_TWO_TOKENS else 1
    check_vocab_size(vocab_size, minimum=minimum)

    @st.composite
    def vectors(draw: st.DrawFn) -> torch.Tensor:
        size = _draw_vocab_size(draw, vocab_size, minimum, f"regime={regime!r}")
        return torch.from_numpy(_draw_vector(draw, size, regime))

    return vectors()


def _far_pair(draw: st.DrawFn, size: int) -> tuple[Vector, Vector]:
    p = _draw_vector(draw, size, None)
    order = np.argsort(-p, kind="stable")
    cumulative = np.cumsum(p[order])
    # Smallest prefix of p's most likely tokens holding half the mass; the top V-1 tokens
    # always do, so the tail keeps at least one token.
    head_size = min(int(np.searchsorted(cumulative, _FAR_HEAD_MASS)) + 1, size - 1)
    head, tail = order[:head_size], order[head_size:]
    head_mass = draw(st.floats(0.0, FAR_MAX_DRAFT_HEAD_MASS))
    q = np.zeros(size)
    q[head] = head_mass * _dense(draw, head.size)
    q[tail] = (1.0 - head_mass) * _draw_vector(draw, tail.size, None)
    return p, _normalise(q)


def _disjoint_pair(draw: st.DrawFn, size: int) -> tuple[Vector, Vector]:
    order = _random_order(draw, size)
    target_size = draw(st.integers(1, size - 1))
    draft_size = draw(st.integers(1, size - target_size))
    p = np.zeros(size)
    q = np.zeros(size)
    p[order[:target_size]] = _draw_vector(draw, target_size, None)
    q[order[target_size : target_size + draft_size]] = _draw_vector(draw, draft_size, None)
    return p, q


def _q_zero_pair(draw: st.DrawFn, size: int) -> tuple[Vector, Vector]:
    p = _draw_vector(draw, size, None)
    support = np.flatnonzero(p > 0)
    hole = int(support[draw(st.integers(0, support.size - 1))])
    others = _random_order(draw, size)
    others = others[others != hole]
    extra_holes = others[: draw(st.integers(0, size - 2))]
    t = draw(st.floats(0.0, 1.0))
    q = (1.0 - t) * p + t * _draw_vector(draw, size, None)
    q[hole] = 0.0
    q[extra_holes] = 0.0
    if not q.sum() > 0.0:
        q = np.ones(size)
        q[hole] = 0.0
        q[extra_holes] = 0.0
    return p, _normalise(q)


def _draw_pair(draw: st.DrawFn, size: int, relation: str | None) -> tuple[Vector, Vector]:
    """A ``(p, q)`` pair of ``[size]`` numpy vectors in ``relation`` (drawn when None)."""
    if relation is None:
        allowed = (
            RELATIONS
            if size >= 2
            else tuple(name for name in RELATIONS if name not in _RELATIONS_NEEDING_TWO_TOKENS)
        )
        relation = draw(st.sampled_from(allowed))
    event(f"relation={relation}")
    if relation == "identical":
        p = _draw_vector(draw, size, None)
        return p, p.copy()
    if relation == "near":
        p = _draw_vector(draw, size, None)
        t = draw(st.floats(*NEAR_MIX_RANGE))
        return p, _normalise((1.0 - t) * p + t * _draw_vector(draw, size, None))
    if relation == "far":
        return _far_pair(draw, size)
    if relation == "disjoint":
        return _disjoint_pair(draw, size)
    return _q_zero_pair(draw, size)


def target_draft_pairs(
    vocab_size: int | SearchStrategy[int], relation: str | None = None
) -> SearchStrategy[tuple[torch.Tensor, torch.Tensor]]:
    """Target/draft pairs ``(p, q)`` over ``vocab_size`` tokens in a named relation.

    Args:
        vocab_size: ``V``, an int ``>= 1`` or a strategy of such ints (drawn per example).
        relation: one of :data:`RELATIONS` (see the module docstring), or None to draw one per
            example (only ``identical`` and ``near`` when ``V == 1``). p (and, where the
            relation leaves it free, q) is drawn from any of :data:`REGIMES`. Each draw
            reports ``event("relation=...")``.

    Returns:
        A strategy of ``(p, q)``, each a ``[V]`` float64 CPU tensor, non-negative, summing to
        1 within 1e-12.

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming ``vocab_size`` (not an int or
            strategy, or ``< 1``; ``< 2`` for ``far``, ``disjoint`` and
            ``q-zero-where-p-positive``) or ``relation`` (not in :data:`RELATIONS`); at draw
            time, naming ``vocab_size`` when its strategy drew an invalid value.
    """
    _check_choice(relation, "relation", RELATIONS)
    minimum = 2 if relation in _RELATIONS_NEEDING_TWO_TOKENS else 1
    check_vocab_size(vocab_size, minimum=minimum)

    @st.composite
    def pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
        size = _draw_vocab_size(draw, vocab_size, minimum, f"relation={relation!r}")
        p, q = _draw_pair(draw, size, relation)
        return torch.from_numpy(p), torch.from_numpy(q)

    return pairs()
