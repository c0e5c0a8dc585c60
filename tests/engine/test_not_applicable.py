"""A target may refuse a case shape it cannot take by design (vLLM's FLy at k = 1) by raising
:class:`~losslessness.adapters.NotApplicable`: the run records that case's checks as SKIPPED
with ``not applicable: <reason>`` (never ERROR, never PASS). When the adapter declares the cases
it does not take (``Adapter.exclusions``), the target's other checks decide its verdict
(LOSSLESS or LOSSY as they find) and the declaration is stated; undeclared refusals leave the
design unreached (INCONCLUSIVE, exit 4, unless something is LOSSY); a target to which nothing
applies is never LOSSLESS; and the outcome survives a sharded run's save, load and merge.

The fake targets are the reference (lossless) and ``tests.wrong_verifiers.ratio_inverted``
(LOSSY) wrapped so that they raise NotApplicable when k = 1; no engine is installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from losslessness.adapters import Adapter, NotApplicable
from losslessness.adapters.vllm import SamplerOptions
from losslessness.config import RunConfig
from losslessness.engine import (
    ShardSpec,
    finish_run,
    load_shard,
    plan_run,
    run_audit,
    run_shard,
    save_shard,
)
from losslessness.protocol import ChainVerifier, GreedyVerifier, InvalidInputError
from losslessness.results import (
    AuditResult,
    CheckContext,
    TargetVerdict,
    Verdict,
    design_shortfalls,
    target_verdict,
)
from losslessness.targets import resolve_adapter
from tests.wrong_verifiers import ratio_inverted

REASON = "fake needs k >= 2"
SKIP_MESSAGE = f"not applicable: {REASON}"
K1_CASES = ("v2-skewed", "greedy-v2-random")
"""Battery cases with k = 1 (chain, greedy)."""
K2_CASES = ("v2-tilted", "greedy-v8-ties")
"""Battery cases with k >= 2 (chain k = 2, greedy k = 3)."""


def _refuse_k1_chain(verifier: ChainVerifier) -> ChainVerifier:
    def chain(
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
    ) -> torch.Tensor:
        if draft_token_ids.shape[1] < 2:
            raise NotApplicable(REASON)
        return verifier(target_probs, draft_probs, draft_token_ids, generator)

    return chain


def _refuse_k1_greedy(verifier: GreedyVerifier) -> GreedyVerifier:
    def greedy(target_logits: torch.Tensor, draft_token_ids: torch.Tensor) -> torch.Tensor:
        if draft_token_ids.shape[1] < 2:
            raise NotApplicable(REASON)
        return verifier(target_logits, draft_token_ids)

    return greedy


DECLARED = "draft length k = 1"


def _fake(name: str, chain: ChainVerifier, exclusions: str | None = DECLARED) -> Adapter:
    reference = resolve_adapter("reference")
    assert reference.greedy is not None
    return Adapter(
        name=name,
        description=f"{name}: refuses k = 1 (NotApplicable)",
        chain=_refuse_k1_chain(chain),
        greedy=_refuse_k1_greedy(reference.greedy),
        exclusions=exclusions,
    )


def _lossless_fake(exclusions: str | None = DECLARED) -> Adapter:
    reference = resolve_adapter("reference")
    assert reference.chain is not None
    return _fake("refuses-k1", reference.chain, exclusions)


def _checks_of(result: AuditResult, case_id: str) -> list[Verdict]:
    return [c.verdict for c in result.targets[0].checks if c.case_id == case_id]


def test_declared_not_applicable_cases_are_skipped_with_the_reason_and_the_rest_decide() -> None:
    """k = 1 cases (chain and greedy) of a target declaring it does not take k = 1: every check
    SKIPPED with ``not applicable: <reason>``, none ERROR or PASS; the k >= 2 cases run and
    PASS; the target is LOSSLESS, exit 0, and its record keeps the declaration."""
    config = RunConfig(cases=(*K1_CASES, *K2_CASES), steps=600, seed=3)
    result = run_audit([_lossless_fake()], config)
    target = result.targets[0]
    for case_id in K1_CASES:
        checks = [c for c in target.checks if c.case_id == case_id]
        assert checks, case_id
        assert all(c.verdict is Verdict.SKIPPED for c in checks), case_id
        assert all(c.message == SKIP_MESSAGE for c in checks), case_id
        assert all(c.p_value is None and c.n == 0 for c in checks), case_id
    for case_id in K2_CASES:
        verdicts = _checks_of(result, case_id)
        assert Verdict.PASS in verdicts, case_id
        assert Verdict.ERROR not in verdicts and Verdict.LOSSY not in verdicts, case_id
    assert target.verdict is TargetVerdict.LOSSLESS
    assert target.error is None
    assert target.exclusions == DECLARED
    assert result.exit_code == 0


def test_undeclared_not_applicable_cases_make_the_target_inconclusive_exit_4() -> None:
    """The same target without a declaration: the k >= 2 cases PASS, but the refused cases
    leave the design unreached: INCONCLUSIVE (exit 4) naming them, never LOSSLESS."""
    config = RunConfig(cases=("v2-skewed", "v2-tilted"), steps=600, seed=3)
    result = run_audit([_lossless_fake(exclusions=None)], config)
    target = result.targets[0]
    assert Verdict.PASS in _checks_of(result, "v2-tilted")
    assert target.verdict is TargetVerdict.INCONCLUSIVE
    assert result.exit_code == 4
    assert design_shortfalls(target.checks, config) == [
        "1 cases not applicable to the target (undeclared): v2-skewed"
    ]


def test_a_lossy_target_stays_lossy_when_some_cases_are_not_applicable() -> None:
    """A wrong verifier (acceptance ratio inverted) refusing k = 1: its k = 1 case is SKIPPED,
    its k = 2 case LOSSY, and the target LOSSY (exit 1), not ERROR."""
    config = RunConfig(cases=("v2-skewed", "v2-tilted"), steps=2000, seed=1)
    result = run_audit([_fake("lossy-refuses-k1", ratio_inverted)], config)
    target = result.targets[0]
    assert set(_checks_of(result, "v2-skewed")) == {Verdict.SKIPPED}
    assert Verdict.LOSSY in _checks_of(result, "v2-tilted")
    assert target.verdict is TargetVerdict.LOSSY
    assert result.exit_code == 1


def test_a_target_to_which_no_case_applies_is_never_lossless() -> None:
    """Only k = 1 cases: every check SKIPPED. Declared, the target is UNAVAILABLE with the
    reason in its error (nothing tested, deciding nothing); undeclared, INCONCLUSIVE (exit 4)."""
    result = run_audit([_lossless_fake()], RunConfig(cases=K1_CASES, steps=50))
    target = result.targets[0]
    assert {c.verdict for c in target.checks} == {Verdict.SKIPPED}
    assert target.verdict is TargetVerdict.UNAVAILABLE
    assert target.error is not None and SKIP_MESSAGE in target.error
    assert result.verdict is TargetVerdict.UNAVAILABLE
    result = run_audit([_lossless_fake(exclusions=None)], RunConfig(cases=K1_CASES, steps=50))
    assert result.targets[0].verdict is TargetVerdict.INCONCLUSIVE
    assert result.exit_code == 4


def test_not_applicable_survives_sharding_save_load_and_merge(tmp_path: Path) -> None:
    """Two shards saved and loaded give the same SKIPPED checks and messages as one run."""
    config = RunConfig(cases=("v2-skewed", "v2-tilted"), steps=300, step_multiplier=1.0, seed=4)
    plan = plan_run(config, [_lossless_fake()])
    whole = finish_run([run_shard(plan, ShardSpec(0, 1), tmp_path)]).audit
    paths = [
        save_shard(run_shard(plan, ShardSpec(i, 2), tmp_path), tmp_path / f"s{i}.npz")
        for i in range(2)
    ]
    merged = finish_run([load_shard(path) for path in paths]).audit

    def outcome(run: AuditResult) -> list[tuple[str, str, str, str]]:
        return [
            (c.case_id, c.check_id, c.verdict.value, c.message)
            for c in run.targets[0].checks
            if c.verdict is Verdict.SKIPPED
        ]

    assert outcome(merged) == outcome(whole)
    assert [c.verdict for c in merged.targets[0].checks] == [
        c.verdict for c in whole.targets[0].checks
    ]
    assert ("v2-skewed", "law", "SKIPPED", SKIP_MESSAGE) in outcome(merged)
    assert merged.targets[0].verdict is TargetVerdict.LOSSLESS


def _context() -> CheckContext:
    return CheckContext(
        target="t",
        case_id="c",
        case_summary="",
        case_hash="h",
        alpha=0.01,
        power=0.9,
        tv=0.05,
        seed=0,
    )


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ((Verdict.SKIPPED,), TargetVerdict.UNAVAILABLE),
        ((Verdict.SKIPPED, Verdict.SKIPPED), TargetVerdict.UNAVAILABLE),
        ((Verdict.SKIPPED, Verdict.PASS), TargetVerdict.LOSSLESS),
        ((Verdict.SKIPPED, Verdict.SUBOPTIMAL), TargetVerdict.SUBOPTIMAL),
        ((Verdict.SKIPPED, Verdict.ERROR), TargetVerdict.ERROR),
        ((Verdict.SKIPPED, Verdict.LOSSY), TargetVerdict.LOSSY),
        ((), TargetVerdict.LOSSLESS),
    ],
)
def test_target_verdict_never_calls_all_skipped_lossless(
    verdicts: tuple[Verdict, ...], expected: TargetVerdict
) -> None:
    """SKIPPED checks decide nothing beside others; all SKIPPED (nothing tested) is
    UNAVAILABLE when nothing fell short of the design (every case excluded by declaration)."""
    context = _context()
    checks = [context.untested(f"check{i}", v, "m") for i, v in enumerate(verdicts)]
    assert target_verdict(checks) is expected


def test_not_applicable_is_an_invalid_input_naming_the_argument_and_needs_a_reason() -> None:
    """To a direct caller NotApplicable is an InvalidInputError (a ValueError) naming the
    argument; its skip message is ``not applicable: <reason>``; an empty reason is refused."""
    error = NotApplicable(REASON)
    assert isinstance(error, InvalidInputError) and isinstance(error, ValueError)
    assert error.argument == "draft_token_ids"
    assert error.reason == REASON
    assert error.skip_message == SKIP_MESSAGE
    assert str(error) == f"draft_token_ids: {SKIP_MESSAGE}"
    with pytest.raises(ValueError, match="reason"):
        NotApplicable("  ")


@pytest.mark.parametrize("k", [0, 1])
def test_vllm_fly_window_is_not_applicable_below_k_2(k: int) -> None:
    """vLLM's FLy needs a window 1 <= W < k: below k = 2 the adapter raises NotApplicable
    with that reason (no vLLM import needed); at k >= 2 the window is min(6, k - 1)."""
    options = SamplerOptions(fly=True)
    with pytest.raises(NotApplicable, match=r"vLLM's FLy needs k >= 2") as caught:
        options.fly_window(k)
    assert caught.value.skip_message.startswith("not applicable: vLLM's FLy needs k >= 2")
    assert [options.fly_window(k) for k in (2, 4, 7, 9)] == [1, 3, 6, 6]

