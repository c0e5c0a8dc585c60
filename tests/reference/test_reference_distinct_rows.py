"""The reference chain verifier on distinct rows (every row its own p and q).

On CPU, rows that do not share memory are verified by the compiled kernel
(``losslessness.reference.chain_kernel.verify_rows``, one pass per row; contiguous float rows,
as here, screened: pinned further in ``test_reference_cpu_kernel.py``). Pinned here:

- **Exact agreement with the shared-table path**: on distinct rows, float32 and float64, V up
  to 32,000, every row's output equals a shared-table call on that row alone with the same
  uniforms (the audit hands the verifier dense rows, so it samples what the tables would).
- **The law, statistically**: among steps reaching position i, the emitted token follows p_i
  (identity test, exact on ``p == 0`` cells), and after a rejection at i it follows
  ``norm(max(0, p_i - q_i))`` (the residual, a diagnostic law that localises a broken
  correction step). Family-wise false-alarm rate :data:`FAMILY_WISE_ALPHA`, Bonferroni over
  every statistical assertion of the file; the test's power is shown on a mutant of this very
  path (rejections resampled from p), which must fail it.
- **Edge cases, exact**: a residual with no mass (p == q up to rounding, where the acceptance
  ratio rounds below 1 and a rejection does happen) draws from p, never from an all-zero row;
  a position with ``p_i == q_i`` accepts every draft; no token with ``p = 0`` is ever emitted,
  including at the uniforms 0 and ``1 - 2**-53``; the accelerators' torch path (run here on
  CPU) works in chunks of bounded size.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import losslessness.reference.chain as chain
from losslessness.laws import chain_laws
from losslessness.protocol import PLACEHOLDER
from losslessness.reference import (
    ChainUniforms,
    sample_inverse_cdf,
    shares_rows,
    verify,
    verify_with_uniforms,
)
from losslessness.stats import ErrorBudget, identity_minimum_detectable_tv, identity_test
from tests.reference.chain_helpers import verify_each_row_alone

SEED = 20250113
"""Root of every random tensor in this file."""

ROW_TYPES = 8
VOCAB = 16
K = 3
STEPS_PER_ROW_TYPE = 6000
"""The statistical test's batch: ``ROW_TYPES`` distinct (p, q) pairs, interleaved (row ``b``
has type ``b % ROW_TYPES``), ``STEPS_PER_ROW_TYPE`` steps each: 48,000 rows."""

DTYPES = (torch.float64, torch.float32)

FAMILY_WISE_ALPHA = 1e-4
"""Probability that this file reports any statistical false alarm on a correct reference."""

ASSERTIONS_PER_DTYPE = ROW_TYPES * ((K + 1) + K)
"""Per dtype: an identity test of the emitted token at each of the k+1 positions, and of the
token emitted after a rejection at each of the k draft positions, per row type."""

BUDGET = ErrorBudget(
    n_assertions=len(DTYPES) * ASSERTIONS_PER_DTYPE, family_wise_alpha=FAMILY_WISE_ALPHA
)
ALPHA = BUDGET.per_assertion_alpha
"""Per-assertion level: 1e-4 / 112, about 8.9e-7."""

MUTANT_MIN_FAILURES = ROW_TYPES
"""The mutant (rejections resampled from p) must fail at least this many assertions."""


def _row_types(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``[R, k+1, V]`` p and ``[R, k, V]`` q, all rows different: Dirichlet(0.5) rows with
    exact zeros in p (tokens that must never be emitted), and in row type 0 ``q_1 == p_1``
    (a position whose residual has no mass: it accepts every draft). Normalised in ``dtype``."""
    generator = torch.Generator().manual_seed(SEED)
    gamma = torch.distributions.Gamma(torch.full((VOCAB,), 0.5, dtype=torch.float64), 1.0)
    torch.manual_seed(SEED)
    p = gamma.sample((ROW_TYPES, K + 1))
    q = gamma.sample((ROW_TYPES, K))
    p[torch.rand(p.shape, generator=generator, dtype=torch.float64) < 0.2] = 0.0
    p[..., 0] += 0.05
    q[..., 1] += 0.05
    p = p / p.sum(dim=-1, keepdim=True)
    q = q / q.sum(dim=-1, keepdim=True)
    q[0, 1] = p[0, 1]
    return p.to(dtype), q.to(dtype)


def _drafts(draft_probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``[N, k]`` drafts ``d_i ~ q_i`` row by row (``draft_probs`` ``[N, k, V]``)."""
    rows, k, _ = draft_probs.shape
    columns = [
        sample_inverse_cdf(
            draft_probs[:, i], torch.rand(rows, generator=generator, dtype=torch.float64)
        )
        for i in range(k)
    ]
    return torch.stack(columns, dim=1) if columns else torch.zeros((rows, 0), dtype=torch.int64)


def _interleaved(
    p: torch.Tensor, q: torch.Tensor, copies: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``copies`` of every row type, materialised (the per-row path), row ``b`` of type
    ``b % R``."""
    return p.repeat(copies, 1, 1), q.repeat(copies, 1, 1)


def _law_failures(
    output: torch.Tensor, p: torch.Tensor, q: torch.Tensor, alpha: float
) -> tuple[list[str], int]:
    """Run every statistical assertion of one sampled batch; return the failures and the
    number of assertions made. ``output`` ``[copies * R, k+1]`` from :func:`_interleaved`."""
    rows = p.shape[0]
    k = q.shape[1]
    steps = output.view(-1, rows, k + 1).transpose(0, 1)  # [R, copies, k+1]
    counts = (steps != PLACEHOLDER).sum(dim=2)
    failures: list[str] = []
    assertions = 0
    for row in range(rows):
        laws = chain_laws(p[row], q[row])
        for position in range(k + 1):
            reached = counts[row] > position
            tests = [("emitted", reached, laws.emitted[position])]
            if position < k:
                rejected = counts[row] == position + 1
                tests.append(("after a rejection", rejected, laws.residual[position]))
            for name, mask, law in tests:
                if not bool(mask.any()):
                    continue
                tokens = steps[row, mask, position]
                result = identity_test(
                    torch.bincount(tokens, minlength=p.shape[-1]).numpy(), law.numpy()
                )
                assertions += 1
                if result.zero_mass_count or result.pvalue <= alpha:
                    failures.append(
                        f"row type {row} position {position} token {name}: n={result.n}, "
                        f"pvalue={result.pvalue:.3g}, zero-mass tokens {result.zero_mass_tokens}"
                    )
    return failures, assertions


def _sample_distinct_rows(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One seeded verify call on the statistical test's batch: ``(output, p, q)``."""
    p, q = _row_types(dtype)
    target, draft = _interleaved(p, q, STEPS_PER_ROW_TYPE)
    assert not shares_rows(target, draft)
    generator = torch.Generator().manual_seed(SEED + 1)
    ids = _drafts(draft, generator)
    return verify(target, draft, ids, generator), p, q


@pytest.mark.parametrize("dtype", DTYPES, ids=["float64", "float32"])
def test_distinct_rows_emit_p_i_at_every_reached_position_and_the_residual_after_a_rejection(
    dtype: torch.dtype,
) -> None:
    """Statistical, each assertion at level :data:`ALPHA`: on 8 distinct row types x 6,000
    steps through the per-row kernel, the token emitted at every reached position
    follows p_i, and the token emitted after a rejection at i follows the residual (exact on
    zero-mass cells: no token with p = 0, or outside the residual's support, ever appears).
    At n = 6,000, position 0's test detects a TV of about 0.07 with power 0.9 (pinned)."""
    output, p, q = _sample_distinct_rows(dtype)
    failures, assertions = _law_failures(output, p, q, ALPHA)
    assert assertions <= ASSERTIONS_PER_DTYPE
    assert not failures, f"seed {SEED}, alpha {ALPHA:.3g}:\n" + "\n".join(failures)
    plan = identity_minimum_detectable_tv(p[0, 0].double().numpy(), STEPS_PER_ROW_TYPE, ALPHA, 0.9)
    assert plan.minimum_detectable_tv < 0.1


def test_the_distinct_row_law_test_fails_a_path_that_resamples_rejections_from_p(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Power: the test above, run on a mutant of the per-row path whose correction token is
    redrawn from p instead of the residual (a classic lossy bug: the emitted law becomes
    ``min(p, q) + (1 - alpha) p``), fails on most row types. Same seeds, so deterministic."""

    kernel_rows = chain._kernel_rows

    def from_p(
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        accept_uniforms: torch.Tensor,
        sample_uniforms: torch.Tensor,
    ) -> tuple[torch.Tensor, object]:
        emitted, facts = kernel_rows(
            target_probs, draft_probs, draft_token_ids, accept_uniforms, sample_uniforms
        )
        k = draft_token_ids.shape[1]
        stop = (emitted != PLACEHOLDER).sum(dim=1) - 1
        rejected = torch.nonzero(stop < k).squeeze(1)
        rows = target_probs[rejected, stop[rejected]].double()
        emitted[rejected, stop[rejected]] = sample_inverse_cdf(rows, sample_uniforms[rejected])
        return emitted, facts

    monkeypatch.setattr(chain, "_kernel_rows", from_p)
    output, p, q = _sample_distinct_rows(torch.float64)
    failures, _ = _law_failures(output, p, q, ALPHA)
    assert len(failures) >= MUTANT_MIN_FAILURES, failures


def test_a_position_with_p_equal_to_q_accepts_every_draft_on_distinct_rows() -> None:
    """Exact: row type 0 has ``q_1 == p_1`` (bit for bit, so the acceptance ratio is exactly 1
    wherever q > 0): every step of that type that reaches position 1 accepts d_1."""
    output, _, _ = _sample_distinct_rows(torch.float64)
    steps = output.view(-1, ROW_TYPES, K + 1)[:, 0]
    counts = (steps != PLACEHOLDER).sum(dim=1)
    assert bool((counts > 1).any())
    assert bool((counts[counts > 1] > 2).all())


@pytest.mark.parametrize(
    ("vocab", "k", "dtype"),
    [
        (16, 3, torch.float64),
        (16, 3, torch.float32),
        (300, 0, torch.float64),
        (1000, 2, torch.float32),
        (32_000, 1, torch.float32),
    ],
    ids=["V16-k3-f64", "V16-k3-f32", "V300-k0", "V1000-k2-f32", "V32000-k1-f32"],
)
def test_per_row_path_on_distinct_rows_equals_the_shared_path_row_by_row(
    vocab: int, k: int, dtype: torch.dtype
) -> None:
    """Exact: on a batch of distinct rows (different p and q in every row, with zeros), every
    row's output equals a shared-table call on that row alone with the same uniforms,
    including the uniforms 0 and ``1 - 2**-53`` (the overflow case)."""
    batch = 61 if vocab < 10_000 else 7
    generator = torch.Generator().manual_seed(SEED + vocab + k)
    p = torch.rand((batch, k + 1, vocab), generator=generator, dtype=torch.float64) ** 3
    q = torch.rand((batch, k, vocab), generator=generator, dtype=torch.float64) ** 3
    p[torch.rand(p.shape, generator=generator) < 0.3] = 0.0
    p[..., -1] += 0.01
    target = (p / p.sum(dim=-1, keepdim=True)).to(dtype)
    draft = (q / q.sum(dim=-1, keepdim=True)).to(dtype)
    ids = _drafts(draft, generator)
    uniforms = ChainUniforms.draw(batch, k, generator)
    uniforms.accept_uniforms[:3] = 0.0
    uniforms.sample_uniforms[:3] = 0.0
    uniforms.sample_uniforms[3:6] = 1.0 - 2.0**-53
    together = verify(target, draft, ids, generator, uniforms=uniforms)
    assert torch.equal(together, verify_each_row_alone(target, draft, ids, uniforms))
    emitted = together != PLACEHOLDER
    mass = target.gather(2, together.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    assert bool((mass[emitted] > 0).all()), "a token with p = 0 was emitted"


def test_a_rejection_whose_residual_has_no_mass_draws_from_p_and_never_a_zero_mass_token() -> None:
    """Exact: p = (1/2, 1/2, 0), q = (1/2 + 2**-53, 1/2, 0). q sums to 1 after rounding, so
    ``max(0, p - q)`` is all zero, yet the acceptance ratio of d = 0 rounds to ``1 - 2**-52``
    and the uniform ``1 - 2**-53`` rejects it. The correction then follows p (the limit
    q -> p), on the per-row path as on the shared one: token 0 at u = 0, token 1 at
    ``u = 1 - 2**-53`` (not the zero-mass token 2, and not an overflow past the row)."""
    p = torch.tensor([[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]], dtype=torch.float64)
    q = torch.tensor([[0.5 + 2.0**-53, 0.5, 0.0]], dtype=torch.float64)
    assert float(q.sum()) == 1.0
    batch = 4
    ids = torch.zeros((batch, 1), dtype=torch.int64)
    accept = torch.full((batch, 1), 1.0 - 2.0**-53, dtype=torch.float64)
    sample = torch.tensor([0.0, 0.25, 0.75, 1.0 - 2.0**-53], dtype=torch.float64)
    shared = verify_with_uniforms(
        p.expand(batch, -1, -1), q.expand(batch, -1, -1), ids, accept, sample
    )
    distinct_target = p.expand(batch, -1, -1).clone()
    distinct_target[1::2, 1] = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64)
    distinct = verify_with_uniforms(
        distinct_target, q.expand(batch, -1, -1).clone(), ids, accept, sample
    )
    expected = torch.tensor([[0, -1], [0, -1], [1, -1], [1, -1]])
    assert torch.equal(shared, expected)
    assert torch.equal(distinct, expected)


def test_final_token_draw_equals_the_law_composition_and_falls_back_to_p_without_residual() -> None:
    """Exact: ``_final_tokens`` (in place, rows patched afterwards) equals
    ``sample_inverse_cdf(_final_laws(...))`` on rows mixing bonus rows, residuals with mass,
    residuals without mass (q == p: they emit what p emits) and a residual whose only mass is
    subnormal (1e-320 at token 7: it emits token 7); never a token with p = 0."""
    generator = torch.Generator().manual_seed(SEED)
    rows, vocab = 400, 24
    p = torch.rand((rows, vocab), generator=generator, dtype=torch.float64) ** 2
    p[:, :5] = 0.0
    p = p / p.sum(dim=-1, keepdim=True)
    q = torch.rand((rows, vocab), generator=generator, dtype=torch.float64)
    q = q / q.sum(dim=-1, keepdim=True)
    q[::3] = p[::3]  # no residual mass
    subnormal = slice(1, None, 6)
    p[subnormal, 7] = 1e-320
    q[subnormal] = p[subnormal]
    q[subnormal, 7] = 0.0
    bonus = torch.rand(rows, generator=generator) < 0.2
    uniforms = torch.rand(rows, generator=generator, dtype=torch.float64)
    uniforms[:10] = 0.0
    uniforms[10:20] = 1.0 - 2.0**-53
    expected = sample_inverse_cdf(chain._final_laws(p, q, bonus), uniforms)
    got = chain._final_tokens(p.clone(), q.clone(), bonus, uniforms)
    assert torch.equal(got, expected)
    normalised = p / p.sum(dim=-1, keepdim=True)
    assert torch.equal(got[::3], sample_inverse_cdf(normalised[::3], uniforms[::3]))
    assert bool((got[subnormal][~bonus[subnormal]] == 7).all())
    assert bool((p.gather(1, got.unsqueeze(1)) > 0).all())


@pytest.mark.parametrize("vocab", [1, 7, 32, 33, 257, 3000, 32_000])
def test_row_sums_of_narrow_rows_equal_the_reductions_own_conversion(vocab: int) -> None:
    """Exact: the per-row path sums float32 rows as ``rows.to(float64).sum(-1)`` (several
    times faster than ``rows.sum(-1, dtype=float64)`` on CPU); the shared path uses the latter.
    They must be equal to the bit, or the two paths could decide differently."""
    generator = torch.Generator().manual_seed(SEED + vocab)
    rows = torch.rand((40, 3, vocab), generator=generator) ** 4
    rows = rows / rows.sum(dim=-1, keepdim=True)
    for view in (rows, rows[:, :2], rows[::3]):
        expected = view.sum(dim=-1, dtype=torch.float64)
        assert torch.equal(chain._row_sums(view, torch.float64), expected)
        for row in range(0, view.shape[0], 13):
            assert torch.equal(view[row].sum(dim=-1, dtype=torch.float64), expected[row])


@pytest.mark.parametrize(("k", "vocab"), [(0, 1), (4, 32), (4, 32_000), (8, 150_000)])
@pytest.mark.parametrize(
    ("device", "budget"),
    [("cpu", chain.PER_ROW_CHUNK_ELEMENTS), ("cuda", chain.ACCELERATOR_CHUNK_ELEMENTS)],
)
def test_per_row_chunks_bound_the_memory_whatever_the_batch(
    k: int, vocab: int, device: str, budget: int
) -> None:
    """A chunk holds at most ``max(budget, (2k+1) V)`` input entries (8 MiB of float64 on CPU,
    128 MiB elsewhere, or one row), and is as large as that allows, so the per-row path's
    temporaries do not grow with B."""
    rows = chain._rows_per_chunk(k, vocab, torch.device(device))
    per_row = (2 * k + 1) * vocab
    assert rows >= 1
    assert rows * per_row <= max(budget, per_row)
    assert (rows + 1) * per_row > budget


def _spy(calls: list[int], original: Callable[..., None]) -> Callable[..., None]:
    def spy(*args: torch.Tensor) -> None:
        calls.append(int(args[0].shape[0]))
        original(*args)

    return spy


def test_accelerator_per_row_path_covers_the_batch_in_chunks_of_the_stated_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chunking of the accelerators' per-row path really happens (run here on CPU): a spy
    on the chunk function sees ``ceil(B / rows)`` calls of ``rows`` rows (the last one
    ragged) covering the batch once."""
    monkeypatch.setattr(chain, "PER_ROW_CHUNK_ELEMENTS", 7 * 16 * 10)
    p, q = _row_types(torch.float64)
    target, draft = _interleaved(p, q, 13)
    ids = _drafts(draft, torch.Generator().manual_seed(SEED))
    uniforms = ChainUniforms.draw(ids.shape[0], K, torch.Generator().manual_seed(SEED))
    calls: list[int] = []
    monkeypatch.setattr(chain, "_verify_rows", _spy(calls, chain._verify_rows))
    chain._verify_per_row(target, draft, ids, uniforms.accept_uniforms, uniforms.sample_uniforms)
    assert calls == [10] * 10 + [4]
