"""Strategies for probability vectors and target/draft pairs over a vocabulary of size ``V``.

Every vector is built as a ``[V]`` numpy float64 array, non-negative, normalised in float64 by
one division (its sum is 1 within a few ulps, far inside 1e-12), and only then cast to the
requested dtype (:data:`PROBABILITY_DTYPES`; see "Low-precision casts" below). Values come from
Hypothesis-drawn values (multiples of 1/4096 in (0, 1)) when ``V <= DRAWN_FLOATS_MAX_VOCAB``
(so small counterexamples shrink to readable vectors) and from a ``numpy.random.Generator``
seeded by a drawn integer otherwise (so a 150k-token vocabulary costs one draw; shrinking then
goes to seed 0 and to small ``V``). Each vector makes the same draws whatever ``V``, so
shrinking ``V`` does not misalign the rest of the example.

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
``tiny-masses``
    1..V-1 tokens carry tiny masses ``10 ** x`` next to normal ones: the smallest has
    ``x = f`` with ``f`` drawn in :data:`TINY_MASS_LOG10_RANGE` (down to 1e-30), the others
    ``x`` uniform in ``[f, -8]``; the ``n`` normal tokens share the rest within a factor 2 of
    each other (each above ``1 / (2 n)``, less the tiny total). Every mass is positive.
    Needs ``V >= 2``.
``long-tailed``
    Zipf-Mandelbrot, as real vocabularies are: ``p ~ 1 / (rank + b) ** s`` over a random
    permutation of the tokens, ``s`` in :data:`ZIPF_EXPONENT_RANGE`, ``b`` in
    :data:`ZIPF_OFFSET_RANGE` (rank 0 is the most likely token). Every mass is positive.

Relations (:data:`RELATIONS`) of :func:`target_draft_pairs`, for ``(p, q)``:

``identical``
    ``q == p`` elementwise.
``near``
    ``q = (1 - t) p + t r`` with ``t`` log-uniform in :data:`NEAR_MIX_RANGE` (1e-9 to 0.5) and
    ``r`` another vector, so ``TV(p, q) <= t``.
``far``
    ``TV(p, q) >= FAR_MIN_TV``: q puts at most :data:`FAR_MAX_DRAFT_HEAD_MASS` on the smallest
    set of p's most likely tokens that holds half of p's mass. Needs ``V >= 2``.
``disjoint``
    ``sum min(p, q) == 0`` exactly: p and q live on disjoint token sets. Needs ``V >= 2``.
``q-zero-where-p-positive``
    Some token has ``p > 0`` and ``q == 0`` exactly (the draft can never propose it, the target
    still emits it). Needs ``V >= 2``.
``p-zero-where-q-positive``
    The reverse: some token has ``q > 0`` and ``p == 0`` exactly (the draft proposes a token
    the target never emits: it must always be rejected). Needs ``V >= 2``.
``temperature``
    One logits vector ``z`` (:func:`strategies.logits.logits_vectors`: ``-inf`` masks, ties,
    magnitudes up to 1e4) at two temperatures: ``p = softmax(z / T_p)``,
    ``q = softmax(z / T_q)``, ``T_p`` log-uniform in :data:`TEMPERATURE_RANGE` and
    ``T_q = T_p * r ** +-1`` with ``r`` log-uniform in :data:`TEMPERATURE_RATIO_RANGE`
    (so ``T_q != T_p``): the same support, different sharpness.
``adversarial``
    q lives on the ``m <= V // 2`` tokens where p is smallest (ties broken at random) and leans
    towards the very smallest: ``q ~ exp(-gamma * rank)`` there, ``gamma`` in
    :data:`ADVERSARIAL_TILT_RANGE` (large ``gamma`` is the one-hot q at ``argmin p``, which
    maximises ``TV(p, q) = 1 - min p`` for a draft of that support). Since the ``m`` smallest
    masses hold at most ``m / V <= 1/2``, ``TV(p, q) >= ADVERSARIAL_MIN_TV = 0.5``. Needs
    ``V >= 2``.

Every drawn vector reports ``event("regime=<name>")`` and every pair ``event("relation=<name>")``
(inner vectors of a pair report their regimes too). Hypothesis's ``target()`` is fed two
deterministic hardness measures only (never a p-value): ``TV(p, q)`` of every pair and
``-log10`` of the smallest positive mass of every vector (a pair's p and q included), the
largest of each in one test case (labels :data:`TV_TARGET_LABEL`,
:data:`SMALLEST_MASS_TARGET_LABEL`).

Low-precision casts
    :func:`renormalise_then_cast` renormalises in float64 and casts last. Summed in float64 (as
    :mod:`losslessness.protocol` sums), a cast row of ``V`` tokens sums to 1 within
    :func:`row_sum_tolerance` ``(dtype, V)`` ``= 1e-12 + u + V * h + V * 2**-53``, ``u`` the
    unit round-off and ``h`` half the smallest subnormal of the dtype (each entry moves by at
    most ``u`` times itself, or by ``h`` where it is subnormal or flushed):

    =========  ==========  =========  ==========================  ========================
    dtype      u           h          bound at V = 64 / 150k      measured max at 64 / 150k
    =========  ==========  =========  ==========================  ========================
    float64    --          --         1e-12 (promise)             4.4e-16 / 1.1e-15
    float32    5.96e-8     7.0e-46    5.96e-8 / 5.96e-8           5.8e-8 / 1.7e-8
    bfloat16   3.91e-3     4.6e-41    3.91e-3 / 3.91e-3           2.0e-3 / 1.4e-3
    float16    4.88e-4     2.98e-8    4.90e-4 / 4.96e-3           3.3e-4 / 1.4e-3
    =========  ==========  =========  ==========================  ========================

    (measured: largest ``|sum - 1|`` over 200 draws of every regime at V = 64 and 10 at
    V = 150k, seed 0, by ``benchmarks/strategy_coverage.py --tolerances``; the float32 bound is
    nearly reached.) The protocol's 1e-5 row-sum tolerance therefore holds for float64 and
    float32 rows but not for bfloat16 or float16 ones. A cast also changes small masses:
    float16 flushes masses below ``2**-25`` (about 3e-8) to exact zeros and rounds those below
    6.1e-5 to its subnormal grid; float32 and bfloat16 keep masses down to about 1e-38 (1e-45
    and 9e-41 subnormal). That is what real low-precision inputs look like;
    :func:`effective_probabilities` gives the float64 law a verifier reading the cast rows
    should follow. Cast rows always keep positive mass: a row's largest mass is at least
    ``1 / V`` (6.7e-6 at V = 150k), which every dtype represents for any V below 16 million.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from strategies._common import (
    DRAWN_FLOATS_MAX_VOCAB,
    SMALLEST_MASS_TARGET_LABEL,
    TV_TARGET_LABEL,
    Vector,
    check_choice,
    check_dtype,
    check_vocab_size,
    draw_vocab_size,
    int_between,
    label,
    log_uniform,
    observe_hardness,
    random_order,
    unit_floats,
)
from strategies.logits import draw_logits

__all__ = [
    "ADVERSARIAL_MIN_TV",
    "ADVERSARIAL_TILT_RANGE",
    "DENSE_EXPONENT_RANGE",
    "DRAWN_FLOATS_MAX_VOCAB",
    "FAR_MAX_DRAFT_HEAD_MASS",
    "FAR_MIN_TV",
    "FLOAT64_ROW_SUM_TOLERANCE",
    "NEAR_MIX_RANGE",
    "PEAKED_INVERSE_TEMPERATURE_RANGE",
    "PEAKED_TAIL_MASS_BOUND",
    "PROBABILITY_DTYPES",
    "REGIMES",
    "RELATIONS",
    "SMALLEST_MASS_TARGET_LABEL",
    "TEMPERATURE_RANGE",
    "TEMPERATURE_RATIO_RANGE",
    "TINY_MASS_LOG10_RANGE",
    "TV_TARGET_LABEL",
    "ZIPF_EXPONENT_RANGE",
    "ZIPF_OFFSET_RANGE",
    "check_vocab_size",
    "effective_probabilities",
    "probability_vectors",
    "renormalise_then_cast",
    "row_sum_tolerance",
    "target_draft_pairs",
]

REGIMES: tuple[str, ...] = (
    "dense",
    "peaked",
    "sparse",
    "one-hot",
    "uniform",
    "tiny-masses",
    "long-tailed",
)
"""Named shapes of a probability vector; see the module docstring."""

RELATIONS: tuple[str, ...] = (
    "identical",
    "near",
    "far",
    "disjoint",
    "q-zero-where-p-positive",
    "p-zero-where-q-positive",
    "temperature",
    "adversarial",
)
"""Named relations between a target p and a draft q; see the module docstring."""

PROBABILITY_DTYPES: tuple[torch.dtype, ...] = (
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
)
"""Dtypes a probability vector may be cast to (after exact normalisation in float64)."""

FLOAT64_ROW_SUM_TOLERANCE = 1e-12
"""How far from 1 a float64 row of any strategy here sums."""

DENSE_EXPONENT_RANGE = (0.5, 4.0)
"""Range of the exponent ``gamma`` applied to exponential weights in the ``dense`` regime."""

PEAKED_INVERSE_TEMPERATURE_RANGE = (40.0, 100.0)
"""Range of ``beta = 1 / temperature`` in the ``peaked`` regime; ``beta >= 40`` is what makes
:data:`PEAKED_TAIL_MASS_BOUND` hold."""

PEAKED_TAIL_MASS_BOUND = math.exp(-10.0)
"""Upper bound on the mass of every token ranked at or below the median in a ``peaked`` vector:
such a token's logit is at most 0.75 and the top one's is 1, so its mass is at most
``exp(-beta / 4) <= exp(-10)``."""

TINY_MASS_LOG10_RANGE = (-30.0, -8.0)
"""Range of ``log10`` of the smallest mass of a ``tiny-masses`` vector (before its one
normalising division, which changes masses by a factor within ``[1 / (1 + V 1e-8), 1]``); the
other tiny masses lie between it and 1e-8."""

ZIPF_EXPONENT_RANGE = (0.8, 1.5)
"""Range of the exponent ``s`` of the ``long-tailed`` regime."""

ZIPF_OFFSET_RANGE = (1.0, 10.0)
"""Range of the offset ``b`` of the ``long-tailed`` regime (``b = 1`` is plain Zipf)."""

NEAR_MIX_RANGE = (1e-9, 0.5)
"""Range of the mixing weight ``t`` of the ``near`` relation: ``q = (1 - t) p + t r``, ``t``
log-uniform."""

FAR_MAX_DRAFT_HEAD_MASS = 0.2
"""Most mass a ``far`` draft puts on the target's head (the most likely tokens holding half of
p's mass)."""

FAR_MIN_TV = 0.25
"""Guaranteed lower bound on ``TV(p, q)`` for the ``far`` relation (``0.5 - 0.2``, rounded down)."""

TEMPERATURE_RANGE = (0.25, 4.0)
"""Range of the target's temperature ``T_p`` in the ``temperature`` relation (log-uniform)."""

TEMPERATURE_RATIO_RANGE = (1.25, 8.0)
"""Range of ``max(T_p, T_q) / min(T_p, T_q)`` in the ``temperature`` relation (log-uniform)."""

ADVERSARIAL_TILT_RANGE = (0.0, 20.0)
"""Range of ``gamma`` in the ``adversarial`` relation's ``q ~ exp(-gamma * rank)``."""

ADVERSARIAL_MIN_TV = 0.5
"""Guaranteed lower bound on ``TV(p, q)`` for the ``adversarial`` relation."""

_REGIMES_NEEDING_TWO_TOKENS = frozenset({"sparse", "tiny-masses"})
_RELATIONS_NEEDING_TWO_TOKENS = frozenset(
    {"far", "disjoint", "q-zero-where-p-positive", "p-zero-where-q-positive", "adversarial"}
)
_FAR_HEAD_MASS = 0.5 - 1e-9  # half of p's mass, less a margin for float round-off
_TINY_LARGEST_LOG10 = -8.0

# Unit round-off u and half the smallest subnormal h of each dtype (round to nearest).
_UNIT_ROUNDOFF: dict[torch.dtype, float] = {
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}
_HALF_SMALLEST_SUBNORMAL: dict[torch.dtype, float] = {
    torch.float32: 2.0**-150,
    torch.bfloat16: 2.0**-134,
    torch.float16: 2.0**-25,
}


def _normalise(weights: Vector) -> Vector:
    """``weights / weights.sum()`` in float64; ``weights`` non-negative with a positive sum."""
    normalised: Vector = weights / weights.sum()
    return normalised


def _softmax(logits: Vector) -> Vector:
    """``softmax`` in float64 of logits with at least one finite value (``-inf`` gives 0)."""
    return _normalise(np.exp(logits - logits.max()))


def _dense(draw: st.DrawFn, size: int) -> Vector:
    """``[size]`` vector with every entry positive (the ``dense`` regime)."""
    exponent = draw(st.floats(*DENSE_EXPONENT_RANGE))
    weights = (-np.log(unit_floats(draw, size))) ** exponent
    # -log(u) > 0 for u < 1, and a power of a positive double stays positive above 1e-300.
    return _normalise(np.maximum(weights, 1e-300))


def _peaked(draw: st.DrawFn, size: int) -> Vector:
    """``[size]`` softmax at low temperature; see :data:`PEAKED_TAIL_MASS_BOUND`."""
    beta = draw(st.floats(*PEAKED_INVERSE_TEMPERATURE_RANGE))
    u = unit_floats(draw, size)
    raw = np.log(u) - np.log1p(-u)  # logistic quantiles: finite logits
    rank = np.argsort(np.argsort(raw, kind="stable"), kind="stable").astype(np.float64)
    spread = float(raw.max() - raw.min())
    value = (raw - raw.min()) / spread if spread > 0 else np.zeros(size)
    logits = 0.5 * rank / max(size - 1, 1) + 0.5 * value  # in [0, 1], top token exactly 1
    return _softmax(beta * logits)


def _one_hot(draw: st.DrawFn, size: int) -> Vector:
    vector = np.zeros(size)
    vector[int_between(draw, 0, size - 1)] = 1.0
    return vector


def _sparse(draw: st.DrawFn, size: int) -> Vector:
    support_size = int_between(draw, 1, size - 1)
    support = random_order(draw, size)[:support_size]
    vector = np.zeros(size)
    vector[support] = _dense(draw, support_size)
    return vector


def _tiny_masses(draw: st.DrawFn, size: int) -> Vector:
    """1..size-1 masses in ``[10**f, 1e-8]`` (the smallest exactly ``10**f``), the rest normal."""
    n_tiny = int_between(draw, 1, size - 1)
    smallest = draw(st.floats(*TINY_MASS_LOG10_RANGE))
    spread = unit_floats(draw, n_tiny)
    exponents = smallest + (_TINY_LARGEST_LOG10 - smallest) * spread
    exponents[int(np.argmin(spread))] = smallest
    order = random_order(draw, size)
    weights = np.empty(size)
    weights[order[:n_tiny]] = 10.0**exponents
    normal = 1.0 + unit_floats(draw, size - n_tiny)  # in (1, 2): within a factor 2
    weights[order[n_tiny:]] = normal / normal.sum()
    return _normalise(weights)


def _long_tailed(draw: st.DrawFn, size: int) -> Vector:
    """Zipf-Mandelbrot ``1 / (rank + b) ** s`` over a random permutation of the tokens."""
    exponent = draw(st.floats(*ZIPF_EXPONENT_RANGE))
    offset = draw(st.floats(*ZIPF_OFFSET_RANGE))
    ranks = np.empty(size)
    ranks[random_order(draw, size)] = np.arange(size, dtype=np.float64)
    return _normalise((ranks + offset) ** -exponent)


def _allowed(names: tuple[str, ...], size: int, needing_two: frozenset[str]) -> tuple[str, ...]:
    if size >= 2:
        return names
    small = tuple(name for name in names if name not in needing_two)
    return small or names


def _observe_smallest_mass(vector: Vector) -> None:
    """``target`` ``-log10`` of the smallest positive mass (every vector has one)."""
    observe_hardness(SMALLEST_MASS_TARGET_LABEL, -math.log10(float(vector[vector > 0].min())))


def _draw_vector(
    draw: st.DrawFn, size: int, regime: str | None, regimes: tuple[str, ...] = REGIMES
) -> Vector:
    """A ``[size]`` float64 probability vector (numpy) in ``regime``, drawn from ``regimes``
    (less those needing two tokens when ``size == 1``) when None."""
    if regime is None:
        regime = draw(st.sampled_from(_allowed(regimes, size, _REGIMES_NEEDING_TWO_TOKENS)))
    label(f"regime={regime}")
    if size == 1:
        vector = np.ones(1)
    elif regime == "dense":
        vector = _dense(draw, size)
    elif regime == "peaked":
        vector = _peaked(draw, size)
    elif regime == "sparse":
        vector = _sparse(draw, size)
    elif regime == "one-hot":
        vector = _one_hot(draw, size)
    elif regime == "tiny-masses":
        vector = _tiny_masses(draw, size)
    elif regime == "long-tailed":
        vector = _long_tailed(draw, size)
    else:
        vector = np.full(size, 1.0 / size)
    _observe_smallest_mass(vector)
    return vector


def row_sum_tolerance(dtype: torch.dtype, vocab_size: int) -> float:
    """Bound on ``|sum(row) - 1|`` (summed in float64) of a row of ``vocab_size`` tokens cast to
    ``dtype`` by :func:`renormalise_then_cast`; see "Low-precision casts" in the module docstring.

    Args:
        dtype: one of :data:`PROBABILITY_DTYPES`.
        vocab_size: ``V >= 1``.

    Returns:
        :data:`FLOAT64_ROW_SUM_TOLERANCE` for float64, else ``1e-12 + u + V h + V 2**-53``.

    Raises:
        hypothesis.errors.InvalidArgument: naming ``dtype`` or ``vocab_size``.
    """
    check_dtype(dtype, "dtype", PROBABILITY_DTYPES)
    check_vocab_size(vocab_size)
    if dtype == torch.float64:
        return FLOAT64_ROW_SUM_TOLERANCE
    return (
        FLOAT64_ROW_SUM_TOLERANCE
        + _UNIT_ROUNDOFF[dtype]
        + vocab_size * (_HALF_SMALLEST_SUBNORMAL[dtype] + 2.0**-53)
    )


def renormalise_then_cast(probs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Renormalise the rows of ``probs`` ``[..., V]`` in float64, then cast to ``dtype``: the
    rows a verifier is fed in ``dtype`` (the law it is then given is
    :func:`losslessness.laws.law_after_cast` of them, cast first).

    Args:
        probs: ``[..., V]`` non-negative tensor, each row with positive mass.
        dtype: one of :data:`PROBABILITY_DTYPES`.

    Returns:
        ``[..., V]`` tensor of ``dtype`` whose rows sum (in float64) to 1 within
        :func:`row_sum_tolerance` ``(dtype, V)``.
    """
    check_dtype(dtype, "dtype", PROBABILITY_DTYPES)
    wide = probs.to(torch.float64)
    return (wide / wide.sum(dim=-1, keepdim=True)).to(dtype)


def effective_probabilities(probs: torch.Tensor) -> torch.Tensor:
    """The float64 law that rows of any dtype stand for: converted exactly to float64 and
    renormalised (what a verifier reading the cast rows should sample from).

    Args:
        probs: ``[..., V]`` non-negative float tensor, each row with positive mass.

    Returns:
        ``[..., V]`` float64 tensor, rows summing to 1 within 1e-12, zero exactly where
        ``probs`` is zero.
    """
    wide = probs.to(torch.float64)
    return wide / wide.sum(dim=-1, keepdim=True)


def probability_vectors(
    vocab_size: int | SearchStrategy[int],
    regime: str | None = None,
    dtype: torch.dtype = torch.float64,
) -> SearchStrategy[torch.Tensor]:
    """Probability vectors over ``vocab_size`` tokens (V from 1 up to 150k and beyond).

    Args:
        vocab_size: ``V``, an int ``>= 1`` or a strategy of such ints (drawn per example).
        regime: one of :data:`REGIMES` (see the module docstring), or None to draw one per
            example (``sparse`` and ``tiny-masses`` are left out when ``V == 1``). With
            ``V == 1`` every regime gives ``[1.0]``. Each draw reports ``event("regime=...")``
            and targets ``-log10`` of its smallest positive mass.
        dtype: one of :data:`PROBABILITY_DTYPES`; the vector is normalised in float64 and cast
            last (:func:`renormalise_then_cast`).

    Returns:
        A strategy of ``[V]`` CPU tensors of ``dtype``, non-negative, summing (in float64) to 1
        within :func:`row_sum_tolerance` ``(dtype, V)`` (1e-12 for float64).

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming ``vocab_size`` (not an int or
            strategy, or ``< 1``; ``< 2`` for ``sparse`` and ``tiny-masses``), ``regime`` (not
            in :data:`REGIMES`) or ``dtype`` (not in :data:`PROBABILITY_DTYPES`); at draw time,
            naming ``vocab_size`` when its strategy drew an invalid value.
    """
    check_choice(regime, "regime", REGIMES)
    minimum = 2 if regime in _REGIMES_NEEDING_TWO_TOKENS else 1
    check_vocab_size(vocab_size, minimum=minimum)
    check_dtype(dtype, "dtype", PROBABILITY_DTYPES)

    @st.composite
    def vectors(draw: st.DrawFn) -> torch.Tensor:
        size = draw_vocab_size(draw, vocab_size, minimum, f"regime={regime!r}")
        vector = torch.from_numpy(_draw_vector(draw, size, regime))
        return vector if dtype == torch.float64 else renormalise_then_cast(vector, dtype)

    return vectors()


def _far_pair(draw: st.DrawFn, size: int, regimes: tuple[str, ...]) -> tuple[Vector, Vector]:
    p = _draw_vector(draw, size, None, regimes)
    order = np.argsort(-p, kind="stable")
    cumulative = np.cumsum(p[order])
    # Smallest prefix of p's most likely tokens holding half the mass; the top V-1 tokens
    # always do, so the tail keeps at least one token.
    head_size = min(int(np.searchsorted(cumulative, _FAR_HEAD_MASS)) + 1, size - 1)
    head, tail = order[:head_size], order[head_size:]
    head_mass = draw(st.floats(0.0, FAR_MAX_DRAFT_HEAD_MASS))
    q = np.zeros(size)
    q[head] = head_mass * _dense(draw, head.size)
    q[tail] = (1.0 - head_mass) * _draw_vector(draw, tail.size, None, regimes)
    return p, _normalise(q)


def _disjoint_pair(draw: st.DrawFn, size: int, regimes: tuple[str, ...]) -> tuple[Vector, Vector]:
    order = random_order(draw, size)
    target_size = int_between(draw, 1, size - 1)
    draft_size = int_between(draw, 1, size - target_size)
    p = np.zeros(size)
    q = np.zeros(size)
    p[order[:target_size]] = _draw_vector(draw, target_size, None, regimes)
    q[order[target_size : target_size + draft_size]] = _draw_vector(draw, draft_size, None, regimes)
    return p, q


def _q_zero_pair(draw: st.DrawFn, size: int, regimes: tuple[str, ...]) -> tuple[Vector, Vector]:
    p = _draw_vector(draw, size, None, regimes)
    support = np.flatnonzero(p > 0)
    hole = int(support[int_between(draw, 0, support.size - 1)])
    others = random_order(draw, size)
    others = others[others != hole]
    extra_holes = others[: int_between(draw, 0, size - 2)]
    t = draw(st.floats(0.0, 1.0))
    q = (1.0 - t) * p + t * _draw_vector(draw, size, None, regimes)
    q[hole] = 0.0
    q[extra_holes] = 0.0
    if not q.sum() > 0.0:
        q = np.ones(size)
        q[hole] = 0.0
        q[extra_holes] = 0.0
    return p, _normalise(q)


def _temperature_pair(draw: st.DrawFn, size: int) -> tuple[Vector, Vector]:
    logits = draw_logits(draw, size)
    target_temperature = log_uniform(draw, *TEMPERATURE_RANGE)
    ratio = log_uniform(draw, *TEMPERATURE_RATIO_RANGE)
    hotter = draw(st.booleans())
    draft_temperature = target_temperature * ratio if hotter else target_temperature / ratio
    return _softmax(logits / target_temperature), _softmax(logits / draft_temperature)


def _adversarial_pair(
    draw: st.DrawFn, size: int, regimes: tuple[str, ...]
) -> tuple[Vector, Vector]:
    p = _draw_vector(draw, size, None, regimes)
    shuffled = random_order(draw, size)
    smallest_first = shuffled[np.argsort(p[shuffled], kind="stable")]
    support_size = int_between(draw, 1, size // 2)
    tilt = draw(st.floats(*ADVERSARIAL_TILT_RANGE))
    q = np.zeros(size)
    q[smallest_first[:support_size]] = np.exp(-tilt * np.arange(support_size, dtype=np.float64))
    return p, _normalise(q)


def _draw_pair(
    draw: st.DrawFn,
    size: int,
    relation: str | None,
    relations: tuple[str, ...] = RELATIONS,
    regimes: tuple[str, ...] = REGIMES,
) -> tuple[Vector, Vector]:
    """A ``(p, q)`` pair of ``[size]`` float64 numpy vectors in ``relation`` (drawn from
    ``relations``, less those needing two tokens when ``size == 1``, when None); their free
    vectors are drawn from ``regimes``."""
    if relation is None:
        relation = draw(st.sampled_from(_allowed(relations, size, _RELATIONS_NEEDING_TWO_TOKENS)))
    label(f"relation={relation}")
    if relation == "identical":
        p = _draw_vector(draw, size, None, regimes)
        p, q = p, p.copy()
    elif relation == "near":
        p = _draw_vector(draw, size, None, regimes)
        t = log_uniform(draw, *NEAR_MIX_RANGE)
        q = _normalise((1.0 - t) * p + t * _draw_vector(draw, size, None, regimes))
    elif relation == "far":
        p, q = _far_pair(draw, size, regimes)
    elif relation == "disjoint":
        p, q = _disjoint_pair(draw, size, regimes)
    elif relation == "q-zero-where-p-positive":
        p, q = _q_zero_pair(draw, size, regimes)
    elif relation == "p-zero-where-q-positive":
        q, p = _q_zero_pair(draw, size, regimes)
    elif relation == "temperature":
        p, q = _temperature_pair(draw, size)
    else:
        p, q = _adversarial_pair(draw, size, regimes)
    observe_hardness(TV_TARGET_LABEL, 0.5 * float(np.abs(p - q).sum()))
    _observe_smallest_mass(p)
    _observe_smallest_mass(q)
    return p, q


def target_draft_pairs(
    vocab_size: int | SearchStrategy[int],
    relation: str | None = None,
    dtype: torch.dtype = torch.float64,
) -> SearchStrategy[tuple[torch.Tensor, torch.Tensor]]:
    """Target/draft pairs ``(p, q)`` over ``vocab_size`` tokens in a named relation.

    Args:
        vocab_size: ``V``, an int ``>= 1`` or a strategy of such ints (drawn per example).
        relation: one of :data:`RELATIONS` (see the module docstring), or None to draw one per
            example (only ``identical``, ``near`` and ``temperature`` when ``V == 1``). p (and,
            where the relation leaves it free, q) is drawn from any of :data:`REGIMES`. Each
            draw reports ``event("relation=...")`` and targets ``TV(p, q)``.
        dtype: one of :data:`PROBABILITY_DTYPES`; both vectors are normalised in float64 and
            cast last. A relation is exact for the float64 vectors; a cast may blur it (float16
            flushes masses below about 3e-8 to zero).

    Returns:
        A strategy of ``(p, q)``, each a ``[V]`` CPU tensor of ``dtype``, non-negative, summing
        to 1 within :func:`row_sum_tolerance` ``(dtype, V)`` (1e-12 for float64).

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming ``vocab_size`` (not an int or
            strategy, or ``< 1``; ``< 2`` for ``far``, ``disjoint``, ``q-zero-where-p-positive``,
            ``p-zero-where-q-positive`` and ``adversarial``), ``relation`` (not in
            :data:`RELATIONS`) or ``dtype``; at draw time, naming ``vocab_size`` when its
            strategy drew an invalid value.
    """
    check_choice(relation, "relation", RELATIONS)
    minimum = 2 if relation in _RELATIONS_NEEDING_TWO_TOKENS else 1
    check_vocab_size(vocab_size, minimum=minimum)
    check_dtype(dtype, "dtype", PROBABILITY_DTYPES)

    @st.composite
    def pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
        size = draw_vocab_size(draw, vocab_size, minimum, f"relation={relation!r}")
        p, q = (torch.from_numpy(vector) for vector in _draw_pair(draw, size, relation))
        if dtype == torch.float64:
            return p, q
        return renormalise_then_cast(p, dtype), renormalise_then_cast(q, dtype)

    return pairs()
