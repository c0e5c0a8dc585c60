"""``strategies.requests``: valid requests inside the vocabulary, every field reachable on its
own, the history starting with the request's output, and eager argument errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis.errors import InvalidArgument

from losslessness.requests import Request
from strategies import REQUEST_FIELDS, ProfileInput, profile_inputs, requests

DEFAULTS = Request()


@settings(deadline=None)
@given(case=profile_inputs(vocab_size=6))
def test_profile_inputs_stay_inside_the_vocabulary(case: ProfileInput) -> None:
    """Logits are [V] float64, every id the request names is below V, and the history starts
    with the request's output tokens."""
    logits, request, history = case
    assert logits.shape == (6,) and logits.dtype == torch.float64
    request.check_vocabulary(6)
    assert history[: len(request.output_token_ids)] == request.output_token_ids
    assert all(0 <= token < 6 for token in history)


@pytest.mark.parametrize("name", REQUEST_FIELDS)
def test_every_field_is_turned_on_by_some_draw(name: str) -> None:
    """Each field leaves its default in some draw (``find`` searches for one)."""
    found = find(
        requests(8, fields=(name,), greedy=False if name != "temperature" else None),
        lambda r: getattr(r, name) != getattr(DEFAULTS, name),
        settings=settings(database=None, max_examples=500),
    )
    assert getattr(found, name) != getattr(DEFAULTS, name)


@settings(deadline=None)
@given(request=requests(5, fields=()))
def test_no_fields_gives_the_default_sampling_parameters(request: Request) -> None:
    """With no field switchable, every sampling parameter keeps its default (only the
    histories vary)."""
    assert request == Request(
        prompt_token_ids=request.prompt_token_ids, output_token_ids=request.output_token_ids
    )


@settings(deadline=None)
@given(request=requests(5, greedy=True))
def test_greedy_true_draws_only_greedy_requests(request: Request) -> None:
    """``greedy=True`` pins the temperature at 0."""
    assert request.greedy


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"vocab_size": 1}, "vocab_size"),
        ({"vocab_size": 4, "fields": ("no_such_field",)}, "fields"),
        ({"vocab_size": 4, "fields": "top_k"}, "fields"),
        ({"vocab_size": 4, "greedy": "yes"}, "greedy"),
        ({"vocab_size": 4, "max_history": -1}, "max_history"),
    ],
)
def test_bad_arguments_are_refused_eagerly(arguments: dict[str, object], named: str) -> None:
    """A bad argument raises ``InvalidArgument`` naming it when the strategy is built."""
    with pytest.raises(InvalidArgument, match=named):
        requests(**arguments)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=named):
        profile_inputs(**arguments)  # type: ignore[arg-type]
