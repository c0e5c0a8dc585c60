"""Peers' losslessness tests, reimplemented from their published test code, as baselines.

Each function takes the outputs of ``n`` chain verification steps (the same samples our checks
see) and the case's exact laws, and returns a :class:`PeerVerdict`: did the peer's assertion
fail (``detected``), on which statistic, against which threshold. They exist to measure, at
equal sample counts, what the peers' tests catch and how often they alarm on correct code
(``benchmarks/detection_rates.py``, ``docs/detection-rates.md``).

Contract: unlike :mod:`losslessness.stats.identity`, none of these methods states a false-alarm
rate or a power; their thresholds are fixed constants tuned for one sample size. Away from that
size they may alarm on correct code (the vLLM histogram and TensorRT-LLM KL tests at small n) or
miss gross deviations. The constants below are the published ones; where a peer's test only fits
its own setting (one row type, one p shared by every position, k = 1), the generalisation to a
case with per-position laws is stated in the function's docstring.

Shapes: ``R`` row types, ``n`` verification steps per row type, draft length ``k``, vocabulary
``V``; ``outputs`` is ``[R, n, k+1]`` int (``-1`` after the last emitted token), ``drafts``
``[R, n, k]`` int, ``target_probs`` ``[R, k+1, V]`` and ``draft_probs`` ``[R, k, V]`` float.

Sources (read with the project's code search; URLs of the repositories' files):
    vLLM histogram test: https://github.com/vllm-project/vllm/blob/main/tests/v1/sample/test_rejection_sampler.py
    (``test_rejection_sampling_approximates_target_distribution``,
    ``estimate_rejection_sampling_pdf``).
    vLLM chi-square test: https://github.com/vllm-project/vllm/pull/38496 ("Adds test for
    rejection sampler correctness (via chi-squared goodness-of-fit test)"), the test of the
    model-runner-v2 ``probabilistic_rejection_sample`` kernel, helper
    ``_assert_distribution_match``.
    TensorRT-LLM KL test: https://github.com/NVIDIA/TensorRT-LLM/pull/6542,
    ``tests/unittest/_torch/speculative/test_torch_rejection_sampling.py``
    (``test_get_rejected_indices``).
    FlashInfer structural test: https://github.com/flashinfer-ai/flashinfer/blob/main/tests/test_sampling.py
    (``test_chain_speculative_sampling``: "a very simple test that only checks whether output
    is valid or not").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.special
import scipy.stats
from numpy.typing import NDArray

from losslessness.protocol import PLACEHOLDER

__all__ = [
    "TRTLLM_KL_NOMINAL_SAMPLES",
    "TRTLLM_KL_TOLERANCE",
    "VLLM_CHI_SQUARE_MIN_EXPECTED",
    "VLLM_CHI_SQUARE_SIGMAS",
    "VLLM_HISTOGRAM_MARGIN",
    "VLLM_HISTOGRAM_NOMINAL_SIZES",
    "VLLM_HISTOGRAM_REFERENCES",
    "PeerVerdict",
    "flashinfer_structure",
    "trtllm_kl",
    "vllm_chi_square",
    "vllm_chi_square_threshold",
    "vllm_histogram_l2",
    "vllm_histogram_sizes",
]

VLLM_HISTOGRAM_MARGIN = 20.0
"""vLLM's ``expected_improvement_multiplier``: the distance to the target must shrink 20x more
than the distance to the random references between the smallest and largest sample size."""

VLLM_HISTOGRAM_REFERENCES = 100
"""vLLM's ``num_reference_probs``: random reference distributions softmax(U[0, 1)^V)."""

VLLM_HISTOGRAM_NOMINAL_SIZES = (10, 100, 1_000, 10_000, 100_000)
"""vLLM's ``sample_sizes``: the first and last decide the verdict."""

VLLM_CHI_SQUARE_MIN_EXPECTED = 5.0
"""vLLM's ``min_expected``: cells with a smaller expected count are merged into one "other" bin
(kept only if its own expected count reaches it)."""

VLLM_CHI_SQUARE_SIGMAS = 10.0
"""vLLM's threshold is ``df + 10 * sqrt(2 * df)``: ten standard deviations of chi-square(df)
above its mean, by the normal approximation ("effectively disallowing false positives")."""

TRTLLM_KL_TOLERANCE = 0.01
"""TensorRT-LLM's bound on ``|KL(p || spec histogram) - KL(p || plain histogram)|``."""

TRTLLM_KL_NOMINAL_SAMPLES = 50_000
"""TensorRT-LLM's ``num_iter`` (one draft token per iteration, V = 500 of which 100 positive)."""


@dataclass(frozen=True)
class PeerVerdict:
    """One peer method's verdict on one case's samples.

    Attributes:
        method: the method's name (``vllm-histogram-l2``, ``vllm-chi-square``, ``trtllm-kl``,
            ``flashinfer-structure``).
        detected: the peer's assertion fails (it would report the implementation as wrong).
        statistic: the quantity the peer compares with its threshold (for multi-part methods,
            the part nearest to failing, or the first that failed).
        threshold: what ``statistic`` is compared with (the method's docstring gives the side).
        n: verification steps per row type the verdict used.
        where: which part decided (row type, position), or why nothing was tested.
    """

    method: str
    detected: bool
    statistic: float
    threshold: float
    n: int
    where: str


def _validate_outputs(outputs: object, k: int | None = None) -> NDArray[np.int64]:
    array = np.asarray(outputs)
    if array.ndim != 3:
        raise ValueError(f"outputs: must have shape [R, n, k+1], got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"outputs: must hold integer token ids, got dtype {array.dtype}")
    if array.shape[0] < 1 or array.shape[1] < 1:
        raise ValueError(f"outputs: needs R >= 1 row types and n >= 1 steps, got {array.shape}")
    if k is not None and array.shape[2] != k + 1:
        raise ValueError(f"outputs: last axis must be k+1 = {k + 1}, got {array.shape[2]}")
    return array.astype(np.int64, copy=False)


def _validate_probs(value: object, name: str, rows: int, width: int | None) -> NDArray[np.float64]:
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != 3 or array.shape[0] != rows or (width is not None and array.shape[1] != width):
        expected = f"[{rows}, {width if width is not None else 'k'}, V]"
        raise ValueError(f"{name}: must have shape {expected}, got shape {array.shape}")
    if not np.all(np.isfinite(array)) or (array < 0).any():
        raise ValueError(f"{name}: must be finite and non-negative")
    if array.shape[2] < 1:
        raise ValueError(f"{name}: vocabulary V must be >= 1")
    if not np.allclose(array.sum(axis=-1), 1.0, atol=1e-5, rtol=0.0):
        raise ValueError(f"{name}: every row must sum to 1 within 1e-5")
    return array


def _emitted_counts(outputs: NDArray[np.int64]) -> NDArray[np.int64]:
    """Leading non-placeholder tokens per step: ``[R, n]`` from ``[R, n, k+1]``."""
    counts: NDArray[np.int64] = np.cumprod(outputs != PLACEHOLDER, axis=-1).sum(axis=-1)
    return counts


def vllm_histogram_sizes(n: int) -> tuple[int, ...]:
    """Sample sizes of :func:`vllm_histogram_l2` at a budget of ``n`` steps.

    vLLM's schedule is 10, 100, ..., 100000; at another budget it is 10, 100, ... up to ``n``
    (``n`` itself appended when it is not a power of ten), so that the published schedule is
    exactly the one at ``n = 100000``.

    Raises:
        ValueError: ``n <= 10`` (the test needs two sizes).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 10:
        raise ValueError(f"n: vLLM's histogram test needs more than 10 steps, got {n!r}")
    sizes = []
    size = VLLM_HISTOGRAM_NOMINAL_SIZES[0]
    while size <= n:
        sizes.append(size)
        size *= 10
    if sizes[-1] != n:
        sizes.append(int(n))
    return tuple(sizes)


def _density(tokens: NDArray[np.int64], vocab: int) -> NDArray[np.float64]:
    # torch.histogram(bins=V, range=(0, V), density=True): ids outside [0, V] are ignored (the
    # last bin is closed, so an id equal to V lands in it), as in vLLM's test.
    counts, _ = np.histogram(tokens, bins=vocab, range=(0, vocab))
    total = counts.sum()
    if total == 0:
        return np.full(vocab, np.nan)
    density: NDArray[np.float64] = counts / total
    return density


def vllm_histogram_l2(outputs: object, target_probs: object, *, seed: int) -> PeerVerdict:
    """vLLM's histogram test: does the L2 distance to p shrink 20x faster than to random laws?

    What it tests: only the marginal histogram of the tokens emitted at the draft positions
    0..k-1, pooled (vLLM drops the bonus column, ``sampled_token_ids[:, :-1]``), against the law
    that pooled histogram must have. It never looks at the bonus token, at acceptance, at
    positions separately, or at zero-probability tokens as such, and it states no false-alarm
    rate: its threshold is a ratio of ratios tuned for the schedule 10..100000.

    Method (vLLM ``test_rejection_sampling_approximates_target_distribution``): for each size s
    of :func:`vllm_histogram_sizes`, the density histogram h_s of the emitted draft-position
    tokens of the first s steps; ``d_target(s) = ||p - h_s||_2`` and ``d_ref(s) =
    ||R - h_s||_F / 100`` for 100 reference laws ``R = softmax(U[0, 1))`` drawn once. Pass iff
    ``d_target(first) / d_target(last) > 20 * d_ref(first) / d_ref(last)``.

    Generalisation: vLLM uses one p at every position and one row type, with fresh samples per
    size. Here p in ``d_target(s)`` is the law the pooled histogram has under losslessness given
    how many tokens each (row type, position) contributed among the first s steps,
    ``sum_{r, i<k} N_{r,i}(s) p_{r,i} / sum N``; with one p throughout it is p, and like vLLM's
    test it does not depend on the acceptance rate. The sizes are prefixes of the same n steps
    (the method uses exactly n steps).

    Args:
        outputs: ``[R, n, k+1]`` int, verifier outputs; ``n > 10``, ``k >= 1``.
        target_probs: ``[R, k+1, V]`` float, p.
        seed: seeds the reference laws.

    Returns:
        :class:`PeerVerdict` with ``statistic = d_target(first) / d_target(last)`` and
        ``threshold = 20 * d_ref(first) / d_ref(last)``; detected iff not ``statistic >
        threshold`` (an empty histogram gives NaN, which fails as in vLLM).

    Raises:
        ValueError: naming the argument, for malformed shapes or probabilities, ``k == 0`` or
            ``n <= 10``.
    """
    array = _validate_outputs(outputs)
    rows, n, width = array.shape
    k = width - 1
    if k < 1:
        raise ValueError("outputs: vLLM's histogram test drops the bonus column, needs k >= 1")
    p = _validate_probs(target_probs, "target_probs", rows, k + 1)
    vocab = p.shape[2]
    sizes = vllm_histogram_sizes(n)
    counts = _emitted_counts(array)
    rng = np.random.default_rng(seed)
    references = scipy.special.softmax(rng.random((VLLM_HISTOGRAM_REFERENCES, vocab)), axis=1)
    to_target, to_reference = [], []
    for size in (sizes[0], sizes[-1]):
        emitted = (counts[:, :size, None] > np.arange(k)).sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            expected = (emitted[..., None] * p[:, :k]).sum(axis=(0, 1)) / emitted.sum()
        histogram = _density(array[:, :size, :k].ravel(), vocab)
        to_target.append(float(np.linalg.norm(expected - histogram)))
        to_reference.append(float(np.linalg.norm(references - histogram)) / len(references))
    with np.errstate(divide="ignore", invalid="ignore"):
        statistic = float(np.float64(to_target[0]) / np.float64(to_target[1]))
        threshold = VLLM_HISTOGRAM_MARGIN * float(
            np.float64(to_reference[0]) / np.float64(to_reference[1])
        )
    return PeerVerdict(
        "vllm-histogram-l2",
        not statistic > threshold,
        statistic,
        threshold,
        n,
        f"draft positions 0..{k - 1} pooled, sizes {sizes[0]}..{sizes[-1]}",
    )


def vllm_chi_square_threshold(df: int) -> float:
    """vLLM's chi-square threshold ``df + 10 * sqrt(2 * df)`` (about 10 sigma above the mean)."""
    if df < 1:
        raise ValueError(f"df: must be >= 1, got {df}")
    return df + VLLM_CHI_SQUARE_SIGMAS * math.sqrt(2 * df)


def vllm_chi_square(outputs: object, target_probs: object) -> PeerVerdict:
    """vLLM's chi-square test at every position, threshold ``df + 10 sqrt(2 df)``.

    What it tests: the emitted token at each position i (including the bonus), among steps that
    emit at least i+1 tokens, against p_i: Pearson's chi-square over the cells with expected
    count >= 5, the others merged into one bin that is dropped when its own expected count is
    below 5. Positions left with fewer than two bins are skipped (vLLM ``return``s). It tests
    the conditional laws as our ``law`` check does, but at about 10 sigma with no Bonferroni
    split and no stated false-alarm rate; it does not test acceptance or independence, and a
    token with p = 0 is seen only through the merged bin (or not at all, when that bin is
    dropped).

    Method (vLLM ``_assert_distribution_match``, used by ``test_stochastic_rejection_sample``
    with V = 4096 and 10 V trials): fail iff ``chi2 >= df + 10 sqrt(2 df)`` at any tested
    position. An emitted id outside [0, V) fails too (vLLM's ``scatter_add_`` would raise).

    Generalisation: vLLM has one row type and one p at every position; here each (row type,
    position) is tested against its own p_i, and the verdict is any failure.

    Args:
        outputs: ``[R, n, k+1]`` int, verifier outputs.
        target_probs: ``[R, k+1, V]`` float, p.

    Returns:
        :class:`PeerVerdict` with the chi-square and threshold of the (row, position) nearest
        to failing (largest ``chi2 / threshold``); ``statistic = inf`` for an out-of-range id;
        ``threshold = inf`` when no position had two bins.

    Raises:
        ValueError: naming the argument, for malformed shapes or probabilities.
    """
    array = _validate_outputs(outputs)
    rows, n, width = array.shape
    p = _validate_probs(target_probs, "target_probs", rows, width)
    vocab = p.shape[2]
    counts = _emitted_counts(array)
    worst = (-math.inf, 0.0, math.inf, "no position with two bins of expected count >= 5")
    for r in range(rows):
        for i in range(width):
            tokens = array[r, counts[r] > i, i]
            if tokens.size == 0:
                continue
            if ((tokens < 0) | (tokens >= vocab)).any():
                return PeerVerdict(
                    "vllm-chi-square",
                    True,
                    math.inf,
                    math.nan,
                    n,
                    f"row {r} pos {i}: id not in [0, V)",
                )
            observed = np.bincount(tokens, minlength=vocab).astype(np.float64)
            expected = p[r, i] * tokens.size
            sufficient = expected >= VLLM_CHI_SQUARE_MIN_EXPECTED
            obs = observed[sufficient]
            exp = expected[sufficient]
            other = float(expected[~sufficient].sum())
            if other >= VLLM_CHI_SQUARE_MIN_EXPECTED:
                obs = np.append(obs, observed[~sufficient].sum())
                exp = np.append(exp, other)
            df = obs.size - 1
            if df < 1:
                continue
            chi2 = float(((obs - exp) ** 2 / exp).sum())
            threshold = vllm_chi_square_threshold(df)
            if chi2 / threshold > worst[0]:
                worst = (chi2 / threshold, chi2, threshold, f"row {r} pos {i}, df {df}")
    _, statistic, threshold, where = worst
    return PeerVerdict("vllm-chi-square", statistic >= threshold, statistic, threshold, n, where)


def trtllm_kl(outputs: object, target_probs: object, *, seed: int) -> PeerVerdict:
    """TensorRT-LLM's test: ``|KL(p || spec histogram) - KL(p || plain histogram)| < 0.01``.

    What it tests: only the first emitted token (position 0, the marginal; TensorRT-LLM drafts
    one token), comparing how far the speculative output's histogram is from p with how far
    plain sampling's histogram (n draws from p) is. It never looks at later positions, the
    bonus token, acceptance or independence, and states no false-alarm rate: whenever a token
    with p > 0 is missing from a histogram the KL is infinite, ``inf - inf`` is NaN and the
    assertion fails, so with n not much larger than the support it alarms on correct code.

    Method (TensorRT-LLM ``test_get_rejected_indices``, V = 500 with 100 positive tokens,
    n = 50000): ``np.histogram`` densities over bins centred on 0..V-1, ``scipy.stats.entropy``
    for the KL. Detected iff not ``|KL_spec - KL_plain| < 0.01`` (NaN fails).

    Generalisation: with R > 1 row types each row type is tested on its own, the verdict is any
    failure.

    Args:
        outputs: ``[R, n, k+1]`` int, verifier outputs (column 0 is used).
        target_probs: ``[R, k+1, V]`` float, p (p_0 is used).
        seed: seeds the plain sampling from p_0.

    Returns:
        :class:`PeerVerdict` with the largest ``|KL_spec - KL_plain|`` over row types (NaN
        first) and ``threshold = 0.01``.

    Raises:
        ValueError: naming the argument, for malformed shapes or probabilities.
    """
    array = _validate_outputs(outputs)
    rows, n, width = array.shape
    p = _validate_probs(target_probs, "target_probs", rows, width)
    vocab = p.shape[2]
    rng = np.random.default_rng(seed)
    bins = np.arange(vocab + 1) - 0.5
    worst = (-math.inf, 0)
    statistic = math.nan
    for r in range(rows):
        expected = p[r, 0]
        cdf = np.cumsum(expected)
        plain = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), vocab - 1)
        kls = []
        for tokens in (array[r, :, 0], plain):
            counts, _ = np.histogram(tokens, bins=bins)
            with np.errstate(divide="ignore", invalid="ignore"):
                kls.append(float(scipy.stats.entropy(expected, counts / max(counts.sum(), 1))))
                if counts.sum() == 0:
                    kls[-1] = math.nan
        with np.errstate(invalid="ignore"):
            gap = abs(kls[0] - kls[1])
        key = math.inf if math.isnan(gap) else gap
        if key > worst[0]:
            worst = (key, r)
            statistic = gap
    return PeerVerdict(
        "trtllm-kl",
        not statistic < TRTLLM_KL_TOLERANCE,
        statistic,
        TRTLLM_KL_TOLERANCE,
        n,
        f"row {worst[1]} pos 0",
    )


def _one_hot_tokens(p: NDArray[np.float64]) -> NDArray[np.int64] | None:
    """The token of every position if each p_i of one row type is one-hot, else None."""
    if not ((p > 0).sum(axis=-1) == 1).all():
        return None
    tokens: NDArray[np.int64] = p.argmax(axis=-1)
    return tokens


def flashinfer_structure(
    outputs: object, drafts: object, vocab_size: int, target_probs: object | None = None
) -> PeerVerdict:
    """FlashInfer's structural test of chain speculative sampling (no distribution test).

    What it tests (FlashInfer ``test_chain_speculative_sampling``): that the output is valid,
    never what it follows. For a row type whose every p_i is one-hot (FlashInfer's
    ``onehot_target`` branch) the output is deterministic and must equal it exactly: accept d_i
    iff it is p_i's token, then emit p_i's token at the first rejection (or the bonus). Otherwise
    every id >= 0 is < V; the positions where the output differs from the draft are contiguous;
    after the first of them only -1 follows; and at least one token is emitted (the consequence
    of FlashInfer's ``emitted_num + 1 == (output != -1).sum()``, whose counter the protocol
    does not return). Exact: never alarms on a correct verifier, blind to every wrong law.

    Args:
        outputs: ``[R, n, k+1]`` int, verifier outputs.
        drafts: ``[R, n, k]`` int, the drafts the verifier was given.
        vocab_size: V.
        target_probs: ``[R, k+1, V]`` float, p, for the one-hot branch; None skips it (greedy
            verifiers, whose p is not given).

    Returns:
        :class:`PeerVerdict` with ``statistic`` the number of invalid rows and ``threshold`` 1
        (detected iff at least one).

    Raises:
        ValueError: naming the argument, for malformed shapes.
    """
    array = _validate_outputs(outputs)
    rows, n, width = array.shape
    k = width - 1
    draft_array = np.asarray(drafts)
    if draft_array.shape != (rows, n, k) or not np.issubdtype(draft_array.dtype, np.integer):
        raise ValueError(
            f"drafts: must be integer with shape {(rows, n, k)}, got {draft_array.shape}"
        )
    if (
        isinstance(vocab_size, bool)
        or not isinstance(vocab_size, (int, np.integer))
        or vocab_size < 1
    ):
        raise ValueError(f"vocab_size: must be a positive integer, got {vocab_size!r}")
    one_hot: list[NDArray[np.int64] | None] = [None] * rows
    if target_probs is not None:
        p = _validate_probs(target_probs, "target_probs", rows, width)
        if p.shape[2] != vocab_size:
            raise ValueError(f"target_probs: vocabulary {p.shape[2]} != vocab_size {vocab_size}")
        one_hot = [_one_hot_tokens(p[r]) for r in range(rows)]
    invalid = np.zeros((rows, n), dtype=bool)
    positions = np.arange(width)
    for r in range(rows):
        out, draft = array[r], draft_array[r].astype(np.int64)
        tokens = one_hot[r]
        if tokens is not None:
            accepted = np.cumprod(draft == tokens[:k], axis=1).sum(axis=1)
            expected = np.full((n, width), PLACEHOLDER, dtype=np.int64)
            expected[:, :k] = np.where(positions[:k] < accepted[:, None], draft, PLACEHOLDER)
            expected[np.arange(n), accepted] = tokens[accepted]
            invalid[r] = (out != expected).any(axis=1)
            continue
        bad_id = (out >= vocab_size).any(axis=1)
        mismatch = out[:, :k] != draft
        has = mismatch.any(axis=1)
        first = np.where(has, mismatch.argmax(axis=1), k)
        last = np.where(has, k - 1 - mismatch[:, ::-1].argmax(axis=1), k)
        gapped = has & (mismatch.sum(axis=1) != last - first + 1)
        tail = (positions[None, :] > first[:, None]) & (out != PLACEHOLDER)
        empty = (out != PLACEHOLDER).sum(axis=1) == 0
        invalid[r] = bad_id | gapped | tail.any(axis=1) | empty
    bad = int(invalid.sum())
    where = "every row valid"
    if bad:
        r, step = (int(x) for x in np.argwhere(invalid)[0])
        where = f"{bad} invalid rows; first: row type {r}, step {step}: {array[r, step].tolist()}"
    return PeerVerdict("flashinfer-structure", bad >= 1, float(bad), 1.0, n, where)
