"""Anytime-valid tests: e-processes that may stop a case with LOSSY at any round, with the
false-alarm probability bounded by Ville's inequality (no chi-square approximation).

An e-process E_n >= 0 for a null H0 is a nonnegative supermartingale with E_0 = 1 under H0;
Ville's inequality gives ``P_H0(sup_n E_n >= 1 / alpha) <= alpha``, so rejecting the first
time E_n crosses ``1 / alpha`` has level ``alpha`` at *every* stopping time, however often the
run looks. Both e-processes here are mixtures of likelihood ratios (Robbins 1970; Ramdas,
Grunwald, Vovk and Shafer 2023, "Game-theoretic statistics and safe anytime-valid inference",
Statist. Sci. 38(4), section 3): for each alternative law Q the likelihood ratio
``prod_t Q(x_t) / P(x_t)`` is a martingale under P, and a prior-weighted average of martingales
is a martingale.

- :func:`multinomial_log_evalue`: the null "tokens are i.i.d. p" against every law on the same
  cells, mixed over a Dirichlet(1/2, ..., 1/2) prior (the Krichevsky-Trofimov mixture; its
  log-regret against the best law in hindsight is ``(C - 1) / 2 * log n + O(1)`` for C cells).
  :func:`partition_mixture_log_evalue` averages it over a few data-independent coarsenings of
  the cells, so that a deviation on a large vocabulary is not drowned by the regret of many
  cells (the average of e-processes is an e-process).
- :func:`independence_log_evalue`: the composite null "paired categories are independent"
  (any marginals): the Dirichlet mixture of the joint law over the contingency table's cells
  divided by the likelihood of the product of the *observed* marginals (the null's maximum
  likelihood on all data so far). Since that maximum is at least the likelihood of the true
  null law, the ratio is bounded by that law's mixture martingale at every round: an
  e-process (Wasserman, Ramdas and Balakrishnan 2020, "Universal inference", PNAS 117(29),
  section 7, the running-MLE e-process). Like the fixed-n chi-square test of independence, it
  tests dependence only, never the marginals (which the identity tests own).
  :func:`independence_mixture_log_evalue` averages it over data-independent groupings of the
  categories.
- :func:`binomial_upper_log_evalue`: the null "successes are i.i.d. Bernoulli(theta) with
  theta <= rate" against theta > rate, mixed over a Beta(1/2, 1/2) prior truncated to
  (rate, 1] (for theta <= rate every such likelihood ratio is a supermartingale).

All values are natural logarithms of e-values. Exactness: the guarantee holds for any
``alpha``; calibration tests measure it where it can be resolved (1e-2, 1e-3), and at the
per-assertion levels of a run (about 1e-6) it is Ville's inequality, not an extrapolation.

No TFP triple here, by design: the assertion is "the log e-value crosses ``log(1 / alpha)``"
(at the sequential share of :func:`split_alpha`), but an e-process is not sized. Each one runs
beside a fixed-n test (identity or binomial, :mod:`losslessness.stats.power`) that keeps the
rest of the level and carries the stated minimum detectable discrepancy and sample size; the
e-process can only stop a lossy case earlier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import special

from losslessness.stats.validation import check_open_unit_interval

__all__ = [
    "KT_CONCENTRATION",
    "SEQUENTIAL_ALPHA_SHARE",
    "AlphaSplit",
    "binomial_upper_log_evalue",
    "cell_partitions",
    "independence_log_evalue",
    "independence_mixture_log_evalue",
    "multinomial_log_evalue",
    "partition_mixture_log_evalue",
    "split_alpha",
]

SEQUENTIAL_ALPHA_SHARE = 0.25
"""Share of each identity and acceptance assertion's level spent on the sequential test; the
fixed-n test keeps the rest. A quarter costs the fixed-n design about 2-3% more samples (its
chi-square needs a slightly larger noncentrality at 0.75 alpha) and the e-process
``log(4)`` = 1.4 nats more evidence than at the full level."""

KT_CONCENTRATION = 0.5
"""Dirichlet (and Beta) prior parameter of the mixtures: Jeffreys' prior, the
Krichevsky-Trofimov estimator's."""

COARSE_GROUPS = (8, 2)
"""Numbers of groups of the coarsenings :func:`cell_partitions` adds to the test's own cells."""


@dataclass(frozen=True)
class AlphaSplit:
    """One assertion's level split between the sequential and the fixed-n test (Bonferroni:
    the assertion's false-alarm probability is at most their sum).

    Attributes:
        sequential: level of the e-process (LOSSY when ``E >= 1 / sequential``); 0.0 when the
            assertion has no sequential test.
        fixed: level of the fixed-n test run on the planned samples.
    """

    sequential: float
    fixed: float

    @property
    def total(self) -> float:
        """The assertion's level."""
        return self.sequential + self.fixed


def split_alpha(alpha: float, share: float = SEQUENTIAL_ALPHA_SHARE) -> AlphaSplit:
    """Split ``alpha`` into ``share * alpha`` (sequential) and the rest (fixed-n).

    Args:
        alpha: the assertion's level in (0, 1).
        share: the sequential share in [0, 1); 0 gives the fixed-n test the whole level.

    Raises:
        ValueError: naming ``alpha`` or ``share`` when out of range.
    """
    level = check_open_unit_interval(alpha, "alpha")
    if not 0.0 <= share < 1.0:
        raise ValueError(f"share: must lie in [0, 1), got {share!r}")
    return AlphaSplit(level * share, level * (1.0 - share))


def _dirichlet_log_marginal(counts: np.ndarray, concentration: float) -> float:
    """log of the Dirichlet(``concentration``)-multinomial marginal likelihood of the cell
    ``counts`` (any shape, float64), the numerator of the mixture e-values below."""
    n = float(counts.sum())
    cells = counts.size
    return float(
        special.gammaln(cells * concentration)
        - special.gammaln(n + cells * concentration)
        + float((special.gammaln(counts + concentration) - special.gammaln(concentration)).sum())
    )


def multinomial_log_evalue(
    counts: NDArray[np.int64], probs: NDArray[np.float64], concentration: float = KT_CONCENTRATION
) -> float:
    """Log e-value of the Dirichlet-mixture likelihood ratio of ``counts`` against ``probs``.

    ``log E = log B(counts + a) - log B(a) - sum_x counts_x log probs_x`` with ``B`` the
    multivariate beta function and ``a`` the concentration on every cell: the marginal
    likelihood of the counts under a Dirichlet(a) prior over the cells' law, divided by their
    likelihood under ``probs``. It depends on the counts only (not their order), so it can be
    recomputed from cumulative counts at every round.

    Args:
        counts: ``[C]`` non-negative integer counts on the cells.
        probs: ``[C]`` positive null probabilities of the cells, summing to 1.
        concentration: Dirichlet parameter a > 0 of every cell.

    Returns:
        ``log E`` (natural log); 0.0 with no observations.

    Raises:
        ValueError: naming ``counts`` or ``probs``: shapes differ, NaN, negative counts,
            non-positive probabilities.
    """
    observed = np.asarray(counts, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    if observed.shape != p.shape or observed.ndim != 1:
        raise ValueError(f"counts: shape {observed.shape} does not match probs {p.shape}")
    if not np.isfinite(observed).all() or (observed < 0).any():
        raise ValueError("counts: must be finite and non-negative")
    if not np.isfinite(p).all() or (p <= 0).any():
        raise ValueError("probs: cells must have positive probability (test zero cells exactly)")
    n = float(observed.sum())
    if n == 0:
        return 0.0
    return float(
        _dirichlet_log_marginal(observed, concentration) - float((observed * np.log(p)).sum())
    )


def cell_partitions(
    probs: NDArray[np.float64], pooled: NDArray[np.bool_], groups: tuple[int, ...] = COARSE_GROUPS
) -> list[NDArray[np.int64]]:
    """Data-independent partitions of the positive cells the sequential identity test mixes.

    The first is the fixed-n test's own partition (every unpooled positive cell alone, the
    pooled cells together); each further one merges those cells, sorted by probability, into
    about ``g`` groups of equal mass for every ``g`` in ``groups`` that is smaller than the
    number of cells. Decided from ``probs`` and the plan alone, never from the samples.

    Args:
        probs: ``[V]`` null probabilities (zeros allowed: they get label -1).
        pooled: ``[V]`` bool, the cells the fixed-n test pools
            (:func:`losslessness.stats.pooling_partition` at the planned n).
        groups: group counts of the coarsenings.

    Returns:
        Partitions as ``[V]`` int64 labels ``0..C-1`` (-1 on zero-probability cells), the
        test's own first; only those with at least two cells.
    """
    p = np.asarray(probs, dtype=np.float64)
    positive = p > 0
    labels = np.full(p.size, -1, dtype=np.int64)
    own = np.flatnonzero(positive & ~pooled)
    labels[own] = np.arange(own.size)
    if (positive & pooled).any():
        labels[positive & pooled] = own.size
    cells = int(labels.max()) + 1
    partitions = [labels] if cells >= 2 else []
    cell_mass = np.bincount(labels[positive], weights=p[positive], minlength=cells)
    order = np.argsort(cell_mass, kind="stable")
    cumulative = np.cumsum(cell_mass[order])
    for count in groups:
        if count >= cells or count < 2:
            continue
        # Group g holds the cells whose cumulative mass (in increasing order) ends in the g-th
        # of ``count`` equal slices of [0, 1].
        slice_of = np.minimum((cumulative * count - 1e-12).astype(np.int64), count - 1)
        group = np.empty(cells, dtype=np.int64)
        group[order] = np.unique(slice_of, return_inverse=True)[1]
        coarse = np.where(labels >= 0, group[np.maximum(labels, 0)], -1)
        if int(coarse.max()) >= 1:
            partitions.append(coarse)
    return partitions


def partition_mixture_log_evalue(
    counts: NDArray[np.int64], probs: NDArray[np.float64], partitions: list[NDArray[np.int64]]
) -> float:
    """Log of the average of :func:`multinomial_log_evalue` over ``partitions``.

    Args:
        counts: ``[V]`` counts of the tokens (those on zero-probability cells are ignored:
            the exact part of the law check decides them).
        probs: ``[V]`` null probabilities.
        partitions: labels from :func:`cell_partitions`.

    Returns:
        ``log((1/J) sum_j E_j)``; 0.0 when ``partitions`` is empty (no test: E = 1).
    """
    if not partitions:
        return 0.0
    values = []
    for labels in partitions:
        inside = labels >= 0
        size = int(labels.max()) + 1
        cell_counts = np.bincount(labels[inside], weights=counts[inside], minlength=size)
        cell_probs = np.bincount(labels[inside], weights=probs[inside], minlength=size)
        cell_probs = cell_probs / cell_probs.sum()
        values.append(multinomial_log_evalue(np.rint(cell_counts), cell_probs))
    return float(special.logsumexp(values) - math.log(len(values)))


def independence_log_evalue(
    table: NDArray[np.int64], concentration: float = KT_CONCENTRATION
) -> float:
    """Log e-value against "the row and column categories of the pairs are independent".

    ``log E = log m(table) - max_{r, c} log L(r x c)``: ``m`` the Dirichlet(a)-mixture marginal
    likelihood of the table's cells (as in :func:`multinomial_log_evalue`), and the maximum
    over every product law ``r x c`` attained at the observed marginals, ``sum_i R_i log(R_i /
    n) + sum_j C_j log(C_j / n)``. For the true null law the mixture ratio is a martingale
    and the maximum is at least its likelihood, so this stays below that martingale at every
    round (universal inference; module docstring).

    Args:
        table: ``[A, B]`` non-negative integer counts of the pairs' (row, column) categories.
        concentration: Dirichlet parameter a > 0 of every cell.

    Returns:
        ``log E`` (natural log); 0.0 with no observations.

    Raises:
        ValueError: naming ``table``: not two-dimensional, NaN or negative counts.
    """
    counts = np.asarray(table, dtype=np.float64)
    if counts.ndim != 2:
        raise ValueError(f"table: expected a [A, B] contingency table, got shape {counts.shape}")
    if not np.isfinite(counts).all() or (counts < 0).any():
        raise ValueError("table: counts must be finite and non-negative")
    n = float(counts.sum())
    if n == 0:
        return 0.0
    log_marginal = _dirichlet_log_marginal(counts, concentration)
    rows, columns = counts.sum(axis=1), counts.sum(axis=0)
    null = float(special.xlogy(rows, rows / n).sum() + special.xlogy(columns, columns / n).sum())
    return float(log_marginal - null)


def independence_mixture_log_evalue(
    table: NDArray[np.int64], groupings: list[NDArray[np.int64]]
) -> float:
    """Log of the average of :func:`independence_log_evalue` over the tables ``table``
    coarsened by each of ``groupings`` (the same grouping on rows and columns; a coarsening
    of independent categories stays independent, so each is an e-process and so is their
    average).

    Args:
        table: ``[K, K]`` counts of the pairs' categories.
        groupings: ``[K]`` int64 labels ``0..G-1`` of each category, decided before sampling
            (:func:`cell_partitions` of the categories' masses).

    Returns:
        ``log((1/J) sum_j E_j)``; 0.0 when ``groupings`` is empty (no test: E = 1).
    """
    if not groupings:
        return 0.0
    counts = np.asarray(table, dtype=np.float64)
    values = []
    for labels in groupings:
        size = int(labels.max()) + 1
        member = np.zeros((labels.size, size))
        member[np.arange(labels.size), labels] = 1.0
        values.append(independence_log_evalue(np.rint(member.T @ counts @ member)))
    return float(special.logsumexp(values) - math.log(len(values)))


def binomial_upper_log_evalue(
    successes: int, trials: int, rate: float, concentration: float = KT_CONCENTRATION
) -> float:
    """Log e-value against "the success probability is at most ``rate``".

    The likelihood ratio of theta against ``rate``, mixed over a Beta(a, a) prior truncated to
    theta in (rate, 1]::

        E = B(s + a, f + a) * P(Beta(s + a, f + a) > rate)
            / (B(a, a) * P(Beta(a, a) > rate) * rate^s * (1 - rate)^f)

    with s successes and f failures. For any true theta <= rate each ratio with theta' > rate
    is a supermartingale, hence so is the mixture.

    Args:
        successes: s, integer in [0, trials].
        trials: n >= 0.
        rate: the bound in [0, 1); a bound of 1 can never be exceeded (returns 0.0).
        concentration: Beta parameter a > 0.

    Returns:
        ``log E`` (natural log); ``-inf`` when the data make every theta > rate negligible.

    Raises:
        ValueError: naming ``successes``, ``trials`` or ``rate`` when out of range.
    """
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"successes: must lie in [0, trials={trials}], got {successes}")
    if not 0.0 <= rate <= 1.0 or math.isnan(rate):
        raise ValueError(f"rate: must lie in [0, 1], got {rate!r}")
    if trials == 0 or rate >= 1.0:
        return 0.0
    if rate == 0.0:
        return float("inf") if successes else 0.0
    a = concentration
    failures = trials - successes
    tail = float(special.betaincc(successes + a, failures + a, rate))
    if tail <= 0.0:
        return float("-inf")
    prior_tail = float(special.betaincc(a, a, rate))
    null = successes * math.log(rate) if successes else 0.0
    if failures:
        null += failures * math.log1p(-rate)
    return float(
        special.betaln(successes + a, failures + a)
        + math.log(tail)
        - special.betaln(a, a)
        - math.log(prior_tail)
        - null
    )
