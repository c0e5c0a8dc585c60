"""Serving tree mutants (issue 21, item 7): serving tree verifiers that reproduce engines'
per-request bugs on the tree path, each on the serving tree battery case that exercises its
mechanism, and the lossless control.

Each mutant is the reference serving tree verifier (:class:`~losslessness.reference.
serving_tree.ServingTreeReference`) with its target law replaced as the engine's code replaces
it; each cites the code. The registry holds them for :data:`~losslessness.zoo.serving.
ZOO_PROFILE` (``mutant/serving-tree-<name>``); :func:`serving_tree_zoo` builds them for another
profile.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import torch

from losslessness.batteries.serving_tree import default_serving_tree_battery
from losslessness.cases import TreeCase
from losslessness.protocol import TreeOutput
from losslessness.reference.profiles import EngineProfile
from losslessness.reference.serving_tree import ServingTreeReference
from losslessness.requests import Request
from losslessness.zoo.entry import Mutant
from losslessness.zoo.serving import ZOO_PROFILE, serving_mutants

__all__ = [
    "GreedyFlagFromAnyRequest",
    "IgnoresMinP",
    "MinTokensCountedAtTheRoot",
    "serving_tree_zoo",
]


class IgnoresMinP(ServingTreeReference):
    """SGLang 0.5.23's EAGLE verify (``srt/speculative/eagle_utils.py``, ``eagle_sample``,
    the tree sampling branch): the target law gets temperature, top-k and top-p only; the
    request's min-p is never read."""

    def target_law(
        self, logits: torch.Tensor, request: Request, history: list[int], depth: int
    ) -> torch.Tensor:
        """The profile's law of the request without min-p."""
        return self.profile.law(logits, dataclasses.replace(request, min_p=None), history)


class MinTokensCountedAtTheRoot(ServingTreeReference):
    """The history of every node counted as the root's: the tokens accepted on the path do not
    count toward ``min_tokens`` (vLLM 0.33.0's model runner v1 at the bonus position,
    ``MinTokensLogitsProcessor.apply``; SGLang 0.5.23's penalties "relaxed" for the step,
    ``eagle_sample``), so the stop tokens stay masked below the boundary's depth."""

    def target_law(
        self, logits: torch.Tensor, request: Request, history: list[int], depth: int
    ) -> torch.Tensor:
        """The profile's law with the history before the root."""
        return self.profile.law(logits, request, history[: len(history) - depth])


class GreedyFlagFromAnyRequest(ServingTreeReference):
    """The batch's greedy flag computed with ``any`` instead of ``all``: one greedy request
    makes the verifier take its greedy path for every tree of the call (each tree's argmax), so
    a sampled request batched beside a greedy one is verified greedily. The flag's correct form
    is vLLM 0.33.0's ``SamplingMetadata.all_greedy`` (``v1/sample/metadata.py``, read by
    ``RejectionSampler.forward``) and SGLang 0.5.23's ``SamplingBatchInfo.is_all_greedy``
    (``srt/sampling/sampling_batch_info.py``, read by ``eagle_sample``); no shipped bug of
    this exact shape was found in their trackers. Every unmixed case passes: only a mixed batch
    shows it."""

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft_probs: torch.Tensor,
        parents: torch.Tensor,
        token_ids: torch.Tensor,
        draft_scheme: str,
        requests: Sequence[Request],
        generator: torch.Generator,
    ) -> TreeOutput:
        """The reference's step, every request made greedy when any is."""
        if any(request.greedy for request in requests):
            requests = [dataclasses.replace(request, temperature=0.0) for request in requests]
        return super().__call__(target_logits, draft_probs, parents, token_ids, draft_scheme,
                                requests, generator)


def _case(case_id: str, profile: str) -> Callable[[], TreeCase]:
    def build() -> TreeCase:
        return next(
            case for case in default_serving_tree_battery(profile) if case.case_id == case_id
        )

    return build


_ENTRIES: tuple[tuple[str, type[ServingTreeReference], bool, str, str, str], ...] = (
    (
        "serving-tree-ignores-min-p", IgnoresMinP, True,
        "min-p ignored by the tree verify path (temperature, top-k and top-p only)",
        "https://github.com/sgl-project/sglang/blob/main/python/sglang/srt/speculative/"
        "eagle_utils.py", "stree-min-p",
    ),
    (
        "serving-tree-min-tokens-at-root", MinTokensCountedAtTheRoot, True,
        "min_tokens counts the history before the tree only, not the accepted path",
        "https://github.com/vllm-project/vllm/issues/42744", "stree-min-tokens",
    ),
    (
        "serving-tree-greedy-flag-from-any-request", GreedyFlagFromAnyRequest, True,
        "one greedy request makes every tree of its batch greedy (batch flag any, not all)",
        "https://github.com/vllm-project/vllm/blob/main/vllm/v1/sample/metadata.py",
        "stree-mixed-sampled",
    ),
    (
        "serving-tree-reference", ServingTreeReference, False,
        "the reference serving tree verifier (tree speculative sampling on the profile's law)",
        "https://arxiv.org/abs/2305.09781", "stree-top-k-top-p",
    ),
)


@functools.cache
def serving_tree_zoo(profile: str | EngineProfile = ZOO_PROFILE) -> tuple[Mutant, ...]:
    """The serving tree entries for ``profile`` (a registered name, or a profile object).

    Returns:
        One :class:`~losslessness.zoo.entry.Mutant` per entry, protocol ``serving-tree``, its
        ``engine_profile`` the profile's name, its case the serving tree battery's case of its
        mechanism built for the profile.
    """
    return serving_mutants(profile, _ENTRIES, protocol="serving-tree", case_builder=_case)
