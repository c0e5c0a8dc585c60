"""Sequence law (docs/architecture.md, 'What lossless means', item 8): a whole engine's output
follows the target.

A speculative-decoding engine is lossless end to end when the law of the first L tokens it
generates equals the target's autoregressive law with the user's sampling parameters,
``prod_t p(x_t | prompt, x_<t)``. This sees the plumbing around the accept/reject rule that
the chain checks cannot: sampling parameters applied to the target and not the draft, q not
matching how the draft was chosen, the wrong logit row after a rollback, lost seeds.

Three checks per end-to-end target:

- ``sequence-law`` (statistical, one assertion): ``n`` sequences from
  ``generate(prompt, L, seed_j)`` are identity-tested (:func:`losslessness.stats.identity_test`)
  against the exact law enumerated from ``next_token_probs``
  (:func:`losslessness.reference.sequences.exact_sequence_law`); a sequence outside its
  support is an exact violation. ``n`` is planned for the design TV and power at the
  per-assertion level (:func:`plan_sequence_law`).
- ``sequence-greedy`` (exact, greedy engines): every run equals plain greedy decoding of
  ``next_token_probs`` token for token.
- ``drafts-accepted`` (exact, a warning): how many verify steps accepted each number of drafts
  (:class:`~losslessness.protocol.ReportsAcceptedLengths`), or how many draft tokens were
  proposed and accepted in total (:class:`~losslessness.protocol.ReportsDraftCounts`). An
  engine whose drafts are (almost) never accepted passes the law trivially, since it is then
  plain decoding: when fewer than :data:`MIN_ACCEPTING_SHARE` of its verify steps (or drafted
  tokens) accepted a draft, the result is SUBOPTIMAL with that warning (the law's verdict is
  unchanged). A whole engine audited with speculation on must show it: with no counters or no
  draft accepted the check is SKIPPED as "speculation not shown" and the target INCONCLUSIVE
  (:data:`~losslessness.results.SPECULATION_NOT_SHOWN_PREFIX`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from losslessness.checks.ids import (
    DRAFTS_ACCEPTED_CHECK_ID,
    SEQUENCE_GREEDY_CHECK_ID,
    SEQUENCE_LAW_CHECK_ID,
)
from losslessness.reference.sequences import SequenceLaw
from losslessness.results import (
    SPECULATION_NOT_SHOWN_PREFIX,
    CheckContext,
    CheckKind,
    CheckResult,
    Verdict,
)
from losslessness.stats import exact_check_minimum_detectable_rate, identity_test

__all__ = [
    "GREEDY_SEQUENCE_RUNS",
    "MIN_ACCEPTING_SHARE",
    "SequencePlan",
    "check_drafts_accepted",
    "check_greedy_sequences",
    "check_sequence_law",
    "end_to_end_case_hash",
    "sequence_seed",
]

MIN_ACCEPTING_SHARE = 0.1
"""Below this share of verify steps accepting at least one draft, ``drafts-accepted`` warns
that the audit exercised the accept path too little to say much (it was mostly plain
decoding). 10% is a judgement call: a working drafter on the toy and transformers targets
accepts in well over half of its steps, a broken or mismatched one in almost none."""

GREEDY_SEQUENCE_RUNS = 32
"""Seeds a greedy engine is run with: greedy output must not depend on the seed at all."""


def sequence_seed(base_seed: int, index: int) -> int:
    """Seed of the ``index``-th generated sequence of a check whose seed is ``base_seed``."""
    return (base_seed + index) % 2**63


def end_to_end_case_hash(prompt_ids: Sequence[int], new_tokens: int, greedy: bool) -> str:
    """Short hash pinning what an end-to-end case asks for (prompt, L, greedy)."""
    text = f"{list(prompt_ids)}|{new_tokens}|{greedy}"
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


@dataclass(frozen=True)
class SequencePlan:
    """How many sequences a sequence-law check generates, and what that detects.

    Attributes:
        law: the exact law of the first L tokens.
        n: sequences to generate.
        needed: sequences the design (tv, alpha, power) asks for, before the cap.
        capped: True when the cap cut ``needed``.
        min_detectable_tv: the smallest TV detected with the design power at ``n``.
    """

    law: SequenceLaw
    n: int
    needed: int
    capped: bool
    min_detectable_tv: float


def _malformed(sequence: object, new_tokens: int, vocab_size: int) -> str | None:
    if not isinstance(sequence, list | tuple):
        return f"returned a {type(sequence).__name__}, not a list of token ids"
    if len(sequence) != new_tokens:
        return f"returned {len(sequence)} tokens, expected {new_tokens}: {list(sequence)}"
    for token in sequence:
        if isinstance(token, bool) or not isinstance(token, int | np.integer):
            return f"returned a non-integer token {token!r}"
        if not 0 <= int(token) < vocab_size:
            return f"returned token id {int(token)} outside [0, {vocab_size})"
    return None


def check_sequence_law(
    sequences: Sequence[Any],
    plan: SequencePlan,
    context: CheckContext,
    law_agreement: dict[str, float] | None = None,
) -> CheckResult:
    """Identity-test an engine's generated sequences against ``plan.law``.

    Args:
        sequences: the ``plan.n`` values ``generate(prompt, L, sequence_seed(context.seed, j))``
            returned (each should be a list of L token ids).
        plan: the law and the test's size (from
            :func:`losslessness.engine.end_to_end.plan_sequence_law`).
        context: the case's context (its ``alpha`` is the per-assertion level; its
            ``sampling_time_s`` the time the sequences took).
        law_agreement: how far the engine's own law (the one tested against) was from a
            reference implementation's on the same weights
            (:class:`~losslessness.protocol.ReportsLawAgreement`): kept in ``details`` and,
            beyond its tolerance, stated in the message.

    Returns:
        The ``sequence-law`` :class:`CheckResult` (LOSSY on a malformed output, a sequence
        outside the law's support, or ``p_value <= alpha``; details: cells, pooled cells and
        mass, the sequence whose count is furthest from its expectation).

    Raises:
        ValueError: naming ``sequences``, when there are not ``plan.n`` of them.
    """
    law = plan.law
    if len(sequences) != plan.n:
        raise ValueError(f"sequences: expected {plan.n}, got {len(sequences)}")
    began = time.perf_counter()
    details: dict[str, Any] = {
        "steps": plan.n,
        "cells": law.n_cells,
        "new_tokens": law.new_tokens,
        "vocab_size": law.vocab_size,
        "needed_sequences": plan.needed,
        "capped": plan.capped,
        "law_calls": law.law_calls,
        "tail_mass": law.tail_mass,
    }
    if law_agreement is not None:
        details["law_agreement"] = law_agreement
    disagreement = ""
    if law_agreement and law_agreement["max_abs_difference"] > law_agreement["tolerance"]:
        disagreement = (
            f"; the engine's law differs from transformers' on the same weights by up to "
            f"{law_agreement['max_abs_difference']:.3g} (> {law_agreement['tolerance']:.3g}): "
            "the law tested is the engine's own"
        )
    common: dict[str, Any] = {
        "kind": CheckKind.STATISTICAL,
        "n": plan.n,
        "min_detectable_tv": plan.min_detectable_tv,
        "details": details,
    }
    for index, sequence in enumerate(sequences):
        problem = _malformed(sequence, law.new_tokens, law.vocab_size)
        if problem is not None:
            seed = sequence_seed(context.seed, index)
            return context.result(
                SEQUENCE_LAW_CHECK_ID,
                verdict=Verdict.LOSSY,
                p_value=0.0,
                message=f"malformed output: generate(seed={seed}) {problem}",
                wall_time_s=time.perf_counter() - began,
                **common,
            )
    cells = law.index()
    outside = law.n_cells
    found = [law.cell_of(sequence, cells) for sequence in sequences]
    observed = np.bincount(
        [outside if cell is None else cell for cell in found], minlength=outside + 1
    )
    probs = np.append(law.cell_probs, 0.0)
    test = identity_test(observed, probs)
    details.update(
        pooled_cells=test.pooled_cells,
        pooled_mass=test.pooled_mass,
        sequences_outside_support=test.zero_mass_count,
    )
    lossy = test.zero_mass_count > 0 or test.pvalue <= context.alpha
    if test.zero_mass_count:
        index = found.index(None)
        message = (
            f"{test.zero_mass_count} of {plan.n} sequences have probability 0 under the target; "
            f"first: {list(sequences[index])} (seed {sequence_seed(context.seed, index)})"
        )
    else:
        expected = law.probs * plan.n
        worst = int(np.argmax(np.abs(observed[: len(law.sequences)] - expected)))
        details["most_deviant"] = {
            "sequence": list(law.sequences[worst]),
            "observed": int(observed[worst]),
            "expected": float(expected[worst]),
        }
        message = (
            f"{law.n_cells} cells (L={law.new_tokens}, V={law.vocab_size}"
            f"{f', tail {law.tail_mass:.3g}' if law.tail_mass else ''}), p-value "
            f"{test.pvalue:.3g} {'<=' if lossy else '>'} alpha {context.alpha:.3g}; most "
            f"deviant sequence {list(law.sequences[worst])}: observed {int(observed[worst])}, "
            f"expected {expected[worst]:.1f}{disagreement}"
        )
    return context.result(
        SEQUENCE_LAW_CHECK_ID,
        verdict=Verdict.LOSSY if lossy else Verdict.PASS,
        statistic=test.statistic,
        df=test.df,
        p_value=0.0 if test.zero_mass_count else test.pvalue,
        message=message,
        wall_time_s=time.perf_counter() - began,
        **common,
    )


def check_greedy_sequences(
    sequences: Sequence[Any], expected: list[int], context: CheckContext
) -> CheckResult:
    """Greedy engines: the sequences ``generate(prompt, L, sequence_seed(context.seed, j))``
    returned must each equal plain greedy decoding of ``next_token_probs``.

    Args:
        sequences: what the engine returned, one per seed.
        expected: the L tokens of plain greedy decoding (argmax, lowest index on ties:
            :func:`losslessness.reference.decoding.greedy_decode`).
        context: the case's context.

    Returns:
        The exact ``sequence-greedy`` :class:`CheckResult` (LOSSY with the first differing
        position).
    """
    began = time.perf_counter()
    runs, new_tokens = len(sequences), len(expected)
    wrong = [j for j, sequence in enumerate(sequences) if list(sequence) != expected]
    message = f"all {runs} runs equal plain greedy decoding ({new_tokens} tokens)"
    if wrong:
        got = list(sequences[wrong[0]])
        position = next(
            (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
            min(len(got), len(expected)),
        )
        message = (
            f"{len(wrong)} of {runs} runs differ from plain greedy decoding; first: seed "
            f"{sequence_seed(context.seed, wrong[0])}, position {position}: expected "
            f"{expected}, got {got}"
        )
    return context.result(
        SEQUENCE_GREEDY_CHECK_ID,
        kind=CheckKind.EXACT,
        n=runs,
        verdict=Verdict.LOSSY if wrong else Verdict.PASS,
        statistic=float(len(wrong)),
        p_value=0.0 if wrong else 1.0,
        min_detectable_tv=exact_check_minimum_detectable_rate(runs, context.power),
        wall_time_s=time.perf_counter() - began,
        message=message,
        details={"steps": runs, "new_tokens": new_tokens, "expected": expected},
    )


def check_drafts_accepted(
    before: dict[int, int] | None,
    after: dict[int, int] | None,
    context: CheckContext,
    counts: tuple[int, int] | None = None,
    required: bool = False,
    predicted: float | None = None,
) -> CheckResult:
    """Whether the audited runs really exercised speculation (see the module docstring).

    Args:
        before: :func:`accepted_length_snapshot` before the runs (None: not reported).
        after: the snapshot after them.
        context: the case's context.
        counts: (drafted, accepted) draft tokens during the runs, for engines that report
            totals (:class:`~losslessness.protocol.ReportsDraftCounts`); None: not reported.
        required: the target is a whole engine with speculation on
            (``EndToEndTarget.requires_speculation``): no counters, or no draft accepted, is
            then SKIPPED with :data:`~losslessness.results.SPECULATION_NOT_SHOWN_PREFIX`,
            which makes the target INCONCLUSIVE.
        predicted: the share of drafted tokens the models predict accepted, stated beside
            the observed share (None: no prediction).

    Returns:
        The exact ``drafts-accepted`` :class:`CheckResult`: PASS when at least
        :data:`MIN_ACCEPTING_SHARE` of the verify steps accepted one draft or more (of the
        drafted tokens, for engines reporting totals), SUBOPTIMAL (a warning, never LOSSY)
        below it, SKIPPED when the engine reports no counters or no verify step. ``details``
        holds the histogram (accepted length -> verify steps), the verify steps, the shares
        accepting >= 1 and >= 2 drafts, and the mean accepted length; or the drafted and
        accepted totals, their share and the prediction.
    """
    unshown = SPECULATION_NOT_SHOWN_PREFIX if required else ""
    if (before is None or after is None) and counts is not None:
        return _drafts_accepted_from_totals(counts, context, unshown, predicted)
    if before is None or after is None:
        return context.untested(
            DRAFTS_ACCEPTED_CHECK_ID,
            Verdict.SKIPPED,
            f"{unshown}the engine does not report accepted lengths (ReportsAcceptedLengths) or "
            "draft counts (ReportsDraftCounts)",
        )
    histogram = {
        length: after.get(length, 0) - before.get(length, 0)
        for length in sorted(set(before) | set(after))
        if after.get(length, 0) - before.get(length, 0)
    }
    steps = sum(histogram.values())
    if steps == 0:
        return context.untested(
            DRAFTS_ACCEPTED_CHECK_ID, Verdict.SKIPPED,
            f"{unshown}the engine reported no verify steps",
        )
    any_share = sum(c for length, c in histogram.items() if length >= 1) / steps
    if required and any_share == 0:
        return context.untested(
            DRAFTS_ACCEPTED_CHECK_ID, Verdict.SKIPPED,
            f"{unshown}no draft accepted in {steps} verify steps",
        )
    multi_share = sum(c for length, c in histogram.items() if length >= 2) / steps
    mean = sum(length * c for length, c in histogram.items()) / steps
    details = {
        "accepted_length_counts": {str(length): count for length, count in histogram.items()},
        "verify_steps": steps,
        "share_accepting_any": any_share,
        "share_accepting_more_than_one": multi_share,
        "mean_accepted_length": mean,
        "min_accepting_share": MIN_ACCEPTING_SHARE,
    }
    summary = (
        f"{steps} verify steps; accepted lengths {histogram}; >= 1 draft accepted in "
        f"{any_share:.1%}, >= 2 in {multi_share:.1%}; mean accepted length {mean:.3g}"
    )
    return _accepted_result(context, steps, any_share, summary, details, "steps accepted any")


def _accepted_result(
    context: CheckContext,
    n: int,
    share: float,
    summary: str,
    details: dict[str, Any],
    what: str,
) -> CheckResult:
    """PASS, or the SUBOPTIMAL warning when ``share`` (of ``what``) is under
    :data:`MIN_ACCEPTING_SHARE`."""
    weak = share < MIN_ACCEPTING_SHARE
    if weak:
        summary = (
            f"drafts were (almost) never accepted: {summary} (< {MIN_ACCEPTING_SHARE:.0%} of "
            f"{what}). The engine ran as plain decoding, so a passing sequence law says little "
            "about its accept path."
        )
    return context.result(
        DRAFTS_ACCEPTED_CHECK_ID,
        kind=CheckKind.EXACT,
        n=n,
        verdict=Verdict.SUBOPTIMAL if weak else Verdict.PASS,
        statistic=share,
        min_detectable_tv=float("inf"),
        message=summary,
        details=details,
    )


def _drafts_accepted_from_totals(
    counts: tuple[int, int], context: CheckContext, unshown: str, predicted: float | None
) -> CheckResult:
    drafted, accepted = counts
    if drafted == 0 or (unshown and accepted == 0):
        what = "no draft token proposed" if drafted == 0 else f"none of {drafted} drafts accepted"
        return context.untested(
            DRAFTS_ACCEPTED_CHECK_ID, Verdict.SKIPPED, f"{unshown}{what} during the runs"
        )
    share = accepted / drafted
    details: dict[str, Any] = {
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": share,
        "predicted_acceptance": predicted,
        "min_accepting_share": MIN_ACCEPTING_SHARE,
    }
    summary = f"{accepted} of {drafted} draft tokens accepted ({share:.1%})"
    if predicted is not None:
        summary += f"; the models predict {predicted:.1%}"
    return _accepted_result(context, drafted, share, summary, details, "drafted tokens")
