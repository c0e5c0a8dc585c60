"""Coupled comparison of an implementation with the CPU reference (docs/architecture.md, 'What
lossless means', item 7).

The third promise of the suite: a GPU kernel agrees with its CPU reference. Peers do not test
this (vLLM compares its Triton kernel with a torch path on the same device; FlashInfer removed
explicit uniforms in 0.2.3, and with them its reference comparison).

This module holds the checks only, pure functions of samples already drawn: it calls no
verifier and draws nothing. The run engine's device unit (:mod:`losslessness.engine.device`)
draws the samples, calls the candidate and the reference, plans and budgets the assertions.

**Coupled path** (:func:`check_coupled_samples` on :class:`CoupledSamples`): both
implementations got the same drafts and the same uniforms
(:class:`losslessness.reference.ChainUniforms`), the candidate its inputs cast to a dtype on a
device, the reference the float64 inputs on CPU. Their outputs are compared row by row at the
first position where they differ. A disagreement is *excused* only where precision can explain
it (:mod:`losslessness.checks.precision` derives the tolerances from the dtype's unit roundoff
and V):

- a different accept/reject decision at draft position i, when ``p_i(d)/q_i(d) > 0`` and
  ``|p_i(d)/q_i(d) - u_i| <= decision_tolerance(dtype) * p_i(d)/q_i(d)``;
- a different final token (correction or bonus), when the candidate's token has ``p > 0`` and
  the sample uniform lies within ``sample_tolerance(dtype, V, mass)`` of that token's CDF
  interval.

Any other disagreement is LOSSY, reported with a reproducer (case hash, seed, step, row type,
position, the uniform and the ratio or CDF interval, both outputs). The result is an EXACT
check (no false alarms, no share of the error budget); its ``details`` give the excused share.
Implementations that take the uniforms for their decisions only (``compare_final=False``, e.g.
vLLM, whose recovered token is an exponential race) have their decisions compared, and their
final tokens left to the statistical path.

**Statistical path** (:func:`check_sampled_laws` on two :class:`~losslessness.checks.sampling.
ChainSamples`, for candidates that take no uniforms): each device is identity-tested against
the law of the inputs it was given (the conditional-law check on the cast inputs, so that
precision alone is not counted as loss), and a two-sample test
(:func:`losslessness.stats.two_sample_test`: Cressie-Read lambda = 2/3, pooled by the identity
test's rule) compares the candidate's emitted tokens with the reference's, position by position.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from losslessness.cases import ChainCase
from losslessness.checks.assertions import case_laws, law_is_statistical
from losslessness.checks.conditional_law import check_conditional_laws
from losslessness.checks.ids import COUPLING_CHECK_ID, TWO_SAMPLE_CHECK_ID
from losslessness.checks.precision import decision_tolerance, sample_tolerance
from losslessness.checks.structure import emitted_counts
from losslessness.laws import residual_distribution
from losslessness.protocol import PLACEHOLDER
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.samples import ChainSamples
from losslessness.stats import (
    exact_check_minimum_detectable_rate,
    two_sample_minimum_detectable_tv,
    two_sample_test,
)

MAX_REPORTED_DISAGREEMENTS = 5
"""How many unexcused disagreements a LOSSY coupling result lists in ``details``."""


@dataclass(frozen=True)
class CoupledSamples:
    """What one coupled comparison drew: the shared randomness and both implementations' outputs.

    Rows are the verification steps of every row type, interleaved as
    :func:`losslessness.checks.sampling.sample_chain` interleaves them: global row ``g`` is step
    ``g // R`` of row type ``g % R`` (``R = case.n_rows``); ``N = n_steps * R``.

    Attributes:
        case: the case (float64 p and q, as the reference received them).
        drafts: ``[N, k]`` int64, d_i drawn from the draft law the candidate received.
        accept_uniforms: ``[N, k]`` float64, the accept/reject uniforms both implementations got.
        sample_uniforms: ``[N]`` float64, the final-token uniforms both got.
        candidate_outputs: ``[N, k+1]`` int64, the candidate's outputs (-1 padded).
        reference_outputs: ``[N, k+1]`` int64, the reference's outputs.
        n_steps: verification steps per row type compared (those before any failure).
        seed: the seed that replays the comparison.
        dtype: the precision of the candidate's ``target_probs`` / ``draft_probs``.
        device: where the candidate's inputs lived (``"cpu"``, ``"cuda:0"``).
        failure: ``"<ExceptionType>: <message>"`` when the candidate raised, or returned a
            malformed array, on the call after the ``n_steps`` compared; else None.
        wall_time_s: seconds spent drawing and calling both implementations.

    Raises:
        ValueError: an array's shape, dtype or row count disagrees with ``case`` and
            ``n_steps`` (the message names the field).
    """

    case: ChainCase
    drafts: np.ndarray
    accept_uniforms: np.ndarray
    sample_uniforms: np.ndarray
    candidate_outputs: np.ndarray
    reference_outputs: np.ndarray
    n_steps: int
    seed: int
    dtype: torch.dtype
    device: str
    failure: str | None = None
    wall_time_s: float = 0.0

    def __post_init__(self) -> None:
        if self.n_steps < 0:
            raise ValueError(f"n_steps: must be >= 0, got {self.n_steps}")
        rows, k = self.n_steps * self.case.n_rows, self.case.k
        expected = {
            "drafts": ((rows, k), np.int64),
            "accept_uniforms": ((rows, k), np.float64),
            "sample_uniforms": ((rows,), np.float64),
            "candidate_outputs": ((rows, k + 1), np.int64),
            "reference_outputs": ((rows, k + 1), np.int64),
        }
        for name, (shape, dtype) in expected.items():
            array = getattr(self, name)
            if not isinstance(array, np.ndarray) or array.shape != shape or array.dtype != dtype:
                got = (
                    f"{array.dtype.name} {array.shape}"
                    if isinstance(array, np.ndarray)
                    else type(array).__name__
                )
                raise ValueError(
                    f"{name}: expected {np.dtype(dtype).name} array of shape {shape} "
                    f"(n_steps={self.n_steps}, R={self.case.n_rows}, k={k}), got {got}"
                )


@dataclass
class _Disagreement:
    """One row where candidate and reference differ, classified."""

    step: int
    row: int
    position: int
    what: str
    excused: bool
    uniform: float
    ratio: float | None
    cdf_interval: tuple[float, float] | None
    tolerance: float
    drafts: list[int]
    reference_output: list[int]
    candidate_output: list[int]

    def describe(self) -> str:
        where = f"step {self.step}, row type {self.row}, position {self.position}"
        if self.ratio is not None:
            numbers = f"u = {self.uniform:.17g}, p/q = {self.ratio:.17g}"
        elif self.cdf_interval is not None:
            low, high = self.cdf_interval
            numbers = f"sample uniform {self.uniform:.17g} vs candidate token's CDF interval "
            numbers += f"[{low:.17g}, {high:.17g})"
        else:
            numbers = ""
        return (
            f"{self.what} at {where} ({numbers}; tolerance {self.tolerance:.3g}): drafts "
            f"{self.drafts}, reference {self.reference_output}, candidate "
            f"{self.candidate_output}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "row": self.row,
            "position": self.position,
            "what": self.what,
            "uniform": self.uniform,
            "ratio": self.ratio,
            "cdf_interval": list(self.cdf_interval) if self.cdf_interval else None,
            "tolerance": self.tolerance,
            "drafts": self.drafts,
            "reference_output": self.reference_output,
            "candidate_output": self.candidate_output,
        }


def _classify(
    step: int,
    row: int,
    ref: np.ndarray,
    cand: np.ndarray,
    drafts: np.ndarray,
    accept: np.ndarray,
    sample: float,
    case: ChainCase,
    dtype: torch.dtype,
    compare_final: bool,
) -> _Disagreement | None:
    """Classify one row whose outputs differ (None when only an uncoupled final token does)."""
    k, vocab = case.k, case.vocab_size
    p, q = case.target_probs[row], case.draft_probs[row]
    shown = {
        "step": step,
        "row": row,
        "drafts": drafts.tolist(),
        "reference_output": ref.tolist(),
        "candidate_output": cand.tolist(),
    }
    n_ref = int(emitted_counts(ref)) - 1
    count = int(emitted_counts(cand))
    emitted = cand[:count]
    well_formed = (
        count >= 1
        and bool((cand[count:] == PLACEHOLDER).all())
        and bool(((emitted >= 0) & (emitted < vocab)).all())
        and bool((emitted[: count - 1] == drafts[: count - 1]).all())
    )
    if not well_formed:
        return _Disagreement(
            position=max(count - 1, 0),
            what="malformed candidate output (structure)",
            excused=False,
            uniform=float("nan"),
            ratio=None,
            cdf_interval=None,
            tolerance=0.0,
            **shown,
        )
    n_cand = count - 1
    if n_cand != n_ref:
        j = min(n_cand, n_ref)
        d = int(drafts[j])
        ratio = float(p[j, d] / p[j].sum()) / float(q[j, d] / q[j].sum())
        u = float(accept[j])
        tolerance = decision_tolerance(dtype)
        excused = ratio > 0 and abs(ratio - u) <= tolerance * ratio
        verb = "accepted" if n_cand > j else "rejected"
        return _Disagreement(
            position=j,
            what=f"candidate {verb} draft {d} where the reference did not",
            excused=excused,
            uniform=u,
            ratio=ratio,
            cdf_interval=None,
            tolerance=tolerance,
            **shown,
        )
    if not compare_final:
        return None
    n = n_ref
    token = int(cand[n])
    p_n = p[n].to(torch.float64) / p[n].sum()
    if n < k:
        q_n = q[n].to(torch.float64) / q[n].sum()
        law = residual_distribution(p_n, q_n)
        mass = float(torch.clamp(p_n - q_n, min=0).sum())
        what = f"candidate drew correction token {token} where the reference drew {int(ref[n])}"
    else:
        law, mass = p_n, 1.0
        what = f"candidate drew bonus token {token} where the reference drew {int(ref[n])}"
    cdf = law.cumsum(dim=0)
    low = float(cdf[token - 1]) if token > 0 else 0.0
    high = float(cdf[token])
    tolerance = sample_tolerance(dtype, vocab, min(max(mass, 0.0), 1.0))
    distance = max(low - sample, sample - high, 0.0)
    return _Disagreement(
        position=n,
        what=what,
        excused=bool(p_n[token] > 0) and distance <= tolerance,
        uniform=sample,
        ratio=None,
        cdf_interval=(low, high),
        tolerance=tolerance,
        **shown,
    )


def candidate_failed(
    context: CheckContext,
    check_id: str,
    n: int,
    device: str,
    dtype: torch.dtype,
    failure: str,
    wall_time_s: float = 0.0,
) -> CheckResult:
    """ERROR result of a candidate that raised, or returned a malformed array, after ``n``
    compared samples.

    Args:
        context: the comparison's context.
        check_id: :data:`~losslessness.checks.ids.COUPLING_CHECK_ID` (coupled path) or
            :data:`~losslessness.checks.ids.LAW_CHECK_ID` (statistical path).
        n: samples compared before the failure.
        device: where the candidate ran.
        dtype: the precision of its inputs.
        failure: ``"<ExceptionType>: <message>"``.
        wall_time_s: seconds spent before the failure.
    """
    return context.untested(
        check_id,
        Verdict.ERROR,
        f"candidate failed on {device} ({dtype}): {failure}",
        n=n,
        wall_time_s=wall_time_s,
    )


def check_coupled_samples(
    samples: CoupledSamples,
    context: CheckContext,
    *,
    precision: torch.dtype | None = None,
    compare_final: bool = True,
) -> CheckResult:
    """Compare the candidate's outputs with the reference's, fed the same drafts and uniforms.

    Args:
        samples: what the comparison drew (:class:`CoupledSamples`).
        context: the case's context (target name, seed, design power).
        precision: the precision the candidate computes in, from which the excusing tolerances
            are derived (default ``samples.dtype``; e.g. float16 for a kernel that takes float32
            probabilities but computes in half precision).
        compare_final: compare final tokens too (the candidate draws them from the sample
            uniforms by inverse CDF); False compares decisions only.

    Returns:
        One EXACT ``coupling`` result: LOSSY on any unexcused disagreement, with up to
        :data:`MAX_REPORTED_DISAGREEMENTS` in ``details["disagreements"]`` and the first as
        ``details["reproducer"]``; PASS otherwise, ``details["excused_share"]`` the share of
        steps whose disagreement precision explains. ERROR (``n`` the rows compared) when
        ``samples.failure`` is set: nothing is concluded from the rows before it.
    """
    began = time.perf_counter()
    case, dtype, device, seed = samples.case, samples.dtype, samples.device, samples.seed
    rows = case.n_rows
    tolerance_dtype = precision or dtype
    if samples.failure is not None:
        return candidate_failed(
            context,
            COUPLING_CHECK_ID,
            samples.n_steps * rows,
            device,
            dtype,
            samples.failure,
            samples.wall_time_s + time.perf_counter() - began,
        )
    got, expected = samples.candidate_outputs, samples.reference_outputs
    differ = np.flatnonzero((got != expected).any(axis=1))
    n = samples.n_steps * rows
    counts = {"agree": n - differ.size, "excused": 0, "unexcused": 0, "final_not_compared": 0}
    excused_decisions = 0
    shown: list[_Disagreement] = []
    for b in differ.tolist():
        found = _classify(
            b // rows,
            b % rows,
            expected[b],
            got[b],
            samples.drafts[b],
            samples.accept_uniforms[b],
            float(samples.sample_uniforms[b]),
            case,
            tolerance_dtype,
            compare_final,
        )
        if found is None:
            counts["agree"] += 1
            counts["final_not_compared"] += 1
        elif found.excused:
            counts["excused"] += 1
            excused_decisions += found.ratio is not None
        else:
            counts["unexcused"] += 1
            if len(shown) < MAX_REPORTED_DISAGREEMENTS:
                shown.append(found)
    share = counts["excused"] / n if n else 0.0
    details: dict[str, Any] = {
        "dtype": str(dtype),
        "precision": str(tolerance_dtype),
        "device": device,
        **counts,
        "excused_share": share,
        "excused_decisions": excused_decisions,
        "decision_tolerance": decision_tolerance(tolerance_dtype),
        "final_token_coupled": compare_final,
        "disagreements": [found.as_dict() for found in shown],
    }
    final_note = "" if compare_final else " (final tokens not coupled: decisions only)"
    if counts["unexcused"]:
        first = shown[0]
        replay = (
            f"replay: check_coupling(..., case {case.case_id!r} (hash {case.case_hash}), "
            f"n_steps={first.step + 1}, seed={seed}, dtype={dtype}, device={device!r})"
        )
        details["reproducer"] = {**first.as_dict(), "case_hash": case.case_hash, "seed": seed}
        message = (
            f"{counts['unexcused']} of {n} coupled steps disagree with the reference beyond "
            f"{tolerance_dtype} tolerance{final_note}. First: {first.describe()}. {replay}"
        )
        verdict = Verdict.LOSSY
    else:
        message = (
            f"same decisions as the reference on {n} coupled steps{final_note}; "
            f"{counts['excused']} disagreements ({share:.3g} of steps) excused as within "
            f"{tolerance_dtype} tolerance of a threshold"
        )
        verdict = Verdict.PASS
    return context.result(
        COUPLING_CHECK_ID,
        kind=CheckKind.EXACT,
        verdict=verdict,
        n=n,
        statistic=float(counts["unexcused"]),
        p_value=0.0 if counts["unexcused"] else 1.0,
        min_detectable_tv=exact_check_minimum_detectable_rate(n, context.power),
        wall_time_s=samples.wall_time_s + time.perf_counter() - began,
        message=message,
        details=details,
    )


def check_sampled_laws(
    candidate: ChainSamples,
    reference: ChainSamples,
    context: CheckContext,
    *,
    device: str,
    dtype: str,
) -> list[CheckResult]:
    """The statistical path: each side's conditional laws, then the two-sample tests.

    Args:
        candidate: the candidate's samples of the case it received (p and q cast to its
            input dtype, so that precision alone is not counted as loss).
        reference: the reference's independent samples of the same case.
        context: the candidate's context for that case; the reference's results carry the
            target ``<context.target>/reference``.
        device: where the candidate ran (for messages).
        dtype: its input dtype, as text (for messages).

    Returns:
        ``law`` results (and one-hot edges) of the candidate, then of the reference
        (:func:`losslessness.checks.check_conditional_laws`), then :func:`check_two_sample`'s.

    Raises:
        ValueError: the samples or the context are of different cases (names the argument).
    """
    _check_same_case(candidate, reference, context)
    reference_context = dataclasses.replace(context, target=f"{context.target}/reference")
    return [
        *check_conditional_laws(candidate, context),
        *check_conditional_laws(reference, reference_context),
        *check_two_sample(candidate, reference, context, device=device, dtype=dtype),
    ]


def _check_same_case(
    candidate: ChainSamples, reference: ChainSamples, context: CheckContext
) -> None:
    if reference.case.case_hash != candidate.case.case_hash:
        raise ValueError(
            f"reference: samples of case {reference.case.case_id!r}, the candidate's are of "
            f"{candidate.case.case_id!r}"
        )
    if context.case_hash != candidate.case.case_hash:
        raise ValueError(
            f"context: for case {context.case_id!r}, the samples are of {candidate.case.case_id!r}"
        )


def check_two_sample(
    candidate: ChainSamples,
    reference: ChainSamples,
    context: CheckContext,
    *,
    device: str,
    dtype: str,
) -> list[CheckResult]:
    """Two-sample test of the candidate's vs the reference's emitted tokens at every
    statistical (row, position) of the case (:func:`losslessness.checks.planning.
    law_is_statistical`, decided from the exact laws, never from the samples).

    Each test is :func:`losslessness.stats.two_sample_test` on the tokens emitted at position
    i by the steps that reach i (ids outside ``[0, V)`` are left to the structure check); LOSSY
    when its p-value is ``<= context.alpha``. ``n`` is the smaller sample's size and
    ``min_detectable_tv`` :func:`losslessness.stats.two_sample_minimum_detectable_tv` at both
    sizes (``df`` at least 1).

    Args, raises: as :func:`check_sampled_laws`.

    Returns:
        One STATISTICAL ``two-sample`` result per statistical (row, position).
    """
    _check_same_case(candidate, reference, context)
    case = candidate.case
    results = []
    got_counts = emitted_counts(candidate.outputs)
    expected_counts = emitted_counts(reference.outputs)
    for r, laws in enumerate(case_laws(case)):
        for i in range(case.k + 1):
            if not law_is_statistical(laws, i):
                continue
            began = time.perf_counter()
            a = candidate.outputs[r, got_counts[r] > i, i]
            b = reference.outputs[r, expected_counts[r] > i, i]
            a, b = a[(a >= 0) & (a < case.vocab_size)], b[(b >= 0) & (b < case.vocab_size)]
            test = two_sample_test(
                np.bincount(a, minlength=case.vocab_size),
                np.bincount(b, minlength=case.vocab_size),
            )
            n_small = min(int(a.size), int(b.size))
            verdict = Verdict.LOSSY if test.pvalue <= context.alpha else Verdict.PASS
            message = (
                f"{device} ({dtype}) and CPU reference emit the same law at position {i} "
                f"(two-sample chi-square, {a.size} vs {b.size} samples)"
            )
            if verdict is Verdict.LOSSY:
                message = (
                    f"{device} ({dtype}) and the CPU reference emit different laws at position "
                    f"{i}: two-sample chi-square p-value {test.pvalue:.3g} <= alpha "
                    f"{context.alpha:.3g}"
                )
            results.append(
                context.result(
                    TWO_SAMPLE_CHECK_ID,
                    kind=CheckKind.STATISTICAL,
                    verdict=verdict,
                    n=n_small,
                    position=i,
                    row=r,
                    statistic=test.statistic,
                    df=test.df,
                    p_value=test.pvalue,
                    min_detectable_tv=two_sample_minimum_detectable_tv(
                        int(a.size), int(b.size), max(test.df, 1), context.alpha, context.power
                    ),
                    wall_time_s=time.perf_counter() - began,
                    message=message,
                    details={
                        "cells": test.cells,
                        "test": "two_sample_test (chi2_contingency, Cressie-Read lambda=2/3)",
                    },
                )
            )
    return results
