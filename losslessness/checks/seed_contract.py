"""The seed contract: a seeded request's output does not depend on the rest of its batch.

A serving engine promises that a request carrying its own seed reproduces: the same request
(same logits, drafts and history) gives the same tokens whatever else is batched with it and
wherever it sits (vLLM's per-request ``torch.Generator``s in ``SamplingMetadata.generators``,
SGLang's ``sampling_seed``). The check is exact: one difference between two observations of the
same request is proof that the contract is broken, and there are no false alarms. Its failure
is the verdict IRREPRODUCIBLE, not LOSSY: the emitted law can still be right (an engine that
draws a seeded row from the shared stream emits the right law and breaks the contract, as in
SGLang issue 30822 and TensorRT-LLM issue 19487).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from losslessness.checks.ids import SEED_CONTRACT_CHECK_ID
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.stats import exact_check_minimum_detectable_rate

__all__ = ["SeedObservation", "check_seed_contract"]


@dataclass(frozen=True)
class SeedObservation:
    """One seeded request's emitted tokens in one batch composition.

    Attributes:
        request: the label of the seeded request (with its logits dtype): observations with
            the same label must agree.
        composition: how the batch was made (e.g. ``alone (B=1)``, ``row 2 of 5 beside
            unseeded rows``).
        tokens: the row's output, ``k+1`` int token ids padded with -1.
    """

    request: str
    composition: str
    tokens: tuple[int, ...]


def check_seed_contract(
    observations: Sequence[SeedObservation], context: CheckContext
) -> CheckResult:
    """Whether every seeded request gave the same tokens in every composition.

    Args:
        observations: at least one per request; the first observation of each request is the
            one the others are compared with.
        context: the unit's context.

    Returns:
        One exact :class:`~losslessness.results.CheckResult` (``seed.contract``): PASS, or
        IRREPRODUCIBLE naming the first request whose outputs differ, the two compositions and
        both outputs. ``n`` is the number of comparisons, ``statistic`` the number of requests
        found irreproducible; ``min_detectable_tv`` is the smallest per-comparison difference
        rate found with the design's power at that ``n``.

    Raises:
        ValueError: ``observations`` is empty.
    """
    if not observations:
        raise ValueError("observations: need at least one seeded request's output")
    first: dict[str, SeedObservation] = {}
    broken: list[tuple[SeedObservation, SeedObservation]] = []
    comparisons = 0
    for observation in observations:
        reference = first.setdefault(observation.request, observation)
        if reference is observation:
            continue
        comparisons += 1
        if observation.tokens != reference.tokens and all(
            seen.request != observation.request for seen, _ in broken
        ):
            broken.append((reference, observation))
    requests = len(first)
    if broken:
        reference, other = broken[0]
        message = (
            f"seed contract broken for {len(broken)} of {requests} seeded requests: "
            f"{reference.request} gave {list(reference.tokens)} {reference.composition} but "
            f"{list(other.tokens)} {other.composition} (same logits, drafts, history and seed)"
        )
        verdict = Verdict.IRREPRODUCIBLE
    else:
        message = (
            f"{requests} seeded requests gave the same tokens in every composition "
            f"({comparisons} comparisons)"
        )
        verdict = Verdict.PASS
    return context.result(
        SEED_CONTRACT_CHECK_ID,
        kind=CheckKind.EXACT,
        n=comparisons,
        verdict=verdict,
        min_detectable_tv=exact_check_minimum_detectable_rate(comparisons, context.power),
        statistic=float(len(broken)),
        p_value=0.0 if broken else 1.0,
        message=message,
        details={
            "requests": requests,
            "irreproducible": [reference.request for reference, _ in broken],
        },
    )
