"""Peers' losslessness tests for tree verification, reimplemented as baselines.

Two methods, each deciding whether a tree verifier is wrong, for the comparison of
``benchmarks/tree_detection_rates.py`` (``docs/detection-rates.md``, tree section):

- :func:`sglang_structural`: the style of SGLang's kernel test of
  ``tree_speculative_sampling_target_only`` (sgl-kernel ``tests/test_speculative_sampling.py``,
  ``test_tree_speculative_sampling_target_only``, https://github.com/sgl-project/sglang/blob/main/sgl-kernel/tests/test_speculative_sampling.py):
  two hand-built draft trees over a vocabulary of 20, target probabilities
  ``softmax(logits / 0.01)`` of logits 1 everywhere and 10 at one token per node (one-hot in
  floating point), random coins, and the exact expected output: the accepted path follows the
  children that carry the one-hot tokens and the final token is the one-hot token at the last
  accepted node (18 wherever the test does not set another). The verifier fails iff its output
  differs from the expected one in any entry (emitted tokens, accepted nodes). Applied to a
  greedy tree verifier, the same trees with the logits themselves.
- :func:`first_token_chi_square`: Pearson's chi-square goodness-of-fit test of the first
  emitted token of each step (the token after the root: the accepted child's token, or the
  root's final token when no child is accepted) against the target law p at the root, the
  usual textbook test of a sampler's output law, restricted to the one position every tree
  verifier emits. Cells with expected count below 5 are merged into one bin (merged further
  into the smallest remaining cell when that bin is itself below 5); an emitted id with p = 0
  or outside the vocabulary falls into the merged bin and, when that bin's expected count is
  0, fails the test outright. The level is :data:`FIRST_TOKEN_LEVEL` (1e-3), one assertion.

Contract: :func:`sglang_structural` has no false-alarm rate to state (its inputs are
deterministic, so a lossless verifier always passes it, pinned by
``tests/benchmarks/test_tree_detection_rates.py``) and no power against a verifier that is
correct on one-hot targets; :func:`first_token_chi_square` has false-alarm rate 1e-3 (the
chi-square approximation, cells >= 5) and sees only the root's law.

The SGLang tree layout, renumbered so that every parent precedes its children (the protocol's
``parents[b, j] < j + 1``) with siblings kept in SGLang's order (``retrive_next_sibling``):
row 0, SGLang's nodes 1..5 with tokens 1..5, the root's children in the order 1, 3; row 1,
SGLang's nodes 4, 1, 5, 2, 3 (tokens 11, 8, 12, 9, 10), the root's children in the order 4, 1.
"""

from __future__ import annotations

import numpy as np
import scipy.stats
import torch
from numpy.typing import NDArray

from benchmarks.peers import PeerVerdict
from losslessness.engine.draw import ProtocolViolation, coerce_tree_output
from losslessness.protocol import PLACEHOLDER, GreedyTreeVerifier, TreeVerifier

__all__ = [
    "FIRST_TOKEN_LEVEL",
    "FIRST_TOKEN_MIN_EXPECTED",
    "SGLANG_EXPECTED_NODES",
    "SGLANG_EXPECTED_TOKENS",
    "SGLANG_PARENTS",
    "SGLANG_TEMPERATURE",
    "SGLANG_TOKEN_IDS",
    "SGLANG_VOCAB",
    "first_token_chi_square",
    "sglang_greedy_structural",
    "sglang_logits",
    "sglang_structural",
]

FIRST_TOKEN_LEVEL = 1e-3
"""Level of :func:`first_token_chi_square` (one assertion per verdict, no split)."""

FIRST_TOKEN_MIN_EXPECTED = 5.0
"""Cells with a smaller expected count are merged (the textbook rule of thumb)."""

SGLANG_VOCAB = 20
"""SGLang's test vocabulary."""

SGLANG_TEMPERATURE = 0.01
"""SGLang's test temperature: ``softmax(logits / 0.01)`` of logits 1 and 10 is one-hot."""

SGLANG_PARENTS = ((0, 1, 0, 3, 4), (0, 0, 1, 2, 4))
"""``[2, 5]`` parents of the two hand-built trees (see the module docstring)."""

SGLANG_TOKEN_IDS = ((1, 2, 3, 4, 5), (11, 8, 12, 9, 10))
"""``[2, 5]`` drafted tokens of nodes 1..5."""

_ONE_HOT = {(0, 0): 3, (0, 3): 4, (0, 4): 5, (1, 0): 11, (1, 1): 12}
"""(row, node) -> the token with logit 10 (every other node: token 18)."""

_DEFAULT_TOKEN = 18

SGLANG_EXPECTED_TOKENS = ((3, 4, 5, 18), (11, 12, 18, PLACEHOLDER))
"""``[2, 4]`` the tokens every lossless verifier emits: SGLang's expected ``predicts``."""

SGLANG_EXPECTED_NODES = ((3, 4, 5), (1, 3, PLACEHOLDER))
"""``[2, 3]`` the nodes it accepts: SGLang's expected ``accept_index`` (renumbered)."""


def sglang_logits() -> torch.Tensor:
    """``[2, 6, 20]`` float64 logits of SGLang's test: 1 everywhere, 10 at one token per node."""
    logits = torch.ones((2, 6, SGLANG_VOCAB), dtype=torch.float64)
    for row in range(2):
        for node in range(6):
            logits[row, node, _ONE_HOT.get((row, node), _DEFAULT_TOKEN)] = 10.0
    return logits


def _expected() -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    return (
        np.array(SGLANG_EXPECTED_TOKENS, dtype=np.int64),
        np.array(SGLANG_EXPECTED_NODES, dtype=np.int64),
    )


def _compare(value: object) -> PeerVerdict:
    tokens_want, nodes_want = _expected()
    try:
        tokens, nodes = coerce_tree_output(value, 2, nodes_want.shape[1])
    except ProtocolViolation as violation:
        return PeerVerdict("sglang-structural", True, 1.0, 0.0, 1, f"malformed: {violation}")
    wrong = int((tokens != tokens_want).sum() + (nodes != nodes_want).sum())
    where = (
        "output equals the expected one"
        if not wrong
        else f"got tokens {tokens.tolist()} nodes {nodes.tolist()}, expected "
        f"{tokens_want.tolist()} {nodes_want.tolist()}"
    )
    return PeerVerdict("sglang-structural", wrong > 0, float(wrong), 0.0, 1, where)


def sglang_structural(
    verifier: TreeVerifier, draft_scheme: str, generator: torch.Generator
) -> PeerVerdict:
    """SGLang's deterministic tree test applied to a sampled tree verifier.

    Args:
        verifier: the tree verifier under test (:class:`losslessness.protocol.TreeVerifier`).
        draft_scheme: the scheme declared to it (the drafts, distinct siblings of a uniform q
            over the 20 tokens, are possible under each of the three).
        generator: the verifier's randomness (SGLang draws its coins with ``torch.rand``).

    Returns:
        A :class:`~benchmarks.peers.PeerVerdict`: ``detected`` iff the output differs from
        :data:`SGLANG_EXPECTED_TOKENS` / :data:`SGLANG_EXPECTED_NODES` (``statistic`` counts
        the differing entries) or is malformed, or the verifier raised (a crash fails a test).

    Notes:
        SGLang's kernel is "target only": it ignores ``draft_probs`` (the test passes zeros).
        The protocol needs a distribution at every node with children, so q is uniform over
        the vocabulary; with one-hot p every lossless rule accepts the child carrying the
        one-hot token (its ratio p/q >= 1) and rejects the others (p = 0), whatever q.
    """
    target = torch.softmax(sglang_logits() / SGLANG_TEMPERATURE, dim=-1)
    draft = torch.full_like(target, 1.0 / SGLANG_VOCAB)
    parents = torch.tensor(SGLANG_PARENTS, dtype=torch.int64)
    ids = torch.tensor(SGLANG_TOKEN_IDS, dtype=torch.int64)
    try:
        value = verifier(target, draft, parents, ids, draft_scheme, generator)
    except Exception as error:  # a crash fails the peer's test; recorded, not hidden
        return PeerVerdict("sglang-structural", True, 1.0, 0.0, 1,
                           f"raised {type(error).__name__}: {error}")
    return _compare(value)


def sglang_greedy_structural(verifier: GreedyTreeVerifier) -> PeerVerdict:
    """SGLang's deterministic tree test applied to a greedy tree verifier: the same trees, the
    logits themselves (argmax = the one-hot token); same verdict rule as
    :func:`sglang_structural`."""
    parents = torch.tensor(SGLANG_PARENTS, dtype=torch.int64)
    ids = torch.tensor(SGLANG_TOKEN_IDS, dtype=torch.int64)
    try:
        value = verifier(sglang_logits(), parents, ids)
    except Exception as error:  # a crash fails the peer's test; recorded, not hidden
        return PeerVerdict("sglang-structural", True, 1.0, 0.0, 1,
                           f"raised {type(error).__name__}: {error}")
    return _compare(value)


def first_token_chi_square(
    first_tokens: object, root_target: object, level: float = FIRST_TOKEN_LEVEL
) -> PeerVerdict:
    """Pearson chi-square of the first emitted token against p at the root.

    Args:
        first_tokens: ``[n]`` integer, the token emitted right after the root in each of n
            steps (``tokens[:, 0]`` of the tree outputs; anything outside ``[0, V)``, e.g. a
            placeholder -1, counts as an impossible token).
        root_target: ``[V]`` float, p at the root (sums to 1 within 1e-6).
        level: significance level in (0, 1).

    Returns:
        :class:`~benchmarks.peers.PeerVerdict` named ``first-token-chi-square``: ``statistic``
        the chi-square p-value (0 when an impossible token fell into an empty merged bin),
        ``threshold`` the level, ``detected`` iff p-value <= level. With fewer than two cells
        after merging there is nothing to test (``detected`` False unless an impossible token
        was seen).

    Raises:
        ValueError: naming the argument: ``first_tokens`` not 1-D integer or empty,
            ``root_target`` not a 1-D distribution, ``level`` outside (0, 1).
    """
    tokens = np.asarray(first_tokens)
    if tokens.ndim != 1 or tokens.size == 0 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"first_tokens: must be a non-empty 1-D integer array, got "
                         f"shape {tokens.shape} dtype {tokens.dtype}")
    p = np.asarray(root_target, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or (p < 0).any() or not np.isfinite(p).all() or abs(
        float(p.sum()) - 1.0
    ) > 1e-6:
        raise ValueError("root_target: must be a 1-D probability vector summing to 1")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: must lie in (0, 1), got {level}")
    n = tokens.size
    vocab = p.size
    inside = (tokens >= 0) & (tokens < vocab)
    counts = np.bincount(tokens[inside], minlength=vocab).astype(np.float64)
    outside = float((~inside).sum())
    expected = n * p
    big = expected >= FIRST_TOKEN_MIN_EXPECTED
    observed_cells = list(counts[big])
    expected_cells = list(expected[big])
    merged_observed = float(counts[~big].sum()) + outside
    merged_expected = float(expected[~big].sum())
    if merged_expected >= FIRST_TOKEN_MIN_EXPECTED or (
        merged_expected > 0 and not expected_cells
    ):
        observed_cells.append(merged_observed)
        expected_cells.append(merged_expected)
    elif merged_expected > 0:
        smallest = int(np.argmin(expected_cells))
        observed_cells[smallest] += merged_observed
        expected_cells[smallest] += merged_expected
    elif merged_observed > 0:
        return PeerVerdict("first-token-chi-square", True, 0.0, level, n,
                           f"{int(merged_observed)} first tokens have p = 0 or lie outside [0, V)")
    if len(expected_cells) < 2:
        return PeerVerdict("first-token-chi-square", False, 1.0, level, n,
                           "fewer than two cells: nothing to test")
    observed_array = np.array(observed_cells)
    expected_array = np.array(expected_cells)
    statistic = float(((observed_array - expected_array) ** 2 / expected_array).sum())
    pvalue = float(scipy.stats.chi2.sf(statistic, df=len(expected_cells) - 1))
    return PeerVerdict("first-token-chi-square", pvalue <= level, pvalue, level, n,
                       f"{len(expected_cells)} cells, chi2 = {statistic:.4g}")
