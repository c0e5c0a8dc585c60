"""What a run draws from a target and hands to the checks.

Checks are functions of these samples (and the case's exact laws); they never call a target.
The chain checks read :class:`ChainCounts`, distinct steps with how often each occurred: a
count table of the engine becomes one without expanding its counts, and raw samples become one
with every step counted once (:func:`chain_counts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from losslessness.cases import ChainCase, ServingCase, TreeCase


@dataclass
class ChainSamples:
    """Outputs of ``n`` verification steps for every row type of a chain case.

    Attributes:
        case: the case that was sampled.
        outputs: ``[R, n, k+1]`` int64, as returned by the verifier (-1 placeholders kept).
        drafts: ``[R, n, k]`` int64, the drafts the run drew (d_i ~ q_i).
        pairs: ``[P, 2]`` int64 step indices ``(j, j')``: the two steps were copies of each row
            type in one verifier call (the independence check compares them).
        seed: the seed that reproduces drafts and verifier randomness.
        wall_time_s: seconds spent drawing them, verifier calls included.
        verifier_time_s: seconds spent inside the verifier.
        calls: number of verifier calls.
        steps_per_call: copies of each row type one verifier call carried (by design).
    """

    case: ChainCase
    outputs: np.ndarray
    drafts: np.ndarray
    pairs: np.ndarray
    seed: int
    wall_time_s: float = 0.0
    verifier_time_s: float = 0.0
    calls: int = 0
    steps_per_call: int = 1

    @property
    def n_steps(self) -> int:
        """Verification steps per row type."""
        return int(self.outputs.shape[1])


@dataclass(frozen=True, eq=False)
class ChainCounts:
    """A chain case's steps as the chain checks read them: M distinct steps, each with the
    number of sampled steps it stands for, and the independence pairs likewise.

    Every count a chain check makes is a weighted count over these M steps, so a count table
    (:mod:`losslessness.engine.tables`) is checked as it is, whatever its counts; raw samples
    are the case of every weight 1 (:func:`chain_counts`).

    Attributes:
        case: the case that was sampled.
        outputs: ``[R, M, k+1]`` int64 verifier outputs (-1 placeholders kept).
        drafts: ``[R, M, k]`` int64 drafts (d_i ~ q_i).
        weights: ``[M]`` int64, each >= 1: how many sampled steps each one stands for.
        first_step: ``[M]`` int64, increasing: where each one first occurs in the order the
            steps were sampled (or a table expanded: records in table order, each repeated
            count times, a pair's two steps adjacent); the step a check's message names.
        pairs: ``[P, 2]`` int64 indices into the M steps: copies of each row type that one
            verifier call carried (the independence check compares them).
        pair_weights: ``[P]`` int64, each >= 1: how many sampled pairs each one stands for.
        steps_per_call: copies of each row type one verifier call carried (by design).

    Raises:
        ValueError: naming the attribute whose shape or values do not fit the case.
    """

    case: ChainCase
    outputs: np.ndarray
    drafts: np.ndarray
    weights: np.ndarray
    first_step: np.ndarray
    pairs: np.ndarray
    pair_weights: np.ndarray
    steps_per_call: int = 1

    def __post_init__(self) -> None:
        rows, k = self.case.n_rows, self.case.k
        if self.outputs.ndim != 3 or self.outputs.shape[::2] != (rows, k + 1):
            raise ValueError(
                f"outputs: expected shape [R={rows}, M, k+1={k + 1}], got {self.outputs.shape}"
            )
        m = self.outputs.shape[1]
        if self.drafts.shape != (rows, m, k):
            raise ValueError(f"drafts: expected shape {(rows, m, k)}, got {self.drafts.shape}")
        for name, value in (("weights", self.weights), ("first_step", self.first_step)):
            if value.shape != (m,):
                raise ValueError(f"{name}: expected shape ({m},), got {value.shape}")
        if np.any(self.weights < 1):
            raise ValueError("weights: every step must stand for at least one sampled step")
        if self.pairs.ndim != 2 or self.pairs.shape[1] != 2:
            raise ValueError(f"pairs: expected shape [P, 2], got {self.pairs.shape}")
        if self.pairs.size and (self.pairs.min() < 0 or self.pairs.max() >= m):
            raise ValueError(f"pairs: step indices must be in [0, {m})")
        if self.pair_weights.shape != (self.pairs.shape[0],):
            raise ValueError(
                f"pair_weights: expected shape ({self.pairs.shape[0]},), got "
                f"{self.pair_weights.shape}"
            )
        if np.any(self.pair_weights < 1):
            raise ValueError("pair_weights: every pair must stand for at least one sampled pair")

    @property
    def n_steps(self) -> int:
        """Sampled verification steps per row type (the sum of the weights)."""
        return int(self.weights.sum())

    @property
    def n_pairs(self) -> int:
        """Sampled independence pairs per row type (the sum of the pair weights)."""
        return int(self.pair_weights.sum())


def chain_counts(samples: ChainSamples | ChainCounts) -> ChainCounts:
    """The counted view of ``samples``: raw samples with every step and pair counted once, in
    the order drawn; a :class:`ChainCounts` as it is.

    Raises:
        ValueError: naming the attribute of ``samples`` whose shape does not fit its case.
    """
    if isinstance(samples, ChainCounts):
        return samples
    n = samples.n_steps
    pairs = np.asarray(samples.pairs, dtype=np.int64).reshape(-1, 2)
    return ChainCounts(
        case=samples.case,
        outputs=samples.outputs,
        drafts=samples.drafts,
        weights=np.ones(n, dtype=np.int64),
        first_step=np.arange(n, dtype=np.int64),
        pairs=pairs,
        pair_weights=np.ones(pairs.shape[0], dtype=np.int64),
        steps_per_call=samples.steps_per_call,
    )


@dataclass
class ServingSamples:
    """Outputs of the verify steps of one serving case, by row kind.

    Attributes:
        case: the :class:`~losslessness.cases.ServingCase` that was sampled.
        drafts: per row kind, ``[n, k]`` int64 drafts of its rows (-1 after the row's drafts).
        outputs: per row kind, ``[n, k+1]`` int64 emitted tokens (-1 placeholders kept).
        seed: the seed that reproduces the drafts, the rows' seeds and the call generator.
        wall_time_s: seconds spent drawing them, verifier calls included.
        verifier_time_s: seconds spent inside the verifier.
        calls: number of verifier calls.
    """

    case: ServingCase
    drafts: list[np.ndarray]
    outputs: list[np.ndarray]
    seed: int
    wall_time_s: float = 0.0
    verifier_time_s: float = 0.0
    calls: int = 0

    @property
    def n_steps(self) -> int:
        """Rows verified, over every kind."""
        return sum(int(out.shape[0]) for out in self.outputs)


@dataclass
class TreeSamples:
    """Outputs of ``n`` tree verification steps of one tree case (one drafted tree per step).

    Attributes:
        case: the :class:`~losslessness.cases.TreeCase` that was sampled.
        token_ids: ``[n, N]`` int64, the drafted trees (the run drew them with
            ``case.draw_trees``).
        tokens: ``[n, D+1]`` int64, the verifier's emitted tokens (-1 placeholders kept).
        accepted_nodes: ``[n, D]`` int64, the verifier's accepted nodes (-1 placeholders kept).
        pairs: ``[P, 2]`` int64 step indices ``(j, j')``: two trees of one verifier call (with
            the same p and q tables, independently drafted) whose outputs the independence
            check compares.
        seed: the seed that reproduces the trees and the verifier's randomness.
        wall_time_s: seconds spent drawing them, verifier calls included.
        verifier_time_s: seconds spent inside the verifier.
        calls: number of verifier calls.
        steps_per_call: trees one verifier call carried (the case's ``batch_size``).
    """

    case: TreeCase
    token_ids: np.ndarray
    tokens: np.ndarray
    accepted_nodes: np.ndarray
    pairs: np.ndarray
    seed: int
    wall_time_s: float = 0.0
    verifier_time_s: float = 0.0
    calls: int = 0
    steps_per_call: int = 1

    @property
    def n_steps(self) -> int:
        """Verification steps (trees)."""
        return int(self.tokens.shape[0])
