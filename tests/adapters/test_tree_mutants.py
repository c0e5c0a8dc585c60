"""The tree mutant zoo: each lossy tree mutant's next-token law differs from p on its own case
(by an exact computation or a fixed-seed chi-square test), each greedy tree mutant's output
differs from :func:`verify_tree_greedy`, each control keeps the target law (or the greedy
output), and every entry resolves as ``mutant/tree-<name>``.

The law check conditions on reaching a node: given that the accepted path reached node n, the
next emitted token (an accepted child's token or the final token) must follow p at n. Nodes
with the same depth and token share p (the cases are Markov), so they are pooled into one class.
Seeds are fixed, so every verdict is reproducible.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from scipy import stats

from losslessness.cases import GreedyTreeCase, TreeCase
from losslessness.checks import check_tree_greedy
from losslessness.config import AuditConfig
from losslessness.engine import run_audit
from losslessness.protocol import InvalidInputError, TreeVerifier
from losslessness.reference.tree import verify_tree, verify_tree_greedy
from losslessness.results import CheckContext, TargetVerdict, Verdict
from losslessness.targets import resolve_adapter
from losslessness.zoo import MUTANT_PREFIX, MUTANTS, Mutant
from losslessness.zoo.tree import (
    TREE_PREFIX,
    TREE_ZOO,
    distinct_rule_on_replacement_drafts,
    replacement_rule_on_distinct_drafts,
)

TREES = 6_000
"""Trees drawn per sampled case for a lossy mutant (each mechanism's effect is TV >= 0.14 on a
class visited several hundred times at this size)."""

CONTROL_TREES = 10_000
"""Trees drawn per control case (the controls' and the reference's no-false-alarm checks)."""

SEED = 11
"""Seed of the drafted trees and of the verifier's randomness."""

LOSSY_ALPHA = 1e-6
"""Level of the chi-square test that declares a lossy mutant's law different from p."""

CONTROL_ALPHA = 1e-3
"""Family-wise level for a control (Bonferroni over its tested classes): a control fails only
if some class's chi-square p-value is below ``CONTROL_ALPHA / classes``."""

MIN_VISITS = 200
"""Classes reached fewer times are not tested (too few visits for the chi-square law)."""

@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread() -> Iterator[None]:
    """One torch thread: on the two shared cores intra-op threading of these small tensors
    costs more wall time than it saves (as in tests/adapters/test_mutants.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SAMPLED = [spec for spec in TREE_ZOO if spec.protocol == "tree"]
GREEDY = [spec for spec in TREE_ZOO if spec.protocol == "greedy-tree"]


def _ids(spec: Mutant) -> str:
    return spec.name


def next_token_counts(
    verifier: TreeVerifier, case: TreeCase, count: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Draft ``count`` trees of ``case``, verify them, and count the next emitted token given
    each reached node, pooled by class (row 0: the root; row ``1 + (d-1) V + x``: nodes of
    depth d with token x).

    Returns:
        ``(counts [1 + D V, V], expected [1 + D V, V])``: float64 counts and the p of each class.
    """
    generator = torch.Generator().manual_seed(seed)
    ids = case.draw_trees(count, generator)
    target, draft = case.inputs(ids)
    parents = case.parents_tensor.expand(count, -1)
    out = verifier(target, draft, parents, ids, case.draft_scheme, generator)
    vocab, depth = case.vocab_size, case.depth
    counts = np.zeros((1 + depth * vocab, vocab))
    for node in range(case.n_nodes + 1):
        level = int(case.depths[node])
        if node == 0:
            reached = torch.ones(count, dtype=torch.bool)
            classes = torch.zeros(count, dtype=torch.int64)
        else:
            reached = out.accepted_nodes[:, level - 1] == node
            classes = 1 + (level - 1) * vocab + ids[:, node - 1]
        following = out.tokens[reached, level]
        assert bool((following >= 0).all()) and bool((following < vocab).all())
        np.add.at(counts, (classes[reached].numpy(), following.numpy()), 1.0)
    expected = np.concatenate(
        [case.root_target.numpy()[None], case.target_table.numpy().reshape(depth * vocab, vocab)]
    )
    return counts, expected


def class_pvalues(counts: np.ndarray, expected: np.ndarray) -> dict[int, float]:
    """Chi-square goodness-of-fit p-value of every class visited at least ``MIN_VISITS`` times
    (cells with expected count < 5 pooled into one; any token with p = 0 emitted: p-value 0)."""
    pvalues: dict[int, float] = {}
    for row in range(counts.shape[0]):
        visits = counts[row].sum()
        if visits < MIN_VISITS:
            continue
        law = expected[row] / expected[row].sum()
        if counts[row][law == 0].sum() > 0:
            pvalues[row] = 0.0
            continue
        mean = visits * law
        big = mean >= 5
        observed = list(counts[row][big])
        wanted = list(mean[big])
        if (~big & (law > 0)).any():
            observed.append(counts[row][~big].sum())
            wanted.append(mean[~big].sum())
        if len(wanted) < 2:
            continue
        pvalues[row] = float(stats.chisquare(observed, wanted).pvalue)
    return pvalues


def tv_from_p(counts: np.ndarray, expected: np.ndarray) -> float:
    """Largest total-variation distance between a tested class's empirical law and its p."""
    visits = counts.sum(axis=1)
    tested = visits >= MIN_VISITS
    distance = 0.5 * np.abs(counts[tested] / visits[tested, None] - expected[tested]).sum(axis=1)
    return float(distance.max())


@pytest.mark.parametrize("spec", [s for s in SAMPLED if s.lossy], ids=_ids)
def test_lossy_tree_mutant_next_token_law_differs_from_p_on_its_case(
    spec: Mutant,
) -> None:
    """Power on the mechanism: on its own case some class's next-token law differs from p
    (chi-square p-value below 1e-6, fixed seed) by a large effect (empirical TV >= 0.1)."""
    assert isinstance(spec.case, TreeCase)
    counts, expected = next_token_counts(spec.verifier, spec.case, TREES, SEED)  # type: ignore[arg-type]
    pvalues = class_pvalues(counts, expected)
    assert min(pvalues.values()) < LOSSY_ALPHA, pvalues
    assert tv_from_p(counts, expected) >= 0.1


@pytest.mark.parametrize("spec", [s for s in SAMPLED if not s.lossy], ids=_ids)
def test_lossless_tree_control_keeps_every_next_token_law_on_its_case(
    spec: Mutant,
) -> None:
    """No false alarm: every class visited at least 200 times passes the chi-square test at the
    Bonferroni level 1e-3 / classes (fixed seed), as the reference does."""
    assert isinstance(spec.case, TreeCase)
    counts, expected = next_token_counts(spec.verifier, spec.case, CONTROL_TREES, SEED)  # type: ignore[arg-type]
    pvalues = class_pvalues(counts, expected)
    assert len(pvalues) >= 3
    assert min(pvalues.values()) > CONTROL_ALPHA / len(pvalues), pvalues


@pytest.mark.parametrize("spec", [s for s in SAMPLED if not s.lossy], ids=_ids)
def test_lossless_tree_control_keeps_the_law_under_every_scheme(spec: Mutant) -> None:
    """Controls are lossless for every draft scheme, not only their own case's: re-declared
    under the other schemes (same tree and laws, Markov tables of the case), every tested class
    still passes at the Bonferroni level 1e-3 / classes."""
    case = spec.case
    assert isinstance(case, TreeCase)
    for scheme in ("iid", "without-replacement", "top-k"):
        if scheme == case.draft_scheme:
            continue
        other = TreeCase(f"{case.case_id}-{scheme}", case.summary, case.parents,
                         case.root_target, case.root_draft, case.target_table, case.draft_table,
                         scheme)
        counts, expected = next_token_counts(spec.verifier, other, CONTROL_TREES // 3, SEED)  # type: ignore[arg-type]
        pvalues = class_pvalues(counts, expected)
        assert min(pvalues.values()) > CONTROL_ALPHA / len(pvalues), (scheme, pvalues)


def test_reference_passes_the_same_law_test_on_every_tree_case() -> None:
    """Calibration of the test itself: the reference verifier passes the control criterion on
    every sampled case of the zoo (same seed, same size)."""
    for spec in SAMPLED:
        assert isinstance(spec.case, TreeCase)
        counts, expected = next_token_counts(verify_tree, spec.case, CONTROL_TREES // 3, SEED)
        pvalues = class_pvalues(counts, expected)
        assert min(pvalues.values()) > CONTROL_ALPHA / len(pvalues), (spec.name, pvalues)


# ----------------------------------------------------------------------------- exact laws


def _emission_law(p: np.ndarray, q: np.ndarray, drafts: tuple[int, ...], rule: str) -> np.ndarray:
    """Exact law of the token emitted at the root of a star tree with siblings ``drafts``,
    verified by the iid (``q`` fixed) or without-replacement (``q'`` updated) rule."""
    residual, draft, law, reach = p.copy(), q.copy(), np.zeros_like(p), 1.0
    for token in drafts:
        accept = min(1.0, residual[token] / draft[token]) if draft[token] > 0 else 0.0
        law[token] += reach * accept
        reach *= 1.0 - accept
        excess = np.maximum(residual - draft, 0.0)
        residual = excess / excess.sum() if excess.sum() > 0 else residual
        if rule == "without-replacement":
            draft = draft.copy()
            draft[token] = 0.0
            draft = draft / draft.sum()
    return law + reach * residual


def _exact_root_law(p: np.ndarray, q: np.ndarray, siblings: int, scheme: str,
                    rule: str) -> np.ndarray:
    """Exact root law over every sibling tuple drawn under ``scheme``, verified by ``rule``."""
    total = np.zeros_like(p)
    for drafts in itertools.product(range(p.shape[0]), repeat=siblings):
        if scheme == "iid":
            weight = float(np.prod(q[list(drafts)]))
        else:
            if len(set(drafts)) < siblings:
                continue
            weight, left = 1.0, 1.0
            for token in drafts:
                weight *= q[token] / left
                left -= q[token]
        total += weight * _emission_law(p, q, drafts, rule)
    return total


@pytest.mark.parametrize(
    ("name", "scheme", "rule", "tv"),
    [
        ("tree-replacement-rule-on-distinct-drafts", "without-replacement", "iid", 0.175),
        ("tree-distinct-rule-on-replacement-drafts", "iid", "without-replacement", 0.14),
    ],
)
def test_scheme_rule_mismatch_is_lossy_by_exact_computation(
    name: str, scheme: str, rule: str, tv: float
) -> None:
    """Exact proof: on the mutant's case (three root siblings), the root law of the wrong
    rule, summed over every sibling tuple, is at TV ``tv`` from p, while the matching rule's is
    p to 1e-12; the mutant's sampled root law agrees with the exact wrong law (chi-square
    p-value above 1e-3, fixed seed)."""
    case = MUTANTS[name].case
    assert isinstance(case, TreeCase) and case.draft_scheme == scheme
    p, q = case.root_target.numpy(), case.root_draft.numpy()
    siblings = case.parents.count(0)
    right = _exact_root_law(p, q, siblings, scheme, scheme)
    wrong = _exact_root_law(p, q, siblings, scheme, rule)
    assert np.abs(right - p).max() < 1e-12
    assert 0.5 * np.abs(wrong - p).sum() == pytest.approx(tv, abs=5e-4)
    verifier = (replacement_rule_on_distinct_drafts if scheme == "without-replacement"
                else distinct_rule_on_replacement_drafts)
    counts, _ = next_token_counts(verifier, case, CONTROL_TREES, SEED)
    assert stats.chisquare(counts[0], counts[0].sum() * wrong).pvalue > 1e-3


# ----------------------------------------------------------------------------- greedy


def _differing_rows(spec: Mutant) -> float:
    case = spec.case
    assert isinstance(case, GreedyTreeCase)
    out = spec.verifier(case.target_logits, case.parents, case.token_ids)  # type: ignore[call-arg]
    ref = verify_tree_greedy(case.target_logits, case.parents, case.token_ids)
    assert out.tokens.shape == ref.tokens.shape
    differ = (out.tokens != ref.tokens).any(dim=1) | (out.accepted_nodes
                                                     != ref.accepted_nodes).any(dim=1)
    return float(differ.double().mean())


def _greedy_verdict(spec: Mutant, case: GreedyTreeCase) -> Verdict:
    out = spec.verifier(case.target_logits, case.parents, case.token_ids)  # type: ignore[call-arg]
    context = CheckContext("test", case.case_id, "", "hash", 1e-3, 0.9, 0.05, 0)
    result = check_tree_greedy(out.tokens.numpy(), out.accepted_nodes.numpy(), case, context)
    return result.verdict


@pytest.mark.parametrize("spec", [s for s in GREEDY if s.lossy], ids=_ids)
def test_lossy_greedy_tree_mutant_breaks_greedy_decoding_on_its_case(
    spec: Mutant,
) -> None:
    """Exact: on its own case the mutant emits a token greedy decoding would not (tree.greedy
    is LOSSY), and its output differs from the greedy tree reference on >= 10% of trees."""
    assert _greedy_verdict(spec, spec.case) is Verdict.LOSSY  # type: ignore[arg-type]
    assert _differing_rows(spec) >= 0.1


@pytest.mark.parametrize("spec", [s for s in GREEDY if not s.lossy], ids=_ids)
def test_greedy_tree_control_follows_greedy_decoding_on_every_greedy_case(
    spec: Mutant,
) -> None:
    """Exact: on every greedy case of the zoo (its own and the lossy mutants') the control's
    tokens are greedy decoding's: tree.greedy is PASS or, for a walk that stops early,
    SUBOPTIMAL, never LOSSY."""
    for other in GREEDY:
        assert _greedy_verdict(spec, other.case) in (  # type: ignore[arg-type]
            Verdict.PASS, Verdict.SUBOPTIMAL
        )


# ----------------------------------------------------------------------------- zoo wiring


@pytest.mark.parametrize("spec", TREE_ZOO, ids=_ids)
def test_tree_mutant_resolves_as_mutant_tree_name_with_its_protocol(spec: Mutant) -> None:
    """``resolve_adapter("mutant/tree-<name>")`` gives the zoo's adapter, whose ``tree`` (or
    ``greedy_tree``) is the mutant and whose other protocols are unset; the entry keeps the
    spec's lossiness, source and case."""
    assert spec.name.startswith(TREE_PREFIX)
    adapter = resolve_adapter(MUTANT_PREFIX + spec.name)
    entry = MUTANTS[spec.name]
    assert adapter is entry.adapter and adapter.name == MUTANT_PREFIX + spec.name
    greedy = spec.protocol == "greedy-tree"
    assert (adapter.greedy_tree if greedy else adapter.tree) is spec.verifier
    assert (adapter.tree if greedy else adapter.greedy_tree) is None
    assert adapter.chain is None and adapter.greedy is None
    assert (entry.lossy, entry.source, entry.case) == (spec.lossy, spec.source, spec.case)
    assert spec.source in (spec.verifier.__doc__ or "")


def test_tree_zoo_covers_every_scheme_with_a_control_and_lists_lossy_first() -> None:
    """Each draft scheme and the greedy tree protocol have at least one control with a case of
    that scheme; the zoo lists every lossy entry (chain and tree) before every control."""
    schemes = {spec.case.draft_scheme for spec in SAMPLED if not spec.lossy
               if isinstance(spec.case, TreeCase)}
    assert schemes == {"iid", "without-replacement", "top-k"}
    assert any(not spec.lossy for spec in GREEDY)
    flags = [entry.lossy for entry in MUTANTS.values()]
    assert flags == sorted(flags, reverse=True)


@pytest.mark.parametrize("spec", SAMPLED, ids=_ids)
def test_tree_mutant_validates_inputs_and_is_deterministic_given_the_generator(
    spec: Mutant,
) -> None:
    """Bad input raises :class:`InvalidInputError` like the reference (a parent index that is
    not an earlier node); the same generator seed gives the same output."""
    case = spec.case
    assert isinstance(case, TreeCase)
    ids = case.draw_trees(8, torch.Generator().manual_seed(0))
    target, draft = case.inputs(ids)
    parents = case.parents_tensor.expand(8, -1).clone()
    first = spec.verifier(target, draft, parents, ids, case.draft_scheme,  # type: ignore[call-arg]
                          torch.Generator().manual_seed(3))
    again = spec.verifier(target, draft, parents, ids, case.draft_scheme,  # type: ignore[call-arg]
                          torch.Generator().manual_seed(3))
    assert torch.equal(first.tokens, again.tokens)
    assert torch.equal(first.accepted_nodes, again.accepted_nodes)
    bad = parents.clone()
    bad[:, 0] = 1
    with pytest.raises(InvalidInputError):
        spec.verifier(target, draft, bad, ids, case.draft_scheme,  # type: ignore[call-arg]
                      torch.Generator().manual_seed(3))


# ----------------------------------------------------------------------------- the default audit


@pytest.mark.parametrize("spec", [s for s in TREE_ZOO if s.lossy], ids=_ids)
def test_default_audit_catches_lossy_tree_mutant_with_exit_1(spec: Mutant) -> None:
    """Power on the tree zoo: the default audit (default config, tree battery, seed 0) finds
    every lossy tree mutant LOSSY, so ``losslessness audit mutant/<name>`` exits 1."""
    result = run_audit([MUTANTS[spec.name].adapter], AuditConfig())
    target = result.targets[0]
    assert result.exit_code == 1, [check.message for check in target.checks[:5]]
    assert target.verdict is TargetVerdict.LOSSY


@pytest.mark.parametrize("spec", [s for s in TREE_ZOO if not s.lossy], ids=_ids)
def test_default_audit_passes_tree_control_with_exit_0(spec: Mutant) -> None:
    """No false alarm on the lossless tree controls: every one exits 0 under the default audit
    (LOSSLESS, or SUBOPTIMAL where it accepts fewer drafts than the declared scheme's exact
    rate: reversed siblings, sample-and-match, the one-coin rule, the first-child-only walk)."""
    result = run_audit([MUTANTS[spec.name].adapter], AuditConfig())
    target = result.targets[0]
    flagged = [f"{c.check_id} {c.where}: {c.message}" for c in target.checks
               if c.verdict is Verdict.LOSSY or c.verdict is Verdict.ERROR]
    assert result.exit_code == 0, flagged
    assert target.verdict in (TargetVerdict.LOSSLESS, TargetVerdict.SUBOPTIMAL)
