"""Strategies for whole verifier inputs: chain cases (p, q) and greedy cases (logits, drafts).

Shapes follow the protocols (DESIGN.md section 3): ``B`` batch, ``k`` draft length, ``V``
vocabulary. Chain cases hold distributions only; the caller draws ``d_i ~ q_i`` itself with its
own seeded generator, because Hypothesis chooses cases and never supplies the random samples
(DESIGN.md section 5).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy
from numpy.typing import NDArray

from strategies.distributions import _draw_pair, _draw_vector, _random_order, _unit_floats

__all__ = [
    "GREEDY_DRAFT_MODES",
    "GREEDY_MAX_TIES",
    "GREEDY_TOP_LOGITS",
    "ChainCaseTensors",
    "GreedyCaseTensors",
    "chain_cases",
    "greedy_cases",
]

GREEDY_MAX_TIES = 3
"""Most tokens sharing the maximum logit in one row of a greedy case."""

GREEDY_TOP_LOGITS: tuple[float, ...] = (0.0, 2.5, -1.0, 30.0)
"""Values the maximum logit of a greedy row takes; the others lie at least 0.25 below it."""

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

_LOGIT_GRID = 0.25  # non-maximal logits lie on this grid, so they tie among themselves too


class ChainCaseTensors(NamedTuple):
    """Inputs of a chain verifier call, less the drafts (the caller draws ``d_i ~ q_i``).

    Attributes:
        target_probs: ``[B, k+1, V]`` float64, rows summing to 1 within 1e-12.
        draft_probs: ``[B, k, V]`` float64, rows summing to 1 within 1e-12.
    """

    target_probs: torch.Tensor
    draft_probs: torch.Tensor

    @property
    def batch_size(self) -> int:
        """``B``."""
        return int(self.target_probs.shape[0])

    @property
    def k(self) -> int:
        """Draft length ``k``."""
        return int(self.draft_probs.shape[1])

    @property
    def vocab_size(self) -> int:
        """``V``."""
        return int(self.target_probs.shape[2])


class GreedyCaseTensors(NamedTuple):
    """Inputs of a greedy verifier call.

    Attributes:
        target_logits: ``[B, k+1, V]`` float64; no NaN or ``+inf``; ``-inf`` allowed but never
            a whole row.
        draft_token_ids: ``[B, k]`` int64 in ``[0, V)``.
    """

    target_logits: torch.Tensor
    draft_token_ids: torch.Tensor

    @property
    def batch_size(self) -> int:
        """``B``."""
        return int(self.target_logits.shape[0])

    @property
    def k(self) -> int:
        """Draft length ``k``."""
        return int(self.draft_token_ids.shape[1])

    @property
    def vocab_size(self) -> int:
        """``V``."""
        return int(self.target_logits.shape[2])


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name}={value!r} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise InvalidArgument(f"{name}={value!r} must be at least {minimum}")
    return value


def chain_cases(
    max_vocab: int = 64, max_k: int = 4, max_batch: int = 3
) -> SearchStrategy[ChainCaseTensors]:
    """Chain verifier cases: ``B`` rows of ``p_0..p_k`` and ``q_0..q_{k-1}``.

    ``V`` is drawn in ``[1, max_vocab]``, ``k`` in ``[0, max_k]`` and ``B`` in
    ``[1, max_batch]``; each ``(p_i, q_i)`` for ``i < k`` is drawn by
    :func:`strategies.distributions.target_draft_pairs` (any relation, any regime) and the bonus
    row ``p_k`` by :func:`strategies.distributions.probability_vectors` (any regime), each row
    independently.

    Args:
        max_vocab: largest ``V``, an int ``>= 1``.
        max_k: largest draft length, an int ``>= 0``.
        max_batch: largest batch, an int ``>= 1``.

    Returns:
        A strategy of :class:`ChainCaseTensors`: ``target_probs [B, k+1, V]`` and
        ``draft_probs [B, k, V]``, float64 CPU tensors whose rows sum to 1 within 1e-12.

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming ``max_vocab``, ``max_k`` or
            ``max_batch`` when it is not an int or below its minimum.
    """
    max_vocab = _check_int(max_vocab, "max_vocab", 1)
    max_k = _check_int(max_k, "max_k", 0)
    max_batch = _check_int(max_batch, "max_batch", 1)

    @st.composite
    def cases(draw: st.DrawFn) -> ChainCaseTensors:
        vocab = draw(st.integers(1, max_vocab))
        k = draw(st.integers(0, max_k))
        batch = draw(st.integers(1, max_batch))
        target = np.zeros((batch, k + 1, vocab))
        draft = np.zeros((batch, k, vocab))
        for row in range(batch):
            for position in range(k):
                target[row, position], draft[row, position] = _draw_pair(draw, vocab, None)
            target[row, k] = _draw_vector(draw, vocab, None)
        event(f"chain k={k}")
        return ChainCaseTensors(torch.from_numpy(target), torch.from_numpy(draft))

    return cases()


def _greedy_row(draw: st.DrawFn, vocab: int) -> NDArray[np.float64]:
    """``[V]`` logits: 1..3 tied maxima, a grid of lower values, some ``-inf`` (never all)."""
    n_ties = draw(st.integers(1, min(GREEDY_MAX_TIES, vocab)))
    n_masked = draw(st.integers(0, vocab - n_ties))
    top = draw(st.sampled_from(GREEDY_TOP_LOGITS))
    gaps = _LOGIT_GRID * (1.0 + np.floor(-np.log(_unit_floats(draw, vocab)) * 4.0))
    logits = top - gaps
    order = _random_order(draw, vocab)
    logits[order[:n_ties]] = top
    logits[order[n_ties : n_ties + n_masked]] = -np.inf
    if n_ties > 1:
        event("greedy row with a tied maximum")
    if n_masked:
        event("greedy row with -inf logits")
    return logits


def _greedy_draft(draw: st.DrawFn, logits: NDArray[np.float64]) -> int:
    maxima = np.flatnonzero(logits == logits.max())
    mode = draw(st.sampled_from(GREEDY_DRAFT_MODES))
    if mode == "lowest-argmax":
        return int(maxima[0])
    if mode == "tied-argmax" and maxima.size > 1:
        return int(draw(st.sampled_from(maxima[1:].tolist())))
    return draw(st.integers(0, logits.size - 1))


def greedy_cases(
    max_vocab: int = 64, max_k: int = 4, max_batch: int = 8
) -> SearchStrategy[GreedyCaseTensors]:
    """Greedy verifier cases with exact ties at the maximum and masked (``-inf``) logits.

    ``V`` is drawn in ``[1, max_vocab]``, ``k`` in ``[0, max_k]``, ``B`` in ``[1, max_batch]``.
    Each row of logits has 1..:data:`GREEDY_MAX_TIES` tokens exactly tied at its maximum (one of
    :data:`GREEDY_TOP_LOGITS`), the rest on a 0.25 grid below it or ``-inf``; never a whole row
    ``-inf``. Each draft id is chosen by :data:`GREEDY_DRAFT_MODES`: usually the lowest argmax
    (so chains of accepts reach the bonus), sometimes a tied maximum that is not the lowest
    index, sometimes any token.

    Args:
        max_vocab: largest ``V``, an int ``>= 1``.
        max_k: largest draft length, an int ``>= 0``.
        max_batch: largest batch, an int ``>= 1``.

    Returns:
        A strategy of :class:`GreedyCaseTensors`: ``target_logits [B, k+1, V]`` float64 and
        ``draft_token_ids [B, k]`` int64 in ``[0, V)``, CPU tensors.

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming ``max_vocab``, ``max_k`` or
            ``max_batch`` when it is not an int or below its minimum.
    """
    max_vocab = _check_int(max_vocab, "max_vocab", 1)
    max_k = _check_int(max_k, "max_k", 0)
    max_batch = _check_int(max_batch, "max_batch", 1)

    @st.composite
    def cases(draw: st.DrawFn) -> GreedyCaseTensors:
        vocab = draw(st.integers(1, max_vocab))
        k = draw(st.integers(0, max_k))
        batch = draw(st.integers(1, max_batch))
        logits = np.zeros((batch, k + 1, vocab))
        drafts = np.zeros((batch, k), dtype=np.int64)
        for row in range(batch):
            for position in range(k + 1):
                logits[row, position] = _greedy_row(draw, vocab)
                if position < k:
                    drafts[row, position] = _greedy_draft(draw, logits[row, position])
        return GreedyCaseTensors(torch.from_numpy(logits), torch.from_numpy(drafts))

    return cases()
