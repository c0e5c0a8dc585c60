"""Serving targets the serving-suite tests name as ``pkg.module:callable``: functions without
an ``engine_profile`` attribute, so the profile comes from ``--losslessness-engine-profile``."""

from __future__ import annotations

from losslessness.reference.serving import ServingReference

reference_sglang_torch = ServingReference("sglang-torch")
"""The reference serving verifier on SGLang's torch sampler's law (no ``engine_profile``
attribute: a run names the profile with ``--losslessness-engine-profile=sglang-torch``)."""

reference_flashinfer = ServingReference("flashinfer")
"""The reference serving verifier on FlashInfer's law (no greedy sampler, no penalties, biases
or masks: the suite draws only the requests it implements)."""
