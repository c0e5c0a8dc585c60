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
VLLM = ["vllm-v1", "vllm-v2"]
SGLANG = ["sglang-flashinfer", "sglang-torch"]
FLASHINFER = ["flashinfer", "flashinfer-joint"]
SERVING = [name for name in NAMES if name not in FLASHINFER]
"""Engines with a greedy path, logit bias and penalties (FlashInfer is a kernel library)."""
REPETITION_READS_PROMPT = ["llama.cpp", "transformers", *VLLM]
MIN_TOKENS = ["transformers", *SGLANG, *VLLM]
BAD_TOKENS = ["llama.cpp", "transformers", *VLLM]
ALLOWED_TOKENS = ["transformers", *VLLM]


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


@pytest.mark.parametrize("name", SERVING)
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


@pytest.mark.parametrize("name", REPETITION_READS_PROMPT)
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


@pytest.mark.parametrize("name", ALLOWED_TOKENS)
def test_allowed_tokens_keep_only_themselves(name: str) -> None:
    """Allowed ids keep only themselves; they renormalise."""
    _expect(_law(name, [0.0, 0.0, 0.0, 0.0], Request(allowed_token_ids=(1, 3))), [0, 0.5, 0, 0.5])


@pytest.mark.parametrize("name", BAD_TOKENS)
def test_bad_tokens_are_removed(name: str) -> None:
    """Bad ids are removed; the rest renormalise."""
    _expect(_law(name, [0.0, 0.0, 0.0, 0.0], Request(bad_token_ids=(0,))), [0, 1 / 3, 1 / 3, 1 / 3])


@pytest.mark.parametrize("name", MIN_TOKENS)
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


@pytest.mark.parametrize("name", SERVING)
def test_position_laws_feed_the_drafts_into_the_history(name: str) -> None:
    """Position i's penalties see ``output_token_ids + drafts[:i]``: with a repetition penalty
    2 and draft 0 at position 0, token 0 is penalised from position 1 on only."""
    request = Request(repetition_penalty=2.0, output_token_ids=(1,))
    logits = torch.tensor([[1.0, 1.0, 0.0]] * 3, dtype=torch.float64)
    laws = position_laws(get_profile(name), logits, request, [0, 2])
    _expect(laws[0], _softmax([1.0, 0.5, 0.0]))
    _expect(laws[1], _softmax([0.5, 0.5, 0.0]))
    _expect(laws[2], _softmax([0.5, 0.5, 0.0]))


@pytest.mark.parametrize("name", MIN_TOKENS)
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


@settings(deadline=None)
@given(case=profile_inputs())
def test_vllm_v2_states_the_same_law_as_v1(case: ProfileInput) -> None:
    """Model runner v2 reorders v1's steps only where they commute: equal laws everywhere."""
    v1 = _supported(get_profile("vllm-v1"), case)
    v2 = _supported(get_profile("vllm-v2"), case)
    assert (v1 is None) == (v2 is None)
    if v1 is not None and v2 is not None:
        torch.testing.assert_close(v1, v2, atol=0, rtol=0)


@pytest.mark.parametrize("name", SGLANG)
def test_sglang_adds_the_bias_after_the_repetition_penalty(name: str) -> None:
    """SGLang: penalties, then ``+= logit_bias``: 0.5 / 2 - 1 = -0.75 where vLLM gives
    (0.5 - 1) * 2 = -1. TV between the two laws is stated."""
    request = Request(logit_bias=((0, -1.0),), repetition_penalty=2.0)
    sglang = _law(name, [0.5, 0.0], request, history=(0,))
    vllm = _law("vllm-v1", [0.5, 0.0], request, history=(0,))
    _expect(sglang, _softmax([-0.75, 0.0]))
    _expect(vllm, _softmax([-1.0, 0.0]))
    expected_tv = _softmax([-0.75, 0.0])[0] - _softmax([-1.0, 0.0])[0]
    assert _tv(sglang, vllm) == pytest.approx(expected_tv, abs=1e-12)


@pytest.mark.parametrize("name", SGLANG)
def test_sglang_repetition_penalty_ignores_the_prompt(name: str) -> None:
    """SGLang's repetition penalizer accumulates output tokens only: a prompt token keeps its
    logit; vLLM divides it."""
    request = Request(repetition_penalty=2.0, prompt_token_ids=(0,))
    _expect(_law(name, [1.0, 0.0], request), _softmax([1.0, 0.0]))
    _expect(_law("vllm-v1", [1.0, 0.0], request), _softmax([0.5, 0.0]))


@pytest.mark.parametrize("name", SGLANG)
def test_sglang_penalties_read_the_output(name: str) -> None:
    """Frequency per occurrence and presence once, on the output history."""
    request = Request(frequency_penalty=0.5, presence_penalty=0.25, prompt_token_ids=(2,))
    _expect(_law(name, [0.0, 0.0, 0.0], request, history=(0, 0, 1)), _softmax([-1.25, -0.75, 0.0]))


def test_top_k_ties_by_rank_in_sglang_torch_by_value_in_flashinfer() -> None:
    """Three tokens tied at the 2nd probability, k = 2: SGLang's torch sampler cuts its sort at
    rank 2 (lower ids kept), FlashInfer's rejection rule keeps every tied token."""
    request = Request(top_k=2)
    logits = [1.0, 1.0, 1.0, 0.0]
    _expect(_law("sglang-torch", logits, request), [0.5, 0.5, 0.0, 0.0])
    for name in ("sglang-flashinfer", *FLASHINFER):
        _expect(_law(name, logits, request), [1 / 3, 1 / 3, 1 / 3, 0.0])


KTP_LOGITS = [math.log(p) for p in (0.4, 0.3, 0.2, 0.1)]


def test_sglang_top_p_on_unfiltered_probabilities_differs_from_vllm() -> None:
    """p = (.4, .3, .2, .1), top_k = 2, top_p = 0.5. vLLM renormalises after top-k, (4/7, 3/7):
    the mass before token 1 is 4/7 >= 0.5, so only token 0 stays. SGLang (both backends) cuts
    top-p on p itself, where the mass before token 1 is 0.4: tokens 0 and 1 stay. TV = 3/7."""
    request = Request(top_k=2, top_p=0.5)
    vllm = _law("vllm-v1", KTP_LOGITS, request)
    _expect(vllm, [1.0, 0.0, 0.0, 0.0])
    for name in SGLANG:
        sglang = _law(name, KTP_LOGITS, request)
        _expect(sglang, [4 / 7, 3 / 7, 0.0, 0.0])
        assert _tv(vllm, sglang) == pytest.approx(3 / 7, abs=1e-12)


def test_sglang_and_vllm_agree_when_top_p_does_not_bind() -> None:
    """The same logits with top_p = 0.9: both keep the top-k pair."""
    request = Request(top_k=2, top_p=0.9)
    for name in SGLANG:
        assert _tv(_law("vllm-v1", KTP_LOGITS, request), _law(name, KTP_LOGITS, request)) < 1e-12


def test_sglang_flashinfer_min_p_switches_to_sequential_filters() -> None:
    """SGLang's FlashInfer path: with min-p set it renormalises after top-k before top-p
    (``top_k_renorm_prob``, ``top_p_renorm_prob``), so even a min-p too small to remove anything
    changes the law of the example above from (4/7, 3/7) to token 0 alone (TV = 3/7)."""
    joint = _law("sglang-flashinfer", KTP_LOGITS, Request(top_k=2, top_p=0.5))
    sequential = _law("sglang-flashinfer", KTP_LOGITS, Request(top_k=2, top_p=0.5, min_p=1e-9))
    _expect(sequential, [1.0, 0.0, 0.0, 0.0])
    assert _tv(joint, sequential) == pytest.approx(3 / 7, abs=1e-12)


def test_flashinfer_top_k_first_and_joint_orders() -> None:
    """``top_k_first`` renormalises after top-k (token 0 alone on the example), ``joint`` cuts
    both on the same probabilities (tokens 0 and 1)."""
    request = Request(top_k=2, top_p=0.5)
    _expect(_law("flashinfer", KTP_LOGITS, request), [1.0, 0.0, 0.0, 0.0])
    _expect(_law("flashinfer-joint", KTP_LOGITS, request), [4 / 7, 3 / 7, 0.0, 0.0])


@pytest.mark.parametrize("name", FLASHINFER)
def test_flashinfer_min_p_keeps_tokens_above_the_floor(name: str) -> None:
    """min_p = 0.5 on p = (.5, .3, .2): the floor is .25, token 2 goes."""
    logits = [math.log(p) for p in (0.5, 0.3, 0.2)]
    _expect(_law(name, logits, Request(min_p=0.5)), [0.625, 0.375, 0.0])


@pytest.mark.parametrize("name", FLASHINFER)
def test_flashinfer_refuses_what_its_kernels_do_not_take(name: str) -> None:
    """Greedy, penalties and min-p with top-k: each named in the error."""
    with pytest.raises(UnsupportedRequest, match="temperature"):
        _law(name, [0.0, 0.0], Request(temperature=0.0))
    with pytest.raises(UnsupportedRequest, match="repetition_penalty"):
        _law(name, [0.0, 0.0], Request(repetition_penalty=1.5))
    with pytest.raises(UnsupportedRequest, match="min_p"):
        _law(name, [0.0, 0.0], Request(min_p=0.1, top_k=1))


@pytest.mark.parametrize("name", SGLANG)
def test_sglang_refuses_token_lists(name: str) -> None:
    """SGLang has no allowed or bad token ids."""
    with pytest.raises(UnsupportedRequest, match=r"sglang.*allowed_token_ids"):
        _law(name, [0.0, 0.0], Request(allowed_token_ids=(0,)))
    with pytest.raises(UnsupportedRequest, match=r"sglang.*bad_token_ids"):
        _law(name, [0.0, 0.0], Request(bad_token_ids=(0,)))


def test_llamacpp_refuses_min_tokens_and_allowed_ids() -> None:
    """llama.cpp's chain has no min_tokens and no allowed ids."""
    with pytest.raises(UnsupportedRequest, match=r"llama.cpp.*min_tokens"):
        _law("llama.cpp", [0.0, 0.0], Request(min_tokens=1, stop_token_ids=(0,)))
    with pytest.raises(UnsupportedRequest, match=r"llama.cpp.*allowed_token_ids"):
        _law("llama.cpp", [0.0, 0.0], Request(allowed_token_ids=(0,)))


T_LAST_LOGITS = [math.log(p) for p in (0.5, 0.3, 0.2)]


def test_llamacpp_tempers_after_top_p_unlike_vllm() -> None:
    """p = (.5, .3, .2), T = 2, top_p = 0.75. llama.cpp cuts on the T = 1 probabilities (mass
    before token 2 is .8: it goes) then tempers; vLLM tempers first, to (.4155, .3218, .2628),
    where the mass before token 2 is .737 < .75: it stays. TV = the tempered mass of token 2."""
    request = Request(temperature=2.0, top_p=0.75)
    llama = _law("llama.cpp", T_LAST_LOGITS, request)
    vllm = _law("vllm-v1", T_LAST_LOGITS, request)
    halves = [math.sqrt(p) for p in (0.5, 0.3, 0.2)]
    _expect(llama, [halves[0] / sum(halves[:2]), halves[1] / sum(halves[:2]), 0.0])
    _expect(vllm, [h / sum(halves) for h in halves])
    assert _tv(llama, vllm) == pytest.approx(halves[2] / sum(halves), abs=1e-12)


def test_llamacpp_and_vllm_agree_when_the_cut_falls_alike() -> None:
    """The same logits with top_p = 0.6: both keep tokens 0 and 1."""
    request = Request(temperature=2.0, top_p=0.6)
    llama = _law("llama.cpp", T_LAST_LOGITS, request)
    assert _tv(llama, _law("vllm-v1", T_LAST_LOGITS, request)) < 1e-12


def test_llamacpp_penalties_count_the_last_64_tokens_of_prompt_and_output() -> None:
    """Prompt (0, 1), output (1, then 63 times 2): the window of the last 64 tokens holds one
    1 and 63 2s; token 0 and the prompt's 1 fell out of it."""
    request = Request(frequency_penalty=1.0, prompt_token_ids=(0, 1))
    history = (1,) + (2,) * 63
    _expect(_law("llama.cpp", [0.0, 0.0, 0.0], request, history), _softmax([0.0, -1.0, -63.0]))


def test_llamacpp_top_k_keeps_exactly_k() -> None:
    """``llama_sampler_top_k_impl`` truncates to k candidates: ties at the k-th broken toward
    the lower id here (the engine's sort leaves them unspecified)."""
    _expect(_law("llama.cpp", [1.0, 1.0, 1.0, 0.0], Request(top_k=2)), [0.5, 0.5, 0.0, 0.0])
