"""Tests of the project's Hypothesis strategies: the promises their docstrings make hold.

Every property here is exact (no sampling): normalisation within 1e-12 in float64 and within
``row_sum_tolerance(dtype, V)`` after a cast to float32/float16/bfloat16; each named regime
and relation has its defining property; logits keep their grid, masks and ties; sampling
parameters keep at least one token, in transformers' order; whole cases are valid protocol
inputs; every regime and relation is reached within 200 examples (``pytest -s`` prints the
frequencies; ``benchmarks/strategy_coverage.py`` prints more); simple predicates shrink to
small, readable cases; bad arguments raise ``InvalidArgument`` naming the argument, eagerly;
and the ``dev``/``ci``/``nightly`` profiles are chosen by ``--losslessness-profile`` or the
environment.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.control import current_build_context
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

import strategies
from losslessness.cases import ChainCase, GreedyCase
from losslessness.laws import total_variation
from losslessness.protocol import validate_chain_inputs, validate_greedy_inputs
from strategies.distributions import (
    ADVERSARIAL_MIN_TV,
    FAR_MIN_TV,
    NEAR_MIX_RANGE,
    PEAKED_TAIL_MASS_BOUND,
    PROBABILITY_DTYPES,
    REGIMES,
    RELATIONS,
    SMALLEST_MASS_TARGET_LABEL,
    TINY_MASS_LOG10_RANGE,
    TV_TARGET_LABEL,
    ZIPF_EXPONENT_RANGE,
    ZIPF_OFFSET_RANGE,
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
    case: ChainCase,
) -> None:
    """Chain cases have shapes ``[B, k+1, V]`` / ``[B, k, V]`` within the maxima, float64 rows
    summing to 1 within 1e-12, and pass the protocol's validation (drafts at q's argmax)."""
    target, draft = case.target_probs, case.draft_probs
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
    case: GreedyCase,
) -> None:
    """Greedy cases: no NaN or +inf, never a whole row of -inf, int64 ids in ``[0, V)``, and
    the protocol's validation accepts them."""
    logits, ids = case.target_logits, case.draft_token_ids
    assert logits.dtype == torch.float64 and ids.dtype == torch.int64
    assert not bool(torch.isnan(logits).any())
    assert not bool((logits == math.inf).any())
    assert not bool((logits == -math.inf).all(dim=-1).any())
    if ids.numel():
        assert int(ids.min()) >= 0 and int(ids.max()) < case.vocab_size
    assert validate_greedy_inputs(logits, ids) == (case.batch_size, case.k, case.vocab_size)


def _has_tied_non_lowest_draft(case: GreedyCase) -> bool:
    logits, ids = case.target_logits, case.draft_token_ids
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

    def all_lowest(case: GreedyCase) -> bool:
        logits, ids = case.target_logits, case.draft_token_ids
        if case.k < 2:
            return False
        firsts = (logits == logits.max(dim=-1, keepdim=True).values).to(torch.int8).argmax(-1)
        return bool((ids == firsts[:, :-1]).all())

    assert all_lowest(find(strategies.greedy_cases(), all_lowest, settings=_FIND_SETTINGS))


def test_greedy_cases_can_mask_tokens_with_minus_inf() -> None:
    """Some logits are ``-inf`` (masked tokens) in some cases."""

    def has_masked(case: GreedyCase) -> bool:
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
        (lambda: probability_vectors(1, regime="tiny-masses"), "vocab_size"),
        (lambda: probability_vectors(4, dtype=torch.int64), "dtype"),
        (lambda: probability_vectors(4, dtype="float32"), "dtype"),  # type: ignore[arg-type]
        (lambda: target_draft_pairs(1, relation="adversarial"), "vocab_size"),
        (lambda: target_draft_pairs(1, relation="p-zero-where-q-positive"), "vocab_size"),
        (lambda: target_draft_pairs(4, dtype=torch.int32), "dtype"),
        (lambda: strategies.chain_cases(min_vocab=0), "min_vocab"),
        (lambda: strategies.chain_cases(max_vocab=4, min_vocab=5), "min_vocab"),
        (lambda: strategies.chain_cases(max_k=2, min_k=3), "min_k"),
        (lambda: strategies.chain_cases(regimes=("spiky",)), "regimes"),
        (lambda: strategies.chain_cases(regimes=()), "regimes"),
        (lambda: strategies.chain_cases(relations="near"), "relations"),
        (lambda: strategies.chain_cases(relations=("disjoint", "far")), "min_vocab"),
        (lambda: strategies.greedy_cases(max_logit_magnitude=1e9), "max_logit_magnitude"),
        (lambda: strategies.greedy_cases(min_k=9), "min_k"),
        (lambda: strategies.logits_vectors(0), "vocab_size"),
        (lambda: strategies.logits_vectors(4, max_magnitude=0.5), "max_magnitude"),
        (lambda: strategies.logits_vectors(4, max_magnitude=math.inf), "max_magnitude"),
        (lambda: strategies.logits_vectors(4, max_ties=0), "max_ties"),
        (lambda: strategies.logits_vectors(4, scale="huge"), "scale"),
        (lambda: strategies.logits_vectors(4, allow_masked=1), "allow_masked"),  # type: ignore[arg-type]
        (lambda: strategies.verify_cases(max_k=-1), "max_k"),
        (lambda: strategies.verify_cases(dtypes=()), "dtypes"),
        (lambda: strategies.verify_cases(dtypes=(torch.int32,)), "dtypes"),
        (lambda: strategies.verify_cases(dtypes=torch.float16), "dtypes"),  # type: ignore[arg-type]
        (lambda: strategies.verify_cases(sampling=3), "sampling"),  # type: ignore[arg-type]
        (lambda: strategies.sampling_parameters(max_top_k=0), "max_top_k"),
        (lambda: strategies.sampling_parameters(temperature_range=(0.0, 1.0)), "temperature_range"),
        (lambda: strategies.sampling_parameters(temperature_range=(2.0, 1.0)), "temperature_range"),
        (lambda: strategies.row_sum_tolerance(torch.int8, 4), "dtype"),
        (lambda: strategies.label_frequencies(strategies.chain_cases(), examples=0), "examples"),
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
    assert REGIMES == (
        "dense",
        "peaked",
        "sparse",
        "one-hot",
        "uniform",
        "tiny-masses",
        "long-tailed",
    )
    assert RELATIONS == (
        "identical",
        "near",
        "far",
        "disjoint",
        "q-zero-where-p-positive",
        "p-zero-where-q-positive",
        "temperature",
        "adversarial",
    )
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


def test_nightly_runs_ten_times_the_ci_examples() -> None:
    """``nightly`` is ``ci`` x 10 in examples, randomised and without a deadline."""
    ci = settings.get_profile("ci")
    nightly = settings.get_profile("nightly")
    assert nightly.max_examples == 10 * ci.max_examples
    assert not nightly.derandomize and nightly.deadline is None


# --------------------------------------------------------------------------- the pytest option


class _FakeGroup:
    """Stands in for a pytest option group: records options, rejects a second registration."""

    def __init__(self) -> None:
        self.options: list[tuple[tuple[str, ...], dict[str, object]]] = []

    def addoption(self, *names: str, **attrs: object) -> None:
        if any(names == registered for registered, _ in self.options):
            raise ValueError(f"option names {set(names)} already added")
        self.options.append((names, attrs))


class _FakeParser:
    def __init__(self) -> None:
        self.group = _FakeGroup()

    def getgroup(self, name: str) -> _FakeGroup:
        return self.group


class _FakeConfig:
    def __init__(self, value: str | None) -> None:
        self.value = value

    def getoption(self, name: str, default: object = None) -> object:
        assert name == "losslessness_profile"
        return self.value


def test_add_profile_option_registers_losslessness_profile_once_with_the_profile_choices() -> None:
    """``--losslessness-profile`` is added with choices ``PROFILES``; a second call (a conftest
    and a plugin both adding it) is a no-op instead of pytest's duplicate-option error."""
    parser = _FakeParser()
    strategies.add_profile_option(parser)  # type: ignore[arg-type]
    strategies.add_profile_option(parser)  # type: ignore[arg-type]
    assert len(parser.group.options) == 1
    names, attrs = parser.group.options[0]
    assert names == ("--losslessness-profile",)
    assert attrs["choices"] == strategies.PROFILES and attrs["default"] is None


def test_configure_profile_prefers_the_option_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The option wins over ``LOSSLESSNESS_HYPOTHESIS_PROFILE``; without it the variable
    decides. The session's profile is restored."""
    active = settings.get_current_profile_name()
    try:
        monkeypatch.setenv(strategies.PROFILE_ENV_VAR, "dev")
        assert strategies.configure_profile(_FakeConfig("nightly")) == "nightly"  # type: ignore[arg-type]
        assert settings().max_examples == 250
        assert strategies.configure_profile(_FakeConfig(None)) == "dev"  # type: ignore[arg-type]
        assert settings().max_examples == 25
    finally:
        settings.load_profile(active)


def test_the_losslessness_profile_option_overrides_the_environment_in_a_pytest_run() -> None:
    """A real ``pytest --losslessness-profile nightly`` run with the variable set to ``ci``
    reports ``nightly`` in its header (the option is wired through ``tests/conftest.py``)."""
    root = Path(__file__).resolve().parents[2]
    environment = {**os.environ, strategies.PROFILE_ENV_VAR: "ci"}
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "--collect-only",
        "--losslessness-profile",
        "nightly",
        "tests/strategies/test_strategies.py::test_nightly_runs_ten_times_the_ci_examples",
    ]
    run = subprocess.run(
        command, cwd=root, env=environment, capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "losslessness hypothesis profile: nightly" in run.stdout


# ------------------------------------------------------------------ new regimes and relations


@given(probability_vectors(st.integers(2, 300), regime="tiny-masses"))
def test_tiny_mass_vectors_have_positive_masses_down_to_1e_30_beside_normal_ones(
    vector: torch.Tensor,
) -> None:
    """``tiny-masses``: every mass positive; each is either tiny (in ``[1e-30 / (1 + V 1e-8),
    1e-8]``) or normal (above ``1 / (2 V)``, less the tiny total), with at least one of each."""
    vocab = vector.numel()
    tiny_total = vocab * 1e-8
    tiny = vector <= 1e-8
    assert 1 <= int(tiny.sum()) <= vocab - 1
    lowest = 10.0 ** TINY_MASS_LOG10_RANGE[0] / (1.0 + tiny_total) * (1 - 1e-12)
    assert float(vector.min()) >= lowest
    assert float(vector[~tiny].min()) >= (1.0 - tiny_total) / (2 * vocab)


def test_tiny_mass_vectors_reach_masses_below_1e_25() -> None:
    """The tiny end of the range is reached, not just its midpoint."""

    def very_tiny(vector: torch.Tensor) -> bool:
        return float(vector.min()) < 1e-25

    found = find(
        probability_vectors(st.integers(2, 64), regime="tiny-masses"),
        very_tiny,
        settings=_FIND_SETTINGS,
    )
    assert very_tiny(found)


@given(probability_vectors(st.integers(2, 300), regime="long-tailed"))
def test_long_tailed_vectors_are_zipf_mandelbrot_with_exponent_in_its_range(
    vector: torch.Tensor,
) -> None:
    """``long-tailed``: positive masses, all distinct (one per rank), and the ratio of largest
    to smallest is ``((V - 1 + b) / b) ** s``, between ``((V + 9) / 10) ** 0.8`` and
    ``V ** 1.5`` for ``b`` in [1, 10] and ``s`` in [0.8, 1.5]."""
    vocab = vector.numel()
    ordered = torch.sort(vector, descending=True).values
    assert bool((ordered > 0).all())
    assert bool((ordered[:-1] > ordered[1:]).all())
    ratio = float(ordered[0] / ordered[-1])
    low_s, high_s = ZIPF_EXPONENT_RANGE
    assert ((vocab - 1 + ZIPF_OFFSET_RANGE[1]) / ZIPF_OFFSET_RANGE[1]) ** low_s <= ratio * (
        1 + 1e-9
    )
    assert ratio <= vocab**high_s * (1 + 1e-9)


def test_near_pairs_reach_a_tv_below_1e_7() -> None:
    """``near`` mixes down to ``t = 1e-9``: pairs with ``0 < TV(p, q) < 1e-7`` occur."""

    def very_near(pair: tuple[torch.Tensor, torch.Tensor]) -> bool:
        return 0.0 < float(total_variation(*pair)) < 1e-7

    found = find(
        target_draft_pairs(st.integers(2, 64), relation="near"), very_near, settings=_FIND_SETTINGS
    )
    assert very_near(found)


@given(target_draft_pairs(st.integers(2, 100), relation="p-zero-where-q-positive"))
def test_p_zero_where_q_positive_pairs_have_such_a_token(
    pair: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """``p-zero-where-q-positive``: some token has ``q > 0`` and ``p == 0`` exactly."""
    p, q = pair
    assert bool(((q > 0) & (p == 0)).any())


@given(target_draft_pairs(st.integers(1, 100), relation="temperature"))
def test_temperature_pairs_rank_tokens_alike_and_share_their_argmax(
    pair: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """``temperature``: p and q are ``softmax(z / T)`` of one ``z``, so ``p_i > p_j`` never
    comes with ``q_i < q_j`` (nor the reverse), and the tied maxima are the same tokens."""
    p, q = pair
    p_above = p[:, None] > p[None, :]
    q_above = q[:, None] > q[None, :]
    assert not bool((p_above & q_above.T).any())
    assert torch.equal(p == p.max(), q == q.max())


@given(target_draft_pairs(st.integers(2, 100), relation="adversarial"))
def test_adversarial_pairs_put_q_where_p_is_smallest_and_have_tv_at_least_a_half(
    pair: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """``adversarial``: q's support is at most half the tokens, all at least as unlikely under p
    as every token outside it, so ``TV(p, q) >= 0.5``."""
    p, q = pair
    support = q > 0
    assert 1 <= int(support.sum()) <= p.numel() // 2
    assert float(p[support].max()) <= float(p[~support].min())
    assert float(total_variation(p, q)) >= ADVERSARIAL_MIN_TV - 1e-12


@settings(deadline=None)
@given(st.data())
def test_target_sees_only_tv_and_the_smallest_mass_keeping_the_largest_tv(
    data: st.DataObject,
) -> None:
    """``hypothesis.target`` gets only the two hardness labels (never a p-value); drawing two
    pairs in one test case keeps the larger TV instead of raising."""
    first = data.draw(target_draft_pairs(st.integers(1, 16)), label="first")
    second = data.draw(target_draft_pairs(st.integers(1, 16)), label="second")
    observations = current_build_context().data.target_observations
    assert set(observations) == {TV_TARGET_LABEL, SMALLEST_MASS_TARGET_LABEL}
    largest = max(0.5 * float((p - q).abs().sum()) for p, q in (first, second))
    assert observations[TV_TARGET_LABEL] == pytest.approx(largest, abs=1e-12)


# ----------------------------------------------------------------- dtypes and normalisation


def test_row_sum_tolerances_are_the_documented_ones() -> None:
    """The bounds tabulated in :mod:`strategies.distributions` (V = 64 and V = 150k)."""
    tolerance = strategies.row_sum_tolerance
    assert tolerance(torch.float64, 150_000) == 1e-12
    assert 5.9e-8 < tolerance(torch.float32, 64) < tolerance(torch.float32, 150_000) < 6.0e-8
    assert 3.9e-3 < tolerance(torch.bfloat16, 150_000) < 3.92e-3
    assert 4.88e-4 < tolerance(torch.float16, 64) < 4.91e-4
    assert 4.9e-3 < tolerance(torch.float16, 150_000) < 5.0e-3


def _assert_cast_row(vector: torch.Tensor, dtype: torch.dtype, vocab_size: int) -> None:
    assert vector.dtype == dtype and tuple(vector.shape) == (vocab_size,)
    wide = vector.to(torch.float64)
    assert bool(torch.isfinite(wide).all()) and float(wide.min()) >= 0.0
    assert bool((wide > 0).any())
    assert abs(float(wide.sum()) - 1.0) <= strategies.row_sum_tolerance(dtype, vocab_size)
    law = strategies.effective_probabilities(vector)
    assert law.dtype == torch.float64
    assert abs(float(law.sum()) - 1.0) <= NORMALISATION_TOLERANCE
    assert torch.equal(law == 0, vector == 0)


@pytest.mark.parametrize("dtype", PROBABILITY_DTYPES, ids=str)
@given(data=st.data())
def test_cast_vectors_and_pairs_sum_to_1_within_the_stated_tolerance_of_their_dtype(
    dtype: torch.dtype, data: st.DataObject
) -> None:
    """Every regime and relation, cast to each dtype: non-negative, some positive mass, sum (in
    float64) within ``row_sum_tolerance(dtype, V)``; its float64 law sums to 1 within 1e-12."""
    vocab_size = data.draw(_SMALL_OR_LARGE_VOCAB, label="vocab_size")
    vector = data.draw(probability_vectors(vocab_size, dtype=dtype), label="p")
    _assert_cast_row(vector, dtype, vocab_size)
    p, q = data.draw(target_draft_pairs(vocab_size, dtype=dtype), label="(p, q)")
    _assert_cast_row(p, dtype, vocab_size)
    _assert_cast_row(q, dtype, vocab_size)


@pytest.mark.parametrize("dtype", PROBABILITY_DTYPES, ids=str)
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_cast_vectors_over_150k_tokens_sum_to_1_within_the_stated_tolerance(
    dtype: torch.dtype, data: st.DataObject
) -> None:
    """The same at a production vocabulary (150k), every regime."""
    regime = data.draw(st.sampled_from(REGIMES), label="regime")
    vector = data.draw(probability_vectors(150_000, regime, dtype), label="p")
    _assert_cast_row(vector, dtype, 150_000)


def test_float16_casts_can_flush_tiny_masses_to_exact_zeros() -> None:
    """float16 flushes masses below about 3e-8 to 0 (real low-precision inputs do too)."""
    found = find(
        probability_vectors(st.integers(2, 64), "tiny-masses", torch.float16),
        lambda vector: bool((vector == 0).any()),
        settings=_FIND_SETTINGS,
    )
    assert bool((found == 0).any()) and bool((found > 0).any())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@given(data=st.data())
def test_float32_and_bfloat16_casts_keep_tiny_masses_positive(
    dtype: torch.dtype, data: st.DataObject
) -> None:
    """float32 and bfloat16 have float32's exponent range: masses down to 1e-30 survive."""
    vector = data.draw(probability_vectors(st.integers(2, 300), "tiny-masses", dtype))
    assert bool((vector > 0).all())


# ------------------------------------------------------------------------------------ logits


@given(strategies.logits_vectors(st.integers(1, 200)))
def test_logits_vectors_are_finite_on_the_grid_exact_in_float32_with_at_most_3_ties(
    logits: torch.Tensor,
) -> None:
    """No NaN or +inf, never all -inf, finite values multiples of 0.25 within 1e4 (so exact in
    float32), and 1..3 tokens at the maximum."""
    assert logits.dtype == torch.float64
    assert not bool(torch.isnan(logits).any()) and not bool((logits == math.inf).any())
    finite = logits[torch.isfinite(logits)]
    assert finite.numel() >= 1
    assert bool((finite * 4 == torch.round(finite * 4)).all())
    assert float(finite.abs().max()) <= 1e4
    assert torch.equal(logits.to(torch.float32).to(torch.float64), logits)
    assert 1 <= int((logits == logits.max()).sum()) <= 3


@pytest.mark.parametrize(
    ("feature", "predicate"),
    [
        ("a logit of magnitude >= 1000", lambda z: float(z[torch.isfinite(z)].abs().max()) >= 1e3),
        (
            "a gap >= 1000 below the maximum",
            lambda z: float(z.max() - z[torch.isfinite(z)].min()) >= 1e3,
        ),
        ("a tie at the maximum", lambda z: int((z == z.max()).sum()) >= 2),
        ("a -inf mask", lambda z: bool((z == -math.inf).any())),
    ],
)
def test_logits_vectors_reach(feature: str, predicate: object) -> None:
    """Each hard feature of real logits occurs."""
    assert callable(predicate)
    found = find(strategies.logits_vectors(st.integers(2, 64)), predicate, settings=_FIND_SETTINGS)
    assert predicate(found), feature


def test_greedy_cases_reach_logits_of_magnitude_1000_and_stay_exact_in_float32() -> None:
    """Greedy cases use the large-magnitude logits too, still exact in float32."""

    def large(case: GreedyCase) -> bool:
        finite = case.target_logits[torch.isfinite(case.target_logits)]
        return float(finite.abs().max()) >= 1e3

    found = find(strategies.greedy_cases(), large, settings=_FIND_SETTINGS)
    logits = found.target_logits
    assert large(found)
    assert torch.equal(logits.to(torch.float32).to(torch.float64), logits)


# ------------------------------------------------------------------------ sampling parameters


@given(
    logits=strategies.logits_vectors(st.integers(1, 64)),
    params=strategies.sampling_parameters(),
)
def test_sampled_distributions_sum_to_1_keep_the_argmax_and_never_revive_masked_tokens(
    logits: torch.Tensor, params: strategies.SamplingParameters
) -> None:
    """``apply_sampling_parameters``: float64 rows summing to 1 within 1e-12, the (lowest)
    argmax kept, zero on ``-inf`` logits, at least one token."""
    probs = strategies.apply_sampling_parameters(logits, params)
    assert probs.dtype == torch.float64 and probs.shape == logits.shape
    assert float(probs.min()) >= 0.0
    assert abs(float(probs.sum()) - 1.0) <= NORMALISATION_TOLERANCE
    assert float(probs[int(torch.argmax(logits))]) > 0.0
    assert bool((probs[logits == -math.inf] == 0).all())


@given(logits=strategies.logits_vectors(st.integers(1, 64)), top_k=st.integers(1, 70))
def test_top_k_keeps_at_most_k_tokens_except_ties_at_the_kth_logit(
    logits: torch.Tensor, top_k: int
) -> None:
    """Top-k zeroes every token below the k-th largest logit; it keeps at most k tokens when
    the k-th logit is not tied."""
    probs = strategies.apply_sampling_parameters(logits, strategies.SamplingParameters(top_k=top_k))
    kept = probs > 0
    kth = torch.sort(logits, descending=True).values[min(top_k, logits.numel()) - 1]
    assert not bool(kept[logits < kth].any())
    if int((logits == kth).sum()) == 1:
        assert int(kept.sum()) <= top_k


@given(
    logits=st.lists(st.floats(-20, 20), min_size=1, max_size=64, unique=True),
    top_k=st.integers(1, 70),
)
def test_top_k_keeps_exactly_min_k_v_distinct_moderate_logits(
    logits: list[float], top_k: int
) -> None:
    """Without ties or underflow, top-k keeps exactly ``min(k, V)`` tokens: the largest."""
    z = torch.tensor(logits, dtype=torch.float64)
    probs = strategies.apply_sampling_parameters(z, strategies.SamplingParameters(top_k=top_k))
    kept = torch.nonzero(probs > 0).flatten().tolist()
    assert sorted(kept) == sorted(torch.topk(z, min(top_k, z.numel())).indices.tolist())


@given(
    logits=st.lists(st.floats(-20, 20), min_size=1, max_size=64),
    top_p=st.floats(0.01, 1.0),
    min_p=st.floats(0.0, 1.0),
)
def test_top_p_keeps_the_smallest_head_reaching_p_and_min_p_keeps_tokens_above_its_floor(
    logits: list[float], top_p: float, min_p: float
) -> None:
    """Top-p alone keeps a head of mass >= top_p whose part strictly above its least likely
    token has mass < top_p; min-p alone keeps exactly the tokens with prob >= min_p * max."""
    z = torch.tensor(logits, dtype=torch.float64)
    base = torch.softmax(z, dim=0)
    kept = strategies.apply_sampling_parameters(z, strategies.SamplingParameters(top_p=top_p)) > 0
    least = float(base[kept].min())
    assert float(base[kept].sum()) >= top_p - 1e-12
    assert float(base[base > least].sum()) < top_p + 1e-12
    kept = strategies.apply_sampling_parameters(z, strategies.SamplingParameters(min_p=min_p)) > 0
    assert torch.equal(kept, base >= min_p * base.max())


def test_filters_apply_in_the_transformers_order_temperature_top_k_top_p_min_p() -> None:
    """Cases where the order matters: top-k before top-p, and top-p before min-p."""
    apply = strategies.apply_sampling_parameters
    params = strategies.SamplingParameters
    z = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64).log()
    # top-k = 2 first leaves [0.625, 0.375]; top-p = 0.6 then keeps only token 0.
    assert apply(z, params(top_k=2, top_p=0.6)).tolist() == [1.0, 0.0, 0.0]
    z = torch.tensor([0.4, 0.35, 0.25], dtype=torch.float64).log()
    # top-p = 0.5 first leaves [8/15, 7/15]; min-p = 0.85 keeps both (7/15 >= 0.85 * 8/15).
    probs = apply(z, params(top_p=0.5, min_p=0.85))
    assert probs.tolist() == pytest.approx([8 / 15, 7 / 15, 0.0], abs=1e-12)
    # temperature first: at T = 0.5 the masses are ~[0.47, 0.36, 0.17]; top-p = 0.5 keeps 2.
    probs = apply(z, params(temperature=0.5, top_p=0.5))
    assert int((probs > 0).sum()) == 2


@given(logits=st.lists(st.floats(-30, 30), min_size=2, max_size=64, unique=True))
def test_temperature_towards_0_approaches_the_one_hot_argmax(logits: list[float]) -> None:
    """With a unique maximum and gap g to the runner-up, the mass off the argmax at temperature
    T is at most ``(V - 1) exp(-g / T)``, and it shrinks as T falls."""
    z = torch.tensor(logits, dtype=torch.float64)
    top2 = torch.topk(z, 2).values
    gap = float(top2[0] - top2[1])
    best = int(torch.argmax(z))
    previous = -1.0
    for temperature in (1.0, 0.1, 0.01, 0.001):
        probs = strategies.apply_sampling_parameters(
            z, strategies.SamplingParameters(temperature=temperature)
        )
        off = 1.0 - float(probs[best])
        assert off <= (z.numel() - 1) * math.exp(-gap / temperature) + 1e-12
        assert float(probs[best]) >= previous - 1e-15
        previous = float(probs[best])


def test_low_temperature_splits_the_mass_evenly_over_tied_maxima() -> None:
    """Tied maxima share the limit: ``[1, 1, 0]`` at T = 1e-3 is ``[0.5, 0.5, 0]``."""
    z = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    probs = strategies.apply_sampling_parameters(z, strategies.SamplingParameters(temperature=1e-3))
    assert probs.tolist() == [0.5, 0.5, 0.0]


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
    ],
)
def test_sampling_parameters_reject_invalid_fields_naming_them(
    fields: dict[str, object], name: str
) -> None:
    """Construction fails with ``ValueError`` naming the field; instances are frozen."""
    with pytest.raises(ValueError, match=rf"^{name}="):
        strategies.SamplingParameters(**fields)  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        strategies.SamplingParameters().temperature = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "logits",
    [
        torch.tensor([-math.inf, -math.inf]),
        torch.tensor([0.0, math.nan]),
        torch.tensor([math.inf, 0.0]),
        torch.tensor([1, 2]),
        torch.zeros((2, 0)),
    ],
    ids=["all-minus-inf", "nan", "plus-inf", "integer", "empty-vocabulary"],
)
def test_apply_sampling_parameters_rejects_malformed_logits(logits: torch.Tensor) -> None:
    """Malformed logits raise ``ValueError`` naming ``logits``."""
    with pytest.raises(ValueError, match=r"^logits"):
        strategies.apply_sampling_parameters(logits, strategies.SamplingParameters())


# ------------------------------------------------------------------------------ verify cases


@given(strategies.verify_cases())
def test_verify_cases_are_cast_chain_inputs_with_their_float64_laws(
    case: strategies.VerifyCase,
) -> None:
    """Shapes within the maxima (k up to 8), one of the four dtypes, cast rows within their
    dtype's tolerance, float64 laws equal to the renormalised cast rows (zeros included) and
    valid chain inputs."""
    batch, k, vocab = case.batch_size, case.k, case.vocab_size
    assert 1 <= batch <= 3 and 0 <= k <= 8 and 1 <= vocab <= 64
    assert case.dtype in strategies.VERIFY_DTYPES and case.draft_probs.dtype == case.dtype
    assert (
        tuple(case.target_probs.shape) == tuple(case.target_probs64.shape) == (batch, k + 1, vocab)
    )
    assert tuple(case.draft_probs.shape) == tuple(case.draft_probs64.shape) == (batch, k, vocab)
    tolerance = strategies.row_sum_tolerance(case.dtype, vocab)
    for cast, law in (
        (case.target_probs, case.target_probs64),
        (case.draft_probs, case.draft_probs64),
    ):
        if not cast.numel():
            continue
        assert law.dtype == torch.float64
        assert float((cast.double().sum(-1) - 1).abs().max()) <= tolerance
        assert float((law.sum(-1) - 1).abs().max()) <= NORMALISATION_TOLERANCE
        assert torch.equal(law, strategies.effective_probabilities(cast))
        assert torch.equal(law == 0, cast == 0)
    drafts = case.draft_probs64.argmax(dim=-1)
    assert validate_chain_inputs(case.target_probs64, case.draft_probs64, drafts) == (
        batch,
        k,
        vocab,
    )


@given(
    strategies.verify_cases(
        dtypes=(torch.float64,),
        sampling=st.just(strategies.SamplingParameters(top_k=1)),
    )
)
def test_verify_case_sampling_parameters_reach_target_and_draft_rows(
    case: strategies.VerifyCase,
) -> None:
    """With ``top_k = 1`` applied, every row of p and q keeps only its (tied) maxima."""
    assert case.sampling == strategies.SamplingParameters(top_k=1)
    for rows in (case.target_probs64, case.draft_probs64):
        for row in rows.reshape(-1, case.vocab_size):
            positive = row[row > 0]
            assert torch.equal(positive, positive.max().expand_as(positive))


@settings(max_examples=3, deadline=None)
@given(strategies.verify_cases(max_vocab=150_000, min_vocab=100_000, max_k=2, max_batch=1))
def test_verify_cases_over_a_production_vocabulary_keep_their_tolerance(
    case: strategies.VerifyCase,
) -> None:
    """Vocabularies of 100k-150k tokens, any dtype and sampling: rows within tolerance."""
    tolerance = strategies.row_sum_tolerance(case.dtype, case.vocab_size)
    assert float((case.target_probs.double().sum(-1) - 1).abs().max()) <= tolerance
    assert bool((case.target_probs64.sum(-1) > 0).all())


# ---------------------------------------------------------------------------------- coverage

COVERAGE_EXAMPLES = 200
"""Examples drawn (fixed seed 0) to show that every regime and relation is reached."""


def _print_frequencies(title: str, frequencies: strategies.LabelFrequencies) -> None:
    print(f"\n{title}: {frequencies.examples} examples (share of examples, share of kind)")
    for prefix in ("regime=", "relation=", "dtype=", "sampling=", "logits scale="):
        for name, _, share, _, of_kind in frequencies.table(prefix):
            print(f"  {name:34s} {share:7.1%} {of_kind:7.1%}")


def test_every_regime_and_relation_is_reached_in_200_chain_cases() -> None:
    """``chain_cases()`` as the suite calls it reaches every regime and every relation within
    200 examples (seed 0); ``pytest -s`` prints the frequencies."""
    frequencies = strategies.label_frequencies(
        strategies.chain_cases(), examples=COVERAGE_EXAMPLES, seed_value=0
    )
    _print_frequencies("chain_cases()", frequencies)
    assert frequencies.examples == COVERAGE_EXAMPLES
    missing = [
        name
        for name in [f"regime={r}" for r in REGIMES] + [f"relation={r}" for r in RELATIONS]
        if frequencies.examples_with[name] == 0
    ]
    assert not missing, f"not reached in {COVERAGE_EXAMPLES} chain cases: {missing}"


def test_every_dtype_regime_relation_and_sampling_mode_is_reached_in_200_verify_cases() -> None:
    """``verify_cases()`` reaches every dtype, sampling on and off, each filter, and every
    regime and relation within 200 examples (seed 0)."""
    frequencies = strategies.label_frequencies(
        strategies.verify_cases(), examples=COVERAGE_EXAMPLES, seed_value=0
    )
    _print_frequencies("verify_cases()", frequencies)
    expected = (
        [f"regime={r}" for r in REGIMES]
        + [f"relation={r}" for r in RELATIONS]
        + ["dtype=float32", "dtype=float16", "dtype=bfloat16", "dtype=float64"]
        + ["sampling=none", "sampling=on"]
        + [f"sampling: {name}" for name in ("temperature != 1", "top-k", "top-p", "min-p")]
        + [f"logits scale={scale}" for scale in strategies.LOGIT_SCALES]
    )
    missing = [name for name in expected if frequencies.examples_with[name] == 0]
    assert not missing, f"not reached in {COVERAGE_EXAMPLES} verify cases: {missing}"


def test_recording_labels_sees_the_events_of_one_draw() -> None:
    """``recording_labels`` collects the ``event`` labels a draw reports (one pair: its
    relation and its vectors' regimes)."""
    seen: list[list[str]] = []

    @settings(max_examples=1, database=None, derandomize=True)
    @given(st.data())
    def draw_one(data: st.DataObject) -> None:
        with strategies.recording_labels() as labels:
            data.draw(target_draft_pairs(4, relation="identical"))
        seen.append(labels)

    draw_one()
    assert seen[0][0] == "relation=identical"
    assert seen[0][1].startswith("regime=")


# --------------------------------------------------------------------------------- shrinking

_SHRINK_SETTINGS = settings(
    max_examples=1000,
    database=None,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
"""For ``find`` with shrinking: the minimal example of a predicate, derandomized."""


def test_a_chain_case_with_a_zero_target_mass_shrinks_to_one_row_of_two_tokens() -> None:
    """The smallest chain case with ``p == 0`` somewhere: ``B = 1``, ``k = 0``, ``V = 2``,
    ``p = [1, 0]`` (readable)."""
    case = find(
        strategies.chain_cases(),
        lambda case: bool((case.target_probs == 0).any()),
        settings=_SHRINK_SETTINGS,
    )
    assert (case.batch_size, case.k, case.vocab_size) == (1, 0, 2)
    assert case.target_probs.flatten().tolist() == [1.0, 0.0]


def test_a_chain_case_over_20_tokens_shrinks_to_v_20_with_one_bonus_row() -> None:
    """A size threshold shrinks to the threshold itself: ``V = 20``, ``k = 0``, ``B = 1``."""
    case = find(
        strategies.chain_cases(), lambda case: case.vocab_size >= 20, settings=_SHRINK_SETTINGS
    )
    assert (case.batch_size, case.k, case.vocab_size) == (1, 0, 20)


def test_a_chain_case_with_a_draft_that_is_never_accepted_shrinks_to_two_one_hot_tokens() -> None:
    """A position with ``sum min(p, q) == 0`` shrinks to ``B = 1``, ``k = 1``, ``V = 2`` with
    one-hot p_0 and q_0 on different tokens."""

    def never_accepted(case: ChainCase) -> bool:
        overlap = torch.minimum(case.target_probs[:, :-1], case.draft_probs).sum(-1)
        return bool((overlap == 0).any())

    case = find(strategies.chain_cases(), never_accepted, settings=_SHRINK_SETTINGS)
    assert (case.batch_size, case.k, case.vocab_size) == (1, 1, 2)
    p0, q0 = case.target_probs[0, 0].tolist(), case.draft_probs[0, 0].tolist()
    assert sorted(p0) == sorted(q0) == [0.0, 1.0] and p0 != q0


def test_a_float16_verify_case_with_sampling_shrinks_to_a_small_case() -> None:
    """A float16 case with sampling parameters and ``k >= 1`` shrinks to ``B = 1``, ``k = 1``,
    ``V <= 2`` and parameters with every filter off."""

    def wanted(case: strategies.VerifyCase) -> bool:
        return case.dtype == torch.float16 and case.sampling is not None and case.k >= 1

    smaller = strategies.verify_cases(max_vocab=16, max_k=2, max_batch=2)  # faster to shrink
    case = find(smaller, wanted, settings=_SHRINK_SETTINGS)
    assert (case.batch_size, case.k) == (1, 1) and case.vocab_size <= 2
    assert case.sampling is not None
    assert (case.sampling.top_k, case.sampling.top_p, case.sampling.min_p) == (None, None, None)


def test_a_greedy_case_rejecting_its_first_draft_shrinks_to_two_tokens() -> None:
    """A greedy case whose first draft is not the lowest argmax shrinks to ``B = 1``, ``k = 1``,
    ``V = 2`` (across the V = 8 / 9 boundary between drawn and seeded values)."""

    def rejects_first(case: GreedyCase) -> bool:
        if case.k == 0:
            return False
        first = case.target_logits[:, 0]
        return bool((case.draft_token_ids[:, 0] != torch.argmax(first, dim=-1)).any())

    smaller = strategies.greedy_cases(max_vocab=16, max_k=2, max_batch=2)  # faster to shrink
    case = find(smaller, rejects_first, settings=_SHRINK_SETTINGS)
    assert (case.batch_size, case.k, case.vocab_size) == (1, 1, 2)
