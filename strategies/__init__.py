"""Hypothesis strategies for speculative-decoding verifier inputs, and settings profiles.

Small composable strategies in the style of ``hypothesis.extra.numpy``: arguments are validated
eagerly (``hypothesis.errors.InvalidArgument`` naming the argument) and regimes are named
constants, not magic numbers.

- :func:`probability_vectors` (regimes :data:`REGIMES`) and :func:`target_draft_pairs`
  (relations :data:`RELATIONS`): ``[V]`` tensors built in float64, optionally cast to float32,
  float16 or bfloat16 (:func:`renormalise_then_cast`, :func:`row_sum_tolerance`,
  :func:`effective_probabilities`).
- :func:`logits_vectors`: ``[V]`` float64 logits with ``-inf`` masks, large magnitudes and ties.
- :func:`sampling_parameters`, :class:`SamplingParameters` and
  :func:`apply_sampling_parameters`: temperature, top-k, top-p, min-p.
- :func:`requests` and :func:`profile_inputs` (fields :data:`REQUEST_FIELDS`): serving
  requests, each field on or off, and ``(logits, request, history)`` triples for the engine
  profiles.
- :func:`chain_cases`, :func:`greedy_cases` and :func:`verify_cases`: whole verifier inputs.
- :func:`recording_labels` and :func:`label_frequencies`: which regimes the draws reached.
- :data:`PROFILES`, :func:`load_profile`, :func:`add_profile_option` and
  :func:`configure_profile`: the ``dev``/``ci``/``nightly`` settings profiles, selected by
  ``--losslessness-profile`` or ``LOSSLESSNESS_HYPOTHESIS_PROFILE``.

Hypothesis chooses cases only; random samples come from generators the tests seed themselves
(docs/architecture.md, 'Statistical method').
"""

from strategies.cases import (
    VERIFY_DTYPES,
    VerifyCase,
    chain_cases,
    greedy_cases,
    verify_cases,
)
from strategies.coverage import LabelFrequencies, label_frequencies, recording_labels
from strategies.distributions import (
    PROBABILITY_DTYPES,
    REGIMES,
    RELATIONS,
    effective_probabilities,
    probability_vectors,
    renormalise_then_cast,
    row_sum_tolerance,
    target_draft_pairs,
)
from strategies.logits import LOGIT_SCALES, logits_vectors
from strategies.parameters import (
    SamplingParameters,
    apply_sampling_parameters,
    sampling_parameters,
)
from strategies.profiles import (
    PROFILE_ENV_VAR,
    PROFILES,
    add_profile_option,
    configure_profile,
    load_profile,
)
from strategies.requests import REQUEST_FIELDS, ProfileInput, profile_inputs, requests

__all__ = [
    "LOGIT_SCALES",
    "PROBABILITY_DTYPES",
    "PROFILES",
    "PROFILE_ENV_VAR",
    "REGIMES",
    "RELATIONS",
    "REQUEST_FIELDS",
    "VERIFY_DTYPES",
    "LabelFrequencies",
    "ProfileInput",
    "SamplingParameters",
    "VerifyCase",
    "add_profile_option",
    "apply_sampling_parameters",
    "chain_cases",
    "configure_profile",
    "effective_probabilities",
    "greedy_cases",
    "label_frequencies",
    "load_profile",
    "logits_vectors",
    "probability_vectors",
    "profile_inputs",
    "recording_labels",
    "renormalise_then_cast",
    "requests",
    "row_sum_tolerance",
    "sampling_parameters",
    "target_draft_pairs",
    "verify_cases",
]
