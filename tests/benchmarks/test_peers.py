"""The peers' tests (benchmarks.peers): each passes the exact law at its own nominal
sample size, detects a gross deviation, uses the published thresholds, and looks only where the
peer looks (the blind spots are pinned too, so that the comparison in docs/detection-rates.md
measures the peers' methods and not a stronger variant).

Samples come from :func:`_steps`, which draws n verification steps whose conditional laws are
exactly those of a lossless verifier (or a chosen wrong law), in numpy: fast enough for the
peers' nominal sizes (1e5 steps, V = 4096). Every seed is fixed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special

from benchmarks.peers import (
    TRTLLM_KL_NOMINAL_SAMPLES,
    TRTLLM_KL_TOLERANCE,
    VLLM_CHI_SQUARE_MIN_EXPECTED,
    VLLM_HISTOGRAM_MARGIN,
    VLLM_HISTOGRAM_NOMINAL_SIZES,
    VLLM_HISTOGRAM_REFERENCES,
    flashinfer_structure,
    trtllm_kl,
    vllm_chi_square,
    vllm_chi_square_threshold,
    vllm_histogram_l2,
    vllm_histogram_sizes,
)


def _sample(probs: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    cdf = np.cumsum(probs)
    tokens: np.ndarray = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
    clipped: np.ndarray = np.minimum(tokens, probs.size - 1)
    return clipped


def _steps(
    p: np.ndarray,
    q: np.ndarray,
    n: int,
    seed: int,
    emitted_law: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``[1, n, k+1]`` outputs and ``[1, n, k]`` drafts of n steps: position i is reached with
    probability prod_{j<i} sum min(p_j, q_j) and the token emitted there follows
    ``emitted_law[i]`` (p_i by default, which is what a lossless verifier emits); the accepted
    prefix equals the drafts."""
    rng = np.random.default_rng(seed)
    k = q.shape[0]
    law = p if emitted_law is None else emitted_law
    acceptance = np.minimum(p[:k], q).sum(axis=-1)
    accepted = np.cumprod(rng.random((n, k)) < acceptance, axis=1).sum(axis=1)
    tokens = np.stack([_sample(law[i], n, rng) for i in range(k + 1)], axis=1)
    positions = np.arange(k + 1)
    outputs = np.where(positions <= accepted[:, None], tokens, -1)
    drafts = np.stack([_sample(q[i], n, rng) for i in range(k)], axis=1)
    drafts = np.where(positions[:k] < accepted[:, None], tokens[:, :k], drafts)
    return outputs[None].astype(np.int64), drafts[None].astype(np.int64)


def _vllm_histogram_case(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's setting: V = 10, k = 2, p and q softmax(U[0, 1)), the same p at every position."""
    rng = np.random.default_rng(seed)
    p = scipy.special.softmax(rng.random(10))
    q = scipy.special.softmax(rng.random(10))
    return np.tile(p, (3, 1)), np.tile(q, (2, 1))


def test_vllm_histogram_sizes_follow_the_published_schedule() -> None:
    """At n = 1e5 the sizes are vLLM's 10..1e5; elsewhere 10, 100, ... up to n; n <= 10 is
    refused (the ratio needs two sizes)."""
    assert vllm_histogram_sizes(100_000) == VLLM_HISTOGRAM_NOMINAL_SIZES
    assert vllm_histogram_sizes(30_000) == (10, 100, 1_000, 10_000, 30_000)
    assert vllm_histogram_sizes(11) == (10, 11)
    with pytest.raises(ValueError, match=r"^n:"):
        vllm_histogram_sizes(10)
    assert (VLLM_HISTOGRAM_MARGIN, VLLM_HISTOGRAM_REFERENCES) == (20.0, 100)


def test_vllm_histogram_passes_the_exact_law_at_its_nominal_size() -> None:
    """vLLM's own setting at its own schedule (1e5 steps): the exact law passes, with the
    distance to p shrinking far more than 20x the distance to the random references."""
    p, q = _vllm_histogram_case()
    outputs, _ = _steps(p, q, 100_000, seed=1)
    verdict = vllm_histogram_l2(outputs, p[None], seed=2)
    assert not verdict.detected, verdict
    assert verdict.statistic > verdict.threshold


def test_vllm_histogram_detects_a_gross_deviation() -> None:
    """Tokens emitted from q instead of p at every draft position: the distance to p stops
    shrinking, so the ratio stays near 1, far below the threshold."""
    p, q = _vllm_histogram_case()
    wrong = np.vstack([q, p[2:]])
    outputs, _ = _steps(p, q, 100_000, seed=1, emitted_law=wrong)
    verdict = vllm_histogram_l2(outputs, p[None], seed=2)
    assert verdict.detected
    assert verdict.statistic < 3.0


def test_vllm_histogram_expects_the_pooled_law_whatever_the_acceptance_rate() -> None:
    """With a different p at each position the pooled histogram mixes them in proportion to
    the tokens each position emitted: exact laws pass at an acceptance rate near 1 and at
    one far below sum min(p, q) (a lossless but suboptimal verifier)."""
    rng = np.random.default_rng(7)
    p = scipy.special.softmax(rng.random((3, 10)) * 3, axis=-1)
    for q in (0.9 * p[:2] + 0.1 / 10, scipy.special.softmax(rng.random((2, 10)) * 3, axis=-1)):
        outputs, _ = _steps(p, q, 100_000, seed=8)
        assert not vllm_histogram_l2(outputs, p[None], seed=9).detected


def test_vllm_histogram_never_looks_at_the_bonus_token() -> None:
    """vLLM drops the bonus column: a bonus drawn from the wrong law passes."""
    p, q = _vllm_histogram_case()
    wrong = np.vstack([p[:2], q[:1]])
    outputs, _ = _steps(p, q, 100_000, seed=1, emitted_law=wrong)
    assert not vllm_histogram_l2(outputs, p[None], seed=2).detected


def test_vllm_chi_square_threshold_is_df_plus_ten_sqrt_two_df() -> None:
    """The published threshold df + 10 sqrt(2 df) (about 10 sigma), e.g. 5000 at df 4095."""
    assert vllm_chi_square_threshold(1) == pytest.approx(1 + 10 * math.sqrt(2))
    assert vllm_chi_square_threshold(4095) == pytest.approx(4095 + 10 * math.sqrt(8190))
    with pytest.raises(ValueError, match=r"^df:"):
        vllm_chi_square_threshold(0)


def test_vllm_chi_square_merges_cells_below_expected_five_and_drops_a_small_merged_bin() -> None:
    """p = [0.5, 0.499, 0.001] at n = 1000: the third cell (expected 1) is merged into an
    "other" bin whose expected count 1 < 5 drops it, so chi2 is Pearson's over two cells."""
    assert VLLM_CHI_SQUARE_MIN_EXPECTED == 5.0
    tokens = np.repeat([0, 1, 2], [510, 489, 1])
    outputs = np.stack([tokens, np.full(1000, -1)], axis=-1)[None]
    p = np.array([[[0.5, 0.499, 0.001], [0.5, 0.499, 0.001]]])
    verdict = vllm_chi_square(outputs, p)
    assert verdict.statistic == pytest.approx(10**2 / 500 + 10**2 / 499)
    assert verdict.threshold == pytest.approx(vllm_chi_square_threshold(1))
    assert not verdict.detected


def _vllm_chi_square_case(k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """vLLM's setting: V = 4096, logits N(0, 1) / 0.6 for target and draft, one p throughout."""
    rng = np.random.default_rng(seed)
    p = scipy.special.softmax(rng.standard_normal(4096) / 0.6)
    q = scipy.special.softmax(rng.standard_normal(4096) / 0.6)
    return np.tile(p, (k + 1, 1)), np.tile(q, (k, 1))


def test_vllm_chi_square_passes_the_exact_law_at_its_nominal_size() -> None:
    """vLLM's setting (k = 3, 10 V = 40960 steps): the exact law passes at every position."""
    p, q = _vllm_chi_square_case(3)
    outputs, _ = _steps(p, q, 10 * 4096, seed=3)
    verdict = vllm_chi_square(outputs, p[None])
    assert not verdict.detected, verdict


def test_vllm_chi_square_detects_a_wrong_bonus_token() -> None:
    """Every position is tested, the bonus included: with k = 1 (vLLM's other setting), a
    bonus drawn from q is caught at position 1."""
    p, q = _vllm_chi_square_case(1)
    outputs, _ = _steps(p, q, 10 * 4096, seed=3, emitted_law=np.vstack([p[:1], q]))
    verdict = vllm_chi_square(outputs, p[None])
    assert verdict.detected
    assert "pos 1" in verdict.where


def test_vllm_chi_square_fails_on_an_id_outside_the_vocabulary() -> None:
    """An id >= V fails (vLLM's scatter_add_ would raise)."""
    outputs = np.array([[[0, 1, -1], [5, -1, -1]]])
    p = np.full((1, 3, 2), 0.5)
    assert vllm_chi_square(outputs, p).statistic == math.inf


def _trtllm_case(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """TensorRT-LLM's setting: V = 500, k = 1, the 400 smallest masses of p and q set to 0."""
    rng = np.random.default_rng(seed)
    rows = rng.random((3, 500))
    for row in rows:
        row[np.argsort(row)[:400]] = 0.0
    rows /= rows.sum(axis=-1, keepdims=True)
    return rows[:2], rows[2:]


def test_trtllm_kl_passes_the_exact_law_at_its_nominal_size() -> None:
    """TensorRT-LLM's setting at 50000 steps: the KL gap stays below 0.01."""
    p, q = _trtllm_case()
    outputs, _ = _steps(p, q, TRTLLM_KL_NOMINAL_SAMPLES, seed=4)
    verdict = trtllm_kl(outputs, p[None], seed=5)
    assert verdict.threshold == TRTLLM_KL_TOLERANCE == 0.01
    assert not verdict.detected, verdict


def test_trtllm_kl_detects_a_gross_deviation_of_the_first_token() -> None:
    """First tokens drawn from a mixture 0.5 p + 0.5 q: KL(p || histogram) jumps by far more
    than 0.01 (q's support covers p's here, so the KL stays finite)."""
    p, q = _trtllm_case()
    mixed = np.vstack([0.5 * p[0] + 0.5 * q[0], p[1]])
    outputs, _ = _steps(p, q, TRTLLM_KL_NOMINAL_SAMPLES, seed=4, emitted_law=mixed)
    verdict = trtllm_kl(outputs, p[None], seed=5)
    assert verdict.detected
    assert verdict.statistic > 0.05


def test_trtllm_kl_never_looks_past_the_first_token() -> None:
    """Only position 0 is compared: a bonus drawn from q passes."""
    p, q = _trtllm_case()
    outputs, _ = _steps(p, q, TRTLLM_KL_NOMINAL_SAMPLES, seed=4, emitted_law=np.vstack([p[0], q]))
    assert not trtllm_kl(outputs, p[None], seed=5).detected


def test_trtllm_kl_alarms_on_the_exact_law_when_a_token_goes_unobserved() -> None:
    """At n = 50 over 100 positive tokens some token is unseen: both KLs are infinite, their
    difference NaN, and the assertion fails although the law is exact."""
    p, q = _trtllm_case()
    outputs, _ = _steps(p, q, 50, seed=4)
    verdict = trtllm_kl(outputs, p[None], seed=5)
    assert verdict.detected
    assert math.isnan(verdict.statistic)


def test_flashinfer_structure_passes_valid_outputs_and_ignores_the_law() -> None:
    """Structurally valid outputs pass whatever law they follow (FlashInfer never tests one)."""
    p, q = _vllm_histogram_case()
    for law in (None, np.tile(q[0], (3, 1))):
        outputs, drafts = _steps(p, q, 2000, seed=6, emitted_law=law)
        verdict = flashinfer_structure(outputs, drafts, 10, p[None])
        assert not verdict.detected, verdict


@pytest.mark.parametrize(
    ("row", "drafts", "problem"),
    [
        ([1, -1, 4], [1, 2], "token after a placeholder"),
        ([1, 2, 10], [1, 2], "id >= V"),
        ([-1, -1, -1], [1, 2], "no token"),
        ([7, 2, -1], [1, 2], "mismatches not contiguous: token after the first mismatch"),
    ],
)
def test_flashinfer_structure_detects_malformed_rows(
    row: list[int], drafts: list[int], problem: str
) -> None:
    """Each structural violation FlashInfer's test asserts against is detected."""
    outputs = np.array([[[1, 2, 3], row]])
    draft_ids = np.array([[[1, 2], drafts]])
    verdict = flashinfer_structure(outputs, draft_ids, 10)
    assert verdict.detected, problem
    assert verdict.statistic == 1.0


def test_flashinfer_structure_one_hot_target_demands_the_exact_output() -> None:
    """With one-hot p the output is deterministic (FlashInfer's onehot_target branch): the
    right tokens pass, a wrong emitted token is detected."""
    p = np.zeros((1, 3, 4))
    p[0, [0, 1, 2], [1, 3, 0]] = 1.0
    drafts = np.array([[[1, 3], [1, 2], [0, 3]]])
    right = np.array([[[1, 3, 0], [1, 3, -1], [1, -1, -1]]])
    assert not flashinfer_structure(right, drafts, 4, p).detected
    wrong = right.copy()
    wrong[0, 1, 1] = 2
    assert flashinfer_structure(wrong, drafts, 4, p).detected


def test_peers_reject_malformed_inputs_naming_the_argument() -> None:
    """Shapes that do not fit give a ValueError starting with the argument's name."""
    p = np.full((1, 2, 4), 0.25)
    good = np.zeros((1, 20, 2), dtype=np.int64)
    with pytest.raises(ValueError, match=r"^outputs:"):
        vllm_chi_square(np.zeros((20, 2), dtype=np.int64), p)
    with pytest.raises(ValueError, match=r"^outputs:"):
        trtllm_kl(good.astype(float), p, seed=0)
    with pytest.raises(ValueError, match=r"^target_probs:"):
        vllm_chi_square(good, np.full((1, 3, 4), 0.25))
    with pytest.raises(ValueError, match=r"^target_probs:"):
        trtllm_kl(good, np.full((1, 2, 4), 0.3), seed=0)
    with pytest.raises(ValueError, match=r"^n:"):
        vllm_histogram_l2(good[:, :10], p, seed=0)
    with pytest.raises(ValueError, match=r"^drafts:"):
        flashinfer_structure(good, np.zeros((1, 20, 2), dtype=np.int64), 4)
    with pytest.raises(ValueError, match=r"^vocab_size:"):
        flashinfer_structure(good, np.zeros((1, 20, 1), dtype=np.int64), 0)
