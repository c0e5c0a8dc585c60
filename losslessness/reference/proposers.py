"""Drafters for the reference spec-decode loop: a draft model, and n-gram prompt lookup.

A proposer returns up to k draft tokens and the law q_i each was drawn from. The chain
verifier is lossless only when ``d_i ~ q_i`` really holds (docs/architecture.md, 'Protocols'), so a
deterministic proposer (n-gram lookup, a greedy draft model) reports one-hot rows: the law of
a token chosen with certainty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from losslessness.reference.greedy import argmax_lowest_index
from losslessness.reference.processing import SamplingParameters
from losslessness.reference.sampling import sample_inverse_cdf

__all__ = [
    "DraftModelProposer",
    "LanguageModel",
    "NgramProposer",
    "Proposal",
    "Proposer",
    "one_hot_rows",
]


@runtime_checkable
class LanguageModel(Protocol):
    """A model the loop can query: ``next_token_probs(prefix_ids, sampling)`` is the processed
    next-token law ``[V]`` float64 after the whole prefix, with ``sampling`` (None: temperature
    1, no filters) applied as :mod:`losslessness.reference.processing` documents.
    :class:`losslessness.reference.toy.MarkovLM` is one."""

    vocab_size: int

    def next_token_probs(
        self, prefix_ids: Sequence[int], sampling: SamplingParameters | None = None
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class Proposal:
    """Draft tokens and their laws.

    Attributes:
        token_ids: ``k'`` draft token ids (``k' <= k``; 0 when the proposer has nothing).
        probs: ``[k', V]`` float64; row i is q_i, the law ``token_ids[i]`` was drawn from.
    """

    token_ids: list[int]
    probs: torch.Tensor


class Proposer(Protocol):
    """Proposes up to ``k`` drafts after ``context``; randomness only from ``generator``."""

    vocab_size: int

    def propose(self, context: Sequence[int], k: int, generator: torch.Generator) -> Proposal:
        """Return at most ``k`` drafts and their laws (see :class:`Proposal`)."""
        ...


def one_hot_rows(token_ids: Sequence[int], vocab_size: int) -> torch.Tensor:
    """``[len(token_ids), V]`` float64 rows, row i one-hot at ``token_ids[i]``."""
    rows = torch.zeros((len(token_ids), vocab_size), dtype=torch.float64)
    if token_ids:
        rows[torch.arange(len(token_ids)), torch.tensor(list(token_ids))] = 1.0
    return rows


class DraftModelProposer:
    """Draft tokens sampled autoregressively from a draft model.

    Args:
        model: the draft model.
        sampling: sampling parameters, the same the target uses (the loop's contract).
        greedy: take the argmax of each q_i instead of sampling (q reported one-hot).

    Draft i is drawn from ``q_i = model.next_token_probs(context + d_<i, sampling)`` by
    inverting its CDF at a float64 uniform from the generator.
    """

    def __init__(
        self, model: LanguageModel, sampling: SamplingParameters | None = None, greedy: bool = False
    ) -> None:
        self.model = model
        self.sampling = sampling
        self.greedy = greedy
        self.vocab_size = model.vocab_size

    def draft_law(self, context: Sequence[int]) -> torch.Tensor:
        """q after ``context``: ``[V]`` float64."""
        return self.model.next_token_probs(context, self.sampling)

    def propose(self, context: Sequence[int], k: int, generator: torch.Generator) -> Proposal:
        """``k`` drafts d_i ~ q_i (or argmax q_i when greedy) and their laws ``[k, V]``."""
        extended = list(context)
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for _ in range(k):
            law = self.draft_law(extended)
            token = self.choose(law, generator)
            tokens.append(token)
            rows.append(one_hot_rows([token], self.vocab_size)[0] if self.greedy else law)
            extended.append(token)
        probs = (
            torch.stack(rows) if rows else torch.zeros((0, self.vocab_size), dtype=torch.float64)
        )
        return Proposal(tokens, probs)

    def choose(self, law: torch.Tensor, generator: torch.Generator) -> int:
        """One draft token from ``law`` ``[V]``: its argmax (lowest index on ties) when
        greedy, else an inverse-CDF draw at one float64 uniform from ``generator``."""
        if self.greedy:
            return int(argmax_lowest_index(law))
        uniform = torch.rand((1,), generator=generator, dtype=torch.float64)
        return int(sample_inverse_cdf(law, uniform)[0])


class NgramProposer:
    """Prompt lookup: copy what followed an earlier occurrence of the context's final n-gram.

    For n from ``max_ngram`` down to ``min_ngram``, find the earliest position where the last
    n tokens of the context occurred before, and propose the (up to k) tokens that followed
    it; no match proposes nothing. Deterministic, so q is one-hot. (The earliest match, as
    transformers takes it, has the longest continuation: in periodic text the most recent one
    is cut short by the end of the context.)

    Source: prompt-lookup decoding (https://github.com/apoorvumang/prompt-lookup-decoding), as
    in transformers' ``PromptLookupCandidateGenerator`` (``max_matching_ngram_size``; it takes
    the earliest match) and vLLM's ``vllm/v1/spec_decode/ngram_proposer.py``
    (``prompt_lookup_min``/``prompt_lookup_max``). Which match is taken changes the drafts,
    never the law of the output.

    Args:
        vocab_size: V.
        max_ngram: longest n-gram matched, ``>= min_ngram``.
        min_ngram: shortest n-gram matched, ``>= 1``.

    Raises:
        ValueError: naming the argument out of range.
    """

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError(
                f"max_ngram, min_ngram: need 1 <= min_ngram <= max_ngram, got "
                f"min_ngram={min_ngram}, max_ngram={max_ngram}"
            )
        if vocab_size < 1:
            raise ValueError(f"vocab_size: must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def lookup(self, context: Sequence[int], k: int) -> list[int]:
        """The up to ``k`` tokens that followed the earliest earlier occurrence of the
        longest matching final n-gram of ``context`` (empty when none matches)."""
        tokens = list(context)
        length = len(tokens)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            suffix = tokens[length - n :]
            for start in range(length - n):
                if tokens[start : start + n] == suffix:
                    return tokens[start + n : start + n + k]
        return []

    def propose(self, context: Sequence[int], k: int, generator: torch.Generator) -> Proposal:
        """The looked-up drafts with one-hot q (``generator`` is not used)."""
        del generator
        tokens = self.lookup(context, k)
        return Proposal(tokens, one_hot_rows(tokens, self.vocab_size))
