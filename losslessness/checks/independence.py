"""Independence of identical rows in one batch (docs/architecture.md, 'What lossless means',
item 5).

Two rows of the same call that carry the same p and q must give independent outputs: a
verifier that shares one random stream across the requests of a batch (TensorRT-LLM issue
19487's mechanism) can emit the right law in every row and still be wrong as a sampler, since
the rows of a batch are different users' requests. Steps ``2j`` and ``2j+1`` of a row type that
shared a call form a pair; the first emitted token of each is mapped to a category (every
token frequent enough to be tested on its own, the rest pooled), and a chi-square test of
independence (Cressie-Read lambda = 2/3, ``scipy.stats.chi2_contingency``) is run on the
pairs' contingency table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from losslessness.checks.assertions import case_laws, independence_is_statistical
from losslessness.checks.ids import INDEPENDENCE_CHECK_ID
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.samples import ChainCounts, ChainSamples, chain_counts
from losslessness.stats import chi_square_minimum_detectable_tv

MIN_EXPECTED_PAIR_COUNT = 20.0
"""A token gets its own category when it is expected to appear in both rows of at least this
many pairs (n_pairs * p(t)^2), the same floor as the identity test's pooling; the rest pool."""


@dataclass(frozen=True)
class PairIndependenceTest:
    """A chi-square test of independence of paired first tokens.

    Attributes:
        n_pairs: pairs tested.
        categories: categories of the first token (frequent tokens, then one pooled cell);
            below 2 nothing was tested.
        statistic: Cressie-Read (lambda = 2/3) statistic of the contingency table.
        pvalue: its p-value (1.0 when nothing was tested).
        df: degrees of freedom.
    """

    n_pairs: int
    categories: int
    statistic: float
    pvalue: float
    df: int


def pair_independence_test(
    first: np.ndarray, second: np.ndarray, p0: np.ndarray, weights: np.ndarray | None = None
) -> PairIndependenceTest:
    """Test that the paired tokens ``first[j]`` and ``second[j]`` are independent.

    Every token expected in both rows of at least :data:`MIN_EXPECTED_PAIR_COUNT` pairs
    (``n_pairs * p0(t)^2``) is its own category, the rest pool into one; a chi-square test of
    independence (``scipy.stats.chi2_contingency``, Cressie-Read lambda = 2/3, no continuity
    correction) is run on the pairs' contingency table. Ids outside ``[0, V)`` are dropped.

    Args:
        first, second: ``[P]`` int64 paired tokens.
        p0: ``[V]`` float, the tokens' common law.
        weights: ``[P]`` int64, how many sampled pairs each entry stands for (None: one each).

    Returns:
        :class:`PairIndependenceTest`.
    """
    vocab = int(p0.size)
    if weights is None:
        weights = np.ones(first.size, dtype=np.int64)
    n_pairs = int(weights.sum())
    frequent = np.flatnonzero(n_pairs * p0**2 >= MIN_EXPECTED_PAIR_COUNT)
    category = np.full(vocab + 1, frequent.size, dtype=np.int64)
    category[frequent] = np.arange(frequent.size)
    other_mass = 1.0 - float(p0[frequent].sum())
    n_categories = int(frequent.size + (other_mass * n_pairs >= MIN_EXPECTED_PAIR_COUNT))
    if n_categories < 2:
        return PairIndependenceTest(n_pairs, n_categories, 0.0, 1.0, 0)
    valid = (first >= 0) & (first < vocab) & (second >= 0) & (second < vocab)
    a = np.minimum(category[first[valid]], n_categories - 1)
    b = np.minimum(category[second[valid]], n_categories - 1)
    table = np.zeros((n_categories, n_categories), dtype=np.int64)
    np.add.at(table, (a, b), weights[valid])
    table = table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0]
    if min(table.shape) < 2:
        return PairIndependenceTest(n_pairs, n_categories, 0.0, 1.0, 0)
    test = stats.chi2_contingency(table, correction=False, lambda_="cressie-read")
    return PairIndependenceTest(
        n_pairs, n_categories, float(test.statistic), float(test.pvalue), int(test.dof)
    )


def _pairs(counted: ChainCounts, row: int) -> tuple[np.ndarray, np.ndarray]:
    first = counted.outputs[row, :, 0]
    return first[counted.pairs[:, 0]], first[counted.pairs[:, 1]]


def check_row_independence(
    samples: ChainSamples | ChainCounts, context: CheckContext
) -> list[CheckResult]:
    """Test that paired identical rows of one call emit independent first tokens.

    Args:
        samples: outputs ``[R, n, k+1]``; ``pairs`` the steps that were copies in one call;
            raw or counted (:class:`~losslessness.samples.ChainCounts`: each pair counted as
            often as it occurred).
        context: the case's context.

    Returns:
        One :class:`CheckResult` per row type that makes the assertion (see
        :func:`losslessness.checks.assertions.independence_is_statistical`): LOSSY when
        independence is rejected at the per-assertion level, SKIPPED when too few pairs make
        two categories. The minimum detectable TV is between the pair's joint law and the
        product of its marginals, on the categories.
    """
    counted = chain_counts(samples)
    case, weights = counted.case, counted.pair_weights
    results = []
    for row, laws in enumerate(case_laws(case)):
        if not independence_is_statistical(laws, counted.steps_per_call):
            continue
        began = time.perf_counter()
        first, second = _pairs(counted, row)
        n_pairs = counted.n_pairs
        p0 = laws.emitted[0].numpy()
        common: dict[str, Any] = {"position": 0, "row": row, "n": n_pairs}
        test = pair_independence_test(first, second, p0, weights)
        details = {"categories": test.categories}
        if test.categories < 2:
            results.append(
                context.result(
                    INDEPENDENCE_CHECK_ID,
                    kind=CheckKind.STATISTICAL,
                    verdict=Verdict.SKIPPED,
                    min_detectable_tv=float("inf"),
                    details=details,
                    message="too few pairs for two categories of the first token",
                    **common,
                )
            )
            continue
        statistic, pvalue, dof = test.statistic, test.pvalue, test.df
        verdict = Verdict.LOSSY if pvalue <= context.alpha else Verdict.PASS
        message = f"paired identical rows emit independent first tokens ({n_pairs} pairs)"
        if verdict is Verdict.LOSSY:
            agree = int(weights[first == second].sum()) / n_pairs
            expected_agree = float((p0**2).sum())
            message = (
                f"identical rows of one batch are dependent: p-value {pvalue:.3g} <= alpha "
                f"{context.alpha:.3g}; paired rows emit the same first token in {agree:.3f} of "
                f"{n_pairs} pairs, {expected_agree:.3f} if independent (shared randomness?)"
            )
        results.append(
            context.result(
                INDEPENDENCE_CHECK_ID,
                kind=CheckKind.STATISTICAL,
                verdict=verdict,
                statistic=statistic,
                df=dof,
                p_value=pvalue,
                min_detectable_tv=chi_square_minimum_detectable_tv(
                    n_pairs, dof, context.alpha, context.power
                ),
                wall_time_s=time.perf_counter() - began,
                message=message,
                details=details,
                **common,
            )
        )
    return results
