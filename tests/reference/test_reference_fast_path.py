"""The reference chain verifier's two paths, its coupling keyword and its device handling.

Pins: the shared-table path (rows that are one memory, ``p.expand(B, k+1, V)``) and the per-row
path give token-for-token identical outputs for the same uniforms, on shared and on distinct
rows; the shared path is the one taken for expanded inputs (spied on) and never for
materialised ones; ``verify(..., uniforms=ChainUniforms)`` equals ``verify_with_uniforms`` and
leaves the generator untouched; drawing from a shared cumulative table equals drawing from a
per-draw copy; inputs on different devices are refused naming the argument; the audit's
sampler gives the verifier contiguous inputs and re-samples when a verifier writes into them.
All exact (no statistics): the law itself is pinned by
``tests/reference/test_reference_properties.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import losslessness.reference.chain as chain
from losslessness.batteries import default_chain_battery
from losslessness.engine.draw import sample_chain
from losslessness.protocol import InvalidInputError
from losslessness.reference import (
    ChainUniforms,
    accepted_lengths,
    compute_dtype,
    sample_inverse_cdf,
    sample_inverse_cdf_from_tables,
    shares_rows,
    verify,
    verify_greedy,
    verify_with_uniforms,
)

SEED = 20240611
"""Fixed seed of every random tensor below (printed by pytest on failure via the ids)."""


def _pair(vocab: int, k: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """p ``[k+1, V]`` and q ``[k, V]`` with exact zeros in both (so residuals and overflow
    paths are exercised), rows normalised in ``dtype``."""
    generator = torch.Generator().manual_seed(seed)
    concentration = torch.full((vocab,), 0.3, dtype=torch.float64)
    gamma = torch.distributions.Gamma(concentration, torch.ones_like(concentration))
    torch.manual_seed(seed)
    p = gamma.sample((k + 1,))
    q = gamma.sample((k,))
    p[:, torch.rand(vocab, generator=generator) < 0.3] = 0.0
    p[:, 0] += 0.1
    q[:, 1 % vocab] += 0.1
    p = (p / p.sum(dim=-1, keepdim=True)).to(dtype)
    q = (q / q.sum(dim=-1, keepdim=True)).to(dtype)
    return p, q


def _drafts(q: torch.Tensor, batch: int, generator: torch.Generator) -> torch.Tensor:
    """``[B, k]`` drafts d_i ~ q_i."""
    k = q.shape[0]
    if k == 0:
        return torch.zeros((batch, 0), dtype=torch.int64)
    columns = [
        sample_inverse_cdf(q[i], torch.rand(batch, generator=generator, dtype=torch.float64))
        for i in range(k)
    ]
    return torch.stack(columns, dim=1)


CASES = [
    (2, 1, torch.float64),
    (32, 4, torch.float32),
    (3000, 3, torch.float32),
    (9, 0, torch.float64),
]


@pytest.mark.parametrize(("vocab", "k", "dtype"), CASES)
def test_shared_table_path_equals_per_row_path_on_shared_rows_for_the_same_uniforms(
    vocab: int, k: int, dtype: torch.dtype
) -> None:
    """Exact: on expanded inputs the shared-table path emits exactly what the per-row path
    emits on the same rows materialised, uniform for uniform (including u = 0 and u -> 1)."""
    batch = 4000
    p, q = _pair(vocab, k, dtype, SEED + vocab + k)
    generator = torch.Generator().manual_seed(SEED)
    ids = _drafts(q, batch, generator)
    uniforms = ChainUniforms.draw(batch, k, generator)
    accept, sample = uniforms.accept_uniforms.clone(), uniforms.sample_uniforms.clone()
    accept[:5] = 0.0
    sample[:5] = 0.0
    sample[5:10] = 1.0 - 2.0**-53
    shared = verify_with_uniforms(
        p.expand(batch, -1, -1), q.expand(batch, -1, -1), ids, accept, sample
    )
    per_row = verify_with_uniforms(
        p.expand(batch, -1, -1).contiguous(),
        q.expand(batch, -1, -1).contiguous(),
        ids,
        accept,
        sample,
    )
    assert torch.equal(shared, per_row)


def test_per_row_path_on_distinct_rows_equals_row_by_row_shared_calls() -> None:
    """Exact: on a batch of different rows, each row's output equals a shared-table call on a
    batch made of that row alone, with the same uniforms (the paths agree on distinct rows)."""
    rows, copies, vocab, k = 3, 500, 40, 3
    pairs = [_pair(vocab, k, torch.float64, SEED + r) for r in range(rows)]
    target = torch.stack([p for p, _ in pairs]).repeat(copies, 1, 1)
    draft = torch.stack([q for _, q in pairs]).repeat(copies, 1, 1)
    generator = torch.Generator().manual_seed(SEED)
    ids = torch.stack([_drafts(q, copies, generator) for _, q in pairs], dim=1).reshape(
        rows * copies, k
    )
    uniforms = ChainUniforms.draw(rows * copies, k, generator)
    together = verify(target, draft, ids, generator, uniforms=uniforms)
    for r, (p, q) in enumerate(pairs):
        alone = verify_with_uniforms(
            p.expand(copies, -1, -1),
            q.expand(copies, -1, -1),
            ids[r::rows],
            uniforms.accept_uniforms[r::rows],
            uniforms.sample_uniforms[r::rows],
        )
        assert torch.equal(together[r::rows], alone)


def test_expanded_inputs_take_the_shared_path_and_materialised_ones_the_per_row_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast path is really taken: a spy on the CPU paths records which one ran (shared
    rows the tables, distinct rows the compiled kernel, screened or validated first)."""
    taken: list[str] = []

    def spying_on(name: str) -> Callable[..., torch.Tensor]:
        original: Callable[..., torch.Tensor] = getattr(chain, name)

        def spy(*args: torch.Tensor) -> torch.Tensor:
            taken.append(name)
            return original(*args)

        return spy

    for name in ("_verify_shared_cpu", "_kernel_rows", "_verify_screened"):
        monkeypatch.setattr(chain, name, spying_on(name))
    p, q = _pair(16, 2, torch.float64, SEED)
    generator = torch.Generator().manual_seed(SEED)
    ids = _drafts(q, 100, generator)
    expanded = (p.expand(100, -1, -1), q.expand(100, -1, -1))
    assert shares_rows(*expanded)
    verify(*expanded, ids, generator)
    verify(expanded[0].contiguous(), expanded[1].contiguous(), ids, generator)
    verify(expanded[0].contiguous(), expanded[1].contiguous(), ids.to(torch.int32), generator)
    assert taken == [
        "_verify_shared_cpu",
        "_verify_screened",
        "_kernel_rows",
        "_kernel_rows",
    ]
    assert not shares_rows(expanded[0].contiguous(), expanded[1])


def test_verify_with_uniforms_keyword_equals_verify_with_uniforms_and_leaves_generator_alone() -> (
    None
):
    """Exact: ``verify(..., uniforms=u)`` == ``verify_with_uniforms(..., u)``; the generator's
    state does not move; without the keyword ``verify`` consumes ``ChainUniforms.draw``."""
    p, q = _pair(24, 3, torch.float32, SEED)
    batch = 300
    generator = torch.Generator().manual_seed(SEED)
    ids = _drafts(q, batch, generator)
    target, draft = p.expand(batch, -1, -1), q.expand(batch, -1, -1)
    uniforms = ChainUniforms.draw(batch, 3, torch.Generator().manual_seed(SEED + 1))
    state = generator.get_state()
    keyword = verify(target, draft, ids, generator, uniforms=uniforms)
    assert torch.equal(generator.get_state(), state)
    explicit = verify_with_uniforms(
        target, draft, ids, uniforms.accept_uniforms, uniforms.sample_uniforms
    )
    assert torch.equal(keyword, explicit)
    replay = torch.Generator().manual_seed(SEED + 1)
    assert torch.equal(verify(target, draft, ids, replay), explicit)


@pytest.mark.parametrize(
    ("uniforms", "argument"),
    [
        ("not uniforms", "uniforms"),
        (ChainUniforms(torch.rand(5, 3), torch.rand(4)), "accept_uniforms"),
        (ChainUniforms(torch.rand(4, 3), torch.full((4,), 1.0)), "sample_uniforms"),
    ],
)
def test_malformed_uniforms_keyword_is_refused_naming_the_argument(
    uniforms: object, argument: str
) -> None:
    """Bad input: a wrong type, shape or value of ``uniforms`` raises InvalidInputError naming
    the offending field."""
    p, q = _pair(8, 3, torch.float64, SEED)
    ids = _drafts(q, 4, torch.Generator().manual_seed(SEED))
    with pytest.raises(InvalidInputError) as raised:
        verify(p.expand(4, -1, -1), q.expand(4, -1, -1), ids, torch.Generator(), uniforms=uniforms)  # type: ignore[arg-type]
    assert raised.value.argument == argument


@pytest.mark.parametrize("n_tables", [6, 200, 40_000], ids=["int8", "int16", "int32"])
def test_drawing_from_shared_tables_equals_drawing_from_per_draw_rows(n_tables: int) -> None:
    """Exact: ``sample_inverse_cdf_from_tables(P, t, u) == sample_inverse_cdf(P[t], u)``,
    including uniforms whose target rounds up to the total (the last positive-mass token), for
    table counts whose labels are grouped as int8, int16 and int32."""
    generator = torch.Generator().manual_seed(SEED)
    probs = torch.rand((n_tables, 50), generator=generator, dtype=torch.float64)
    probs[:, -7:] = 0.0
    probs[2] = 0.0
    probs[2, 3] = 1.0
    table = torch.randint(0, n_tables, (5000,), generator=generator)
    table[:n_tables] = torch.arange(min(n_tables, 5000))
    uniforms = torch.rand(5000, generator=generator, dtype=torch.float64)
    uniforms[:20] = 1.0 - 2.0**-53
    got = sample_inverse_cdf_from_tables(probs, table, uniforms)
    assert torch.equal(got, sample_inverse_cdf(probs[table], uniforms))
    assert bool((probs[table, got] > 0).all())


@pytest.mark.parametrize("k", [0, 1, 2, 5, 8])
def test_accepted_lengths_is_the_leading_run_of_accepted_drafts(k: int) -> None:
    """``accepted_lengths`` equals its definition, the number of leading True per row (the
    product-of-prefixes formula), on random decisions with every run length present."""
    generator = torch.Generator().manual_seed(SEED + k)
    accepted = torch.rand((4000, k), generator=generator) < 0.8
    expected = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    got = accepted_lengths(accepted)
    assert got.dtype == torch.int64
    assert torch.equal(got, expected)
    assert set(got.tolist()) == set(range(k + 1))


def test_reference_outputs_live_on_the_inputs_device_and_mixed_devices_are_refused() -> None:
    """Device-generic: outputs come back on the inputs' device (cpu here; ``tests/gpu`` runs
    cuda), the compute dtype is float64 except on mps, and inputs split over two devices
    raise InvalidInputError naming the argument on the other device (meta stands in for an
    accelerator: the check fires before any value is read)."""
    p, q = _pair(8, 2, torch.float64, SEED)
    generator = torch.Generator().manual_seed(SEED)
    ids = _drafts(q, 10, generator)
    target, draft = p.expand(10, -1, -1), q.expand(10, -1, -1)
    assert verify(target, draft, ids, generator).device == target.device
    assert compute_dtype(torch.device("cpu")) == torch.float64
    assert compute_dtype(torch.device("cuda", 0)) == torch.float64
    assert compute_dtype(torch.device("mps")) == torch.float32
    with pytest.raises(InvalidInputError) as raised:
        chain._require_same_device(target, draft, ids.to("meta"))
    assert raised.value.argument == "draft_token_ids"
    logits = torch.randn(10, 3, 8, dtype=torch.float64)
    assert verify_greedy(logits, ids).device == logits.device


def test_audit_sampler_gives_contiguous_inputs_and_resamples_a_verifier_that_writes_into_them() -> (
    None
):
    """The audit's calls get dense (contiguous) p and q; a verifier that reverses its inputs in
    place after each call gets the case re-sampled on fresh copies, so the samples equal those
    of a verifier that leaves its inputs alone, and every re-sampled call saw the exact rows."""
    case = next(c for c in default_chain_battery() if c.case_id == "v4096-flat")
    intact: list[bool] = []

    def writes_into_inputs(
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
    ) -> torch.Tensor:
        assert target_probs.is_contiguous() and draft_probs.is_contiguous()
        rows = target_probs.shape[0]
        intact.append(torch.equal(target_probs, case.target_probs.expand(rows, -1, -1)))
        out = verify(target_probs, draft_probs, draft_token_ids, generator)
        target_probs.copy_(target_probs.flip(-1))
        return out

    samples = sample_chain(writes_into_inputs, case, 800, seed=SEED)
    clean = sample_chain(verify, case, 800, seed=SEED)
    assert samples.calls == clean.calls >= 2
    assert not all(intact[: samples.calls]), "the first pass should have seen altered inputs"
    assert all(intact[samples.calls :]) and len(intact) == 2 * samples.calls
    assert (samples.outputs == clean.outputs).all()
    assert (samples.drafts == clean.drafts).all()
