"""The serving battery (issue 21): what a serving verifier is audited on by default.

Every case is a batch as a serving engine builds it (:class:`~losslessness.cases.ServingCase`):
greedy rows beside sampled rows at several temperatures; top-k, top-p and min-p alone and
combined; logit bias; frequency, presence and repetition penalties with output histories;
``min_tokens`` with its boundary before, inside and right after the draft block; seeded beside
unseeded rows; a different number of drafts per request (0..k) in one batch; calls with and
without draft probabilities; B = 1 and larger batches, repeated and all-distinct rows; float32
and bfloat16 logits; and two cases at real vocabularies (32k and 152k tokens), whose laws the
checks pool into the cells with enough expected mass (their results state the TV they reach).

Logits and draft laws are drawn from :data:`SERVING_BATTERY_SEED`, so every case and its hash
are the same on every machine. The rows whose law reads the history (penalties,
``min_tokens``) draft from q with a support of a few tokens, so that the prefixes their law
checks group by stay few.
"""

from __future__ import annotations

import functools

import torch

from losslessness.batteries.builders import softmax
from losslessness.cases import ServingCase, ServingRow
from losslessness.requests import Request

__all__ = [
    "SERVING_BATTERY_SEED",
    "SERVING_CI_MAX_STEPS",
    "ServingDraws",
    "default_serving_battery",
]

SERVING_BATTERY_SEED = 20_211
"""Seed of every serving case's logits and draft laws."""

SERVING_CI_MAX_STEPS = 2000
"""Rows per kind of a serving case at most in the CI plan: a serving target is called row by
row through its engine's processors, and positions reached rarely would otherwise size whole
cases; the results of positions below the design state the TV they reach. The vocabulary cases
cap lower (200 rows at 32k, 100 at 152k: an engine profile's law costs 10-200 ms per position
there), so their law tests detect only large TV (about 0.3-1, as their results state); what
they catch for certain is the exact part, a token outside the kept set (top-k, top-p) or an
emitted greedy token that is not the argmax at the real vocabulary size."""

_K = 3
_V = 16


class ServingDraws:
    """Deterministic logits and draft laws of serving rows (the battery's, and a case file's
    from its own seed), each draw advancing one seeded generator.

    Args:
        seed: the generator's seed (the battery's: :data:`SERVING_BATTERY_SEED`).
    """

    def __init__(self, seed: int = SERVING_BATTERY_SEED) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def logits(self, vocab: int = _V, k: int = _K, scale: float = 1.5) -> torch.Tensor:
        """``[k+1, V]`` float64 Gaussian logits times ``scale``."""
        return torch.randn(k + 1, vocab, generator=self.generator, dtype=torch.float64) * scale

    def draft(self, logits: torch.Tensor, support: int | None = None) -> torch.Tensor:
        """``[k, V]`` float64: a draft law near the target's softmax (noisy logits), on the
        ``support`` largest tokens of each row when given."""
        noisy = logits[:-1] + torch.randn(
            logits[:-1].shape, generator=self.generator, dtype=torch.float64
        )
        if support is not None:
            cut = torch.topk(noisy, support, dim=-1).values[:, -1:]
            noisy = noisy.masked_fill(noisy < cut, float("-inf"))
        return torch.from_numpy(softmax(noisy.numpy()))

    def row(self, label: str, request: Request, drafts: int = _K, support: int | None = None,
            vocab: int = _V, k: int = _K, scale: float = 1.5) -> ServingRow:
        """A row with draft probabilities."""
        logits = self.logits(vocab, k, scale)
        return ServingRow(label, logits, request, drafts, self.draft(logits, support))

    def fixed_row(self, label: str, request: Request, drafts: int, vocab: int = _V, k: int = _K,
                  scale: float = 1.5) -> ServingRow:
        """A row without draft probabilities: its drafts are the target's top tokens at each
        position (what a good n-gram or greedy EAGLE drafter proposes), shifted by one at every
        other position so that some are rejected."""
        logits = self.logits(vocab, k, scale)
        tokens = [int(torch.argsort(logits[i], descending=True)[i % 2]) for i in range(drafts)]
        return ServingRow(label, logits, request, drafts, None, tuple(tokens))


def _cases() -> list[ServingCase]:
    d = ServingDraws()
    cases = [
        ServingCase(
            "serving-b1",
            "B = 1: one sampled request (T 0.8, top-k 6)",
            (d.row("T 0.8 top-k 6", Request(temperature=0.8, top_k=6)),),
        ),
        ServingCase(
            "serving-temperatures",
            "greedy beside T 0.5, 1 and 1.5, each row twice (B = 8)",
            (
                d.row("greedy", Request(temperature=0.0)),
                d.row("T 0.5", Request(temperature=0.5)),
                d.row("T 1", Request()),
                d.row("T 1.5", Request(temperature=1.5)),
            ),
            copies=2,
        ),
        ServingCase(
            "serving-filters",
            "top-k, top-p, min-p alone and combined, logit bias (distinct rows)",
            (
                d.row("top-k 4", Request(top_k=4)),
                d.row("top-p 0.7", Request(top_p=0.7)),
                d.row("min-p 0.15", Request(min_p=0.15)),
                d.row("top-k 5 + top-p 0.6", Request(top_k=5, top_p=0.6)),
                d.row("T 0.7 top-k 6 top-p 0.8 min-p 0.1",
                      Request(temperature=0.7, top_k=6, top_p=0.8, min_p=0.1)),
                d.row("logit bias", Request(logit_bias=((1, 3.0), (2, -100.0), (5, 1.5)))),
                d.row("logit bias + min-p 0.1", Request(logit_bias=((3, 2.5),), min_p=0.1)),
            ),
        ),
        ServingCase(
            "serving-penalties",
            "frequency, presence and repetition penalties with output histories",
            (
                d.row("frequency 1.2", Request(frequency_penalty=1.2,
                                               output_token_ids=(0, 1, 1, 4)), support=3),
                d.row("presence 1.5", Request(presence_penalty=1.5, output_token_ids=(2, 7)),
                      support=3),
                d.row("repetition 1.8", Request(repetition_penalty=1.8, prompt_token_ids=(3, 5),
                                                output_token_ids=(6,)), support=3),
                d.row("frequency 0.8 + presence 0.5 + top-k 8",
                      Request(frequency_penalty=0.8, presence_penalty=0.5, top_k=8,
                              output_token_ids=(9,)), support=3),
            ),
        ),
        ServingCase(
            "serving-min-tokens",
            "min_tokens: the boundary before, inside and right after the draft block",
            (
                d.row("min_tokens before the block",
                      Request(min_tokens=2, stop_token_ids=(0, 1), output_token_ids=(5, 6, 7)),
                      support=3, scale=1.0),
                d.row("min_tokens inside the block",
                      Request(min_tokens=3, stop_token_ids=(0, 1), output_token_ids=(5,)),
                      support=3, scale=1.0),
                d.row("min_tokens right after the block",
                      Request(min_tokens=5, stop_token_ids=(0, 1), output_token_ids=(5,)),
                      support=3, scale=1.0),
            ),
        ),
        ServingCase(
            "serving-seeded-ragged",
            "seeded beside unseeded rows, 0..k drafts per request in one batch",
            (
                d.row("seeded, 3 drafts", Request(seed=1, top_k=8)),
                d.row("unseeded, 2 drafts", Request(top_k=8), drafts=2),
                d.row("seeded, 1 draft", Request(seed=2, temperature=0.9), drafts=1),
                d.row("unseeded, 0 drafts", Request(temperature=0.9), drafts=0),
                d.row("seeded greedy", Request(seed=3, temperature=0.0)),
            ),
        ),
        ServingCase(
            "serving-no-draft-probs",
            "no draft probabilities (n-gram / greedy EAGLE drafts), 0..k drafts, greedy beside "
            "sampled",
            (
                d.fixed_row("T 1, 3 drafts", Request(), 3),
                d.fixed_row("top-p 0.8, 2 drafts", Request(top_p=0.8), 2),
                d.fixed_row("greedy, 3 drafts", Request(temperature=0.0), 3),
                d.fixed_row("seeded T 0.7, 1 draft", Request(temperature=0.7, seed=4), 1),
                d.fixed_row("T 1, 0 drafts", Request(), 0),
            ),
        ),
        ServingCase(
            "serving-distinct-b12",
            "12 distinct requests in one batch (mixed parameters)",
            tuple(
                d.row(f"distinct {i}: {label}", request, drafts=i % 4)
                for i, (label, request) in enumerate(
                    [
                        ("T 1", Request()),
                        ("greedy", Request(temperature=0.0)),
                        ("top-k 3", Request(top_k=3)),
                        ("top-p 0.9", Request(top_p=0.9)),
                        ("min-p 0.2", Request(min_p=0.2)),
                        ("T 0.6", Request(temperature=0.6)),
                        ("seeded", Request(seed=9)),
                        ("top-k 6 top-p 0.7", Request(top_k=6, top_p=0.7)),
                        ("T 1.3 min-p 0.05", Request(temperature=1.3, min_p=0.05)),
                        ("bias", Request(logit_bias=((4, 2.0),))),
                        ("greedy bias", Request(temperature=0.0, logit_bias=((7, 4.0),))),
                        ("seeded top-p 0.6", Request(seed=11, top_p=0.6)),
                    ]
                )
            ),
        ),
        ServingCase(
            "serving-bfloat16",
            "bfloat16 logits: greedy, T 0.9 top-k 5, top-p 0.8",
            (
                d.row("greedy", Request(temperature=0.0)),
                d.row("T 0.9 top-k 5", Request(temperature=0.9, top_k=5)),
                d.row("top-p 0.8", Request(top_p=0.8)),
            ),
            dtype="bfloat16",
        ),
        ServingCase(
            "serving-vocab-32k",
            "V = 32000 float32: T 0.8 top-k 20, top-p 0.9 on peaked logits",
            (
                d.row("T 0.8 top-k 20", Request(temperature=0.8, top_k=20), drafts=2,
                      vocab=32_000, k=2, scale=3.0),
                d.row("top-p 0.9", Request(top_p=0.9), drafts=2, vocab=32_000, k=2, scale=3.0),
            ),
            max_steps=200,
        ),
        ServingCase(
            "serving-vocab-152k",
            "V = 152064 bfloat16: greedy beside top-k 50",
            (
                d.row("greedy", Request(temperature=0.0), drafts=1, vocab=152_064, k=1,
                      scale=3.0),
                d.row("top-k 50", Request(top_k=50), drafts=1, vocab=152_064, k=1, scale=3.0),
            ),
            dtype="bfloat16",
            max_steps=100,
        ),
    ]
    return cases


@functools.cache
def _battery() -> tuple[ServingCase, ...]:
    return tuple(_cases())


def default_serving_battery() -> list[ServingCase]:
    """The serving cases every serving target is audited on (the module docstring)."""
    return list(_battery())
