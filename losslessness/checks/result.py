"""Results of checks: one :class:`CheckResult` per assertion, and the verdict vocabulary."""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from losslessness.checks.cases import ChainCase, GreedyCase


class Verdict(str, enum.Enum):
    """Outcome of one check.

    PASS: no violation at the stated level. LOSSY: a losslessness property is violated.
    SUBOPTIMAL: lossless, but accepts fewer drafts than sum min(p, q) (a warning).
    ERROR: the target crashed; nothing is concluded. SKIPPED: not applicable or not reachable.
    """

    PASS = "PASS"
    LOSSY = "LOSSY"
    SUBOPTIMAL = "SUBOPTIMAL"
    ERROR = "ERROR"
    SKIPPED = "SKIPPED"


class CheckKind(str, enum.Enum):
    """EXACT checks fail on a single violation and have no false alarms; STATISTICAL checks
    spend a share of the run's family-wise false-alarm budget."""

    EXACT = "exact"
    STATISTICAL = "statistical"


@dataclass
class CheckResult:
    """One assertion's record (DESIGN.md section 4; issue 2, item 4).

    Attributes:
        check_id: ``structure``, ``law``, ``acceptance``, ``edge.disjoint``, ``edge.one-hot``,
            ``edge.p-equals-q`` or ``greedy``.
        target: the audited adapter's name.
        case_id: the battery case's name; ``case_summary`` describes it, ``case_hash`` pins its
            exact tensors.
        position: the draft position i (``k`` is the bonus), or None for whole-case checks.
        row: the row type within a mixed batch (0 for single-row cases), or None.
        kind: exact or statistical.
        n: observations the assertion used (samples reaching the position, verify steps, ...).
        statistic: the test statistic (Cressie-Read power divergence; observed acceptance
            rate; violation count for exact checks), or None.
        df: degrees of freedom of a chi-square test, else None.
        p_value: the test's p-value (0.0 or 1.0 for exact checks), or None when not run.
        alpha: the per-assertion significance level (0.0 for exact checks).
        power: the design power 1 - beta.
        min_detectable_tv: the smallest TV distance detected with probability ``power`` at
            this n (for acceptance: the smallest shift of the acceptance rate; for exact checks:
            the smallest per-sample violation rate); ``inf`` when nothing is detectable.
        verdict: see :class:`Verdict`.
        seed: the seed that replays this assertion's samples.
        wall_time_s: seconds spent on the samples and test of this assertion (sampling time is
            shared by a case's assertions and reported on each).
        message: human-readable detail (what failed, where, with an example).
        details: extra JSON-able numbers (expected rate, pooled mass, counts, ...).
    """

    check_id: str
    target: str
    case_id: str
    case_summary: str
    case_hash: str
    position: int | None
    row: int | None
    kind: CheckKind
    n: int
    statistic: float | None
    df: int | None
    p_value: float | None
    alpha: float
    power: float
    min_detectable_tv: float
    verdict: Verdict
    seed: int
    wall_time_s: float
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def where(self) -> str:
        """Short location: ``case[row r] pos i``."""
        text = self.case_id
        if self.row is not None and self.details.get("n_rows", 1) > 1:
            text += f"[row {self.row}]"
        if self.position is not None:
            text += f" pos {self.position}"
        return text


@dataclass(frozen=True)
class CheckContext:
    """What every check of one case needs besides the samples.

    Attributes:
        target: the audited adapter's name.
        case_id, case_summary, case_hash: identify the case.
        alpha: per-assertion significance level of statistical checks.
        power: design power 1 - beta.
        tv: design TV distance.
        seed: the seed that replays the case's samples.
        sampling_time_s: seconds the case's samples took (shared by its assertions).
    """

    target: str
    case_id: str
    case_summary: str
    case_hash: str
    alpha: float
    power: float
    tv: float
    seed: int
    sampling_time_s: float = 0.0

    @classmethod
    def for_case(
        cls,
        target: str,
        case: ChainCase | GreedyCase,
        *,
        alpha: float,
        power: float,
        tv: float,
        seed: int,
    ) -> CheckContext:
        """The context of ``case`` audited on ``target`` (sampling time filled in later)."""
        return cls(target, case.case_id, case.summary, case.case_hash, alpha, power, tv, seed)

    def result(
        self,
        check_id: str,
        *,
        kind: CheckKind,
        n: int,
        verdict: Verdict,
        min_detectable_tv: float,
        position: int | None = None,
        row: int | None = None,
        statistic: float | None = None,
        df: int | None = None,
        p_value: float | None = None,
        wall_time_s: float = 0.0,
        message: str = "",
        details: dict[str, Any] | None = None,
    ) -> CheckResult:
        """Build a :class:`CheckResult` for this case (exact checks get ``alpha`` 0.0)."""
        return CheckResult(
            check_id=check_id,
            target=self.target,
            case_id=self.case_id,
            case_summary=self.case_summary,
            case_hash=self.case_hash,
            position=position,
            row=row,
            kind=kind,
            n=n,
            statistic=statistic,
            df=df,
            p_value=p_value,
            alpha=self.alpha if kind is CheckKind.STATISTICAL else 0.0,
            power=self.power,
            min_detectable_tv=min_detectable_tv,
            verdict=verdict,
            seed=self.seed,
            wall_time_s=self.sampling_time_s + wall_time_s,
            message=message,
            details=details or {},
        )

    def untested(
        self,
        check_id: str,
        verdict: Verdict,
        message: str,
        *,
        n: int = 0,
        wall_time_s: float = 0.0,
    ) -> CheckResult:
        """An exact result with no test behind it: the check could not run (ERROR: the target
        raised; SKIPPED: nothing to test), so no statistic or p-value, an infinite minimum
        detectable TV, and ``n`` the samples drawn before it stopped (default 0)."""
        return self.result(
            check_id,
            kind=CheckKind.EXACT,
            n=n,
            verdict=verdict,
            min_detectable_tv=float("inf"),
            wall_time_s=wall_time_s,
            message=message,
        )


def check_to_dict(check: CheckResult) -> dict[str, Any]:
    """JSON-able dictionary of a :class:`CheckResult` (enums as values, an infinite minimum
    detectable TV as None)."""
    data = dataclasses.asdict(check)
    data["kind"] = check.kind.value
    data["verdict"] = check.verdict.value
    if not math.isfinite(check.min_detectable_tv):
        data["min_detectable_tv"] = None
    return data


def check_from_dict(data: dict[str, Any]) -> CheckResult:
    """Inverse of :func:`check_to_dict` (also reads the check objects of a saved audit record).

    Raises:
        KeyError, TypeError: a field is missing or unknown. ValueError: an unknown kind or
            verdict.
    """
    values = dict(data)
    values["kind"] = CheckKind(values["kind"])
    values["verdict"] = Verdict(values["verdict"])
    if values["min_detectable_tv"] is None:
        values["min_detectable_tv"] = math.inf
    return CheckResult(**values)
