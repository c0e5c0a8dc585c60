"""The tree checks (``losslessness.checks.tree_*``): each passes on the reference tree verifier and
fails on a hand-written wrong verifier defined here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from losslessness.batteries import default_greedy_tree_battery, default_tree_battery
from losslessness.batteries.tree import (
    CALL_CELLS,
    TABLE_CELLS,
    tree_case_in_dtype,
    tree_cases_at_vocab,
)
from losslessness.cases import TreeCase
from losslessness.checks import (
    check_tree_acceptance,
    check_tree_greedy,
    check_tree_independence,
    check_tree_law,
    check_tree_structure,
)
from losslessness.checks import tree_assertions as tree_assertions_module
from losslessness.checks.tree_assertions import class_p, tree_assertions
from losslessness.engine.draw import sample_tree
from losslessness.protocol import PLACEHOLDER, InvalidInputError, TreeOutput
from losslessness.reference import tree_laws as tree_laws_module
from losslessness.reference.tree import _verify_tree_validated, verify_tree, verify_tree_greedy
from losslessness.reference.tree_laws import TreeLaws
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.zoo import tree as tree_zoo

ALPHA = 1e-3


def _context(case_id: str) -> CheckContext:
    return CheckContext("test", case_id, "", "hash", ALPHA, 0.8, 0.05, 0)


def _case(case_id: str) -> TreeCase:
    return next(case for case in default_tree_battery() if case.case_id == case_id)


def _star_iid_verifier(mode: str):  # type: ignore[no-untyped-def]
    """An iid multi-draft verifier for stars (every node a child of the root), vectorised, with
    one deliberate defect:

    - ``"original-p"``: every sibling is verified against the root's original p (the residual
      is never updated after a rejection) and the final token is drawn from p;
    - ``"parent-row"``: siblings verified correctly, but the token after an accepted draft (the
      bonus at the leaf) is drawn from the parent's (the root's) p row instead of the leaf's.
    """

    def verify(target, draft, parents, token_ids, scheme, generator):  # type: ignore[no-untyped-def]
        batch, nodes = token_ids.shape
        assert bool((parents == 0).all()), "stars only"
        uniforms = torch.rand((batch, nodes), generator=generator, dtype=torch.float64)
        rows = torch.arange(batch)
        residual = target[:, 0].clone()
        q = draft[:, 0]
        chosen = torch.full((batch,), PLACEHOLDER, dtype=torch.int64)
        for j in range(nodes):
            x = token_ids[:, j]
            trying = chosen < 0
            ratio = residual[rows, x] / q[rows, x]
            accept = trying & (uniforms[:, j] < ratio)
            chosen = torch.where(accept, torch.full_like(chosen, j + 1), chosen)
            if mode != "original-p":
                updated = torch.clamp(residual - q, min=0)
                updated = updated / updated.sum(dim=1, keepdim=True).clamp(min=1e-300)
                residual = torch.where((trying & ~accept).unsqueeze(1), updated, residual)
        moved = chosen > 0
        leaf_p = target[rows, chosen.clamp(min=0)]
        if mode == "parent-row":
            leaf_p = target[:, 0]
        law = torch.where(moved.unsqueeze(1), leaf_p, residual)
        drawn = torch.multinomial(law, 1, generator=generator)[:, 0]
        first = torch.where(moved, token_ids[rows, (chosen - 1).clamp(min=0)], drawn)
        second = torch.where(moved, drawn, torch.full_like(drawn, PLACEHOLDER))
        return TreeOutput(torch.stack([first, second], 1),
                          torch.where(moved, chosen, PLACEHOLDER).unsqueeze(1))

    return verify


def _off_tree_verifier(target, draft, parents, token_ids, scheme, generator):  # type: ignore[no-untyped-def]
    """The reference, except that a row accepting two or more nodes reports its first accepted
    node again at the second position (a path that is not in the tree)."""
    output = verify_tree(target, draft, parents, token_ids, scheme, generator)
    nodes = output.accepted_nodes.clone()
    tokens = output.tokens.clone()
    two = nodes[:, 1] > 0
    nodes[two, 1] = nodes[two, 0]
    tokens[two, 1] = tokens[two, 0]
    return TreeOutput(tokens, nodes)


def _shared_randomness_verifier(target, draft, parents, token_ids, scheme, generator):  # type: ignore[no-untyped-def]
    """The reference's algorithm with one set of uniforms for the whole call: every row reuses
    row 0's accept and sampling uniforms (a batch-wide random stream)."""
    batch, nodes = token_ids.shape
    accept_u = torch.rand((1, nodes), generator=generator, dtype=torch.float64)
    sample_u = torch.rand((1,), generator=generator, dtype=torch.float64)
    return _verify_tree_validated(target, draft, parents, token_ids, scheme,
                                  accept_u.expand(batch, -1), sample_u.expand(batch))


def _verdicts(results: list[CheckResult]) -> set[Verdict]:
    return {result.verdict for result in results}


def test_structure_passes_on_the_reference_and_shows_the_row_of_an_off_tree_path() -> None:
    """tree.structure is PASS for every reference row and LOSSY, with the offending row (its
    tree, accepted nodes and tokens) in the message and details, for a path not in the tree."""
    case = _case("tree-binary-iid")
    good = check_tree_structure(sample_tree(verify_tree, case, 1024, 1), _context(case.case_id))
    assert good.verdict is Verdict.PASS
    bad = check_tree_structure(sample_tree(_off_tree_verifier, case, 1024, 1),
                               _context(case.case_id))
    assert bad.verdict is Verdict.LOSSY
    assert "root-to-node path" in bad.message
    row = bad.details["first_row"]
    assert row["accepted_nodes"][0] == row["accepted_nodes"][1] > 0
    assert str(row["accepted_nodes"]) in bad.message


def test_structure_flags_out_of_range_ids_missing_final_tokens_and_bad_padding() -> None:
    """Each structural rule is exact: one malformed row among correct ones is LOSSY."""
    case = _case("tree-star2-iid")
    samples = sample_tree(verify_tree, case, 256, 3)
    for corrupt, rule in (
        (lambda s: s.tokens.__setitem__((5, 0), case.vocab_size), "outside [0, V)"),
        (lambda s: s.tokens.__setitem__((5, slice(None)), PLACEHOLDER), "final token"),
        (lambda s: s.accepted_nodes.__setitem__((5, 0), 99), "outside 1..N"),
    ):
        broken = sample_tree(verify_tree, case, 256, 3)
        corrupt(broken)
        result = check_tree_structure(broken, _context(case.case_id))
        assert result.verdict is Verdict.LOSSY and rule in result.message
    assert check_tree_structure(samples, _context(case.case_id)).verdict is Verdict.PASS


@pytest.mark.parametrize("mode", ["original-p", "parent-row"])
def test_law_passes_on_the_reference_and_is_lossy_for_a_wrong_residual(mode: str) -> None:
    """tree.law: every statistical class PASSes on the reference; verifying siblings against the
    original p, or drawing the final token from the parent's row, is LOSSY."""
    case = _case("tree-star2-iid")
    good = check_tree_law(sample_tree(verify_tree, case, 4096, 5), _context(case.case_id))
    assert _verdicts(good) == {Verdict.PASS}
    assert any(r.alpha == ALPHA and np.isfinite(r.min_detectable_tv) for r in good)
    bad = check_tree_law(sample_tree(_star_iid_verifier(mode), case, 4096, 5),
                         _context(case.case_id))
    assert Verdict.LOSSY in _verdicts(bad)


def test_law_tests_the_classes_a_caller_names_in_order_and_the_rest_exactly() -> None:
    """Given classes (the property suite's design), tree.law identity-tests exactly those, in
    the order given, and covers every other reached class by the exact part."""
    case = _case("tree-binary-iid")
    samples = sample_tree(verify_tree, case, 2048, 4)
    assertions = tree_assertions(case)
    named = list(reversed(assertions.classes[:2]))
    results = check_tree_law(samples, _context(case.case_id), named)
    statistical = [r for r in results if r.kind is CheckKind.STATISTICAL]
    assert [(r.details["depth"], r.details["token"]) for r in statistical] == [
        (c.depth, c.token) for c in named
    ]
    exact = [r for r in results if r.details.get("exact_only")]
    assert len(exact) == 1 and exact[0].details["classes"] >= len(assertions.classes) - 2
    assert _verdicts(results) == {Verdict.PASS}


def test_law_catches_a_zero_mass_token_exactly() -> None:
    """A token with p = 0 at its node is LOSSY (exact part of tree.law)."""
    case = _case("tree-zeros-iid")
    samples = sample_tree(verify_tree, case, 512, 2)
    assert _verdicts(check_tree_law(samples, _context(case.case_id))) == {Verdict.PASS}
    zero = int(np.flatnonzero(case.root_target.numpy() == 0)[0])
    samples.tokens[0, 0] = zero
    samples.accepted_nodes[0, :] = PLACEHOLDER
    samples.tokens[0, 1:] = PLACEHOLDER
    assert Verdict.LOSSY in _verdicts(check_tree_law(samples, _context(case.case_id)))


def _single_draft_case() -> TreeCase:
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    table = torch.full((1, 3, 3), 1 / 3, dtype=torch.float64)
    return TreeCase("single-draft", "one iid draft, V=3", (0,), p, q, table, table, "iid", 128)


def _single_draft_laws(case: TreeCase) -> TreeLaws:
    rate = float(torch.minimum(case.root_target, case.root_draft).sum())
    return TreeLaws(torch.tensor([1.0, rate]), torch.tensor([1.0, rate]), rate, rate)


def _always_accept(target, draft, parents, token_ids, scheme, generator):  # type: ignore[no-untyped-def]
    bonus = torch.multinomial(target[:, 1], 1, generator=generator)[:, 0]
    return TreeOutput(torch.stack([token_ids[:, 0], bonus], 1), token_ids[:, :1] * 0 + 1)


def _never_accept(target, draft, parents, token_ids, scheme, generator):  # type: ignore[no-untyped-def]
    final = torch.multinomial(target[:, 0], 1, generator=generator)[:, 0]
    pad = torch.full_like(final, PLACEHOLDER)
    return TreeOutput(torch.stack([final, pad], 1), pad.unsqueeze(1))


def test_acceptance_pass_lossy_above_the_bound_suboptimal_below_the_exact_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tree.acceptance against exact laws (a single draft: depth_reach[1] = root_bound =
    sum min(p, q)): the reference PASSes, accepting every draft is LOSSY (above the lossless
    bound), never accepting (lossless: it emits p) is SUBOPTIMAL."""
    monkeypatch.setattr(tree_laws_module, "exact_tree_laws", _single_draft_laws)
    case = _single_draft_case()
    assert tree_assertions(case).acceptance_depths == (1,)
    outcomes = {}
    for name, verifier in (("ref", verify_tree), ("all", _always_accept),
                           ("none", _never_accept)):
        results = check_tree_acceptance(sample_tree(verifier, case, 2048, 9), _context("c"))
        assert len(results) == 1 and results[0].alpha == ALPHA
        outcomes[name] = results[0].verdict
    assert outcomes == {"ref": Verdict.PASS, "all": Verdict.LOSSY, "none": Verdict.SUBOPTIMAL}
    never = sample_tree(_never_accept, case, 2048, 9)
    assert _verdicts(check_tree_law(never, _context("c"))) == {Verdict.PASS}


def test_acceptance_is_skipped_with_the_reason_when_exact_laws_are_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No exact laws (not implemented, or over the cap): no acceptance assertion is counted
    and the result is SKIPPED naming why."""

    def unavailable(case: TreeCase) -> TreeLaws:
        raise ValueError("over the cap")

    monkeypatch.setattr(tree_laws_module, "exact_tree_laws", unavailable)
    case = _single_draft_case()
    assert tree_assertions(case).count(("tree.acceptance",)) == 0
    [result] = check_tree_acceptance(sample_tree(verify_tree, case, 64, 0), _context("c"))
    assert result.verdict is Verdict.SKIPPED and "over the cap" in result.message


def test_independence_passes_on_the_reference_and_is_lossy_for_shared_randomness() -> None:
    """tree.independence: paired trees of one call are independent under the reference and
    dependent when every row of a call reuses the same uniforms."""
    case = _case("tree-dup-v3-iid")
    good = check_tree_independence(sample_tree(verify_tree, case, 2048, 4),
                                   _context(case.case_id))
    assert _verdicts(good) == {Verdict.PASS}
    bad = check_tree_independence(sample_tree(_shared_randomness_verifier, case, 2048, 4),
                                  _context(case.case_id))
    assert _verdicts(bad) == {Verdict.LOSSY}


def _highest_index_greedy(target_logits, parents, token_ids):  # type: ignore[no-untyped-def]
    """Greedy tree verification that, at the root, reports the highest-index child among
    duplicate siblings matching the argmax (the reference takes the lowest)."""
    out = verify_tree_greedy(target_logits, parents, token_ids)
    nodes = out.accepted_nodes.clone()
    for b in range(nodes.shape[0]):
        if nodes[b, 0] < 0:
            continue
        token = int(out.tokens[b, 0])
        matching = [j + 1 for j in range(parents.shape[1])
                    if int(parents[b, j]) == 0 and int(token_ids[b, j]) == token]
        nodes[b, 0] = max(matching)
    return TreeOutput(out.tokens, nodes)


def test_greedy_passes_any_duplicate_choice_flags_early_stops_and_wrong_tokens() -> None:
    """tree.greedy checks greedy decoding, not one walk: the reference PASSes every battery
    case, and so does a walk into the highest-index child among duplicate siblings (a real
    model gives both the same logits); stopping at the first child only is SUBOPTIMAL; a final
    token from the parent's row and the first matching path's tokens are LOSSY."""
    cases = default_greedy_tree_battery()
    expected = {
        verify_tree_greedy: Verdict.PASS,
        tree_zoo.greedy_highest_index_match: Verdict.PASS,
        tree_zoo.greedy_first_child_only: Verdict.SUBOPTIMAL,
        tree_zoo.greedy_final_from_parent: Verdict.LOSSY,
        tree_zoo.greedy_first_matching_path: Verdict.LOSSY,
    }
    for verifier, verdict in expected.items():
        verdicts = set()
        for case in cases:
            out = verifier(case.target_logits, case.parents, case.token_ids)
            result = check_tree_greedy(out.tokens.numpy(), out.accepted_nodes.numpy(), case,
                                       _context(case.case_id))
            verdicts.add(result.verdict)
        worst = Verdict.LOSSY if Verdict.LOSSY in verdicts else (
            Verdict.SUBOPTIMAL if Verdict.SUBOPTIMAL in verdicts else Verdict.PASS)
        assert worst is verdict, (verifier, verdicts)


def test_greedy_shows_the_first_bad_tree() -> None:
    """A LOSSY tree.greedy result names the first bad tree, why, and what greedy tree
    verification gives there."""
    case = next(c for c in default_greedy_tree_battery() if "duplicates" in c.tags)
    out = _highest_index_greedy(case.target_logits, case.parents, case.token_ids)
    result = check_tree_greedy(out.tokens.numpy(), out.accepted_nodes.numpy(), case,
                               _context(case.case_id))
    assert result.verdict is Verdict.LOSSY
    assert "First: tree" in result.message and "greedy tree verification gives" in result.message
    row = result.details["first_row"]
    expected = verify_tree_greedy(case.target_logits, case.parents, case.token_ids)
    assert row["tokens"] == out.tokens[row["tree"]].tolist()
    assert row["greedy_tokens"] == expected.tokens[row["tree"]].tolist()
    assert row["reason"] and row["reason"] in result.message


def test_pilot_assertions_are_deterministic_and_cached_by_case_hash() -> None:
    """The assertions a case makes depend on the case alone: two builds of the battery give the
    same classes (the budget is fixed before sampling)."""
    first = tree_assertions(default_tree_battery()[0])
    tree_assertions_module._ASSERTIONS.clear()
    tree_assertions_module._PILOTS.clear()
    second = tree_assertions(default_tree_battery()[0])
    assert [(c.depth, c.token, c.statistical) for c in first.classes] == [
        (c.depth, c.token, c.statistical) for c in second.classes
    ]
    assert first.count() == second.count() > 0


def test_tree_law_at_v1024_passes_the_reference_and_catches_the_top_10_residual() -> None:
    """tree.law at a real vocabulary (the battery's V = 1024 star, cells of small expected count
    pooled): the reference PASSes every class; sampling the residual among the target's top 10
    only (``tree-residual-top-10-only``) is LOSSY; the exact top-k fast path PASSes."""
    case = _case("tree-star4-v1024-iid")
    assert case.vocab_size == 1024
    good = check_tree_law(sample_tree(verify_tree, case, 2048, 5), _context(case.case_id))
    assert _verdicts(good) == {Verdict.PASS}
    assert any(r.details.get("pooled_cells", 0) > 0 for r in good)
    bad = check_tree_law(sample_tree(tree_zoo.residual_top_10_only, case, 2048, 5),
                         _context(case.case_id))
    assert Verdict.LOSSY in _verdicts(bad)
    exact = check_tree_law(sample_tree(tree_zoo.exact_top_k_fast_path, case, 2048, 5),
                           _context(case.case_id))
    assert _verdicts(exact) == {Verdict.PASS}


@pytest.mark.parametrize("vocab", [4, 1024, pytest.param(152_064, marks=pytest.mark.slow)])
def test_tree_cases_at_vocab_build_every_scheme_within_memory_and_verify(vocab: int) -> None:
    """tree_cases_at_vocab(V): 15 cases at V (every shape under every scheme, deterministic
    hashes), tables of at most TABLE_CELLS cells per depth and calls of at most CALL_CELLS
    input cells, so V = 152k (Qwen2's vocabulary, marked slow: about 20 s) builds in
    memory; the reference verifies one call of each without an emitted id outside [0, V)."""
    cases = tree_cases_at_vocab(vocab)
    assert len(cases) == 15 and {c.draft_scheme for c in cases} == {"iid", "without-replacement",
                                                                    "top-k"}
    assert all(c.vocab_size == vocab for c in cases)
    assert [c.case_hash for c in cases] == [c.case_hash for c in tree_cases_at_vocab(vocab)]
    for case in cases:
        assert case.target_table[0].numel() <= max(TABLE_CELLS, vocab)
        assert case.batch_size * (case.n_nodes + 1) * vocab <= max(
            CALL_CELLS, 2 * (case.n_nodes + 1) * vocab
        )
        samples = sample_tree(verify_tree, case, case.batch_size, 1)
        emitted = samples.tokens[samples.tokens >= 0]
        assert emitted.size and int(emitted.max()) < vocab


def test_tree_cases_at_vocab_rejects_a_vocabulary_smaller_than_a_sibling_group() -> None:
    """V < 4 cannot draft the EAGLE-like root's 4 siblings without replacement: ValueError
    naming vocab_size."""
    with pytest.raises(ValueError, match="vocab_size"):
        tree_cases_at_vocab(3)


def test_token_rows_share_table_rows_and_must_index_them() -> None:
    """A TreeCase with ``token_rows`` reads p and q of token x from row ``token_rows[x]`` (the
    inputs and the law check's class p agree), and a row index outside the tables raises
    InvalidInputError naming token_rows."""
    case = next(c for c in tree_cases_at_vocab(64) if c.case_id == "tree-chain-v64-iid")
    ids = case.draw_trees(3, torch.Generator().manual_seed(0))
    target, _ = case.inputs(ids)
    token = int(ids[0, 0])
    row = int(case.token_rows[token])  # type: ignore[index]
    assert torch.equal(target[0, 1], case.target_table[0, row])
    assert np.array_equal(class_p(case, 1, token), case.target_table[0, row].numpy())
    with pytest.raises(InvalidInputError, match="token_rows"):
        TreeCase("bad", "bad", case.parents, case.root_target, case.root_draft,
                 case.target_table, case.draft_table, case.draft_scheme,
                 token_rows=torch.full((64,), 10_000, dtype=torch.int64))


def test_tree_case_in_float32_gives_float32_inputs_and_the_reference_passes_its_laws() -> None:
    """tree_case_in_dtype(case, float32): the verifier receives float32 p and q equal to the
    case's tables (the exact laws are those values), the reference PASSes tree.law on the V =
    1024 star; float64 returns the case itself; bfloat16 raises InvalidInputError naming
    input_dtype (its rows miss the protocol's row-sum tolerance)."""
    case = _case("tree-star4-v1024-iid")
    assert tree_case_in_dtype(case, torch.float64) is case
    single = tree_case_in_dtype(case, torch.float32)
    ids = single.draw_trees(4, torch.Generator().manual_seed(0))
    target, draft = single.inputs(ids)
    assert target.dtype == draft.dtype == torch.float32
    assert torch.equal(target[:, 0].double(), single.root_target.expand(4, -1))
    assert single.case_hash != case.case_hash
    results = check_tree_law(sample_tree(verify_tree, single, 2048, 5),
                             _context(single.case_id))
    assert _verdicts(results) == {Verdict.PASS}
    with pytest.raises(InvalidInputError, match="input_dtype"):
        tree_case_in_dtype(case, torch.bfloat16)


def test_pooled_pit_law_sees_a_law_error_beyond_depth_1_that_no_class_test_sees() -> None:
    """The pooled PIT assertion (issue 21's remaining tree weakness): on the battery's EAGLE-like
    V = 1024 tree, whose nodes beyond the root split into classes too rare for an identity test
    of their own, the reference PASSes every law result; cutting the law at depth >= 2 to its
    top 10 (``tree-deep-nodes-top-10-only``) leaves every per-class identity test and the exact
    part passing and is LOSSY by the pooled test alone (4096 trees, fixed seeds)."""
    case = _case("tree-eagle-v1024-topk")
    assertions = tree_assertions(case)
    assert assertions.pooled and assertions.count(("tree.law",)) == 1 + sum(
        c.statistical for c in assertions.classes
    )
    good = check_tree_law(sample_tree(verify_tree, case, 4096, 5), _context(case.case_id))
    assert _verdicts(good) == {Verdict.PASS}
    pooled = [r for r in good if r.details.get("pit")]
    assert len(pooled) == 1 and pooled[0].n > 1000 and pooled[0].min_detectable_tv < 0.1
    bad = check_tree_law(sample_tree(tree_zoo.deep_nodes_top_10_only, case, 4096, 5),
                         _context(case.case_id))
    lossy = [r for r in bad if r.verdict is Verdict.LOSSY]
    assert [r.details.get("pit") for r in lossy] == [True], [r.message for r in lossy]


def test_pooled_pit_law_is_only_in_the_audits_design() -> None:
    """A caller naming its classes (the property suite) gets no pooled test; a case whose rare
    classes are reached less than ``POOLED_REACH_FLOOR`` times per step makes none."""
    case = _case("tree-eagle-iid")
    samples = sample_tree(verify_tree, case, 1024, 4)
    named = [c for c in tree_assertions(case).classes if c.statistical]
    assert not any(r.details.get("pit") for r in check_tree_law(samples, _context("x"), named))
    assert any(r.details.get("pit") for r in check_tree_law(samples, _context("x")))
    zeros = _case("tree-zeros-topk")
    assert tree_assertions(zeros).pooled_reach < tree_assertions_module.POOLED_REACH_FLOOR
    assert not tree_assertions(zeros).pooled
