"""Exact tree laws (losslessness.reference.tree_laws) against Monte Carlo runs of the reference
tree verifier, the chain laws, and SpecTr's optimal-transport bound against its known sandwich
and an independent min-cut computation.

Monte Carlo tolerance: every node's reach is compared with ``COUNT`` = 40,000 verified trees
(fixed seeds) at ``Z_MAX`` = 4.5 binomial standard errors (a false alarm has probability about
7e-6 per node under the exact law).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from losslessness.cases import TreeCase
from losslessness.laws import chain_laws
from losslessness.protocol import InvalidInputError
from losslessness.reference.tree_laws import (
    CELL_CAP,
    OT_TUPLE_CAP,
    exact_tree_laws,
    ot_acceptance_bound,
    token_reach,
)
from tests.reference.tree_helpers import dirichlet, node_frequencies, random_tree_case, run_case

COUNT = 40_000
Z_MAX = 4.5
SCHEMES = ("iid", "without-replacement", "top-k")
SHAPES = {
    "chain3": (0, 1, 2),
    "star2": (0, 0),
    "star3": (0, 0, 0),
    "star4": (0, 0, 0, 0),
    "balanced": (0, 0, 1, 1, 2, 2),
    "mixed": (0, 0, 0, 1, 1, 2, 4),
}


def _max_z(exact: torch.Tensor, observed: torch.Tensor, count: int) -> float:
    se = (exact * (1 - exact) / count).sqrt().clamp(min=1.0 / count)
    return float(((observed - exact).abs() / se).max())


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_exact_reach_agrees_with_monte_carlo_of_the_reference(shape: str, scheme: str) -> None:
    """Every node's exact reach is within 4.5 standard errors of its frequency over 40,000
    drafted and verified trees (chains, stars n = 2..4, balanced and mixed trees, V = 5)."""
    case = random_tree_case(SHAPES[shape], 5, scheme, seed=sum(map(ord, shape + scheme)))
    laws = exact_tree_laws(case)
    _, output = run_case(case, COUNT, seed=7)
    observed = node_frequencies(output, case.n_nodes)
    assert _max_z(laws.reach, observed, COUNT) < Z_MAX
    accepted = (output.accepted_nodes >= 0).sum(dim=1).to(torch.float64)
    se = float(accepted.std()) / math.sqrt(COUNT)
    assert abs(float(accepted.mean()) - laws.expected_accepted) < Z_MAX * max(se, 1e-3)


@pytest.mark.parametrize("parents", [(0, 0, 0), (0, 0, 1, 1)], ids=["star3", "binary"])
def test_exact_reach_with_duplicate_iid_siblings_at_v2(parents: tuple[int, ...]) -> None:
    """With V = 2, iid siblings repeat tokens often; a repeated sibling after a rejection is
    never accepted (its residual is 0) and the exact reach still matches Monte Carlo."""
    case = random_tree_case(parents, 2, "iid", seed=3)
    laws = exact_tree_laws(case)
    ids, output = run_case(case, COUNT, seed=8)
    assert bool((ids[:, 0] == ids[:, 1]).any())
    assert _max_z(laws.reach, node_frequencies(output, case.n_nodes), COUNT) < Z_MAX


def test_laws_are_consistent_distributions() -> None:
    """reach[0] = depth_reach[0] = 1, depth_reach is non-increasing and sums the reach of each
    depth, expected_accepted = depth_reach[1:].sum(), and the root children's accepted-token
    mass never exceeds p at the root (a lossless verifier's necessary condition)."""
    for scheme in SCHEMES:
        case = random_tree_case(SHAPES["mixed"], 5, scheme, seed=11)
        laws = exact_tree_laws(case)
        assert float(laws.reach[0]) == 1.0 and float(laws.depth_reach[0]) == 1.0
        assert bool((laws.depth_reach[1:] <= laws.depth_reach[:-1] + 1e-12).all())
        for depth in range(case.depth + 1):
            mask = case.depths == depth
            assert float(laws.reach[mask].sum()) == pytest.approx(float(laws.depth_reach[depth]))
        assert laws.expected_accepted == pytest.approx(float(laws.depth_reach[1:].sum()))
        per_token = token_reach(case)
        root_children = [j for j, parent in enumerate(case.parents) if parent == 0]
        assert bool((per_token[root_children].sum(dim=0) <= case.root_target + 1e-12).all())


def test_chain_reach_equals_the_chain_acceptance() -> None:
    """A chain whose p and q do not depend on the drafted token (every table row the same at a
    depth) reaches node i with the chain's probability prod_{j<i} sum min(p_j, q_j)
    (losslessness.laws.chain_laws)."""
    generator = torch.Generator().manual_seed(5)
    k, vocab = 4, 6
    p = dirichlet((k + 1, vocab), generator)
    q = dirichlet((k, vocab), generator)
    case = TreeCase(
        case_id="chain", summary="token-independent chain", parents=tuple(range(k)),
        root_target=p[0], root_draft=q[0],
        target_table=p[1:, None, :].expand(k, vocab, vocab).clone(),
        # Depth k is the leaf: its draft row is never used (any distribution).
        draft_table=torch.cat([q[1:], q[:1]])[:, None, :].expand(k, vocab, vocab).clone(),
        draft_scheme="iid",
    )
    laws = exact_tree_laws(case)
    expected = chain_laws(p, q).reach
    torch.testing.assert_close(laws.reach, expected, rtol=1e-12, atol=1e-12)


def _min_cut_bound(p: torch.Tensor, q: torch.Tensor, n: int, scheme: str) -> float:
    """min over token sets S of p(S) + 1 - P(every draft in S): the max-flow/min-cut dual of
    the transport problem, by brute force over the 2^V sets and the V^n draft tuples."""
    vocab = p.shape[0]
    tuples = []
    for draft in itertools.product(range(vocab), repeat=n):
        if scheme == "iid":
            prob = math.prod(float(q[x]) for x in draft)
        elif len(set(draft)) < n:
            continue
        else:
            prob, left = 1.0, 1.0
            for x in draft:
                prob *= float(q[x]) / left
                left -= float(q[x])
        tuples.append((set(draft), prob))
    best = 1.0
    for size in range(vocab + 1):
        for subset in itertools.combinations(range(vocab), size):
            inside = set(subset)
            within = sum(prob for drafts, prob in tuples if drafts <= inside)
            best = min(best, float(p[list(subset)].sum()) + 1.0 - within)
    return best


@pytest.mark.parametrize("scheme", ["iid", "without-replacement"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_ot_bound_equals_the_min_cut_dual(scheme: str, n: int) -> None:
    """The linear program's optimum equals the min-cut form min_S p(S) + 1 - P(X in S^n)
    computed independently by brute force (V = 5, random p, q with a zero)."""
    generator = torch.Generator().manual_seed(20 + n)
    p = dirichlet((5,), generator)
    q = dirichlet((5,), generator)
    q[4] = 0.0
    q /= q.sum()
    bound = ot_acceptance_bound(p, q, n, scheme)
    assert bound == pytest.approx(_min_cut_bound(p, q, n, scheme), abs=1e-9)


def test_ot_bound_for_one_draft_is_the_overlap() -> None:
    """n = 1: the bound is the chain acceptance sum_y min(p(y), q(y)) (iid and without
    replacement coincide)."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(5):
        p, q = dirichlet((8,), generator), dirichlet((8,), generator)
        overlap = float(torch.minimum(p, q).sum())
        for scheme in ("iid", "without-replacement"):
            assert ot_acceptance_bound(p, q, 1, scheme) == pytest.approx(overlap, abs=1e-9)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_iid_reference_acceptance_is_below_the_bound_and_the_bound_below_its_envelope(
    n: int,
) -> None:
    """For iid drafts: P(the reference accepts a root child) <= the OT bound <=
    sum_y min(p(y), 1 - (1 - q(y))^n) (Sun et al. 2023), on random stars (V = 6)."""
    for seed in range(3):
        case = random_tree_case((0,) * n, 6, "iid", seed=100 + seed)
        laws = exact_tree_laws(case)
        acceptance = float(laws.reach[1:].sum())
        envelope = float(torch.minimum(
            case.root_target, 1 - (1 - case.root_draft) ** n).sum())
        assert acceptance <= laws.root_bound + 1e-9
        assert laws.root_bound <= envelope + 1e-9


@pytest.mark.parametrize("n", [2, 3, 4])
def test_without_replacement_bound_is_at_least_the_rrsw_acceptance(n: int) -> None:
    """Recursive rejection sampling without replacement (the reference) accepts a root child
    with probability at most the OT bound of drafts without replacement (V = 6)."""
    for seed in range(3):
        case = random_tree_case((0,) * n, 6, "without-replacement", seed=200 + seed)
        laws = exact_tree_laws(case)
        assert float(laws.reach[1:].sum()) <= laws.root_bound + 1e-9


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_top_k_bound_equals_the_top_k_reference_acceptance(n: int) -> None:
    """Top-k drafts are deterministic: the bound is p's mass on the top-n set of q, and the
    reference (sampling from the residual one candidate at a time) attains it exactly."""
    case = random_tree_case((0,) * n, 7, "top-k", seed=300 + n)
    laws = exact_tree_laws(case)
    top = torch.sort(case.root_draft, descending=True, stable=True).indices[:n]
    assert laws.root_bound == pytest.approx(float(case.root_target[top].sum()), abs=1e-12)
    assert float(laws.reach[1:].sum()) == pytest.approx(laws.root_bound, abs=1e-12)


def test_bound_is_one_when_the_target_is_the_draft() -> None:
    """p == q: the bound is 1 for iid and without-replacement drafts (n <= q's support), and
    for top-k drafts when the top-n set covers q's support."""
    generator = torch.Generator().manual_seed(9)
    q = dirichlet((6,), generator)
    for n in (1, 2, 3):
        for scheme in ("iid", "without-replacement"):
            assert ot_acceptance_bound(q, q, n, scheme) == pytest.approx(1.0, abs=1e-9)
    sparse_q = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0], dtype=torch.float64)
    assert ot_acceptance_bound(sparse_q, sparse_q, 3, "top-k") == pytest.approx(1.0)
    assert ot_acceptance_bound(sparse_q, sparse_q, 2, "top-k") == pytest.approx(0.8)


def test_caps_raise_value_errors_naming_v_and_n() -> None:
    """Beyond the caps both functions raise ValueError naming V and n (or N)."""
    case = random_tree_case((0, 0, 0, 0, 0), 64, "iid", seed=1)
    with pytest.raises(ValueError, match=r"V = 64, N = 5.*cap of " + str(CELL_CAP)):
        exact_tree_laws(case)
    p = torch.full((64,), 1 / 64, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"V = 64.*n = 4.*cap of " + str(OT_TUPLE_CAP)):
        ot_acceptance_bound(p, p, 4, "iid")


def test_ot_bound_rejects_bad_arguments() -> None:
    """n < 1, an unknown scheme, mismatched shapes and more drafts without replacement than
    q's support raise InvalidInputError naming the argument."""
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    q = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    cases = [
        ((p, q, 0, "iid"), "n_drafts"),
        ((p, q, 1, "beam"), "draft_scheme"),
        ((p, q[:2], 1, "iid"), "draft_probs"),
        ((p, q, 3, "without-replacement"), "n_drafts"),
        ((p, q, 4, "top-k"), "n_drafts"),
    ]
    for arguments, name in cases:
        with pytest.raises(InvalidInputError) as error:
            ot_acceptance_bound(*arguments)
        assert error.value.argument == name


@pytest.mark.parametrize("scheme", ["iid", "without-replacement"])
def test_ot_bound_is_unchanged_by_zero_padding_the_vocabulary(scheme: str) -> None:
    """Tokens with p = q = 0 change nothing: the bound on V = 5 equals the bound on the same
    laws padded to V = 70 (which aggregates draft sets row-wise instead of as bit masks)."""
    generator = torch.Generator().manual_seed(31)
    p, q = dirichlet((5,), generator), dirichlet((5,), generator)
    padded_p = torch.cat([torch.zeros(65, dtype=torch.float64), p])
    padded_q = torch.cat([torch.zeros(65, dtype=torch.float64), q])
    for n in (2, 3):
        assert ot_acceptance_bound(padded_p, padded_q, n, scheme) == pytest.approx(
            ot_acceptance_bound(p, q, n, scheme), abs=1e-9
        )
