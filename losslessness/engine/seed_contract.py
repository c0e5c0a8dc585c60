"""Running the seed contract on a serving target: the same seeded requests in many batches.

Each seeded request (fixed logits, drafts, draft count and history) is called in several batch
compositions: alone (B = 1); first, in the middle and last of a batch of unseeded rows; beside
seeded rows with other seeds; beside greedy rows; in a batch of copies of itself; in one batch
with the other seeded requests; and in the middle composition again with the shared generator
seeded differently (an unseeded neighbour then draws other numbers). Every composition is run
with float32 and with bfloat16 logits (the law differs between the two, so each dtype is its
own request for the comparison). :func:`losslessness.checks.seed_contract.check_seed_contract`
then compares the outputs exactly.

The requests are built for power, not for realism: V = 64 near-flat logits at temperature 1
(or 0.8 with top-k 32) and drafts whose acceptance is a coin flip, so that two independent
draws of one row agree with probability well under 1/10 and a contract broken for every
composition is found at its first comparison with near certainty.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from losslessness.batteries.builders import softmax
from losslessness.checks.seed_contract import SeedObservation
from losslessness.engine.draw import call_target
from losslessness.protocol import (
    PLACEHOLDER,
    InvalidInputError,
    ServingVerifier,
    validate_serving_output,
)
from losslessness.requests import Request
from losslessness.seeding import derive_seed
from losslessness.worker import ProtocolViolation

__all__ = [
    "SEED_CONTRACT_CASE_ID",
    "SEED_CONTRACT_K",
    "SEED_CONTRACT_SUMMARY",
    "SEED_CONTRACT_VOCAB",
    "SeedRow",
    "seed_contract_observations",
    "seed_contract_rows",
]

SEED_CONTRACT_CASE_ID = "seed-contract"
"""The case id of every seed-contract result."""

SEED_CONTRACT_VOCAB = 64
"""V of the seed contract's rows."""

SEED_CONTRACT_K = 3
"""Draft length k of the seed contract's batches."""

SEED_CONTRACT_SUMMARY = (
    f"V={SEED_CONTRACT_VOCAB} k={SEED_CONTRACT_K}: 3 seeded requests in 8-9 batch compositions, "
    "float32 and bfloat16 logits"
)
"""The one-line summary of the seed contract's case."""


@dataclasses.dataclass(frozen=True)
class SeedRow:
    """One row of a serving batch: what the verifier gets for it.

    Attributes:
        label: a name for the messages.
        logits: ``[k+1, V]`` float64 target logits.
        draft_probs: ``[k, V]`` float64 draft probabilities, or None (the drafter passes none).
        drafts: the row's drafts, ``num_draft_tokens`` ids.
        request: the row's request.
    """

    label: str
    logits: torch.Tensor
    draft_probs: torch.Tensor | None
    drafts: tuple[int, ...]
    request: Request


def _row(label: str, generator: torch.Generator, request: Request, drafts: int,
         with_q: bool, scale: float = 0.5) -> SeedRow:
    vocab, k = SEED_CONTRACT_VOCAB, SEED_CONTRACT_K
    logits = scale * torch.randn((k + 1, vocab), generator=generator, dtype=torch.float64)
    q = None
    if with_q:
        draft_logits = scale * torch.randn((k, vocab), generator=generator, dtype=torch.float64)
        q = torch.from_numpy(softmax(draft_logits.numpy()))
    tokens = torch.randint(0, vocab, (drafts,), generator=generator).tolist()
    return SeedRow(label, logits, q, tuple(int(t) for t in tokens), request)


def seed_contract_rows(seed: int) -> tuple[list[SeedRow], dict[bool, list[SeedRow]]]:
    """The seeded requests under test and the neighbours they are batched with.

    Args:
        seed: the unit's seed (logits, drafts and the requests' seeds derive from it).

    Returns:
        ``(seeded, neighbours)``: three seeded rows (with draft probabilities and 3 drafts;
        without draft probabilities, top-k 32 at temperature 0.8 and 2 drafts, a history;
        bonus only) and, by whether the batch carries draft probabilities, the neighbour rows:
        two unseeded, one greedy, two seeded with other seeds.
    """
    generator = torch.Generator().manual_seed(derive_seed(seed, "seed-contract rows"))

    def seed_of(name: str) -> int:
        return derive_seed(seed, "seed-contract", name) % (2**31)

    seeded = [
        _row("seeded request A (draft probs, 3 drafts)", generator,
             Request(seed=seed_of("A")), 3, with_q=True),
        _row("seeded request B (no draft probs, top-k 32, T=0.8, 2 drafts, history)", generator,
             Request(temperature=0.8, top_k=32, seed=seed_of("B"),
                     output_token_ids=(5, 9, 5)), 2, with_q=False),
        _row("seeded request C (draft probs, bonus only)", generator,
             Request(seed=seed_of("C")), 0, with_q=True),
    ]
    neighbours = {
        with_q: [
            _row("unseeded", generator, Request(), 3, with_q),
            _row("unseeded", generator, Request(temperature=0.7), 1, with_q),
            _row("greedy", generator, Request(temperature=0.0), 2, with_q),
            _row("other seed", generator, Request(seed=seed_of(f"D{with_q}")), 3, with_q),
            _row("other seed", generator, Request(seed=seed_of(f"E{with_q}")), 0, with_q),
        ]
        for with_q in (True, False)
    }
    return seeded, neighbours


def _compositions(
    row: SeedRow, others: Sequence[SeedRow], neighbours: Sequence[SeedRow]
) -> list[tuple[str, list[SeedRow], int, int]]:
    """``(description, rows, index of the row under test, generator seed)`` per composition."""
    unseeded = [n for n in neighbours if n.request.seed is None and not n.request.greedy]
    greedy = [n for n in neighbours if n.request.greedy]
    other_seeds = [n for n in neighbours if n.request.seed is not None]
    middle = [unseeded[0], unseeded[1], row, unseeded[0], unseeded[1]]
    together = [*others, row]
    compositions = [
        ("alone (B=1)", [row], 0, 1),
        ("first of 4, beside unseeded rows", [row, *unseeded, unseeded[0]], 0, 1),
        ("row 2 of 5, beside unseeded rows", middle, 2, 1),
        ("last of 4, beside unseeded rows", [*unseeded, unseeded[1], row], 3, 1),
        ("row 1 of 3, beside rows with other seeds", [other_seeds[0], row, other_seeds[1]], 1, 1),
        ("row 1 of 3, beside greedy rows", [greedy[0], row, greedy[0]], 1, 1),
        ("row 2 of 4 copies of itself", [row, row, row, row], 2, 1),
        ("row 2 of 5, beside unseeded rows, shared generator seeded otherwise", middle, 2, 2),
    ]
    if others:
        compositions.append(
            (f"last of {len(together)}, beside the other seeded requests", together,
             len(together) - 1, 1)
        )
    return compositions


def _batch(rows: Sequence[SeedRow], dtype: torch.dtype) -> tuple[
    torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, tuple[Request, ...]
]:
    k = SEED_CONTRACT_K
    logits = torch.stack([r.logits for r in rows]).to(dtype)
    with_q = rows[0].draft_probs is not None
    q = None
    if with_q:
        # Draft probabilities stay float32: a bfloat16 row cannot sum to 1 within the
        # protocol's 1e-5 (the serving battery's bfloat16 cases do the same).
        q = torch.stack([r.draft_probs for r in rows if r.draft_probs is not None]).to(
            torch.float32
        )
    drafts = torch.full((len(rows), k), PLACEHOLDER, dtype=torch.int64)
    for b, r in enumerate(rows):
        drafts[b, : len(r.drafts)] = torch.tensor(r.drafts, dtype=torch.int64)
    counts = torch.tensor([len(r.drafts) for r in rows], dtype=torch.int64)
    return logits, q, drafts, counts, tuple(r.request for r in rows)


def seed_contract_observations(
    verifier: ServingVerifier,
    seed: int,
    timeout_s: float | None,
    progress: Callable[[int], None] | None = None,
) -> list[SeedObservation]:
    """Call ``verifier`` on every composition of every seeded request, at float32 and bfloat16.

    Args:
        verifier: the serving verifier.
        seed: the unit's seed (rows, request seeds and the shared generators derive from it).
        timeout_s: seconds one call may take.
        progress: called with the rows of each finished call.

    Returns:
        One :class:`SeedObservation` per (request, dtype, composition), the ``alone``
        composition first for each request.

    Raises:
        ProtocolViolation: an output of the wrong shape, dtype or layout (the message names
            the composition).
        Exception: what the verifier raised (timeouts and crashes included).
    """
    seeded, neighbours = seed_contract_rows(seed)
    observations = []
    for dtype in (torch.float32, torch.bfloat16):
        dtype_name = str(dtype).removeprefix("torch.")
        for row in seeded:
            with_q = row.draft_probs is not None
            others = [r for r in seeded if r is not row and (r.draft_probs is not None) == with_q]
            for description, rows, index, generator_seed in _compositions(
                row, others, neighbours[with_q]
            ):
                logits, q, drafts, counts, requests = _batch(rows, dtype)
                generator = torch.Generator().manual_seed(
                    derive_seed(seed, "seed-contract generator", generator_seed)
                )
                output = call_target(
                    verifier, logits, q, drafts, counts, requests, generator,
                    timeout_s=timeout_s,
                )
                try:
                    validate_serving_output(output, drafts, counts, SEED_CONTRACT_VOCAB)
                except InvalidInputError as error:
                    raise ProtocolViolation(f"seed contract, {description}: {error}") from None
                observations.append(
                    SeedObservation(
                        f"{row.label} [{dtype_name} logits]",
                        description,
                        tuple(int(t) for t in output[index].tolist()),
                    )
                )
                if progress is not None:
                    progress(len(rows))
    return observations
