"""What a run draws from a target and hands to the checks.

Checks are functions of these samples (and the case's exact laws); they never call a target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from losslessness.cases import ChainCase, TreeCase


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
