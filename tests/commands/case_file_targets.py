"""Targets of the case-file tests: the reference serving verifier on vLLM v1's profile, the
profile the example file's serving case is written for."""

from __future__ import annotations

from losslessness.reference.profiles import get_profile
from losslessness.reference.serving import ServingReference

vllm_v1_reference = ServingReference(get_profile("vllm-v1"))
"""The serving reference drawing from ``vllm-v1``'s law (lossless for it)."""
