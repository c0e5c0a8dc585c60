"""The sequence-law check on crafted engines (fast: plain samplers, no speculation): an engine
that samples the target's law passes; one that samples another temperature, leaves the top-k
support, or returns malformed output is LOSSY; greedy engines must equal greedy decoding; the
drafts-accepted warning fires when drafts are (almost) never accepted; capped plans report what
they can detect."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from losslessness.checks import (
    SequencePlan,
    check_drafts_accepted,
    check_greedy_sequences,
    check_sequence_law,
)
from losslessness.checks.sequence_law import GREEDY_SEQUENCE_RUNS
from losslessness.config import RunConfig
from losslessness.engine.draw import generate_sequences
from losslessness.engine.end_to_end import plan_sequence_law
from losslessness.reference.decoding import greedy_decode, sample_autoregressive
from losslessness.reference.processing import SamplingParameters
from losslessness.reference.sequences import exact_sequence_law
from losslessness.reference.toy import MarkovLM
from losslessness.results import (
    SPECULATION_NOT_SHOWN_PREFIX,
    CheckContext,
    CheckKind,
    CheckResult,
    TargetVerdict,
    Verdict,
    design_shortfalls,
    target_verdict,
)

ALPHA = 1e-3
"""Significance level of every identity test here (one per test function)."""

SEED = 11
"""Base seed of the checks' contexts (sequence j of a check uses SEED + j)."""

PROMPT = (2, 0)
TARGET_SAMPLING = SamplingParameters(temperature=0.7, top_k=3)


class PlainSampler:
    """An engine that samples autoregressively from ``model`` with ``sampling`` and reports the
    law with ``reported`` (the target's) as next_token_probs; optionally greedy."""

    def __init__(
        self,
        sampling: SamplingParameters,
        reported: SamplingParameters = TARGET_SAMPLING,
        greedy: bool = False,
    ) -> None:
        self.model = MarkovLM.random(4, order=2, sharpness=1.5, seed=SEED)
        self.vocab_size = 4
        self.sampling = sampling
        self.reported = reported
        self.greedy = greedy

    def next_token_probs(self, prefix_ids: list[int]) -> torch.Tensor:
        return self.model.next_token_probs(prefix_ids, self.reported)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int) -> list[int]:
        def law(prefix: list[int]) -> torch.Tensor:
            return self.model.next_token_probs(prefix, self.sampling)

        if self.greedy:
            return greedy_decode(law, prompt_ids, max_new_tokens)
        generator = torch.Generator().manual_seed(seed)
        return sample_autoregressive(law, prompt_ids, max_new_tokens, generator)


def context(alpha: float = ALPHA) -> CheckContext:
    return CheckContext("crafted", "case", "crafted engine", "hash", alpha, 0.9, 0.1, SEED)


def law_check(engine: object, plan: SequencePlan) -> tuple[CheckResult, float]:
    """Generate the plan's sequences (as the engine's end-to-end unit does) and check them."""
    sequences, inside = generate_sequences(engine, PROMPT, plan.law.new_tokens, plan.n, SEED)  # type: ignore[arg-type]
    return check_sequence_law(sequences, plan, context()), inside


def greedy_check(engine: PlainSampler, new_tokens: int) -> CheckResult:
    """Generate the greedy runs and compare them with greedy decoding of the target's law."""
    sequences, _ = generate_sequences(engine, PROMPT, new_tokens, GREEDY_SEQUENCE_RUNS, SEED)
    expected = greedy_decode(engine.next_token_probs, PROMPT, new_tokens)
    return check_greedy_sequences(sequences, expected, context())


def run(engine: PlainSampler, tv: float = 0.1, max_sequences: int = 50_000) -> tuple:  # type: ignore[type-arg]
    plan = plan_sequence_law(engine, PROMPT, 3, tv, ALPHA, 0.9, max_sequences)
    result, inside = law_check(engine, plan)
    return plan, result, inside


def test_engine_sampling_the_target_law_passes_with_stated_design() -> None:
    """Correct engine: PASS at level 1e-3, with n planned for TV 0.1 at power 0.9 and the
    minimum detectable TV at that n reported (<= 0.1)."""
    plan, result, inside = run(PlainSampler(TARGET_SAMPLING))
    assert result.verdict is Verdict.PASS, result.message
    assert result.n == plan.n and not plan.capped and result.min_detectable_tv <= 0.1
    assert result.p_value is not None and result.p_value > ALPHA
    assert result.details["cells"] == plan.law.n_cells <= 27 and inside > 0


def test_temperature_applied_differently_is_lossy() -> None:
    """An engine sampling at temperature 1.0 while the target's law is at 0.7 (same top-k)."""
    _, result, _ = run(PlainSampler(SamplingParameters(temperature=1.0, top_k=3)))
    assert result.verdict is Verdict.LOSSY
    assert result.p_value is not None and result.p_value <= ALPHA
    assert "most deviant sequence" in result.message


def test_sequence_outside_the_top_k_support_is_an_exact_violation() -> None:
    """Sampling without the top-k filter emits sequences of probability 0 under the target: the
    message names one and the seed that replays it."""
    _, result, _ = run(PlainSampler(SamplingParameters(temperature=0.7)))
    assert result.verdict is Verdict.LOSSY and result.p_value == 0.0
    assert result.details["sequences_outside_support"] > 0
    assert "have probability 0 under the target" in result.message and "seed" in result.message


def test_malformed_output_is_lossy_with_the_seed() -> None:
    """An engine returning L - 1 tokens is reported as malformed, naming the seed."""
    engine = PlainSampler(TARGET_SAMPLING)
    plan = plan_sequence_law(engine, PROMPT, 3, 0.1, ALPHA, 0.9, 1000)
    short = type(
        "Short",
        (),
        {
            "vocab_size": 4,
            "next_token_probs": engine.next_token_probs,
            "generate": lambda self, prompt, n, seed: engine.generate(prompt, n - 1, seed),
        },
    )()
    result, _ = law_check(short, plan)
    assert result.verdict is Verdict.LOSSY
    assert result.message.startswith(f"malformed output: generate(seed={SEED}) returned 2 tokens")


def test_check_is_reproducible_from_its_seed() -> None:
    """Same context seed, same engine: the same statistic (on 2000 sequences: reproducing
    does not need the design's n)."""
    first = run(PlainSampler(TARGET_SAMPLING), max_sequences=2000)[1]
    second = run(PlainSampler(TARGET_SAMPLING), max_sequences=2000)[1]
    assert first.n == 2000
    assert first.statistic == second.statistic and first.seed == SEED


def test_capped_plan_reports_what_it_can_detect() -> None:
    """With max_sequences below the design's n, the plan is capped, needs more than it uses,
    and its minimum detectable TV exceeds the design TV; steps overrides n exactly."""
    engine = PlainSampler(TARGET_SAMPLING)
    plan = plan_sequence_law(engine, PROMPT, 3, 0.05, ALPHA, 0.9, 300)
    assert plan.capped and plan.n == 300 < plan.needed
    assert plan.min_detectable_tv > 0.05
    replay = plan_sequence_law(engine, PROMPT, 3, 0.05, ALPHA, 0.9, 300, steps=123)
    assert replay.n == 123 and not replay.capped


def test_greedy_engine_equal_to_greedy_decoding_passes() -> None:
    """32 runs, all equal to argmax decoding of the target's law."""
    engine = PlainSampler(TARGET_SAMPLING, greedy=True)
    result = greedy_check(engine, 12)
    assert result.verdict is Verdict.PASS and result.n == 32, result.message


def test_greedy_engine_with_another_argmax_is_lossy_at_the_first_difference() -> None:
    """An engine decoding greedily under another law (temperature is argmax-invariant, so a
    different model): LOSSY, naming the first differing position."""
    engine = PlainSampler(TARGET_SAMPLING, greedy=True)
    engine.model = MarkovLM.random(4, order=2, sharpness=1.5, seed=SEED + 1)
    reference = PlainSampler(TARGET_SAMPLING, greedy=True)
    engine.next_token_probs = reference.next_token_probs  # type: ignore[method-assign]
    result = greedy_check(engine, 12)
    assert result.verdict is Verdict.LOSSY
    assert "32 of 32 runs differ from plain greedy decoding" in result.message
    assert "position" in result.message


def test_drafts_accepted_flags_engines_whose_drafts_are_never_accepted() -> None:
    """Below 10% of verify steps accepting any draft: SUBOPTIMAL with the warning; otherwise
    PASS; the histogram is the difference of the two snapshots."""
    weak = check_drafts_accepted({0: 10}, {0: 110, 1: 5}, context())
    assert weak.verdict is Verdict.SUBOPTIMAL and "almost) never accepted" in weak.message
    assert weak.details["accepted_length_counts"] == {"0": 100, "1": 5}
    good = check_drafts_accepted({}, {0: 30, 1: 20, 2: 20, 3: 30}, context())
    assert good.verdict is Verdict.PASS
    assert good.details["share_accepting_more_than_one"] == pytest.approx(0.5)
    assert good.details["mean_accepted_length"] == pytest.approx(1.5)


def test_drafts_accepted_is_skipped_for_engines_that_do_not_report() -> None:
    """No ReportsAcceptedLengths (or no verify steps): SKIPPED, never PASS."""
    assert check_drafts_accepted(None, None, context()).verdict is Verdict.SKIPPED
    assert check_drafts_accepted({1: 4}, {1: 4}, context()).verdict is Verdict.SKIPPED


def test_engine_totals_give_the_acceptance_share_beside_the_models_prediction() -> None:
    """Engines reporting totals (ReportsDraftCounts): PASS with the share and the prediction
    stated; a share under MIN_ACCEPTING_SHARE is the SUBOPTIMAL warning."""
    good = check_drafts_accepted(None, None, context(), counts=(200, 150), predicted=0.8)
    assert good.verdict is Verdict.PASS and good.details["acceptance_rate"] == 0.75
    assert "150 of 200 draft tokens accepted (75.0%); the models predict 80.0%" in good.message
    weak = check_drafts_accepted(None, None, context(), counts=(200, 3))
    assert weak.verdict is Verdict.SUBOPTIMAL


@pytest.mark.parametrize(
    ("before", "after", "counts", "why"),
    [
        (None, None, None, "does not report"),
        (None, None, (0, 0), "no draft token proposed"),
        (None, None, (120, 0), "none of 120 drafts accepted"),
        ({0: 5}, {0: 50}, None, "no draft accepted in 45 verify steps"),
    ],
)
def test_a_whole_engine_that_shows_no_speculation_is_inconclusive_never_lossless(
    before: dict[int, int] | None,
    after: dict[int, int] | None,
    counts: tuple[int, int] | None,
    why: str,
) -> None:
    """With speculation required (an engine target), no counters, no draft proposed or none
    accepted is 'speculation not shown': the law's PASS beside it leaves the target
    INCONCLUSIVE with the reason, whatever the law says."""
    result = check_drafts_accepted(before, after, context(), counts=counts, required=True)
    assert result.verdict is Verdict.SKIPPED and why in result.message
    assert result.message.startswith(SPECULATION_NOT_SHOWN_PREFIX)
    law = context().result("sequence-law", kind=CheckKind.STATISTICAL, n=100,
                           verdict=Verdict.PASS, p_value=0.5, message="law holds",
                           min_detectable_tv=0.1)
    shortfalls = design_shortfalls([law, result], RunConfig())
    assert any("showed no speculation" in reason for reason in shortfalls)
    assert target_verdict([law, result], shortfalls=shortfalls) is TargetVerdict.INCONCLUSIVE


UNFILTERED = SamplingParameters(temperature=1.0)
"""An unfiltered law: every sequence has positive probability (V^L of them)."""


class UnfilteredSampler(PlainSampler):
    """A correct or wrong engine on a 6-token model whose target law is unfiltered."""

    def __init__(self, sampling: SamplingParameters) -> None:
        super().__init__(sampling, reported=UNFILTERED)
        self.model = MarkovLM.random(6, order=2, sharpness=2.0, seed=SEED)
        self.vocab_size = 6


def test_tail_cell_is_the_exact_mass_of_every_pruned_sequence() -> None:
    """With ``min_mass``, the enumerated cells and the tail partition all V^L sequences: summing
    the brute-force probability of every sequence by :meth:`SequenceLaw.cell_of` gives
    ``cell_probs`` exactly, fewer law calls are made than without pruning, and a sequence of
    probability 0 (outside a top-k support) has no cell."""
    engine = UnfilteredSampler(UNFILTERED)
    full = exact_sequence_law(engine.next_token_probs, PROMPT, 3, 6)
    pruned = exact_sequence_law(engine.next_token_probs, PROMPT, 3, 6, min_mass=0.01)
    assert full.tail_mass == 0.0 and full.n_cells == 6**3
    assert 0.0 < pruned.tail_mass < 0.5 and pruned.n_cells < 6**3 / 2
    assert pruned.law_calls < full.law_calls
    by_cell = np.zeros(pruned.n_cells)
    index = full.index()
    for sequence in itertools.product(range(6), repeat=3):
        cell = pruned.cell_of(sequence)
        assert cell is not None
        by_cell[cell] += full.probs[index[sequence]]
    np.testing.assert_allclose(by_cell, pruned.cell_probs, rtol=1e-9, atol=1e-12)
    assert pruned.cell_probs.sum() == pytest.approx(1.0)
    filtered = exact_sequence_law(
        lambda prefix: engine.model.next_token_probs(prefix, SamplingParameters(top_k=2)),
        PROMPT, 3, 6, min_mass=0.05,
    )
    zero = next(t for t in range(6) if filtered.supports[()][t] == 0)
    assert filtered.cell_of((zero, 0, 0)) is None


def test_pooled_tail_keeps_the_level_and_still_catches_a_wrong_temperature() -> None:
    """Unfiltered 6-token law, L = 3, tail below mass 0.005: an engine sampling the law passes
    at level 1e-3; one sampling at temperature 1.5 is LOSSY; the message names the tail."""
    plan = plan_sequence_law(
        UnfilteredSampler(UNFILTERED), PROMPT, 3, 0.1, ALPHA, 0.9, 50_000, min_mass=0.005
    )
    assert plan.law.tail_mass > 0
    right, _ = law_check(UnfilteredSampler(UNFILTERED), plan)
    assert right.verdict is Verdict.PASS, right.message
    assert "tail" in right.message and right.details["tail_mass"] == plan.law.tail_mass
    wrong, _ = law_check(UnfilteredSampler(SamplingParameters(temperature=1.5)), plan)
    assert wrong.verdict is Verdict.LOSSY, wrong.message


def test_an_engine_law_off_its_reference_is_stated_and_the_engines_own_law_is_tested() -> None:
    """ReportsLawAgreement: within tolerance the comparison is kept in the details; beyond it
    the message says so (the verdict is the engine's own law's)."""
    engine = PlainSampler(TARGET_SAMPLING)
    plan = plan_sequence_law(engine, PROMPT, 3, 0.1, ALPHA, 0.9, 50_000)
    sequences, _ = generate_sequences(engine, PROMPT, 3, plan.n, SEED)
    close = {"prefixes": 5.0, "max_abs_difference": 2e-6, "tolerance": 1e-4}
    result = check_sequence_law(sequences, plan, context(), close)
    assert result.verdict is Verdict.PASS and result.details["law_agreement"] == close
    assert "differs from transformers" not in result.message
    far = {**close, "max_abs_difference": 3e-3}
    result = check_sequence_law(sequences, plan, context(), far)
    assert result.verdict is Verdict.PASS
    assert "differs from transformers' on the same weights by up to 0.003" in result.message
