"""Seed-contract mutants (issue 21, item 4): serving verifiers whose seeded rows change with
the rest of their batch, each citing the bug it reproduces.

Each is the reference serving verifier (:class:`~losslessness.reference.serving.
ServingReference`) with its :meth:`row_generator` replaced. Every emitted token still follows
the profile's law (each row draws fresh uniforms from some generator), so the law checks pass
and the seed contract (:mod:`losslessness.engine.seed_contract`) alone sees them: an audit
gives IRREPRODUCIBLE, not LOSSY. The reference itself is the lossless control (its seeded rows
draw from ``row_seed(request)`` alone): ``mutant/serving-reference``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from losslessness.reference.profiles import EngineProfile
from losslessness.reference.serving import ServingReference, row_seed
from losslessness.requests import Request
from losslessness.zoo.entry import Mutant
from losslessness.zoo.serving import ZOO_PROFILE, serving_mutants

__all__ = [
    "BatchStreamFromFirstSeed",
    "SeedPlusRowIndex",
    "SeededRowsOnSharedStream",
    "seed_zoo",
]


class SeededRowsOnSharedStream(ServingReference):
    """Seeded rows draw their verify coins from the batch's shared generator, as unseeded rows
    do (SGLang issue 30822: the speculative verify step's coins ignored ``sampling_seed``)."""

    def row_generator(self, request: Request, generator: torch.Generator,
                      requests: Sequence[Request]) -> torch.Generator:
        """The call's shared generator, whatever the request's seed."""
        return generator


class BatchStreamFromFirstSeed(ServingReference):
    """One random stream for the whole batch, seeded from its first seeded row (TensorRT-LLM
    issue 19487: requests share one random stream): a seeded row's draws depend on the rows
    before it and on which seeded row comes first."""

    def __init__(self, profile: EngineProfile | str) -> None:
        super().__init__(profile)
        self._stream: torch.Generator | None = None

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft_probs: torch.Tensor | None,
        draft_token_ids: torch.Tensor,
        num_draft_tokens: torch.Tensor,
        requests: Sequence[Request],
        generator: torch.Generator,
    ) -> torch.Tensor:
        """The reference's call, with one stream for the batch (see the class)."""
        seeded = [r for r in requests if r.seed is not None]
        self._stream = torch.Generator().manual_seed(row_seed(seeded[0])) if seeded else None
        return super().__call__(
            target_logits, draft_probs, draft_token_ids, num_draft_tokens, requests, generator
        )

    def row_generator(self, request: Request, generator: torch.Generator,
                      requests: Sequence[Request]) -> torch.Generator:
        """The batch's one stream (the call's generator when no row is seeded)."""
        return self._stream if self._stream is not None else generator


class SeedPlusRowIndex(ServingReference):
    """A seeded row's generator seeded with its seed plus its row index in the batch (a
    per-row offset into a batched Philox stream, the pattern of vLLM's FlashInfer sampler
    offsets, applied without the request's own generator): the output moves with the row."""

    def row_generator(self, request: Request, generator: torch.Generator,
                      requests: Sequence[Request]) -> torch.Generator:
        """A generator seeded with ``row_seed(request) + row index``."""
        if request.seed is None:
            return generator
        index = next(b for b, r in enumerate(requests) if r is request)
        return torch.Generator().manual_seed(row_seed(request) + index)


_ENTRIES: tuple[tuple[str, type[ServingReference], str, str], ...] = (
    (
        "serving-seeded-rows-on-shared-stream", SeededRowsOnSharedStream,
        "seeded rows draw their verify coins from the shared generator",
        "https://github.com/sgl-project/sglang/issues/30822",
    ),
    (
        "serving-batch-stream-from-first-seed", BatchStreamFromFirstSeed,
        "one random stream for the batch, seeded from its first seeded row",
        "https://github.com/NVIDIA/TensorRT-LLM/issues/19487",
    ),
    (
        "serving-seed-plus-row-index", SeedPlusRowIndex,
        "a seeded row's generator offset by its row index in the batch",
        "https://github.com/vllm-project/vllm/issues/9441",
    ),
)

SEED_CASE_ID = "serving-seeded-ragged"
"""The serving battery case the seed mutants' law is checked on (seeded beside unseeded rows,
0..k drafts): each keeps the law there."""


@functools.cache
def seed_zoo(profile: str | EngineProfile = ZOO_PROFILE) -> tuple[Mutant, ...]:
    """The seed-contract entries for ``profile``.

    Returns:
        One :class:`~losslessness.zoo.entry.Mutant` per entry, protocol ``serving``, lossy
        False (their law is right) and ``irreproducible`` True (the audit's verdict is
        IRREPRODUCIBLE).
    """
    return serving_mutants(
        profile,
        (
            (entry_name, verifier, False, mechanism, source, SEED_CASE_ID)
            for entry_name, verifier, mechanism, source in _ENTRIES
        ),
        irreproducible=True,
    )
