"""A small engine profile for the serving tests, registered as ``test-serving``: vLLM v1's order
(penalties, min_tokens, logit bias, temperature, top-k, top-p on the renormalised top-k,
min-p), written here so the serving machinery is tested independently of the engine profiles
(:mod:`losslessness.reference.profiles`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from losslessness.reference.profiles import PROFILES, register
from losslessness.requests import Request

PROFILE_NAME = "test-serving"


class SmallProfile:
    """penalties -> min_tokens -> logit bias -> temperature -> top-k -> top-p -> min-p."""

    name = PROFILE_NAME
    source = "tests/serving/profile.py (vLLM v1's order, simplified: ties at a cut kept)"

    def law(self, logits: torch.Tensor, request: Request, history: Sequence[int]) -> torch.Tensor:
        """The law of one position, ``[V]`` float64."""
        x = logits.to(torch.float64).clone()
        counts = Counter(history)
        for token, count in counts.items():
            x[token] -= request.frequency_penalty * count + request.presence_penalty
        if request.repetition_penalty != 1.0:
            seen = sorted(set(history) | set(request.prompt_token_ids))
            for token in seen:
                value = x[token]
                x[token] = value / request.repetition_penalty if value > 0 else (
                    value * request.repetition_penalty
                )
        if len(history) < request.min_tokens:
            for token in request.stop_token_ids:
                x[token] = float("-inf")
        for token, bias in request.logit_bias:
            x[token] += bias
        if request.greedy:
            law = torch.zeros_like(x)
            law[int(torch.argmax(x))] = 1.0
            return law
        x = x / request.temperature
        if request.top_k is not None and request.top_k < x.shape[0]:
            cut = torch.topk(x, request.top_k).values[-1]
            x[x < cut] = float("-inf")
        p = torch.softmax(x, dim=0)
        if request.top_p is not None:
            order = torch.argsort(p, descending=True, stable=True)
            before = torch.cumsum(p[order], 0) - p[order]
            drop = order[before >= request.top_p]
            p[drop] = 0.0
            p = p / p.sum()
        if request.min_p is not None:
            p[p < request.min_p * p.max()] = 0.0
            p = p / p.sum()
        return p


def small_profile() -> SmallProfile:
    """The registered test profile (registered on first call)."""
    if PROFILE_NAME not in PROFILES:
        register(SmallProfile())
    profile = PROFILES[PROFILE_NAME]
    assert isinstance(profile, SmallProfile)
    return profile
