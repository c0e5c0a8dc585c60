"""The acceptance the tiny models predict (``losslessness.adapters.e2e.acceptance``, issue 22
item 3): a draft equal to the target predicts 1 exactly (greedy, and probabilistic drafting);
one draft after the prompt predicts ``sum min(p, q)`` (probabilistic) or ``p(argmax q)``
(greedy drafting) within 4 standard errors; the engines' drafting schemes give the shares the
engines showed on the greedy case; a prediction is read back from its JSON file without being
computed again; bad arguments are refused, named; an engine adapter takes one prediction per
case. Needs transformers and sentencepiece (skipped with the reason otherwise) except the
argument and adapter tests; predictions are cached under ``tmp_path``, never in the models'
cache.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from losslessness.adapters import AdapterUnavailable
from losslessness.adapters.base import import_optional
from losslessness.adapters.e2e import acceptance
from losslessness.adapters.e2e.acceptance import DraftingScheme, Prediction, predicted_acceptance
from losslessness.adapters.e2e.engine import PROMPTS, EngineCase, Sampling, engine_adapter
from losslessness.adapters.e2e.models import (
    TinyModels,
    build_tiny_models,
    transformers_next_token_probs,
)

FILTERED = Sampling(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05)
GREEDY = Sampling(temperature=None)


@pytest.fixture(scope="module")
def built() -> TinyModels:
    try:
        # Cached models load without either package, but the tests tokenize and run them.
        import_optional("sentencepiece", "sentencepiece")
        import_optional("transformers", "transformers")
        return build_tiny_models()
    except AdapterUnavailable as error:
        pytest.skip(str(error))


@pytest.fixture
def models(built: TinyModels, tmp_path: Path) -> TinyModels:
    """The tiny target and draft, the predictions' cache in ``tmp_path``."""
    return TinyModels(tmp_path / "models", built.target, built.draft, built.tokenizer)


@pytest.fixture
def same(built: TinyModels, tmp_path: Path) -> TinyModels:
    """The target as its own draft."""
    return TinyModels(tmp_path / "same", built.target, built.target, built.tokenizer)


# --------------------------------------------------------------------------- exact values


@pytest.mark.parametrize("scheme", [
    DraftingScheme(3, True),
    DraftingScheme(3, True, plain_first_token=True, end_margin=1, profile="llama.cpp"),
])
def test_greedy_requests_with_the_target_as_draft_accept_every_draft(
    same: TinyModels, scheme: DraftingScheme
) -> None:
    ids = same.prompt_ids(PROMPTS[1])
    prediction = predicted_acceptance(same, ids, GREEDY, scheme.k, True, 6, scheme=scheme)
    assert prediction.share == 1.0 and prediction.standard_error == 0.0
    assert prediction.sequences == 1 and prediction.drafted > 0


@pytest.mark.parametrize("sampling", [Sampling(), FILTERED])
@pytest.mark.parametrize(
    "scheme", [DraftingScheme(3, False), DraftingScheme(2, False, end_margin=0)]
)
def test_probabilistic_drafting_with_the_target_as_draft_accepts_every_draft(
    same: TinyModels, sampling: Sampling, scheme: DraftingScheme
) -> None:
    """p = q at every position: min(1, p/q) = 1, so no draft is ever rejected."""
    ids = same.prompt_ids(PROMPTS[0])
    prediction = predicted_acceptance(same, ids, sampling, scheme.k, False, 4, 40, scheme=scheme)
    assert prediction.share == 1.0 and prediction.standard_error == 0.0
    assert prediction.accepted == prediction.drafted >= 40


@pytest.mark.parametrize("greedy_drafting", [False, True])
def test_one_draft_after_the_prompt_is_accepted_as_the_two_laws_say(
    models: TinyModels, greedy_drafting: bool
) -> None:
    """k = 1, L = 1, temperature 1: every request verifies one draft at the prompt's first
    position, accepted with probability sum_x min(p(x), q(x)) (Leviathan et al. 2022, Sec.
    3.3) for a sampled draft, p(argmax q) for a greedy one; the prediction is within 4 of its
    standard errors of the value computed from the two models' laws."""
    ids = list(models.prompt_ids(PROMPTS[0]))
    p = transformers_next_token_probs(models.target, ids)
    q = transformers_next_token_probs(models.draft, ids)
    exact = float(p[int(torch.argmax(q))]) if greedy_drafting else float(torch.minimum(p, q).sum())
    prediction = predicted_acceptance(models, ids, Sampling(), 1, greedy_drafting, 1, 1500)
    assert prediction.drafted == prediction.sequences == 1500
    assert 0.0 < prediction.standard_error < 0.02
    assert abs(prediction.share - exact) <= 4 * prediction.standard_error, (prediction, exact)


def test_the_engines_schemes_give_the_shares_the_engines_showed_on_the_greedy_case(
    models: TinyModels,
) -> None:
    """The greedy case (second prompt, L = 4, K = 3) on the recipe-2 models: drafting right
    after the prompt, min(K, L - g) drafts a step, accepts 3 of 4 (ONNX Runtime GenAI showed 96
    of 128 in 32 requests); a plain first token and min(K, L - g - 1) drafts accept 1 of 2
    (llama.cpp and OpenVINO GenAI: 32 of 64); K drafts every step after a plain first token
    (vLLM) accept 1 of 3, then 3 of 3 more, counted though only the first is kept."""
    ids = models.prompt_ids(PROMPTS[1])
    ort = predicted_acceptance(models, ids, GREEDY, 3, False,
                               scheme=DraftingScheme(3, False, end_margin=0))
    llama = predicted_acceptance(models, ids, GREEDY, 3, True, scheme=DraftingScheme(
        3, True, plain_first_token=True, end_margin=1))
    vllm = predicted_acceptance(models, ids, GREEDY, 3, True,
                                scheme=DraftingScheme(3, True, plain_first_token=True))
    assert (ort.accepted, ort.drafted, ort.share) == (3, 4, 0.75)
    assert (llama.accepted, llama.drafted, llama.share) == (1, 2, 0.5)
    assert (vllm.accepted, vllm.drafted) == (4, 6)


# --------------------------------------------------------------------------- the cache


def test_a_prediction_is_read_back_from_disk_without_running_the_loop_again(
    models: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = models.prompt_ids(PROMPTS[0])
    first = predicted_acceptance(models, ids, Sampling(), 3, False, 4, 30)
    files = list((models.directory / "acceptance").glob("*.json"))
    assert len(files) == 1 and 0.0 < first.share < 1.0 and first.seconds > 0

    def refuse(*args: object) -> object:
        raise AssertionError("the reference loop ran again")

    monkeypatch.setattr(acceptance, "_simulate", refuse)
    assert predicted_acceptance(models, ids, Sampling(), 3, False, 4, 30) == first
    with pytest.raises(AssertionError, match="ran again"):  # another seed is another key
        predicted_acceptance(models, ids, Sampling(), 3, False, 4, 30, seed=7)
    with pytest.raises(LookupError, match="no cached prediction"):
        predicted_acceptance(models, ids, Sampling(), 3, False, 4, 31, compute=False)


# --------------------------------------------------------------------------- bad arguments

FAKE = TinyModels(Path("/nonexistent/models"), Path("/nonexistent/t"), Path("/nonexistent/d"),
                  Path("/nonexistent/tokenizer.model"))


@pytest.mark.parametrize(("change", "name"), [
    ({"models": "a path"}, "models"),
    ({"prompt_ids": []}, "prompt_ids"),
    ({"prompt_ids": [1, 256]}, "prompt_ids"),
    ({"prompt_ids": [1, True]}, "prompt_ids"),
    ({"sampling": 1.0}, "sampling"),
    ({"k": 0}, "k"),
    ({"k": 2.0}, "k"),
    ({"greedy_drafting": 1}, "greedy_drafting"),
    ({"new_tokens": 0}, "new_tokens"),
    ({"sequences": 1}, "sequences"),
    ({"seed": -1}, "seed"),
    ({"scheme": DraftingScheme(2, False)}, "scheme"),
])
def test_bad_arguments_are_refused_naming_them(change: dict[str, object], name: str) -> None:
    arguments: dict[str, object] = {
        "models": FAKE, "prompt_ids": [1, 40], "sampling": Sampling(), "k": 3,
        "greedy_drafting": False, **change,
    }
    with pytest.raises(ValueError, match=rf"^{name}:"):
        predicted_acceptance(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(("fields", "name"), [
    ({"k": 0}, "k"),
    ({"greedy_drafting": None}, "greedy_drafting"),
    ({"end_margin": -1}, "end_margin"),
    ({"draft_top_k": 0}, "draft_top_k"),
    ({"profile": "no-such-engine"}, "profile"),
])
def test_a_bad_drafting_scheme_is_refused_naming_the_field(
    fields: dict[str, object], name: str
) -> None:
    arguments: dict[str, object] = {"k": 3, "greedy_drafting": False, **fields}
    with pytest.raises(ValueError, match=rf"^{name}:"):
        DraftingScheme(**arguments)  # type: ignore[arg-type]


def test_the_draft_law_takes_the_requests_filters_or_only_its_temperature() -> None:
    assert DraftingScheme(3, False).draft_sampling(FILTERED) == FILTERED
    assert DraftingScheme(3, False, draft_top_k=10, draft_filters=False).draft_sampling(
        FILTERED) == Sampling(0.8, 10)
    assert DraftingScheme(3, False, draft_top_k=10).draft_sampling(FILTERED) == Sampling(
        0.8, 10, 0.9, 0.05)
    assert DraftingScheme(3, False, draft_filters=False).draft_sampling(GREEDY) == GREEDY


# --------------------------------------------------------------------------- the adapter


class _Client:
    vocab_size = 256
    description = "a stub engine"

    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int,
                 sampling: Sampling) -> tuple[list[int], int, int]:
        raise NotImplementedError

    def next_token_law(self, prefix_ids: list[int], sampling: Sampling) -> list[float]:
        raise NotImplementedError

    def close(self) -> None:
        pass


def test_an_engine_adapter_takes_one_prediction_per_case_or_one_for_all() -> None:
    cases = (EngineCase("a", Sampling()), EngineCase("b", GREEDY))
    seen: list[EngineCase] = []

    def predict(case: EngineCase) -> float | None:
        seen.append(case)
        return 0.5 if case.sampling.greedy else None

    adapter = engine_adapter("e2e/stub", _Client(), lambda text: [1, 40], cases,
                             predicted_acceptance=predict)
    assert seen == list(cases)
    assert [target.predicted_acceptance for target in adapter.end_to_end] == [None, 0.5]
    adapter = engine_adapter("e2e/stub", _Client(), lambda text: [1, 40], cases,
                             predicted_acceptance=0.25)
    assert [target.predicted_acceptance for target in adapter.end_to_end] == [0.25, 0.25]
    adapter = engine_adapter("e2e/stub", _Client(), lambda text: [1, 40], cases)
    assert all(target.predicted_acceptance is None for target in adapter.end_to_end)


def test_a_prediction_with_nothing_drafted_is_nan_and_a_case_gets_none(
    models: TinyModels,
) -> None:
    """L = 1 with a plain first token drafts nothing: the share is undefined (nan), and the
    case predictor gives the adapter None."""
    scheme = DraftingScheme(3, False, plain_first_token=True)
    ids = models.prompt_ids(PROMPTS[0])
    prediction = predicted_acceptance(models, ids, Sampling(), 3, False, 1, 5, scheme=scheme)
    assert prediction.drafted == 0 and math.isnan(prediction.share)
    predict = acceptance.case_predictor(models, scheme, models.prompt_ids, compute=True)
    assert predict(EngineCase(PROMPTS[0], Sampling(), new_tokens=1)) is None
    assert isinstance(prediction, Prediction)
