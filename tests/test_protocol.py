"""Every malformed verifier input raises ``InvalidInputError`` that names its argument.

The protocol (``losslessness.protocol``) promises: bad input raises
:class:`~losslessness.protocol.InvalidInputError` (a ``ValueError``) whose message starts with
the argument's name and whose ``.argument`` is that name. Checked here, case by case, for
``validate_chain_inputs`` and the reference ``verify`` / ``verify_with_uniforms`` (chain
protocol) and ``validate_greedy_inputs`` / ``verify_greedy`` (greedy protocol); plus the inputs
that must be *accepted* (rows within the 1e-5 row-sum tolerance, float32, narrow int ids).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from losslessness.protocol import (
    ROW_SUM_TOLERANCE,
    InvalidInputError,
    validate_chain_inputs,
    validate_greedy_inputs,
)
from losslessness.reference import verify, verify_greedy, verify_with_uniforms

BATCH, K, VOCAB = 2, 2, 5
"""Shape of the valid base case every bad input is derived from."""


@dataclass(frozen=True)
class ChainArgs:
    """Arguments of one chain verifier call (``object`` where a test passes a non-tensor)."""

    target_probs: object
    draft_probs: object
    draft_token_ids: object
    generator: object
    accept_uniforms: object
    sample_uniforms: object


def _valid_chain_args() -> ChainArgs:
    """A valid call: uniform p and q, drafts 0 and 1, a seeded generator, mid-range uniforms."""
    return ChainArgs(
        target_probs=torch.full((BATCH, K + 1, VOCAB), 1.0 / VOCAB, dtype=torch.float64),
        draft_probs=torch.full((BATCH, K, VOCAB), 1.0 / VOCAB, dtype=torch.float64),
        draft_token_ids=torch.tensor([[0, 1], [2, 3]], dtype=torch.int64),
        generator=torch.Generator().manual_seed(0),
        accept_uniforms=torch.full((BATCH, K), 0.5, dtype=torch.float64),
        sample_uniforms=torch.full((BATCH,), 0.5, dtype=torch.float64),
    )


def _edited(tensor: object, index: tuple[int, ...], value: float) -> torch.Tensor:
    assert isinstance(tensor, torch.Tensor)
    out = tensor.clone()
    out[index] = value
    return out


def _uniform(shape: tuple[int, ...], vocab: int = VOCAB) -> torch.Tensor:
    """``[*shape, vocab]`` float64 rows of ``1 / vocab`` (empty when ``vocab == 0``)."""
    return torch.full((*shape, vocab), 1.0 / max(vocab, 1), dtype=torch.float64)


def _with_negative_mass(args: ChainArgs) -> ChainArgs:
    target = _edited(args.target_probs, (0, 1, 0), 0.2 + 0.3)
    target[0, 1, 1] = 0.2 - 0.3  # the row still sums to 1: only the sign is wrong
    return replace(args, target_probs=target)


def _with_draft_on_zero_mass(args: ChainArgs) -> ChainArgs:
    draft = _edited(args.draft_probs, (1, 0, 2), 0.0)
    draft[1, 0, 3] = 0.4  # row still sums to 1, but token 2 (drafted at [1, 0]) has q = 0
    return replace(args, draft_probs=draft)


ChainEdit = Callable[[ChainArgs], ChainArgs]

CHAIN_PROBLEMS: list[tuple[str, ChainEdit, str]] = [
    # non-tensor inputs
    (
        "target_probs as list",
        lambda a: replace(a, target_probs=_uniform((BATCH, K + 1)).tolist()),
        "target_probs",
    ),
    (
        "draft_probs as numpy",
        lambda a: replace(a, draft_probs=np.full((BATCH, K, VOCAB), 0.2)),
        "draft_probs",
    ),
    (
        "draft_token_ids as list",
        lambda a: replace(a, draft_token_ids=[[0, 1], [2, 3]]),
        "draft_token_ids",
    ),
    # wrong rank
    ("target_probs rank 2", lambda a: replace(a, target_probs=_uniform((K + 1,))), "target_probs"),
    (
        "target_probs rank 4",
        lambda a: replace(a, target_probs=_uniform((1, BATCH, K + 1))),
        "target_probs",
    ),
    ("draft_probs rank 2", lambda a: replace(a, draft_probs=_uniform((K,))), "draft_probs"),
    (
        "draft_token_ids rank 1",
        lambda a: replace(a, draft_token_ids=torch.zeros(BATCH * K, dtype=torch.int64)),
        "draft_token_ids",
    ),
    (
        "draft_token_ids rank 3",
        lambda a: replace(a, draft_token_ids=torch.zeros((BATCH, K, 1), dtype=torch.int64)),
        "draft_token_ids",
    ),
    # dtypes
    (
        "target_probs int64",
        lambda a: replace(a, target_probs=torch.ones((BATCH, K + 1, VOCAB), dtype=torch.int64)),
        "target_probs",
    ),
    (
        "draft_probs bool",
        lambda a: replace(a, draft_probs=torch.ones((BATCH, K, VOCAB), dtype=torch.bool)),
        "draft_probs",
    ),
    (
        "draft_token_ids float",
        lambda a: replace(a, draft_token_ids=torch.zeros((BATCH, K))),
        "draft_token_ids",
    ),
    (
        "draft_token_ids bool",
        lambda a: replace(a, draft_token_ids=torch.zeros((BATCH, K), dtype=torch.bool)),
        "draft_token_ids",
    ),
    # k+1 vs k and empty axes
    (
        "target_probs with 0 positions",
        lambda a: replace(a, target_probs=_uniform((BATCH, 0))),
        "target_probs",
    ),
    (
        "target_probs with V = 0",
        lambda a: replace(
            a, target_probs=_uniform((BATCH, K + 1), 0), draft_probs=_uniform((BATCH, K), 0)
        ),
        "target_probs",
    ),
    (
        "draft_probs with k+1 positions",
        lambda a: replace(a, draft_probs=_uniform((BATCH, K + 1))),
        "draft_probs",
    ),
    (
        "draft_probs with k-1 positions",
        lambda a: replace(a, draft_probs=_uniform((BATCH, K - 1))),
        "draft_probs",
    ),
    (
        "draft_token_ids with k+1 positions",
        lambda a: replace(a, draft_token_ids=torch.zeros((BATCH, K + 1), dtype=torch.int64)),
        "draft_token_ids",
    ),
    (
        "draft_token_ids with k-1 positions",
        lambda a: replace(a, draft_token_ids=torch.zeros((BATCH, K - 1), dtype=torch.int64)),
        "draft_token_ids",
    ),
    # vocabulary and batch mismatches
    (
        "draft_probs with V+1 tokens",
        lambda a: replace(a, draft_probs=_uniform((BATCH, K), VOCAB + 1)),
        "draft_probs",
    ),
    (
        "draft_probs with V-1 tokens",
        lambda a: replace(a, draft_probs=_uniform((BATCH, K), VOCAB - 1)),
        "draft_probs",
    ),
    (
        "draft_probs with batch B+1",
        lambda a: replace(a, draft_probs=_uniform((BATCH + 1, K))),
        "draft_probs",
    ),
    (
        "draft_token_ids with batch B-1",
        lambda a: replace(a, draft_token_ids=torch.zeros((BATCH - 1, K), dtype=torch.int64)),
        "draft_token_ids",
    ),
    # non-finite values
    (
        "NaN in target_probs",
        lambda a: replace(a, target_probs=_edited(a.target_probs, (1, 2, 4), math.nan)),
        "target_probs",
    ),
    (
        "+inf in target_probs",
        lambda a: replace(a, target_probs=_edited(a.target_probs, (0, 0, 0), math.inf)),
        "target_probs",
    ),
    (
        "NaN in draft_probs",
        lambda a: replace(a, draft_probs=_edited(a.draft_probs, (0, 1, 3), math.nan)),
        "draft_probs",
    ),
    (
        "-inf in draft_probs",
        lambda a: replace(a, draft_probs=_edited(a.draft_probs, (1, 0, 0), -math.inf)),
        "draft_probs",
    ),
    # negative mass and rows not summing to 1
    ("negative mass in target_probs", _with_negative_mass, "target_probs"),
    (
        "negative mass in draft_probs",
        lambda a: replace(a, draft_probs=_edited(a.draft_probs, (0, 0, 4), -1e-9)),
        "draft_probs",
    ),
    (
        "target_probs row off by +1e-3",
        lambda a: replace(a, target_probs=_edited(a.target_probs, (1, 2, 0), 0.2 + 1e-3)),
        "target_probs",
    ),
    (
        "target_probs row off by -1e-3",
        lambda a: replace(a, target_probs=_edited(a.target_probs, (0, 0, 0), 0.2 - 1e-3)),
        "target_probs",
    ),
    (
        "draft_probs row off by 1e-3",
        lambda a: replace(a, draft_probs=_edited(a.draft_probs, (1, 1, 1), 0.2 + 1e-3)),
        "draft_probs",
    ),
    (
        "unnormalised logits as target_probs",
        lambda a: replace(a, target_probs=torch.ones((BATCH, K + 1, VOCAB), dtype=torch.float64)),
        "target_probs",
    ),
    # draft ids
    (
        "negative draft id",
        lambda a: replace(a, draft_token_ids=_edited(a.draft_token_ids, (0, 1), -1)),
        "draft_token_ids",
    ),
    (
        "draft id equal to V",
        lambda a: replace(a, draft_token_ids=_edited(a.draft_token_ids, (1, 0), VOCAB)),
        "draft_token_ids",
    ),
    ("draft id with q = 0", _with_draft_on_zero_mass, "draft_token_ids"),
]
"""(description, edit of the valid call, argument the error must name)."""

GENERATOR_PROBLEMS: list[tuple[str, object]] = [
    ("an int seed", 42),
    ("a string", "cpu"),
    ("a numpy Generator", np.random.default_rng(0)),
]
"""Things passed as ``generator`` that are not a ``torch.Generator``."""

UNIFORM_PROBLEMS: list[tuple[str, ChainEdit, str]] = [
    (
        "accept_uniforms as list",
        lambda a: replace(a, accept_uniforms=[[0.5, 0.5], [0.5, 0.5]]),
        "accept_uniforms",
    ),
    (
        "accept_uniforms wrong shape",
        lambda a: replace(a, accept_uniforms=torch.full((BATCH, K + 1), 0.5, dtype=torch.float64)),
        "accept_uniforms",
    ),
    (
        "accept_uniforms transposed",
        lambda a: replace(a, accept_uniforms=torch.full((K, BATCH + 1), 0.5, dtype=torch.float64)),
        "accept_uniforms",
    ),
    (
        "accept_uniforms int",
        lambda a: replace(a, accept_uniforms=torch.zeros((BATCH, K), dtype=torch.int64)),
        "accept_uniforms",
    ),
    (
        "accept uniform equal to 1",
        lambda a: replace(a, accept_uniforms=_edited(a.accept_uniforms, (1, 1), 1.0)),
        "accept_uniforms",
    ),
    (
        "accept uniform negative",
        lambda a: replace(a, accept_uniforms=_edited(a.accept_uniforms, (0, 0), -1e-12)),
        "accept_uniforms",
    ),
    (
        "accept uniform NaN",
        lambda a: replace(a, accept_uniforms=_edited(a.accept_uniforms, (0, 1), math.nan)),
        "accept_uniforms",
    ),
    ("sample_uniforms as float", lambda a: replace(a, sample_uniforms=0.5), "sample_uniforms"),
    (
        "sample_uniforms wrong shape",
        lambda a: replace(a, sample_uniforms=torch.full((BATCH, 1), 0.5, dtype=torch.float64)),
        "sample_uniforms",
    ),
    (
        "sample uniform equal to 1",
        lambda a: replace(a, sample_uniforms=_edited(a.sample_uniforms, (0,), 1.0)),
        "sample_uniforms",
    ),
    (
        "sample uniform above 1",
        lambda a: replace(a, sample_uniforms=_edited(a.sample_uniforms, (1,), 1.5)),
        "sample_uniforms",
    ),
    (
        "sample uniform +inf",
        lambda a: replace(a, sample_uniforms=_edited(a.sample_uniforms, (1,), math.inf)),
        "sample_uniforms",
    ),
]
"""(description, edit of the valid call, argument the error must name) for
``verify_with_uniforms``'s explicit randomness."""


def _named_params(
    problems: list[tuple[str, ChainEdit, str]] | list[tuple[str, GreedyEdit, str]],
) -> list[object]:
    """``pytest.param(edit, argument, id=description)`` for each problem."""
    return [
        pytest.param(edit, argument, id=description) for description, edit, argument in problems
    ]


def _call_validate(args: ChainArgs) -> object:
    return validate_chain_inputs(
        args.target_probs, args.draft_probs, args.draft_token_ids, args.generator
    )


def _call_verify(args: ChainArgs) -> object:
    return verify(
        args.target_probs,  # type: ignore[arg-type]
        args.draft_probs,  # type: ignore[arg-type]
        args.draft_token_ids,  # type: ignore[arg-type]
        args.generator,  # type: ignore[arg-type]
    )


def _call_verify_with_uniforms(args: ChainArgs) -> object:
    return verify_with_uniforms(
        args.target_probs,  # type: ignore[arg-type]
        args.draft_probs,  # type: ignore[arg-type]
        args.draft_token_ids,  # type: ignore[arg-type]
        args.accept_uniforms,  # type: ignore[arg-type]
        args.sample_uniforms,  # type: ignore[arg-type]
    )


CHAIN_CALLS: dict[str, Callable[[ChainArgs], object]] = {
    "validate_chain_inputs": _call_validate,
    "verify": _call_verify,
    "verify_with_uniforms": _call_verify_with_uniforms,
}
"""The chain-protocol entry points whose validation is checked."""


def _assert_names_argument(call: Callable[[], object], argument: str) -> None:
    with pytest.raises(InvalidInputError, match=rf"^{argument}: ") as caught:
        call()
    assert caught.value.argument == argument
    assert isinstance(caught.value, ValueError)
    assert caught.value.problem


@pytest.mark.parametrize("entry_point", list(CHAIN_CALLS))
@pytest.mark.parametrize(
    ("edit", "argument"),
    _named_params(CHAIN_PROBLEMS),
)
def test_chain_entry_points_reject_malformed_inputs_naming_the_argument(
    entry_point: str, edit: ChainEdit, argument: str
) -> None:
    """Each malformed chain input raises ``InvalidInputError`` whose message starts with the
    offending argument's name and whose ``.argument`` is that name, from every entry point."""
    args = edit(_valid_chain_args())
    _assert_names_argument(lambda: CHAIN_CALLS[entry_point](args), argument)


@pytest.mark.parametrize("entry_point", ["validate_chain_inputs", "verify"])
@pytest.mark.parametrize(
    "generator", [pytest.param(value, id=description) for description, value in GENERATOR_PROBLEMS]
)
def test_chain_entry_points_reject_a_generator_that_is_not_a_torch_generator(
    entry_point: str, generator: object
) -> None:
    """A ``generator`` that is not a ``torch.Generator`` raises ``InvalidInputError`` naming
    ``generator``."""
    args = replace(_valid_chain_args(), generator=generator)
    _assert_names_argument(lambda: CHAIN_CALLS[entry_point](args), "generator")


def test_verify_rejects_a_missing_generator_naming_generator() -> None:
    """``verify(..., generator=None)`` raises ``InvalidInputError`` naming ``generator``
    (``None`` is not a ``torch.Generator``; the chain protocol requires one)."""
    args = replace(_valid_chain_args(), generator=None)
    _assert_names_argument(lambda: _call_verify(args), "generator")


@pytest.mark.parametrize(
    ("edit", "argument"),
    _named_params(UNIFORM_PROBLEMS),
)
def test_verify_with_uniforms_rejects_malformed_uniforms_naming_the_argument(
    edit: ChainEdit, argument: str
) -> None:
    """Uniforms that are not tensors, have the wrong shape or dtype, or fall outside
    ``[0, 1)`` (NaN and inf included) raise ``InvalidInputError`` naming them."""
    args = edit(_valid_chain_args())
    _assert_names_argument(lambda: _call_verify_with_uniforms(args), argument)


def _shifted_row(args: ChainArgs, shift: float) -> ChainArgs:
    return replace(
        args,
        target_probs=_edited(args.target_probs, (0, 0, 0), 0.2 + shift),
        draft_probs=_edited(args.draft_probs, (1, 1, 4), 0.2 - shift),
    )


ACCEPTED_INPUTS: list[tuple[str, ChainEdit]] = [
    ("the valid base case", lambda a: a),
    ("rows off by +1e-7", lambda a: _shifted_row(a, 1e-7)),
    ("rows off by -1e-7", lambda a: _shifted_row(a, -1e-7)),
    ("rows off by just under the tolerance", lambda a: _shifted_row(a, 0.9 * ROW_SUM_TOLERANCE)),
    (
        "float32 probabilities",
        lambda a: replace(
            a,
            target_probs=torch.full((BATCH, K + 1, VOCAB), 0.2, dtype=torch.float32),
            draft_probs=torch.full((BATCH, K, VOCAB), 0.2, dtype=torch.float32),
        ),
    ),
    (
        "int32 draft ids",
        lambda a: replace(a, draft_token_ids=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)),
    ),
    (
        "draft ids at 0 and V-1",
        lambda a: replace(a, draft_token_ids=torch.tensor([[0, VOCAB - 1], [VOCAB - 1, 0]])),
    ),
    (
        "exact zeros in p where nothing is drafted",
        lambda a: replace(
            a,
            target_probs=torch.tensor(
                [[[0.0, 0.5, 0.5, 0.0, 0.0]] * (K + 1)] * BATCH, dtype=torch.float64
            ),
        ),
    ),
    (
        "uniforms exactly 0",
        lambda a: replace(
            a,
            accept_uniforms=torch.zeros((BATCH, K), dtype=torch.float64),
            sample_uniforms=torch.zeros(BATCH, dtype=torch.float64),
        ),
    ),
    (
        "uniforms just below 1",
        lambda a: replace(
            a, accept_uniforms=torch.full((BATCH, K), math.nextafter(1.0, 0.0), dtype=torch.float64)
        ),
    ),
]
"""(description, edit of the valid call) for inputs every entry point must accept."""


@pytest.mark.parametrize("entry_point", list(CHAIN_CALLS))
@pytest.mark.parametrize(
    "edit", [pytest.param(edit, id=description) for description, edit in ACCEPTED_INPUTS]
)
def test_chain_entry_points_accept_rows_within_the_row_sum_tolerance_and_narrow_dtypes(
    entry_point: str, edit: ChainEdit
) -> None:
    """Valid inputs, including rows 1e-7 off 1 (tolerance 1e-5), float32 probabilities and
    int32 ids, are accepted; verifiers then return ``[B, k+1]`` int64."""
    args = edit(_valid_chain_args())
    result = CHAIN_CALLS[entry_point](args)
    if entry_point == "validate_chain_inputs":
        assert result == (BATCH, K, VOCAB)
    else:
        assert isinstance(result, torch.Tensor)
        assert result.dtype == torch.int64 and tuple(result.shape) == (BATCH, K + 1)


@dataclass(frozen=True)
class GreedyArgs:
    """Arguments of one greedy verifier call."""

    target_logits: object
    draft_token_ids: object


def _valid_greedy_args() -> GreedyArgs:
    logits = torch.arange(BATCH * (K + 1) * VOCAB, dtype=torch.float64).view(BATCH, K + 1, VOCAB)
    logits[0, 1, :2] = -math.inf  # masked tokens are allowed
    return GreedyArgs(logits, torch.tensor([[4, 4], [0, 1]], dtype=torch.int64))


GreedyEdit = Callable[[GreedyArgs], GreedyArgs]

GREEDY_PROBLEMS: list[tuple[str, GreedyEdit, str]] = [
    (
        "target_logits as list",
        lambda a: replace(a, target_logits=[[[0.0] * VOCAB] * (K + 1)]),
        "target_logits",
    ),
    (
        "draft_token_ids as numpy",
        lambda a: replace(a, draft_token_ids=np.zeros((BATCH, K), dtype=np.int64)),
        "draft_token_ids",
    ),
    (
        "target_logits rank 2",
        lambda a: replace(a, target_logits=torch.zeros((K + 1, VOCAB))),
        "target_logits",
    ),
    (
        "draft_token_ids rank 1",
        lambda a: replace(a, draft_token_ids=torch.zeros(K, dtype=torch.int64)),
        "draft_token_ids",
    ),
    (
        "target_logits int64",
        lambda a: replace(a, target_logits=torch.zeros((BATCH, K + 1, VOCAB), dtype=torch.int64)),
        "target_logits",
    ),
    (
        "draft_token_ids float",
        lambda a: replace(a, draft_token_ids=torch.zeros((BATCH, K))),
        "draft_token_ids",
    ),
    (
        "target_logits with 0 positions",
        lambda a: replace(a, target_logits=torch.zeros((BATCH, 0, VOCAB))),
        "target_logits",
    ),
    (
        "target_logits with V = 0",
        lambda a: replace(a, target_logits=torch.zeros((BATCH, K + 1, 0))),
        "target_logits",
    ),
    (
        "draft_token_ids with batch B+1",
        lambda a: replace(a, draft_token_ids=torch.zeros((BATCH + 1, K), dtype=torch.int64)),
        "draft_token_ids",
    ),
    (
        "draft_token_ids with k+1 positions",
        lambda a: replace(a, draft_token_ids=torch.zeros((BATCH, K + 1), dtype=torch.int64)),
        "draft_token_ids",
    ),
    (
        "draft_token_ids with k-1 positions",
        lambda a: replace(a, draft_token_ids=torch.zeros((BATCH, K - 1), dtype=torch.int64)),
        "draft_token_ids",
    ),
    (
        "NaN logit",
        lambda a: replace(a, target_logits=_edited(a.target_logits, (1, 2, 3), math.nan)),
        "target_logits",
    ),
    (
        "+inf logit",
        lambda a: replace(a, target_logits=_edited(a.target_logits, (0, 0, 1), math.inf)),
        "target_logits",
    ),
    (
        "all -inf row",
        lambda a: replace(a, target_logits=_edited(a.target_logits, (1, 1), -math.inf)),
        "target_logits",
    ),
    (
        "all -inf bonus row",
        lambda a: replace(a, target_logits=_edited(a.target_logits, (0, K), -math.inf)),
        "target_logits",
    ),
    (
        "negative draft id",
        lambda a: replace(a, draft_token_ids=_edited(a.draft_token_ids, (1, 0), -1)),
        "draft_token_ids",
    ),
    (
        "draft id equal to V",
        lambda a: replace(a, draft_token_ids=_edited(a.draft_token_ids, (0, 1), VOCAB)),
        "draft_token_ids",
    ),
]
"""(description, edit of the valid greedy call, argument the error must name)."""

GREEDY_CALLS: dict[str, Callable[[GreedyArgs], object]] = {
    "validate_greedy_inputs": lambda a: validate_greedy_inputs(a.target_logits, a.draft_token_ids),
    "verify_greedy": lambda a: verify_greedy(
        a.target_logits,  # type: ignore[arg-type]
        a.draft_token_ids,  # type: ignore[arg-type]
    ),
}
"""The greedy-protocol entry points whose validation is checked."""


@pytest.mark.parametrize("entry_point", list(GREEDY_CALLS))
@pytest.mark.parametrize(
    ("edit", "argument"),
    _named_params(GREEDY_PROBLEMS),
)
def test_greedy_entry_points_reject_malformed_inputs_naming_the_argument(
    entry_point: str, edit: GreedyEdit, argument: str
) -> None:
    """Each malformed greedy input (NaN or +inf logits, an all -inf row, bad shapes, dtypes or
    ids) raises ``InvalidInputError`` naming the argument, from every entry point."""
    args = edit(_valid_greedy_args())
    _assert_names_argument(lambda: GREEDY_CALLS[entry_point](args), argument)


@pytest.mark.parametrize("entry_point", list(GREEDY_CALLS))
def test_greedy_entry_points_accept_partially_masked_rows(entry_point: str) -> None:
    """Rows with some (not all) ``-inf`` logits are valid; ``verify_greedy`` then emits the
    argmax of the finite ones."""
    args = _valid_greedy_args()
    result = GREEDY_CALLS[entry_point](args)
    if entry_point == "validate_greedy_inputs":
        assert result == (BATCH, K, VOCAB)
    else:
        assert isinstance(result, torch.Tensor)
        assert result.tolist() == [[4, 4, 4], [4, -1, -1]]
