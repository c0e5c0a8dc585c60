"""What the property suite's tree tests share: the tree case strategy, the explicit witness
cases, one example run on the engine's pieces (its sampler :func:`losslessness.engine.draw.
sample_tree`, its checks :mod:`losslessness.checks.tree_structure`, :mod:`losslessness.checks.
tree_law` and :mod:`losslessness.checks.tree_greedy`) and the failure messages (check, tree,
laws, seed, replay).

The tree law (:mod:`losslessness.checks.tree_law` defines it): given that the accepted path
reached node n (or the root), the next emitted token follows p at n; nodes whose p is the same
row (same depth and token in the case's Markov model) are pooled. The suite's design differs
from the audit's in which classes it identity-tests: the root (every step reaches it: the first
emitted token must follow ``root_target``) and every depth-1 class x (the steps whose first
accepted node has token x: the second emitted token must follow ``target_table[0, x]``), at
most :data:`~losslessness.suite.support.TREE_LAW_CLASSES` classes (the most reached first),
each one identity test at the suite's per-assertion level
(:func:`~losslessness.suite.support.suite_budget`); every other reached class keeps the law
check's exact part (a token with p = 0 is never emitted).
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import note, reject
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from losslessness.batteries.serving_tree import (
    SERVING_TREE_CASE_IDS,
    default_serving_tree_battery,
    serving_tree_case,
)
from losslessness.cases import GreedyTreeCase, TreeCase
from losslessness.checks import check_tree_greedy, check_tree_law, check_tree_structure
from losslessness.checks.ids import TREE_GREEDY_CHECK_ID, TREE_LAW_CHECK_ID, TREE_STRUCTURE_CHECK_ID
from losslessness.checks.tree_assertions import ROOT, NodeClass, class_p, visited_classes
from losslessness.engine.draw import ProtocolViolation, sample_greedy_tree, sample_tree
from losslessness.protocol import GreedyTreeVerifier, TreeVerifier
from losslessness.reference.profiles import EngineProfile
from losslessness.reference.profiles.steps import NoTokenLeft
from losslessness.requests import Request, UnsupportedRequest
from losslessness.results import CheckContext, CheckResult, Verdict
from losslessness.samples import TreeSamples
from losslessness.seeding import derive_seed
from losslessness.stats import SUITE_FAMILY_WISE_ALPHA
from losslessness.suite.serving_support import supported_fields
from losslessness.suite.support import (
    SERVING_TREE_WITNESS_EXAMPLES,
    TREE_LAW_CLASSES,
    TREE_WITNESS_EXAMPLES,
    SuiteBudget,
    _shorten,
    suite_budget,
)
from strategies.requests import requests
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

SUITE_POWER = 0.9
"""Design power the suite's results report their minimum detectable TV at (the chain test's,
:func:`losslessness.suite.support.run_chain_example`); it decides nothing."""

SUITE_TV = 0.1
"""Design TV distance of the suite's check context (the chain test's); it decides nothing."""


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


@st.composite
def suite_serving_tree_cases(draw: st.DrawFn, profile: EngineProfile) -> TreeCase:
    """A serving tree case for the suite: a :func:`suite_tree_cases` tree, scheme and tables,
    its target tables' logs as the raw logits (``-inf`` where p = 0), a request drawn among the
    fields ``profile`` implements less the penalties (:func:`~losslessness.batteries.
    serving_tree.reads_path_tokens`; greedy where the profile has a greedy sampler), float32 or
    bfloat16 logits; the tables then hold ``profile``'s law
    (:func:`~losslessness.batteries.serving_tree.serving_tree_case`). Draws where the request's
    masks leave no token at some node, or that the profile refuses, are rejected."""
    tree = draw(suite_tree_cases())
    fields, greedy = supported_fields(profile)
    fields = fields - {"frequency_penalty", "presence_penalty", "repetition_penalty"}
    # Over one token every request has the same law.
    request = Request() if tree.vocab_size < 2 else draw(
        requests(tree.vocab_size, fields=sorted(fields),
                 greedy=None if greedy and "temperature" in fields else False),
        label="request",
    )
    dtype = draw(st.sampled_from(("float32", "bfloat16")), label="dtype")
    try:
        return serving_tree_case(
            tree.case_id, tree.summary, tree.parents, tree.draft_scheme,
            tree.root_target.log(), tree.target_table.log(), tree.root_draft, tree.draft_table,
            request, profile, dtype, batch_size=tree.batch_size, token_rows=tree.token_rows,
            tags=tree.tags,
        )
    except (UnsupportedRequest, NoTokenLeft):
        reject()


SERVING_TREE_WITNESSES = ("stree-min-p", "stree-min-tokens", "stree-eagle-top-p")
"""The serving tree battery's cases the serving tree test runs first, built for the target's
profile: min-p, the min_tokens boundary inside the tree, top-p on an EAGLE top-k tree (the
engines' tree paths drop or misplace these: :mod:`losslessness.zoo.serving_tree`)."""

if len(SERVING_TREE_WITNESSES) != SERVING_TREE_WITNESS_EXAMPLES:
    raise ImportError("SERVING_TREE_WITNESSES and SERVING_TREE_WITNESS_EXAMPLES disagree")


def serving_tree_witness(name: str, profile: EngineProfile) -> TreeCase | None:
    """The serving tree battery's case ``name`` built for ``profile``, or None when the
    profile does not implement its request.

    Raises:
        ValueError: ``name`` is not a battery case id.
    """
    if name not in SERVING_TREE_CASE_IDS:
        raise ValueError(f"name: {name!r} is not a serving tree battery case")
    battery = default_serving_tree_battery(profile.name)
    return next((case for case in battery if case.case_id == name), None)


def suite_greedy_tree_cases() -> st.SearchStrategy[GreedyTreeCase]:
    """Greedy tree cases for the suite (:func:`strategies.trees.greedy_tree_cases`)."""
    return greedy_tree_cases(GREEDY_TREE_MAX_VOCAB, GREEDY_TREE_MAX_BATCH)


class TreeFailure(AssertionError):
    """A tree property failed; the message is the suite's report."""


def _context(verifier: object, case: TreeCase | GreedyTreeCase, alpha: float,
             seed: int) -> CheckContext:
    """The check context of one example: the verifier's name as the target, the suite's
    per-assertion level ``alpha``."""
    name = getattr(verifier, "__qualname__", type(verifier).__name__)
    return CheckContext(name, case.case_id, case.summary, case.case_hash, alpha, SUITE_POWER,
                        SUITE_TV, seed)


def _header(check: str, where: str, case: TreeCase | GreedyTreeCase,
            parents: tuple[int, ...]) -> list[str]:
    topology = TreeTopology(case.summary.split()[0], parents)
    lines = [
        f"losslessness: LOSSY {check}{where} ({case.summary})",
        f"  tree: parents {list(parents)} ({topology.describe()})",
    ]
    serving = case.serving if isinstance(case, TreeCase) else None
    if serving is not None:
        lines.append(f"  request: {serving.request!r}")
        if serving.companions:
            lines.append(f"  batched beside (unchecked): {list(serving.companions)!r}")
    return lines


def _footer(case: TreeCase, seed: int, replay: str) -> list[str]:
    return [
        f"  seed {seed} (derived from the case hash {case.case_hash})",
        f"  replay: {replay}",
    ]


def suite_law_classes(samples: TreeSamples) -> list[NodeClass]:
    """The classes whose law the suite identity-tests (module docstring): the root, then the at
    most :data:`~losslessness.suite.support.TREE_LAW_CLASSES` depth-1 classes the samples
    reached most (ties: lowest token first).

    Args:
        samples: well-formed outputs (:func:`~losslessness.checks.tree_structure.
            check_tree_structure` passed).

    Returns:
        :class:`~losslessness.checks.tree_assertions.NodeClass` records, each ``statistical``,
        ``reach`` the share of the samples' steps that reached it.
    """
    case = samples.case
    _, depth, token, _ = visited_classes(
        samples.token_ids, samples.tokens, samples.accepted_nodes, case.depths.numpy()
    )
    found, sizes = np.unique(token[depth == 1], return_counts=True)
    order = np.lexsort((found, -sizes))[:TREE_LAW_CLASSES]
    steps = samples.n_steps
    depth_one = [
        NodeClass(1, int(x), class_p(case, 1, int(x)), float(size) / steps, True)
        for x, size in zip(found[order], sizes[order], strict=True)
    ]
    return [NodeClass(0, ROOT, class_p(case, 0, ROOT), 1.0, True), *depth_one]


def _law_failure(
    result: CheckResult, samples: TreeSamples, budget: SuiteBudget
) -> tuple[str, list[str]]:
    """Where a LOSSY ``tree.law`` result was found and the lines that show it: the p-value
    against the suite's budget (statistical failures), p and q at the class, the observed
    frequencies and the check's own message."""
    case = samples.case
    if result.details.get("exact_only"):
        return " at a node without an identity test", [f"  {result.message}"]
    d, x = result.details["depth"], result.details["token"]
    where = " at the root" if d == 0 else f" after a depth-{d} node with token {x}"
    lines = []
    if not result.details["zero_mass_count"] and not result.details["out_of_vocab"]:
        lines.append(
            f"  p-value {result.p_value:.3g} <= alpha {result.alpha:.3g} (family-wise "
            f"{SUITE_FAMILY_WISE_ALPHA:g} over {budget.assertions} assertions, profile "
            f"{budget.profile})"
        )
    p = torch.from_numpy(class_p(case, d, x))
    q = (case.root_draft if d == 0
         else case.draft_table[d - 1, int(case.table_rows(torch.tensor(x)))] if d < case.depth
         else None)
    _, depth, token, emitted = visited_classes(
        samples.token_ids, samples.tokens, samples.accepted_nodes, case.depths.numpy()
    )
    counts = np.bincount(emitted[(depth == d) & (token == x)], minlength=case.vocab_size)
    n = int(counts.sum())
    lines += [
        f"  p = {_shorten(p)}",
        *([f"  q = {_shorten(q)}"] if q is not None else []),
        f"  observed {_shorten(torch.from_numpy(counts / max(n, 1)))} over {n} steps",
        f"  {result.message}",
    ]
    return where, lines


def run_tree_example(
    verifier: TreeVerifier, case: TreeCase, replay: str, timeout_s: float | None = None
) -> None:
    """Sample ``case`` on ``verifier`` with the engine's sampler (each call within
    ``timeout_s`` seconds; None: no limit) and decide with the engine's structure and law
    checks (the suite's classes and level); fail on the first violation.

    Raises:
        TreeFailure: with the check, the tree (parents and edges), p (and q), the observed
            frequencies, the seed and ``replay``.
    """
    budget = suite_budget()
    seed = derive_seed(0, "suite-tree", case.case_hash)
    # A witness test of the serving tree suite runs outside Hypothesis (its cases depend on
    # the target's profile), where notes cannot be made; its failure message says it all.
    if currently_in_test_context():
        note(f"case {case.summary}, parents {list(case.parents)}, hash {case.case_hash}, "
             f"seed {seed}")
    structure_header = _header(TREE_STRUCTURE_CHECK_ID, "", case, case.parents)
    try:
        samples = sample_tree(verifier, case, TREE_STEPS, seed, timeout_s)
    except ProtocolViolation as violation:
        raise TreeFailure("\n".join([*structure_header, f"  {violation}",
                                     *_footer(case, seed, replay)])) from None
    context = _context(verifier, case, budget.per_assertion_alpha, seed)
    structure = check_tree_structure(samples, context)
    if structure.verdict is Verdict.LOSSY:
        raise TreeFailure("\n".join([*structure_header, f"  {structure.message}",
                                     *_footer(case, seed, replay)]))
    laws = check_tree_law(samples, context, suite_law_classes(samples))
    lossy = [result for result in laws if result.verdict is Verdict.LOSSY]
    if lossy:
        where, lines = _law_failure(lossy[0], samples, budget)
        raise TreeFailure("\n".join([*_header(TREE_LAW_CHECK_ID, where, case, case.parents), *lines,
                                     *_footer(case, seed, replay)]))


def greedy_tree_failure(
    verifier: GreedyTreeVerifier, case: GreedyTreeCase, replay: str,
    timeout_s: float | None = None,
) -> str | None:
    """The message for the first tree where ``verifier`` breaks greedy decoding (a token that
    is not the argmax at its node, a path not in the tree: :func:`losslessness.checks.
    tree_greedy.check_tree_greedy` is LOSSY) or returns a malformed output, or None. Any
    duplicate child carrying the argmax is a correct continuation, and stopping early only
    wastes drafts. The call may take ``timeout_s`` seconds (None: no limit)."""
    logits, ids = case.target_logits, case.token_ids
    header = _header(TREE_GREEDY_CHECK_ID, "", case, tuple(case.parents[0].tolist()))
    try:
        tokens, accepted = sample_greedy_tree(verifier, case, timeout_s)
    except ProtocolViolation as violation:
        return "\n".join([*header, f"  malformed output: {violation}", f"  replay: {replay}"])
    context = _context(verifier, case, suite_budget().per_assertion_alpha, 0)
    result = check_tree_greedy(tokens, accepted, case, context)
    if result.verdict is not Verdict.LOSSY:
        return None
    first = result.details["first_row"]
    b = first["tree"]
    lines = [*header, f"  row {b}: token_ids {ids[b].tolist()}: {first['reason']}"]
    for node in range(logits.shape[1]):
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
        f"  greedy tree verification gives tokens {first['greedy_tokens']}, accepted "
        f"{first['greedy_accepted_nodes']}",
        f"  got tokens {first['tokens']}, accepted {first['accepted_nodes']}",
        f"  replay: {replay}",
    ]
    return "\n".join(lines)
