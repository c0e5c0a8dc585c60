"""Tests of the project's Hypothesis strategies: the promises their docstrings make hold.

Every property here is exact (no sampling): normalisation within 1e-12, each named regime and
relation has its defining property, whole cases are valid protocol inputs, and bad arguments
raise ``InvalidArgument`` naming the argument, eagerly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

import strategies
from losslessness.protocol import validate_chain_inputs, validate_greedy_inputs
from losslessness.reference import total_variation
from strategies.distributions import (
    FAR_MIN_TV,
    NEAR_MIX_RANGE,
    PEAKED_TAIL_MASS_BOUND,
    REGIMES,
    RELATIONS,
    probability_vectors,
    target_draft_pairs,
)

NORMALISATION_TOLERANCE = 1e-12
"""How far from 1 a generated row may sum (the strategies promise it)."""

PEAKED_SMALL_MASS = 1e-3
"""A ``peaked`` vector over ``V >= 100`` tokens has at least half its masses below this."""

_FIND_SETTINGS = settings(
    max_examples=1000,
    database=None,
    derandomize=True,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
"""For ``find``: whether a strategy *can* produce a feature (derandomized, so stable)."""

_SMALL_OR_LARGE_VOCAB = st.one_of(st.integers(1, 12), st.integers(13, 300))


def _assert_probability_vector(vector: torch.Tensor, vocab_size: int) -> None:
    assert isinstance(vector, torch.Tensor)
    assert vector.dtype == torch.float64
    assert tuple(vector.shape) == (vocab_size,)
    assert bool(torch.isfinite(vector).all())
    assert float(vector.min()) >= 0.0
    assert abs(float(vector.sum()) - 1.0) <= NORMALISATION_TOLERANCE


@given(st.data())
def test_probability_vectors_are_float64_rows_normalised_within_1e_12(
    data: st.DataObject,
) -> None:
    """Every regime yields a ``[V]`` float64 non-negative vector summing to 1 within 1e-12."""
    vocab_size = data.draw(_SMALL_OR_LARGE_VOCAB, label="vocab_size")
    vector = data.draw(probability_vectors(vocab_size), label="p")
    _assert_probability_vector(vector, vocab_size)


@settings(max_examples=5, deadline=None)
@given(probability_vectors(150_000))
def test_probability_vectors_over_a_150k_vocabulary_are_normalised_within_1e_12(
    vector: torch.Tensor,
) -> None:
    """A production-sized vocabulary is cheap to draw and still normalised within 1e-12."""
    _assert_probability_vector(vector, 150_000)


@given(probability_vectors(st.integers(1, 64), regime="dense"))
def test_dense_vectors_have_every_mass_positive(vector: torch.Tensor) -> None:
    """``dense``: no exact zeros."""
    assert bool((vector > 0).all())


@given(probability_vectors(st.integers(100, 2000), regime="peaked"))
def test_peaked_vectors_over_100_tokens_have_half_their_masses_below_1e_3(
    vector: torch.Tensor,
) -> None:
    """``peaked`` with ``V >= 100``: at least half the masses are below 1e-3 (by construction,
    every token at or below the median logit has mass below exp(-10))."""
    small = int((vector < PEAKED_SMALL_MASS).sum())
    assert 2 * small >= vector.numel()
    tail = int((vector < PEAKED_TAIL_MASS_BOUND).sum())
    assert 2 * tail >= vector.numel()


@given(probability_vectors(st.integers(2, 200), regime="sparse"))
def test_sparse_vectors_have_exact_zeros_and_some_mass(vector: torch.Tensor) -> None:
    """``sparse``: at least one exact zero and at least one positive mass."""
    assert bool((vector == 0).any())
    assert bool((vector > 0).any())


@given(probability_vectors(st.integers(1, 200), regime="one-hot"))
def test_one_hot_vectors_have_exactly_one_nonzero_mass_equal_to_1(vector: torch.Tensor) -> None:
    """``one-hot``: one entry is exactly 1, all others exactly 0."""
    assert int((vector != 0).sum()) == 1
    assert float(vector.max()) == 1.0


@given(probability_vectors(st.integers(1, 200), regime="uniform"))
def test_uniform_vectors_equal_1_over_v_everywhere(vector: torch.Tensor) -> None:
    """``uniform``: every mass is ``1 / V``."""
    expected = 1.0 / vector.numel()
    assert bool(((vector - expected).abs() <= 1e-15).all())


@given(st.data())
def test_target_draft_pairs_are_both_normalised_within_1e_12(data: st.DataObject) -> None:
    """Both members of every relation's pair are probability vectors summing to 1 within 1e-12."""
    vocab_size = data.draw(_SMALL_OR_LARGE_VOCAB, label="vocab_size")
    p, q = data.draw(target_draft_pairs(vocab_size), label="(p, q)")
    _assert_probability_vector(p, vocab_size)
    _assert_probability_vector(q, vocab_size)


@given(target_draft_pairs(st.integers(1, 100), relation="identical"))
def test_identical_pairs_have_q_equal_to_p(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    """``identical``: ``q == p`` elementwise, exactly."""
    p, q = pair
    assert torch.equal(p, q)


@given(target_draft_pairs(st.integers(1, 100), relation="near"))
def test_near_pairs_are_within_tv_of_the_mixing_weight(
    pair: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """``near``: ``TV(p, q) <= t <= 0.5`` for ``q = (1 - t) p + t r``."""
    p, q = pair
    assert float(total_variation(p, q)) <= NEAR_MIX_RANGE[1] + 1e-12


@given(target_draft_pairs(st.integers(2, 100), relation="far"))
def test_far_pairs_have_tv_at_least_a_quarter(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    """``far``: ``TV(p, q) >= 0.25``."""
    p, q = pair
    assert float(total_variation(p, q)) >= FAR_MIN_TV


@given(target_draft_pairs(st.integers(2, 100), relation="disjoint"))
def test_disjoint_pairs_have_zero_overlap_mass(pair: tuple[torch.Tensor, torch.Tensor]) -> None:
    """``disjoint``: ``sum min(p, q) == 0`` exactly (so no draft can ever be accepted)."""
    p, q = pair
    assert float(torch.minimum(p, q).sum()) == 0.0


@given(target_draft_pairs(st.integers(2, 100), relation="q-zero-where-p-positive"))
def test_q_zero_where_p_positive_pairs_have_such_a_token(
    pair: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """``q-zero-where-p-positive``: some token has ``p > 0`` and ``q == 0`` exactly."""
    p, q = pair
    assert bool(((p > 0) & (q == 0)).any())


@given(strategies.chain_cases())
def test_chain_cases_are_valid_chain_inputs_with_rows_normalised_within_1e_12(
    case: strategies.ChainCaseTensors,
) -> None:
    """Chain cases have shapes ``[B, k+1, V]`` / ``[B, k, V]`` within the maxima, float64 rows
    summing to 1 within 1e-12, and pass the protocol's validation (drafts at q's argmax)."""
    target, draft = case
    batch, k, vocab = case.batch_size, case.k, case.vocab_size
    assert 1 <= batch <= 3 and 0 <= k <= 4 and 1 <= vocab <= 64
    assert tuple(target.shape) == (batch, k + 1, vocab)
    assert tuple(draft.shape) == (batch, k, vocab)
    assert target.dtype == draft.dtype == torch.float64
    assert float((target.sum(-1) - 1).abs().max()) <= NORMALISATION_TOLERANCE
    if k:
        assert float((draft.sum(-1) - 1).abs().max()) <= NORMALISATION_TOLERANCE
    assert validate_chain_inputs(target, draft, draft.argmax(dim=-1)) == (batch, k, vocab)


@given(strategies.greedy_cases())
def test_greedy_cases_never_have_an_all_minus_inf_row_and_are_valid_greedy_inputs(
    case: strategies.GreedyCaseTensors,
) -> None:
    """Greedy cases: no NaN or +inf, never a whole row of -inf, int64 ids in ``[0, V)``, and
    the protocol's validation accepts them."""
    logits, ids = case
    assert logits.dtype == torch.float64 and ids.dtype == torch.int64
    assert not bool(torch.isnan(logits).any())
    assert not bool((logits == math.inf).any())
    assert not bool((logits == -math.inf).all(dim=-1).any())
    if ids.numel():
        assert int(ids.min()) >= 0 and int(ids.max()) < case.vocab_size
    assert validate_greedy_inputs(logits, ids) == (case.batch_size, case.k, case.vocab_size)


def _has_tied_non_lowest_draft(case: strategies.GreedyCaseTensors) -> bool:
    logits, ids = case
    for row, position in np.ndindex(*ids.shape):
        values = logits[row, position]
        maxima = torch.nonzero(values == values.max()).flatten().tolist()
        if int(ids[row, position]) in maxima[1:]:
            return True
    return False


def test_greedy_cases_can_draft_a_tied_maximum_that_is_not_the_lowest_index() -> None:
    """The tie-breaking trap exists: some draft is a maximum of its row but not the lowest."""
    case = find(strategies.greedy_cases(), _has_tied_non_lowest_draft, settings=_FIND_SETTINGS)
    assert _has_tied_non_lowest_draft(case)


def test_greedy_cases_can_accept_every_draft_up_to_the_bonus() -> None:
    """Drafts equal to the lowest argmax at every position occur with ``k >= 2``."""

    def all_lowest(case: strategies.GreedyCaseTensors) -> bool:
        logits, ids = case
        if case.k < 2:
            return False
        firsts = (logits == logits.max(dim=-1, keepdim=True).values).to(torch.int8).argmax(-1)
        return bool((ids == firsts[:, :-1]).all())

    assert all_lowest(find(strategies.greedy_cases(), all_lowest, settings=_FIND_SETTINGS))


def test_greedy_cases_can_mask_tokens_with_minus_inf() -> None:
    """Some logits are ``-inf`` (masked tokens) in some cases."""

    def has_masked(case: strategies.GreedyCaseTensors) -> bool:
        return bool((case.target_logits == -math.inf).any())

    assert has_masked(find(strategies.greedy_cases(), has_masked, settings=_FIND_SETTINGS))


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: probability_vectors(0), "vocab_size"),
        (lambda: probability_vectors(-3), "vocab_size"),
        (lambda: probability_vectors(True), "vocab_size"),
        (lambda: probability_vectors(4.0), "vocab_size"),  # type: ignore[arg-type]
        (lambda: probability_vectors(4, regime="spiky"), "regime"),
        (lambda: probability_vectors(1, regime="sparse"), "vocab_size"),
        (lambda: target_draft_pairs(0), "vocab_size"),
        (lambda: target_draft_pairs(4, relation="close"), "relation"),
        (lambda: target_draft_pairs(1, relation="disjoint"), "vocab_size"),
        (lambda: target_draft_pairs(1, relation="far"), "vocab_size"),
        (lambda: target_draft_pairs(1, relation="q-zero-where-p-positive"), "vocab_size"),
        (lambda: strategies.chain_cases(max_vocab=0), "max_vocab"),
        (lambda: strategies.chain_cases(max_k=-1), "max_k"),
        (lambda: strategies.chain_cases(max_batch=0), "max_batch"),
        (lambda: strategies.chain_cases(max_k=1.5), "max_k"),  # type: ignore[arg-type]
        (lambda: strategies.greedy_cases(max_vocab=0), "max_vocab"),
        (lambda: strategies.greedy_cases(max_k=-1), "max_k"),
        (lambda: strategies.greedy_cases(max_batch=False), "max_batch"),
    ],
)
def test_strategy_arguments_are_validated_eagerly_naming_the_argument(
    make: object, argument: str
) -> None:
    """A bad argument raises ``InvalidArgument`` when the strategy is built, naming it first."""
    assert callable(make)
    with pytest.raises(InvalidArgument, match=rf"^{argument}="):
        make()


def test_drawn_vocabulary_sizes_are_validated_naming_vocab_size() -> None:
    """A ``vocab_size`` strategy that draws an invalid size fails at draw time, naming it."""
    bad: SearchStrategy[int] = st.just(0)

    @settings(max_examples=1, database=None)
    @given(probability_vectors(bad))
    def draw_one(vector: torch.Tensor) -> None:
        raise AssertionError("unreachable: the draw must fail")

    with pytest.raises(InvalidArgument, match=r"^vocab_size"):
        draw_one()


def test_regime_and_relation_names_are_the_documented_ones() -> None:
    """The named regimes and relations are exactly those the design and docstrings list."""
    assert REGIMES == ("dense", "peaked", "sparse", "one-hot", "uniform")
    assert RELATIONS == ("identical", "near", "far", "disjoint", "q-zero-where-p-positive")
    assert strategies.REGIMES is REGIMES and strategies.RELATIONS is RELATIONS


def test_profiles_are_registered_with_their_documented_settings() -> None:
    """``dev``/``ci``/``nightly`` exist; ``ci`` is derandomized without a database or deadline."""
    assert strategies.PROFILES == ("dev", "ci", "nightly")
    dev = settings.get_profile("dev")
    ci = settings.get_profile("ci")
    nightly = settings.get_profile("nightly")
    assert dev.max_examples == 25
    assert ci.max_examples == 25 and ci.derandomize and ci.database is None
    assert ci.deadline is None and ci.print_blob
    assert nightly.max_examples == 250 and nightly.deadline is None and not nightly.derandomize


def test_load_profile_selects_the_profile_named_by_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``LOSSLESSNESS_HYPOTHESIS_PROFILE`` picks the profile; unset means ``dev``; an unknown
    name raises ``InvalidArgument`` naming the variable. The session's profile is restored."""
    active = settings.get_current_profile_name()
    try:
        monkeypatch.setenv(strategies.PROFILE_ENV_VAR, "nightly")
        assert strategies.load_profile() == "nightly"
        assert settings().max_examples == 250
        monkeypatch.delenv(strategies.PROFILE_ENV_VAR)
        assert strategies.load_profile() == "dev"
        monkeypatch.setenv(strategies.PROFILE_ENV_VAR, "weekly")
        with pytest.raises(InvalidArgument, match=rf"^{strategies.PROFILE_ENV_VAR}="):
            strategies.load_profile()
        with pytest.raises(InvalidArgument, match=r"^name="):
            strategies.load_profile("weekly")
    finally:
        settings.load_profile(active)
