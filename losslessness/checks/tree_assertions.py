"""Which assertions a tree case makes, and how many trees it needs: the tree counterpart of
:mod:`losslessness.checks.assertions` (issue 11).

The run's false-alarm budget is split over statistical assertions before any sample is drawn,
so a tree case's assertions are decided from the case alone (:func:`tree_assertions`): the
classes of nodes whose next-token law is tested come from a fixed-seed pilot run of the
reference verifier (the same on every machine and for every target), the depths whose
acceptance is tested from the exact laws of
:func:`losslessness.reference.tree_laws.exact_tree_laws`. :func:`tree_steps` sizes the case
for every identity test to reach the design's power.

Node classes: node 0 is the root context; a node of depth d >= 1 with token x has p =
``target_table[d-1, x]`` (a Markov model), so the nodes of one (depth, token) class share one p
row and the law check (:mod:`losslessness.checks.tree_law`) pools them;
:func:`visited_classes` lists which class every step reached and what it emitted next. The
classes the pilot reaches too rarely for an identity test of their own share one pooled test
(:class:`PooledPit`, the randomized PIT of :mod:`losslessness.stats.pit`): at a language
model's vocabulary the nodes beyond the root split into hundreds of classes, each reached in a
few percent of the steps, and a law error there would otherwise meet only the exact part (no
token with p = 0 emitted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from losslessness.cases import TreeCase
from losslessness.checks.assertions import RATE_TOLERANCE
from losslessness.checks.ids import (
    TREE_ACCEPTANCE_CHECK_ID,
    TREE_INDEPENDENCE_CHECK_ID,
    TREE_LAW_CHECK_ID,
)
from losslessness.protocol import PLACEHOLDER
from losslessness.reference import tree_laws as tree_laws_module
from losslessness.reference.tree import verify_tree
from losslessness.reference.tree_laws import TreeLaws
from losslessness.seeding import derive_seed
from losslessness.stats import plan_identity_test
from losslessness.stats.pit import PIT_CELLS, mass_before, randomized_pit

PILOT_TREES = 2048
"""Trees of the reference pilot run that estimates how often each node class is reached."""

PILOT_SEED = 20240311
"""Seed of the pilot run (fixed: the assertions of a case are the same on every machine)."""

REACH_FLOOR = 0.2
"""A class of nodes gets an identity test when the pilot reaches it in at least this share of
steps (rarer classes keep the exact part of the law check; the budget stays small)."""

ROOT = -1
"""The token of the root class (the root context has no token)."""

POOLED = -2
"""The token of the pooled law assertion's key (:attr:`~losslessness.results.CheckResult.
assertion_key`): every class without an identity test, in one PIT test."""

POOLED_REACH_FLOOR = 0.05
"""The pooled PIT test is made when the pilot's classes without an identity test (those whose
p has two or more positive cells) are reached at least this many times per step in all."""


@dataclass(frozen=True)
class NodeClass:
    """Nodes sharing one target row p: the root, or every node of one depth and token.

    Attributes:
        depth: 0 for the root, else d >= 1.
        token: the nodes' token (:data:`ROOT` for the root).
        p: ``[V]`` float64, the target law of the next token at these nodes.
        reach: share of the pilot's steps whose accepted path reached the class.
        statistical: the class gets an identity test (in the audit's design, reach >=
            :data:`REACH_FLOOR` and p has two or more positive cells; a caller naming its
            own classes to :func:`~losslessness.checks.tree_law.check_tree_law` sets it).
    """

    depth: int
    token: int
    p: np.ndarray
    reach: float
    statistical: bool

    @property
    def label(self) -> str:
        """``root`` or ``depth d token x``."""
        return "root" if self.depth == 0 else f"depth {self.depth} token {self.token}"


@dataclass(frozen=True)
class TreeAssertions:
    """The statistical assertions of a tree case (decided before sampling).

    Attributes:
        classes: every node class the pilot reached (root first), statistical or not.
        laws: the case's exact laws, or None where they cannot be computed (then no acceptance
            assertion is made); ``laws_note`` says why.
        acceptance_depths: depths d >= 1 whose acceptance is tested statistically.
        independence: whether the root's p allows an independence test (two or more positive
            cells; the call must carry two trees or more).
        pooled_reach: observations per step, in the pilot, at the classes without an identity
            test whose p has two or more positive cells; the pooled PIT test
            (:class:`PooledPit`) is made when it is at least :data:`POOLED_REACH_FLOOR`.
    """

    classes: tuple[NodeClass, ...]
    laws: TreeLaws | None
    laws_note: str
    acceptance_depths: tuple[int, ...]
    independence: bool
    pooled_reach: float = 0.0

    @property
    def pooled(self) -> bool:
        """Whether the case makes the pooled PIT assertion."""
        return self.pooled_reach >= POOLED_REACH_FLOOR

    def count(self, check_ids: tuple[str, ...] = ()) -> int:
        """Statistical assertions of the checks in ``check_ids`` (all when empty)."""
        wanted = set(check_ids or (TREE_LAW_CHECK_ID, TREE_ACCEPTANCE_CHECK_ID,
                                   TREE_INDEPENDENCE_CHECK_ID))
        total = 0
        if TREE_LAW_CHECK_ID in wanted:
            total += sum(node_class.statistical for node_class in self.classes) + self.pooled
        if TREE_ACCEPTANCE_CHECK_ID in wanted:
            total += len(self.acceptance_depths)
        if TREE_INDEPENDENCE_CHECK_ID in wanted:
            total += self.independence
        return total


def class_p(case: TreeCase, depth: int, token: int) -> np.ndarray:
    """``[V]`` float64 p at the nodes of (``depth``, ``token``) (the root's p at depth 0)."""
    row = (case.root_target if depth == 0
           else case.target_table[depth - 1, int(case.table_rows(torch.tensor(token)))])
    array: np.ndarray = row.to(torch.float64).numpy()
    return array


def visited_classes(
    token_ids: np.ndarray, tokens: np.ndarray, accepted_nodes: np.ndarray, depths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (reached node, next emitted token) observation of a batch of steps.

    Args:
        token_ids: ``[n, N]`` int64 drafted trees.
        tokens: ``[n, D+1]`` int64 emitted tokens.
        accepted_nodes: ``[n, D]`` int64 accepted nodes (rows assumed well formed; structure
            checks them).
        depths: ``[N+1]`` int64 node depths.

    Returns:
        (step, class depth, class token (:data:`ROOT` at the root), next token), each ``[M]``
        int64: level i of a step with L accepted nodes, for i <= L, is reached at the root
        (i = 0) or at its i-th accepted node, and emitted ``tokens[:, i]`` next.
    """
    n, width = tokens.shape
    node_tokens = np.concatenate([np.full((n, 1), ROOT, dtype=np.int64), token_ids], axis=1)
    accepted = np.where(accepted_nodes > 0, accepted_nodes, PLACEHOLDER)
    reached_nodes = np.concatenate([np.zeros((n, 1), dtype=np.int64), accepted], axis=1)
    present = (reached_nodes >= 0) & (tokens != PLACEHOLDER)
    safe = np.clip(reached_nodes, 0, depths.size - 1)
    steps = np.broadcast_to(np.arange(n)[:, None], (n, width))
    class_token = np.take_along_axis(node_tokens, safe, axis=1)
    return (
        steps[present],
        depths[safe][present],
        class_token[present],
        tokens[present],
    )


PILOT_CELLS = 1 << 25
"""Largest ``trees x (N+1) x V`` input of one pilot call (256 MB per float64 tensor): a pilot
at a real vocabulary (V = 152k) verifies its trees in chunks of this size; every battery case
at V <= 1024 fits in one call."""


def _pilot_reach(case: TreeCase) -> dict[tuple[int, int], float]:
    generator = torch.Generator().manual_seed(derive_seed(PILOT_SEED, case.case_hash))
    chunk = max(1, PILOT_CELLS // ((case.n_nodes + 1) * case.vocab_size))
    depths, tokens = [], []
    for start in range(0, PILOT_TREES, chunk):
        count = min(chunk, PILOT_TREES - start)
        ids = case.draw_trees(count, generator)
        target, draft = case.inputs(ids)
        parents = case.parents_tensor.expand(count, -1).contiguous()
        output = verify_tree(target, draft, parents, ids, case.draft_scheme, generator)
        _, depth, token, _ = visited_classes(
            ids.numpy(), output.tokens.numpy(), output.accepted_nodes.numpy(),
            case.depths.numpy(),
        )
        depths.append(depth)
        tokens.append(token)
    depth, token = np.concatenate(depths), np.concatenate(tokens)
    keys, counts = np.unique(np.stack([depth, token], axis=1), axis=0, return_counts=True)
    return {
        (int(d), int(x)): float(c) / PILOT_TREES
        for (d, x), c in zip(keys, counts, strict=True)
    }


def case_tree_laws(case: TreeCase) -> tuple[TreeLaws | None, str]:
    """The case's exact laws, or None and why they are not available (not implemented yet, or
    over the enumeration's cap)."""
    try:
        return tree_laws_module.exact_tree_laws(case), ""
    except (NotImplementedError, ValueError) as error:
        return None, f"exact tree laws unavailable: {error}"


def tree_assertions(case: TreeCase) -> TreeAssertions:
    """The statistical assertions ``case`` makes (see the module docstring); cached by the
    case's hash (and the exact-laws function, which tests may replace)."""
    key = (case.case_hash, tree_laws_module.exact_tree_laws)
    if key not in _ASSERTIONS:
        _ASSERTIONS[key] = _tree_assertions(case)
    return _ASSERTIONS[key]


_ASSERTIONS: dict[tuple[str, object], TreeAssertions] = {}
_PILOTS: dict[str, dict[tuple[int, int], float]] = {}


def _tree_assertions(case: TreeCase) -> TreeAssertions:
    if case.case_hash not in _PILOTS:
        _PILOTS[case.case_hash] = _pilot_reach(case)
    reach = _PILOTS[case.case_hash]
    classes = []
    for (depth, token), share in sorted(reach.items()):
        p = class_p(case, depth, token)
        statistical = share >= REACH_FLOOR and int((p > 0).sum()) >= 2
        classes.append(NodeClass(depth, token, p, share, statistical))
    laws, note = case_tree_laws(case)
    depths: list[int] = []
    if laws is not None:
        for d in range(1, case.depth + 1):
            rate = float(laws.depth_reach[d])
            if RATE_TOLERANCE < rate < 1.0 - RATE_TOLERANCE:
                depths.append(d)
    root_p = class_p(case, 0, ROOT)
    independence = int((root_p > 0).sum()) >= 2 and case.batch_size >= 2
    pooled_reach = sum(
        c.reach for c in classes if not c.statistical and int((c.p > 0).sum()) >= 2
    )
    return TreeAssertions(
        tuple(classes), laws, note, tuple(depths), independence, float(pooled_reach)
    )


def tree_steps(
    case: TreeCase, tv: float, alpha: float, power: float, max_steps: int, min_steps: int
) -> tuple[int, int]:
    """Trees to verify so that every identity test of ``case`` detects TV >= ``tv``.

    The class of a test is reached in a share r of steps (the pilot's), so it needs about
    ``(n + 3 sqrt(n (1 - r))) / r`` steps for the n samples of its identity test
    (:func:`losslessness.stats.plan_identity_test`), as :func:`losslessness.engine.plan.
    plan_case` sizes a chain position; the pooled PIT test, whose classes are reached r times
    per step (r may exceed 1), ``(n + 3 sqrt(n)) / r`` for the n observations of its uniform
    histogram; exact checks need ``log(1 - power) / log(1 - tv)``; never fewer than
    ``min_steps``.

    Returns:
        (steps, capped at ``max_steps``; steps the design asks for).
    """
    needed = max(min_steps, math.ceil(math.log1p(-power) / math.log1p(-min(tv, 1 - 1e-12))))
    assertions = tree_assertions(case)
    if assertions.pooled:
        plan = plan_identity_test(np.full(PIT_CELLS, 1.0 / PIT_CELLS), tv, alpha, power,
                                  max_n=max_steps * PIT_CELLS)
        r = assertions.pooled_reach
        needed = max(needed, math.ceil((plan.n + 3 * math.sqrt(plan.n)) / r))
    for node_class in assertions.classes:
        if not node_class.statistical:
            continue
        plan = plan_identity_test(node_class.p, tv, alpha, power, max_n=max_steps)
        r = node_class.reach
        needed = max(needed, math.ceil((plan.n + 3 * math.sqrt(plan.n * (1 - r))) / r))
    return min(needed, max_steps), needed




class PooledPit:
    """The randomized PIT (:mod:`losslessness.stats.pit`) of the next emitted token at every
    reached node outside the identity-tested classes: each observation's u is U(0, 1) given
    everything emitted before it when the verifier is lossless, so their histogram over
    :data:`~losslessness.stats.pit.PIT_CELLS` equal cells is one identity test against the
    uniform law.

    Left out: observations at a tested class, at a class whose p has fewer than two positive
    cells (its u says nothing), and tokens outside the vocabulary or with p = 0 at their node
    (violations, for the law check's exact part). ``F(x-)`` of each class is computed once.

    Args:
        case: the tree case (its class laws, :func:`class_p`).
        tested: the (depth, token) keys of the identity-tested classes.
    """

    def __init__(self, case: TreeCase, tested: set[tuple[int, int]]) -> None:
        self.case = case
        self.tested = set(tested)
        self._laws: dict[tuple[int, int], tuple[np.ndarray, np.ndarray] | None] = {}

    def _law(self, key: tuple[int, int]) -> tuple[np.ndarray, np.ndarray] | None:
        if key not in self._laws:
            p = class_p(self.case, *key)
            self._laws[key] = (
                None if key in self.tested or int((p > 0).sum()) < 2
                else (p, mass_before(p / p.sum()))
            )
        return self._laws[key]

    def transform(
        self, depth: np.ndarray, token: np.ndarray, emitted: np.ndarray,
        rng: np.random.Generator,
    ) -> tuple[np.ndarray, int]:
        """The PIT values of the pooled observations among ``(depth, token, emitted)`` (each
        ``[M]`` int64, :func:`visited_classes`' order), with the next ``rng`` uniform for every
        observation, pooled or not: the uniform an observation gets depends only on how many
        came before it, never on its own token, so u stays exactly U(0, 1) given the past.

        Returns:
            (``[m]`` float64 u values, the number of classes they came from).
        """
        uniforms = rng.random(emitted.size)
        vocab = self.case.vocab_size
        keys, inverse = np.unique(np.stack([depth, token], axis=1), axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        before = np.zeros(emitted.size)
        mass = np.zeros(emitted.size)
        classes = 0
        in_vocab = (emitted >= 0) & (emitted < vocab)
        for index, (d, x) in enumerate(keys.tolist()):
            law = self._law((int(d), int(x)))
            if law is None:
                continue
            chosen = (inverse == index) & in_vocab
            p, cumulative = law
            before[chosen] = cumulative[emitted[chosen]]
            mass[chosen] = p[emitted[chosen]] / p.sum()
            classes += bool(chosen.any())
        pooled = mass > 0
        return randomized_pit(before[pooled], mass[pooled], uniforms[pooled]), classes
