"""Serving mutants (issue 21, item 7): serving verifiers that reproduce engines' shipped
per-request bugs, each on the serving battery case that exercises its mechanism, and lossless
controls.

Each mutant is the reference serving verifier (:class:`~losslessness.reference.serving.
ServingReference`) with one step replaced as the engine's bug replaced it; each cites the
report. Seed-contract mutants (a seeded row that changes with its batch) are the seed
contract's (:mod:`losslessness.engine.seed_contract`), not these: every entry here keeps its
seeded rows' randomness a function of their seed and history alone.

:func:`serving_zoo` builds the entries for one engine profile; the registry holds them for
:data:`ZOO_PROFILE` (``mutant/serving-<name>``), and the tests build them for their own profile.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from losslessness.batteries.serving import default_serving_battery
from losslessness.cases import ServingCase
from losslessness.reference.profiles import EngineProfile
from losslessness.reference.serving import ServingReference, inverse_cdf
from losslessness.requests import Request
from losslessness.zoo.entry import Mutant, ZooCase

__all__ = [
    "ZOO_PROFILE",
    "DefaultSamplingParams",
    "DropsMinPAndLogitBias",
    "IgnoresFrequencyPenalty",
    "IgnoresPenalties",
    "SharedAcceptResidualUniform",
    "SparseSupportSampling",
    "StaleNoiseForUnseededRows",
    "TopPBeforeTopK",
    "serving_case",
    "serving_mutants",
    "serving_zoo",
]

ZOO_PROFILE = "vllm-v1"
"""The engine profile the registered serving entries claim (vLLM's model runner v1, whose
bugs most of them reproduce)."""


class DefaultSamplingParams(ServingReference):
    """vLLM #9834: the target law used the default temperature 1 and no top-p while the draft
    had used the request's: the verifier processes the target logits without the request's
    temperature and top-p (greedy rows stay greedy)."""

    def target_law(
        self, logits: torch.Tensor, request: Request, history: list[int]
    ) -> torch.Tensor:
        """The profile's law at temperature 1 without top-p."""
        if not request.greedy:
            request = dataclasses.replace(request, temperature=1.0, top_p=None)
        return super().target_law(logits, request, history)


class DropsMinPAndLogitBias(ServingReference):
    """vLLM #42744: min_p and logit_bias silently dropped on the verified tokens."""

    def target_law(
        self, logits: torch.Tensor, request: Request, history: list[int]
    ) -> torch.Tensor:
        """The profile's law without min-p and logit bias."""
        request = dataclasses.replace(request, min_p=None, logit_bias=())
        return super().target_law(logits, request, history)


class IgnoresFrequencyPenalty(ServingReference):
    """vLLM #18902: the frequency penalty is ignored under speculative decoding."""

    def target_law(
        self, logits: torch.Tensor, request: Request, history: list[int]
    ) -> torch.Tensor:
        """The profile's law without the frequency penalty."""
        request = dataclasses.replace(request, frequency_penalty=0.0)
        return super().target_law(logits, request, history)


class IgnoresPenalties(ServingReference):
    """TensorRT-LLM #17701: one-model speculative decoding ignores every penalty
    (frequency, presence, repetition)."""

    def target_law(
        self, logits: torch.Tensor, request: Request, history: list[int]
    ) -> torch.Tensor:
        """The profile's law without penalties."""
        request = dataclasses.replace(
            request, frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0
        )
        return super().target_law(logits, request, history)


class TopPBeforeTopK(ServingReference):
    """SGLang #36173: the speculative path applied top-p (on the full distribution) before
    top-k, the other order from the normal sampler's: the profile's law without both, then a
    top-p cut, then a top-k cut, renormalised."""

    def target_law(
        self, logits: torch.Tensor, request: Request, history: list[int]
    ) -> torch.Tensor:
        """Top-p, then top-k, on the profile's law without either."""
        plain = dataclasses.replace(request, top_k=None, top_p=None)
        p = super().target_law(logits, plain, history).clone()
        if request.greedy:
            return p
        if request.top_p is not None:
            order = torch.argsort(p, descending=True, stable=True)
            before = torch.cumsum(p[order], 0) - p[order]
            p[order[before >= request.top_p]] = 0.0
        if request.top_k is not None and request.top_k < int((p > 0).sum()):
            order = torch.argsort(p, descending=True, stable=True)
            p[order[request.top_k:]] = 0.0
        return p / p.sum()


class SharedAcceptResidualUniform(ServingReference):
    """vllm-ascend #16370: the uniform that rejected the draft also draws the residual token:
    given a rejection it lies in ``[p'(d)/q(d), 1)``, so the residual's inverse CDF only
    reaches its upper tokens (biased output, right acceptance rate)."""

    def correction(self, weights: torch.Tensor, accept_uniform: float,
                   generator: torch.Generator) -> int:
        """The residual drawn with the acceptance uniform."""
        return inverse_cdf(weights, accept_uniform)


class StaleNoiseForUnseededRows(ServingReference):
    """vLLM #9441 / #11123: in a batch with seeded rows, the noise of the unseeded rows was not
    written, so they reused stale values: here the unseeded rows of such a batch draw from a
    buffer left by an earlier call (the same every call); batches without seeded rows are
    right."""

    def row_generator(self, request: Request, generator: torch.Generator,
                      requests: Sequence[Request]) -> torch.Generator:
        """A fixed stale stream for unseeded rows beside seeded ones."""
        if request.seed is None and any(other.seed is not None for other in requests):
            return torch.Generator().manual_seed(0)
        return super().row_generator(request, generator, requests)


class SparseSupportSampling(ServingReference):
    """Lossless control: a sparse fast path that gathers the law's support (the top-k or
    nucleus kept tokens) and samples from the gathered entries only: exact, since the tokens it
    drops have mass 0."""

    def correction(self, weights: torch.Tensor, accept_uniform: float,
                   generator: torch.Generator) -> int:
        """Inverse CDF over the positive entries alone, mapped back to their ids."""
        support = torch.nonzero(weights > 0).flatten()
        fresh = float(torch.rand((), generator=generator, dtype=torch.float64))
        return int(support[inverse_cdf(weights[support], fresh)])


def serving_case(case_id: str) -> Callable[[], ServingCase]:
    """A builder of the serving battery case ``case_id`` (a zoo entry's ``build_case``)."""

    def build() -> ServingCase:
        return next(case for case in default_serving_battery() if case.case_id == case_id)

    return build


_ENTRIES: tuple[tuple[str, type[ServingReference], bool, str, str, str], ...] = (
    (
        "serving-default-sampling-params", DefaultSamplingParams, True,
        "target law at temperature 1 without top-p while the draft used the request's",
        "https://github.com/vllm-project/vllm/issues/9834", "serving-temperatures",
    ),
    (
        "serving-drops-min-p-logit-bias", DropsMinPAndLogitBias, True,
        "min_p and logit_bias dropped on verified tokens",
        "https://github.com/vllm-project/vllm/issues/42744", "serving-filters",
    ),
    (
        "serving-ignores-frequency-penalty", IgnoresFrequencyPenalty, True,
        "frequency penalty ignored by the speculative path",
        "https://github.com/vllm-project/vllm/issues/18902", "serving-penalties",
    ),
    (
        "serving-top-p-before-top-k", TopPBeforeTopK, True,
        "top-p applied before top-k on the speculative path (the normal sampler's other order)",
        "https://github.com/sgl-project/sglang/issues/36173", "serving-filters",
    ),
    (
        "serving-shared-accept-residual-uniform", SharedAcceptResidualUniform, True,
        "acceptance and residual share one uniform: biased output, right acceptance rate",
        "https://github.com/vllm-project/vllm-ascend/issues/16370", "serving-temperatures",
    ),
    (
        "serving-stale-noise-unseeded-rows", StaleNoiseForUnseededRows, True,
        "noise not written for unseeded rows of a mixed seeded batch: they reuse stale noise",
        "https://github.com/vllm-project/vllm/issues/9441", "serving-seeded-ragged",
    ),
    (
        "serving-ignores-penalties", IgnoresPenalties, True,
        "frequency, presence and repetition penalties ignored by one-model speculative decoding",
        "https://github.com/NVIDIA/TensorRT-LLM/issues/17701", "serving-penalties",
    ),
    (
        "serving-reference", ServingReference, False,
        "the reference serving verifier (Leviathan et al. 2022, Alg. 1 on the profile's law)",
        "https://arxiv.org/abs/2211.17192", "serving-filters",
    ),
    (
        "serving-sparse-support", SparseSupportSampling, False,
        "sparse fast path: samples from the gathered support of the law only (exact)",
        "https://github.com/vllm-project/vllm/blob/v0.6.3/vllm/model_executor/layers/sampler.py",
        "serving-filters",
    ),
)


def serving_mutants(
    profile: str | EngineProfile,
    entries: Iterable[tuple[str, Callable[..., Any], bool, str, str, str]],
    *,
    irreproducible: bool = False,
    protocol: str = "serving",
    case_builder: Callable[[str, str], Callable[[], ZooCase]] | None = None,
) -> tuple[Mutant, ...]:
    """Mutants in the serving (or serving tree) protocol for ``profile``, one per entry
    ``(name, verifier factory, lossy, mechanism, source, case id)``: the factory is called with
    ``profile``; the case is the serving battery's case of that id, or ``case_builder(case id,
    profile name)``'s.

    Args:
        profile: a registered profile name, or a profile object.
        entries: the table of entries.
        irreproducible: the entries break the seed contract (the audit's verdict is
            IRREPRODUCIBLE).
        protocol: ``serving`` or ``serving-tree``.
        case_builder: builds an entry's case from its id and the profile's name (None: the
            serving battery's, :func:`serving_case`).
    """
    name = profile if isinstance(profile, str) else profile.name
    return tuple(
        Mutant(
            name=entry_name,
            verifier=verifier(profile),
            protocol=protocol,
            lossy=lossy,
            mechanism=mechanism,
            source=source,
            build_case=(
                serving_case(case_id) if case_builder is None else case_builder(case_id, name)
            ),
            engine_profile=name,
            irreproducible=irreproducible,
        )
        for entry_name, verifier, lossy, mechanism, source, case_id in entries
    )


@functools.cache
def serving_zoo(profile: str | EngineProfile = ZOO_PROFILE) -> tuple[Mutant, ...]:
    """The serving entries for ``profile`` (a registered name, or a profile object).

    Returns:
        One :class:`~losslessness.zoo.entry.Mutant` per entry, protocol ``serving``, its
        ``engine_profile`` the profile's name, its case the battery case of its mechanism.
    """
    return serving_mutants(profile, _ENTRIES)
