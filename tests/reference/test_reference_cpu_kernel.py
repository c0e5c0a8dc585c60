"""The reference chain verifier on CPU: the compiled kernel, its tables and its screening.

On CPU, distinct rows are verified by ``losslessness.reference.chain_kernel.verify_rows`` (one
pass per row, on one or more threads) and shared rows from ``chain_kernel.final_tables``, with
the same float64 arithmetic; contiguous float32/float64 inputs with int64 ids are *screened*
(``chain._verify_screened``): the protocol's value checks are made on what the kernel reads,
instead of a separate validation that reads the whole input twice. Pinned here, all exact:

- **Which calls take it**: exactly the inputs :func:`chain._screenable` describes; anything
  else (expanded rows, other dtypes, layouts, ids, k = 0) is validated first.
- **Same outputs**: for the same uniforms, the screened call, the validated call (int32 ids,
  non-contiguous, float16/bfloat16 or mixed-precision inputs, converted exactly), the thread
  split, and the shared-table path on each row alone emit the same tokens, float32 and
  float64, V from 1 to 1,000, including the uniforms 0 and ``1 - 2**-53``; ``verify`` with a
  generator equals ``verify_with_uniforms`` fed the generator's own uniforms. The law itself
  is pinned statistically by ``test_reference_distinct_rows.py``, whose batches take this path.
- **The stated arithmetic**: the kernel's row sums are the four-accumulator sums its docstring
  states; its tokens agree with the accelerators' torch arithmetic (run here on CPU) on
  random rows, as two roundings of one rule must away from decision boundaries.
- **Same errors**: every malformed value (NaN, +inf, -inf, negative mass, even ``-1e-300``
  that leaves the row sum unchanged, a row sum off by more than the tolerance, a draft on a zero
  of q), in the first or the second thread's rows, raises exactly the ``InvalidInputError`` of
  ``validate_chain_inputs`` (same argument, same message), and ``verify`` leaves the generator
  as it found it; malformed uniforms are reported after malformed probabilities.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import losslessness.reference.chain as chain
from losslessness.protocol import InvalidInputError, validate_chain_inputs
from losslessness.reference import (
    ChainUniforms,
    chain_kernel,
    sample_inverse_cdf,
    verify,
    verify_with_uniforms,
)
from tests.reference.chain_helpers import verify_each_row_alone

SEED = 20261124
"""Root of every random tensor in this file."""


def _inputs(
    batch: int, k: int, vocab: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator]:
    """Distinct rows: p ``[B, k+1, V]`` with exact zeros, q ``[B, k, V]``, normalised in
    ``dtype``, and drafts ``[B, k]`` d_i ~ q_i; the generator that drew them."""
    generator = torch.Generator().manual_seed(seed)
    p = torch.rand((batch, k + 1, vocab), generator=generator, dtype=torch.float64) ** 3
    q = torch.rand((batch, k, vocab), generator=generator, dtype=torch.float64) ** 3
    p[torch.rand(p.shape, generator=generator) < 0.3] = 0.0
    p[..., -1] += 0.01
    target = (p / p.sum(dim=-1, keepdim=True)).to(dtype)
    draft = (q / q.sum(dim=-1, keepdim=True)).to(dtype)
    ids = torch.stack(
        [
            sample_inverse_cdf(
                draft[:, i], torch.rand(batch, generator=generator, dtype=torch.float64)
            )
            for i in range(k)
        ],
        dim=1,
    )
    return target, draft, ids, generator


def _spy_on_screened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record ``"screened"`` each time :func:`chain._verify_screened` runs."""
    taken: list[str] = []
    original: Callable[..., torch.Tensor] = chain._verify_screened

    def spy(*args: object) -> torch.Tensor:
        taken.append("screened")
        return original(*args)

    monkeypatch.setattr(chain, "_verify_screened", spy)
    return taken


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_contiguous_cpu_float_inputs_take_the_screened_path_and_others_do_not(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """Exact: a contiguous float32/float64 CPU call with int64 ids in range takes the screened
    path (a grad-requiring one too, detached); a float16, expanded, non-contiguous, int32-id,
    out-of-range-id or k = 0 call does not (and is still answered, or refused, by the general
    path)."""
    target, draft, ids, generator = _inputs(20, 2, 8, dtype, SEED)
    taken = _spy_on_screened(monkeypatch)
    assert chain._screenable(target, draft, ids)
    verify(target, draft, ids, generator)
    with_grad = target.clone().requires_grad_(True)
    assert chain._screenable(with_grad, draft, ids)
    uniforms = ChainUniforms.draw(20, 2, generator)
    assert torch.equal(
        verify(with_grad, draft, ids, generator, uniforms=uniforms),
        verify(target, draft, ids, generator, uniforms=uniforms),
    )
    assert taken == ["screened"] * 3
    wide_target = torch.cat([target, target], dim=2)[..., :8]
    assert not chain._screenable(target.half(), draft.half(), ids)
    others = [
        (target[:1].expand(20, -1, -1), draft[:1].expand(20, -1, -1), ids),
        (wide_target, draft, ids),
        (target, draft, ids.to(torch.int32)),
        (target[:, :1], draft[:, :0], ids[:, :0]),
    ]
    for other in others:
        assert not chain._screenable(*other)
        verify(*other, generator)
    out_of_range = ids.clone()
    out_of_range[3, 1] = 8
    assert not chain._screenable(target, draft, out_of_range)
    with pytest.raises(InvalidInputError, match="draft_token_ids"):
        verify(target, draft, out_of_range, generator)
    assert taken == ["screened"] * 3


def _validated_variants(
    target: torch.Tensor, draft: torch.Tensor, ids: torch.Tensor
) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The same inputs in forms that skip the screening: int32 ids, non-contiguous rows."""
    padded = (torch.cat([target, target], dim=-1), torch.cat([draft, draft], dim=-1))
    vocab = target.shape[-1]
    return {
        "int32 ids": (target, draft, ids.to(torch.int32)),
        "non-contiguous": (padded[0][..., :vocab], padded[1][..., :vocab], ids),
    }


@pytest.mark.parametrize(
    ("vocab", "k", "dtype"),
    [
        (1, 1, torch.float64),
        (2, 3, torch.float32),
        (7, 4, torch.float64),
        (32, 4, torch.float32),
        (1000, 2, torch.float64),
    ],
    ids=["V1-k1-f64", "V2-k3-f32", "V7-k4-f64", "V32-k4-f32", "V1000-k2-f64"],
)
@pytest.mark.parametrize("threads", [1, 2], ids=["one-thread", "two-threads"])
def test_screened_path_equals_the_validated_path_and_the_shared_path(
    request: pytest.FixtureRequest, vocab: int, k: int, dtype: torch.dtype, threads: int
) -> None:
    """Exact, same uniforms: the screened call's output equals the validated call's (int32
    ids, non-contiguous rows) and, row by row, a shared-table call on that row alone
    (``p[b].expand``), on one thread or split over two, including the uniforms 0 and
    ``1 - 2**-53``."""
    if threads == 2:
        request.getfixturevalue("two_threads")
    batch = 47
    target, draft, ids, generator = _inputs(batch, k, vocab, dtype, SEED + vocab + k)
    uniforms = ChainUniforms.draw(batch, k, generator)
    uniforms.accept_uniforms[:3] = 0.0
    uniforms.sample_uniforms[:3] = 0.0
    uniforms.sample_uniforms[3:6] = 1.0 - 2.0**-53
    assert chain._screenable(target, draft, ids)
    screened = verify(target, draft, ids, generator, uniforms=uniforms)
    for name, inputs in _validated_variants(target, draft, ids).items():
        assert not chain._screenable(*inputs)
        assert torch.equal(verify(*inputs, generator, uniforms=uniforms), screened), name
    assert torch.equal(verify_each_row_alone(target, draft, ids, uniforms), screened)


@pytest.mark.parametrize(
    ("target_dtype", "draft_dtype", "kernel_dtype"),
    [
        (torch.float16, torch.float16, torch.float32),
        (torch.bfloat16, torch.float32, torch.float32),
        (torch.float32, torch.float64, torch.float64),
    ],
    ids=["f16", "bf16-f32", "f32-f64"],
)
def test_narrow_and_mixed_precision_inputs_are_verified_as_their_exact_conversions(
    target_dtype: torch.dtype, draft_dtype: torch.dtype, kernel_dtype: torch.dtype
) -> None:
    """Exact: float16/bfloat16 inputs equal their (exact) float32 conversions, and a float32
    input beside a float64 one equals its float64 conversion, on distinct and shared rows."""
    generator = torch.Generator().manual_seed(SEED + 7)

    def dyadic_rows(positions: int, dtype: torch.dtype) -> torch.Tensor:
        # Multiples of 1/256 summing to 1: exact in float16 and bfloat16.
        draws = torch.randint(0, 24, (60, positions, 256), generator=generator)
        counts = torch.zeros((60, positions, 24), dtype=torch.float64)
        counts.scatter_add_(2, draws, torch.ones_like(draws, dtype=torch.float64))
        return (counts / 256).to(dtype)

    target, draft = dyadic_rows(4, target_dtype), dyadic_rows(3, draft_dtype)
    ids = torch.stack(
        [
            sample_inverse_cdf(
                draft[:, i].double(), torch.rand(60, generator=generator, dtype=torch.float64)
            )
            for i in range(3)
        ],
        dim=1,
    )
    uniforms = ChainUniforms.draw(60, 3, generator)
    converted = (target.to(kernel_dtype), draft.to(kernel_dtype), ids)
    assert torch.equal(
        verify(target, draft, ids, generator, uniforms=uniforms),
        verify(*converted, generator, uniforms=uniforms),
    )
    shared = (target[:1].expand(60, -1, -1), draft[:1].expand(60, -1, -1))
    assert torch.equal(
        verify(*shared, ids[:1].expand(60, -1), generator, uniforms=uniforms),
        verify(
            shared[0].to(kernel_dtype),
            shared[1].to(kernel_dtype),
            ids[:1].expand(60, -1),
            generator,
            uniforms=uniforms,
        ),
    )


@pytest.mark.parametrize("vocab", [1, 3, 4, 5, 31, 32, 33, 257])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_kernel_row_sums_are_the_stated_four_accumulator_sums(
    vocab: int, dtype: torch.dtype
) -> None:
    """Exact: ``chain_kernel.row_sums`` is ``(a0 + a1) + (a2 + a3)`` with ``a_r`` the
    sequential float64 sum of the entries ``j = r (mod 4)`` (the tail in ``a0``), the order
    both CPU paths rely on."""
    rows = torch.rand((6, vocab), generator=torch.Generator().manual_seed(SEED + vocab))
    rows = rows.to(dtype)
    got = chain_kernel.row_sums(rows.numpy())
    for r, row in enumerate(rows.tolist()):
        full = vocab - vocab % 4
        lanes = [0.0, 0.0, 0.0, 0.0]
        for j in range(full):
            lanes[j % 4] += row[j]
        for j in range(full, vocab):
            lanes[0] += row[j]
        assert got[r] == (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_kernel_agrees_with_the_accelerators_torch_arithmetic_on_random_rows(
    dtype: torch.dtype,
) -> None:
    """The two arithmetics of one rule (compiled on CPU, torch ops on accelerators, here run on
    CPU) emit the same tokens on 2,000 random rows of V = 32, k = 4: they differ in rounding
    only, so a disagreement needs a uniform within a few ulps of a boundary (about 1e-13 of
    the rows here). A divergence beyond rounding in either path fails this."""
    target, draft, ids, generator = _inputs(2000, 4, 32, dtype, SEED + 8)
    uniforms = ChainUniforms.draw(2000, 4, generator)
    assert torch.equal(
        verify(target, draft, ids, generator, uniforms=uniforms),
        chain._verify_per_row(
            target, draft, ids, uniforms.accept_uniforms, uniforms.sample_uniforms
        ),
    )


def test_screened_verify_draws_the_generators_uniforms_as_verify_with_uniforms_uses_them() -> None:
    """Exact: ``verify(..., generator)`` on the screened path equals ``verify_with_uniforms``
    fed :meth:`ChainUniforms.draw` of an identical generator, and advances the generator by
    exactly those draws."""
    target, draft, ids, _ = _inputs(300, 4, 32, torch.float64, SEED + 1)
    generator = torch.Generator().manual_seed(SEED + 2)
    replay = torch.Generator().manual_seed(SEED + 2)
    drawn = ChainUniforms.draw(300, 4, replay)
    assert torch.equal(
        verify(target, draft, ids, generator),
        verify_with_uniforms(target, draft, ids, drawn.accept_uniforms, drawn.sample_uniforms),
    )
    assert torch.equal(generator.get_state(), replay.get_state())


def _corrupt(
    name: str, target: torch.Tensor, draft: torch.Tensor, ids: torch.Tensor, row: int
) -> None:
    """Make one value of batch row ``row`` malformed in place (``name`` says how)."""
    if name == "nan-target":
        target[row, 1, 3] = float("nan")
    elif name == "inf-draft":
        draft[row, 0, 2] = float("inf")
    elif name == "minus-inf-target":
        target[row, 2, 0] = float("-inf")
    elif name == "negative-target":
        target[row, 0, 1] -= 0.25
        target[row, 0, 2] += 0.25
    elif name == "tiny-negative-draft":
        draft[row, 1, 5] = -1e-300
    elif name == "row-sum-draft":
        draft[row, 1] *= 1.001
    elif name == "draft-on-zero":
        position, token = 1, int(ids[row, 1])
        mass = draft[row, position, token].clone()
        draft[row, position, token] = 0.0
        draft[row, position, (token + 1) % draft.shape[-1]] += mass
    else:
        raise AssertionError(name)


CORRUPTIONS = [
    "nan-target",
    "inf-draft",
    "minus-inf-target",
    "negative-target",
    "tiny-negative-draft",
    "row-sum-draft",
    "draft-on-zero",
]


@pytest.mark.parametrize("row", [0, 251], ids=["first-thread", "second-thread"])
@pytest.mark.parametrize("name", CORRUPTIONS)
@pytest.mark.usefixtures("two_threads")
def test_malformed_values_raise_the_validators_own_error_and_leave_the_generator_alone(
    name: str, row: int
) -> None:
    """Exact: a malformed value in the first or the second thread's rows makes the screened
    call raise the
    very ``InvalidInputError`` of ``validate_chain_inputs`` (argument and message), from
    ``verify`` (generator state unchanged) and from ``verify_with_uniforms``. A negative entry
    of ``-1e-300``, which leaves its row sum unchanged, is caught too."""
    target, draft, ids, _ = _inputs(300, 4, 16, torch.float64, SEED + 3)
    _corrupt(name, target, draft, ids, row)
    assert chain._screenable(target, draft, ids)
    with pytest.raises(InvalidInputError) as expected:
        validate_chain_inputs(target, draft, ids)
    generator = torch.Generator().manual_seed(SEED)
    state = generator.get_state()
    with pytest.raises(InvalidInputError) as got:
        verify(target, draft, ids, generator)
    assert (got.value.argument, str(got.value)) == (expected.value.argument, str(expected.value))
    assert torch.equal(generator.get_state(), state)
    uniforms = ChainUniforms.draw(300, 4, torch.Generator().manual_seed(SEED))
    with pytest.raises(InvalidInputError) as again:
        verify_with_uniforms(target, draft, ids, uniforms.accept_uniforms, uniforms.sample_uniforms)
    assert str(again.value) == str(expected.value)


def test_malformed_uniforms_are_reported_after_malformed_probabilities() -> None:
    """Exact, the protocol's order: with NaN in ``target_probs`` and uniforms outside [0, 1),
    the error names ``target_probs``; with valid probabilities it names the uniforms (and a
    ``uniforms`` keyword that is no ChainUniforms names ``uniforms``)."""
    target, draft, ids, generator = _inputs(50, 2, 8, torch.float64, SEED + 4)
    accept = torch.full((50, 2), 0.5, dtype=torch.float64)
    sample = torch.full((50,), 1.5, dtype=torch.float64)
    with pytest.raises(InvalidInputError, match="sample_uniforms"):
        verify_with_uniforms(target, draft, ids, accept, sample)
    with pytest.raises(InvalidInputError, match="uniforms"):
        verify(target, draft, ids, generator, uniforms=(accept, sample))  # type: ignore[arg-type]
    target[10, 0, 0] = float("nan")
    with pytest.raises(InvalidInputError, match="target_probs"):
        verify_with_uniforms(target, draft, ids, accept, sample)
    with pytest.raises(InvalidInputError, match="target_probs"):
        verify(target, draft, ids, generator, uniforms=ChainUniforms(accept, sample))


def test_negative_zero_entries_are_valid_on_the_screened_path() -> None:
    """Exact: ``-0.0`` is no negative mass for the validator, nor for the screened path, whose
    output then equals the validated path's."""
    target, draft, ids, generator = _inputs(40, 2, 8, torch.float64, SEED + 5)
    target[target == 0] = -0.0
    validate_chain_inputs(target, draft, ids)
    uniforms = ChainUniforms.draw(40, 2, generator)
    screened = verify(target, draft, ids, generator, uniforms=uniforms)
    validated = verify(target, draft, ids.to(torch.int32), generator, uniforms=uniforms)
    assert torch.equal(screened, validated)
