"""End-to-end audits: the toy adapter (the reference loop) comes out LOSSLESS with drafts of
length > 1 accepted in most steps; the three plumbing mutants come out LOSSY; an honest drafter
that ignores the temperature stays LOSSLESS (losslessness needs d ~ q, not q close to p); the
sequence-law assertions share the run's Bonferroni budget; `losslessness audit toy` works from
the command line; crashes and drafters that are never right are reported, not hidden."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from losslessness.adapters import Adapter, EndToEndTarget
from losslessness.adapters.reference import adapter as reference_adapter
from losslessness.adapters.toy import MUTANT_TEMPERATURE, adapter, mutant_adapter, toy_models
from losslessness.batteries import default_chain_battery, default_tree_battery
from losslessness.checks import count_statistical_assertions
from losslessness.checks.sequence_law import sequence_seed
from losslessness.checks.tree_assertions import tree_assertions
from losslessness.cli import main
from losslessness.config import AuditConfig
from losslessness.engine import plan_run, run_audit
from losslessness.engine.draw import generate_sequences, rows_per_call
from losslessness.protocol import GeneratesBatches
from losslessness.reference.decoding import SpeculativeDecoder
from losslessness.reference.proposers import DraftModelProposer, Proposal, one_hot_rows
from losslessness.reference.toy import MarkovLM
from losslessness.results import TargetVerdict, Verdict
from losslessness.targets import resolve_adapter
from losslessness.worker import shutdown_workers, worker_of
from tests.engine.batching_engines import (
    ENGINE_DIRECTORY,
    NEW_TOKENS,
    PROMPT,
    BatchingToy,
    batching_adapter,
)

SEED = 20261127

MUTANT_DESIGN = AuditConfig(tv=0.1)
"""Mutants are audited at design TV 0.1 (power 0.9, family-wise 1e-3): a quarter of the
default sample size; at the default design (TV 0.05) each is caught with p-value ~0 too."""


def test_toy_adapter_is_lossless_at_default_settings_with_long_accepted_drafts() -> None:
    """Default design (TV 0.05, power 0.9, family-wise 1e-3 over the 2 sampled targets and the
    run-level p-value test): every check passes, and drafts of length >= 2 are accepted in
    over half of the verify steps of the draft-model and n-gram sampled targets."""
    result = run_audit([adapter()], AuditConfig())
    target = result.targets[0]
    assert target.verdict is TargetVerdict.LOSSLESS, [c.message for c in target.checks]
    # Two sequence-law tests and the target's run-level p-value test.
    assert result.n_assertions == 3
    by_case = {(c.case_id, c.check_id): c for c in target.checks if c.case_id != "run"}
    assert set(by_case) == {
        (case, check)
        for case in ("toy/draft-sampling", "toy/ngram-sampling")
        for check in ("sequence-law", "drafts-accepted")
    } | {
        (case, check)
        for case in ("toy/draft-greedy", "toy/ngram-greedy")
        for check in ("sequence-greedy", "drafts-accepted")
    }
    for case in ("toy/draft-sampling", "toy/ngram-sampling"):
        law = by_case[case, "sequence-law"]
        assert law.min_detectable_tv <= 0.05 and law.alpha == pytest.approx(1e-3 / 3)
        drafts = by_case[case, "drafts-accepted"].details
        assert drafts["share_accepting_more_than_one"] > 0.5, drafts


@pytest.mark.parametrize(
    "name",
    [
        "toy-mutant/untempered-draft",
        "toy-mutant/greedy-draft-softmax-q",
        "toy-mutant/rejected-token-kept",
    ],
)
def test_plumbing_mutant_is_caught_by_the_sequence_law(name: str) -> None:
    """Each mutant (a correct verifier inside a wrong loop) is LOSSY on its sequence law."""
    mutants = mutant_adapter()
    (target,) = [t for t in mutants.end_to_end if t.name == name]
    audited = Adapter(mutants.name, mutants.description, end_to_end=(target,))
    result = run_audit([audited], MUTANT_DESIGN)
    checks = {c.check_id: c for c in result.targets[0].checks}
    assert result.targets[0].verdict is TargetVerdict.LOSSY
    assert checks["sequence-law"].verdict is Verdict.LOSSY, checks["sequence-law"].message
    assert result.exit_code == 1


def test_honest_drafter_without_temperature_stays_lossless() -> None:
    """Control for the untempered-draft mutant: a drafter sampling its raw softmax *and
    reporting it* as q is lossless, however far q is from the tempered target."""
    target, draft = toy_models()
    loop = SpeculativeDecoder(target, DraftModelProposer(draft, None), 3, MUTANT_TEMPERATURE)
    honest = Adapter(
        "honest",
        "raw-softmax drafts reported as such",
        end_to_end=(EndToEndTarget("honest/raw-draft", "raw draft", loop, (1, 4, 2), 3),),
    )
    result = run_audit([honest], MUTANT_DESIGN)
    assert result.targets[0].verdict is TargetVerdict.LOSSLESS, result.targets[0].checks


def test_sequence_law_assertions_share_the_bonferroni_budget_with_chain_checks() -> None:
    """Planned together, the reference's chain assertions and the toy's two sampled targets
    split one family-wise rate; sequence-law is one assertion per sampled target."""
    config = AuditConfig(tv=0.1)
    plan = plan_run(config, [reference_adapter, adapter()])
    chain = sum(
        count_statistical_assertions(case, rows_per_call(case)) for case in default_chain_battery()
    )
    tree = sum(tree_assertions(case).count() for case in default_tree_battery())
    # ... and one run-level p-value test per target (reference, toy).
    assert plan.record.n_assertions == chain + tree + 2 + 2
    only = plan_run(AuditConfig(only=("sequence-law",)), [reference_adapter, adapter()])
    assert only.record.n_assertions == 2 and not only.chain_cases


class NeverRight:
    """Greedy drafter that always proposes a token other than the target's argmax."""

    def __init__(self, target: MarkovLM) -> None:
        self.target = target
        self.vocab_size = target.vocab_size

    def propose(self, context: Sequence[int], k: int, generator: torch.Generator) -> Proposal:
        token = (int(self.target.next_token_probs(context).argmax()) + 1) % self.vocab_size
        return Proposal([token], one_hot_rows([token], self.vocab_size))


class Crashing(SpeculativeDecoder):
    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int) -> list[int]:  # type: ignore[override]
        raise RuntimeError("engine fell over")


def test_never_accepted_drafts_warn_and_crashes_are_errors() -> None:
    """A greedy loop whose drafts are never accepted passes the greedy check but is flagged
    SUBOPTIMAL by drafts-accepted; a generate that raises is ERROR; the audit goes on."""
    target, draft = toy_models()
    never = SpeculativeDecoder(target, NeverRight(target), 1, greedy=True)
    crashing = Crashing(target, DraftModelProposer(draft), 2)
    audited = Adapter(
        "odd",
        "odd engines",
        end_to_end=(
            EndToEndTarget("odd/crash", "raises", crashing, (1,), 2),
            EndToEndTarget("odd/never", "never right", never, (1,), 8, greedy=True),
        ),
    )
    result = run_audit([audited], AuditConfig(tv=0.2))
    checks = {(c.case_id, c.check_id): c for c in result.targets[0].checks}
    assert checks["odd/crash", "sequence-law"].verdict is Verdict.ERROR
    assert "engine fell over" in checks["odd/crash", "sequence-law"].message
    assert checks["odd/never", "sequence-greedy"].verdict is Verdict.PASS
    assert checks["odd/never", "drafts-accepted"].verdict is Verdict.SUBOPTIMAL
    assert result.targets[0].verdict is TargetVerdict.ERROR and result.exit_code == 3


def test_cli_audits_toy_targets_and_replays_by_case(tmp_path: Path) -> None:
    """`losslessness audit toy --case ... --json` runs the end-to-end checks and exits 0; the
    JSON carries the new check ids and the accepted-length histogram; unknown cases exit 2."""
    path = tmp_path / "toy.json"
    runner = CliRunner()
    result = runner.invoke(
        main,
        [
            "audit",
            "toy",
            "--no-progress",
            "--tv",
            "0.2",
            "--case",
            "toy/ngram-sampling",
            "--case",
            "toy/draft-greedy",
            "--json",
            str(path),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    record = json.loads(path.read_text())
    checks = {
        (c["case_id"], c["check_id"]): c
        for c in record["targets"][0]["checks"]
        if c["check_id"] != "pvalues"
    }
    assert set(checks) == {
        ("toy/ngram-sampling", "sequence-law"),
        ("toy/ngram-sampling", "drafts-accepted"),
        ("toy/draft-greedy", "sequence-greedy"),
        ("toy/draft-greedy", "drafts-accepted"),
    }
    histogram = checks["toy/ngram-sampling", "drafts-accepted"]["details"]
    assert sum(histogram["accepted_length_counts"].values()) == histogram["verify_steps"]
    bad = runner.invoke(main, ["audit", "toy", "--no-progress", "--case", "toy/nothing"])
    assert bad.exit_code == 2 and "unknown case ids" in bad.output


class ForgetsSeeds:
    """The toy reference loop, correct in law, whose seed stops mattering after ``honest``
    calls (a global stream): a replay of the same seed gives other tokens."""

    def __init__(self, honest: int) -> None:
        target, draft = toy_models()
        self.inner = SpeculativeDecoder(target, DraftModelProposer(draft), 2)
        self.vocab_size = self.inner.vocab_size
        self.calls, self.honest = 0, honest
        self.stream = 10**6

    def generate(self, prompt_ids: list[int], max_new_tokens: int, seed: int) -> list[int]:
        self.calls += 1
        if self.calls > self.honest:
            self.stream += 1
            seed = self.stream
        return self.inner.generate(prompt_ids, max_new_tokens, seed)

    def next_token_probs(self, prefix_ids: list[int]) -> torch.Tensor:
        return self.inner.next_token_probs(prefix_ids)


@pytest.mark.parametrize(("honest", "verdict"), [(10**9, Verdict.PASS),
                                                 (0, Verdict.IRREPRODUCIBLE)])
def test_an_engine_promising_reproducible_seeds_is_replayed_and_irreproducible_if_not(
    honest: int, verdict: Verdict
) -> None:
    """EndToEndTarget.reproducible_seeds: the first sequences are generated again after the
    run; identical replays PASS ``seed.contract``, an engine that draws from a global stream
    is IRREPRODUCIBLE (not LOSSY: its law is right)."""
    engine = ForgetsSeeds(honest)
    audited = Adapter(
        "seeds", "seeded engine",
        end_to_end=(EndToEndTarget("seeds/t1", "toy", engine, (1,), 3, reproducible_seeds=True),),
    )
    result = run_audit([audited], AuditConfig(tv=0.2))
    checks = {c.check_id: c for c in result.targets[0].checks}
    assert checks["seed.contract"].verdict is verdict and checks["seed.contract"].n == 16
    assert checks["sequence-law"].verdict is Verdict.PASS
    expected = TargetVerdict.LOSSLESS if honest else TargetVerdict.IRREPRODUCIBLE
    assert result.targets[0].verdict is expected


def test_a_batching_engine_gets_its_seeds_in_batches_and_gives_the_unbatched_sequences() -> None:
    """GeneratesBatches: the seeds go out in batches of the engine's ``batch_size`` (the last
    one shorter), the sequences are those of one-by-one ``generate`` for the same seeds, and an
    honest batching engine is LOSSLESS with the seed contract held (the replays come as one
    batch of 16 in reverse order)."""
    engine = BatchingToy(batch_size=64)
    sequences, _ = generate_sequences(engine, PROMPT, NEW_TOKENS, 150, SEED)
    assert engine.batches == [64, 64, 22]
    one_by_one = [engine.generate(list(PROMPT), NEW_TOKENS, sequence_seed(SEED, j))
                  for j in range(150)]
    assert sequences == one_by_one
    engine.batches.clear()
    result = run_audit([batching_adapter(engine)], AuditConfig(tv=0.2))
    checks = {c.check_id: c for c in result.targets[0].checks}
    assert result.targets[0].verdict is TargetVerdict.LOSSLESS, result.targets[0].checks
    assert checks["seed.contract"].verdict is Verdict.PASS and checks["seed.contract"].n == 16
    assert max(engine.batches) == 64 and 16 in engine.batches


@pytest.mark.parametrize(("fault", "verdict"), [("drops", TargetVerdict.ERROR),
                                                ("position", TargetVerdict.IRREPRODUCIBLE)])
def test_a_batching_engine_that_loses_a_sequence_or_its_seeds_place_is_reported(
    fault: str, verdict: TargetVerdict
) -> None:
    """A batch answered with one sequence too few is an ERROR naming ``generate_batch``; a
    request whose stream depends on its place in the batch keeps the law (sequence-law PASS)
    but breaks the seed contract: IRREPRODUCIBLE, not LOSSY."""
    result = run_audit([batching_adapter(BatchingToy(batch_size=64, fault=fault))],
                       AuditConfig(tv=0.2))
    target = result.targets[0]
    assert target.verdict is verdict, target.checks
    if fault == "drops":
        assert any("generate_batch: expected a list of 64" in c.message for c in target.checks)
    else:
        checks = {c.check_id: c for c in target.checks}
        assert checks["sequence-law"].verdict is Verdict.PASS
        assert checks["seed.contract"].verdict is Verdict.IRREPRODUCIBLE


def test_a_batching_engine_in_a_worker_process_is_batched_there_too() -> None:
    """A batching engine resolved by name runs in a worker process; its proxy batches as the
    engine does and the audit's sequences are the in-process ones (same statistic). A light
    loop (no ``requires_speculation``) keeps its worker after its units."""
    isolated = resolve_adapter("tests.engine.batching_engines:batching_adapter",
                               in_process=False)
    worker = worker_of(isolated)
    try:
        generator = isolated.end_to_end[0].generator
        assert isinstance(generator, GeneratesBatches) and generator.batch_size == 64
        config = AuditConfig(tv=0.2)
        pid = worker.pid if worker is not None else None
        remote = run_audit([isolated], config).targets[0]
        assert worker is not None and worker.pid == pid is not None
        assert len(generator.generate_batch([1], 3, [5, 6])) == 2
        local = run_audit([batching_adapter()], config).targets[0]
    finally:
        shutdown_workers()
    statistic = {c.check_id: c.statistic for c in local.checks}
    assert remote.verdict is TargetVerdict.LOSSLESS
    assert {c.check_id: c.statistic for c in remote.checks} == statistic


@pytest.mark.parametrize("time_budget_s", [None, 600.0], ids=["planned", "time-budget"])
def test_a_run_of_engines_in_workers_holds_one_engine_at_a_time(
    time_budget_s: float | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning (each engine's law), the time budget's warm-up and the units call every
    engine in turn; a whole engine in a worker is released after each phase's last call, so
    no engine is ever called while another is alive (``ExclusiveToy`` raises if one is: the
    target would be ERROR). Four vLLM servers held together took 18 of 23 GiB."""
    monkeypatch.setenv(ENGINE_DIRECTORY, str(tmp_path))
    adapters = [
        resolve_adapter(f"tests.engine.batching_engines:exclusive_adapter_{name}",
                        in_process=False)
        for name in "ab"
    ]
    try:
        result = run_audit(adapters, AuditConfig(tv=0.3, time_budget_s=time_budget_s))
        released = [worker_of(adapter).pid is None for adapter in adapters]  # type: ignore[union-attr]
    finally:
        shutdown_workers()
    assert [t.verdict for t in result.targets] == [TargetVerdict.LOSSLESS] * 2, [
        c.message for t in result.targets for c in t.checks
    ]
    assert len(list(tmp_path.iterdir())) >= 4
    assert released == [True, True]
