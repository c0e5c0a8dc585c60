"""What floating-point precision alone does to chain speculative sampling (issue 6, part 4).

Two questions, answered exactly (no sampling):

- **How far does casting move the laws?** A GPU kernel sees p and q in float32, float16 or
  bfloat16. The exact laws of one verification step (emitted token per position, residual,
  acceptance, accepted length; :func:`losslessness.laws.chain_laws`) of the cast and
  renormalised inputs are compared with those of the float64 inputs. The TV distance found is
  what precision alone costs; a statistical deviation of that size is *not* an algorithmic
  loss, so it is reported as a diagnostic (``details["diagnostic"] == "precision"``, verdict
  PASS), never as LOSSY.
- **How wrong is the acceptance ratio?** p(d) / q(d) computed in the low precision from cast
  inputs vs float64 from the float64 inputs (relative error, worst token).

The tolerances the coupled CPU-vs-GPU comparison (:mod:`losslessness.checks.coupling`) excuses
disagreements with are derived here from the dtype's unit roundoff ``u = eps / 2`` and V, by
standard floating-point error analysis (Higham 2002, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., sec. 2.2 (model of arithmetic) and sec. 4.2, eq. (4.4): recursive
summation of n terms errs by at most ``gamma_{n-1} * sum |x_i|``, ``gamma_n = n u / (1 - n u)``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from losslessness.cases import ChainCase
from losslessness.checks.ids import PRECISION_CHECK_ID
from losslessness.laws import chain_laws, law_after_cast, total_variation
from losslessness.results import CheckContext, CheckKind, CheckResult, Verdict

PRECISION_DIAGNOSTIC = PRECISION_CHECK_ID
"""``CheckResult.details["diagnostic"]`` of precision results: they describe, never decide."""

LOW_PRECISION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
"""The dtypes :func:`check_precision` reports by default."""


def unit_roundoff(dtype: torch.dtype) -> float:
    """Unit roundoff ``u = eps / 2`` of a floating-point dtype (Higham 2002, sec. 2.1).

    Raises:
        ValueError: ``dtype`` is not a floating-point dtype.
    """
    if not dtype.is_floating_point:
        raise ValueError(f"dtype: expected a floating-point dtype, got {dtype}")
    return float(torch.finfo(dtype).eps) / 2.0


def summation_error_bound(dtype: torch.dtype, n_terms: int) -> float:
    """``gamma_n = n u / (1 - n u)``: relative error bound of summing ``n_terms`` non-negative
    terms recursively in ``dtype`` (Higham 2002, eq. (4.4)); 1.0 (vacuous) when ``n u >= 1/2``.

    Raises:
        ValueError: ``n_terms < 0`` or ``dtype`` not floating point.
    """
    if n_terms < 0:
        raise ValueError(f"n_terms: must be >= 0, got {n_terms}")
    nu = n_terms * unit_roundoff(dtype)
    return 1.0 if nu >= 0.5 else nu / (1.0 - nu)


def decision_tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance on ``|p(d)/q(d) - u|`` within which a ``dtype`` implementation may
    decide an accept/reject differently from the float64 reference.

    ``8 u``: the casts of p and q (``u`` each), their renormalisation (rows of cast inputs sum
    to 1 within ``u``: ``u`` each), the division (``u``), the cast of the uniform (``u``), and a
    factor of about 4/3 of head-room for implementations that compare ``u * q < p`` instead of
    ``u < p / q`` (one more rounding). A decision is excused only when the float64 ratio is
    positive and ``|ratio - u| <= 8 u * ratio``.
    """
    return 8.0 * unit_roundoff(dtype)


def sample_tolerance(dtype: torch.dtype, vocab_size: int, mass: float) -> float:
    """Absolute tolerance on the normalised CDF at the sampling uniform within which a
    ``dtype`` implementation may draw a different token than the float64 reference.

    The token is the inverse CDF of a law over V tokens at the uniform ``s``. In ``dtype``:
    casting p and q moves each unnormalised residual entry by at most ``u (p_x + q_x)``, in all
    ``2u``, which normalising by the residual's mass ``m`` (the TV distance; 1 for the bonus law)
    turns into ``2u / m`` on each of the prefix and the total (``4u / m``); the prefix sum and
    the total are each off by ``gamma_V`` relative (Higham eq. (4.4)); the product ``s * total``
    and the cast of ``s`` add ``2u``.

    Args:
        dtype: the implementation's precision.
        vocab_size: V.
        mass: the unnormalised mass of the law sampled from (``1 - acceptance`` for a residual,
            1.0 for the bonus law), in [0, 1].

    Returns:
        ``min(1, 4u / mass + 2 gamma_V + 2u)``; 1.0 (nothing can be told apart) when ``mass`` is
        0 or the bound is vacuous.

    Raises:
        ValueError: ``vocab_size < 1`` or ``mass`` outside [0, 1].
    """
    if vocab_size < 1:
        raise ValueError(f"vocab_size: must be >= 1, got {vocab_size}")
    if not 0.0 <= mass <= 1.0:
        raise ValueError(f"mass: must lie in [0, 1], got {mass}")
    if mass == 0.0:
        return 1.0
    u = unit_roundoff(dtype)
    bound = 4.0 * u / mass + 2.0 * summation_error_bound(dtype, vocab_size) + 2.0 * u
    return min(1.0, bound)


@dataclass(frozen=True)
class PrecisionReport:
    """TV distances that casting p and q to ``dtype`` induces in one row type's exact laws.

    Attributes:
        dtype: the precision, e.g. ``"torch.float16"``.
        emitted_tv: ``[k+1]`` TV between the emitted-token laws (p_i) at each position.
        residual_tv: ``[k]`` TV between the residual laws norm(max(0, p_i - q_i)).
        acceptance_shift: ``[k]`` absolute change of sum min(p_i, q_i).
        accepted_length_tv: TV between the laws of the number of accepted drafts.
        ratio_relative_error: largest ``|r_dtype - r_64| / r_64`` over positions and tokens with
            ``p > 0`` and ``q > 0``, where ``r_dtype = p/q`` computed in ``dtype`` from cast inputs
            and ``r_64`` in float64 (0.0 when no such token; ``inf`` when a cast zeroes one).
        max_tv: the largest of the TVs above (the step's precision-only deviation).
    """

    dtype: str
    emitted_tv: tuple[float, ...]
    residual_tv: tuple[float, ...]
    acceptance_shift: tuple[float, ...]
    accepted_length_tv: float
    ratio_relative_error: float

    @property
    def max_tv(self) -> float:
        """The largest TV the cast induces in any law of the step."""
        return max((*self.emitted_tv, *self.residual_tv, self.accepted_length_tv), default=0.0)


def ratio_relative_error(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, dtype: torch.dtype
) -> float:
    """Worst relative error of the acceptance ratio p/q computed in ``dtype`` from cast inputs.

    Args:
        target_probs: ``[k(+1), V]`` float64 (only the first k rows are used).
        draft_probs: ``[k, V]`` float64.
        dtype: the low precision.

    Returns:
        ``max |r_dtype - r_64| / r_64`` over tokens with p > 0 and q > 0 (0.0 if none); ``inf``
        where the cast turns a positive p or q into 0.
    """
    k = draft_probs.shape[-2]
    p64 = target_probs[..., :k, :].to(torch.float64)
    q64 = draft_probs.to(torch.float64)
    both = (p64 > 0) & (q64 > 0)
    if not bool(both.any()):
        return 0.0
    exact = p64[both] / q64[both]
    # Computed on CPU: float16/bfloat16 division is supported there and rounds per IEEE.
    low = (p64.to(dtype)[both] / q64.to(dtype)[both]).to(torch.float64)
    error = (low - exact).abs() / exact
    return float(torch.where(torch.isfinite(low) & (low > 0), error, torch.inf).max())


def precision_report(case: ChainCase, row: int, dtype: torch.dtype) -> PrecisionReport:
    """Exact TVs that casting ``case``'s row type ``row`` to ``dtype`` induces (see module doc).

    Raises:
        ValueError: ``row`` out of range or ``dtype`` not floating point.
    """
    if not 0 <= row < case.n_rows:
        raise ValueError(f"row: must lie in [0, {case.n_rows}), got {row}")
    unit_roundoff(dtype)
    p, q = case.target_probs[row], case.draft_probs[row]
    exact = chain_laws(p, q)
    cast = chain_laws(law_after_cast(p, dtype), law_after_cast(q, dtype))
    return PrecisionReport(
        dtype=str(dtype),
        emitted_tv=tuple(float(x) for x in total_variation(exact.emitted, cast.emitted)),
        residual_tv=tuple(float(x) for x in total_variation(exact.residual, cast.residual)),
        acceptance_shift=tuple(float(x) for x in (exact.acceptance - cast.acceptance).abs()),
        accepted_length_tv=float(total_variation(exact.accepted_length, cast.accepted_length)),
        ratio_relative_error=ratio_relative_error(p, q, dtype),
    )


def check_precision(
    case: ChainCase,
    context: CheckContext,
    dtypes: tuple[torch.dtype, ...] = LOW_PRECISION_DTYPES,
) -> list[CheckResult]:
    """Report, per row type and dtype, the TV that precision alone induces (a diagnostic).

    Args:
        case: the case.
        context: its context; ``context.tv`` is the design TV the report compares with.
        dtypes: the precisions to report.

    Returns:
        One ``precision`` :class:`CheckResult` per (row type, dtype): kind EXACT, verdict PASS
        always, ``details["diagnostic"] == "precision"``, ``statistic`` the largest TV,
        ``details`` the whole :class:`PrecisionReport` and ``above_design_tv`` (True when a
        statistical check at the design TV could see the precision-only deviation).
    """
    results = []
    for row in range(case.n_rows):
        for dtype in dtypes:
            began = time.perf_counter()
            report = precision_report(case, row, dtype)
            visible = report.max_tv >= context.tv
            message = (
                f"precision only: casting p, q to {dtype} moves the step's laws by TV "
                f"{report.max_tv:.3g} (acceptance ratio off by {report.ratio_relative_error:.3g}"
                f" relative); {'at or above' if visible else 'below'} the design TV "
                f"{context.tv:g}"
            )
            results.append(
                context.result(
                    PRECISION_CHECK_ID,
                    kind=CheckKind.EXACT,
                    verdict=Verdict.PASS,
                    n=0,
                    row=row,
                    statistic=report.max_tv,
                    min_detectable_tv=0.0,
                    wall_time_s=time.perf_counter() - began,
                    message=message,
                    details={
                        "diagnostic": PRECISION_DIAGNOSTIC,
                        "dtype": report.dtype,
                        "max_tv": report.max_tv,
                        "emitted_tv": list(report.emitted_tv),
                        "residual_tv": list(report.residual_tv),
                        "acceptance_shift": list(report.acceptance_shift),
                        "accepted_length_tv": report.accepted_length_tv,
                        "ratio_relative_error": report.ratio_relative_error,
                        "above_design_tv": visible,
                    },
                )
            )
    return results
