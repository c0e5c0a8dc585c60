"""The serving protocol's input and output validation: each malformed argument is refused
with an error naming it; well-formed calls pass."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from losslessness.protocol import (
    InvalidInputError,
    validate_serving_inputs,
    validate_serving_output,
)
from losslessness.requests import Request


def _call(**changes: Any) -> dict[str, Any]:
    batch, k, vocab = 2, 3, 6
    call: dict[str, Any] = {
        "target_logits": torch.zeros(batch, k + 1, vocab, dtype=torch.float32),
        "draft_probs": torch.full((batch, k, vocab), 1 / vocab),
        "draft_token_ids": torch.tensor([[1, 2, 3], [4, -1, -1]]),
        "num_draft_tokens": torch.tensor([3, 1]),
        "requests": (Request(), Request(temperature=0.0)),
        "generator": torch.Generator(),
    }
    call.update(changes)
    return call


def test_well_formed_serving_call_passes_validation_with_and_without_draft_probs() -> None:
    """Control: the shapes the protocol states pass, draft_probs given or None."""
    assert validate_serving_inputs(**_call()) == (2, 3, 6)
    assert validate_serving_inputs(**_call(draft_probs=None)) == (2, 3, 6)


@pytest.mark.parametrize(
    ("changes", "argument"),
    [
        ({"target_logits": torch.zeros(2, 4, 6, dtype=torch.float16)}, "target_logits"),
        ({"target_logits": torch.zeros(2, 4)}, "target_logits"),
        ({"num_draft_tokens": torch.tensor([4, 1])}, "num_draft_tokens"),
        ({"num_draft_tokens": torch.tensor([3])}, "num_draft_tokens"),
        ({"draft_token_ids": torch.tensor([[1, 2, 3], [4, 5, -1]])}, "draft_token_ids"),
        ({"draft_token_ids": torch.tensor([[1, 2, 6], [4, -1, -1]])}, "draft_token_ids"),
        ({"draft_probs": torch.full((2, 3, 6), 0.5)}, "draft_probs"),
        ({"requests": (Request(),)}, "requests"),
        ({"requests": (Request(), {"temperature": 0})}, "requests"),
        ({"requests": (Request(), Request(logit_bias={9: 1.0}))}, "requests"),
        ({"generator": None}, "generator"),
    ],
)
def test_malformed_serving_argument_is_refused_naming_it(
    changes: dict[str, Any], argument: str
) -> None:
    """Wrong dtype, rank, count range, pad layout, id range, draft law, request count, request
    type, a request's token outside V, a missing generator: each names its argument."""
    with pytest.raises(InvalidInputError) as error:
        validate_serving_inputs(**_call(**changes))
    assert error.value.argument == argument


def test_serving_output_layout_is_checked_against_drafts_and_counts() -> None:
    """An output accepting a token that is not the draft, emitting more than n + 1 tokens or
    none is refused; the right layout passes."""
    drafts = torch.tensor([[1, 2, 3], [4, -1, -1]])
    counts = torch.tensor([3, 1])
    validate_serving_output(torch.tensor([[1, 2, 5, -1], [4, 0, -1, -1]]), drafts, counts, 6)
    for bad in (
        torch.tensor([[1, 0, 5, -1], [4, 0, -1, -1]]),
        torch.tensor([[1, 2, 5, -1], [4, 0, 1, -1]]),
        torch.tensor([[-1, -1, -1, -1], [4, 0, -1, -1]]),
        torch.tensor([[1, 2, 3, 6], [4, 0, -1, -1]]),
    ):
        with pytest.raises(InvalidInputError, match="output"):
            validate_serving_output(bad, drafts, counts, 6)
