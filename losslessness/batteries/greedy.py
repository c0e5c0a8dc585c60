"""The greedy battery of the default audit: random logits, exact ties at the maximum and
``-inf`` masks, for greedy (argmax) verifiers. Every case is built from
``BATTERY_SEED + 1`` (:data:`losslessness.batteries.chain.BATTERY_SEED`), so the battery, and
each case's hash, is the same on every machine.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from losslessness.batteries.chain import BATTERY_SEED
from losslessness.cases import GreedyCase


def default_greedy_battery() -> list[GreedyCase]:
    """The greedy-verifier battery: random logits, exact ties at the maximum, -inf masks.

    Drafts equal the target's argmax with probability 0.7 per position so that deep positions
    and the bonus are reached; in the tie cases a wrong draft is preferably a tied maximum
    other than the lowest index, which a correct verifier must reject.

    Returns:
        :class:`GreedyCase` objects, deterministic (built from :data:`BATTERY_SEED`).
    """
    return list(_default_greedy_battery())


@functools.cache
def _default_greedy_battery() -> tuple[GreedyCase, ...]:
    """Built once per process (cases are immutable; targets get copies of their tensors)."""
    rng = np.random.default_rng(BATTERY_SEED + 1)
    cases = []
    for vocab, k, regime in (
        (2, 1, "random"),
        (50, 4, "random"),
        (4096, 2, "random"),
        (8, 3, "ties"),
        (300, 4, "ties"),
        (64, 2, "masked"),
    ):
        batch = 256
        if regime == "ties":
            logits = rng.integers(0, 3, size=(batch, k + 1, vocab)).astype(np.float64)
        else:
            logits = rng.standard_normal((batch, k + 1, vocab))
        if regime == "masked":
            mask = rng.random((batch, k + 1, vocab)) < 0.5
            mask[..., 0] = False  # keep every row possible
            logits[mask] = -np.inf
        best = logits.max(axis=-1, keepdims=True)
        argmax = np.argmax(logits == best, axis=-1)
        drafts = rng.integers(0, vocab, size=(batch, k))
        match = rng.random((batch, k)) < 0.7
        drafts = np.where(match, argmax[:, :k], drafts)
        if regime == "ties":
            for b, i in zip(*np.nonzero(~match), strict=True):
                tied = np.flatnonzero(logits[b, i] == best[b, i, 0])
                if len(tied) > 1:
                    drafts[b, i] = rng.choice(tied[1:])
        cases.append(
            GreedyCase(
                f"greedy-v{vocab}-{regime}",
                f"V={vocab} k={k} {regime} logits, B={batch}",
                torch.from_numpy(logits),
                torch.from_numpy(drafts.astype(np.int64)),
                frozenset({regime}),
            )
        )
    return tuple(cases)
