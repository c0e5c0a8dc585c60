"""End-to-end units: planning and sampling the sequence-law checks of a whole engine.

The exact law of the first L tokens is enumerated from the target's ``next_token_probs``
(:func:`losslessness.reference.sequences.exact_sequence_law`) when the run is planned; the unit
generates the sequences (:func:`losslessness.engine.draw.generate_sequences`) and hands them to
the pure checks of :mod:`losslessness.checks.sequence_law`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from losslessness.adapters.base import EndToEndTarget
from losslessness.checks import (
    SequencePlan,
    check_drafts_accepted,
    check_greedy_sequences,
    check_sequence_law,
)
from losslessness.checks.seed_contract import SeedObservation, check_seed_contract
from losslessness.checks.sequence_law import (
    GREEDY_SEQUENCE_RUNS,
    end_to_end_case_hash,
    sequence_seed,
)
from losslessness.config import RunConfig
from losslessness.engine.draw import generate_for_seeds, generate_sequences
from losslessness.protocol import (
    EndToEndGenerator,
    InvalidInputError,
    ReportsAcceptedLengths,
    ReportsDraftCounts,
    ReportsLawAgreement,
)
from losslessness.reference.decoding import greedy_decode
from losslessness.reference.sequences import exact_sequence_law
from losslessness.results import CheckContext, CheckResult
from losslessness.seeding import derive_seed
from losslessness.stats import identity_minimum_detectable_tv, plan_identity_test

SEED_REPLAYS = 16
"""Sequences an engine that promises reproducible seeds generates a second time, in reverse
order after the run (a batching engine gets them as one batch of another size, each request at
another place in it)."""


def plan_sequence_law(
    generator: EndToEndGenerator,
    prompt_ids: Sequence[int],
    new_tokens: int,
    tv: float,
    alpha: float,
    power: float,
    max_sequences: int,
    steps: int | None = None,
    step_multiplier: float = 1.0,
    min_mass: float = 0.0,
) -> SequencePlan:
    """Enumerate the exact law and size the identity test.

    Args:
        generator: the engine; only ``next_token_probs`` and ``vocab_size`` are used.
        prompt_ids: the prompt.
        new_tokens: L.
        tv: design TV distance in (0, 1].
        alpha: per-assertion significance level.
        power: design power.
        max_sequences: cap on the design's ``n``.
        steps: when set, ``n`` is exactly this (replays).
        step_multiplier: multiple of the design's (capped) ``n`` to draw.
        min_mass: prefixes and sequences below it pooled into the law's tail cell
            (:func:`losslessness.reference.sequences.exact_sequence_law`).

    Returns:
        :class:`~losslessness.checks.SequencePlan`.

    Raises:
        ValueError: from :func:`losslessness.reference.sequences.exact_sequence_law` (too many
            cells) or the planners.
        InvalidInputError: ``next_token_probs`` returned a malformed row.
        Exception: whatever ``next_token_probs`` raised.
    """
    law = exact_sequence_law(
        generator.next_token_probs, prompt_ids, new_tokens, generator.vocab_size,
        min_mass=min_mass,
    )
    design = plan_identity_test(law.cell_probs, tv, alpha, power, max_n=max_sequences)
    # When capped, report what the design would need, so the user sees what the cap cost.
    needed = plan_identity_test(law.cell_probs, tv, alpha, power).n if design.capped else design.n
    n = steps if steps is not None else max(1, math.ceil(design.n * step_multiplier))
    reached = identity_minimum_detectable_tv(law.cell_probs, n, alpha, power).minimum_detectable_tv
    return SequencePlan(law, n, needed, steps is None and design.capped, reached)


@dataclass
class EndToEndPlan:
    """One end-to-end target's plan: its law and n (sampled engines), or why planning failed.

    Attributes:
        target: the engine and its prompt.
        seed: the seed of its sequences (``derive_seed(run seed, "end-to-end", name)``).
        plan: the law and the test's size (None for greedy engines, or when planning failed).
        error: what planning raised, if it did.
    """

    target: EndToEndTarget
    seed: int
    plan: SequencePlan | None = None
    error: BaseException | None = None

    @property
    def planned_runs(self) -> int:
        """Sequences the unit will generate."""
        if self.target.greedy:
            return GREEDY_SEQUENCE_RUNS
        return self.plan.n if self.plan is not None else 0

    @property
    def case_hash(self) -> str:
        """Pins what the case asks for (prompt, L, greedy)."""
        target = self.target
        return end_to_end_case_hash(target.prompt_ids, target.new_tokens, target.greedy)


def plan_end_to_end(target: EndToEndTarget, config: RunConfig, alpha: float) -> EndToEndPlan:
    """Plan one end-to-end target (planning errors are kept, to be reported by its unit)."""
    seed = derive_seed(config.seed, "end-to-end", target.name)
    if target.greedy:
        return EndToEndPlan(target, seed)
    cap = min(config.max_steps, target.max_sequences or config.max_steps)
    try:
        plan = plan_sequence_law(
            target.generator,
            target.prompt_ids,
            target.new_tokens,
            config.tv,
            alpha,
            config.power,
            cap,
            config.steps,
            config.step_multiplier,
            target.min_sequence_mass,
        )
    except Exception as error:
        return EndToEndPlan(target, seed, error=error)
    return EndToEndPlan(target, seed, plan)


def accepted_length_snapshot(generator: object) -> dict[int, int] | None:
    """The generator's accepted-length counts now, or None if it does not report them."""
    if not isinstance(generator, ReportsAcceptedLengths):
        return None
    return {int(length): int(count) for length, count in generator.accepted_length_counts().items()}


def draft_count_snapshot(generator: object) -> tuple[int, int] | None:
    """The generator's (drafted, accepted) totals now, or None if it does not report them.

    Raises:
        InvalidInputError: naming ``draft_counts`` when the counts are malformed.
    """
    if not isinstance(generator, ReportsDraftCounts):
        return None
    counts = generator.draft_counts()
    try:
        drafted, accepted = int(counts["drafted"]), int(counts["accepted"])
    except (KeyError, TypeError, ValueError) as error:
        raise InvalidInputError(
            "draft_counts", f"expected {{'drafted': int, 'accepted': int}}, got {counts!r}"
        ) from error
    if not 0 <= accepted <= drafted:
        raise InvalidInputError(
            "draft_counts", f"expected 0 <= accepted <= drafted, got {counts!r}"
        )
    return drafted, accepted


@dataclass
class EndToEndSamples:
    """What one end-to-end unit drew.

    Attributes:
        sequences: what ``generate`` returned, one per seed.
        inside_s: seconds spent inside ``generate``.
        wall_time_s: seconds the unit's sampling took.
        before, after: accepted-length snapshots around the runs (None: not reported).
        counts_before, counts_after: (drafted, accepted) totals around the runs (None: not
            reported).
        replayed: the first :data:`SEED_REPLAYS` sequences generated again with their seeds
            after the runs (None: the target does not promise reproducible seeds).
        law_agreement: the engine's law against transformers' (None: not compared).
    """

    sequences: list[object]
    inside_s: float
    wall_time_s: float
    before: dict[int, int] | None
    after: dict[int, int] | None
    counts_before: tuple[int, int] | None = None
    counts_after: tuple[int, int] | None = None
    replayed: list[object] | None = None
    law_agreement: dict[str, float] | None = None


def sample_end_to_end(
    entry: EndToEndPlan,
    progress: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
) -> EndToEndSamples:
    """Generate the unit's sequences.

    Raises:
        TargetTimeout: a call took longer than ``timeout_s``.
        Exception: whatever the engine raised, unchanged.
    """
    target = entry.target
    began = time.perf_counter()
    before = accepted_length_snapshot(target.generator)
    counts_before = draft_count_snapshot(target.generator)
    sequences, inside = generate_sequences(
        target.generator,
        target.prompt_ids,
        target.new_tokens,
        entry.planned_runs,
        entry.seed,
        progress,
        timeout_s,
    )
    after = accepted_length_snapshot(target.generator)
    counts_after = draft_count_snapshot(target.generator)
    replayed = None
    if target.reproducible_seeds:
        # In reverse order: each replayed request sits elsewhere in its batch, beside others.
        seeds = [sequence_seed(entry.seed, index)
                 for index in range(min(SEED_REPLAYS, len(sequences)))]
        backwards, _ = generate_for_seeds(
            target.generator, target.prompt_ids, target.new_tokens, seeds[::-1], None,
            timeout_s,
        )
        replayed = backwards[::-1]
    agreement = None
    if isinstance(target.generator, ReportsLawAgreement):
        agreement = {k: float(v) for k, v in target.generator.law_agreement().items()}
    return EndToEndSamples(
        sequences, inside, time.perf_counter() - began, before, after, counts_before,
        counts_after, replayed, agreement,
    )


def end_to_end_checks(
    entry: EndToEndPlan, samples: EndToEndSamples, context: CheckContext
) -> list[CheckResult]:
    """The law check (sequence-law, or sequence-greedy for greedy engines) and drafts-accepted
    on one unit's samples."""
    target = entry.target
    if entry.plan is not None:
        law = check_sequence_law(samples.sequences, entry.plan, context, samples.law_agreement)
    else:
        expected = greedy_decode(
            target.generator.next_token_probs, target.prompt_ids, target.new_tokens
        )
        law = check_greedy_sequences(samples.sequences, expected, context)
    counts = None
    if samples.counts_before is not None and samples.counts_after is not None:
        counts = (
            samples.counts_after[0] - samples.counts_before[0],
            samples.counts_after[1] - samples.counts_before[1],
        )
    accepted = check_drafts_accepted(
        samples.before, samples.after, context, counts=counts,
        required=target.requires_speculation, predicted=target.predicted_acceptance,
    )
    checks = [law, accepted]
    if samples.replayed is not None:
        observations = [
            SeedObservation(
                f"sequence seed {sequence_seed(entry.seed, index)}", composition,
                tuple(run) if isinstance(run, list | tuple) else (repr(run),),  # type: ignore[arg-type]
            )
            for index, (first, again) in enumerate(
                zip(samples.sequences, samples.replayed, strict=False)
            )
            for composition, run in (
                ("in the run", first), ("generated again after it, in reverse order", again)
            )
        ]
        checks.append(check_seed_contract(observations, context))
    return checks
