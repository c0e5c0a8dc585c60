"""``--time-budget`` is a bound on the whole run: the warm-up counts against it, tree units stop
at its deadline like chain units, and the warm-up's outputs are checked like the run's own (a
verifier wrong only on its first call fails with a time budget as without one)."""

from __future__ import annotations

import time
from typing import Any

import torch

from losslessness.adapters import Adapter
from losslessness.config import RunConfig
from losslessness.engine import run_audit
from losslessness.reference import verify
from losslessness.results import TargetVerdict, Verdict
from losslessness.targets import resolve_adapter

SLACK_S = 15.0
"""Seconds a budgeted run may take beyond its budget: the checks after sampling, and a call in
progress at the deadline, on a loaded 2-core machine (the run itself takes ~2 s of them)."""

TREE_CASES = ("tree-chain-iid", "tree-star2-iid", "tree-binary-iid")
"""Tree cases of 16 calls each at the CI plan."""


class _SlowsDownAfterWarmUp:
    """The reference tree verifier, fast on its first ``fast_calls`` calls (the warm-up sees a
    cheap target) and ``seconds`` per call after (the fit underestimates the run: only the
    deadline can keep it within the budget)."""

    def __init__(self, fast_calls: int, seconds: float) -> None:
        self.calls, self.fast_calls, self.seconds = 0, fast_calls, seconds
        self.tree = resolve_adapter("reference").tree

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls > self.fast_calls:
            time.sleep(self.seconds)
        assert self.tree is not None
        return self.tree(*args)


def test_time_budget_bounds_the_run_warm_up_and_tree_units_included() -> None:
    """A tree target that slows down after the warm-up (48 s of planned calls at the pace it
    reaches) under a 6-second budget: the whole run, warm-up and checks included, ends within
    the budget plus :data:`SLACK_S`, and the tree cases say they stopped at the budget."""
    budget = 6.0
    slow = Adapter("slowing", "reference tree verifier, 1 s per call after the warm-up",
                   tree=_SlowsDownAfterWarmUp(len(TREE_CASES), 1.0))
    began = time.perf_counter()
    result = run_audit([slow], RunConfig(cases=TREE_CASES, time_budget_s=budget))
    elapsed = time.perf_counter() - began
    assert elapsed <= budget + SLACK_S
    (target,) = result.targets
    stopped = {c.case_id for c in target.checks if c.details.get("stopped") == "time budget spent"}
    skipped = {c.case_id for c in target.checks
               if c.verdict is Verdict.SKIPPED and "time budget spent" in c.message}
    assert stopped | skipped == set(TREE_CASES), target.checks


_first_call_done = False


def _wrong_on_first_call(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """The reference, except that its first call emits for every row a token that differs
    from the draft at an accepted position (a lazily initialised kernel's first call)."""
    global _first_call_done
    if not _first_call_done:
        _first_call_done = True
        batch, _ = draft_token_ids.shape
        wrong = (draft_token_ids + 1) % target_probs.shape[-1]
        return torch.cat([wrong, torch.zeros(batch, 1, dtype=torch.int64)], dim=1)
    return verify(target_probs, draft_probs, draft_token_ids, generator)


def test_verifier_wrong_only_on_its_first_call_is_lossy_under_a_time_budget() -> None:
    """The first call of the run is a warm-up call: its outputs join the case's table, so the
    exact structure check sees the wrong row and the target is LOSSY, as without a budget."""
    global _first_call_done
    _first_call_done = False
    target = Adapter("first-call", "wrong on its first call", chain=_wrong_on_first_call)
    result = run_audit([target], RunConfig(cases=("v8-far",), time_budget_s=20.0))
    (audited,) = result.targets
    assert audited.verdict is TargetVerdict.LOSSY
    assert any(c.check_id == "structure" and c.verdict is Verdict.LOSSY for c in audited.checks)
    assert result.exit_code == 1
