"""Identity test: do observed token counts follow a known distribution p?

Contract (in the manner of TFP's ``statistical_testing``):

- **Correct code fails rarely.** If the counts are a multinomial sample from ``p``, the
  chi-square part of :func:`identity_test` gives ``pvalue <= alpha`` with probability about
  ``alpha``. The pooling floor :data:`EXPECTED_COUNT_FLOOR` was chosen by simulation so that
  this holds, within measurement error, at 1e-2, 1e-3 and 1e-4 (worst measured 1.26 alpha at
  1e-4; table at the constant); at the ~5e-6 levels runs use it is an extrapolation. The exact
  part (observations on cells with ``p == 0``) never fires on correct code.
- **Code that misbehaves by more than the minimum detectable TV fails with the stated power.**
  :func:`losslessness.stats.power.identity_minimum_detectable_tv` gives that TV for a given ``n``
  and :func:`losslessness.stats.power.plan_identity_test` the ``n`` for a given TV; both see the
  same pooled partition as this test (:func:`pooling_partition`).
- **Nothing is claimed below it.** A deviation smaller than the minimum detectable TV, or hidden
  inside the pooled cell, may pass.

The triple: :func:`identity_test` / :func:`losslessness.stats.power.identity_minimum_detectable_tv`
/ :func:`losslessness.stats.power.plan_identity_test`.

Shapes: ``counts`` and ``probs`` are ``[V]``; ``V`` is the vocabulary (number of cells).

References:
    Cressie, N. and Read, T. R. C. (1984). Multinomial goodness-of-fit tests. JRSS B 46(3),
    440-464 (the power-divergence family; lambda = 2/3 is best calibrated in the tails).
    Paninski, L. (2008). A coincidence-based test for uniformity given very sparsely sampled
    discrete data. IEEE Trans. Inf. Theory 54(10) (identity testing needs
    Theta(sqrt(V) / eps^2) samples; below that no test, this one included, has power).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.stats
from numpy.typing import ArrayLike, NDArray

from losslessness.stats.validation import check_expected_floor, check_nonnegative_int

__all__ = [
    "EXPECTED_COUNT_FLOOR",
    "PROBS_SUM_TOLERANCE",
    "IdentityTestResult",
    "identity_test",
    "identity_test_pvalues",
    "pooling_partition",
    "pooling_partition_unchecked",
]

PROBS_SUM_TOLERANCE = 1e-6
"""Largest accepted ``|sum(probs) - 1|`` after conversion to float64."""

MAX_REPORTED_ZERO_MASS_TOKENS = 10
"""How many offending zero-probability cells :class:`IdentityTestResult` lists."""

# Chosen by measurement, not convention: the chi-square tail is least accurate at the small
# per-assertion levels runs use (about 1e-3 / 200 = 5e-6), and sparse cells are what spoil it.
EXPECTED_COUNT_FLOOR: float = 20.0
"""Default pooling floor: positive cells with expected count ``n * p`` below it are pooled.

Chosen by simulation (``benchmarks/calibrate_expected_floor.py``, seed 20240601, 216 s on two
cores): the false-alarm rate of :func:`identity_test` under the null, divided by alpha, worst
cell over 6 regimes (V2 [0.3, 0.7]; V2 [1e-4, 1 - 1e-4]; V8 Dirichlet(1); V64 Dirichlet(1) with
16 exact zeros; V1000 softmax(N(0, 1) / 0.3); V4096 Dirichlet(50)) x n in {50, 500, 5000, 50000},
cells with df > 0 only, 1e6 multinomial replicates per cell (5e4 for V4096). In brackets, cells
significantly above nominal (one-sided exact binomial p < 1e-3)::

    floor   alpha=1e-2   alpha=1e-3   alpha=1e-4
        1   1.07 (2)     1.96 (4)     2.68 (6)
        5   1.04 (1)     1.96 (2)     2.26 (3)
       10   1.02 (0)     1.13 (1)     1.38 (1)
       20   1.02 (0)     1.09 (0)     1.26 (0)

20 is the smallest candidate with no cell significantly above nominal at 1e-3 and 1e-4. Below it
the worst cells are V2 [1e-4, 1 - 1e-4] at n = 50000 (one cell of expected count 5: 1.96 at 1e-3
for floors 1 and 5) and V1000 peaked at n = 500 (floor 10: 1.13, 95% Clopper-Pearson [1.06, 1.20]
at 1e-3; 1.38 [1.16, 1.63] at 1e-4). At 20 a mild excess remains at 1e-4 (V64 at n = 500: 1.26
[1.05, 1.50]; V1000 at n = 500: 1.22 [1.01, 1.46]); the trend suggests a larger one at ~5e-6,
which this many replicates cannot resolve. The worst at 1e-3 (1.09, V2 [0.3, 0.7]) does not
depend on the floor: it is the discreteness of a two-cell statistic. V4096 Dirichlet(50) is
fully pooled (df 0) at floor 20 for every n measured, so it constrains only the smaller floors
(floor 10 at n = 50000: 0.90 at 1e-3, 0.60 at 1e-4). The price is power: more
mass is pooled, so planned sample sizes grow (peaked V1000 at TV 0.05, alpha 5e-6, power 0.9:
40662 samples at floor 10, 58821 at 20).
"""


@dataclass(frozen=True)
class IdentityTestResult:
    """Outcome of :func:`identity_test`.

    Attributes:
        statistic: Cressie-Read (lambda = 2/3) power divergence over the pooled cells; ``0.0``
            when ``df == 0``.
        pvalue: upper tail of chi-square(``df``) at ``statistic``; ``1.0`` when ``df == 0``.
            It does *not* include the exact zero-mass part: check ``zero_mass_count`` too.
        df: degrees of freedom, ``n_cells - 1`` (``>= 0``).
        n: total count, zero-probability cells included.
        n_cells: number of cells after pooling (cells with ``p > 0`` only).
        pooled_cells: how many positive-probability cells were merged into the pooled cell
            (``0`` if none).
        pooled_mass: total null probability of the merged cells (``0.0`` if none).
        expected_floor: the pooling floor used, in expected counts.
        zero_mass_count: observations on cells whose null probability is exactly 0; any
            positive value proves ``counts`` did not come from ``probs`` (the exact part).
        zero_mass_tokens: ascending indices of up to 10 such offending cells.
    """

    statistic: float
    pvalue: float
    df: int
    n: int
    n_cells: int
    pooled_cells: int
    pooled_mass: float
    expected_floor: float
    zero_mass_count: int
    zero_mass_tokens: tuple[int, ...]


def as_probs(probs: ArrayLike, name: str = "probs") -> NDArray[np.float64]:
    """Validate a probability vector and return it as float64, renormalised to sum to 1.

    Args:
        probs: ``[V]`` real, ``V >= 1``, non-negative, no NaN, summing to 1 within
            :data:`PROBS_SUM_TOLERANCE` after conversion to float64.
        name: the argument's name, used in error messages.

    Returns:
        ``[V]`` float64, a fresh array summing to 1 (exact zeros stay exact zeros).

    Raises:
        ValueError: message starts with ``name`` and says which condition failed.
    """
    array = np.asarray(probs)
    if array.dtype.kind not in "iuf":
        raise ValueError(f"{name}: must be a real array, got dtype {array.dtype}")
    array = array.astype(np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name}: must have shape [V], got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"{name}: must not be empty")
    if np.isnan(array).any():
        raise ValueError(f"{name}: contains NaN")
    if np.isinf(array).any():
        raise ValueError(f"{name}: contains inf")
    if (array < 0).any():
        raise ValueError(f"{name}: contains negative entries (min {array.min()!r})")
    total = float(array.sum())
    if abs(total - 1.0) > PROBS_SUM_TOLERANCE:
        raise ValueError(f"{name}: must sum to 1 within {PROBS_SUM_TOLERANCE:g}, sums to {total!r}")
    return array / total


def as_counts(counts: ArrayLike, name: str = "counts") -> NDArray[np.int64]:
    """Validate a count vector and return it as int64.

    Args:
        counts: ``[V]`` non-negative integers; integer-valued floats are accepted.
        name: the argument's name, used in error messages.

    Returns:
        ``[V]`` int64.

    Raises:
        ValueError: message starts with ``name`` and says which condition failed.
    """
    array = np.asarray(counts)
    if array.dtype.kind not in "iuf":
        raise ValueError(f"{name}: must be non-negative integers, got dtype {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"{name}: must have shape [V], got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"{name}: must not be empty")
    if array.dtype.kind == "f":
        if np.isnan(array).any():
            raise ValueError(f"{name}: contains NaN")
        if not np.isfinite(array).all():
            raise ValueError(f"{name}: contains inf")
    if (array < 0).any():
        raise ValueError(f"{name}: must be non-negative integers, min is {array.min()!r}")
    if array.dtype.kind == "f" and (array != np.floor(array)).any():
        raise ValueError(f"{name}: must be non-negative integers, got non-integer values")
    return array.astype(np.int64)


def pooling_partition(
    probs: ArrayLike, n: int, expected_floor: float = EXPECTED_COUNT_FLOOR
) -> tuple[NDArray[np.bool_], int, float]:
    """The cell partition the identity test uses at sample size ``n``: which cells are pooled.

    Pooling rule (the single implementation; :func:`identity_test` and the power functions in
    :mod:`losslessness.stats.power` both call it):

    1. Cells with ``probs == 0`` take no part: they are checked exactly, not by the chi-square.
    2. Every positive cell with expected count ``n * p < expected_floor`` is merged into one
       pooled cell.
    3. If the pooled cell's expected count is still below the floor and unpooled positive cells
       remain, the smallest remaining cells (ties: lowest index) are merged into it until it
       reaches the floor or nothing else remains. Each remaining cell has expected count
       ``>= expected_floor`` on its own, so at most one is ever needed.

    The partition has ``n_cells = (#unpooled positive cells) + (1 if any pooled)`` cells and
    ``df = n_cells - 1`` degrees of freedom. With ``n == 0`` every positive cell is pooled
    (``df == 0``): nothing is tested.

    Args:
        probs: ``[V]`` probabilities (validated as in :func:`identity_test`).
        n: sample size, an integer ``>= 0``.
        expected_floor: pooling floor in expected counts, ``>= 0``.

    Returns:
        ``(pooled, df, pooled_mass)``: ``pooled`` is a ``[V]`` bool mask of the merged cells
        (never true on a zero-probability cell), ``df`` an int ``>= 0`` and ``pooled_mass`` the
        total probability of the merged cells as a float (``0.0`` when nothing is pooled).

    Raises:
        ValueError: on invalid ``probs``, ``n`` or ``expected_floor`` (message names it).
    """
    p = as_probs(probs)
    size = check_nonnegative_int(n, "n")
    return pooling_partition_unchecked(p, size, check_expected_floor(expected_floor))


def pooling_partition_unchecked(
    p: NDArray[np.float64], n: int, floor: float
) -> tuple[NDArray[np.bool_], int, float]:
    """:func:`pooling_partition` on arguments the caller has validated, for the stats
    functions that already hold them (``p`` from :func:`as_probs`, ``n`` and ``floor`` from
    :mod:`losslessness.stats.validation`): nothing is checked or renormalised again, so they
    see exactly the partition the test sees.

    Args:
        p: ``[V]`` float64 probabilities summing to 1.
        n: sample size, an int ``>= 0``.
        floor: pooling floor in expected counts, ``>= 0``.

    Returns:
        ``(pooled, df, pooled_mass)`` as :func:`pooling_partition`.
    """
    positive = p > 0
    expected = n * p
    pooled = positive & (expected < floor)
    if pooled.any():
        remaining = positive & ~pooled
        if float(expected[pooled].sum()) < floor and remaining.any():
            # Every remaining cell alone reaches the floor, so adding the smallest one suffices.
            candidates = np.flatnonzero(remaining)
            pooled[candidates[np.argmin(expected[candidates])]] = True
    n_pooled = int(pooled.sum())
    n_cells = int(positive.sum()) - n_pooled + (1 if n_pooled else 0)
    pooled_mass = float(p[pooled].sum()) if n_pooled else 0.0
    return pooled, n_cells - 1, pooled_mass


def identity_test(
    counts: ArrayLike, probs: ArrayLike, *, expected_floor: float = EXPECTED_COUNT_FLOOR
) -> IdentityTestResult:
    """Test whether ``counts`` is a multinomial sample from ``probs``.

    Two parts, reported separately:

    - **exact**: any observation on a cell with ``probs == 0`` is impossible under the null;
      their number is ``zero_mass_count`` and the first offending cells ``zero_mass_tokens``.
    - **chi-square**: over the positive cells, pooled by :func:`pooling_partition` at the number
      of observations on positive cells, the Cressie-Read lambda = 2/3 power-divergence
      statistic (computed by ``scipy.stats.power_divergence(lambda_="cressie-read")``, expected
      counts rescaled to the observed total over positive cells), referred to chi-square(df).

    A caller rejects at level ``alpha`` when ``zero_mass_count > 0`` or ``pvalue <= alpha``; the
    exact part adds no false alarms, so the level is that of the chi-square part.

    Args:
        counts: ``[V]`` non-negative integers (any integer dtype, or integer-valued floats).
        probs: ``[V]`` null probabilities, float, summing to 1 within 1e-6 after float64
            conversion; renormalised internally.
        expected_floor: pooling floor in expected counts (default
            :data:`EXPECTED_COUNT_FLOOR`, chosen by simulation).

    Returns:
        :class:`IdentityTestResult`. With no observations on positive cells, or a single cell
        after pooling, ``df == 0``, ``statistic == 0.0`` and ``pvalue == 1.0``.

    Raises:
        ValueError: naming ``counts``, ``probs`` or ``expected_floor``: wrong shape, empty, NaN,
            negative, non-integer counts, probabilities not summing to 1, or a length mismatch.

    Notes:
        Cressie & Read (1984) for the statistic and its chi-square limit; the limit is poor when
        expected counts are small, hence the pooling floor.
    """
    observed = as_counts(counts)
    p = as_probs(probs)
    if observed.shape != p.shape:
        raise ValueError(
            f"counts: length {observed.shape[0]} does not match probs length {p.shape[0]}"
        )
    floor = check_expected_floor(expected_floor)

    zero = p == 0
    offending = np.flatnonzero(zero & (observed > 0))
    zero_mass_count = int(observed[zero].sum())
    zero_mass_tokens = tuple(int(i) for i in offending[:MAX_REPORTED_ZERO_MASS_TOKENS])
    n = int(observed.sum())
    # The chi-square compares the law on positive cells; impossible observations are the exact
    # part's business, so the expected counts are scaled to what landed on positive cells.
    n_positive = n - zero_mass_count

    pooled, df, pooled_mass = pooling_partition_unchecked(p, n_positive, floor)
    n_pooled = int(pooled.sum())
    if df == 0:
        return IdentityTestResult(
            statistic=0.0,
            pvalue=1.0,
            df=0,
            n=n,
            n_cells=1,
            pooled_cells=n_pooled,
            pooled_mass=pooled_mass,
            expected_floor=floor,
            zero_mass_count=zero_mass_count,
            zero_mass_tokens=zero_mass_tokens,
        )

    cell_obs, cell_probs = _cells(observed, p, pooled)
    cell_exp = cell_probs * (n_positive / float(cell_probs.sum()))
    result = scipy.stats.power_divergence(cell_obs, cell_exp, lambda_="cressie-read")
    return IdentityTestResult(
        statistic=float(result.statistic),
        pvalue=float(result.pvalue),
        df=df,
        n=n,
        n_cells=df + 1,
        pooled_cells=n_pooled,
        pooled_mass=pooled_mass,
        expected_floor=floor,
        zero_mass_count=zero_mass_count,
        zero_mass_tokens=zero_mass_tokens,
    )


def _cells(
    counts: NDArray[np.int64], probs: NDArray[np.float64], pooled: NDArray[np.bool_]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Counts ``[..., C]`` and null probabilities ``[C]`` of the cells the chi-square compares:
    every positive unpooled cell, then the pooled cell when there is one."""
    kept = (probs > 0) & ~pooled
    observed = counts[..., kept].astype(np.float64)
    cell_probs = probs[kept]
    if pooled.any():
        merged = counts[..., pooled].sum(axis=-1, keepdims=True).astype(np.float64)
        observed = np.concatenate([observed, merged], axis=-1)
        cell_probs = np.append(cell_probs, probs[pooled].sum())
    return observed, cell_probs


def identity_test_pvalues(
    counts: ArrayLike, probs: ArrayLike, *, expected_floor: float = EXPECTED_COUNT_FLOOR
) -> NDArray[np.float64]:
    """Chi-square p-values of :func:`identity_test` for many replicates at once (calibration).

    Args:
        counts: ``[R, V]`` non-negative integers, every row with the same total ``n`` and no
            observation on a zero-probability cell (samples drawn from ``probs`` itself).
        probs: ``[V]`` float64 summing to 1 within 1e-6.
        expected_floor: the pooling floor, as in :func:`identity_test`.

    Returns:
        ``[R]`` float64: row r's value equals ``identity_test(counts[r], probs).pvalue``
        (all ones when the partition has one cell).

    Raises:
        ValueError: naming ``counts`` or ``probs``: not 2-D / 1-D, a width mismatch, rows with
            different totals, or observations on zero-probability cells.
    """
    observed = np.asarray(counts)
    p = as_probs(probs)
    if observed.ndim != 2 or observed.shape[1] != p.shape[0]:
        raise ValueError(f"counts: expected shape [R, {p.shape[0]}], got {observed.shape}")
    totals = observed.sum(axis=1)
    if totals.size and (totals != totals[0]).any():
        raise ValueError("counts: every row must have the same total n")
    if (observed[:, p == 0] > 0).any():
        raise ValueError("counts: observations on zero-probability cells")
    n = int(totals[0]) if totals.size else 0
    pooled, df, _ = pooling_partition_unchecked(p, n, check_expected_floor(expected_floor))
    if df == 0:
        return np.ones(observed.shape[0])
    cell_obs, cell_probs = _cells(observed, p, pooled)
    expected = n * cell_probs / cell_probs.sum()
    result = scipy.stats.power_divergence(
        cell_obs, expected[None, :], axis=1, lambda_="cressie-read"
    )
    return np.asarray(result.pvalue, dtype=np.float64)
