"""Targets the command tests run in a subprocess by name (``tests.commands.slow_targets:...``):
a correct verifier slowed down, so that a signal finds the audit in the phase a test wants,
and a verifier wrong only on its first call (lazy initialisation gone wrong)."""

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


_calls = 0


def wrong_on_first_call(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """The reference chain verifier, except that its first call in the process emits every
    position's token as if every draft were accepted, each one a token that differs from its
    draft (``[B, k+1]`` int64, well formed, but the accepted prefix is not the drafts: a
    structure violation), like a kernel whose first, compiling call takes a wrong path."""
    global _calls
    _calls += 1
    if _calls == 1:
        vocabulary = target_probs.shape[-1]
        batch, k = draft_token_ids.shape
        wrong = (draft_token_ids + 1) % vocabulary
        return torch.cat([wrong, torch.zeros(batch, 1, dtype=torch.int64)], dim=1)
    return verify(target_probs, draft_probs, draft_token_ids, generator)
