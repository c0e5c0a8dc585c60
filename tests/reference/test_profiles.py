"""Engine semantics profiles: each law is a distribution, all-off is the softmax, greedy is the
engine's argmax, each processor moves the law as its formula says (hand-computed cases, ties at
the cut-offs included), engines differ where their sources differ, and ``position_laws`` feeds
the drafts into the history."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings

from losslessness.reference.profiles import PROFILES, EngineProfile, get_profile, position_laws
from losslessness.reference.profiles.steps import NoTokenLeft
from losslessness.requests import Request, UnsupportedRequest
from strategies.requests import ProfileInput, profile_inputs

NAMES = sorted(PROFILES)


def _law(
    name: str, logits: list[float], request: Request, history: tuple[int, ...] = ()
) -> torch.Tensor:
    return get_profile(name).law(torch.tensor(logits, dtype=torch.float64), request, history)


def _expect(law: torch.Tensor, expected: list[float]) -> None:
    torch.testing.assert_close(law, torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=0)


def _softmax(values: list[float]) -> list[float]:
    return torch.softmax(torch.tensor(values, dtype=torch.float64), dim=-1).tolist()


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def _supported(profile: EngineProfile, case: ProfileInput) -> torch.Tensor | None:
    logits, request, history = case
    try:
        return profile.law(logits, request, history)
    except (UnsupportedRequest, NoTokenLeft):
        return None


@pytest.mark.parametrize("name", NAMES)
@settings(deadline=None)
@given(case=profile_inputs())
def test_every_profile_law_is_a_distribution(name: str, case: ProfileInput) -> None:
    """Every profile maps every supported (logits, request, history) to a float64 law: finite,
    non-negative, summing to 1, zero on ``-inf`` logits, one-hot when greedy."""
    law = _supported(PROFILES[name], case)
    if law is None:
        return
    logits, request, _ = case
    assert law.dtype == torch.float64 and law.shape == logits.shape
    assert bool(torch.isfinite(law).all()) and bool((law >= 0).all())
    assert abs(float(law.sum()) - 1.0) < 1e-12
    assert bool((law[logits == -math.inf] == 0).all())
    if request.greedy:
        assert sorted(law.tolist())[-1] == 1.0


@pytest.mark.parametrize("name", NAMES)
@settings(deadline=None)
@given(case=profile_inputs(fields=()))
def test_all_off_request_is_the_softmax_for_every_profile(name: str, case: ProfileInput) -> None:
    """A request with every field off (T = 1) gives ``softmax(logits)`` under every profile,
    whatever the history."""
    logits, request, history = case
    law = PROFILES[name].law(logits, request, history)
    torch.testing.assert_close(law, torch.softmax(logits, dim=-1), atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_is_the_one_hot_of_the_first_argmax(name: str) -> None:
    """Temperature 0 gives the one-hot of the first maximal processed logit (ties at the
    maximum go to the lower id; the filters never move it)."""
    request = Request(temperature=0.0, top_k=1, top_p=0.1, min_p=0.9)
    _expect(_law(name, [0.0, 2.0, 2.0, 1.0], request), [0.0, 1.0, 0.0, 0.0])
    biased = Request(temperature=0.0, logit_bias=((3, 1.5),))
    _expect(_law(name, [0.0, 2.0, 2.0, 1.0], biased), [0.0, 0.0, 0.0, 1.0])


@pytest.mark.parametrize("name", NAMES)
def test_temperature_divides_the_logits(name: str) -> None:
    """T scales the logits: the law is ``softmax(logits / T)``."""
    _expect(_law(name, [1.0, 0.0, -1.0], Request(temperature=0.5)), _softmax([2.0, 0.0, -2.0]))


@pytest.mark.parametrize("name", ["transformers", "vllm-v1"])
def test_repetition_penalty_reads_the_prompt_and_the_history(name: str) -> None:
    """CTRL's penalty divides a positive logit and multiplies a negative one of every token in
    the prompt or the history; the other tokens keep theirs."""
    request = Request(repetition_penalty=2.0, prompt_token_ids=(0,))
    law = _law(name, [1.0, -1.0, 0.5], request, history=(1,))
    _expect(law, _softmax([0.5, -2.0, 0.5]))


def test_vllm_penalties_follow_openai_on_the_output_only() -> None:
    """vLLM v1: frequency subtracts per occurrence in the output, presence once; prompt tokens
    pay only the repetition penalty (``apply_penalties``)."""
    request = Request(frequency_penalty=0.5, presence_penalty=0.25, prompt_token_ids=(2,))
    law = _law("vllm-v1", [0.0, 0.0, 0.0], request, history=(0, 0, 1))
    _expect(law, _softmax([-1.25, -0.75, 0.0]))


def test_vllm_applies_logit_bias_before_the_repetition_penalty() -> None:
    """vLLM v1 runs ``LogitBiasLogitsProcessor`` before ``apply_penalties``: 0.5 - 1 = -0.5,
    then times r = 2 gives -1 (penalty first would give 0.25 - 1 = -0.75)."""
    request = Request(logit_bias=((0, -1.0),), repetition_penalty=2.0, prompt_token_ids=(0,))
    _expect(_law("vllm-v1", [0.5, 0.0], request), _softmax([-1.0, 0.0]))
    _expect(_law("transformers", [0.5, 0.0], request), _softmax([-1.0, 0.0]))


@pytest.mark.parametrize("name", NAMES)
def test_masks_remove_their_tokens(name: str) -> None:
    """Allowed ids keep only themselves, bad ids are removed, the rest renormalise."""
    _expect(_law(name, [0.0, 0.0, 0.0, 0.0], Request(allowed_token_ids=(1, 3))), [0, 0.5, 0, 0.5])
    _expect(_law(name, [0.0, 0.0, 0.0, 0.0], Request(bad_token_ids=(0,))), [0, 1 / 3, 1 / 3, 1 / 3])


@pytest.mark.parametrize("name", NAMES)
def test_min_tokens_masks_stop_tokens_until_enough_were_emitted(name: str) -> None:
    """Stop tokens are ``-inf`` while fewer than ``min_tokens`` tokens were emitted, free after."""
    request = Request(min_tokens=2, stop_token_ids=(2,))
    _expect(_law(name, [0.0, 0.0, 0.0], request, history=(0,)), [0.5, 0.5, 0.0])
    _expect(_law(name, [0.0, 0.0, 0.0], request, history=(0, 1)), [1 / 3, 1 / 3, 1 / 3])


def test_transformers_never_masks_a_bad_token_that_is_a_stop_token() -> None:
    """``NoBadWordsLogitsProcessor`` drops bad words equal to an eos id: bad token 1 that is
    also a stop token keeps its mass; vLLM masks it."""
    request = Request(bad_token_ids=(1,), stop_token_ids=(1,))
    _expect(_law("transformers", [0.0, 0.0], request), [0.5, 0.5])
    _expect(_law("vllm-v1", [0.0, 0.0], request), [1.0, 0.0])


def test_transformers_refuses_openai_penalties() -> None:
    """transformers has no frequency or presence processor: the profile says so, naming the
    field and the engine."""
    with pytest.raises(UnsupportedRequest, match=r"transformers.*frequency_penalty"):
        _law("transformers", [0.0, 0.0], Request(frequency_penalty=0.5))
    with pytest.raises(UnsupportedRequest, match=r"transformers.*presence_penalty"):
        _law("transformers", [0.0, 0.0], Request(presence_penalty=0.5))


def test_top_k_ties_vllm_keeps_exactly_k_transformers_keeps_all() -> None:
    """Three tokens tied at the 2nd logit, k = 2: vLLM's Triton kernel keeps exactly two (the
    lower ids), transformers' ``TopKLogitsWarper`` keeps all three."""
    request = Request(top_k=2)
    _expect(_law("vllm-v1", [1.0, 1.0, 1.0, 0.0], request), [0.5, 0.5, 0.0, 0.0])
    _expect(_law("transformers", [1.0, 1.0, 1.0, 0.0], request), [1 / 3, 1 / 3, 1 / 3, 0.0])


def test_top_p_tie_at_the_cut_follows_each_engines_order() -> None:
    """p = (0.4, 0.3, 0.3), top_p = 0.6: one of the tied tokens goes. vLLM's Triton kernel keeps
    the lower id; transformers' ascending sort removes the lower id first."""
    logits = [math.log(4.0 / 3.0), 0.0, 0.0]
    request = Request(top_p=0.6)
    _expect(_law("vllm-v1", logits, request), [4 / 7, 3 / 7, 0.0])
    _expect(_law("transformers", logits, request), [4 / 7, 0.0, 3 / 7])


def test_top_p_keeps_until_the_mass_before_reaches_p() -> None:
    """p = (0.5, 0.3, 0.15, 0.05), top_p = 0.7: the mass before token 2 is 0.8 >= 0.7, so
    tokens 0 and 1 stay (both engines)."""
    logits = [math.log(p) for p in (0.5, 0.3, 0.15, 0.05)]
    for name in ("vllm-v1", "transformers"):
        _expect(_law(name, logits, Request(top_p=0.7)), [0.625, 0.375, 0.0, 0.0])


MIN_P_TOP_P_LOGITS = [math.log(p) for p in (0.3, 0.3, 0.2, 0.1, 0.1)]


def test_vllm_min_p_before_top_p_differs_from_transformers_after() -> None:
    """p = (.3, .3, .2, .1, .1), min_p = 0.5, top_p = 0.7. vLLM v1: min-p keeps {0,1,2}, top-p
    on (3/8, 3/8, 2/8) keeps {0,1}: (.5, .5). transformers: top-p on p keeps {0,1,2}, min-p
    keeps them: (3/8, 3/8, 2/8). TV = 0.25."""
    request = Request(top_p=0.7, min_p=0.5)
    vllm = _law("vllm-v1", MIN_P_TOP_P_LOGITS, request)
    hf = _law("transformers", MIN_P_TOP_P_LOGITS, request)
    _expect(vllm, [0.5, 0.5, 0.0, 0.0, 0.0])
    _expect(hf, [0.375, 0.375, 0.25, 0.0, 0.0])
    assert _tv(vllm, hf) == pytest.approx(0.25, abs=1e-12)


def test_vllm_and_transformers_agree_without_min_p() -> None:
    """The same logits with min-p off: both keep {0,1,2} under top_p = 0.7."""
    request = Request(top_p=0.7, top_k=4, temperature=0.9)
    vllm = _law("vllm-v1", MIN_P_TOP_P_LOGITS, request)
    hf = _law("transformers", MIN_P_TOP_P_LOGITS, request)
    assert _tv(vllm, hf) < 1e-12


def test_vllm_raises_tiny_temperatures_to_its_floor() -> None:
    """vLLM's ``SamplingParams`` raises 0 < T < 1e-2 to 1e-2 (and only T = 0 is greedy)."""
    logits = [0.01, 0.0]
    _expect(_law("vllm-v1", logits, Request(temperature=1e-6)), _softmax([1.0, 0.0]))


@pytest.mark.parametrize("name", NAMES)
def test_position_laws_feed_the_drafts_into_the_history(name: str) -> None:
    """Position i's penalties see ``output_token_ids + drafts[:i]``: with a repetition penalty
    2 and draft 0 at position 0, token 0 is penalised from position 1 on only."""
    request = Request(repetition_penalty=2.0, output_token_ids=(1,))
    logits = torch.tensor([[1.0, 1.0, 0.0]] * 3, dtype=torch.float64)
    laws = position_laws(get_profile(name), logits, request, [0, 2])
    _expect(laws[0], _softmax([1.0, 0.5, 0.0]))
    _expect(laws[1], _softmax([0.5, 0.5, 0.0]))
    _expect(laws[2], _softmax([0.5, 0.5, 0.0]))


@pytest.mark.parametrize("name", NAMES)
def test_position_laws_min_tokens_boundary_inside_the_draft_block(name: str) -> None:
    """min_tokens = 3 with one token emitted: the stop token is masked at positions 0 and 1
    (1 and 2 emitted) and free at position 2 (3 emitted), inside a block of k = 3 drafts."""
    request = Request(min_tokens=3, stop_token_ids=(0,), output_token_ids=(1,))
    logits = torch.zeros(4, 2, dtype=torch.float64)
    laws = position_laws(get_profile(name), logits, request, [1, 1, 1])
    assert laws[:, 0].tolist() == [0.0, 0.0, 0.5, 0.5]


def test_position_laws_refuse_a_mismatched_block() -> None:
    """``logits`` must have k + 1 rows for k drafts."""
    with pytest.raises(ValueError, match=r"k\+1"):
        position_laws(get_profile("vllm-v1"), torch.zeros(2, 3), Request(), [0, 1])


def test_profiles_refuse_malformed_inputs() -> None:
    """NaN logits, a request naming a token outside V, a history id outside V: named errors."""
    profile = get_profile("vllm-v1")
    with pytest.raises(ValueError, match="NaN"):
        profile.law(torch.tensor([math.nan, 0.0]), Request(), ())
    with pytest.raises(ValueError, match="V=2"):
        profile.law(torch.zeros(2), Request(bad_token_ids=(5,)), ())
    with pytest.raises(ValueError, match="history"):
        profile.law(torch.zeros(2), Request(), (2,))
    with pytest.raises(ValueError, match="unknown engine profile"):
        get_profile("no-such-engine")
