"""The chain and tree monitors stop on exact violations at once and on conclusive statistical
evidence, never on a correct verifier's samples, and their evidence lands on the results."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from losslessness.batteries import default_chain_battery, default_tree_battery
from losslessness.checks import run_chain_checks
from losslessness.checks.sequential import ChainMonitor, merged_evidence
from losslessness.checks.tree_sequential import TreeMonitor
from losslessness.engine.draw import ChainSampler, sample_tree
from losslessness.reference import verify
from losslessness.reference.tree import verify_tree
from losslessness.results import CheckContext, Verdict

CASES = {case.case_id: case for case in default_chain_battery()}


def shifted_bonus(target, draft, ids, generator):  # type: ignore[no-untyped-def]
    """The reference with the bonus token moved to the next token id: well-formed outputs
    (any token may be a bonus), a wrong law at position k."""
    out = verify(target, draft, ids, generator)
    k = ids.shape[1]
    full = out[:, k] >= 0
    out[full, k] = (out[full, k] + 1) % target.shape[-1]
    return out


def _context(case_id: str) -> CheckContext:
    case = CASES[case_id]
    return CheckContext("t", case.case_id, case.summary, case.case_hash, 1e-4, 0.9, 0.05, 0)


def _feed(verifier: object, case_id: str, steps: int, alpha: float, seed: int = 1) -> tuple[
    ChainMonitor, ChainSampler
]:
    case = CASES[case_id]
    monitor = ChainMonitor(case, steps, alpha, _context(case_id))
    sampler = ChainSampler(verifier, case, steps, seed, ramp=True)  # type: ignore[arg-type]
    while not sampler.finished:
        start, m = sampler.step()
        outputs = sampler.outputs[:, start : start + m]
        drafts = sampler.drafts[:, start : start + m]
        if monitor.update(outputs, drafts, sampler.call_pairs(start, m)):
            break
    return monitor, sampler


def test_monitor_never_stops_the_reference_and_records_every_assertion() -> None:
    """A correct verifier on a mixed batch: no stop at a run-like level (1e-6; a false stop has
    probability below 1e-5 for this fixed seed), and evidence for every law, acceptance and
    independence assertion of the case."""
    monitor, sampler = _feed(verify, "v32-mixed-batch", 4000, 1e-6)
    assert sampler.finished and monitor.decision is None
    kinds = {key[0] for key in monitor.evidence()}
    assert kinds == {"law", "acceptance", "independence"}
    assert all(not item.crossed for item in monitor.evidence().values())


def test_monitor_stops_a_wrong_bonus_law_within_a_few_thousand_steps() -> None:
    """A bonus token off by one id (well-formed outputs, wrong law at position k) is caught
    by the law e-process at position k long before the planned 20,000 steps, at 1e-6."""
    monitor, sampler = _feed(shifted_bonus, "v8-far", 20_000, 1e-6)
    assert monitor.decision is not None and not monitor.decision.exact
    assert sampler.done <= 2000
    assert ("law", 0, 1, 0) in monitor.decision.crossed
    crossed = [item for item in monitor.evidence().values() if item.crossed]
    assert crossed and all(item.log_e_value >= math.log(1e6) for item in crossed)


def test_monitor_stops_at_the_first_call_with_an_impossible_token() -> None:
    """Exact checks stop at their first violation: a verifier that emits a token with p = 0
    on the one-hot case stops in the first call, flagged exact."""

    def off_by_one(target, draft, ids, generator):  # type: ignore[no-untyped-def]
        out = verify(target, draft, ids, generator)
        out[:, 0] = (out[:, 0] + 1) % target.shape[-1]
        return out

    monitor, sampler = _feed(off_by_one, "edge-one-hot", 5000, 1e-6)
    assert monitor.decision is not None and monitor.decision.exact
    assert sampler.calls == 1


def test_attached_crossing_makes_the_result_lossy_with_its_evidence() -> None:
    """Evidence in the context: the crossed assertion's result is LOSSY whatever its fixed-n
    test said on the steps drawn, and every monitored result carries its sequential record."""
    monitor, sampler = _feed(shifted_bonus, "v8-far", 20_000, 1e-6)
    context = dataclasses.replace(
        _context("v8-far"), sequential=merged_evidence([monitor.evidence()]), stop_reason="stop"
    )
    results = run_chain_checks(sampler.samples(), context)
    crossed = [r for r in results if r.sequential is not None and r.sequential.crossed]
    assert crossed and all(r.verdict is Verdict.LOSSY for r in crossed)
    assert all("sequential test" in r.message or r.p_value <= r.alpha for r in crossed)
    monitored = [r for r in results if r.sequential is not None]
    assert {r.check_id for r in monitored} >= {"law", "acceptance"}


def test_tree_monitor_stops_a_wrong_tree_verifier_and_not_the_reference() -> None:
    """The tree monitor: the reference tree verifier is never stopped; a verifier that draws
    the final token from p instead of the residual is stopped by a law e-process."""
    case = next(c for c in default_tree_battery() if c.draft_scheme == "iid")
    context = CheckContext("t", case.case_id, case.summary, case.case_hash, 1e-4, 0.9, 0.05, 0)
    good = TreeMonitor(case, 8192, 1e-6, context)
    samples = sample_tree(verify_tree, case, 4096, 3, monitor=good.update)
    assert good.decision is None and samples.n_steps == 4096
    assert any(key[0] == "tree.law" for key in good.evidence())

    from losslessness.zoo.tree import TREE_ZOO

    wrong = next(spec for spec in TREE_ZOO if spec.name == "tree-final-from-root-row")
    bad = TreeMonitor(case, 8192, 1e-6, context)
    stopped = sample_tree(wrong.verifier, case, 8192, 3, monitor=bad.update)
    assert bad.decision is not None and stopped.n_steps < 8192


@pytest.mark.parametrize(
    ("steps", "alpha", "shards"), [(0, 1e-3, 1), (10, 1.0, 1), (10, 1e-3, 0)]
)
def test_monitor_rejects_bad_arguments_by_name(steps: int, alpha: float, shards: int) -> None:
    """Out-of-range design arguments raise ValueError naming them."""
    with pytest.raises(ValueError, match=r"planned_steps|alpha_sequential|shards"):
        ChainMonitor(CASES["v2-tilted"], steps, alpha, _context("v2-tilted"), shards=shards)


def test_pairs_of_a_call_are_indexed_within_it() -> None:
    """The independence pairs of a call starting at an odd step skip its first step (global
    pairs are (2j, 2j+1))."""
    sampler = ChainSampler(verify, CASES["v2-tilted"], 10, 0)
    assert np.array_equal(sampler.call_pairs(3, 5), [[1, 2], [3, 4]])
    assert np.array_equal(sampler.call_pairs(0, 4), [[0, 1], [2, 3]])


def test_tree_monitor_keys_match_the_results_they_attach_to() -> None:
    """Every assertion the tree monitor follows lands on the result of the same assertion
    (law classes by depth and token, acceptance at depth 1, independence)."""
    from losslessness.checks import run_tree_checks

    case = next(c for c in default_tree_battery() if c.draft_scheme == "iid")
    context = CheckContext("t", case.case_id, case.summary, case.case_hash, 1e-4, 0.9, 0.05, 0)
    monitor = TreeMonitor(case, 2048, 1e-6, context)
    samples = sample_tree(verify_tree, case, 2048, 5, monitor=monitor.update)
    keys = {result.assertion_key for result in run_tree_checks(samples, context)}
    assert set(monitor.evidence()) <= keys
    assert {key[0] for key in monitor.evidence()} >= {"tree.law", "tree.independence"}


def test_monitor_update_names_outputs_or_drafts_of_the_wrong_shape() -> None:
    """Outputs or drafts that do not fit the case raise ValueError naming the argument."""
    case = CASES["v2-tilted"]
    monitor = ChainMonitor(case, 100, 1e-3, _context("v2-tilted"))
    good = np.zeros((case.n_rows, 4, case.k + 1), dtype=np.int64)
    drafts = np.zeros((case.n_rows, 4, case.k), dtype=np.int64)
    pairs = np.empty((0, 2), dtype=np.int64)
    with pytest.raises(ValueError, match=r"^outputs"):
        monitor.update(good[:, :, :-1], drafts, pairs)
    with pytest.raises(ValueError, match=r"^drafts"):
        monitor.update(good, drafts[:, :3], pairs)


def _tilted_root(target_probs, draft_probs, parents, token_ids, draft_scheme, generator):  # type: ignore[no-untyped-def]
    """A tree verifier that accepts no draft and draws the final token from p_root squared and
    renormalised, independently for every tree: a wrong marginal, independent pairs."""
    from losslessness.protocol import PLACEHOLDER, TreeOutput
    from losslessness.reference.tree import tree_depths

    batch = target_probs.shape[0]
    law = target_probs[:, 0].double() ** 2
    first = torch.multinomial((law / law.sum(-1, keepdim=True)).float(), 1, generator=generator)
    depth = int(tree_depths(parents.long().cpu()).max())
    tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64)
    tokens[:, 0] = first.reshape(-1)
    return TreeOutput(tokens, torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64))


def test_tree_independence_monitor_tests_independence_only_not_the_root_law() -> None:
    """A wrong root marginal with independent pairs (fixed seed, 8192 trees, one look): the
    ``tree.law`` root e-process crosses and the fixed-n law test is LOSSY, while
    ``tree.independence`` (e-process against the product of the observed marginals, and the
    fixed-n test) stays below its threshold and PASSes; the same pair counts against
    p_root x p_root (the monitor's former null) would have crossed."""
    from losslessness.checks import run_tree_checks
    from losslessness.checks.tree_assertions import ROOT, class_p
    from losslessness.stats.sequential import multinomial_log_evalue

    case = next(c for c in default_tree_battery() if c.case_id == "tree-chain-iid")
    context = CheckContext("t", case.case_id, case.summary, case.case_hash, 1e-4, 0.9, 0.05, 0)
    samples = sample_tree(_tilted_root, case, 8192, 3)
    monitor = TreeMonitor(case, 8192, 1e-6, context)
    assert monitor.update(samples)
    evidence = monitor.evidence()
    assert evidence[("tree.law", 0, 0, ROOT)].crossed
    independence = evidence[("tree.independence", 0, 0, 0)]
    assert not independence.crossed and independence.log_e_value < monitor.log_threshold
    results = {(r.check_id, r.position): r for r in run_tree_checks(samples, context)}
    assert results[("tree.law", 0)].verdict is Verdict.LOSSY
    assert results[("tree.independence", None)].verdict is Verdict.PASS
    pairs = monitor.pairs
    assert pairs is not None
    p_root = class_p(case, 0, ROOT)
    mass = np.bincount(pairs.categories, weights=p_root / p_root.sum())
    against_p_root = multinomial_log_evalue(pairs.counts, np.outer(mass, mass).reshape(-1))
    assert against_p_root > monitor.log_threshold


def test_chain_independence_monitor_tests_independence_only() -> None:
    """The chain monitor's independence e-process likewise: copies of a row whose first token
    follows a wrong law but independently stay below the threshold (fixed seed), while a
    shared random stream (both copies equal) crosses it."""
    from losslessness.checks.sequential import pair_state, update_pairs

    case = CASES["v8-far"]
    p0 = case.laws[0].emitted[0].numpy()
    rng = np.random.default_rng(7)
    wrong = p0**2 / (p0**2).sum()
    first = rng.choice(p0.size, size=8000, p=wrong)
    pairs = np.arange(8000).reshape(-1, 2)
    independent = pair_state(p0, 8000)
    update_pairs(independent, first, pairs)
    threshold = math.log(1e6)
    assert independent.log_evalue < threshold
    shared = pair_state(p0, 8000)
    update_pairs(shared, np.repeat(first[::2], 2), pairs)
    assert shared.log_evalue > threshold


def test_tree_monitor_pooled_pit_e_process_stops_a_law_error_beyond_depth_1() -> None:
    """The pooled PIT e-process: on the V = 1024 EAGLE-like tree, the reference does not cross
    it; the law cut to its top 10 at depth >= 2 crosses it (and only the pooled key), within
    4096 trees (fixed seeds)."""
    from losslessness.checks.tree_assertions import POOLED
    from losslessness.zoo.tree import deep_nodes_top_10_only

    case = next(c for c in default_tree_battery() if c.case_id == "tree-eagle-v1024-topk")
    context = CheckContext("t", case.case_id, case.summary, case.case_hash, 1e-4, 0.9, 0.05, 0)
    key = ("tree.law", 0, 0, POOLED)
    good = TreeMonitor(case, 4096, 1e-6, context)
    sample_tree(verify_tree, case, 4096, 3, monitor=good.update)
    assert not good.evidence()[key].crossed
    bad = TreeMonitor(case, 4096, 1e-6, context)
    sample_tree(deep_nodes_top_10_only, case, 4096, 3, monitor=bad.update)
    assert bad.decision is not None and bad.decision.crossed == [key]
