"""Strategies for whole verifier inputs: chain cases (p, q), greedy cases (logits, drafts) and
verify cases (p, q in a drawn dtype, with optional sampling parameters).

Shapes follow the protocols (docs/architecture.md, 'Protocols'): ``B`` batch, ``k`` draft length,
``V`` vocabulary. Chain and verify cases hold distributions only; the caller draws ``d_i ~ q_i``
itself with its own seeded generator, because Hypothesis chooses cases and never supplies the
random samples (docs/architecture.md, 'Statistical method').
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy
from numpy.typing import NDArray

from losslessness.cases import CaseShape, ChainCase, GreedyCase
from strategies._common import (
    batch_window,
    check_choices,
    check_float,
    check_int,
    int_between,
    label,
    quiet,
)
from strategies.distributions import (
    _RELATIONS_NEEDING_TWO_TOKENS,
    PROBABILITY_DTYPES,
    REGIMES,
    RELATIONS,
    _draw_pair,
    _draw_vector,
    effective_probabilities,
    renormalise_then_cast,
)
from strategies.logits import (
    DEFAULT_MAX_LOGIT_MAGNITUDE,
    MAX_LOGIT_MAGNITUDE,
    UNIT_SCALE_TOP_LOGITS,
    draw_logits,
)
from strategies.parameters import SamplingParameters, apply_sampling_parameters, sampling_parameters

__all__ = [
    "GREEDY_DRAFT_MODES",
    "GREEDY_MAX_TIES",
    "GREEDY_TOP_LOGITS",
    "VERIFY_DTYPES",
    "VerifyCase",
    "chain_cases",
    "greedy_cases",
    "verify_cases",
]

GREEDY_MAX_TIES = 3
"""Most tokens sharing the maximum logit in one row of a greedy case."""

GREEDY_TOP_LOGITS: tuple[float, ...] = UNIT_SCALE_TOP_LOGITS
"""Values the maximum logit of a ``unit``-scale greedy row takes (the ``large`` scale puts it
anywhere within the magnitude bound); see :mod:`strategies.logits`."""

GREEDY_DRAFT_MODES: tuple[str, ...] = (
    "lowest-argmax",
    "lowest-argmax",
    "lowest-argmax",
    "lowest-argmax",
    "lowest-argmax",
    "tied-argmax",
    "tied-argmax",
    "any-token",
)
"""How a greedy draft id is chosen, as a table drawn uniformly (so 5/8 of drafts are the lowest
argmax): ``lowest-argmax`` is what the reference accepts; ``tied-argmax`` is a maximum that is not
the lowest index (the reference rejects it; falls back to ``any-token`` without a tie);
``any-token`` is any id in ``[0, V)``, masked ones included."""

VERIFY_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
)
"""Default dtypes of :func:`verify_cases` (drawn uniformly; shrinks towards float32)."""


@dataclass(frozen=True)
class VerifyCase(CaseShape):
    """A chain verifier case in a drawn dtype, with the float64 law its cast rows stand for.

    Attributes:
        target_probs: ``[B, k+1, V]`` of :attr:`dtype`: rows built and normalised in float64
            (sampling parameters applied there), cast last; rows sum (in float64) to 1 within
            :func:`strategies.distributions.row_sum_tolerance` ``(dtype, V)``.
        draft_probs: ``[B, k, V]`` of :attr:`dtype`, likewise.
        target_probs64: ``[B, k+1, V]`` float64: ``target_probs`` converted back to float64
            and renormalised (rows within 1e-12), the law a verifier reading the cast rows
            should follow; zero exactly where the cast rows are.
        draft_probs64: ``[B, k, V]`` float64: likewise for ``draft_probs``; draw the drafts
            ``d_i`` from it.
        sampling: the :class:`~strategies.parameters.SamplingParameters` applied identically to
            the target's and the draft's logits (``log p``, ``log q``), or None.
    """

    target_probs: torch.Tensor
    draft_probs: torch.Tensor
    target_probs64: torch.Tensor
    draft_probs64: torch.Tensor
    sampling: SamplingParameters | None

    @property
    def target_shape(self) -> tuple[int, int, int]:
        """``(B, k+1, V)`` of :attr:`target_probs`."""
        batch, width, vocab = self.target_probs.shape
        return int(batch), int(width), int(vocab)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of :attr:`target_probs` and :attr:`draft_probs`."""
        return self.target_probs.dtype


def _check_sizes(
    max_vocab: object,
    max_k: object,
    max_batch: object,
    min_vocab: object,
    min_k: object,
    relations: tuple[str, ...],
) -> tuple[int, int, int, int, int]:
    vocab_high = check_int(max_vocab, "max_vocab", 1)
    k_high = check_int(max_k, "max_k", 0)
    batch_high = check_int(max_batch, "max_batch", 1)
    vocab_low = check_int(min_vocab, "min_vocab", 1, vocab_high)
    k_low = check_int(min_k, "min_k", 0, k_high)
    if vocab_low < 2 and k_high > 0 and set(relations) <= _RELATIONS_NEEDING_TWO_TOKENS:
        raise InvalidArgument(
            f"min_vocab={min_vocab!r} must be at least 2 when every relation in {relations} "
            "needs two tokens"
        )
    return vocab_high, k_high, batch_high, vocab_low, k_low


@st.composite
def _chain_row(
    draw: st.DrawFn,
    k: int,
    vocab: int,
    regimes: tuple[str, ...],
    relations: tuple[str, ...],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """One batch row: ``[k+1, V]`` target and ``[k, V]`` draft, float64.

    The bonus row ``p_k`` is drawn first and the pairs after it, each in its own span, so that
    lowering ``k`` drops the row's last choices instead of misaligning its bonus row.
    """
    target = np.zeros((k + 1, vocab))
    draft = np.zeros((k, vocab))
    target[k] = draw(_vector_span(vocab, regimes))
    for position in range(k):
        target[position], draft[position] = draw(_pair_span(vocab, relations, regimes))
    return target, draft


@st.composite
def _vector_span(draw: st.DrawFn, vocab: int, regimes: tuple[str, ...]) -> NDArray[np.float64]:
    return _draw_vector(draw, vocab, None, regimes)


@st.composite
def _pair_span(
    draw: st.DrawFn, vocab: int, relations: tuple[str, ...], regimes: tuple[str, ...]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    return _draw_pair(draw, vocab, None, relations, regimes)


def _draw_rows(
    draw: st.DrawFn,
    max_batch: int,
    k: int,
    vocab: int,
    regimes: tuple[str, ...],
    relations: tuple[str, ...],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``[B, k+1, V]`` and ``[B, k, V]`` float64 rows, ``B`` in ``[1, max_batch]``, through
    :func:`strategies._common.batch_window` (so ``B`` shrinks to 1 whichever row matters)."""
    batch, start = batch_window(draw, max_batch)
    rows = []
    for index in range(start + batch):
        with quiet(index < start):
            rows.append(draw(_chain_row(k, vocab, regimes, relations)))
    rows = rows[start:]
    target = np.stack([row[0] for row in rows])
    draft = np.stack([row[1] for row in rows])
    return target, draft


def chain_cases(
    max_vocab: int = 64,
    max_k: int = 4,
    max_batch: int = 3,
    *,
    min_vocab: int = 1,
    min_k: int = 0,
    regimes: Sequence[str] | None = None,
    relations: Sequence[str] | None = None,
) -> SearchStrategy[ChainCase]:
    """Chain verifier cases: ``B`` rows of ``p_0..p_k`` and ``q_0..q_{k-1}``, float64.

    ``V`` is drawn in ``[min_vocab, max_vocab]``, ``k`` in ``[min_k, max_k]`` and ``B`` in
    ``[1, max_batch]`` (each shrinks to its minimum); each ``(p_i, q_i)`` for ``i < k`` is
    drawn in one of ``relations`` (:func:`strategies.distributions.target_draft_pairs`) and the
    bonus row ``p_k`` in one of ``regimes``
    (:func:`strategies.distributions.probability_vectors`), every row independently. Every
    vector reports ``event("regime=...")``, every pair ``event("relation=...")`` and the case
    reports ``event("chain k=...")``; ``target()`` sees the largest ``TV(p_i, q_i)`` and the
    largest ``-log10`` smallest positive mass of the case.

    Args:
        max_vocab: largest ``V``, an int ``>= 1``.
        max_k: largest draft length, an int ``>= 0``.
        max_batch: largest batch, an int ``>= 1``.
        min_vocab: smallest ``V``, an int in ``[1, max_vocab]`` (at least 2 when every relation
            needs two tokens and ``max_k > 0``).
        min_k: smallest draft length, an int in ``[0, max_k]``.
        regimes: names from :data:`strategies.distributions.REGIMES` the vectors are drawn
            from, or None for all of them.
        relations: names from :data:`strategies.distributions.RELATIONS` the pairs are drawn
            from, or None for all of them (those needing two tokens are left out at ``V == 1``).

    Returns:
        A strategy of :class:`ChainCase`: ``target_probs [B, k+1, V]`` and
        ``draft_probs [B, k, V]``, float64 CPU tensors whose rows are non-negative, have
        positive mass and sum to 1 within 1e-12.

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming ``max_vocab``, ``max_k``,
            ``max_batch``, ``min_vocab``, ``min_k``, ``regimes`` or ``relations`` when it is of
            the wrong type or out of range.
    """
    chosen_regimes = check_choices(regimes, "regimes", REGIMES) or REGIMES
    chosen_relations = check_choices(relations, "relations", RELATIONS) or RELATIONS
    vocab_high, k_high, batch_high, vocab_low, k_low = _check_sizes(
        max_vocab, max_k, max_batch, min_vocab, min_k, chosen_relations
    )

    @st.composite
    def cases(draw: st.DrawFn) -> ChainCase:
        vocab = draw(st.integers(vocab_low, vocab_high))
        k = draw(st.integers(k_low, k_high))
        target, draft = _draw_rows(draw, batch_high, k, vocab, chosen_regimes, chosen_relations)
        label(f"chain k={k}")
        summary = f"V={vocab} k={k} B={target.shape[0]}"
        return ChainCase("hypothesis", summary, torch.from_numpy(target), torch.from_numpy(draft))

    return cases()


def _greedy_draft(draw: st.DrawFn, logits: NDArray[np.float64]) -> int:
    maxima = np.flatnonzero(logits == logits.max())
    mode = draw(st.sampled_from(GREEDY_DRAFT_MODES))
    if mode == "lowest-argmax":
        return int(maxima[0])
    if mode == "tied-argmax" and maxima.size > 1:
        return int(maxima[1 + int_between(draw, 0, maxima.size - 2)])
    return int_between(draw, 0, logits.size - 1)


@st.composite
def _greedy_logits_span(draw: st.DrawFn, vocab: int, magnitude: float) -> NDArray[np.float64]:
    return draw_logits(draw, vocab, max_magnitude=magnitude, max_ties=GREEDY_MAX_TIES)


@st.composite
def _greedy_row(
    draw: st.DrawFn, k: int, vocab: int, magnitude: float
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """One batch row: ``[k+1, V]`` logits and ``[k]`` drafts; the bonus row first (as in
    :func:`_chain_row`), then each position's logits and draft."""
    logits = np.zeros((k + 1, vocab))
    drafts = np.zeros(k, dtype=np.int64)
    logits[k] = draw(_greedy_logits_span(vocab, magnitude))
    for position in range(k):
        logits[position] = draw(_greedy_logits_span(vocab, magnitude))
        drafts[position] = _greedy_draft(draw, logits[position])
    return logits, drafts


def greedy_cases(
    max_vocab: int = 64,
    max_k: int = 4,
    max_batch: int = 8,
    *,
    min_vocab: int = 1,
    min_k: int = 0,
    max_logit_magnitude: float = DEFAULT_MAX_LOGIT_MAGNITUDE,
) -> SearchStrategy[GreedyCase]:
    """Greedy verifier cases with exact ties at the maximum, masked (``-inf``) and large logits.

    ``V`` is drawn in ``[min_vocab, max_vocab]``, ``k`` in ``[min_k, max_k]``, ``B`` in
    ``[1, max_batch]``. Each row of logits is drawn as by
    :func:`strategies.logits.logits_vectors` (``unit`` or ``large`` scale): 1..
    :data:`GREEDY_MAX_TIES` tokens exactly tied at its maximum, the rest on a 0.25 grid below
    it (magnitudes up to ``max_logit_magnitude``) or ``-inf``; never a whole row ``-inf``;
    every finite value exact in float32. Each draft id is chosen by
    :data:`GREEDY_DRAFT_MODES`: usually the lowest argmax (so chains of accepts reach the
    bonus), sometimes a tied maximum that is not the lowest index, sometimes any token.

    Args:
        max_vocab: largest ``V``, an int ``>= 1``.
        max_k: largest draft length, an int ``>= 0``.
        max_batch: largest batch, an int ``>= 1``.
        min_vocab: smallest ``V``, an int in ``[1, max_vocab]``.
        min_k: smallest draft length, an int in ``[0, max_k]``.
        max_logit_magnitude: bound on ``|logit|`` of finite logits, in ``[1, 2**22]``.

    Returns:
        A strategy of :class:`GreedyCase`: ``target_logits [B, k+1, V]`` float64 and
        ``draft_token_ids [B, k]`` int64 in ``[0, V)``, CPU tensors.

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming ``max_vocab``, ``max_k``,
            ``max_batch``, ``min_vocab``, ``min_k`` or ``max_logit_magnitude`` when it is not
            of the right type or out of range.
    """
    vocab_high, k_high, batch_high, vocab_low, k_low = _check_sizes(
        max_vocab, max_k, max_batch, min_vocab, min_k, RELATIONS
    )
    magnitude = check_float(max_logit_magnitude, "max_logit_magnitude", 1.0, MAX_LOGIT_MAGNITUDE)

    @st.composite
    def cases(draw: st.DrawFn) -> GreedyCase:
        vocab = draw(st.integers(vocab_low, vocab_high))
        k = draw(st.integers(k_low, k_high))
        batch, start = batch_window(draw, batch_high)
        rows = []
        for index in range(start + batch):
            with quiet(index < start):
                rows.append(draw(_greedy_row(k, vocab, magnitude)))
        rows = rows[start:]
        logits = np.stack([row[0] for row in rows])
        drafts = np.stack([row[1] for row in rows])
        summary = f"V={vocab} k={k} B={logits.shape[0]}"
        return GreedyCase(
            "hypothesis", summary, torch.from_numpy(logits), torch.from_numpy(drafts)
        )

    return cases()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def verify_cases(
    max_vocab: int = 64,
    max_k: int = 8,
    max_batch: int = 3,
    dtypes: Sequence[torch.dtype] = VERIFY_DTYPES,
    *,
    min_vocab: int = 1,
    min_k: int = 0,
    regimes: Sequence[str] | None = None,
    relations: Sequence[str] | None = None,
    sampling: SearchStrategy[SamplingParameters | None] | None = None,
) -> SearchStrategy[VerifyCase]:
    """Whole chain verify cases: sizes, a dtype, per-position p and q, optional sampling.

    ``V``, ``k`` and ``B`` are drawn as in :func:`chain_cases` (``k`` up to 8 by default), the
    rows likewise in float64. Then, when the drawn sampling parameters are not None, every row
    ``r`` of p and q becomes ``apply_sampling_parameters(log r, params)`` (the same parameters
    for target and draft, as an engine applies its user's settings to both models). Finally
    the rows are renormalised in float64 and cast to the drawn dtype
    (:func:`strategies.distributions.renormalise_then_cast`), and their float64 meaning is kept
    in ``target_probs64`` / ``draft_probs64``. Reports ``event("dtype=...")`` and
    ``event("sampling=none")`` or ``event("sampling=on")`` besides the regime and relation
    events of the rows.

    Args:
        max_vocab: largest ``V``, an int ``>= 1``.
        max_k: largest draft length, an int ``>= 0`` (8 by default).
        max_batch: largest batch, an int ``>= 1``.
        dtypes: non-empty sequence of dtypes from
            :data:`strategies.distributions.PROBABILITY_DTYPES`, drawn uniformly (shrinking
            towards the first).
        min_vocab: smallest ``V``, an int in ``[1, max_vocab]``.
        min_k: smallest draft length, an int in ``[0, max_k]``.
        regimes: as in :func:`chain_cases`.
        relations: as in :func:`chain_cases`.
        sampling: strategy of ``SamplingParameters | None``; None means ``st.none() |``
            :func:`strategies.parameters.sampling_parameters` (parameters half the time).

    Returns:
        A strategy of :class:`VerifyCase`.

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming the first invalid argument.
    """
    chosen_regimes = check_choices(regimes, "regimes", REGIMES) or REGIMES
    chosen_relations = check_choices(relations, "relations", RELATIONS) or RELATIONS
    vocab_high, k_high, batch_high, vocab_low, k_low = _check_sizes(
        max_vocab, max_k, max_batch, min_vocab, min_k, chosen_relations
    )
    if (
        isinstance(dtypes, str | torch.dtype)
        or not isinstance(dtypes, Sequence)
        or not dtypes
        or any(dtype not in PROBABILITY_DTYPES for dtype in dtypes)
    ):
        raise InvalidArgument(
            f"dtypes={dtypes!r} must be a non-empty sequence of dtypes from {PROBABILITY_DTYPES}"
        )
    chosen_dtypes = tuple(dtypes)
    if sampling is not None and not isinstance(sampling, SearchStrategy):
        raise InvalidArgument(f"sampling={sampling!r} must be None or a strategy")
    sampling_strategy: SearchStrategy[SamplingParameters | None] = (
        sampling if sampling is not None else st.none() | sampling_parameters()
    )

    @st.composite
    def cases(draw: st.DrawFn) -> VerifyCase:
        vocab = draw(st.integers(vocab_low, vocab_high))
        k = draw(st.integers(k_low, k_high))
        dtype = draw(st.sampled_from(chosen_dtypes))
        label(f"dtype={_dtype_name(dtype)}")
        target_rows, draft_rows = _draw_rows(
            draw, batch_high, k, vocab, chosen_regimes, chosen_relations
        )
        params = draw(sampling_strategy)
        label("sampling=none" if params is None else "sampling=on")
        target = torch.from_numpy(target_rows)
        draft = torch.from_numpy(draft_rows)
        if params is not None:
            target = apply_sampling_parameters(torch.log(target), params)
            draft = apply_sampling_parameters(torch.log(draft), params)
        target_cast = renormalise_then_cast(target, dtype)
        draft_cast = renormalise_then_cast(draft, dtype)
        return VerifyCase(
            target_probs=target_cast,
            draft_probs=draft_cast,
            target_probs64=effective_probabilities(target_cast),
            draft_probs64=effective_probabilities(draft_cast),
            sampling=params,
        )

    return cases()
