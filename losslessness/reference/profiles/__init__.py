"""Engine semantics profiles: the exact law each engine's *non-speculative* sampler draws from.

A profile is a pure function from (target logits, :class:`~losslessness.requests.Request`,
output history) to a float64 distribution over the vocabulary: the order of the engine's
logits processors, its ties at a top-k/top-p cut-off, its renormalisation, which request fields
it honours. A speculative verifier inside that engine is lossless for a request when the token
it emits at every position (the bonus position included) follows the profile's law at that
position, the accepted drafts before it appended to the history.

Every profile module cites the engine source it states (file, function, version) and registers
itself in :data:`PROFILES`.
"""

from __future__ import annotations

from losslessness.reference.profiles import transformers, vllm_v1
from losslessness.reference.profiles.registry import (
    PROFILES,
    EngineProfile,
    get_profile,
    position_laws,
    register,
)

__all__ = [
    "PROFILES",
    "EngineProfile",
    "get_profile",
    "position_laws",
    "register",
    "transformers",
    "vllm_v1",
]
