"""transformers' ``generate`` end to end: assisted generation and prompt lookup on tiny models.

What is pinned: each generator replays per seed and leaves the caller's RNG alone; its reference
law is the target's logits with temperature, top-k and top-p applied as transformers applies
them; greedy targets equal plain greedy ``generate``; the default adapter is LOSSLESS with
drafts of length 2 accepted in a stated share of verify steps; transformers' documented lossy
``assistant_ensemble_weight=0.5`` is reported LOSSY, once through the exact support part and
once through the chi-square alone.

Runtime: about 17 s on an idle 2-core machine (70 s under heavy load), mostly ``generate``
calls (4-7 ms each idle).
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from losslessness.adapters import Adapter, AdapterUnavailable
from losslessness.adapters.transformers_generate import (
    TEMPERATURE,
    TOP_K,
    TOP_P,
    TransformersGenerator,
    adapter,
    assisted_generation_target,
    prompt_lookup_target,
    tiny_models,
)
from losslessness.config import AuditConfig
from losslessness.engine import run_audit
from losslessness.protocol import (
    EndToEndGenerator,
    InvalidInputError,
    ReportsAcceptedLengths,
)
from losslessness.results import AuditResult, TargetVerdict, Verdict

PASS_SEQUENCES = 600
"""Sequences per sampled target in the pass test: the false-alarm rate does not depend on n
(1e-3 family-wise, seeded), so fewer than the adapter's 2000 keep the test fast."""

MIN_MULTI_TOKEN_SHARE = {
    "transformers-generate/assisted-sampling": 0.25,
    "transformers-generate/assisted-greedy": 0.25,
    "transformers-generate/prompt-lookup-sampling": 0.1,
    "transformers-generate/prompt-lookup-greedy": 0.3,
}
"""Stated share of verify steps that accept 2 drafts (k = 2), per target. Measured at seed 0
with the adapter's 2000 sequences: 0.373, 0.25 (every greedy run: 2, 0, 0, 0), 0.182, 0.333
(2, 1, 0)."""


def audit(target: Any, steps: int, seed: int = 0) -> AuditResult:
    """Audit one end-to-end target alone with exactly ``steps`` sequences."""
    wrapped = Adapter(name="under-test", description="one target", end_to_end=(target,))
    return run_audit([wrapped], AuditConfig(seed=seed, steps=steps))


def check(result: AuditResult, case_id: str, check_id: str) -> Any:
    return next(
        c for c in result.targets[0].checks if c.case_id == case_id and c.check_id == check_id
    )


@pytest.fixture(scope="module")
def default_audit() -> AuditResult:
    return run_audit([adapter()], AuditConfig(seed=0, steps=PASS_SEQUENCES))


def test_generators_follow_the_end_to_end_protocols() -> None:
    """Every target's generator is an EndToEndGenerator that reports accepted lengths."""
    for target in adapter().end_to_end:
        assert isinstance(target.generator, EndToEndGenerator)
        assert isinstance(target.generator, ReportsAcceptedLengths)
        assert target.generator.vocab_size == 8


@pytest.mark.parametrize("build", [assisted_generation_target, prompt_lookup_target])
def test_generate_replays_per_seed_and_leaves_the_global_rng_alone(build: Any) -> None:
    """Same seed, same tokens; different seeds, different tokens somewhere; caller's RNG
    state and thread count unchanged."""
    target = build(new_tokens=3)
    generator = target.generator
    prompt = list(target.prompt_ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(123)
        state = torch.get_rng_state()
        threads = torch.get_num_threads()
        first = [generator.generate(prompt, 3, seed) for seed in range(20)]
        assert torch.equal(torch.get_rng_state(), state)
        assert torch.get_num_threads() == threads
    again = [generator.generate(prompt, 3, seed) for seed in range(20)]
    assert first == again
    assert len({tuple(tokens) for tokens in first}) > 1
    assert all(len(tokens) == 3 for tokens in first)


def hand_processed_law(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> Any:
    """softmax after temperature, top-k and top-p applied by hand in float64 (top-p keeps a
    token when the mass of the tokens more likely than it is below top_p)."""
    scaled = logits.to(torch.float64) / temperature
    kth = scaled.topk(top_k).values[-1]
    scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = scaled.softmax(dim=-1)
    order = probs.argsort(descending=True)
    before = probs[order].cumsum(dim=0) - probs[order]
    removed = torch.zeros_like(probs, dtype=torch.bool)
    removed[order] = before >= top_p
    return scaled.masked_fill(removed, float("-inf")).softmax(dim=-1)


def test_next_token_probs_equals_temperature_top_k_top_p_applied_by_hand() -> None:
    """The reference law is the target's logits under the user's warpers, nothing else."""
    target = assisted_generation_target()
    generator = target.generator
    model = tiny_models().target
    prompt = list(target.prompt_ids)
    prefixes = [prompt, *([*prompt, a] for a in range(8)), *([*prompt, 5, b] for b in range(8))]
    for prefix in prefixes:
        with torch.no_grad():
            logits = model(torch.tensor([prefix])).logits[0, -1]
        expected = hand_processed_law(logits, TEMPERATURE, TOP_K, TOP_P)
        law = generator.next_token_probs(prefix)
        assert law.dtype == torch.float64
        assert torch.equal(law == 0, expected == 0), prefix
        torch.testing.assert_close(law, expected, atol=1e-6, rtol=0)


def test_greedy_next_token_probs_is_the_softmax_of_the_raw_logits() -> None:
    """Greedy decoding applies no warper, so the reference law is the plain softmax."""
    generator = assisted_generation_target(do_sample=False).generator
    prefix = [3, 1, 4, 1, 5]
    with torch.no_grad():
        logits = tiny_models().target(torch.tensor([prefix])).logits[0, -1]
    expected = logits.to(torch.float64).softmax(dim=-1)
    torch.testing.assert_close(generator.next_token_probs(prefix), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("build", [assisted_generation_target, prompt_lookup_target])
def test_greedy_targets_equal_plain_greedy_generate_token_for_token(build: Any) -> None:
    """Assisted greedy and prompt-lookup greedy emit exactly plain greedy ``generate``."""
    target = build(do_sample=False)
    model = tiny_models().target
    for prompt in [list(target.prompt_ids), [0], [7, 6, 5, 4, 3, 2, 1], [1, 2, 1, 2, 1, 2]]:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            plain = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=8,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert target.generator.generate(prompt, 8, seed=0) == plain[0, len(prompt) :].tolist()


def test_step_counts_add_up_to_the_generated_tokens() -> None:
    """Each verify step emits its accepted drafts plus one token: over N calls of L tokens the
    counted steps sum to N L; no step accepts more than it drafted, and k = 2 is drafted."""
    target = assisted_generation_target()
    generator = target.generator
    assert isinstance(generator, TransformersGenerator)
    calls = 40
    for seed in range(calls):
        generator.generate(list(target.prompt_ids), 3, seed)
    accepted = generator.accepted_length_counts()
    drafted = generator.drafted_length_counts()
    assert sum((length + 1) * count for length, count in accepted.items()) == calls * 3
    assert sum(accepted.values()) == sum(drafted.values())
    assert sum(length * count for length, count in accepted.items()) <= sum(
        length * count for length, count in drafted.items()
    )
    assert drafted.get(2, 0) >= calls
    assert accepted.get(2, 0) > 0


def test_default_adapter_is_lossless_with_two_token_drafts_accepted(
    default_audit: AuditResult,
) -> None:
    """Default transformers settings pass every sequence-law and greedy check, and every
    target accepts whole drafts of length 2 in at least its stated share of verify steps."""
    result = default_audit
    assert result.targets[0].verdict is TargetVerdict.LOSSLESS
    for target in adapter().end_to_end:
        law_id = "sequence-greedy" if target.greedy else "sequence-law"
        law = check(result, target.name, law_id)
        assert law.verdict is Verdict.PASS, law.message
        drafts = check(result, target.name, "drafts-accepted")
        assert drafts.verdict is Verdict.PASS, drafts.message
        share = drafts.details["share_accepting_more_than_one"]
        assert share >= MIN_MULTI_TOKEN_SHARE[target.name], drafts.message


def test_sampled_targets_state_their_detectable_tv(default_audit: AuditResult) -> None:
    """The sampled checks report a finite minimum detectable TV at the n they used."""
    for name in ("assisted-sampling", "prompt-lookup-sampling"):
        law = check(default_audit, f"transformers-generate/{name}", "sequence-law")
        assert law.n == PASS_SEQUENCES
        assert 0 < law.min_detectable_tv < 0.5


def test_assistant_ensemble_weight_is_lossy_through_tokens_outside_the_target_support() -> None:
    """With top-k/top-p, ``assistant_ensemble_weight=0.5`` accepts draft tokens the target's
    warpers removed (ratio 1 - w + w p/q = 0.5 at p = 0): about 11% of sequences are
    impossible under the target, so 300 sequences expose it through the exact part."""
    target = assisted_generation_target(assistant_ensemble_weight=0.5)
    result = audit(target, steps=300)
    law = check(result, target.name, "sequence-law")
    assert result.targets[0].verdict is TargetVerdict.LOSSY
    assert law.verdict is Verdict.LOSSY
    assert law.details["sequences_outside_support"] > 0


def test_assistant_ensemble_weight_is_lossy_through_the_chi_square_alone() -> None:
    """Without truncation every sequence is possible, so only the identity test can see the
    ensemble's bias (first token law w p + (1 - w) q, TV 0.11 from p; about 0.2 over the three
    tokens): at 600 sequences its p-value falls below the level (3e-22 measured at 1200) with
    no sequence outside the support."""
    target = assisted_generation_target(assistant_ensemble_weight=0.5, top_k=None, top_p=1.0)
    result = audit(target, steps=PASS_SEQUENCES)
    law = check(result, target.name, "sequence-law")
    assert law.verdict is Verdict.LOSSY, law.message
    assert law.details["sequences_outside_support"] == 0
    assert law.p_value is not None and law.p_value <= result.per_assertion_alpha


class SilentModel:
    """A model whose ``generate`` never builds a candidate generator (a future transformers
    that moved the hook): the generator must refuse to report zero verify steps."""

    config = SimpleNamespace(vocab_size=8)

    def _get_candidate_generator(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("not called")

    def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        new = kwargs["generation_config"].max_new_tokens
        return torch.cat([input_ids, torch.zeros(1, new, dtype=torch.int64)], dim=1)


def test_generate_raises_when_the_step_hook_is_never_called() -> None:
    generator = TransformersGenerator(
        SilentModel(), SimpleNamespace(max_new_tokens=None), prompt_lookup_num_tokens=2
    )
    with pytest.raises(RuntimeError, match="no verify step"):
        generator.generate([1, 2], 3, seed=0)


@pytest.mark.parametrize(
    ("prompt", "new_tokens", "seed", "argument"),
    [
        ([], 3, 0, "prompt_ids"),
        ([1, 8], 3, 0, "prompt_ids"),
        ([1, -1], 3, 0, "prompt_ids"),
        ([1.0, 2], 3, 0, "prompt_ids"),
        ([1, 2], 0, 0, "max_new_tokens"),
        ([1, 2], 2.0, 0, "max_new_tokens"),
        ([1, 2], 3, -1, "seed"),
        ([1, 2], 3, 2**64, "seed"),
    ],
)
def test_bad_generate_arguments_are_named(
    prompt: Any, new_tokens: Any, seed: Any, argument: str
) -> None:
    generator = assisted_generation_target().generator
    with pytest.raises(InvalidInputError) as raised:
        generator.generate(prompt, new_tokens, seed)
    assert raised.value.argument == argument


@pytest.mark.parametrize(
    ("options", "argument"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"draft_length": 0}, "draft_length"),
        ({"new_tokens": 0}, "new_tokens"),
        ({"assistant_ensemble_weight": 1.0}, "assistant_ensemble_weight"),
    ],
)
def test_bad_builder_options_are_named(options: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        assisted_generation_target(**options)


def test_bad_prompt_is_named() -> None:
    with pytest.raises(InvalidInputError, match=r"^prompt_ids:"):
        prompt_lookup_target(prompt_ids=[9])


def test_adapter_is_unavailable_without_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(AdapterUnavailable, match="transformers is not installed"):
        adapter()
