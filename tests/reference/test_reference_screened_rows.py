"""The screened distinct-row path of the reference chain verifier (validation fused into chunks).

Contiguous CPU float32/float64 inputs with distinct rows take
``losslessness.reference.chain._verify_screened``: the protocol's value checks are made chunk
by chunk on the way (the verifier's own float64 row sums, one scan for the smallest entry, the
drafted entries of q), instead of a separate validation that reads the whole input twice.
Pinned here, all exact:

- **Which calls take it**: exactly the inputs :func:`chain._screenable` describes; anything
  else (expanded rows, other dtypes, layouts, devices, ids, k = 0) takes the general path.
- **Same outputs**: for the same uniforms, the screened path, the general per-row path
  (validated first, unscreened chunks) and the shared-table path on each row alone emit the
  same tokens, over ragged chunks, float32 and float64, V from 1 to 1,000; ``verify`` with a
  generator equals ``verify_with_uniforms`` fed the generator's own uniforms. The law itself is
  pinned statistically by ``test_reference_distinct_rows.py``, whose batches take this path.
- **Same errors**: every malformed value (NaN, +inf, -inf, negative mass, even ``-1e-300``
  that leaves the row sum unchanged, a row sum off by more than the tolerance, a draft on a zero
  of q), in the first or a later chunk, raises exactly the ``InvalidInputError`` of
  ``validate_chain_inputs`` (same argument, same message), and ``verify`` leaves the generator
  as it found it; malformed uniforms are reported after malformed probabilities, as before.
- **The shared sums are the validator's and the final law's**: a row's float64 sum does not
  depend on the tensor it sits in, so the sums of the stopping rows taken from the chunk's sums
  equal the ones ``_final_tokens`` would compute.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import losslessness.reference.chain as chain
from losslessness.protocol import InvalidInputError, validate_chain_inputs
from losslessness.reference import ChainUniforms, sample_inverse_cdf, verify, verify_with_uniforms

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


@pytest.mark.parametrize(
    ("vocab", "k", "dtype", "chunk_elements"),
    [
        (1, 1, torch.float64, 9),
        (2, 3, torch.float32, 7 * 2 * 4),
        (7, 4, torch.float64, 9 * 7 * 5),
        (32, 4, torch.float32, 9 * 32 * 11),
        (1000, 2, torch.float64, 5 * 1000 * 3),
    ],
    ids=["V1-k1-f64", "V2-k3-f32", "V7-k4-f64", "V32-k4-f32", "V1000-k2-f64"],
)
def test_screened_path_equals_the_general_per_row_path_and_the_shared_path(
    monkeypatch: pytest.MonkeyPatch,
    vocab: int,
    k: int,
    dtype: torch.dtype,
    chunk_elements: int,
) -> None:
    """Exact, same uniforms, ragged chunks: the screened path's output equals the general
    per-row path's (validated, unscreened) and, row by row, a shared-table call on that row
    alone (``p[b].expand``), including the uniforms 0 and ``1 - 2**-53``."""
    monkeypatch.setattr(chain, "PER_ROW_CHUNK_ELEMENTS", chunk_elements)
    batch = 47
    target, draft, ids, generator = _inputs(batch, k, vocab, dtype, SEED + vocab + k)
    uniforms = ChainUniforms.draw(batch, k, generator)
    uniforms.accept_uniforms[:3] = 0.0
    uniforms.sample_uniforms[:3] = 0.0
    uniforms.sample_uniforms[3:6] = 1.0 - 2.0**-53
    assert chain._screenable(target, draft, ids)
    assert 1 < chain._rows_per_chunk(k, vocab) < batch
    screened = verify(target, draft, ids, generator, uniforms=uniforms)
    general = chain._verify_per_row(
        target, draft, ids, uniforms.accept_uniforms, uniforms.sample_uniforms
    )
    assert torch.equal(screened, general)
    for b in range(batch):
        alone = verify_with_uniforms(
            target[b : b + 1].expand(3, -1, -1),
            draft[b : b + 1].expand(3, -1, -1),
            ids[b : b + 1].expand(3, -1),
            uniforms.accept_uniforms[b : b + 1].expand(3, -1),
            uniforms.sample_uniforms[b : b + 1].expand(3),
        )
        assert torch.equal(alone[0], screened[b]), f"row {b}"


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


@pytest.mark.parametrize("row", [0, 251], ids=["first-chunk", "later-chunk"])
@pytest.mark.parametrize("name", CORRUPTIONS)
def test_malformed_values_raise_the_validators_own_error_and_leave_the_generator_alone(
    monkeypatch: pytest.MonkeyPatch, name: str, row: int
) -> None:
    """Exact: a malformed value in the first or a later chunk makes the screened call raise the
    very ``InvalidInputError`` of ``validate_chain_inputs`` (argument and message), from
    ``verify`` (generator state unchanged) and from ``verify_with_uniforms``. A negative entry
    of ``-1e-300``, which leaves its row sum unchanged, is caught too."""
    monkeypatch.setattr(chain, "PER_ROW_CHUNK_ELEMENTS", 9 * 16 * 40)
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
    output then equals the general path's."""
    target, draft, ids, generator = _inputs(40, 2, 8, torch.float64, SEED + 5)
    target[target == 0] = -0.0
    validate_chain_inputs(target, draft, ids)
    uniforms = ChainUniforms.draw(40, 2, generator)
    screened = verify(target, draft, ids, generator, uniforms=uniforms)
    general = chain._verify_per_row(
        target, draft, ids, uniforms.accept_uniforms, uniforms.sample_uniforms
    )
    assert torch.equal(screened, general)


@pytest.mark.parametrize("vocab", [1, 3, 8, 31, 32, 33, 257, 32_000])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_a_rows_float64_sum_is_the_same_in_the_chunk_and_gathered_alone(
    vocab: int, dtype: torch.dtype
) -> None:
    """Exact: ``_row_sums`` of a ``[c, m, V]`` chunk, read at one position per row, equals the
    sum of that row gathered alone into ``[c, V]`` and of the row as ``[1, V]`` (the shared
    path's tables), to the bit, so the screened path may hand its sums to ``_final_tokens``."""
    generator = torch.Generator().manual_seed(SEED + vocab)
    rows, positions = 13, 5
    chunk = torch.rand((rows, positions, vocab), generator=generator, dtype=torch.float64).to(dtype)
    position = torch.randint(0, positions, (rows,), generator=generator)
    sums = chain._row_sums(chunk, torch.float64).gather(1, position.unsqueeze(1)).squeeze(1)
    gathered = chunk[torch.arange(rows), position]
    assert torch.equal(sums, gathered.to(torch.float64).sum(dim=-1))
    for b in range(rows):
        alone = chunk[b, int(position[b])].unsqueeze(0)
        assert torch.equal(sums[b : b + 1], alone.sum(dim=-1, dtype=torch.float64))


def test_final_tokens_with_the_callers_row_sums_equal_final_tokens_without_them() -> None:
    """Exact: ``_final_tokens`` given the rows' float64 sums equals the same call computing
    them, on rows mixing bonus rows, residuals with mass and residuals without."""
    generator = torch.Generator().manual_seed(SEED + 6)
    p = torch.rand((200, 12), generator=generator, dtype=torch.float64)
    q = torch.rand((200, 12), generator=generator, dtype=torch.float64)
    q[::7] = p[::7]
    bonus = torch.rand(200, generator=generator) < 0.3
    uniforms = torch.rand(200, generator=generator, dtype=torch.float64)
    sums = (p.sum(dim=-1, keepdim=True), q.sum(dim=-1, keepdim=True))
    assert torch.equal(
        chain._final_tokens(p.clone(), q.clone(), bonus, uniforms, sums),
        chain._final_tokens(p.clone(), q.clone(), bonus, uniforms),
    )
