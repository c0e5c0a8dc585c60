"""The exact law of the first L generated tokens, enumerated from a next-token law.

For any autoregressive sampler, ``P(x_1..x_L | prompt) = prod_t p(x_t | prompt, x_<t)``. Given
the target's processed next-token law (``next_token_probs``, docs/architecture.md, 'Protocols') the
law of the first L tokens is enumerated breadth-first over the sequences of positive probability
only, so a filtered law (top-k, top-p) over a large vocabulary stays small. It is what a
lossless speculative decoder's output must follow (Leviathan et al. 2022, Thm. 3.5, applied
step after step).

An unfiltered law over a real tokenizer's vocabulary (hundreds of tokens at temperature 1) has
V^L sequences of positive probability. With ``min_mass > 0`` a prefix (or a whole sequence)
of probability below ``min_mass`` is not expanded: every sequence through it falls in one
pooled *tail* cell, whose exact probability is the pruned mass. The cells are then a partition
of the sequences by a function of the sequence, so the law of the cells is still exact and an
identity test on them keeps its level; what it gives up is power against differences inside the
tail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from numpy.typing import NDArray

from losslessness.protocol import InvalidInputError, validate_probability_rows

__all__ = ["MAX_SEQUENCE_CELLS", "NextTokenLaw", "SequenceLaw", "exact_sequence_law"]

MAX_SEQUENCE_CELLS = 20_000
"""Default cap on the number of positive-probability sequences enumerated; beyond a few
thousand cells an identity test needs more samples than an audit can draw."""

NextTokenLaw = Callable[[list[int]], torch.Tensor]
"""``next_token_probs(prefix_ids) -> [V]`` float, the processed law after a whole prefix."""


@dataclass(frozen=True)
class SequenceLaw:
    """The law of the first ``new_tokens`` generated tokens.

    Attributes:
        sequences: the sequences of positive probability, each a tuple of ``new_tokens`` token
            ids, in lexicographic order.
        probs: ``[cells]`` float64, their probabilities (summing to 1 within float rounding).
        new_tokens: L.
        vocab_size: V.
        prompt_ids: the prompt the law is conditioned on.
        law_calls: how many times ``next_token_probs`` was called to enumerate it.
        tail_mass: the probability of the pooled tail cell (0.0 when nothing was pruned):
            every sequence of positive probability not in ``sequences``.
        supports: the support (``[V]`` bool) of the next-token law after each expanded prefix
            of length < L (generated tokens only), to tell a tail sequence from one of
            probability 0.
    """

    sequences: tuple[tuple[int, ...], ...]
    probs: NDArray[np.float64]
    new_tokens: int
    vocab_size: int
    prompt_ids: tuple[int, ...]
    law_calls: int
    tail_mass: float = 0.0
    supports: dict[tuple[int, ...], NDArray[np.bool_]] = field(default_factory=dict, repr=False)

    @property
    def n_cells(self) -> int:
        """Number of cells: the enumerated sequences, and the tail when there is one."""
        return len(self.sequences) + (1 if self.tail_mass > 0 else 0)

    @property
    def cell_probs(self) -> NDArray[np.float64]:
        """``[n_cells]`` float64: the enumerated sequences' probabilities, then the tail's."""
        if self.tail_mass > 0:
            return np.append(self.probs, self.tail_mass)
        return self.probs

    def index(self) -> dict[tuple[int, ...], int]:
        """Cell index of each enumerated sequence."""
        return {sequence: cell for cell, sequence in enumerate(self.sequences)}

    def cell_of(
        self, sequence: Sequence[int], index: dict[tuple[int, ...], int] | None = None
    ) -> int | None:
        """The cell of one generated sequence (L token ids in ``[0, V)``).

        Args:
            sequence: the L generated tokens.
            index: :meth:`index`, when the caller looks up many sequences.

        Returns:
            Its enumerated cell, the tail cell (``len(sequences)``) for a sequence of positive
            probability through a pruned prefix, or None for a sequence of probability 0.
        """
        key = tuple(int(token) for token in sequence)
        cells = self.index() if index is None else index
        if key in cells:
            return cells[key]
        if self.tail_mass <= 0:
            return None
        for position in range(len(key)):
            support = self.supports.get(key[:position])
            if support is None:
                return len(self.sequences)
            if not support[key[position]]:
                return None
        return len(self.sequences)


def _law_row(next_token_probs: NextTokenLaw, prefix: list[int], vocab_size: int) -> torch.Tensor:
    row = next_token_probs(list(prefix))
    if not isinstance(row, torch.Tensor) or tuple(row.shape) != (vocab_size,):
        shape = tuple(row.shape) if isinstance(row, torch.Tensor) else type(row).__name__
        raise InvalidInputError(
            "next_token_probs", f"expected a [{vocab_size}] tensor after {prefix}, got {shape}"
        )
    if not row.is_floating_point():
        raise InvalidInputError("next_token_probs", f"expected floats, got {row.dtype}")
    wide = row.detach().to("cpu", torch.float64)
    try:
        validate_probability_rows("next_token_probs", wide)
    except InvalidInputError as error:
        raise InvalidInputError(
            "next_token_probs", f"after prefix {prefix}: {error.problem}"
        ) from error
    return wide / wide.sum()


def exact_sequence_law(
    next_token_probs: NextTokenLaw,
    prompt_ids: Sequence[int],
    new_tokens: int,
    vocab_size: int,
    max_cells: int = MAX_SEQUENCE_CELLS,
    min_mass: float = 0.0,
) -> SequenceLaw:
    """Enumerate ``P(x_1..x_L | prompt)`` over every sequence of positive probability, the
    sequences and prefixes below ``min_mass`` pooled into one tail cell.

    Args:
        next_token_probs: the processed next-token law given the whole prefix (prompt and
            generated tokens): ``[V]`` float, rows summing to 1 within 1e-5.
        prompt_ids: the prompt.
        new_tokens: L >= 1.
        vocab_size: V >= 1.
        max_cells: cap on the number of enumerated sequences.
        min_mass: prefixes and sequences of probability below it go to the tail cell (module
            docstring); 0.0 enumerates every sequence of positive probability.

    Returns:
        :class:`SequenceLaw`; ``next_token_probs`` is called once per expanded prefix of
        length < L.

    Raises:
        ValueError: naming ``new_tokens``, ``vocab_size``, ``max_cells`` or ``min_mass`` when
            out of range, or ``new_tokens`` when the law has more than ``max_cells`` cells.
        InvalidInputError: naming ``next_token_probs`` when it returns a malformed row.
    """
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise ValueError(f"new_tokens: must be an int >= 1, got {new_tokens!r}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size: must be an int >= 1, got {vocab_size!r}")
    if isinstance(max_cells, bool) or not isinstance(max_cells, int) or max_cells < 1:
        raise ValueError(f"max_cells: must be an int >= 1, got {max_cells!r}")
    if not 0.0 <= min_mass < 1.0:
        raise ValueError(f"min_mass: must be in [0, 1), got {min_mass!r}")
    prompt = [int(token) for token in prompt_ids]
    prefixes: list[tuple[int, ...]] = [()]
    probs = np.ones(1)
    tail = 0.0
    supports: dict[tuple[int, ...], NDArray[np.bool_]] = {}
    calls = 0
    for step in range(new_tokens):
        rows = []
        for prefix in prefixes:
            row = _law_row(next_token_probs, prompt + list(prefix), vocab_size).numpy()
            calls += 1
            if min_mass > 0:
                supports[prefix] = row > 0
            rows.append(row)
        joint = probs[:, None] * np.stack(rows)
        kept = joint >= min_mass if min_mass > 0 else joint > 0
        tail += float(joint[~kept].sum())
        parent, token = np.nonzero(kept)
        if parent.size > max_cells:
            raise ValueError(
                f"new_tokens: the law of the first {step + 1} of {new_tokens} tokens already has "
                f"{parent.size} positive-probability sequences to enumerate (max_cells "
                f"{max_cells}); use fewer new tokens, a smaller vocabulary, a filtered "
                "(top-k/top-p) law or a larger min_mass"
            )
        prefixes = [(*prefixes[p], int(t)) for p, t in zip(parent, token, strict=True)]
        probs = joint[parent, token]
    total = float(probs.sum()) + tail
    return SequenceLaw(
        sequences=tuple(prefixes),
        probs=probs / total,
        new_tokens=new_tokens,
        vocab_size=vocab_size,
        prompt_ids=tuple(prompt),
        law_calls=calls,
        tail_mass=tail / total,
        supports=supports,
    )
