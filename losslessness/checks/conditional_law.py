"""Conditional law at every position (the verdict; docs/architecture.md, 'What lossless means',
item 2).

Among the steps that reach position i (d_0..d_{i-1} accepted), the token emitted at i must
follow p_i: position 0 is the marginal, position k the bonus token. Each (row type, position)
is one identity test (Cressie-Read power divergence, lambda = 2/3) at the per-assertion level,
plus its exact part: a token with p_i = 0 (or an id outside the vocabulary) is never emitted.
With a one-hot p_i the whole check is exact (``edge.one-hot``).

For the reports each result's ``details`` carries the observed counts and p_i of the
:data:`LAW_CELLS_KEPT` cells of largest p_i (ties: lowest token id) and one "other" cell
pooling the rest, so a record stays bounded in size for any vocabulary.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from losslessness.checks.assertions import (
    case_laws,
    emits_target_randomness,
    is_reachable,
    law_is_statistical,
)
from losslessness.checks.ids import EDGE_ONE_HOT_CHECK_ID, LAW_CHECK_ID
from losslessness.checks.structure import emitted_counts
from losslessness.results import CheckContext, CheckKind, CheckResult, LawCells, Verdict
from losslessness.samples import ChainCounts, ChainSamples, chain_counts
from losslessness.stats import (
    exact_check_minimum_detectable_rate,
    identity_minimum_detectable_tv,
    identity_test,
)

LAW_CELLS_KEPT = 40
"""Cells of largest target probability whose counts a law result keeps (:class:`LawCells`)."""


def law_cells(observed: np.ndarray, p: np.ndarray) -> LawCells:
    """The bounded per-cell record of one position.

    Args:
        observed: ``[V]`` int counts of the emitted tokens in the vocabulary.
        p: ``[V]`` float target law p_i.

    Returns:
        :class:`~losslessness.results.LawCells`: the :data:`LAW_CELLS_KEPT` tokens of largest
        p (ties lowest id first) with their counts and p_i, and the counts and mass of every
        other cell (0 when V <= :data:`LAW_CELLS_KEPT`).
    """
    order = np.lexsort((np.arange(p.size), -p))[:LAW_CELLS_KEPT]
    rest = np.ones(p.size, dtype=bool)
    rest[order] = False
    return LawCells(
        tokens=[int(token) for token in order],
        observed=[int(count) for count in observed[order]],
        p=[float(mass) for mass in p[order]],
        other_observed=int(observed[rest].sum()),
        other_p=float(p[rest].sum()),
    )


def token_counts(tokens: np.ndarray, weights: np.ndarray, vocab: int) -> np.ndarray:
    """How many sampled steps emitted each token.

    Args:
        tokens: ``[M]`` int64 token ids in ``[0, V)``.
        weights: ``[M]`` int64, how many sampled steps each entry stands for.
        vocab: V.

    Returns:
        ``[V]`` int64 counts (exact: float64 holds every integer count below 2**53).
    """
    summed = np.bincount(tokens, weights=weights.astype(np.float64), minlength=vocab)
    counts: np.ndarray = np.rint(summed).astype(np.int64)
    return counts


def check_conditional_laws(
    samples: ChainSamples | ChainCounts, context: CheckContext
) -> list[CheckResult]:
    """Identity-test the emitted token at every reachable position against p_i.

    Args:
        samples: outputs ``[R, n, k+1]`` of a case, raw or counted
            (:class:`~losslessness.samples.ChainCounts`).
        context: the case's context (per-assertion alpha, power, seed).

    Returns:
        One :class:`CheckResult` per (row type, position): statistical ``law`` checks, exact
        ``edge.one-hot`` checks for one-hot p_i, SKIPPED for positions the step cannot reach.
    """
    counted = chain_counts(samples)
    case = counted.case
    counts = emitted_counts(counted.outputs)
    results = []
    for r, laws in enumerate(case_laws(case)):
        for i in range(case.k + 1):
            began = time.perf_counter()
            reached = counts[r] > i
            tokens, weights = counted.outputs[r, reached, i], counted.weights[reached]
            n_tokens = int(weights.sum())
            p = laws.emitted[i].numpy()
            statistical = law_is_statistical(laws, i)
            one_hot_edge = not statistical and "one-hot" in case.tags
            check_id = EDGE_ONE_HOT_CHECK_ID if one_hot_edge else LAW_CHECK_ID
            kind = CheckKind.STATISTICAL if statistical else CheckKind.EXACT
            common: dict[str, Any] = {"position": i, "row": r, "n": n_tokens}
            details: dict[str, Any] = {"reach_probability": float(laws.reach[i])}
            if not is_reachable(laws, i):
                results.append(
                    context.result(
                        check_id,
                        kind=CheckKind.EXACT,
                        verdict=Verdict.SKIPPED,
                        min_detectable_tv=float("inf"),
                        details=details,
                        message="unreachable: P(reach) = 0 (the acceptance check covers it)",
                        **common,
                    )
                )
                continue
            in_vocab = (tokens >= 0) & (tokens < case.vocab_size)
            out_of_vocab = int(weights[~in_vocab].sum())
            observed_counts = token_counts(tokens[in_vocab], weights[in_vocab], case.vocab_size)
            test = identity_test(observed_counts, p)
            impossible = test.zero_mass_count + out_of_vocab
            if statistical:
                bound = identity_minimum_detectable_tv(p, test.n, context.alpha, context.power)
                min_tv = bound.minimum_detectable_tv
            else:
                min_tv = exact_check_minimum_detectable_rate(test.n, context.power)
            details.update(
                pooled_cells=test.pooled_cells,
                pooled_mass=test.pooled_mass,
                zero_mass_count=test.zero_mass_count,
                out_of_vocab=out_of_vocab,
            )
            cells = law_cells(observed_counts, p)
            if impossible:
                verdict = Verdict.LOSSY
                shown = list(test.zero_mass_tokens[:5])
                message = (
                    f"{impossible} of {n_tokens} emitted tokens have p = 0 at position {i}"
                    f" (tokens {shown}{' and ids outside the vocabulary' if out_of_vocab else ''})"
                )
            elif statistical and test.pvalue <= context.alpha:
                verdict = Verdict.LOSSY
                # No token is out of the vocabulary here (that is the exact failure above).
                observed = observed_counts / max(n_tokens, 1)
                worst = int(np.argmax(np.abs(observed - p)))
                message = (
                    f"emitted token at position {i} does not follow p_{i}: p-value "
                    f"{test.pvalue:.3g} <= alpha {context.alpha:.3g}; largest gap at token "
                    f"{worst}: observed {observed[worst]:.4f} vs p {p[worst]:.4f}; empirical TV "
                    f"{0.5 * float(np.abs(observed - p).sum()):.4f}"
                )
            elif statistical or emits_target_randomness(laws, i):
                verdict = Verdict.PASS
                message = f"emitted token at position {i} ~ p_{i}"
            else:
                verdict = Verdict.PASS
                message = (
                    f"no token with p = 0 emitted at position {i} (exact only: its draft is "
                    "accepted with probability 1, so the token there is the run's own draft and "
                    "no identity test is spent on it)"
                )
            results.append(
                context.result(
                    check_id,
                    kind=kind,
                    verdict=verdict,
                    min_detectable_tv=min_tv,
                    statistic=test.statistic if statistical else float(impossible),
                    df=test.df if statistical else None,
                    p_value=test.pvalue
                    if statistical and not impossible
                    else float(not impossible),
                    wall_time_s=time.perf_counter() - began,
                    message=message,
                    details=details,
                    cells=cells,
                    **common,
                )
            )
    return results
