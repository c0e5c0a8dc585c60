"""Hypothesis strategies for speculative-decoding verifier inputs, and settings profiles.

Small composable strategies in the style of ``hypothesis.extra.numpy``: arguments are validated
eagerly (``hypothesis.errors.InvalidArgument`` naming the argument) and regimes are named
constants, not magic numbers.

- :func:`probability_vectors` (regimes :data:`REGIMES`) and :func:`target_draft_pairs`
  (relations :data:`RELATIONS`): ``[V]`` float64 tensors.
- :func:`chain_cases` and :func:`greedy_cases`: whole verifier inputs.
- :data:`PROFILES` and :func:`load_profile`: the ``dev``/``ci``/``nightly`` settings profiles,
  selected by ``LOSSLESSNESS_HYPOTHESIS_PROFILE``.

Hypothesis chooses cases only; random samples come from generators the tests seed themselves
(DESIGN.md section 5).
"""

from strategies.cases import ChainCaseTensors, GreedyCaseTensors, chain_cases, greedy_cases
from strategies.distributions import (
    REGIMES,
    RELATIONS,
    probability_vectors,
    target_draft_pairs,
)
from strategies.profiles import PROFILE_ENV_VAR, PROFILES, load_profile

__all__ = [
    "PROFILES",
    "PROFILE_ENV_VAR",
    "REGIMES",
    "RELATIONS",
    "ChainCaseTensors",
    "GreedyCaseTensors",
    "chain_cases",
    "greedy_cases",
    "load_profile",
    "probability_vectors",
    "target_draft_pairs",
]
