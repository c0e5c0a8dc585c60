"""Two-sample homogeneity test: do two count vectors over the same cells follow one law?

Used where no exact law is known to test against, only a second implementation's samples: the
device checks compare a GPU kernel's emitted tokens with the CPU reference's, position by
position (:mod:`losslessness.checks.coupling`).

Contract (in the manner of TFP's ``statistical_testing``, like
:mod:`losslessness.stats.identity`):

- **Correct code fails rarely.** If both count vectors are multinomial samples from one law,
  :func:`two_sample_test` gives ``pvalue <= alpha`` with probability about ``alpha`` (measured in
  ``tests/stats/test_two_sample.py`` at 0.05 and 0.01).
- **Code that misbehaves by more than the minimum detectable TV fails with the stated power.**
  :func:`two_sample_minimum_detectable_tv` gives that TV for sample sizes ``n_a``, ``n_b``, and
  :func:`two_sample_sample_size` the per-sample ``n`` (equal sizes) for a given TV.
- **Nothing is claimed below it**, nor for a difference hidden inside the pooled cell.

The triple: :func:`two_sample_test` / :func:`two_sample_minimum_detectable_tv` /
:func:`two_sample_sample_size`.

Pooling follows the identity test's one rule (:func:`losslessness.stats.identity.
pooling_partition`, "cells expected below the floor pool into one"), applied to the pooled
empirical law ``(a + b) / (n_a + n_b)`` at the smaller sample's size ``min(n_a, n_b)``: under the
null, cell j's expected counts in the 2 x C table are ``n_a * p_j`` and ``n_b * p_j``, so
``min(n_a, n_b) * p_j`` is the smaller of them, the one the floor must bound.

Shapes: ``counts_a`` and ``counts_b`` are ``[V]``; ``V`` is the number of cells (vocabulary).

References:
    Cressie, N. and Read, T. R. C. (1984). Multinomial goodness-of-fit tests. JRSS B 46(3),
    440-464 (the power-divergence family, lambda = 2/3; its limit for contingency tables).
    Cohen, J. (1988). Statistical Power Analysis for the Behavioral Sciences, 2nd ed., ch. 7
    (effect size w and noncentral chi-square power of contingency tables).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.stats
from numpy.typing import ArrayLike

from losslessness.stats.identity import (
    EXPECTED_COUNT_FLOOR,
    as_counts,
    pooling_partition_unchecked,
)
from losslessness.stats.power import chi_square_minimum_detectable_tv, chi_square_sample_size
from losslessness.stats.validation import (
    check_expected_floor,
    check_nonnegative_int,
    check_open_unit_interval,
)

__all__ = [
    "TwoSampleTestResult",
    "two_sample_minimum_detectable_tv",
    "two_sample_sample_size",
    "two_sample_test",
]


@dataclass(frozen=True)
class TwoSampleTestResult:
    """Outcome of :func:`two_sample_test`.

    Attributes:
        statistic: Cressie-Read (lambda = 2/3) power divergence of the pooled 2 x ``cells``
            table; ``0.0`` when ``df == 0``.
        pvalue: upper tail of chi-square(``df``) at ``statistic``; ``1.0`` when ``df == 0``.
        df: degrees of freedom, ``cells - 1`` (``>= 0``; ``0`` when either sample is empty).
        cells: number of cells (columns) after pooling; cells observed in neither sample take
            no part (``0`` when both samples are empty).
        n_a: total of ``counts_a``.
        n_b: total of ``counts_b``.
        pooled_cells: how many observed cells were merged into the pooled cell (``0`` if none).
        pooled_mass: share of all ``n_a + n_b`` observations in the merged cells (``0.0`` if
            none).
        expected_floor: the pooling floor used, in expected counts of the smaller sample.
    """

    statistic: float
    pvalue: float
    df: int
    cells: int
    n_a: int
    n_b: int
    pooled_cells: int
    pooled_mass: float
    expected_floor: float


def two_sample_test(
    counts_a: ArrayLike, counts_b: ArrayLike, *, expected_floor: float = EXPECTED_COUNT_FLOOR
) -> TwoSampleTestResult:
    """Test whether ``counts_a`` and ``counts_b`` are multinomial samples from one law.

    The 2 x V table ``[counts_a, counts_b]`` is pooled by :func:`losslessness.stats.identity.
    pooling_partition` on the pooled empirical law at ``min(n_a, n_b)`` (module docstring), and
    its Cressie-Read lambda = 2/3 statistic is referred to chi-square(cells - 1), as
    ``scipy.stats.chi2_contingency(table, correction=False, lambda_="cressie-read")`` computes
    it (expected counts from the margins; no continuity correction, also for 2 x 2).

    A caller rejects at level ``alpha`` when ``pvalue <= alpha``.

    Args:
        counts_a: ``[V]`` non-negative integers (any integer dtype, or integer-valued floats).
        counts_b: ``[V]`` non-negative integers, the same ``V``.
        expected_floor: pooling floor in expected counts of the smaller sample (default
            :data:`losslessness.stats.identity.EXPECTED_COUNT_FLOOR`, chosen by simulation for
            the identity test).

    Returns:
        :class:`TwoSampleTestResult`. With either sample empty, or a single cell after
        pooling, ``df == 0``, ``statistic == 0.0`` and ``pvalue == 1.0``.

    Raises:
        ValueError: naming ``counts_a``, ``counts_b`` or ``expected_floor``: not 1-D, empty,
            NaN or inf, negative or non-integer counts, or lengths that differ.

    Notes:
        Cressie & Read (1984) for the statistic and its chi-square(cells - 1) limit, which is
        poor when expected counts are small, hence the pooling floor.
    """
    a = as_counts(counts_a, "counts_a")
    b = as_counts(counts_b, "counts_b")
    if a.shape != b.shape:
        raise ValueError(
            f"counts_b: length {b.shape[0]} does not match counts_a length {a.shape[0]}"
        )
    floor = check_expected_floor(expected_floor)
    n_a, n_b = int(a.sum()), int(b.sum())
    total = a + b
    n = n_a + n_b
    if n == 0:
        return TwoSampleTestResult(0.0, 1.0, 0, 0, 0, 0, 0, 0.0, floor)
    pooled_law = total / float(n)
    pooled, df, pooled_mass = pooling_partition_unchecked(pooled_law, min(n_a, n_b), floor)
    n_pooled = int(pooled.sum())
    if df == 0:
        return TwoSampleTestResult(0.0, 1.0, 0, 1, n_a, n_b, n_pooled, pooled_mass, floor)
    kept = (total > 0) & ~pooled
    table = np.stack([a[kept], b[kept]])
    if n_pooled:
        merged = np.array([[a[pooled].sum()], [b[pooled].sum()]])
        table = np.concatenate([table, merged], axis=1)
    test = scipy.stats.chi2_contingency(table, correction=False, lambda_="cressie-read")
    if int(test.dof) != df:  # pragma: no cover - a 2 x C table has C - 1 degrees of freedom
        raise AssertionError(f"chi2_contingency dof {test.dof} != partition df {df}")
    return TwoSampleTestResult(
        statistic=float(test.statistic),
        pvalue=float(test.pvalue),
        df=df,
        cells=df + 1,
        n_a=n_a,
        n_b=n_b,
        pooled_cells=n_pooled,
        pooled_mass=pooled_mass,
        expected_floor=floor,
    )


def two_sample_minimum_detectable_tv(
    n_a: int, n_b: int, df: int, alpha: float, power: float
) -> float:
    """Smallest TV between the two laws that :func:`two_sample_test` detects with ``power``.

    Under laws ``p_a`` and ``p_b`` the 2 x C statistic is approximately noncentral
    chi-square(df) with noncentrality ``n_eff * w**2``, ``n_eff = n_a n_b / (n_a + n_b)`` and
    ``w**2 = sum((p_a - p_b)**2 / pbar)``, ``pbar`` the mixture weighted by the sample sizes
    (Cohen 1988, ch. 7); by Cauchy-Schwarz ``w >= sum |p_a - p_b| = 2 TV``. So this is
    :func:`losslessness.stats.power.chi_square_minimum_detectable_tv` at the effective size
    ``n_eff``:
    about ``sqrt(2)`` times the identity test's at ``n`` for two samples of ``n`` each.

    Args:
        n_a, n_b: the sample sizes, integers ``>= 0``.
        df: degrees of freedom of the test, integer ``>= 0``.
        alpha: significance level, in (0, 1).
        power: required power, in (0, 1).

    Returns:
        TV as a float; ``math.inf`` when either sample is empty or ``df == 0`` (may exceed 1).

    Raises:
        ValueError: naming the argument that is out of range or of the wrong type.
    """
    size_a = check_nonnegative_int(n_a, "n_a")
    size_b = check_nonnegative_int(n_b, "n_b")
    dof = check_nonnegative_int(df, "df")
    level = check_open_unit_interval(alpha, "alpha")
    target = check_open_unit_interval(power, "power")
    if size_a == 0 or size_b == 0 or dof == 0:
        return math.inf
    effective = size_a * size_b / (size_a + size_b)
    # chi_square_minimum_detectable_tv(n) = sqrt(lambda / n) / 2, so scale its value at n = 1.
    return chi_square_minimum_detectable_tv(1, dof, level, target) / math.sqrt(effective)


def two_sample_sample_size(tv: float, df: int, alpha: float, power: float) -> int:
    """Per-sample size ``n`` (two samples of ``n`` each) at which :func:`two_sample_test`
    detects laws at TV ``tv`` with ``power``: ``2 * chi_square_sample_size(tv, df, alpha,
    power)``, since ``n_eff = n / 2`` (see :func:`two_sample_minimum_detectable_tv`); it may
    exceed the smallest such ``n`` by one.

    Raises:
        ValueError: naming the argument that is out of range (``df == 0`` included: a one-cell
            test has no power at any ``n``).
    """
    return 2 * chi_square_sample_size(tv, df, alpha, power)
