"""End-to-end engines that batch requests (:class:`~losslessness.protocol.GeneratesBatches`),
for :mod:`tests.engine.test_end_to_end` and the worker: the toy reference loop served in
batches, honestly or with one of the faults a batching engine can have."""

from __future__ import annotations

import os
from pathlib import Path

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


ENGINE_DIRECTORY = "LOSSLESSNESS_TEST_ENGINE_DIR"
"""Where :class:`ExclusiveToy` engines register: the name of an environment variable."""


class ExclusiveToy(BatchingToy):
    """An honest :class:`BatchingToy` that, like a server holding gigabytes, must be the only
    engine alive (a whole engine: its target ``requires_speculation`` and it counts drafts):
    its first call registers this process in the folder named by :data:`ENGINE_DIRECTORY`,
    and every call raises ``RuntimeError`` while another registered process is still alive
    (so a run that keeps two engines up at once gets an ERROR)."""

    def _hold(self) -> None:
        folder = Path(os.environ[ENGINE_DIRECTORY])
        (folder / str(os.getpid())).touch()
        others = [int(path.name) for path in folder.iterdir() if path.name != str(os.getpid())]
        alive = [pid for pid in others if _alive(pid)]
        if alive:
            raise RuntimeError(f"engine {os.getpid()} called while engines {alive} are alive")

    def generate_batch(
        self, prompt_ids: list[int], max_new_tokens: int, seeds: list[int]
    ) -> list[list[int]]:
        self._hold()
        return super().generate_batch(prompt_ids, max_new_tokens, seeds)

    def next_token_probs(self, prefix_ids: list[int]) -> torch.Tensor:
        self._hold()
        return super().next_token_probs(prefix_ids)

    def draft_counts(self) -> dict[str, int]:
        """Drafted and accepted tokens as an engine counts them (two drafts per verify step:
        an upper bound near ``max_new_tokens``, where the loop may draft fewer)."""
        lengths = self.inner.accepted_length_counts()
        return {
            "drafted": 2 * sum(lengths.values()),
            "accepted": sum(length * count for length, count in lengths.items()),
        }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _exclusive_adapter(name: str) -> Adapter:
    return Adapter(
        name, "the toy loop in batches, the only engine alive",
        end_to_end=(EndToEndTarget(f"{name}/t1", "toy in batches", ExclusiveToy(), PROMPT,
                                   NEW_TOKENS, reproducible_seeds=True,
                                   requires_speculation=True),),
    )


def exclusive_adapter_a() -> Adapter:
    """One sampled end-to-end case of an :class:`ExclusiveToy`, named ``exclusive-a``."""
    return _exclusive_adapter("exclusive-a")


def exclusive_adapter_b() -> Adapter:
    """One sampled end-to-end case of an :class:`ExclusiveToy`, named ``exclusive-b``."""
    return _exclusive_adapter("exclusive-b")
