"""Sequential early stopping and the time budget in the run engine: a lossy target stops early
and says after how many steps, a lossless one draws every planned step with each level split
and stated, cases are interleaved without changing their samples, and a slow target's run fits
its time budget."""

from __future__ import annotations

import time

import pytest
import torch
from click.testing import CliRunner

from losslessness.adapters import Adapter
from losslessness.cli import main
from losslessness.config import RunConfig
from losslessness.engine import plan_run, run_audit
from losslessness.engine.time_budget import FIT_FRACTION, fit_time_budget
from losslessness.reference import verify
from losslessness.results import CheckKind, TargetVerdict, Verdict, design_shortfalls
from losslessness.stats.sequential import SEQUENTIAL_ALPHA_SHARE
from losslessness.targets import resolve_adapter

CASES = ("v2-tilted", "v8-far", "v16-near-k4")


def test_lossy_mutant_stops_early_and_says_after_how_many_steps() -> None:
    """A lossy mutant of the zoo is LOSSY after far fewer steps than the plan, its record says
    why and after how many verify steps, and its other cases stop with it."""
    mutant = resolve_adapter("mutant/draft-chosen-greedily")
    config = RunConfig(cases=CASES)
    planned = sum(grid.n_steps for grid in plan_run(config, [mutant]).record.chain_cases.values())
    target = run_audit([mutant], config).targets[0]
    assert target.verdict is TargetVerdict.LOSSY
    assert target.stopped_early is not None and target.stopped_early.startswith("LOSSY after")
    assert f"after {target.verify_steps} verify steps" in target.stopped_early
    assert target.verify_steps < planned / 4
    assert any(c.verdict is Verdict.LOSSY for c in target.checks)


def test_lossless_target_draws_every_planned_step_with_its_level_split_and_stated() -> None:
    """The reference is not stopped: every case draws its planned steps, every identity and
    acceptance result states the fixed-n level (alpha) and the sequential level, which sum to
    the assertion's share of the budget, and the verdict is LOSSLESS."""
    config = RunConfig(cases=CASES)
    reference = resolve_adapter("reference")
    plan = plan_run(config, [reference]).record
    result = run_audit([reference], config)
    target = next(t for t in result.targets if t.name == "reference")
    assert target.verdict is TargetVerdict.LOSSLESS and target.stopped_early is None
    statistical = [c for c in target.checks if c.kind is CheckKind.STATISTICAL
                   and c.check_id in ("law", "acceptance", "independence")]
    assert statistical
    for check in statistical:
        assert check.details["steps"] == plan.chain_cases[check.case_id].n_steps
        assert check.sequential is not None and not check.sequential.crossed
        assert check.sequential.alpha == pytest.approx(
            SEQUENTIAL_ALPHA_SHARE * plan.per_assertion_alpha
        )
        assert check.alpha + check.sequential.alpha == pytest.approx(plan.per_assertion_alpha)


def test_fixed_design_gives_the_whole_level_to_the_fixed_n_test() -> None:
    """``early_stop=False``: no sequential records, alpha is the whole per-assertion level, and
    a lossy target draws every planned step."""
    mutant = resolve_adapter("mutant/draft-chosen-greedily")
    config = RunConfig(cases=CASES[:1], early_stop=False)
    plan = plan_run(config, [mutant]).record
    target = run_audit([mutant], config).targets[0]
    assert target.verdict is TargetVerdict.LOSSY and target.stopped_early is None
    assert target.verify_steps == sum(
        grid.n_steps * 1 for grid in plan.chain_cases.values()
    )
    statistical = [c for c in target.checks if c.kind is CheckKind.STATISTICAL]
    assert all(c.sequential is None for c in statistical)
    assert all(c.alpha == pytest.approx(plan.per_assertion_alpha) for c in statistical)


def test_interleaving_cases_leaves_each_cases_samples_unchanged() -> None:
    """A case audited with others (sampled call by call, interleaved) gives exactly the
    p-values it gives alone: its samples depend on its seed, never on the order of calls."""
    reference = resolve_adapter("reference")
    together = run_audit([reference], RunConfig(cases=CASES, steps=3000, early_stop=False))
    alone = run_audit([reference], RunConfig(cases=("v8-far",), steps=3000, early_stop=False))

    def p_values(result: object, case_id: str) -> dict[tuple[str, int | None, int | None], float]:
        return {
            (c.check_id, c.position, c.row): c.p_value
            for t in result.targets  # type: ignore[attr-defined]
            for c in t.checks
            if c.case_id == case_id and c.kind is CheckKind.STATISTICAL
            and c.check_id in ("law", "acceptance", "independence")
        }

    assert p_values(together, "v8-far") == p_values(alone, "v8-far")


def _slow_verify(target: torch.Tensor, draft: torch.Tensor, ids: torch.Tensor,
                 generator: torch.Generator) -> torch.Tensor:
    """The reference, one batch row at a time with a 0.1 ms pause each (a batch-1 target
    whose speed does not depend on how fast the reference is: at most 10,000 rows/s)."""
    rows = []
    for b in range(target.shape[0]):
        time.sleep(1e-4)
        rows.append(verify(target[b : b + 1], draft[b : b + 1], ids[b : b + 1], generator))
    return torch.cat(rows)


def test_time_budget_fits_a_slow_target_and_states_what_it_can_claim() -> None:
    """A batch-1 target under a 2-second budget: the fit raises the design TV (said before
    sampling, with the warm-up's time), the run samples for at most the budget, and every
    statistical result reports the minimum detectable TV its samples reached. The target is
    LOSSLESS only when every assertion reached the claimed design; a cap the fit chose or a
    deadline that cut the sampling (this machine's speed decides) leaves it INCONCLUSIVE,
    with the reasons in its record; a warm-up that reached no case (a loaded machine, seen in
    a fresh-clone tox run) claims nothing. The default design (TV 0.05, 19,109 rows on these
    cases) cannot fit whatever the machine: at the target's top speed, 10,000 rows/s, it needs
    1.9 s, above the 1.6 s the fit allows itself (FIT_FRACTION of 2 s); at 6 s it almost fit
    on a fast machine (5 s needed, 4.8 s allowed)."""
    slow = Adapter("slow", "reference one row at a time", chain=_slow_verify)
    # The reference's first call loads its numba kernels: paid here, not in the 1 s warm-up.
    half = torch.full((1, 2, 2), 0.5, dtype=torch.float64)
    verify(half, half[:, :1], torch.zeros((1, 1), dtype=torch.int64), torch.Generator())
    config = RunConfig(cases=CASES, time_budget_s=2.0)
    claims: list[str] = []
    began = time.perf_counter()
    result = run_audit([slow], config, announce=claims.append)
    elapsed = time.perf_counter() - began
    assert len(claims) == 1 and claims[0].startswith("in 2 s, slow allows TV >= ")
    assert result.environment["time budget"] == claims[0]
    target = result.targets[0]
    if " on 0 cases" in claims[0]:
        # A loaded machine's warm-up may reach no case in its second: nothing is claimed.
        assert "the warm-up had no time for them: v16-near-k4, v2-tilted, v8-far" in claims[0]
        assert target.verdict is not TargetVerdict.LOSSLESS
        return
    assert result.config.tv > 0.05, claims
    shortfalls = design_shortfalls(target.checks, result.config)
    expected = TargetVerdict.INCONCLUSIVE if shortfalls else TargetVerdict.LOSSLESS
    assert target.verdict is expected
    sampling = sum(c.wall_time_s for c in target.checks if c.check_id == "structure")
    assert sampling <= 2.0
    assert elapsed <= 2.0 + 30.0
    laws = [c for c in target.checks if c.check_id == "law" and c.kind is CheckKind.STATISTICAL]
    assert laws and all(c.min_detectable_tv > 0 for c in laws)


def test_fit_drops_cases_only_when_the_rest_cannot_fit_and_names_them() -> None:
    """The fit's claim is consistent with its plan: the estimate fits FIT_FRACTION of the
    budget (or one case is left), and dropped cases are named."""
    slow = Adapter("slow", "reference one row at a time", chain=_slow_verify)
    fit = fit_time_budget(RunConfig(cases=(*CASES, "v4096-flat"), time_budget_s=4.0), [slow])
    total = sum(fit.estimate_s.values())
    assert total <= FIT_FRACTION * 4.0 or len(fit.config.cases) == 1
    for case_id in fit.dropped:
        assert case_id in fit.claim and case_id not in fit.config.cases


def test_time_budget_must_be_positive() -> None:
    """A zero or negative budget is refused, naming the field."""
    with pytest.raises(ValueError, match="time_budget_s"):
        RunConfig(time_budget_s=0.0)


def test_time_budget_refuses_fixed_steps() -> None:
    """A time budget chooses the steps: combined with fixed steps (a replay) it is refused,
    naming the field."""
    with pytest.raises(ValueError, match="time_budget_s"):
        RunConfig(time_budget_s=10.0, steps=100)


def _raising_verify(target: torch.Tensor, draft: torch.Tensor, ids: torch.Tensor,
                    generator: torch.Generator) -> torch.Tensor:
    raise RuntimeError("kernel not built")


def test_target_failing_in_the_warm_up_is_named_and_still_audited_as_error() -> None:
    """A target that raises during the warm-up costs nothing in the fit, the claim names it
    and the case, and the run records its checks as ERROR (exit 3), the other target still
    audited."""
    broken = Adapter("broken", "raises", chain=_raising_verify)
    claims: list[str] = []
    result = run_audit([broken, resolve_adapter("reference")],
                       RunConfig(cases=CASES[:1], time_budget_s=20.0), announce=claims.append)
    assert "warm-up failed on broken v2-tilted (RuntimeError: kernel not built)" in claims[0]
    verdicts = {t.name: t.verdict for t in result.targets}
    assert verdicts["broken"] is TargetVerdict.ERROR
    assert verdicts["reference"] is TargetVerdict.LOSSLESS
    assert result.exit_code == 3


def test_time_budget_fits_at_the_ci_step_multiplier_whatever_the_config_had() -> None:
    """The fit sizes the run itself: a config whose step multiplier is the CPU nightly's 0.05
    is fitted with multiplier 1, so the claimed TV is the one the planned steps detect (with
    0.05 left in place the plan would draw a twentieth of the steps the claim priced: the
    engines nightly claimed TV 0.05 and its laws reached 0.15-0.6)."""
    slow = Adapter("slow", "reference one row at a time", chain=_slow_verify)
    fit = fit_time_budget(RunConfig(cases=CASES, time_budget_s=4.0, step_multiplier=0.05), [slow])
    assert fit.config.step_multiplier == 1.0
    plan = plan_run(fit.config, [slow])
    assert plan.config.step_multiplier == 1.0
    total = sum(fit.estimate_s.values())
    assert total <= FIT_FRACTION * 4.0 or len(fit.config.cases) == 1


def test_nightly_refuses_a_step_multiplier_with_a_time_budget() -> None:
    """``losslessness nightly --budget X --time-budget S`` exits 2 naming both options (before
    anything is planned): one sizes the run by steps, the other by time."""
    result = CliRunner().invoke(
        main, ["nightly", "--budget", "0.1", "--time-budget", "10", "--no-progress"]
    )
    assert result.exit_code == 2
    assert "--budget" in result.output and "--time-budget" in result.output


def _writes_q_over_p(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Hostile: the zoo's ``residual-zeroes-rejected-token`` (lossy), which after every call
    writes q over p in its input buffer, so that the calls after the first see corrupted
    inputs."""
    lossy = resolve_adapter("mutant/residual-zeroes-rejected-token").chain
    assert lossy is not None
    output = lossy(target_probs, draft_probs, draft_token_ids, generator)
    k = draft_probs.shape[1]
    target_probs[:, :k] = draft_probs
    return output


@pytest.mark.parametrize("early_stop", [True, False])
def test_a_verifier_writing_into_its_inputs_cannot_turn_early_stopping_into_lossless(
    early_stop: bool,
) -> None:
    """Evidence drawn from overwritten inputs decides nothing: the chunk is redrawn with fresh
    inputs before any stop, so a lossy verifier that writes q over p after each call is LOSSY
    with early stopping as without it (before the fix, on these three cases: LOSSLESS beside
    'stopped early: LOSSY')."""
    hostile = Adapter("writes-q-over-p", "lossy, overwrites its inputs", chain=_writes_q_over_p)
    target = run_audit([hostile], RunConfig(cases=CASES, early_stop=early_stop)).targets[0]
    assert target.verdict is TargetVerdict.LOSSY, target.stopped_early
