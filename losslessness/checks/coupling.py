"""Coupled comparison of an implementation with the CPU reference (DESIGN.md section 4, item 7).

The third promise of the suite: a GPU kernel agrees with its CPU reference. Peers do not test
this (vLLM compares its Triton kernel with a torch path on the same device; FlashInfer removed
explicit uniforms in 0.2.3, and with them its reference comparison).

**Coupled path** (the candidate takes the chain protocol's optional ``uniforms=`` keyword,
:class:`losslessness.reference.ChainUniforms`): both implementations get the same drafts and the
same uniforms, the candidate its inputs cast to ``dtype`` on ``device``, the reference the
float64 inputs on CPU. Their outputs are compared row by row at the first position where they
differ. A disagreement is *excused* only where precision can explain it
(:mod:`losslessness.checks.precision` derives the tolerances from the dtype's unit roundoff and
V):

- a different accept/reject decision at draft position i, when ``p_i(d)/q_i(d) > 0`` and
  ``|p_i(d)/q_i(d) - u_i| <= decision_tolerance(dtype) * p_i(d)/q_i(d)``;
- a different final token (correction or bonus), when the candidate's token has ``p > 0`` and
  the sample uniform lies within ``sample_tolerance(dtype, V, mass)`` of that token's CDF
  interval.

Any other disagreement is LOSSY, reported with a reproducer (case hash, seed, step, row type,
position, the uniform and the ratio or CDF interval, both outputs). The result is an EXACT
check (no false alarms, no share of the error budget); its ``details`` give the excused share.
Implementations that take the uniforms for their decisions only (``coupled_final_token =
False`` on the verifier, e.g. vLLM, whose recovered token is an exponential race) have their
decisions compared, and their final tokens left to the statistical path.

**Statistical path** (the candidate takes no uniforms): each device is identity-tested against
the law of the inputs it was given (the conditional-law check on the cast inputs, so that
precision alone is not counted as loss), and a two-sample chi-square test
(``scipy.stats.chi2_contingency``, Cressie-Read lambda = 2/3, cells expected below 20 pooled)
compares the candidate's emitted tokens with the reference's, position by position.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats

from losslessness.adapters.base import AdapterUnavailable
from losslessness.cases import ChainCase
from losslessness.checks.assertions import case_laws, law_is_statistical
from losslessness.checks.conditional_law import check_conditional_laws
from losslessness.checks.precision import (
    cast_probabilities,
    check_precision,
    decision_tolerance,
    sample_tolerance,
)
from losslessness.checks.structure import emitted_counts
from losslessness.engine.battery import default_chain_battery
from losslessness.engine.draw import ProtocolViolation, coerce_output, rows_per_call, sample_chain
from losslessness.protocol import PLACEHOLDER, ChainVerifier
from losslessness.reference import ChainUniforms, residual_distribution, sample_inverse_cdf
from losslessness.reference import verify as reference_verify
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict
from losslessness.samples import ChainSamples
from losslessness.seeding import derive_seed
from losslessness.stats import (
    EXPECTED_COUNT_FLOOR,
    ErrorBudget,
    exact_check_minimum_detectable_rate,
    minimum_detectable_tv,
)

MAX_REPORTED_DISAGREEMENTS = 5
"""How many unexcused disagreements a LOSSY coupling result lists in ``details``."""


def accepts_uniforms(verifier: Callable[..., Any]) -> bool:
    """Whether ``verifier`` takes the chain protocol's optional ``uniforms=`` keyword.

    Read from its signature (``inspect.signature``): a parameter named ``uniforms`` that can be
    passed by keyword. ``**kwargs`` alone does not count: silently ignored uniforms would make a
    coupled comparison meaningless.
    """
    try:
        parameters = inspect.signature(verifier).parameters
    except (TypeError, ValueError):
        return False
    parameter = parameters.get("uniforms")
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def couples_final_token(verifier: object) -> bool:
    """Whether ``verifier`` draws its final token from ``uniforms.sample_uniforms`` by inverse
    CDF (attribute ``coupled_final_token``, True when absent)."""
    return bool(getattr(verifier, "coupled_final_token", True))


def deterministic_draft_case(case: ChainCase) -> ChainCase:
    """``case`` with every draft law q_i replaced by a one-hot at its most likely token.

    For kernels that assume deterministic (greedy, top-1) drafts, such as SGLang's
    ``tree_speculative_sampling_target_only`` (it accepts d with probability p(d), which is
    Leviathan et al.'s rule when q = one-hot(d)).
    """
    one_hot = torch.nn.functional.one_hot(case.draft_probs.argmax(dim=-1), case.vocab_size)
    return ChainCase(
        f"{case.case_id}+greedy-draft",
        f"{case.summary}; one-hot draft",
        case.target_probs,
        one_hot.to(torch.float64),
        case.tags - {"p-equals-q", "disjoint"},
    )


class CastVerifier:
    """A chain verifier called with its inputs cast to ``dtype`` and moved to ``device``.

    Args:
        verifier: the implementation.
        device: where its inputs live (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        dtype: the precision of ``target_probs`` and ``draft_probs`` it receives.

    Calls return the verifier's output moved to CPU. ``uniforms`` (when given) are moved to
    ``device`` too; the generator is passed unchanged (the protocol's generator is a CPU one; a
    device implementation derives its device seeds from it).
    """

    def __init__(self, verifier: ChainVerifier, device: str | torch.device, dtype: torch.dtype):
        self.verifier = verifier
        self.device = torch.device(device)
        self.dtype = dtype

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
        uniforms: ChainUniforms | None = None,
    ) -> torch.Tensor:
        """Cast, move, call (chain protocol; shapes as in :class:`ChainVerifier`)."""
        arguments = (
            _cast_rows(target_probs, self.device, self.dtype),
            _cast_rows(draft_probs, self.device, self.dtype),
            draft_token_ids.to(self.device),
            generator,
        )
        if uniforms is None:
            result = self.verifier(*arguments)
        else:
            moved = ChainUniforms(
                uniforms.accept_uniforms.to(self.device), uniforms.sample_uniforms.to(self.device)
            )
            result = self.verifier(*arguments, uniforms=moved)  # type: ignore[call-arg]
        return result.cpu() if isinstance(result, torch.Tensor) else result


def _cast_rows(probs: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``probs`` on ``device`` in ``dtype``; rows shared in memory (stride 0 along the batch, as
    ``expand`` makes them) are cast once and stay shared."""
    if probs.dim() == 3 and probs.shape[0] > 1 and probs.stride(0) == 0:
        return probs[:1].to(device, dtype).expand_as(probs)
    return probs.to(device, dtype)


def _batch(probs: torch.Tensor, copies: int) -> torch.Tensor:
    """``copies`` interleaved copies of the ``[R, ...]`` row types (row b has type b % R);
    shared memory (``expand``) when R == 1, so the reference takes its shared-table path."""
    if probs.shape[0] == 1:
        return probs.expand(copies, *probs.shape[1:])
    return probs.repeat(copies, 1, 1)


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


def _draw_chunk(
    case: ChainCase, draft_law: torch.Tensor, chunk: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drafts ``[chunk*R, k]`` (d ~ the cast q), accept uniforms ``[chunk*R, k]`` and sample
    uniforms ``[chunk*R]``; always a full chunk so that a replay with fewer steps draws the
    same numbers for the steps it keeps."""
    rows, k = case.n_rows, case.k
    batch = chunk * rows
    draft_uniforms = torch.rand((chunk, rows, k), generator=generator, dtype=torch.float64)
    accept = torch.rand((batch, k), generator=generator, dtype=torch.float64)
    sample = torch.rand((batch,), generator=generator, dtype=torch.float64)
    drafts = torch.empty((chunk, rows, k), dtype=torch.int64)
    for r in range(rows):
        for i in range(k):
            drafts[:, r, i] = sample_inverse_cdf(draft_law[r, i], draft_uniforms[:, r, i])
    return drafts.reshape(batch, k), accept, sample


def check_coupling(
    candidate: ChainVerifier,
    case: ChainCase,
    n_steps: int,
    seed: int,
    *,
    reference: ChainVerifier = reference_verify,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    precision: torch.dtype | None = None,
    target: str = "candidate",
    alpha: float = 1e-3,
    power: float = 0.9,
    tv: float = 0.05,
    statistical: bool | None = None,
) -> list[CheckResult]:
    """Compare ``candidate`` (on ``device``, inputs in ``dtype``) with the CPU reference.

    Args:
        candidate: a chain verifier; coupled when it takes ``uniforms=``
            (:func:`accepts_uniforms`).
        case: the case; its row types are interleaved in each call as in
            :func:`losslessness.engine.draw.sample_chain`.
        n_steps: verification steps per row type (>= 1).
        seed: replays everything; each result carries it.
        reference: the CPU ground truth (float64 inputs); must take ``uniforms=`` on the
            coupled path.
        dtype: precision of the candidate's ``target_probs`` / ``draft_probs``.
        device: where the candidate's inputs live.
        precision: the precision the candidate computes in, which the excusing tolerances
            are derived from (default ``dtype``; e.g. float16 for a kernel that takes float32
            probabilities but computes in half precision). The protocol's row-sum tolerance
            (1e-5) admits float32 and float64 inputs only, so lower precisions are declared here.
        target: the candidate's name in the results.
        alpha: per-assertion significance level of the statistical path's tests (the caller
            splits its family-wise rate over :func:`count_coupling_assertions`).
        power: design power, for the minimum detectable TV reported.
        tv: design TV (reported in the context).
        statistical: force the statistical path (True) or the coupled one (False); None picks
            the coupled path exactly when the candidate takes uniforms.

    Returns:
        Coupled path: one EXACT ``coupling`` result (LOSSY on any unexcused disagreement, with
        reproducers in ``details["disagreements"]``; ``details["excused_share"]``). Statistical
        path: ``law`` results for the candidate and the reference (targets ``<target>`` and
        ``<target>/reference``) and one ``two-sample`` result per statistical (row, position).
        A candidate that raises or returns a malformed array gives one ERROR result.

    Raises:
        ValueError: ``n_steps < 1``, or the coupled path forced on a candidate without
            ``uniforms=``.
    """
    if n_steps < 1:
        raise ValueError(f"n_steps: must be >= 1, got {n_steps}")
    coupled = accepts_uniforms(candidate) if statistical is None else not statistical
    if coupled and not accepts_uniforms(candidate):
        raise ValueError("statistical: the candidate takes no uniforms= keyword to couple")
    context = CheckContext.for_case(target, case, alpha=alpha, power=power, tv=tv, seed=seed)
    if not coupled:
        return _statistical_comparison(
            candidate, reference, case, n_steps, seed, context, dtype, device
        )
    return [
        _coupled_comparison(
            candidate, reference, case, n_steps, seed, context, dtype, device, precision or dtype
        )
    ]


def _candidate_failed(
    context: CheckContext,
    check_id: str,
    n: int,
    began: float,
    device: str | torch.device,
    dtype: torch.dtype,
    error: BaseException,
) -> CheckResult:
    """ERROR result of a candidate that raised (or returned a malformed output) after ``n``
    compared samples; ``began`` is the comparison's ``time.perf_counter()`` start."""
    return context.untested(
        check_id,
        Verdict.ERROR,
        f"candidate failed on {device} ({dtype}): {type(error).__name__}: {error}",
        n=n,
        wall_time_s=time.perf_counter() - began,
    )


def _coupled_comparison(
    candidate: ChainVerifier,
    reference: ChainVerifier,
    case: ChainCase,
    n_steps: int,
    seed: int,
    context: CheckContext,
    dtype: torch.dtype,
    device: str | torch.device,
    precision: torch.dtype,
) -> CheckResult:
    began = time.perf_counter()
    rows, k = case.n_rows, case.k
    cast = CastVerifier(candidate, device, dtype)
    compare_final = couples_final_token(candidate)
    draft_law = cast_probabilities(case.draft_probs, dtype)
    generator = torch.Generator().manual_seed(derive_seed(seed, "coupling", case.case_hash))
    candidate_generator = torch.Generator().manual_seed(derive_seed(seed, "candidate"))
    reference_generator = torch.Generator().manual_seed(derive_seed(seed, "reference"))
    chunk = rows_per_call(case)
    counts = {"agree": 0, "excused": 0, "unexcused": 0, "final_not_compared": 0}
    excused_decisions = 0
    shown: list[_Disagreement] = []
    done = 0
    while done < n_steps:
        m = min(chunk, n_steps - done)
        drafts, accept, sample = _draw_chunk(case, draft_law, chunk, generator)
        batch = m * rows
        drafts, accept, sample = drafts[:batch], accept[:batch], sample[:batch]
        target_probs = _batch(case.target_probs, m)
        draft_probs = _batch(case.draft_probs, m)
        try:
            raw = cast(
                target_probs,
                draft_probs,
                drafts,
                candidate_generator,
                uniforms=ChainUniforms(accept, sample),
            )
            got = coerce_output(raw, batch, k)
        except (ProtocolViolation, Exception) as error:
            return _candidate_failed(context, "coupling", done * rows, began, device, dtype, error)
        expected = coerce_output(
            reference(
                target_probs,
                draft_probs,
                drafts,
                reference_generator,
                uniforms=ChainUniforms(accept, sample),  # type: ignore[call-arg]
            ),
            batch,
            k,
        )
        differ = np.flatnonzero((got != expected).any(axis=1))
        counts["agree"] += batch - differ.size
        drafts_np, accept_np, sample_np = drafts.numpy(), accept.numpy(), sample.numpy()
        for b in differ.tolist():
            found = _classify(
                done + b // rows,
                b % rows,
                expected[b],
                got[b],
                drafts_np[b],
                accept_np[b],
                float(sample_np[b]),
                case,
                precision,
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
        done += m
    n = n_steps * rows
    share = counts["excused"] / n
    details: dict[str, Any] = {
        "n_rows": rows,
        "dtype": str(dtype),
        "precision": str(precision),
        "device": str(device),
        **counts,
        "excused_share": share,
        "excused_decisions": excused_decisions,
        "decision_tolerance": decision_tolerance(precision),
        "final_token_coupled": compare_final,
        "disagreements": [found.as_dict() for found in shown],
    }
    final_note = "" if compare_final else " (final tokens not coupled: decisions only)"
    if counts["unexcused"]:
        first = shown[0]
        replay = (
            f"replay: check_coupling(..., case {case.case_id!r} (hash {case.case_hash}), "
            f"n_steps={first.step + 1}, seed={seed}, dtype={dtype}, device={str(device)!r})"
        )
        details["reproducer"] = {**first.as_dict(), "case_hash": case.case_hash, "seed": seed}
        message = (
            f"{counts['unexcused']} of {n} coupled steps disagree with the reference beyond "
            f"{precision} tolerance{final_note}. First: {first.describe()}. {replay}"
        )
        verdict = Verdict.LOSSY
    else:
        message = (
            f"same decisions as the reference on {n} coupled steps{final_note}; "
            f"{counts['excused']} disagreements ({share:.3g} of steps) excused as within "
            f"{precision} tolerance of a threshold"
        )
        verdict = Verdict.PASS
    return context.result(
        "coupling",
        kind=CheckKind.EXACT,
        verdict=verdict,
        n=n,
        statistic=float(counts["unexcused"]),
        p_value=0.0 if counts["unexcused"] else 1.0,
        min_detectable_tv=exact_check_minimum_detectable_rate(n, context.power),
        wall_time_s=time.perf_counter() - began,
        message=message,
        details=details,
    )


def cast_case(case: ChainCase, dtype: torch.dtype) -> ChainCase:
    """``case`` with p and q replaced by the laws an implementation receiving them in ``dtype``
    follows (:func:`losslessness.checks.precision.cast_probabilities`)."""
    if dtype == torch.float64:
        return case
    return ChainCase(
        f"{case.case_id}@{str(dtype).removeprefix('torch.')}",
        f"{case.summary}; inputs cast to {dtype}",
        cast_probabilities(case.target_probs, dtype),
        cast_probabilities(case.draft_probs, dtype),
        case.tags,
    )


def count_coupling_assertions(
    candidate: ChainVerifier, case: ChainCase, dtype: torch.dtype = torch.float32
) -> int:
    """Statistical assertions :func:`check_coupling` makes for ``candidate`` on ``case``: none
    on the coupled path; three per statistical (row, position) on the statistical path (law
    of the candidate, law of the reference, two-sample)."""
    if accepts_uniforms(candidate):
        return 0
    return 3 * _statistical_positions(cast_case(case, dtype))


def _statistical_positions(case: ChainCase) -> int:
    return sum(law_is_statistical(laws, i) for laws in case_laws(case) for i in range(case.k + 1))


def _statistical_comparison(
    candidate: ChainVerifier,
    reference: ChainVerifier,
    case: ChainCase,
    n_steps: int,
    seed: int,
    context: CheckContext,
    dtype: torch.dtype,
    device: str | torch.device,
) -> list[CheckResult]:
    cast = cast_case(case, dtype)
    began = time.perf_counter()
    try:
        got = sample_chain(
            CastVerifier(candidate, device, dtype), cast, n_steps, derive_seed(seed, "candidate")
        )
    except Exception as error:
        return [_candidate_failed(context, "law", 0, began, device, dtype, error)]
    # Independent samples: the reference's seed differs from the candidate's.
    expected = sample_chain(reference, cast, n_steps, derive_seed(seed, "reference"))
    cast_context = CheckContext.for_case(
        context.target, cast, alpha=context.alpha, power=context.power, tv=context.tv, seed=seed
    )
    reference_context = CheckContext.for_case(
        f"{context.target}/reference",
        cast,
        alpha=context.alpha,
        power=context.power,
        tv=context.tv,
        seed=seed,
    )
    return [
        *check_conditional_laws(got, cast_context),
        *check_conditional_laws(expected, reference_context),
        *_two_sample_tests(got, expected, cast_context, str(device), str(dtype)),
    ]


def _two_sample_tests(
    got: ChainSamples, expected: ChainSamples, context: CheckContext, device: str, dtype: str
) -> list[CheckResult]:
    """Chi-square homogeneity test of the candidate's vs the reference's emitted tokens at
    every statistical (row, position); tokens expected fewer than 20 times in either sample are
    pooled into one cell (the identity test's floor)."""
    case = got.case
    results = []
    got_counts, expected_counts = emitted_counts(got.outputs), emitted_counts(expected.outputs)
    for r, laws in enumerate(case_laws(case)):
        for i in range(case.k + 1):
            if not law_is_statistical(laws, i):
                continue
            began = time.perf_counter()
            a = got.outputs[r, got_counts[r] > i, i]
            b = expected.outputs[r, expected_counts[r] > i, i]
            a, b = a[(a >= 0) & (a < case.vocab_size)], b[(b >= 0) & (b < case.vocab_size)]
            table = np.stack(
                [
                    np.bincount(a, minlength=case.vocab_size),
                    np.bincount(b, minlength=case.vocab_size),
                ]
            )
            total = table.sum(axis=0)
            n_small = min(int(a.size), int(b.size))
            frequent = total * (n_small / max(int(total.sum()), 1)) >= EXPECTED_COUNT_FLOOR
            pooled = table[:, ~frequent].sum(axis=1, keepdims=True)
            table = np.concatenate([table[:, frequent], pooled], axis=1)
            table = table[:, table.sum(axis=0) > 0]
            if table.shape[1] < 2 or min(a.size, b.size) == 0:
                statistic, pvalue, dof = 0.0, 1.0, 0
            else:
                test = stats.chi2_contingency(table, correction=False, lambda_="cressie-read")
                statistic, pvalue, dof = float(test.statistic), float(test.pvalue), int(test.dof)
            verdict = Verdict.LOSSY if pvalue <= context.alpha else Verdict.PASS
            message = (
                f"{device} ({dtype}) and CPU reference emit the same law at position {i} "
                f"(two-sample chi-square, {a.size} vs {b.size} samples)"
            )
            if verdict is Verdict.LOSSY:
                message = (
                    f"{device} ({dtype}) and the CPU reference emit different laws at position "
                    f"{i}: two-sample chi-square p-value {pvalue:.3g} <= alpha {context.alpha:.3g}"
                )
            results.append(
                context.result(
                    "two-sample",
                    kind=CheckKind.STATISTICAL,
                    verdict=verdict,
                    n=n_small,
                    position=i,
                    row=r,
                    statistic=statistic,
                    df=dof,
                    p_value=pvalue,
                    min_detectable_tv=minimum_detectable_tv(
                        n_small, max(dof, 1), context.alpha, context.power
                    ),
                    wall_time_s=time.perf_counter() - began,
                    message=message,
                    details={
                        "n_rows": case.n_rows,
                        "cells": int(table.shape[1]),
                        "test": "chi2_contingency, Cressie-Read lambda=2/3",
                    },
                )
            )
    return results


GPU_ADAPTERS = ("vllm", "flashinfer", "sglang", "transformers-cuda")
"""The device adapters :func:`run_device_checks` tries, by entry-point name."""


def _load_device_adapter(name: str, device: str) -> ChainVerifier:
    """The chain verifier of a device adapter (raises AdapterUnavailable with the reason)."""
    if name == "vllm":
        from losslessness.adapters import vllm

        chain = vllm.adapter().chain
    elif name == "flashinfer":
        from losslessness.adapters import flashinfer

        chain = flashinfer.adapter().chain
    elif name == "sglang":
        from losslessness.adapters import sglang

        chain = sglang.adapter().chain
    elif name == "transformers-cuda":
        from losslessness.adapters import transformers_cuda

        chain = transformers_cuda.adapter(device=device).chain
    else:
        raise ValueError(f"name: unknown device adapter {name!r}; known: {GPU_ADAPTERS}")
    if chain is None:
        raise AdapterUnavailable(f"{name}: the adapter has no chain verifier")
    return chain


def run_device_checks(
    device: str, n_steps: int, seed: int, family_wise_alpha: float
) -> tuple[list[CheckResult], list[tuple[str, str]]]:
    """Coupling and precision checks for every device implementation that loads here.

    On ``device="cpu"``: the reference fed float32 inputs, coupled against the float64
    reference, on every battery case, plus the precision diagnostics. On a CUDA device,
    additionally: the reference on the device (float64 and float32 inputs) and every adapter of
    :data:`GPU_ADAPTERS` that loads, each coupled when it takes ``uniforms=`` and compared
    statistically when it does not (or does not couple its final token); SGLang's target-only
    kernel on the cases with one-hot drafts (:func:`deterministic_draft_case`).

    Args:
        device: ``"cpu"`` or a CUDA device (``"cuda"``, ``"cuda:0"``).
        n_steps: verification steps per case and row type.
        seed: the run seed.
        family_wise_alpha: split Bonferroni over every statistical assertion made.

    Returns:
        ``(results, unavailable)``: every CheckResult (targets named ``<adapter>@<device>/<dtype>``)
        and ``(adapter name, reason)`` for each adapter that could not load.

    Raises:
        ValueError: ``n_steps < 1``, ``family_wise_alpha`` outside (0, 1), or ``device`` is
            neither cpu nor cuda.
    """
    if torch.device(device).type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or a CUDA device, got {device!r}")
    if n_steps < 1:
        raise ValueError(f"n_steps: must be >= 1, got {n_steps}")
    cases = default_chain_battery()
    plans: list[tuple[str, ChainVerifier, torch.dtype, ChainCase, bool]] = []
    unavailable: list[tuple[str, str]] = []
    plans += [("reference", reference_verify, torch.float32, case, False) for case in cases]
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda:
        plans += [("reference", reference_verify, torch.float64, case, False) for case in cases]
    for name in GPU_ADAPTERS:
        try:
            chain = _load_device_adapter(name, device)
        except AdapterUnavailable as error:
            unavailable.append((name, str(error)))
            continue
        if not on_cuda:
            unavailable.append((name, f"device {device!r}: GPU adapters run on CUDA only"))
            continue
        one_hot = bool(getattr(chain, "requires_one_hot_draft", False))
        for case in cases:
            if one_hot and ({"disjoint", "p-equals-q"} & case.tags):
                continue
            chosen = deterministic_draft_case(case) if one_hot else case
            plans.append((name, chain, torch.float32, chosen, False))
            if accepts_uniforms(chain) and not couples_final_token(chain):
                plans.append((name, chain, torch.float32, chosen, True))
    n_assertions = sum(
        3 * _statistical_positions(cast_case(case, dtype))
        if statistical or not accepts_uniforms(chain)
        else 0
        for _, chain, dtype, case, statistical in plans
    )
    budget = ErrorBudget(max(1, n_assertions), family_wise_alpha)
    results: list[CheckResult] = []
    for name, chain, dtype, case, statistical in plans:
        label = f"{name}@{device}/{str(dtype).removeprefix('torch.')}"
        results += check_coupling(
            chain,
            case,
            n_steps,
            derive_seed(seed, label, case.case_hash),
            dtype=dtype,
            device=device,
            target=label,
            alpha=budget.per_assertion_alpha,
            statistical=statistical or not accepts_uniforms(chain),
        )
    for case in cases:
        context = CheckContext.for_case(
            "precision", case, alpha=budget.per_assertion_alpha, power=0.9, tv=0.05, seed=seed
        )
        results += check_precision(case, context)
    return results, unavailable
