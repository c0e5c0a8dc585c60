"""The reference tree verifiers (losslessness.reference.tree): input validation naming the
argument, a chain as a tree equal to the chain references, the emitted tokens' law, and the
TreeOutput invariants.

Law tests: Pearson chi-square goodness of fit at significance ALPHA = 1e-3 with fixed seeds
(cells with expected count < 5 pooled), on 40,000 verified trees; each law test also runs the
same statistic on a wrong law (q instead of p) and requires a rejection, so it can fail.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from scipy import stats

from losslessness.cases import TreeCase
from losslessness.protocol import PLACEHOLDER, InvalidInputError, TreeOutput, sample_siblings
from losslessness.reference import verify, verify_greedy
from losslessness.reference.tree import verify_tree, verify_tree_greedy
from tests.reference.tree_helpers import dirichlet, random_tree_case, run_case

ALPHA = 1e-3
COUNT = 40_000
SCHEMES = ("iid", "without-replacement", "top-k")


def _valid_inputs(
    scheme: str = "iid", vocab: int = 6, batch: int = 3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """target, draft ``[B, 5, V]``, parents ``[B, 4]`` (0, 0, 1, 1), token ids drafted per
    ``scheme``."""
    generator = torch.Generator().manual_seed(0)
    target = dirichlet((batch, 5, vocab), generator)
    draft = dirichlet((batch, 5, vocab), generator)
    parents = torch.tensor([[0, 0, 1, 1]] * batch)
    ids = torch.zeros((batch, 4), dtype=torch.int64)
    ids[:, :2] = sample_siblings(draft[:, 0], 2, scheme, generator)
    ids[:, 2:] = sample_siblings(draft[:, 1], 2, scheme, generator)
    return target, draft, parents, ids


def _call(target: torch.Tensor, draft: torch.Tensor, parents: torch.Tensor, ids: torch.Tensor,
          scheme: str = "iid", generator: object = None) -> TreeOutput:
    gen = torch.Generator().manual_seed(0) if generator is None else generator
    return verify_tree(target, draft, parents, ids, scheme, gen)  # type: ignore[arg-type]


def _bad_trees() -> list[tuple[str, Callable[[], object], str]]:
    """(what, a call that must fail, the argument it must name)."""
    t, d, p, i = _valid_inputs()
    cases: list[tuple[str, Callable[[], object], str]] = []

    def with_parents(parents: list[int]) -> Callable[[], object]:
        tree = p.clone()
        tree[1] = torch.tensor(parents)
        return lambda: _call(t, d, tree, i)

    cases.append(("parent equal to its own index", with_parents([0, 2, 1, 1]), "parents"))
    cases.append(("cycle 1 <-> 2", with_parents([2, 1, 1, 1]), "parents"))
    cases.append(("parent out of range", with_parents([0, 0, 1, 9]), "parents"))
    cases.append(("negative parent", with_parents([0, -1, 1, 1]), "parents"))
    no_law = d.clone()
    no_law[0, 1] = 0.0
    cases.append(("siblings without a draft law", lambda: _call(t, no_law, p, i), "draft_probs"))
    half_law = d.clone()
    half_law[2, 0] *= 0.5
    cases.append(("root draft law not summing to 1", lambda: _call(t, half_law, p, i),
                  "draft_probs"))
    zero_q = d.clone()
    zero_q[0, 0, int(i[0, 0])] = 0.0
    zero_q[0, 0] /= zero_q[0, 0].sum()
    cases.append(("drafted token with q = 0", lambda: _call(t, zero_q, p, i), "token_ids"))
    for scheme in ("without-replacement", "top-k"):
        ts, ds, ps, dup = _valid_inputs(scheme)
        dup = dup.clone()
        dup[0, 1] = dup[0, 0]
        cases.append((f"duplicate siblings under {scheme}",
                      lambda ts=ts, ds=ds, ps=ps, dup=dup, scheme=scheme:
                      _call(ts, ds, ps, dup, scheme), "token_ids"))
    tk, dk, pk, ik = _valid_inputs("top-k")
    not_top = ik.clone()
    not_top[0, 0] = int(torch.argsort(dk[0, 0])[0])  # the least likely token
    cases.append(("non-top-k sibling under top-k", lambda: _call(tk, dk, pk, not_top, "top-k"),
                  "token_ids"))
    cases.append(("N = 0", lambda: _call(t[:, :1], d[:, :1], p[:, :0], i[:, :0]), "parents"))
    cases.append(("draft shape differs", lambda: _call(t, d[:, :, :5], p, i), "draft_probs"))
    cases.append(("node count differs", lambda: _call(t, d, p[:, :3], i[:, :3]), "parents"))
    cases.append(("token ids shape differs", lambda: _call(t, d, p, i[:, :3]), "token_ids"))
    cases.append(("batch differs", lambda: _call(t, d, p[:2], i[:2]), "parents"))
    big = i.clone()
    big[0, 0] = 6
    cases.append(("token id outside the vocabulary", lambda: _call(t, d, p, big), "token_ids"))
    cases.append(("target not a distribution", lambda: _call(t * 2, d, p, i), "target_probs"))
    nan_target, nan_draft = t.clone(), d.clone()
    nan_target[0, 1, 0] = float("nan")
    nan_draft[0, 0, 0] = float("nan")
    cases.append(("NaN in target_probs", lambda: _call(nan_target, d, p, i), "target_probs"))
    cases.append(("NaN in draft_probs", lambda: _call(t, nan_draft, p, i), "draft_probs"))
    negative = i.clone()
    negative[0, 0] = -1
    cases.append(("negative token id", lambda: _call(t, d, p, negative), "token_ids"))
    cases.append(("unknown scheme", lambda: _call(t, d, p, i, "beam"), "draft_scheme"))
    cases.append(("generator of the wrong type", lambda: _call(t, d, p, i, "iid", 3),
                  "generator"))
    return cases


@pytest.mark.parametrize("index", range(len(_bad_trees())),
                         ids=[what for what, _, _ in _bad_trees()])
def test_verify_tree_rejects_bad_input_naming_the_argument(index: int) -> None:
    """Every malformed call the issue lists raises InvalidInputError naming the argument."""
    _, call, argument = _bad_trees()[index]
    with pytest.raises(InvalidInputError) as error:
        call()
    assert error.value.argument == argument


@pytest.mark.parametrize(
    ("parents", "argument"),
    [([[0, 2, 1]], "parents"), ([[0, 0, 7]], "parents"), ([[0, -1, 1]], "parents")],
    ids=["not-smaller", "out-of-range", "negative"],
)
def test_verify_tree_greedy_rejects_bad_trees(parents: list[list[int]], argument: str) -> None:
    """The greedy tree verifier validates the tree the same way."""
    logits = torch.randn(1, 4, 5, generator=torch.Generator().manual_seed(0))
    with pytest.raises(InvalidInputError) as error:
        verify_tree_greedy(logits, torch.tensor(parents), torch.tensor([[1, 2, 3]]))
    assert error.value.argument == argument


def test_greedy_tree_rejects_n_zero_and_token_out_of_range() -> None:
    """N = 0 names parents; a token id >= V names token_ids."""
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    with pytest.raises(InvalidInputError) as error:
        verify_tree_greedy(logits[:, :1], torch.zeros((2, 0), dtype=torch.int64),
                           torch.zeros((2, 0), dtype=torch.int64))
    assert error.value.argument == "parents"
    with pytest.raises(InvalidInputError) as error:
        verify_tree_greedy(logits, torch.tensor([[0, 1]] * 2), torch.tensor([[0, 5]] * 2))
    assert error.value.argument == "token_ids"


@pytest.mark.parametrize(("k", "vocab", "shared"), [(1, 4, False), (4, 6, False), (3, 32, True),
                                                    (5, 2, False)])
def test_a_chain_as_a_tree_equals_the_chain_reference(k: int, vocab: int, shared: bool) -> None:
    """parents = 0, 1, .., k-1 under iid gives exactly the chain reference's tokens for the same
    generator (distinct and shared rows), and the accepted nodes are 1..m."""
    batch = 2000
    generator = torch.Generator().manual_seed(k * vocab)
    p = dirichlet((batch, k + 1, vocab), generator, 0.5)
    q = dirichlet((batch, k + 1, vocab), generator, 0.5)
    if shared:
        p, q = p[:1].expand(batch, -1, -1), q[:1].expand(batch, -1, -1)
    ids = torch.stack([torch.multinomial(q[:, i], 1, generator=generator).squeeze(1)
                       for i in range(k)], dim=1)
    parents = torch.arange(k).expand(batch, -1)
    chain = verify(p, q[:, :k], ids, torch.Generator().manual_seed(1))
    tree = verify_tree(p, q, parents, ids, "iid", torch.Generator().manual_seed(1))
    assert torch.equal(tree.tokens, chain)
    lengths = (chain >= 0).sum(dim=1) - 1
    expected = torch.where(torch.arange(k) < lengths.unsqueeze(1), torch.arange(1, k + 1),
                           PLACEHOLDER)
    assert torch.equal(tree.accepted_nodes, expected)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_tree_on_a_chain_equals_greedy_chain_verification(k: int) -> None:
    """verify_tree_greedy on a chain equals verify_greedy (ties and -inf included)."""
    generator = torch.Generator().manual_seed(k)
    logits = torch.randint(0, 3, (500, k + 1, 4), generator=generator).to(torch.float64)
    logits[:, :, 3] = float("-inf")
    ids = torch.randint(0, 4, (500, k), generator=generator)
    tree = verify_tree_greedy(logits, torch.arange(k).expand(500, -1), ids)
    assert torch.equal(tree.tokens, verify_greedy(logits, ids))


def _chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson goodness of fit, pooling cells whose expected count is below 5."""
    total = float(observed.sum())
    expected = expected_probs.to(torch.float64) * total
    small = expected < 5
    obs = observed.to(torch.float64)
    if bool(small.any()):
        obs = torch.cat([obs[~small], obs[small].sum().reshape(1)])
        expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    keep = expected > 0
    if bool((obs[~keep] > 0).any()):
        return 0.0
    obs, expected = obs[keep], expected[keep]
    if obs.numel() < 2:
        return 1.0
    statistic = float(((obs - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(statistic, obs.numel() - 1))


def _second_token_p_value(case: TreeCase, output: TreeOutput, law_table: torch.Tensor) -> float:
    """The second emitted token given that the first was an accepted depth-1 node with token x
    must follow ``law_table[x]``; one chi-square per x, combined by summing the statistics."""
    vocab = case.vocab_size
    moved = output.accepted_nodes[:, 0] >= 0
    first, second = output.tokens[moved, 0], output.tokens[moved, 1]
    statistic, dof = 0.0, 0
    for token in range(vocab):
        chosen = second[first == token]
        if chosen.numel() < 50:
            continue
        observed = torch.bincount(chosen, minlength=vocab).to(torch.float64)
        expected = law_table[token] * chosen.numel()
        small = expected < 5
        if bool((observed[expected == 0] > 0).any()):
            return 0.0
        obs = torch.cat([observed[~small], observed[small].sum().reshape(1)])
        exp = torch.cat([expected[~small], expected[small].sum().reshape(1)])
        keep = exp > 0
        statistic += float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
        dof += int(keep.sum()) - 1
    assert dof > 0
    return float(stats.chi2.sf(statistic, dof))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_emitted_tokens_follow_the_target(scheme: str) -> None:
    """The first emitted token follows p at the root, and the second, given an accepted
    depth-1 node with token x, follows p at that node (target_table[0, x]); chi-square at
    ALPHA = 1e-3 on 40,000 trees (parents 0,0,0,1,1,2, V = 6). The same statistics reject q
    in place of p (power)."""
    case = random_tree_case((0, 0, 0, 1, 1, 2), 6, scheme, seed=41)
    _, output = run_case(case, COUNT, seed=42)
    first = torch.bincount(output.tokens[:, 0], minlength=case.vocab_size)
    assert _chi_square_p_value(first, case.root_target) > ALPHA
    assert _chi_square_p_value(first, case.root_draft) < ALPHA
    assert _second_token_p_value(case, output, case.target_table[0]) > ALPHA
    assert _second_token_p_value(case, output, case.draft_table[0]) < ALPHA


def _check_output_invariants(output: TreeOutput, parents: torch.Tensor, ids: torch.Tensor,
                             depth: int) -> None:
    tokens, accepted = output.tokens, output.accepted_nodes
    batch = ids.shape[0]
    assert tokens.dtype == torch.int64 and accepted.dtype == torch.int64
    assert tuple(tokens.shape) == (batch, depth + 1)
    assert tuple(accepted.shape) == (batch, depth)
    lengths = (accepted >= 0).sum(dim=1)
    positions = torch.arange(depth)
    # Left-aligned: accepted nodes first, then padding only.
    assert torch.equal(accepted >= 0, positions < lengths.unsqueeze(1))
    assert torch.equal(tokens >= 0, torch.arange(depth + 1) <= lengths.unsqueeze(1))
    assert bool(((tokens == PLACEHOLDER) | (tokens >= 0)).all())
    assert bool(((accepted == PLACEHOLDER) | (accepted >= 1)).all())
    for b in range(batch):
        node = 0
        for position in range(int(lengths[b])):
            child = int(accepted[b, position])
            assert int(parents[b, child - 1]) == node  # a path from the root
            assert int(tokens[b, position]) == int(ids[b, child - 1])
            node = child


@pytest.mark.parametrize("scheme", SCHEMES)
def test_tree_output_invariants(scheme: str) -> None:
    """Accepted nodes form a root path, tokens at accepted positions are the nodes' tokens,
    one final token follows, everything left-aligned and -1 padded, shapes [B, D+1]/[B, D]."""
    case = random_tree_case((0, 0, 1, 2, 2, 3, 5), 5, scheme, seed=61)
    ids, output = run_case(case, 600, seed=62)
    parents = case.parents_tensor.expand(600, -1)
    _check_output_invariants(output, parents, ids, case.depth)
    assert bool((output.accepted_nodes[:, 0] >= 0).any())


def test_rows_with_different_trees_and_greedy_invariants() -> None:
    """A batch whose rows have different trees (depth D of the deepest) keeps the invariants,
    for the sampling and the greedy verifier, and each row equals its own single-row call."""
    generator = torch.Generator().manual_seed(70)
    parents = torch.tensor([[0, 1, 2, 3], [0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 1, 2]] * 50)
    batch, vocab = parents.shape[0], 4
    target = dirichlet((batch, 5, vocab), generator)
    draft = dirichlet((batch, 5, vocab), generator)
    ids = torch.randint(0, vocab, (batch, 4), generator=generator)
    output = verify_tree(target, draft, parents, ids, "iid", torch.Generator().manual_seed(3))
    _check_output_invariants(output, parents, ids, 4)
    greedy = verify_tree_greedy(target.log(), parents, ids)
    _check_output_invariants(greedy, parents, ids, 4)
    for b in (0, 1, 2, 3):
        alone = verify_tree_greedy(target[b:b + 1].log(), parents[b:b + 1], ids[b:b + 1])
        width = alone.tokens.shape[1]
        assert torch.equal(alone.tokens[0], greedy.tokens[b, :width])


def test_an_empty_batch_gives_empty_outputs() -> None:
    """B = 0 passes validation and returns tokens [0, 1] and accepted nodes [0, 0] from both
    verifiers (it used to fail on the max of an empty depth tensor)."""
    empty = torch.zeros((0, 3, 4), dtype=torch.float64)
    tree = torch.zeros((0, 2), dtype=torch.int64)
    output = verify_tree(empty, empty, tree, tree, "iid", torch.Generator())
    assert tuple(output.tokens.shape) == (0, 1) and tuple(output.accepted_nodes.shape) == (0, 0)
    greedy = verify_tree_greedy(empty, tree, tree)
    assert tuple(greedy.tokens.shape) == (0, 1) and tuple(greedy.accepted_nodes.shape) == (0, 0)
