"""Drawing a serving case's samples: the audit draws the drafts (d ~ q, or the row's fixed drafts
when the drafter passes no probabilities) and the seeded rows' seeds, calls the serving
verifier once per batch (:func:`~losslessness.engine.draw.call_target`), checks each output's
layout and keeps the drafts and outputs by row kind.

Randomness: one generator seeded with the unit's seed draws the drafts and the seeds; the
verifier's generator is seeded with ``derive_seed(seed, "verifier")``. A seeded row gets a fresh
seed at every call (its rows are independent across calls, as the law checks need), and the
seed contract (:mod:`losslessness.reference.serving`) makes its output a function of that seed
and its inputs alone.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np
import torch

from losslessness.cases import ServingCase
from losslessness.engine.draw import call_target
from losslessness.protocol import (
    PLACEHOLDER,
    InvalidInputError,
    ServingVerifier,
    validate_serving_output,
)
from losslessness.requests import Request
from losslessness.samples import ServingSamples
from losslessness.seeding import derive_seed
from losslessness.worker import ProtocolViolation

__all__ = ["SEED_RANGE", "sample_serving"]

SEED_RANGE = 2**62
"""Seeds of seeded rows are drawn uniformly from ``[0, SEED_RANGE)``."""


def sample_serving(
    verifier: ServingVerifier,
    case: ServingCase,
    steps: int,
    seed: int,
    timeout_s: float | None,
    progress: Callable[[int], None] | None = None,
) -> ServingSamples:
    """Call ``verifier`` on batches of ``case`` until every row kind has ``steps`` rows.

    Args:
        verifier: the serving verifier.
        case: the serving case (B = R * copies rows per call, row b of kind b % R).
        steps: rows per kind (calls = ceil(steps / copies)).
        seed: the unit's seed.
        timeout_s: seconds one call may take.
        progress: called with the rows of each finished call.

    Returns:
        :class:`~losslessness.samples.ServingSamples`.

    Raises:
        ProtocolViolation: an output of the wrong shape, dtype or layout (message names the
            call and the problem).
        Exception: what the verifier raised.
    """
    began = time.perf_counter()
    draws = torch.Generator().manual_seed(seed)
    verifier_generator = torch.Generator().manual_seed(derive_seed(seed, "verifier"))
    kinds = torch.arange(case.batch_size) % case.n_rows
    logits = case.served_logits[kinds].contiguous()
    k, vocab = case.k, case.vocab_size
    q = case.served_draft_probs
    q_batch = None if q is None else q[kinds].contiguous()
    q_draw = None if q_batch is None else q_batch.to(torch.float64).reshape(-1, vocab)
    counts = torch.tensor([case.rows[int(r)].num_draft_tokens for r in kinds], dtype=torch.int64)
    drafted = torch.arange(k).unsqueeze(0) < counts.unsqueeze(1)
    fixed = torch.full((case.batch_size, k), PLACEHOLDER, dtype=torch.int64)
    for b, r in enumerate(kinds.tolist()):
        for i, token in enumerate(case.rows[r].drafts or ()):
            fixed[b, i] = token
    calls = max(1, math.ceil(steps / case.copies))
    drafts_by_kind: list[list[np.ndarray]] = [[] for _ in case.rows]
    outputs_by_kind: list[list[np.ndarray]] = [[] for _ in case.rows]
    inside = 0.0
    for call in range(calls):
        if q_draw is None:
            drafts = fixed.clone()
        else:
            drawn = torch.multinomial(q_draw, 1, generator=draws).view(case.batch_size, k)
            drafts = torch.where(drafted, drawn, torch.full_like(drawn, PLACEHOLDER))
        requests = tuple(_request_for_call(case.rows[r].request, draws) for r in kinds.tolist())
        start = time.perf_counter()
        output = call_target(
            verifier, logits, q_batch, drafts, counts, requests, verifier_generator,
            timeout_s=timeout_s,
        )
        inside += time.perf_counter() - start
        try:
            validate_serving_output(output, drafts, counts, vocab)
        except InvalidInputError as error:
            raise ProtocolViolation(f"call {call}: {error}") from None
        tokens = output.long().numpy()
        draft_array = drafts.numpy()
        for r in range(case.n_rows):
            rows = (kinds == r).numpy()
            drafts_by_kind[r].append(draft_array[rows])
            outputs_by_kind[r].append(tokens[rows])
        if progress is not None:
            progress(case.batch_size)
    return ServingSamples(
        case=case,
        drafts=[np.concatenate(parts) for parts in drafts_by_kind],
        outputs=[np.concatenate(parts) for parts in outputs_by_kind],
        seed=seed,
        wall_time_s=time.perf_counter() - began,
        verifier_time_s=inside,
        calls=calls,
    )


def _request_for_call(request: Request, draws: torch.Generator) -> Request:
    """``request`` with a fresh seed when it is seeded (unseeded requests as they are)."""
    if request.seed is None:
        return request
    fresh = int(torch.randint(0, SEED_RANGE, (), generator=draws))
    return dataclasses.replace(request, seed=fresh)
