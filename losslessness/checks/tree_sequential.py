"""Sequential LOSSY detection on a tree case: after every verifier call, the exact tree checks
on the new trees and an e-process for every statistical tree assertion (the tree analogue of
:mod:`losslessness.checks.sequential`).

- ``tree.law`` (one per tested node class): the tokens emitted after nodes of the class are
  i.i.d. p of the class: the Dirichlet-mixture e-process on the fixed-n test's cells at the
  planned n (and two coarsenings); and the pooled PIT assertion over every other class (its
  histogram is uniform, :class:`~losslessness.checks.tree_assertions.PooledPit`), the same
  e-process on the uniform law's cells;
- ``tree.acceptance`` at depth 1: a root child is accepted with probability at most
  ``root_bound`` (SpecTr's optimal transport, the LOSSY side of the fixed-n check): the
  one-sided Beta-mixture e-process; deeper depths only have a SUBOPTIMAL side (never a reason
  to stop);
- ``tree.independence``: the first tokens of trees ``2m, 2m+1`` of one call are independent:
  the universal-inference e-process against the product of the observed marginals (as the
  fixed-n test), so a wrong root law is ``tree.law``'s to find, never blamed on independence.

Exact checks (``tree.structure``, a token with p = 0 after any node) stop at their first
violation. Keys are :attr:`~losslessness.results.CheckResult.assertion_key`'s: ``(check id, 0,
depth, token)`` for a law class (:data:`ROOT` at the root), ``(tree.law, 0, 0, POOLED)`` for
the pooled test, token 0 for acceptance (depth 1) and independence (depth 0).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from losslessness.cases import TreeCase
from losslessness.checks.assertions import RATE_TOLERANCE
from losslessness.checks.ids import (
    TREE_ACCEPTANCE_CHECK_ID,
    TREE_INDEPENDENCE_CHECK_ID,
    TREE_LAW_CHECK_ID,
)
from losslessness.checks.sequential import (
    StopDecision,
    evidence_of,
    pair_state,
    update_pairs,
)
from losslessness.checks.tree_assertions import (
    POOLED,
    ROOT,
    PooledPit,
    class_p,
    tree_assertions,
    visited_classes,
)
from losslessness.checks.tree_structure import check_tree_structure, well_formed_rows
from losslessness.results import AssertionKey, CheckContext, SequentialEvidence, Verdict
from losslessness.samples import TreeSamples
from losslessness.seeding import derive_seed
from losslessness.stats import pooling_partition
from losslessness.stats.pit import PIT_CELLS, pit_histogram
from losslessness.stats.sequential import (
    binomial_upper_log_evalue,
    cell_partitions,
    partition_mixture_log_evalue,
)

SEQUENTIAL_POOLED_SEED_LABEL = "tree.law.pooled.sequential"
"""Label of the seed of the pooled e-process's PIT uniforms (derived from the case's seed;
independent of the fixed-n test's, :data:`~losslessness.checks.tree_law.POOLED_SEED_LABEL`)."""


class TreeMonitor:
    """The sequential tests of one tree case on one target.

    Args:
        case: the case.
        planned_steps: trees the fixed-n design plans (the law e-processes' partitions are the
            fixed-n test's at the expected counts of this many trees).
        alpha_sequential: each assertion's sequential level, in (0, 1).
        context: the case's context (for the exact structure check).

    Raises:
        ValueError: naming ``planned_steps`` or ``alpha_sequential`` when out of range.
    """

    def __init__(
        self, case: TreeCase, planned_steps: int, alpha_sequential: float, context: CheckContext
    ) -> None:
        if planned_steps < 1:
            raise ValueError(f"planned_steps: must be >= 1, got {planned_steps}")
        if not 0.0 < alpha_sequential < 1.0:
            raise ValueError(f"alpha_sequential: must lie in (0, 1), got {alpha_sequential}")
        self.case, self.context = case, context
        self.alpha_sequential = alpha_sequential
        self.log_threshold = math.log(1.0 / alpha_sequential)
        self.steps = 0
        self.decision: StopDecision | None = None
        self.log_evalues: dict[AssertionKey, float] = {}
        assertions = tree_assertions(case)
        vocab = case.vocab_size
        self.classes: dict[tuple[int, int], tuple[np.ndarray, list[np.ndarray], np.ndarray]] = {}
        for node_class in assertions.classes:
            if not node_class.statistical:
                continue
            expected = max(1, int(planned_steps * node_class.reach))
            pooled = pooling_partition(node_class.p / node_class.p.sum(), expected)[0]
            self.classes[(node_class.depth, node_class.token)] = (
                node_class.p, cell_partitions(node_class.p, pooled),
                np.zeros(vocab, dtype=np.int64),
            )
        self.pooled: tuple[PooledPit, np.random.Generator, list[np.ndarray], np.ndarray] | None
        self.pooled = None
        if assertions.pooled:
            uniform = np.full(PIT_CELLS, 1.0 / PIT_CELLS)
            expected = max(1, int(planned_steps * assertions.pooled_reach))
            self.pooled = (
                PooledPit(case, set(self.classes)),
                np.random.default_rng(derive_seed(context.seed, SEQUENTIAL_POOLED_SEED_LABEL)),
                cell_partitions(uniform, pooling_partition(uniform, expected)[0]),
                np.zeros(PIT_CELLS, dtype=np.int64),
            )
        self.bound: float | None = None
        if assertions.laws is not None and 1 in assertions.acceptance_depths:
            bound = float(assertions.laws.root_bound) + RATE_TOLERANCE
            self.bound = bound if bound < 1.0 - RATE_TOLERANCE else None
        self.accepted = 0
        # Zero-mass lookups of every class, so that the exact part is vectorised.
        self.root_zero = (case.root_target == 0).numpy()
        self.table_zero = (case.target_table == 0).numpy()
        self.token_rows = case.table_rows(torch.arange(case.vocab_size)).numpy()
        self.pairs = (
            pair_state(class_p(case, 0, ROOT), planned_steps)
            if assertions.independence and case.batch_size >= 2
            else None
        )

    def update(self, samples: TreeSamples) -> bool:
        """Add one call's trees (``samples`` holds just them, pairs indexed within the call)
        and decide whether to stop; once True, stays True."""
        if self.decision is not None:
            return True
        self.steps += samples.n_steps
        structure = check_tree_structure(samples, self.context)
        if structure.verdict is Verdict.LOSSY:
            self._stop(f"tree structure violated within {self.steps} trees: "
                       f"{structure.message}", exact=True)
            return True
        case = samples.case
        rows = well_formed_rows(samples)
        _, depth, token, emitted = visited_classes(
            samples.token_ids[rows], samples.tokens[rows], samples.accepted_nodes[rows],
            case.depths.numpy(),
        )
        # Ids outside [0, V) were stopped on by the structure check above.
        at_root = depth == 0
        impossible = np.where(
            at_root,
            self.root_zero[emitted],
            self.table_zero[np.maximum(depth - 1, 0), self.token_rows[np.maximum(token, 0)],
                            emitted],
        )
        if impossible.any():
            first = int(np.flatnonzero(impossible)[0])
            d, x, e = int(depth[first]), int(token[first]), int(emitted[first])
            where = "root" if d == 0 else f"depth {d} token {x}"
            self._stop(f"token {e} with p = 0 emitted after the {where} within "
                       f"{self.steps} trees", exact=True)
            return True
        crossed: list[AssertionKey] = []
        for (d, x), (p, partitions, counts) in self.classes.items():
            chosen = emitted[(depth == d) & (token == x)]
            counts += np.bincount(chosen, minlength=case.vocab_size)
            key = (TREE_LAW_CHECK_ID, 0, d, x)
            self.log_evalues[key] = partition_mixture_log_evalue(counts, p, partitions)
        if self.pooled is not None:
            pit, rng, pit_partitions, pit_counts = self.pooled
            u, _ = pit.transform(depth, token, emitted, rng)
            pit_counts += pit_histogram(u)
            self.log_evalues[(TREE_LAW_CHECK_ID, 0, 0, POOLED)] = partition_mixture_log_evalue(
                pit_counts, np.full(PIT_CELLS, 1.0 / PIT_CELLS), pit_partitions
            )
        if self.bound is not None:
            self.accepted += int((samples.accepted_nodes[:, 0] > 0).sum())
            key = (TREE_ACCEPTANCE_CHECK_ID, 0, 1, 0)
            self.log_evalues[key] = binomial_upper_log_evalue(self.accepted, self.steps,
                                                              self.bound)
        if self.pairs is not None:
            update_pairs(self.pairs, samples.tokens[:, 0], samples.pairs)
            key = (TREE_INDEPENDENCE_CHECK_ID, 0, 0, 0)
            self.log_evalues[key] = self.pairs.log_evalue
        crossed = [key for key, value in self.log_evalues.items() if value >= self.log_threshold]
        if crossed:
            self._stop(
                f"e-value crossed 1/alpha_sequential = {math.exp(self.log_threshold):.3g} "
                f"within {self.steps} trees ({', '.join(_describe(key) for key in crossed)})",
                crossed,
            )
            return True
        return False

    def _stop(self, reason: str, crossed: list[AssertionKey] | None = None,
              exact: bool = False) -> None:
        self.decision = StopDecision(self.steps, reason, crossed or [], exact)

    def evidence(self) -> dict[AssertionKey, SequentialEvidence]:
        """Each monitored assertion's evidence so far."""
        return evidence_of(self.log_evalues, self.alpha_sequential, self.log_threshold,
                           self.steps, self.decision)


def _describe(key: AssertionKey) -> str:
    check_id, _, depth, token = key
    if check_id == TREE_LAW_CHECK_ID and token == POOLED:
        return f"{check_id} pooled PIT"
    if check_id == TREE_LAW_CHECK_ID:
        return f"{check_id} " + ("root" if depth == 0 else f"depth {depth} token {token}")
    return check_id if check_id == TREE_INDEPENDENCE_CHECK_ID else f"{check_id} depth {depth}"
