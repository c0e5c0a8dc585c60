"""Serving targets for the tests: the reference serving verifier on the test profile, as a
``pkg.module:callable`` a user would name (``engine_profile`` set as the protocol asks)."""

from __future__ import annotations

from losslessness.reference.serving import ServingReference
from tests.serving.profile import PROFILE_NAME, small_profile

reference = ServingReference(small_profile())
reference.engine_profile = PROFILE_NAME  # type: ignore[attr-defined]
