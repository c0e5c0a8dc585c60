"""Exact laws of chain speculative sampling: residual, acceptance, per-position laws.

Sources: Leviathan, Kalman, Matias 2022, "Fast Inference from Transformers via Speculative
Decoding", Alg. 1, Thm. 3.5 (the output follows p) and Def. 3.1/Cor. 3.6 (acceptance
probability alpha = sum_x min(p(x), q(x)) = 1 - TV(p, q)); Chen et al. 2023, "Accelerating LLM
Decoding with Speculative Sampling", Alg. 2 and Thm. 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """The residual ``norm(max(0, p - q))`` sampled from after a rejection.

    Where ``p == q`` the residual has no mass; a rejection has probability 0 there, and the
    row is returned as ``p`` (the limit as ``q -> p``), so the result is always a distribution.

    Args:
        target_probs: ``[..., V]`` float, p.
        draft_probs: ``[..., V]`` float, q (same shape).

    Returns:
        ``[..., V]`` float64 rows summing to 1.

    Source: Leviathan et al. 2022, Alg. 1 ("sample from norm(max(0, p - q))").
    """
    p = target_probs.to(torch.float64)
    residual = (p - draft_probs.to(torch.float64)).clamp_(min=0.0)
    # Scaling by the row maximum first keeps subnormal residual masses exact to normalise.
    peak = residual.amax(dim=-1, keepdim=True)
    positive = peak > 0
    scaled = residual / torch.where(positive, peak, 1.0)
    return torch.where(positive, scaled / scaled.sum(dim=-1, keepdim=True), p)


def acceptance_probability(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """Probability that a draft ``d ~ q`` is accepted: ``sum_x min(p(x), q(x))``.

    Args:
        target_probs: ``[..., V]`` float, p.
        draft_probs: ``[..., V]`` float, q.

    Returns:
        ``[...]`` float64 in ``[0, 1]``, equal to ``1 - TV(p, q)``.

    Source: Leviathan et al. 2022, Def. 3.1 and Cor. 3.6.
    """
    p = target_probs.to(torch.float64)
    q = draft_probs.to(torch.float64)
    return torch.minimum(p, q).sum(dim=-1).clamp_(0.0, 1.0)


def total_variation(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Total variation distance ``0.5 * sum_x |a(x) - b(x)|`` along the last axis.

    Args:
        first: ``[..., V]`` float.
        second: ``[..., V]`` float.

    Returns:
        ``[...]`` float64 in ``[0, 1]``.
    """
    return 0.5 * (first.to(torch.float64) - second.to(torch.float64)).abs().sum(dim=-1)


@dataclass(frozen=True)
class ChainLaws:
    """Exact laws of one chain verification step for one row (p_0..p_k, q_0..q_{k-1}).

    Rows do not depend on the drafted prefix here (the audit's cases fix them), so the law of
    the token emitted at position i, given that position i is reached, is exactly p_i.

    Attributes:
        emitted: ``[k+1, V]`` float64; law of the token emitted at position i given the
            step reaches i (that is, d_0..d_{i-1} were accepted). Row k is the bonus token.
        acceptance: ``[k]`` float64; P(d_i accepted | position i reached) = sum min(p_i, q_i).
        reach: ``[k+1]`` float64; P(position i reached) = prod_{j<i} acceptance_j.
        accepted_length: ``[k+1]`` float64; P(exactly m drafts accepted), m = 0..k.
        residual: ``[k, V]`` float64; law of the emitted token given d_i was rejected.
        accepted_token: ``[k, V]`` float64; law of d_i given it was accepted,
            ``min(p_i, q_i) / acceptance_i`` (uniform-free diagnostic; rows with acceptance 0
            are all zero).
    """

    emitted: torch.Tensor
    acceptance: torch.Tensor
    reach: torch.Tensor
    accepted_length: torch.Tensor
    residual: torch.Tensor
    accepted_token: torch.Tensor


def chain_laws(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> ChainLaws:
    """Compute :class:`ChainLaws` for one row.

    Args:
        target_probs: ``[k+1, V]`` float, p_0..p_k.
        draft_probs: ``[k, V]`` float, q_0..q_{k-1}.

    Returns:
        The exact laws, all float64.

    Raises:
        ValueError: if the shapes are not ``[k+1, V]`` and ``[k, V]``.

    Source: Leviathan et al. 2022, Thm. 3.5 and Sec. 3.3 (number of generated tokens).
    """
    if target_probs.dim() != 2 or draft_probs.dim() != 2:
        raise ValueError(
            f"target_probs/draft_probs: expected [k+1, V] and [k, V], got "
            f"{tuple(target_probs.shape)} and {tuple(draft_probs.shape)}"
        )
    if (
        draft_probs.shape[0] + 1 != target_probs.shape[0]
        or draft_probs.shape[1] != target_probs.shape[1]
    ):
        raise ValueError(
            f"draft_probs: shape {tuple(draft_probs.shape)} does not fit target_probs "
            f"{tuple(target_probs.shape)} (expected [k, V] with k+1 target rows)"
        )
    p = target_probs.to(torch.float64)
    q = draft_probs.to(torch.float64)
    k = q.shape[0]
    acceptance = acceptance_probability(p[:k], q)
    reach = torch.cat([torch.ones(1, dtype=torch.float64), torch.cumprod(acceptance, dim=0)])
    stop = torch.cat([1.0 - acceptance, torch.ones(1, dtype=torch.float64)])
    overlap = torch.minimum(p[:k], q)
    safe = acceptance.clamp(min=torch.finfo(torch.float64).tiny).unsqueeze(1)
    return ChainLaws(
        emitted=p / p.sum(dim=-1, keepdim=True),
        acceptance=acceptance,
        reach=reach,
        accepted_length=reach * stop,
        residual=residual_distribution(p[:k], q),
        accepted_token=torch.where(
            acceptance.unsqueeze(1) > 0, overlap / safe, torch.zeros_like(overlap)
        ),
    )


MAX_BOUND_CELLS = 1 << 22
"""Most cells (prefixes in the common support of p and q) :func:`prefix_acceptance_bound`
enumerates for one prefix length; longer prefixes get the valid, looser fallback."""


@dataclass(frozen=True)
class PrefixAcceptanceBound:
    """Upper bound on P(the first m drafts are all accepted) for every lossless verifier.

    Attributes:
        bound: ``[k+1]`` float64; ``bound[m]`` for prefix length m = 0..k (``bound[0] = 1``).
        exact: ``[k+1]`` bool; True where ``bound[m]`` is ``1 - TV`` of the joint laws of the
            first m tokens computed exactly (by enumeration), False where it is the fallback
            ``min(exact bound of the longest enumerable prefix, min_{j < m} sum min(p_j, q_j))``
            (valid, never below the exact value, but not tight).
        cells: ``[k+1]`` int; cells enumerated for ``bound[m]`` (0 for the fallback).
    """

    bound: torch.Tensor
    exact: torch.Tensor
    cells: tuple[int, ...]

    def describe(self, m: int) -> str:
        """One phrase naming what ``bound[m]`` is, for messages."""
        if bool(self.exact[m]):
            return (
                f"1 - TV of the joint laws of the first {m} tokens under p and q, exact over "
                f"{self.cells[m]} cells"
            )
        return (
            f"a valid upper bound on 1 - TV of the joint laws of the first {m} tokens (the "
            "exact value over a shorter prefix, or the smallest per-position sum min(p, q)): "
            "too many cells to enumerate"
        )


def prefix_acceptance_bound(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, max_cells: int = MAX_BOUND_CELLS
) -> PrefixAcceptanceBound:
    """Largest probability with which any lossless verifier accepts the first m drafts.

    If the first m drafts are accepted, the first m output tokens equal them: ``{tau >= m}``
    is contained in ``{Y^m = X^m}``. A lossless verifier's output prefix ``Y^m`` follows p's
    joint law, the drafts ``X^m`` follow q's, and no coupling of two laws agrees more often
    than ``1 - TV`` (the coupling inequality; Lindvall 1992, Lectures on the Coupling Method,
    I.2; Leviathan et al. 2022 use it for m = 1). With p_j, q_j fixed per position the joint
    laws are products, so::

        P(tau >= m) <= sum over x^m of min(prod_j p_j(x_j), prod_j q_j(x_j)).

    The bound holds for every lossless verifier, block verification (Sun et al. 2024)
    included. It is not attained in general: in Sun et al.'s Sec. 1 example block
    verification accepts both drafts with probability 5/9 where the bound is 6/9; the
    token-level value ``prod_{j < m} sum min(p_j, q_j)`` is a lower value still.

    Only cells where every p_j and q_j is positive contribute; they are enumerated while
    their number stays within ``max_cells``. Beyond it ``bound[m]`` is the exact bound of the
    longest enumerable prefix, or the smallest per-position ``sum min(p_j, q_j)`` if lower
    (both are ``1 - TV`` of a marginal of the first m tokens, and marginalising never
    increases TV), so the fallback is never below the exact value.

    Args:
        target_probs: ``[k+1, V]`` float, p_0..p_k (rows divided by their sums).
        draft_probs: ``[k, V]`` float, q_0..q_{k-1}.
        max_cells: largest enumeration per prefix length (>= 1).

    Returns:
        :class:`PrefixAcceptanceBound`.

    Raises:
        ValueError: shapes that are not ``[k+1, V]`` and ``[k, V]``, or ``max_cells < 1``.
    """
    if max_cells < 1:
        raise ValueError(f"max_cells: must be >= 1, got {max_cells}")
    if (
        target_probs.dim() != 2
        or draft_probs.dim() != 2
        or draft_probs.shape[0] + 1 != target_probs.shape[0]
        or draft_probs.shape[1] != target_probs.shape[1]
    ):
        raise ValueError(
            f"target_probs/draft_probs: expected [k+1, V] and [k, V], got "
            f"{tuple(target_probs.shape)} and {tuple(draft_probs.shape)}"
        )
    p = target_probs.to(torch.float64)
    p = p / p.sum(dim=-1, keepdim=True)
    q = draft_probs.to(torch.float64)
    k = q.shape[0]
    if k:
        q = q / q.sum(dim=-1, keepdim=True)
    overlap = acceptance_probability(p[:k], q)
    bound = torch.ones(k + 1, dtype=torch.float64)
    exact = torch.ones(k + 1, dtype=torch.bool)
    cells = [1] * (k + 1)
    joint_p = torch.ones(1, dtype=torch.float64)
    joint_q = torch.ones(1, dtype=torch.float64)
    enumerable = True
    for m in range(1, k + 1):
        j = m - 1
        common = (p[j] > 0) & (q[j] > 0)
        if enumerable and joint_p.numel() * int(common.sum()) <= max_cells:
            joint_p = torch.outer(joint_p, p[j][common]).reshape(-1)
            joint_q = torch.outer(joint_q, q[j][common]).reshape(-1)
            bound[m] = torch.minimum(joint_p, joint_q).sum().clamp(0.0, 1.0)
            cells[m] = joint_p.numel()
        else:
            enumerable = False
            bound[m] = torch.minimum(bound[m - 1], overlap[:m].min())
            exact[m] = False
            cells[m] = 0
    return PrefixAcceptanceBound(bound, exact, tuple(cells))


def law_after_cast(probs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The law an implementation receiving ``probs`` in ``dtype`` is given: cast, then
    renormalised in float64 (a row whose every mass underflowed keeps its largest entry).
    The opposite order of :func:`strategies.renormalise_then_cast`, which makes the rows an
    implementation is fed.

    Args:
        probs: ``[..., V]`` float rows summing to 1.
        dtype: the precision the implementation receives.

    Returns:
        ``[..., V]`` float64 rows summing to 1; zeros of ``probs`` stay zeros.
    """
    cast = probs.to(dtype).to(torch.float64)
    empty = cast.sum(dim=-1, keepdim=True) <= 0
    if bool(empty.any()):
        peak = torch.nn.functional.one_hot(probs.argmax(dim=-1), probs.shape[-1]).to(torch.float64)
        cast = torch.where(empty, peak, cast)
    return cast / cast.sum(dim=-1, keepdim=True)
