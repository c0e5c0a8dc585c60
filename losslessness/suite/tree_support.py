"""What the property suite's tree tests share: the tree case strategy, sampling a tree verifier
on one case, its checks (structure, the law at the root and after each reached depth-1 class,
greedy equality) and the failure messages (check, tree, laws, seed, replay).

The tree law check (TREE.md semantics): given that the accepted path reached node n (or the
root), the next emitted token follows p at n; nodes whose p is the same row (same depth and
token in the case's Markov model) are pooled. The suite tests the root (every step reaches it:
the first emitted token must follow ``root_target``) and every depth-1 class x (the steps whose
first accepted node has token x: the second emitted token must follow ``target_table[0, x]``),
at most :data:`~losslessness.suite.support.TREE_LAW_CLASSES` classes (the most reached first),
each one identity test (:func:`losslessness.stats.identity_test`) at the suite's
per-assertion level plus its exact part (a token with p = 0 is never emitted).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import note
from hypothesis import strategies as st

from losslessness.cases import GreedyTreeCase, TreeCase
from losslessness.checks.tree_greedy import greedy_violation
from losslessness.protocol import GreedyTreeVerifier, TreeVerifier
from losslessness.reference.greedy import argmax_lowest_index
from losslessness.reference.tree import verify_tree_greedy
from losslessness.seeding import derive_seed
from losslessness.stats import identity_test
from losslessness.suite.support import (
    SUITE_FAMILY_WISE_ALPHA,
    TREE_LAW_CLASSES,
    TREE_WITNESS_EXAMPLES,
    SuiteBudget,
    _shorten,
    suite_budget,
)
from strategies.trees import TreeTopology, greedy_tree_cases, tree_cases

TREE_STEPS = 4000
"""Tree verification steps (trees) per example."""

TREE_BATCH = 250
"""Trees per verifier call in the suite (:attr:`TreeCase.batch_size`)."""

TREE_MAX_VOCAB = 16
"""Largest V of a generated tree case (shrinks to small V)."""

TREE_SMALL_VOCAB = 3
"""Half the tree cases draw V in ``[1, TREE_SMALL_VOCAB]``, where ``iid`` siblings often repeat
a token; the other half in ``(TREE_SMALL_VOCAB, TREE_MAX_VOCAB]``."""

GREEDY_TREE_MAX_VOCAB = 16
"""Largest V of a generated greedy tree case."""

GREEDY_TREE_MAX_BATCH = 4
"""Largest B of a generated greedy tree case."""


def _witness(scheme: str, root_target: list[float], root_draft: list[float]) -> TreeCase:
    """A star of three siblings at V = 4 under ``scheme`` with the given root laws; the depth-1
    (leaf) rows are the root's rotated by the leaf's token."""
    p = torch.tensor(root_target, dtype=torch.float64)
    q = torch.tensor(root_draft, dtype=torch.float64)
    vocab = p.shape[0]
    target = torch.stack([p.roll(x) for x in range(vocab)]).unsqueeze(0)
    draft = torch.stack([q.roll(x) for x in range(vocab)]).unsqueeze(0)
    return TreeCase(
        f"witness-{scheme}",
        f"star N=3 D=1 V={vocab} {scheme}",
        (0, 0, 0),
        p,
        q,
        target,
        draft,
        scheme,
        batch_size=TREE_BATCH,
        tags=frozenset({"star", scheme, "witness"}),
    )


TREE_WITNESS_CASES: tuple[TreeCase, ...] = (
    _witness("iid", [0.15, 0.15, 0.35, 0.35], [0.55, 0.35, 0.05, 0.05]),
    _witness("iid", [0.2, 0.2, 0.3, 0.3], [0.1, 0.1, 0.7, 0.1]),
    _witness("without-replacement", [0.2, 0.1, 0.3, 0.4], [0.1, 0.6, 0.2, 0.1]),
    _witness("top-k", [0.2, 0.1, 0.3, 0.4], [0.1, 0.6, 0.2, 0.1]),
)
"""Explicit examples of the tree test, run by every profile before the generated ones: a star
of three siblings at V = 4 whose q puts most of its mass where p puts little, under each draft
scheme (``iid`` twice: q far from p, and q peaked on one token so siblings repeat it). There
the published rules differ most: after a rejection the running residual moves far from p,
i.i.d. siblings repeat the peak token, and a draw without replacement changes ``q'`` by the
peak's mass. A verifier that skips the running residual or applies one scheme's rule to
another's drafts is off by a root TV of 0.1 to 0.2 on one of them, which the suite's 4,000
steps detect; random cases rarely concentrate q so (measured: none of 250 ``nightly``
examples caught such a verifier). Counted in the suite's budget
(:data:`losslessness.suite.support.TREE_WITNESS_EXAMPLES`)."""

if len(TREE_WITNESS_CASES) != TREE_WITNESS_EXAMPLES:
    raise ImportError("TREE_WITNESS_CASES and TREE_WITNESS_EXAMPLES disagree")


@st.composite
def suite_tree_cases(draw: st.DrawFn) -> TreeCase:
    """A tree case for the suite: V small (``<= TREE_SMALL_VOCAB``, duplicates under ``iid``)
    or larger (up to :data:`TREE_MAX_VOCAB`), every shape, scheme, regime and relation of
    :func:`strategies.trees.tree_cases`, :data:`TREE_BATCH` trees per call."""
    large = draw(st.booleans())
    low, high = (TREE_SMALL_VOCAB + 1, TREE_MAX_VOCAB) if large else (1, TREE_SMALL_VOCAB)
    return draw(tree_cases(high, min_vocab=low, batch_size=TREE_BATCH))


def suite_greedy_tree_cases() -> st.SearchStrategy[GreedyTreeCase]:
    """Greedy tree cases for the suite (:func:`strategies.trees.greedy_tree_cases`)."""
    return greedy_tree_cases(GREEDY_TREE_MAX_VOCAB, GREEDY_TREE_MAX_BATCH)


class TreeFailure(AssertionError):
    """A tree property failed; the message is the suite's report."""


@dataclass(frozen=True)
class TreeSamples:
    """The outputs of a tree verifier on one case.

    Attributes:
        token_ids: ``[S, N]`` int64, the drafted trees (S steps).
        tokens: ``[S, D+1]`` int64, the emitted tokens.
        accepted: ``[S, D]`` int64, the accepted nodes.
        seed: the seed the drafts and the verifier's generator came from.
    """

    token_ids: np.ndarray
    tokens: np.ndarray
    accepted: np.ndarray
    seed: int


def _topology(case: TreeCase) -> TreeTopology:
    return TreeTopology(case.summary.split()[0], case.parents)


def _header(check: str, where: str, case: TreeCase) -> list[str]:
    topology = _topology(case)
    return [
        f"losslessness: LOSSY {check}{where} ({case.summary})",
        f"  tree: parents {list(case.parents)} ({topology.describe()})",
    ]


def _footer(case: TreeCase, seed: int, replay: str) -> list[str]:
    return [
        f"  seed {seed} (derived from the case hash {case.case_hash})",
        f"  replay: {replay}",
    ]


def _structure_violation(value: object, case: TreeCase, batch: int) -> str | None:
    """Why a verifier's return value is not a well-formed :class:`TreeOutput`, or None."""
    if not isinstance(value, tuple) or len(value) != 2:
        return f"returned {type(value).__name__}, expected TreeOutput(tokens, accepted_nodes)"
    expected = {"tokens": (batch, case.depth + 1), "accepted_nodes": (batch, case.depth)}
    for name, tensor in zip(("tokens", "accepted_nodes"), value, strict=True):
        if not isinstance(tensor, torch.Tensor):
            return f"{name} is a {type(tensor).__name__}, expected a torch.Tensor"
        if tuple(tensor.shape) != expected[name]:
            return (
                f"{name} has shape {tuple(tensor.shape)}, expected {expected[name]} "
                f"([B, D+{1 if name == 'tokens' else 0}] with D = {case.depth})"
            )
        if tensor.dtype != torch.int64:
            return f"{name} has dtype {tensor.dtype}, expected torch.int64"
    return None


def sample_tree(verifier: TreeVerifier, case: TreeCase, steps: int, seed: int,
                replay: str) -> TreeSamples:
    """Draft ``steps`` trees of ``case`` and verify them, :attr:`TreeCase.batch_size` per call.

    Drafts come from a generator seeded with ``seed``, the verifier's randomness from one seeded
    with ``derive_seed(seed, "verifier")``; the verifier gets fresh copies of its inputs.

    Raises:
        TreeFailure: the verifier returned something that is not a ``[B, D+1]`` / ``[B, D]``
            int64 :class:`TreeOutput` (``tree.structure``).
    """
    drafts = torch.Generator().manual_seed(seed)
    randomness = torch.Generator().manual_seed(derive_seed(seed, "verifier"))
    ids_chunks, token_chunks, accepted_chunks = [], [], []
    done = 0
    while done < steps:
        batch = min(case.batch_size, steps - done)
        ids = case.draw_trees(batch, drafts)
        target, draft = case.inputs(ids)
        parents = case.parents_tensor.expand(batch, -1).clone()
        output = verifier(target, draft, parents, ids.clone(), case.draft_scheme, randomness)
        problem = _structure_violation(output, case, batch)
        if problem is not None:
            raise TreeFailure(
                "\n".join([*_header("tree.structure", "", case), f"  {problem}",
                           *_footer(case, seed, replay)])
            )
        ids_chunks.append(ids.numpy())
        token_chunks.append(output[0].cpu().numpy())
        accepted_chunks.append(output[1].cpu().numpy())
        done += batch
    return TreeSamples(np.concatenate(ids_chunks), np.concatenate(token_chunks),
                       np.concatenate(accepted_chunks), seed)


def _step_problem(samples: TreeSamples, case: TreeCase, step: int) -> str | None:
    """What is wrong with one step's output (see :func:`structure_problem`), or None."""
    parents = case.parents
    nodes, vocab = case.n_nodes, case.vocab_size
    path, tokens = samples.accepted[step], samples.tokens[step]
    length = int(np.argmax(path < 0)) if (path < 0).any() else path.size
    row = f"step {step}: accepted_nodes {path.tolist()}, tokens {tokens.tolist()}"
    if (path[length:] != -1).any():
        return f"{row}: accepted_nodes is not left-aligned with -1 padding"
    if ((path[:length] < 1) | (path[:length] > nodes)).any():
        return f"{row}: an accepted node is outside 1..{nodes}"
    previous = 0
    for node in path[:length].tolist():
        if parents[node - 1] != previous:
            return f"{row}: node {node} is not a child of node {previous} (not a root path)"
        previous = node
    expected = samples.token_ids[step, path[:length] - 1]
    if (tokens[:length] != expected).any():
        return (f"{row}: the emitted tokens {tokens[:length].tolist()} are not the accepted "
                f"nodes' tokens {expected.tolist()}")
    final = int(tokens[length])
    if not 0 <= final < vocab:
        return f"{row}: the final token {final} is outside [0, {vocab})"
    if (tokens[length + 1:] != -1).any():
        return f"{row}: tokens is not -1 after the final token"
    return None


def structure_problem(samples: TreeSamples, case: TreeCase) -> str | None:
    """The first step whose output is not a root path of its tree with matching tokens and
    ``-1`` padding, described, or None.

    Checks, for every step: the accepted nodes are ``1..N`` then ``-1`` only; the first is a
    child of the root and each next one a child of the previous; ``tokens[i]`` is the token of
    the i-th accepted node; after them one final token in ``[0, V)``, then ``-1`` only. The
    check runs on all steps at once; the first offending step is then described.
    """
    parents = np.asarray(case.parents, dtype=np.int64)
    nodes, vocab = case.n_nodes, case.vocab_size
    accepted, tokens, ids = samples.accepted, samples.tokens, samples.token_ids
    steps, depth = accepted.shape
    rows = np.arange(steps)
    padding = accepted < 0
    length = np.where(padding.any(axis=1), np.argmax(padding, axis=1), depth)
    inside = np.arange(depth) < length[:, None]
    index = np.clip(accepted - 1, 0, nodes - 1)
    previous = np.concatenate([np.zeros((steps, 1), dtype=np.int64), accepted[:, :-1]], axis=1)
    final = tokens[rows, length]
    bad = (
        (~inside & (accepted != -1)).any(axis=1)
        | (inside & ((accepted < 1) | (accepted > nodes))).any(axis=1)
        | (inside & (parents[index] != previous)).any(axis=1)
        | (inside & (tokens[:, :depth] != np.take_along_axis(ids, index, axis=1))).any(axis=1)
        | (final < 0) | (final >= vocab)
        | ((np.arange(depth + 1) > length[:, None]) & (tokens != -1)).any(axis=1)
    )
    if not bad.any():
        return None
    step = int(np.argmax(bad))
    return _step_problem(samples, case, step) or f"step {step}: malformed output"


def _law_failure(
    counts: np.ndarray, p: torch.Tensor, q: torch.Tensor | None, budget: SuiteBudget
) -> str | None:
    alpha = budget.per_assertion_alpha
    result = identity_test(counts, p.numpy())
    if result.zero_mass_count > 0:
        why = (f"  {result.zero_mass_count} emitted tokens have p = 0 (tokens "
               f"{list(result.zero_mass_tokens)}): impossible under p")
    elif result.pvalue <= alpha:
        why = (f"  p-value {result.pvalue:.3g} <= alpha {alpha:.3g} (family-wise "
               f"{SUITE_FAMILY_WISE_ALPHA:g} over {budget.assertions} assertions, profile "
               f"{budget.profile})")
    else:
        return None
    n = int(counts.sum())
    lines = [
        why,
        f"  p = {_shorten(p)}",
        *([f"  q = {_shorten(q)}"] if q is not None else []),
        f"  observed {_shorten(torch.from_numpy(counts / max(n, 1)))} over {n} steps",
    ]
    return "\n".join(lines)


def law_failures(
    samples: TreeSamples, case: TreeCase, budget: SuiteBudget
) -> list[tuple[str, str]]:
    """Identity tests of the first emitted token against p at the root and of the next token
    after each reached depth-1 class against its p (module docstring).

    Returns:
        ``(where, details)`` per failed test, the root first: where the law was tested
        (``" at the root"``, ``" after a depth-1 node with token x"``) and the lines that
        show it (p-value or impossible tokens, p, q, observed frequencies).
    """
    vocab = case.vocab_size
    failures = []
    first = np.bincount(samples.tokens[:, 0], minlength=vocab)
    failure = _law_failure(first, case.root_target, case.root_draft, budget)
    if failure is not None:
        failures.append((" at the root", failure))
    head = samples.accepted[:, 0]
    reached = head >= 1
    classes = samples.token_ids[np.flatnonzero(reached), head[reached] - 1]
    tokens_after = samples.tokens[reached, 1]
    found, sizes = np.unique(classes, return_counts=True)
    order = np.lexsort((found, -sizes))[:TREE_LAW_CLASSES]
    for x in found[order].tolist():
        counts = np.bincount(tokens_after[classes == x], minlength=vocab)
        p = case.target_table[0, x]
        q = case.draft_table[0, x] if case.depth > 1 else None
        failure = _law_failure(counts, p, q, budget)
        if failure is not None:
            failures.append((f" after a depth-1 node with token {x}", failure))
    return failures


def run_tree_example(verifier: TreeVerifier, case: TreeCase, replay: str) -> None:
    """Sample ``case`` on ``verifier`` and check structure and laws; fail on the first
    violation.

    Raises:
        TreeFailure: with the check, the tree (parents and edges), p (and q), the observed
            frequencies, the seed and ``replay``.
    """
    budget = suite_budget()
    seed = derive_seed(0, "suite-tree", case.case_hash)
    note(f"case {case.summary}, parents {list(case.parents)}, hash {case.case_hash}, "
         f"seed {seed}")
    samples = sample_tree(verifier, case, TREE_STEPS, seed, replay)
    problem = structure_problem(samples, case)
    if problem is not None:
        raise TreeFailure("\n".join([*_header("tree.structure", "", case), f"  {problem}",
                                     *_footer(case, seed, replay)]))
    failures = law_failures(samples, case, budget)
    if failures:
        where, text = failures[0]
        raise TreeFailure("\n".join([*_header("tree.law", where, case), text,
                                     *_footer(case, seed, replay)]))


def greedy_tree_failure(
    verifier: GreedyTreeVerifier, case: GreedyTreeCase, replay: str
) -> str | None:
    """The message for the first tree where ``verifier`` breaks greedy decoding (a token that
    is not the argmax at its node, a path not in the tree: :func:`losslessness.checks.
    tree_greedy.greedy_violation`) or returns a malformed output, or None. Any duplicate child
    carrying the argmax is a correct continuation, and stopping early only wastes drafts."""
    logits, parents, ids = case.target_logits, case.parents, case.token_ids
    expected = verify_tree_greedy(logits, parents, ids)
    output = verifier(logits.clone(), parents.clone(), ids.clone())
    topology = TreeTopology(case.summary.split()[0], tuple(parents[0].tolist()))
    header = [
        f"losslessness: LOSSY tree.greedy ({case.summary})",
        f"  tree: parents {list(topology.parents)} ({topology.describe()})",
    ]
    shapes_ok = (
        isinstance(output, tuple) and len(output) == 2
        and all(isinstance(t, torch.Tensor) for t in output)
        and tuple(output[0].shape) == tuple(expected.tokens.shape)
        and tuple(output[1].shape) == tuple(expected.accepted_nodes.shape)
        and output[0].dtype == torch.int64 and output[1].dtype == torch.int64
    )
    if not shapes_ok:
        got = (
            [(tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else type(t).__name__
             for t in output] if isinstance(output, tuple) else type(output).__name__
        )
        return "\n".join([*header, f"  malformed output {got}, expected int64 tensors of "
                          f"shapes {tuple(expected.tokens.shape)} and "
                          f"{tuple(expected.accepted_nodes.shape)}", f"  replay: {replay}"])
    tokens, accepted = output[0].cpu().numpy(), output[1].cpu().numpy()
    best = argmax_lowest_index(logits).numpy()
    found = [
        greedy_violation(tokens[b], accepted[b], best[b], parents[b].numpy(), ids[b].numpy())
        for b in range(case.batch_size)
    ]
    lossy = [b for b, (kind, _) in enumerate(found) if kind == "lossy"]
    if not lossy:
        return None
    b = lossy[0]
    lines = [*header, f"  row {b}: token_ids {ids[b].tolist()}: {found[b][1]}"]
    for node in range(case.target_logits.shape[1]):
        row = logits[b, node]
        tied = int((row == row.max()).sum())
        lines.append(
            f"  logits at node {node} = {_shorten(row)}"
            + (f" ({tied}-way tie at the maximum)" if tied > 1 else "")
        )
        if node >= 5:
            lines.append("  ...")
            break
    lines += [
        f"  greedy tree verification gives tokens {expected.tokens[b].tolist()}, accepted "
        f"{expected.accepted_nodes[b].tolist()}",
        f"  got tokens {tokens[b].tolist()}, accepted {accepted[b].tolist()}",
        f"  replay: {replay}",
    ]
    return "\n".join(lines)
