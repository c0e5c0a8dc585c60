"""Property tests of the reference verifiers (``losslessness.reference``) and their exact laws.

Hypothesis chooses the cases (:func:`strategies.chain_cases`, :func:`strategies.greedy_cases`);
it never supplies random samples. Every sample comes from a ``torch.Generator`` seeded by
:func:`losslessness.seeding.derive_seed` from the test's name and a SHA-256 of the case's
tensors, so a failing example replays bit for bit from the example Hypothesis prints (or its
``@reproduce_failure`` blob under the ``ci`` profile). The seed is attached with ``note``.

Exact properties never fail on correct code and take no share of the budget: the output's
structure (docs/architecture.md, 'What lossless means', item 1), the exact edge cases (item 4),
``verify`` == ``verify_with_uniforms`` on the generator's own uniforms, greedy == argmax decoding
(item 6) and the algebra of :func:`losslessness.laws.chain_laws`.

Statistical property (item 2 and 3):
:func:`test_reference_chain_emits_p_i_at_every_reached_position_and_accepts_at_sum_min_pq`
runs :data:`STEPS_PER_ROW` verification steps per row type of each case and, for every row type
``b`` and position ``i`` that is reached, identity-tests the emitted token against ``p_i``
(:func:`losslessness.stats.identity_test`, exact on ``p == 0`` cells) and, for ``i < k``,
binomial-tests the acceptance of ``d_i`` against ``sum min(p_i, q_i)``
(:func:`losslessness.stats.acceptance_rate_test`).

Budget. The whole file has a family-wise false-alarm rate of
:data:`FAMILY_WISE_ALPHA` = 1e-4, split Bonferroni (any dependence allowed) over
``max_examples x ASSERTIONS_PER_EXAMPLE`` statistical assertions, where ``max_examples`` is the
active profile's (read at import, after ``tests/conftest.py`` loaded the profile; the test pins
it) and ``ASSERTIONS_PER_EXAMPLE = MAX_BATCH x ((MAX_K + 1) + MAX_K) = 3 x 9 = 27``:

=========  ============  ==========  ===================
profile    max_examples  assertions  per-assertion alpha
=========  ============  ==========  ===================
dev, ci    25            675         1.48e-7
nightly    250           6750        1.48e-8
=========  ============  ==========  ===================

Hypothesis runs at most ``max_examples`` examples in its generate phase; replays of stored
failures (``dev``/``nightly`` example database) only happen after a failure. At 4000 steps and
alpha = 1.48e-7, position 0 detects (power 0.9) a TV of about 0.05 (V = 2) to 0.08 (V = 64),
and an acceptance-rate shift of about 0.05; smaller deviations may pass (see
:data:`MIN_DETECTABLE_TV_AT_POSITION_0`).
"""

from __future__ import annotations

import hashlib

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from losslessness.cases import ChainCase, GreedyCase
from losslessness.laws import chain_laws, residual_distribution, total_variation
from losslessness.protocol import PLACEHOLDER
from losslessness.reference import sample_inverse_cdf, verify, verify_greedy, verify_with_uniforms
from losslessness.seeding import derive_seed
from losslessness.stats import (
    ErrorBudget,
    acceptance_rate_minimum_detectable_shift,
    acceptance_rate_test,
    chi_square_minimum_detectable_tv,
    identity_test,
)
from strategies import (
    chain_cases,
    greedy_cases,
    probability_vectors,
    target_draft_pairs,
)

RUN_SEED = 0
"""Root of every sampling seed in this file (docs/architecture.md, 'Statistical method',
"Seeds")."""

MAX_VOCAB = 64
MAX_K = 4
MAX_BATCH = 3
"""Case sizes of the statistical test (``strategies.chain_cases`` arguments)."""

STEPS_PER_ROW = 4000
"""Verification steps per row type of a case in the statistical test."""

STRUCTURE_STEPS_PER_ROW = 1000
"""Verification steps per row type in the exact structure test."""

COUPLING_STEPS_PER_ROW = 256
"""Verification steps per row type when comparing ``verify`` with ``verify_with_uniforms``."""

EXACT_TOLERANCE = 1e-12
"""Tolerance of float64 identities between exact laws."""

FAMILY_WISE_ALPHA = 1e-4
"""Probability that this file reports any statistical false alarm on a correct reference."""

PROFILE_MAX_EXAMPLES: int = settings().max_examples
"""``max_examples`` of the profile active at import (``tests/conftest.py`` loads it)."""

ASSERTIONS_PER_EXAMPLE = MAX_BATCH * ((MAX_K + 1) + MAX_K)
"""Most statistical assertions one example makes: per row type, k+1 identity tests and k
acceptance tests."""

BUDGET = ErrorBudget(
    n_assertions=PROFILE_MAX_EXAMPLES * ASSERTIONS_PER_EXAMPLE,
    family_wise_alpha=FAMILY_WISE_ALPHA,
)
"""Bonferroni split of :data:`FAMILY_WISE_ALPHA` over every assertion the file can make."""

ALPHA = BUDGET.per_assertion_alpha
"""Per-assertion significance level."""

MIN_DETECTABLE_TV_AT_POSITION_0 = chi_square_minimum_detectable_tv(
    STEPS_PER_ROW, MAX_VOCAB - 1, ALPHA, 0.9
)
"""TV that position 0's identity test detects with power 0.9 at V = 64 (about 0.08)."""

MIN_DETECTABLE_ACCEPTANCE_SHIFT = acceptance_rate_minimum_detectable_shift(
    STEPS_PER_ROW, 0.5, ALPHA, 0.9
)
"""Acceptance-rate shift detected with power 0.9 at position 0, rate 0.5 (about 0.05)."""


def _case_seed(check: str, *tensors: torch.Tensor) -> int:
    """Sampling seed from (run seed, check name, SHA-256 of the exact tensors)."""
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(str((tuple(tensor.shape), str(tensor.dtype))).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    seed = derive_seed(RUN_SEED, check, digest.hexdigest()[:16])
    note(f"sampling seed for {check}: {seed}")
    return seed


def _repeat_rows(case: ChainCase, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B * steps, k+1, V]`` and ``[B * steps, k, V]``: each row type repeated ``steps`` times
    consecutively (row type ``b`` occupies rows ``b * steps .. (b + 1) * steps - 1``)."""
    return (
        case.target_probs.repeat_interleave(steps, dim=0),
        case.draft_probs.repeat_interleave(steps, dim=0),
    )


def _draw_drafts(draft_probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``[N, k]`` int64 drafts ``d_i ~ q_i``, drawn by inverse CDF, position by position."""
    rows, k, _ = draft_probs.shape
    ids = torch.empty((rows, k), dtype=torch.int64)
    for position in range(k):
        uniforms = torch.rand(rows, generator=generator, dtype=torch.float64)
        ids[:, position] = sample_inverse_cdf(draft_probs[:, position], uniforms)
    return ids


def _emitted_counts(output: torch.Tensor) -> torch.Tensor:
    """``[N]`` number of emitted (non-placeholder) tokens per output row."""
    return (output != PLACEHOLDER).sum(dim=1)


def _assert_chain_structure(
    output: torch.Tensor, target_probs: torch.Tensor, draft_token_ids: torch.Tensor
) -> None:
    """docs/architecture.md, 'What lossless means', item 1, on every row of one verification step's
    output."""
    rows, positions, vocab = target_probs.shape
    k = positions - 1
    assert output.dtype == torch.int64
    assert tuple(output.shape) == (rows, k + 1)
    counts = _emitted_counts(output)
    assert bool(((counts >= 1) & (counts <= k + 1)).all()), "a row emits 0 or > k+1 tokens"
    emitted = output != PLACEHOLDER
    layout = torch.arange(k + 1).unsqueeze(0) < counts.unsqueeze(1)
    assert torch.equal(emitted, layout), "emitted tokens are not left-aligned before the -1s"
    assert bool(((output[emitted] >= 0) & (output[emitted] < vocab)).all()), "id out of [0, V)"
    accepted = torch.arange(k).unsqueeze(0) < (counts - 1).unsqueeze(1)
    assert torch.equal(output[:, :k][accepted], draft_token_ids[accepted]), (
        "an accepted token differs from the draft at its position"
    )
    mass = target_probs.gather(2, output.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    assert bool((mass[emitted] > 0).all()), "a token with p = 0 at its position was emitted"


@settings(deadline=None)
@given(case=chain_cases())
def test_reference_chain_output_has_protocol_structure_and_never_emits_p_zero_tokens(
    case: ChainCase,
) -> None:
    """Exact, on every one of ``B x 1000`` steps: shape ``[N, k+1]`` int64, 1..k+1 tokens
    left-aligned with -1 after, ids in ``[0, V)``, accepted prefix equal to the drafts, and no
    token with ``p_i = 0`` ever emitted at position i."""
    target, draft = _repeat_rows(case, STRUCTURE_STEPS_PER_ROW)
    generator = torch.Generator().manual_seed(
        _case_seed("structure", case.target_probs, case.draft_probs)
    )
    ids = _draw_drafts(draft, generator)
    output = verify(target, draft, ids, generator)
    _assert_chain_structure(output, target, ids)


@settings(max_examples=PROFILE_MAX_EXAMPLES, deadline=None)
@given(case=chain_cases(max_vocab=MAX_VOCAB, max_k=MAX_K, max_batch=MAX_BATCH))
def test_reference_chain_emits_p_i_at_every_reached_position_and_accepts_at_sum_min_pq(
    case: ChainCase,
) -> None:
    """Statistical, at the per-assertion level :data:`ALPHA`: among steps reaching position
    i, the emitted token follows p_i (identity test, exact on p = 0), and d_i is accepted at
    rate ``sum min(p_i, q_i)`` (exact two-sided binomial test)."""
    batch, k, vocab = case.batch_size, case.k, case.vocab_size
    target, draft = _repeat_rows(case, STEPS_PER_ROW)
    seed = _case_seed("conditional-laws", case.target_probs, case.draft_probs)
    generator = torch.Generator().manual_seed(seed)
    ids = _draw_drafts(draft, generator)
    output = verify(target, draft, ids, generator).view(batch, STEPS_PER_ROW, k + 1)
    counts = _emitted_counts(output.view(-1, k + 1)).view(batch, STEPS_PER_ROW)

    failures: list[str] = []
    assertions = 0
    for row in range(batch):
        laws = chain_laws(case.target_probs[row], case.draft_probs[row])
        for position in range(k + 1):
            reached = counts[row] > position
            n_reached = int(reached.sum())
            if n_reached == 0:
                continue  # nothing to test: the position is (almost) unreachable
            tokens = output[row, reached, position]
            result = identity_test(
                torch.bincount(tokens, minlength=vocab).numpy(),
                laws.emitted[position].numpy(),
            )
            assertions += 1
            if result.zero_mass_count or result.pvalue <= ALPHA:
                failures.append(
                    f"row {row} position {position}: emitted token is not ~ p_i "
                    f"(n={n_reached}, pvalue={result.pvalue:.3g}, "
                    f"zero-mass tokens {result.zero_mass_tokens})"
                )
            if position < k:
                accepted = int((counts[row] > position + 1).sum())
                rate = float(laws.acceptance[position])
                binomial = acceptance_rate_test(accepted, n_reached, rate)
                assertions += 1
                if binomial.pvalue <= ALPHA:
                    failures.append(
                        f"row {row} position {position}: accepted {accepted}/{n_reached} "
                        f"({binomial.direction}), expected rate sum min(p, q) = {rate:.6g}, "
                        f"pvalue={binomial.pvalue:.3g}"
                    )
    assert assertions <= ASSERTIONS_PER_EXAMPLE
    assert not failures, (
        f"seed {seed}, per-assertion alpha {ALPHA:.3g} (family-wise {FAMILY_WISE_ALPHA:g} over "
        f"{BUDGET.n_assertions} assertions):\n" + "\n".join(failures)
    )


@settings(deadline=None)
@given(case=chain_cases())
def test_verify_equals_verify_with_uniforms_fed_the_generators_own_uniforms(
    case: ChainCase,
) -> None:
    """Exact: ``verify(g)`` equals ``verify_with_uniforms`` given ``B*k`` accept uniforms then
    ``B`` sampling uniforms (float64) drawn from a generator in the same state, and ``verify``
    consumes exactly those draws (both generators end in the same state)."""
    target, draft = _repeat_rows(case, COUPLING_STEPS_PER_ROW)
    rows, k = target.shape[0], case.k
    seed = _case_seed("uniform-coupling", case.target_probs, case.draft_probs)
    ids = _draw_drafts(draft, torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(seed + 1)
    expected = verify(target, draft, ids, generator)
    replay = torch.Generator().manual_seed(seed + 1)
    accept_uniforms = torch.rand((rows, k), generator=replay, dtype=torch.float64)
    sample_uniforms = torch.rand((rows,), generator=replay, dtype=torch.float64)
    coupled = verify_with_uniforms(target, draft, ids, accept_uniforms, sample_uniforms)
    assert torch.equal(coupled, expected)
    assert torch.equal(generator.get_state(), replay.get_state())


def _greedy_decode(logits: list[list[float]], drafts: list[int]) -> list[int]:
    """Plain greedy decoding of one row, written independently of the reference: accept
    ``d_i`` while it is the first index of the maximum of row i, emit that index at the first
    mismatch, or the bonus row's first maximum when every draft matched; pad with -1."""
    emitted: list[int] = []
    for position, draft in enumerate(drafts):
        row = logits[position]
        best = row.index(max(row))
        if draft != best:
            emitted.append(best)
            break
        emitted.append(draft)
    else:
        bonus = logits[len(drafts)]
        emitted.append(bonus.index(max(bonus)))
    return emitted + [PLACEHOLDER] * (len(logits) - len(emitted))


@settings(deadline=None)
@given(case=greedy_cases())
def test_verify_greedy_equals_python_argmax_decoding_including_ties_and_masked_tokens(
    case: GreedyCase,
) -> None:
    """Exact: ``verify_greedy`` equals a per-row Python greedy loop token for token, with ties
    at the maximum going to the lowest index and ``-inf`` logits, in float64 and float32 (the
    cases' logits are exact in float32)."""
    logits, ids = case.target_logits, case.draft_token_ids
    expected = [
        _greedy_decode(row_logits, row_ids)
        for row_logits, row_ids in zip(logits.tolist(), ids.tolist(), strict=True)
    ]
    assert verify_greedy(logits, ids).tolist() == expected
    assert verify_greedy(logits.to(torch.float32), ids).tolist() == expected


@settings(deadline=None)
@given(case=chain_cases())
def test_chain_laws_lengths_sum_to_1_and_acceptance_equals_1_minus_tv(
    case: ChainCase,
) -> None:
    """Exact (1e-12): per row, ``accepted_length`` sums to 1; ``reach`` starts at 1 and is the
    running product of ``acceptance``; ``sum(reach)`` is the expected number of emitted tokens;
    ``acceptance_i = 1 - TV(p_i, q_i)``; ``emitted_i = p_i``; and p_i splits into an accepted
    and a residual part: ``p_i = min(p_i, q_i) + (1 - acceptance_i) residual_i``."""
    for row in range(case.batch_size):
        p, q = case.target_probs[row], case.draft_probs[row]
        k = case.k
        laws = chain_laws(p, q)
        assert abs(float(laws.accepted_length.sum()) - 1.0) <= EXACT_TOLERANCE
        assert bool((laws.accepted_length >= -EXACT_TOLERANCE).all())
        assert float(laws.reach[0]) == 1.0
        assert torch.allclose(
            laws.reach[1:], laws.reach[:-1] * laws.acceptance, rtol=0, atol=EXACT_TOLERANCE
        )
        lengths = torch.arange(1, k + 2, dtype=torch.float64)
        expected_tokens = float((lengths * laws.accepted_length).sum())
        assert abs(float(laws.reach.sum()) - expected_tokens) <= EXACT_TOLERANCE
        if k:
            tv = total_variation(p[:k], q)
            assert float((laws.acceptance - (1.0 - tv)).abs().max()) <= EXACT_TOLERANCE
            rebuilt = torch.minimum(p[:k], q) + (1.0 - laws.acceptance).unsqueeze(1) * (
                laws.residual
            )
            assert float((rebuilt - p[:k]).abs().max()) <= EXACT_TOLERANCE
        assert float((laws.emitted - p).abs().max()) <= EXACT_TOLERANCE


def test_residual_distribution_sums_to_1_even_when_the_residual_mass_is_subnormal() -> None:
    """``residual_distribution`` promises rows summing to 1 whenever ``max(0, p - q)`` has
    positive mass, however small (here 1e-320, a subnormal double)."""
    p = torch.tensor([1.0, 1e-320], dtype=torch.float64)
    q = torch.tensor([1.0, 0.0], dtype=torch.float64)
    residual = residual_distribution(p, q)
    assert residual.tolist() == [0.0, 1.0]


EDGE_CASE_STEPS = 500
"""Verification steps in each exact edge-case test."""


@settings(deadline=None)
@given(
    pair=target_draft_pairs(st.integers(2, 64), relation="disjoint"),
    bonus=st.data(),
)
def test_reference_accepts_no_draft_when_supports_are_disjoint(
    pair: tuple[torch.Tensor, torch.Tensor], bonus: st.DataObject
) -> None:
    """Exact (docs/architecture.md, 'What lossless means', item 4): with ``sum min(p, q) = 0`` no
    draft is ever accepted, and the one emitted token lies in p's support."""
    p, q = pair
    vocab = p.numel()
    p_bonus = bonus.draw(probability_vectors(vocab), label="p_bonus")
    target = torch.stack([p, p_bonus]).expand(EDGE_CASE_STEPS, 2, vocab)
    draft = q.view(1, 1, vocab).expand(EDGE_CASE_STEPS, 1, vocab)
    generator = torch.Generator().manual_seed(_case_seed("disjoint", p, q, p_bonus))
    ids = _draw_drafts(draft, generator)
    output = verify(target, draft, ids, generator)
    assert bool((_emitted_counts(output) == 1).all())
    assert bool((p[output[:, 0]] > 0).all())


@settings(deadline=None)
@given(
    case=chain_cases(max_k=3),
    hot=st.data(),
)
def test_reference_always_emits_the_token_of_a_one_hot_target(
    case: ChainCase, hot: st.DataObject
) -> None:
    """Exact (docs/architecture.md, 'What lossless means', item 4): where p_i is one-hot at token t,
    every step that reaches position i emits t there, whatever the draft."""
    vocab, k = case.vocab_size, case.k
    position = hot.draw(st.integers(0, k), label="one-hot position")
    token = hot.draw(st.integers(0, vocab - 1), label="one-hot token")
    target_types = case.target_probs.clone()
    target_types[:, position] = 0.0
    target_types[:, position, token] = 1.0
    one_hot_case = ChainCase("one-hot", "one-hot target rows", target_types, case.draft_probs)
    target, draft = _repeat_rows(one_hot_case, EDGE_CASE_STEPS)
    generator = torch.Generator().manual_seed(_case_seed("one-hot", target_types, case.draft_probs))
    ids = _draw_drafts(draft, generator)
    output = verify(target, draft, ids, generator)
    reached = _emitted_counts(output) > position
    assert bool((output[reached, position] == token).all())


def test_budget_numbers_match_the_module_docstring() -> None:
    """The per-assertion level is ``1e-4 / (max_examples x 27)``, as the docstring tabulates."""
    assert ASSERTIONS_PER_EXAMPLE == 27
    assert BUDGET.n_assertions == PROFILE_MAX_EXAMPLES * 27
    assert pytest.approx(FAMILY_WISE_ALPHA / (PROFILE_MAX_EXAMPLES * 27)) == ALPHA
    assert 0.0 < MIN_DETECTABLE_TV_AT_POSITION_0 < 0.1
    assert 0.0 < MIN_DETECTABLE_ACCEPTANCE_SHIFT < 0.1
