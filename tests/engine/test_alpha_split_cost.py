"""The price of the sequential test: splitting each assertion's level (a quarter to the
e-process, the rest to the fixed-n test) must cost the LOSSLESS design at most 5% more planned
samples, case by case.

Measured on the default battery (reference target, default design): chain cases 281,021 ->
283,094 planned steps (+0.7%; worst case v2-tilted +2.0%), tree cases 334,086 -> 339,555
trees asked for before the cap (+1.6%), 156,561 -> 156,884 after it. The fixed-n tests' power
at the design TV is unchanged: they are sized at their own (smaller) level.
"""

from __future__ import annotations

from losslessness.config import RunConfig
from losslessness.engine import plan_run
from losslessness.targets import resolve_adapter

GOAL = 1.05


def test_alpha_split_costs_at_most_five_percent_more_planned_samples() -> None:
    """Every chain case's and tree case's planned samples (before caps) grow by at most 5%
    when the level is split, and so do the battery's totals."""
    reference = resolve_adapter("reference")
    fixed = plan_run(RunConfig(early_stop=False), [reference]).record
    split = plan_run(RunConfig(early_stop=True), [reference]).record
    assert split.alpha_split.fixed < fixed.alpha_split.fixed == fixed.per_assertion_alpha
    for plans_fixed, plans_split in (
        (fixed.chain_cases, split.chain_cases),
        (fixed.tree_cases, split.tree_cases),
    ):
        assert plans_fixed.keys() == plans_split.keys()
        for case_id, before in plans_fixed.items():
            after = plans_split[case_id]
            assert before.needed_steps <= after.needed_steps <= GOAL * before.needed_steps, case_id
        total_before = sum(plan.needed_steps for plan in plans_fixed.values())
        total_after = sum(plan.needed_steps for plan in plans_split.values())
        assert total_after <= GOAL * total_before
