"""What two runs must agree on, check by check, for their results to count as the same."""

from __future__ import annotations

from losslessness.results import CheckResult


def check_outcome(check: CheckResult) -> tuple[object, ...]:
    """The fields that identify a check and its outcome (not its timings)."""
    return (
        check.target,
        check.check_id,
        check.case_id,
        check.position,
        check.row,
        check.n,
        check.statistic,
        check.p_value,
        check.alpha,
        check.verdict,
    )
