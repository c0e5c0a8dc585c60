"""End-to-end engines that batch requests (:class:`~losslessness.protocol.GeneratesBatches`),
for :mod:`tests.engine.test_end_to_end` and the worker: the toy reference loop served in
batches, honestly or with one of the faults a batching engine can have."""

from __future__ import annotations

import torch

from losslessness.adapters import Adapter, EndToEndTarget
from losslessness.adapters.toy import toy_models
from losslessness.reference.decoding import SpeculativeDecoder
from losslessness.reference.proposers import DraftModelProposer

PROMPT = (1,)
NEW_TOKENS = 3


class BatchingToy:
    """The toy reference loop (draft length 2) serving ``batch_size`` requests per call.

    Args:
        batch_size: the most seeds per call.
        fault: ``""`` (honest), ``"drops"`` (answers one sequence fewer than seeds) or
            ``"position"`` (a request's stream also depends on its place in the batch: the
            law stays right, the seed contract does not hold).
    """

    def __init__(self, batch_size: int = 64, fault: str = "") -> None:
        target, draft = toy_models()
        self.inner = SpeculativeDecoder(target, DraftModelProposer(draft), 2)
        self.vocab_size = self.inner.vocab_size
        self.batch_size = batch_size
        self.fault = fault
        self.batches: list[int] = []

    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int) -> list[int]:
        return self.inner.generate(prompt_ids, max_new_tokens, seed)

    def generate_batch(
        self, prompt_ids: list[int], max_new_tokens: int, seeds: list[int]
    ) -> list[list[int]]:
        self.batches.append(len(seeds))
        if self.fault == "position":
            seeds = [hash((seed, index)) % 2**62 for index, seed in enumerate(seeds)]
        sequences = [self.inner.generate(prompt_ids, max_new_tokens, seed) for seed in seeds]
        return sequences[:-1] if self.fault == "drops" else sequences

    def next_token_probs(self, prefix_ids: list[int]) -> torch.Tensor:
        return self.inner.next_token_probs(prefix_ids)


def batching_adapter(engine: BatchingToy | None = None) -> Adapter:
    """One sampled end-to-end case of ``engine`` (an honest :class:`BatchingToy` by default),
    promising reproducible seeds."""
    engine = engine or BatchingToy()
    return Adapter(
        "batching", "the toy loop in batches",
        end_to_end=(EndToEndTarget("batching/t1", "toy in batches", engine, PROMPT, NEW_TOKENS,
                                   reproducible_seeds=True),),
    )
