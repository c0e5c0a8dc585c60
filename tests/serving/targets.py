"""Serving targets for the tests: the reference serving verifier on the test profile, as a
``pkg.module:callable`` a user would name (``engine_profile`` set as the protocol asks), and
the same verifier without the attribute (the audit's ``--engine-profile`` names it)."""

from __future__ import annotations

import dataclasses

import torch

from losslessness.reference.serving import ServingReference
from losslessness.reference.serving_tree import ServingTreeReference
from losslessness.requests import Request
from tests.serving.profile import PROFILE_NAME, small_profile

reference = ServingReference(small_profile())
reference.engine_profile = PROFILE_NAME  # type: ignore[attr-defined]

unnamed = ServingReference(small_profile())


def records_call(
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    requests: tuple[Request, ...],
    generator: torch.Generator,
) -> torch.Tensor:
    """Raises unless the call arrived as the serving protocol sends it (Request objects, None
    draft probabilities kept None), else verifies with the reference."""
    if draft_probs is not None or not all(isinstance(r, Request) for r in requests):
        raise TypeError(f"arrived as {type(draft_probs).__name__}, {[type(r) for r in requests]}")
    return reference(
        target_logits, draft_probs, draft_token_ids, num_draft_tokens, requests, generator
    )


records_call.engine_profile = PROFILE_NAME  # type: ignore[attr-defined]


def seeded_from_shared_stream(
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    requests: tuple[Request, ...],
    generator: torch.Generator,
) -> torch.Tensor:
    """The reference with every seed dropped: seeded rows draw from the shared generator (the
    law is right, the seed contract broken), as a ``pkg.module:callable`` in a worker."""
    unseeded = tuple(dataclasses.replace(r, seed=None) for r in requests)
    return reference(
        target_logits, draft_probs, draft_token_ids, num_draft_tokens, unseeded, generator
    )


seeded_from_shared_stream.engine_profile = PROFILE_NAME  # type: ignore[attr-defined]


def exits_at_batch_of_one(
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    requests: tuple[Request, ...],
    generator: torch.Generator,
) -> torch.Tensor:
    """Hostile: the process exits (no exception, no output) on a batch of one request; the
    reference otherwise."""
    if target_logits.shape[0] == 1:
        import os

        os._exit(3)
    return reference(
        target_logits, draft_probs, draft_token_ids, num_draft_tokens, requests, generator
    )


exits_at_batch_of_one.engine_profile = PROFILE_NAME  # type: ignore[attr-defined]


def hangs_at_batch_of_one(
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    requests: tuple[Request, ...],
    generator: torch.Generator,
) -> torch.Tensor:
    """Hostile: never returns on a batch of one request (a sleep no Python signal reaches in
    time); the reference otherwise."""
    if target_logits.shape[0] == 1:
        import time

        time.sleep(3600)
    return reference(
        target_logits, draft_probs, draft_token_ids, num_draft_tokens, requests, generator
    )


hangs_at_batch_of_one.engine_profile = PROFILE_NAME  # type: ignore[attr-defined]


def drops_the_last_column(
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    requests: tuple[Request, ...],
    generator: torch.Generator,
) -> torch.Tensor:
    """Hostile: lies about its output's shape, [B, k] instead of [B, k+1]."""
    out = reference(
        target_logits, draft_probs, draft_token_ids, num_draft_tokens, requests, generator
    )
    return out[:, :-1]


drops_the_last_column.engine_profile = PROFILE_NAME  # type: ignore[attr-defined]


tree_reference = ServingTreeReference(small_profile())
tree_reference.engine_profile = PROFILE_NAME  # type: ignore[attr-defined]
"""The reference serving tree verifier on the test profile (``--protocol serving-tree``)."""
