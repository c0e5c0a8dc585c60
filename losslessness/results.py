"""Results: one :class:`CheckResult` per assertion, one :class:`TargetResult` per target, one
:class:`AuditResult` per run, and the verdict vocabulary (docs/architecture.md, 'What lossless
means').

The domain decides here, once, what the reports only render: a target's verdict from its
checks, the run's overall verdict and exit code, and the command that replays an assertion.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import math
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy
import torch

import losslessness
from losslessness.cases import ChainCase, GreedyCase
from losslessness.config import RunConfig

SCHEMA_VERSION = "4"
"""Version of the :class:`AuditResult` JSON layout (docs/report-schema.md)."""

MESSAGE_LIMIT = 500
"""Characters of a target-supplied message (an exception's text, a reason) kept where it is
recorded and shown: a longer one keeps its first :data:`MESSAGE_HEAD` and last
:data:`MESSAGE_TAIL` characters around a note of how many were left out
(:func:`shorten_message`); its full text is kept once, in
:attr:`TargetResult.full_messages`."""

MESSAGE_HEAD = 400
"""Leading characters :func:`shorten_message` keeps (the exception's type and first words)."""

MESSAGE_TAIL = MESSAGE_LIMIT - MESSAGE_HEAD
"""Trailing characters :func:`shorten_message` keeps (where the exception was raised)."""


def message_key(text: str) -> str:
    """The key of ``text`` in :attr:`TargetResult.full_messages`: the first 16 hex digits of
    its SHA-256 (of its UTF-8 form; unpaired surrogates escaped)."""
    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()[:16]


def shorten_message(text: str) -> str:
    """``text`` when it has at most :data:`MESSAGE_LIMIT` characters; else its first
    :data:`MESSAGE_HEAD` and last :data:`MESSAGE_TAIL` characters around a note saying how
    many were left out and where the full text is kept (``full_messages['<message_key>']`` of
    the target in the JSON record)."""
    if len(text) <= MESSAGE_LIMIT:
        return text
    left_out = len(text) - MESSAGE_HEAD - MESSAGE_TAIL
    note = (
        f" ... ({left_out} more characters; full text: full_messages[{message_key(text)!r}] "
        "in the JSON record) ... "
    )
    return text[:MESSAGE_HEAD] + note + text[-MESSAGE_TAIL:]


class Verdict(str, enum.Enum):
    """Outcome of one check.

    PASS: no violation at the stated level. LOSSY: a losslessness property is violated.
    SUBOPTIMAL: lossless, but accepts fewer drafts than sum min(p, q) (a warning).
    ERROR: the target crashed; nothing is concluded. SKIPPED: not applicable or not reachable.
    IRREPRODUCIBLE: the seed contract is broken (a seeded request's output changed with what
    else was in its batch); says nothing about the law, which may still be right.
    """

    PASS = "PASS"
    LOSSY = "LOSSY"
    SUBOPTIMAL = "SUBOPTIMAL"
    ERROR = "ERROR"
    SKIPPED = "SKIPPED"
    IRREPRODUCIBLE = "IRREPRODUCIBLE"


class CheckKind(str, enum.Enum):
    """EXACT checks fail on a single violation and have no false alarms; STATISTICAL checks
    spend a share of the run's family-wise false-alarm budget."""

    EXACT = "exact"
    STATISTICAL = "statistical"


@dataclass(frozen=True)
class LawCells:
    """What a law check observed, cell by cell, bounded: the tokens of largest target
    probability and one pooled cell for the rest (the figures of the reports read it).

    Attributes:
        tokens: kept token ids, by decreasing p (ties: lowest id first).
        observed: their counts among the samples that reached the position.
        p: their target probabilities.
        other_observed: counts of every other in-vocabulary token.
        other_p: mass of every other token (0 when every token is kept).
    """

    tokens: list[int]
    observed: list[int]
    p: list[float]
    other_observed: int
    other_p: float

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LawCells:
        """From :func:`dataclasses.asdict`'s form.

        Raises:
            ValueError: ``tokens``, ``observed`` and ``p`` differ in length.
        """
        cells = cls(**data)
        if not len(cells.tokens) == len(cells.observed) == len(cells.p):
            raise ValueError(
                f"tokens, observed and p: expected one entry per kept cell, got "
                f"{len(cells.tokens)}, {len(cells.observed)} and {len(cells.p)}"
            )
        return cells


@dataclass(frozen=True)
class AcceptanceCounts:
    """What an acceptance check observed at its position, given the position was reached.

    Attributes:
        expected_rate: sum min(p_i, q_i) = 1 - TV(p_i, q_i), what the standard algorithm
            accepts.
        accepted: drafts accepted among the ``reached`` steps.
        reached: steps that reached the position.
    """

    expected_rate: float
    accepted: int
    reached: int

    @property
    def observed_rate(self) -> float | None:
        """``accepted / reached`` (None when the position was never reached)."""
        return self.accepted / self.reached if self.reached else None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AcceptanceCounts:
        """From :func:`dataclasses.asdict`'s form."""
        return cls(**data)


LOG_E_CLIP = 1e9
"""Bound on a recorded log e-value's magnitude (``-inf``: no evidence at all; ``inf``: an
impossible observation; both far beyond any threshold)."""


@dataclass(frozen=True)
class SequentialEvidence:
    """What an assertion's sequential test (an e-process, :mod:`losslessness.stats.sequential`)
    saw: the run may stop a case with LOSSY as soon as an e-value crosses
    ``1 / alpha_sequential`` (Ville's inequality bounds that false-alarm probability by
    ``alpha_sequential`` at any stopping time).

    Attributes:
        alpha: the assertion's sequential level (its fixed-n test has ``CheckResult.alpha``).
        log_e_value: natural log of the e-value at the last look, clipped to
            [-:data:`LOG_E_CLIP`, :data:`LOG_E_CLIP`] so that records stay finite.
        log_threshold: natural log of the crossing threshold (``log(shards / alpha)``).
        steps: steps per row type the last look saw.
        crossed: the e-value crossed the threshold (the assertion is LOSSY).
    """

    alpha: float
    log_e_value: float
    log_threshold: float
    steps: int
    crossed: bool

    @property
    def e_value_text(self) -> str:
        """The e-value for messages (``e^x`` beyond float range)."""
        if self.log_e_value > 700:
            return f"e^{self.log_e_value:.0f}"
        return f"{math.exp(self.log_e_value):.3g}"

    def to_json(self) -> dict[str, Any]:
        """JSON-able form (the fields; every number is finite)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SequentialEvidence:
        """Inverse of :meth:`to_json`."""
        return cls(**data)


AssertionKey = tuple[str, int, int, int]
"""``(check id, row type, position, token)``: names one assertion for its sequential test
(:attr:`CheckResult.assertion_key`). Chain assertions have token 0 (independence position 0);
tree assertions row 0, the depth, and the node class's token."""


@dataclass
class CheckResult:
    """One assertion's record (docs/architecture.md, 'What lossless means'; issue 2, item 4).

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
        replay: the command that redraws exactly this assertion's samples and recomputes its
            test, or None where no command can (device comparisons).
        n_rows: row types of the case's batch (``row`` is one of them).
        cells: what a law check observed per cell (law and one-hot checks), else None.
        acceptance: what an acceptance check observed (acceptance and its edge checks), else
            None.
        sequential: the assertion's sequential test (level and e-value), when the run had
            one; ``alpha`` is then the fixed-n test's share of the assertion's level.
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
    replay: str | None = None
    n_rows: int = 1
    cells: LawCells | None = None
    acceptance: AcceptanceCounts | None = None
    sequential: SequentialEvidence | None = None

    @property
    def assertion_key(self) -> AssertionKey:
        """The key of the assertion this result reports (its check id, row, position and, for
        tree law classes, the class's token, ``details["token"]``)."""
        return (
            self.check_id,
            self.row or 0,
            self.position or 0,
            int(self.details.get("token", 0)),
        )

    @property
    def where(self) -> str:
        """Short location: ``case[row r] pos i``."""
        text = self.case_id
        if self.row is not None and self.n_rows > 1:
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
        n_rows: row types of the case's batch.
        details: what every result of the case records of the run that drew its samples
            (steps drawn and planned, capped, chunks, why it stopped early), added to each
            result's own details.
        sequential: the case's sequential evidence by assertion (from the monitors of every
            shard that sampled it), attached to the result of each assertion it names.
        stop_reason: why the case stopped before its planned steps, when it did (added to the
            messages of its monitored results).
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
    n_rows: int = 1
    details: Mapping[str, Any] = field(default_factory=dict, hash=False)
    sequential: Mapping[AssertionKey, SequentialEvidence] = field(
        default_factory=dict, hash=False
    )
    stop_reason: str | None = None

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
        return cls(
            target,
            case.case_id,
            case.summary,
            case.case_hash,
            alpha,
            power,
            tv,
            seed,
            n_rows=case.n_rows if isinstance(case, ChainCase) else 1,
        )

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
        cells: LawCells | None = None,
        acceptance: AcceptanceCounts | None = None,
    ) -> CheckResult:
        """Build the finished :class:`CheckResult` of one assertion of this case: exact checks
        get ``alpha`` 0.0, every result the context's run details, and a monitored assertion
        its sequential evidence (:meth:`_attach_sequential`)."""
        result = CheckResult(
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
            details={**(details or {}), **self.details},
            n_rows=self.n_rows,
            cells=cells,
            acceptance=acceptance,
        )
        self._attach_sequential(result)
        return result

    def _attach_sequential(self, result: CheckResult) -> None:
        """Attach the assertion's sequential evidence to its fixed-n ``result``, in place; an
        assertion whose e-value crossed is LOSSY (whatever the fixed-n test on the samples
        drawn says), with the crossing in its message."""
        found = self.sequential.get(result.assertion_key)
        if found is None:
            return
        result.sequential = found
        if found.crossed and result.verdict is not Verdict.LOSSY:
            result.verdict = Verdict.LOSSY
            result.message = (
                f"sequential test: e-value {found.e_value_text} >= 1/alpha_sequential "
                f"{math.exp(found.log_threshold):.3g} after {found.steps} steps "
                f"(anytime-valid, Ville's inequality); fixed-n test on those steps: "
                f"{result.message}"
            )
        elif self.stop_reason and found.steps:
            result.message += f" [case stopped early: {self.stop_reason}]"

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


JSON_NULL_FLOATS = frozenset({"min_detectable_tv"})
"""Float fields of a check whose JSON form may be ``null`` (an infinite value, read back as
inf by :func:`check_from_dict`); :func:`losslessness.records.validate_record` takes them."""


def check_from_dict(data: dict[str, Any]) -> CheckResult:
    """Inverse of :func:`check_to_dict` (also reads the check objects of a saved audit record).
    Its caller validates ``data`` first (:func:`losslessness.records.validate_record` against
    :class:`CheckResult`, with :data:`JSON_NULL_FLOATS`), so that a malformed record is
    reported by the path of its wrong field.

    Raises:
        KeyError, TypeError: a field is missing or unknown. ValueError: an unknown kind or
            verdict, or cells of different lengths (``cells.tokens, observed and p: ...``).
    """
    values = dict(data)
    values["kind"] = CheckKind(values["kind"])
    values["verdict"] = Verdict(values["verdict"])
    if values["min_detectable_tv"] is None:
        values["min_detectable_tv"] = math.inf
    if values.get("cells") is not None:
        try:
            values["cells"] = LawCells.from_dict(values["cells"])
        except ValueError as error:
            raise ValueError(f"cells.{error}") from error
    if values.get("acceptance") is not None:
        values["acceptance"] = AcceptanceCounts.from_dict(values["acceptance"])
    if values.get("sequential") is not None:
        values["sequential"] = SequentialEvidence.from_json(values["sequential"])
    return CheckResult(**values)


class TargetVerdict(str, enum.Enum):
    """Verdict on one target: LOSSLESS (every planned assertion ran at the design's power and
    none failed), LOSSY (any check LOSSY), SUBOPTIMAL (lossless but accepts fewer drafts than
    sum min(p, q)), INCONCLUSIVE (nothing failed, but the design was not reached: no checks, a
    step cap, a time budget that stopped or dropped cases, cases the target refused without
    declaring it: :func:`design_shortfalls`), ERROR (crashed, or a target the user named could
    not load; nothing LOSSY), UNAVAILABLE (a registered adapter or an optional unit whose
    package or device is missing here, or a target whose every check was SKIPPED by its own
    declared exclusions: nothing was tested, and the run's outcome ignores it), INCOMPLETE (the
    run was interrupted before the target's planned samples were drawn, and nothing finished
    was LOSSY: no LOSSLESS verdict can be given), IRREPRODUCIBLE (nothing LOSSY or ERROR, but
    the seed contract is broken: a seeded request's output depends on the rest of its batch;
    the emitted law may still be right)."""

    LOSSLESS = "LOSSLESS"
    LOSSY = "LOSSY"
    SUBOPTIMAL = "SUBOPTIMAL"
    INCONCLUSIVE = "INCONCLUSIVE"
    ERROR = "ERROR"
    UNAVAILABLE = "UNAVAILABLE"
    INCOMPLETE = "INCOMPLETE"
    IRREPRODUCIBLE = "IRREPRODUCIBLE"


VERDICT_PRECEDENCE = (
    TargetVerdict.LOSSY,
    TargetVerdict.INCOMPLETE,
    TargetVerdict.ERROR,
    TargetVerdict.IRREPRODUCIBLE,
    TargetVerdict.INCONCLUSIVE,
    TargetVerdict.SUBOPTIMAL,
)
"""The run's verdict is the first of these that any target has (then LOSSLESS)."""

EXIT_CODES = {
    TargetVerdict.LOSSY: 1,
    TargetVerdict.ERROR: 3,
    TargetVerdict.INCONCLUSIVE: 4,
    TargetVerdict.IRREPRODUCIBLE: 6,
    TargetVerdict.INCOMPLETE: 130,
}
"""Exit code of a run by its verdict (0 for the others: LOSSLESS, SUBOPTIMAL, UNAVAILABLE)."""

NOT_APPLICABLE_PREFIX = "not applicable: "
"""Message prefix of a check the target refused as not applicable
(:class:`~losslessness.adapters.NotApplicable`)."""

NOT_SAMPLED_PREFIXES = ("not sampled: ", "not run: ")
"""Message prefixes of a check whose samples were never drawn (a time budget's deadline, an
interrupt, a target already decided)."""

SPECULATION_NOT_SHOWN_PREFIX = "speculation not shown: "
"""Message prefix of a ``drafts-accepted`` check on an engine that must show speculation ran
(a whole engine audited end to end) and did not: no draft counters, or no draft accepted. Its
sequence law then says nothing about speculative decoding, so the target is INCONCLUSIVE."""

TV_TOLERANCE = 1.0001
"""A reached TV within this factor of the design's counts as reaching it (float rounding)."""


def is_not_applicable(check: CheckResult) -> bool:
    """Whether ``check`` was SKIPPED because the target refused its case as not applicable."""
    return check.verdict is Verdict.SKIPPED and check.message.startswith(NOT_APPLICABLE_PREFIX)


def _capped_by_user(check: CheckResult, config: RunConfig) -> bool:
    """Whether the run's ``max_steps`` (``--max-steps``, or a time budget's cap) cut the
    check's steps below what its design asked for; a cap the battery or the adapter builds into
    the CI plan (trees, end-to-end sequences) is part of the design and stated with the reached
    TV instead."""
    details = check.details
    if not details.get("capped"):
        return False
    ci_steps = details.get("ci_steps")
    if ci_steps is None:
        # End-to-end sequence checks record the sequences drawn ("steps") only.
        ci_steps = details.get("steps")
    return ci_steps is not None and int(ci_steps) >= config.max_steps


def design_shortfalls(
    checks: Sequence[CheckResult], config: RunConfig, exclusions: str | None = None
) -> list[str]:
    """Why a target's planned assertions did not all run at the design's power, read from its
    record alone (so a saved record, a report and a merge all give the same verdict).

    Args:
        checks: the target's check results.
        config: the run's design (``max_steps`` is the cap the user chose).
        exclusions: the cases the target's adapter declares it does not take, or None; its
            not-applicable checks then fall short of nothing (they are stated instead).

    Returns:
        One sentence per kind of shortfall, empty when the design was reached: no checks, a
        step cap, samples not drawn or fewer than planned (a time budget's deadline), cases
        dropped by the time budget, cases the target refused as not applicable without having
        declared it, whole engines that showed no speculation
        (:data:`SPECULATION_NOT_SHOWN_PREFIX`), assertions that detect no TV distance
        (:data:`VACUOUS_TV`).
    """
    if not checks:
        return ["no checks ran"]
    reasons = []
    refused = {c.case_id for c in checks if is_not_applicable(c)}
    if refused and exclusions is None:
        reasons.append(
            f"{len(refused)} cases not applicable to the target (undeclared): "
            + ", ".join(sorted(refused))
        )
    unsampled = {
        c.case_id
        for c in checks
        if c.verdict is Verdict.SKIPPED and c.message.startswith(NOT_SAMPLED_PREFIXES)
    }
    if unsampled:
        reasons.append(f"{len(unsampled)} cases not sampled: " + ", ".join(sorted(unsampled)))
    capped = {c.case_id for c in checks if _capped_by_user(c, config)}
    if capped:
        reasons.append(
            f"{len(capped)} cases capped at {config.max_steps} steps (--max-steps, or the time "
            "budget's cap) below their design: "
            + ", ".join(sorted(capped))
        )
    short = {
        c.case_id
        for c in checks
        if c.verdict is not Verdict.SKIPPED
        and isinstance(c.details.get("planned_steps"), int)
        and isinstance(c.details.get("steps"), int)
        and c.details["steps"] < c.details["planned_steps"]
    }
    if short:
        reasons.append(
            f"{len(short)} cases sampled fewer steps than planned: " + ", ".join(sorted(short))
        )
    if config.dropped_cases:
        reasons.append(
            "cases dropped by the time budget: " + ", ".join(config.dropped_cases)
        )
    unshown = sorted(
        {c.case_id for c in checks if c.message.startswith(SPECULATION_NOT_SHOWN_PREFIX)}
    )
    if unshown:
        reasons.append(
            f"{len(unshown)} cases where the engine showed no speculation (no draft accepted, "
            "or no draft counters): " + ", ".join(unshown)
        )
    blind = sorted({c.case_id for c in checks if _detects_nothing(c)})
    if blind:
        reasons.append(
            f"{len(blind)} cases with assertions that detect no TV distance (minimum detectable "
            f"TV >= {VACUOUS_TV:g}: too few steps for any claim): " + ", ".join(blind)
        )
    return reasons


VACUOUS_TV = 1.0
"""A minimum detectable TV at or above this (TV is at most 1) claims nothing: an assertion that
passed with it is a design shortfall, never a LOSSLESS verdict (the engines' night at the CPU
nightly's default step multiplier stated "every assertion at TV >= 1.08")."""


def _detects_nothing(check: CheckResult) -> bool:
    """A statistical assertion that passed on samples whose design detects no TV distance
    (a finite minimum detectable TV of at least :data:`VACUOUS_TV`; an infinite one is an
    assertion with no LOSSY side, such as an acceptance bound of 1, see :func:`reached_tv`)."""
    return (
        check.kind is CheckKind.STATISTICAL
        and check.verdict is Verdict.PASS
        and check.n > 0
        and math.isfinite(check.min_detectable_tv)
        and check.min_detectable_tv >= VACUOUS_TV
    )


def reached_tv(checks: Sequence[CheckResult]) -> float | None:
    """The design a target's statistical assertions reached: the largest minimum detectable TV
    among those that ran (each detects a TV at least that large with the design's power), or
    None when none ran. Assertions with nothing detectable on their LOSSY side (an infinite
    minimum detectable TV, such as an acceptance bound of 1, or the run-level p-value test)
    state no TV and are left out."""
    values = [
        check.min_detectable_tv
        for check in checks
        if check.kind is CheckKind.STATISTICAL
        and check.verdict is not Verdict.SKIPPED
        and check.verdict is not Verdict.ERROR
        and check.n > 0
        and math.isfinite(check.min_detectable_tv)
    ]
    return max(values) if values else None


def target_verdict(
    checks: Sequence[CheckResult],
    complete: bool = True,
    shortfalls: Sequence[str] = (),
) -> TargetVerdict:
    """A target's verdict from its checks: LOSSY if any check is LOSSY (finished evidence holds
    even in an interrupted run), else INCOMPLETE when ``complete`` is False, else ERROR if any
    is ERROR, else IRREPRODUCIBLE if the seed contract was broken, else UNAVAILABLE when there
    are checks, every one is SKIPPED and there is no shortfall (every case was excluded by the
    target's own declaration), else INCONCLUSIVE when the design was not reached
    (``shortfalls``, :func:`design_shortfalls`), else SUBOPTIMAL if any is SUBOPTIMAL, else
    LOSSLESS. SKIPPED checks beside others decide nothing: the others
    do."""
    verdicts = {check.verdict for check in checks}
    if Verdict.LOSSY in verdicts:
        return TargetVerdict.LOSSY
    if not complete:
        return TargetVerdict.INCOMPLETE
    if Verdict.ERROR in verdicts:
        return TargetVerdict.ERROR
    if Verdict.IRREPRODUCIBLE in verdicts:
        return TargetVerdict.IRREPRODUCIBLE
    if verdicts == {Verdict.SKIPPED} and not shortfalls:
        return TargetVerdict.UNAVAILABLE
    if shortfalls:
        return TargetVerdict.INCONCLUSIVE
    if Verdict.SUBOPTIMAL in verdicts:
        return TargetVerdict.SUBOPTIMAL
    return TargetVerdict.LOSSLESS


@dataclass
class TargetResult:
    """Everything a run found about one target.

    Attributes:
        name, description: the adapter's.
        verdict: see :class:`TargetVerdict`.
        checks: one record per assertion.
        wall_time_s: seconds spent on this target.
        verify_steps: verification steps (batch rows) the target ran.
        verifier_calls: calls made to the target.
        verifier_time_s: seconds spent inside the target.
        error: why the target could not be audited at all, if so (with the command that
            installs what is missing, for UNAVAILABLE).
        stopped_early: why its sampling stopped before the plan's steps (a sequential LOSSY
            verdict, with after how many steps; the time budget), else None.
        full_messages: the full text of every message of the target that was shortened where
            it was recorded (:func:`shorten_message`), once each, by :func:`message_key`.
        exclusions: the cases the target's adapter declares it does not take (its
            not-applicable checks are then stated, not a shortfall), else None.
        expected_verdict: the verdict the adapter declares it should get (``LOSSY`` for a
            target lossy by design), else None (LOSSLESS expected). Records written before
            the field existed read as None.
        expected_reason: why, when ``expected_verdict`` is set.
    """

    name: str
    description: str
    verdict: TargetVerdict
    checks: list[CheckResult] = field(default_factory=list)
    wall_time_s: float = 0.0
    verify_steps: int = 0
    verifier_calls: int = 0
    verifier_time_s: float = 0.0
    error: str | None = None
    stopped_early: str | None = None
    full_messages: dict[str, str] = field(default_factory=dict)
    exclusions: str | None = None
    expected_verdict: str | None = None
    expected_reason: str | None = None

    @property
    def expected(self) -> TargetVerdict | None:
        """The verdict the target should get when it is audited: the adapter's declaration, else
        LOSSLESS (SUBOPTIMAL also counts as lossless); None when it was not audited
        (UNAVAILABLE: nothing to compare)."""
        if self.verdict is TargetVerdict.UNAVAILABLE:
            return None
        if self.expected_verdict is not None:
            return TargetVerdict(self.expected_verdict)
        return TargetVerdict.LOSSLESS

    @property
    def as_expected(self) -> bool:
        """Whether the verdict is the expected one (SUBOPTIMAL meets a LOSSLESS expectation;
        an UNAVAILABLE target meets every expectation: it decides nothing)."""
        expected = self.expected
        if expected is None:
            return True
        if expected is TargetVerdict.LOSSLESS:
            return self.verdict in (TargetVerdict.LOSSLESS, TargetVerdict.SUBOPTIMAL)
        return self.verdict is expected


@dataclass
class AuditResult:
    """One run (plain dataclasses; :mod:`reports.jsonio` reads and writes it).

    Attributes:
        schema_version: :data:`SCHEMA_VERSION`.
        config: the design.
        n_assertions: statistical assertions the run's budget was split over.
        per_assertion_alpha: the battery's family-wise rate over ``n_assertions`` (Bonferroni).
        targets: one result per target, in the order requested.
        wall_time_s: seconds for the whole run.
        started_at: ISO 8601 UTC time the run started.
        environment: versions (python, torch, numpy, scipy, losslessness, platform, engines).
    """

    schema_version: str
    config: RunConfig
    n_assertions: int
    per_assertion_alpha: float
    targets: list[TargetResult]
    wall_time_s: float
    started_at: str
    environment: dict[str, str]

    @property
    def verdict(self) -> TargetVerdict:
        """The run's overall verdict: the first of :data:`VERDICT_PRECEDENCE` (LOSSY,
        INCOMPLETE, ERROR, IRREPRODUCIBLE, INCONCLUSIVE, SUBOPTIMAL) any target has, else
        LOSSLESS over the targets that ran; UNAVAILABLE only when every target was unavailable
        (those a user named are ERROR, never UNAVAILABLE); INCONCLUSIVE for a run without
        targets (nothing was audited)."""
        verdicts = {target.verdict for target in self.targets}
        for verdict in VERDICT_PRECEDENCE:
            if verdict in verdicts:
                return verdict
        if not verdicts:
            return TargetVerdict.INCONCLUSIVE
        if verdicts == {TargetVerdict.UNAVAILABLE}:
            return TargetVerdict.UNAVAILABLE
        return TargetVerdict.LOSSLESS

    @property
    def exit_code(self) -> int:
        """0 lossless (SUBOPTIMAL included), 1 any target LOSSY, 3 any target crashed or a named
        target could not load, 4 INCONCLUSIVE (a target's design was not reached), 6
        IRREPRODUCIBLE (a seeded request's output depended on its batch), 130 the run was
        interrupted (Ctrl-C) with nothing LOSSY (:data:`EXIT_CODES`)."""
        return EXIT_CODES.get(self.verdict, 0)

    @property
    def unexpected(self) -> list[TargetResult]:
        """Targets whose verdict differs from their expectation (:attr:`TargetResult.as_expected`):
        what makes a night red."""
        return [target for target in self.targets if not target.as_expected]


def design_note(config: RunConfig) -> str:
    """One sentence on the sequential split of the run's levels (empty in the fixed design),
    for the reports' budget lines."""
    if not config.early_stop:
        return ""
    from losslessness.stats.sequential import SEQUENTIAL_ALPHA_SHARE

    return (
        f" Each chain and tree assertion's alpha is split: {SEQUENTIAL_ALPHA_SHARE:g} of it to "
        "a sequential test (an e-process looked at after every call, which stops a lossy "
        f"target early), {1 - SEQUENTIAL_ALPHA_SHARE:g} to the fixed-n test, whose level is the "
        "'alpha' column."
    )


def run_environment() -> dict[str, str]:
    """Versions of what a run's numbers depend on: losslessness, Python, torch, numpy, scipy,
    the platform string, and every audited engine that is imported (transformers, vllm,
    sglang, flashinfer)."""
    environment = {
        "losslessness": losslessness.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "platform": platform.platform(),
    }
    for engine in ("transformers", "vllm", "sglang", "flashinfer"):
        if engine in sys.modules:
            environment[engine] = str(getattr(sys.modules[engine], "__version__", "unknown"))
    return environment
