"""A target the command tests run in a subprocess by name
(``tests.commands.slow_targets:slow_verify``): a correct verifier slowed down and counting its
calls, so that a signal finds the audit in the phase a test wants."""

from __future__ import annotations

import os
import time

import torch

from losslessness.reference import verify

SECONDS_PER_CALL = float(os.environ.get("SLOW_TARGET_SECONDS", "0.02"))
"""Pause of every call of :func:`slow_verify` (the environment variable sets it per test)."""

CALLS_FILE = os.environ.get("SLOW_TARGET_CALLS")
"""A file :func:`slow_verify` appends a line to at every call (when set): a test reads it to
know that the audit is calling the target."""


def slow_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """The reference chain verifier (lossless), :data:`SECONDS_PER_CALL` slower per call, each
    call counted in :data:`CALLS_FILE`."""
    if CALLS_FILE:
        with open(CALLS_FILE, "a") as calls:
            calls.write("call\n")
    time.sleep(SECONDS_PER_CALL)
    return verify(target_probs, draft_probs, draft_token_ids, generator)

