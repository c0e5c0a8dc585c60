"""Toy language models with exact laws: Markov chains over a small vocabulary.

A :class:`MarkovLM` conditions its next-token logits on the last ``order`` tokens (0, 1 or 2)
of the prefix, read from an explicit table. Positions before the start of the prefix count
as a start symbol (id ``V``, never emitted), so every prefix, the empty one included, has a
law. Because the table is explicit, the law of anything the model generates is known exactly:
the spec-decode loop (:mod:`losslessness.reference.decoding`) run on two of them can be
tested against the exact law of its first L tokens
(:func:`losslessness.reference.sequences.exact_sequence_law`).

Knobs (all seeded, float64):

- ``sharpness``: the standard deviation of the Gaussian logits; large values make a nearly
  deterministic ("repetitive") model, small ones a nearly uniform ("random text") one;
- sampling parameters (temperature, top-k, top-p, min-p) are applied on top by
  :meth:`MarkovLM.next_token_probs`, in the order of
  :mod:`losslessness.reference.processing`;
- :meth:`MarkovLM.perturbed` builds a draft model close to a target: the same table plus
  Gaussian noise, so the acceptance rate sum min(p, q) is high but below 1.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

from losslessness.reference.processing import SamplingParameters, apply_sampling_parameters

__all__ = ["MAX_ORDER", "MarkovLM"]

MAX_ORDER = 2
"""Longest context a toy model conditions on (the table has ``(V+1)**order`` rows)."""


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name}: must be {bound}, got {value}")
    return value


def _check_nonnegative(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: must be a real number, got {type(value).__name__}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}: must be finite and >= 0, got {value!r}")
    return float(value)


class MarkovLM:
    """A language model whose next-token logits depend on the last ``order`` tokens only.

    Args:
        logits: ``[(V+1)**order, V]`` float table of next-token logits, one row per context
            state (see :meth:`state`); converted to float64. Finite, or ``-inf`` to forbid a
            token (at least one finite entry per row).
        order: context length, 0 (a unigram model), 1 or 2.

    Attributes:
        vocab_size: ``V``, the number of token ids (``0..V-1``).
        order: the context length.
        logits: the ``[(V+1)**order, V]`` float64 table.

    Raises:
        ValueError: naming ``order`` or ``logits`` (wrong rank or row count, NaN, ``+inf``, a
            row of all ``-inf``).
    """

    def __init__(self, logits: torch.Tensor, order: int) -> None:
        self.order = _check_int("order", order, 0, MAX_ORDER)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[1] < 1:
            raise ValueError("logits: expected a [(V+1)**order, V] tensor with V >= 1")
        table = logits.to(torch.float64)
        vocab = int(table.shape[1])
        if table.shape[0] != (vocab + 1) ** self.order:
            raise ValueError(
                f"logits: expected {(vocab + 1) ** self.order} rows ((V+1)**order for V={vocab}, "
                f"order={self.order}), got {table.shape[0]}"
            )
        if bool(torch.isnan(table).any()) or bool((table == math.inf).any()):
            raise ValueError("logits: contains NaN or +inf")
        if bool((table == -math.inf).all(dim=1).any()):
            raise ValueError("logits: a row has every logit -inf (no next token possible)")
        self.vocab_size = vocab
        self.logits = table

    @classmethod
    def random(
        cls, vocab_size: int, order: int = 1, sharpness: float = 2.0, seed: int = 0
    ) -> MarkovLM:
        """A model with i.i.d. Gaussian logits of standard deviation ``sharpness``.

        Args:
            vocab_size: ``V >= 2``.
            order: context length 0, 1 or 2.
            sharpness: logit scale ``>= 0``; 0 gives the uniform model.
            seed: seeds the table (``torch.Generator.manual_seed``).

        Raises:
            ValueError: naming the argument out of range.
        """
        vocab = _check_int("vocab_size", vocab_size, 2)
        scale = _check_nonnegative("sharpness", sharpness)
        _check_int("order", order, 0, MAX_ORDER)
        generator = torch.Generator().manual_seed(seed)
        table = torch.randn(((vocab + 1) ** order, vocab), generator=generator, dtype=torch.float64)
        return cls(table * scale, order)

    def perturbed(self, noise: float, seed: int) -> MarkovLM:
        """A draft model near this one: the same table plus Gaussian noise of std ``noise``.

        Raises:
            ValueError: naming ``noise`` when negative or not finite.
        """
        scale = _check_nonnegative("noise", noise)
        generator = torch.Generator().manual_seed(seed)
        noise_table = torch.randn(self.logits.shape, generator=generator, dtype=torch.float64)
        return MarkovLM(self.logits + scale * noise_table, self.order)

    def state(self, prefix_ids: Sequence[int]) -> int:
        """Row of the table that ``prefix_ids`` selects: its last ``order`` tokens in base
        ``V+1``, positions before the start counting as the start symbol ``V``.

        Raises:
            ValueError: naming ``prefix_ids`` for a token id outside ``[0, V)`` among the last
                ``order`` tokens (the only ones read).
        """
        vocab = self.vocab_size
        context = list(prefix_ids[len(prefix_ids) - self.order :]) if self.order else []
        for token in context:
            if not 0 <= token < vocab:
                raise ValueError(f"prefix_ids: token id {token} out of range [0, {vocab})")
        index = 0
        for token in [vocab] * (self.order - len(context)) + context:
            index = index * (vocab + 1) + int(token)
        return index

    def next_token_logits(self, prefix_ids: Sequence[int]) -> torch.Tensor:
        """The raw next-token logits after ``prefix_ids``: ``[V]`` float64 (a view; do not
        modify)."""
        return self.logits[self.state(prefix_ids)]

    def next_token_probs(
        self, prefix_ids: Sequence[int], sampling: SamplingParameters | None = None
    ) -> torch.Tensor:
        """The processed next-token law after ``prefix_ids``: ``[V]`` float64 summing to 1.

        ``sampling`` (default: temperature 1, no filters) is applied as
        :func:`losslessness.reference.processing.apply_sampling_parameters` documents.
        """
        return self.processed_table(sampling or SamplingParameters())[self.state(prefix_ids)]

    def processed_table(self, sampling: SamplingParameters) -> torch.Tensor:
        """The processed law of every context state: ``[(V+1)**order, V]`` float64 (cached
        per sampling parameters; do not modify)."""
        return _processed(self, sampling)

    def __repr__(self) -> str:
        return f"MarkovLM(vocab_size={self.vocab_size}, order={self.order})"


@functools.lru_cache(maxsize=64)
def _processed(model: MarkovLM, sampling: SamplingParameters) -> torch.Tensor:
    # Keyed on the model's identity: a MarkovLM's table is never modified after construction.
    return apply_sampling_parameters(model.logits, sampling)
