"""Sequential LOSSY detection on a chain case: after every verifier call, the exact checks on
the new steps and an e-process for every identity, acceptance and independence assertion, so
that a case (and its target) stops as soon as the evidence is conclusive.

What each assertion's e-process tests (its null holds for every lossless verifier):

- ``law`` (row r, position i): the tokens emitted at i by the steps that reach i are i.i.d.
  p_i: :func:`~losslessness.stats.sequential.partition_mixture_log_evalue` on the cells of the
  fixed-n test's partition at the planned n (and two coarsenings of it).
- ``acceptance`` at position 0: d_0 is accepted with probability at most sum min(p_0, q_0);
  at position i >= 1: the prefix d_0..d_i is accepted with probability at most the joint
  coupling bound (the same thresholds as :mod:`losslessness.checks.acceptance`'s LOSSY side):
  :func:`~losslessness.stats.sequential.binomial_upper_log_evalue`. The SUBOPTIMAL side stays
  with the fixed-n test (it is a warning, never a reason to stop).
- ``independence`` (row r): the first tokens of two copies of the row in one call are
  independent, on the fixed-n test's categories: the universal-inference e-process against
  the product of the observed marginals
  (:func:`~losslessness.stats.sequential.independence_mixture_log_evalue`), as the fixed-n
  chi-square test of independence. A shared random stream breaks it; a wrong first-token law
  does not (the law e-process at position 0 owns that).

Exact checks (structure, tokens with p = 0) stop at their first violation: they cannot fire on
correct code, so stopping on them spends no level.

The monitor only decides when to stop; the results are still made by the fixed-n checks on the
samples drawn (:func:`losslessness.checks.run_chain_checks`), with the monitor's evidence
attached by their context (:attr:`losslessness.results.CheckContext.sequential`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from losslessness.cases import ChainCase
from losslessness.checks.acceptance import BOUND_TOLERANCE
from losslessness.checks.assertions import (
    acceptance_is_statistical,
    case_laws,
    independence_is_statistical,
    law_is_statistical,
)
from losslessness.checks.ids import ACCEPTANCE_CHECK_ID, INDEPENDENCE_CHECK_ID, LAW_CHECK_ID
from losslessness.checks.independence import MIN_EXPECTED_PAIR_COUNT
from losslessness.checks.structure import check_structure, emitted_counts
from losslessness.laws import prefix_acceptance_bound
from losslessness.results import (
    LOG_E_CLIP,
    AssertionKey,
    CheckContext,
    SequentialEvidence,
    Verdict,
)
from losslessness.samples import ChainSamples
from losslessness.stats import pooling_partition
from losslessness.stats.sequential import (
    binomial_upper_log_evalue,
    cell_partitions,
    independence_mixture_log_evalue,
    partition_mixture_log_evalue,
)


@dataclass
class _LawState:
    probs: np.ndarray
    partitions: list[np.ndarray]
    zero: np.ndarray
    counts: np.ndarray


@dataclass
class _AcceptanceState:
    rate: float
    prefix: int
    accepted: int = 0
    trials: int = 0


@dataclass
class _PairState:
    categories: np.ndarray
    n_categories: int
    groupings: list[np.ndarray]
    counts: np.ndarray

    @property
    def log_evalue(self) -> float:
        """The independence e-process on the pairs counted so far."""
        table = self.counts.reshape(self.n_categories, self.n_categories)
        return independence_mixture_log_evalue(table, self.groupings)


@dataclass
class StopDecision:
    """Why a case stopped early.

    Attributes:
        steps: steps per row type sampled when it stopped.
        reason: one sentence for the results and the progress display.
        crossed: the assertions whose e-value crossed ``1 / alpha_sequential``.
        exact: True when an exact check (structure, a token with p = 0) fired.
    """

    steps: int
    reason: str
    crossed: list[AssertionKey] = field(default_factory=list)
    exact: bool = False


class ChainMonitor:
    """The sequential tests of one chain case on one target.

    Args:
        case: the case.
        planned_steps: steps per row type the fixed-n design plans (the partitions of the
            identity e-processes are the fixed-n test's at the expected counts of this many
            steps; decided before sampling).
        alpha_sequential: each assertion's sequential level (0 disables the e-processes;
            exact checks still stop).
        shards: how many shards sample this case with their own monitor; each stops at
            ``shards / alpha_sequential`` so that the union stays within ``alpha_sequential``.
        block_decisions: the target declares block verification (the structure rule on
            replacement tokens is off, as in the fixed-n check).
        context: the case's context (for the exact structure check's messages).

    Raises:
        ValueError: naming ``planned_steps``, ``alpha_sequential`` or ``shards`` when out of
            range.
    """

    def __init__(
        self,
        case: ChainCase,
        planned_steps: int,
        alpha_sequential: float,
        context: CheckContext,
        shards: int = 1,
        block_decisions: bool = False,
    ) -> None:
        if planned_steps < 1:
            raise ValueError(f"planned_steps: must be >= 1, got {planned_steps}")
        if not 0.0 <= alpha_sequential < 1.0:
            raise ValueError(f"alpha_sequential: must lie in [0, 1), got {alpha_sequential}")
        if shards < 1:
            raise ValueError(f"shards: must be >= 1, got {shards}")
        self._arguments = (case, planned_steps, alpha_sequential, context, shards,
                           block_decisions)
        self.case = case
        self.context = context
        self.block_decisions = block_decisions
        self.alpha_sequential = alpha_sequential
        self.log_threshold = (
            math.log(shards / alpha_sequential) if alpha_sequential > 0 else math.inf
        )
        self.steps = 0
        self.laws: dict[AssertionKey, _LawState] = {}
        self.acceptance: dict[AssertionKey, _AcceptanceState] = {}
        self.pairs: dict[AssertionKey, _PairState] = {}
        self.log_evalues: dict[AssertionKey, float] = {}
        self.decision: StopDecision | None = None
        vocab = case.vocab_size
        for r, laws in enumerate(case_laws(case)):
            for i in range(case.k + 1):
                p = laws.emitted[i].numpy().astype(np.float64)
                zero = p <= 0
                partitions: list[np.ndarray] = []
                if law_is_statistical(laws, i):
                    expected = max(1, int(planned_steps * float(laws.reach[i])))
                    pooled = pooling_partition(p / p.sum(), expected)[0]
                    partitions = cell_partitions(p, pooled)
                self.laws[(LAW_CHECK_ID, r, i, 0)] = _LawState(
                    p, partitions, zero, np.zeros(vocab, dtype=np.int64)
                )
            bound = prefix_acceptance_bound(case.law_target_probs[r], case.law_draft_probs[r])
            for i in range(case.k):
                if not acceptance_is_statistical(laws, i):
                    continue
                if i == 0:
                    rate = float(laws.acceptance[0]) + BOUND_TOLERANCE
                else:
                    token_rate = float(laws.reach[i + 1])
                    rate = max(float(bound.bound[i + 1]) + BOUND_TOLERANCE, token_rate)
                self.acceptance[(ACCEPTANCE_CHECK_ID, r, i, 0)] = _AcceptanceState(
                    min(rate, 1.0), i + 1
                )
            if independence_is_statistical(laws, 2):
                first = laws.emitted[0].numpy().astype(np.float64)
                self.pairs[(INDEPENDENCE_CHECK_ID, r, 0, 0)] = pair_state(first, planned_steps)

    def reset(self) -> None:
        """Forget every step seen (the samples are being redrawn)."""
        self.__init__(*self._arguments)  # type: ignore[misc]

    def update(self, outputs: np.ndarray, drafts: np.ndarray, pairs: np.ndarray) -> bool:
        """Add one call's steps and decide whether to stop.

        Args:
            outputs: ``[R, m, k+1]`` int64 outputs of the call's m steps per row type.
            drafts: ``[R, m, k]`` int64 drafts of those steps.
            pairs: ``[P, 2]`` int64 step indices, within these m, of copies one call carried
                together (the independence pairs).

        Returns:
            True when the case should stop (``decision`` says why); once True, stays True.

        Raises:
            ValueError: naming ``outputs`` or ``drafts`` when their shapes do not fit the case.
        """
        if self.decision is not None:
            return True
        rows, k = self.case.n_rows, self.case.k
        if outputs.ndim != 3 or outputs.shape[0] != rows or outputs.shape[2] != k + 1:
            raise ValueError(f"outputs: expected shape [R={rows}, m, k+1={k + 1}], got "
                             f"{outputs.shape}")
        if drafts.shape != (*outputs.shape[:2], k):
            raise ValueError(f"drafts: expected shape {(*outputs.shape[:2], k)}, got "
                             f"{drafts.shape}")
        m = int(outputs.shape[1])
        self.steps += m
        samples = ChainSamples(self.case, outputs, drafts, np.empty((0, 2), np.int64), 0)
        structure = check_structure(samples, self.context, self.block_decisions)
        if structure.verdict is Verdict.LOSSY:
            self._stop(f"structure violated after {self.steps} steps: {structure.message}",
                       exact=True)
            return True
        counts = emitted_counts(outputs)
        vocab = self.case.vocab_size
        for (_, r, i, _), state in self.laws.items():
            # Ids outside [0, V) were stopped on by the structure check above.
            tokens = outputs[r, counts[r] > i, i]
            state.counts += np.bincount(tokens, minlength=vocab)
            impossible = int(state.counts[state.zero].sum())
            if impossible:
                self._stop(
                    f"{impossible} emitted tokens with p = 0 at position {i} (row type {r}) "
                    f"within {self.steps} steps",
                    exact=True,
                )
                return True
        for (_, r, _, _), state_a in self.acceptance.items():
            state_a.accepted += int((counts[r] > state_a.prefix).sum())
            state_a.trials += m
        for (_, r, _, _), state_p in self.pairs.items():
            update_pairs(state_p, outputs[r, :, 0], pairs)
        return self._evaluate()

    def _evaluate(self) -> bool:
        crossed: list[AssertionKey] = []
        for key, state in self.laws.items():
            if state.partitions:
                value = partition_mixture_log_evalue(state.counts, state.probs, state.partitions)
                self.log_evalues[key] = value
                if value >= self.log_threshold:
                    crossed.append(key)
        for key, state_a in self.acceptance.items():
            value = binomial_upper_log_evalue(state_a.accepted, state_a.trials, state_a.rate)
            self.log_evalues[key] = value
            if value >= self.log_threshold:
                crossed.append(key)
        for key, state_p in self.pairs.items():
            value = state_p.log_evalue
            self.log_evalues[key] = value
            if value >= self.log_threshold:
                crossed.append(key)
        if crossed:
            named = ", ".join(_describe(key) for key in crossed)
            self._stop(
                f"e-value crossed 1/alpha_sequential = {math.exp(self.log_threshold):.3g} after "
                f"{self.steps} steps ({named})",
                crossed=crossed,
            )
            return True
        return False

    def _stop(self, reason: str, crossed: list[AssertionKey] | None = None,
              exact: bool = False) -> None:
        self.decision = StopDecision(self.steps, reason, crossed or [], exact)

    def evidence(self) -> dict[AssertionKey, SequentialEvidence]:
        """Each monitored assertion's evidence so far (its last log e-value, the steps it was
        computed on, and whether it crossed)."""
        return evidence_of(self.log_evalues, self.alpha_sequential, self.log_threshold,
                           self.steps, self.decision)


def evidence_of(
    log_evalues: dict[AssertionKey, float],
    alpha: float,
    log_threshold: float,
    steps: int,
    decision: StopDecision | None,
) -> dict[AssertionKey, SequentialEvidence]:
    """:class:`SequentialEvidence` of every monitored assertion (a monitor's state)."""
    crossed = set(decision.crossed) if decision is not None else set()
    return {
        key: SequentialEvidence(
            alpha=alpha,
            log_e_value=float(np.clip(value, -LOG_E_CLIP, LOG_E_CLIP)),
            log_threshold=min(log_threshold, LOG_E_CLIP),
            steps=steps,
            crossed=key in crossed,
        )
        for key, value in log_evalues.items()
    }


def _describe(key: AssertionKey) -> str:
    check_id, row, position, _ = key
    where = f"row {row} " if row else ""
    return f"{check_id} {where}pos {position}" if check_id != INDEPENDENCE_CHECK_ID else (
        f"{check_id} {where}".strip()
    )


def update_pairs(state: _PairState, first: np.ndarray, pairs: np.ndarray) -> None:
    """Count the category pairs of ``first[pairs[:, 0]]``, ``first[pairs[:, 1]]`` into
    ``state`` (ids outside the vocabulary are left to the exact checks, which stop first)."""
    a = state.categories[np.clip(first[pairs[:, 0]], 0, state.categories.size - 1)]
    b = state.categories[np.clip(first[pairs[:, 1]], 0, state.categories.size - 1)]
    state.counts += np.bincount(a * state.n_categories + b, minlength=state.n_categories**2)


def pair_state(first: np.ndarray, planned_steps: int) -> _PairState:
    """Categories of the first token (the independence test's: tokens expected in both rows of
    at least :data:`MIN_EXPECTED_PAIR_COUNT` pairs alone, the rest pooled; zero-probability
    tokens join the pooled category, which the law check covers exactly) and the groupings of
    the categories the independence e-process mixes (:func:`cell_partitions` of their masses
    under ``first``, decided before sampling; ``first`` never enters the test itself)."""
    p = first / first.sum()
    n_pairs = max(1, planned_steps // 2)
    frequent = n_pairs * p**2 >= MIN_EXPECTED_PAIR_COUNT
    categories = np.full(p.size, int(frequent.sum()), dtype=np.int64)
    categories[frequent] = np.arange(int(frequent.sum()))
    n_categories = int(categories.max()) + 1
    mass = np.bincount(categories, weights=p, minlength=n_categories)
    if (mass <= 0).any():
        # Only the pooled category can be empty (every pooled token has p = 0): its tokens are
        # impossible, the law monitor stops on them first, so any category may hold them.
        keep = mass > 0
        remap = np.cumsum(keep) - 1
        categories = remap[categories]
        mass = mass[keep]
        n_categories = int(keep.sum())
    masses = np.asarray(mass, dtype=np.float64)
    groupings = (
        cell_partitions(masses, np.zeros(n_categories, dtype=bool)) if n_categories >= 2 else []
    )
    return _PairState(
        categories, n_categories, groupings, np.zeros(n_categories**2, dtype=np.int64)
    )


def evidence_to_json(evidence: dict[AssertionKey, SequentialEvidence]) -> list[Any]:
    """JSON-able form of :meth:`ChainMonitor.evidence` (what a unit record stores)."""
    return [[*key, item.to_json()] for key, item in evidence.items()]


def merged_evidence(
    records: Iterable[dict[AssertionKey, SequentialEvidence]],
) -> dict[AssertionKey, SequentialEvidence]:
    """The evidence of several monitors of one case (its shards): per assertion, a crossing if
    any crossed, else the largest e-value."""
    merged: dict[AssertionKey, SequentialEvidence] = {}
    for record in records:
        for key, found in record.items():
            kept = merged.get(key)
            if kept is None or found.crossed or (
                not kept.crossed and found.log_e_value > kept.log_e_value
            ):
                merged[key] = found
    return merged


def evidence_from_json(data: list[Any]) -> dict[AssertionKey, SequentialEvidence]:
    """Inverse of :func:`evidence_to_json`."""
    return {
        (str(check_id), int(row), int(position), int(token)): SequentialEvidence.from_json(item)
        for check_id, row, position, token, item in data
    }


__all__ = [
    "ChainMonitor",
    "StopDecision",
    "evidence_from_json",
    "evidence_of",
    "evidence_to_json",
    "merged_evidence",
    "pair_state",
    "update_pairs",
]
