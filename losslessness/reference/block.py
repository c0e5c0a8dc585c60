"""Reference block verifier (Sun et al. 2024) and the exact laws of block verification.

Source: Ziteng Sun, Uri Mendlovic, Yaniv Leviathan, Asaf Aharoni, Jae Hun Ro, Ahmad Beirami,
Ananda Theertha Suresh, "Block Verification Accelerates Speculative Decoding", ICLR 2025,
arXiv:2403.10444, Algorithm 2 (block verification). Token-by-token verification (Leviathan et
al. 2022, Alg. 1) stops at the first rejected draft; block verification decides the accepted
prefix from the whole block, stays lossless (the paper's Theorem 1) and is optimal in the
expected number of accepted drafts among all valid verifiers (Theorem 2), in particular never
worse than token verification. In the paper's motivating example (Sec. 1: two
context-independent models on {a, b}, p = (1/3, 2/3), q = (2/3, 1/3), two drafts) token
verification accepts 10/9 drafts per step on average, block verification 11/9, and the
idealised joint coupling 12/9 (pinned in ``tests/reference/test_block_verification.py``).

In the chain protocol's 0-based positions (drafts d_0..d_{k-1}, targets p_0..p_k, drafts'
laws q_0..q_{k-1}; the paper's ``M_b`` is p and ``M_s`` is q), the algorithm is:

1. **Prefix weights** (the paper's ``p_i``): ``w_0 = 1`` and
   ``w_{j+1} = min(w_j * p_j(d_j) / q_j(d_j), 1)`` for ``j = 0..k-1``.
2. **Stopping probabilities** (the paper's ``h_i``): for ``j < k``, with the residual mass
   ``r_j = sum_x max(w_j p_j(x) - q_j(x), 0)``, ``h_j = r_j / (r_j + 1 - w_j)`` (taken as 1
   when the denominator is 0, i.e. ``w_j = 1`` and ``p_j == q_j``, as vLLM's implementation
   does); ``h_k = w_k``.
3. **Accepted prefix**: ``eta_j ~ Bernoulli(h_j)`` independently, ``tau = max {j : eta_j = 1}``
   (the paper scans j = k, k-1, ..., 0 and stops at the first success: the same law).
   ``h_0 = 1``, so ``tau`` always exists.
4. **Final token**: the bonus ``~ p_k`` when ``tau = k``; otherwise the block residual
   ``norm(max(w_tau p_tau - q_tau, 0))`` (the paper's ``p_res``; it is the token-level residual
   ``norm(max(p - q, 0))`` only where ``w_tau = 1``, e.g. at ``tau = 0``).

Public implementations that read the same way (read, not copied): vLLM PR 46781
(``_compute_cumulative_log_p_kernel``: ``P_i = min(P_{i-1} p/q, 1)``; ``h_i = r_i / (r_i + 1 -
P_i)``; the last passing row wins; residual ``max(P_tau M_b - M_s, 0)``,
https://github.com/vllm-project/vllm/pull/46781) and vllm-ascend PR 15673 ("the residual
distribution over the vocabulary becomes max(p_tau * M_b(x) - M_s(x), 0) / Z instead of
max(p(x) - q(x), 0) / Z", https://github.com/vllm-project/vllm-ascend/pull/15673).

A verifier declares that it decides on the whole block by carrying the attribute
:data:`VERIFICATION_ATTRIBUTE` with the value :data:`BLOCK_VERIFICATION` (see
:func:`declared_verification`); :func:`verify_block` does. The acceptance check then holds it to
block verification's own acceptance, not to token verification's, when it warns SUBOPTIMAL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from losslessness.protocol import InvalidInputError, validate_chain_inputs
from losslessness.reference.output import emitted_tokens
from losslessness.reference.sampling import compute_dtype, sample_inverse_cdf

VERIFICATION_ATTRIBUTE = "losslessness_verification"
"""Name of the attribute by which a chain verifier declares how it verifies: ``"token"``
(the default when absent: Leviathan et al.'s token-by-token rule or any other rule) or
:data:`BLOCK_VERIFICATION`."""

TOKEN_VERIFICATION = "token"
"""Declared (or assumed) token-by-token verification."""

BLOCK_VERIFICATION = "block"
"""Declared block verification (Sun et al. 2024, Alg. 2)."""

MAX_BLOCK_STATES = 1 << 22
"""Most prefix states (draft prefixes with positive draft probability) that
:func:`block_laws` enumerates at one position; beyond it the exact laws are not computed."""


def declared_verification(verifier: object) -> str:
    """How ``verifier`` declares it verifies: the value of its :data:`VERIFICATION_ATTRIBUTE`
    attribute, or :data:`TOKEN_VERIFICATION` when it has none.

    Args:
        verifier: a chain verifier (any callable; bound methods and ``functools.partial``
            objects are read through ``__func__`` / ``func`` when they lack the attribute).

    Returns:
        :data:`TOKEN_VERIFICATION` or :data:`BLOCK_VERIFICATION`.

    Raises:
        ValueError: the attribute holds any other value.
    """
    value = getattr(verifier, VERIFICATION_ATTRIBUTE, None)
    for inner in ("__func__", "func"):
        if value is None and hasattr(verifier, inner):
            value = getattr(getattr(verifier, inner), VERIFICATION_ATTRIBUTE, None)
    if value is None:
        return TOKEN_VERIFICATION
    if value not in (TOKEN_VERIFICATION, BLOCK_VERIFICATION):
        raise ValueError(
            f"{VERIFICATION_ATTRIBUTE}: must be {TOKEN_VERIFICATION!r} or "
            f"{BLOCK_VERIFICATION!r}, got {value!r}"
        )
    return str(value)


def _stopping_probabilities(
    weights: torch.Tensor, target_rows: torch.Tensor, draft_rows: torch.Tensor
) -> torch.Tensor:
    """``h_j = r_j / (r_j + 1 - w_j)`` with ``r_j = sum_x max(w_j p_j(x) - q_j(x), 0)``.

    Args:
        weights: ``[..., k]`` float64 prefix weights w_0..w_{k-1}.
        target_rows: ``[..., k, V]`` float64 p_0..p_{k-1}.
        draft_rows: ``[..., k, V]`` float64 q_0..q_{k-1}.

    Returns:
        ``[..., k]`` float64 in [0, 1]; 1 where the denominator is 0 (``w_j = 1``, p_j == q_j).
    """
    residual_mass = (weights.unsqueeze(-1) * target_rows - draft_rows).clamp(min=0.0).sum(-1)
    denominator = residual_mass + (1.0 - weights)
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    return torch.where(denominator > 0, (residual_mass / safe).clamp(0.0, 1.0), 1.0)


def block_decisions(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    accept_uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The accepted prefix of block verification (Sun et al. 2024, Alg. 2, steps 1-3 above).

    Args:
        target_probs: ``[B, k+1, V]`` float64 rows summing to 1 (p_0..p_k).
        draft_probs: ``[B, k, V]`` float64 rows summing to 1 (q_0..q_{k-1}).
        draft_token_ids: ``[B, k]`` int64, with ``q_j(d_j) > 0``.
        accept_uniforms: ``[B, k+1]`` float64 in ``[0, 1)``; ``eta_j = accept_uniforms[:, j] <
            h_j`` (strict, so ``h_j = 0`` never stops at j).

    Returns:
        ``(n_accepted, weight)``: ``[B]`` int64 ``tau`` in ``[0, k]`` and ``[B]`` float64 the
        prefix weight ``w_tau`` that scales the residual.
    """
    batch, k = draft_token_ids.shape
    device = target_probs.device
    weights = torch.ones((batch, k + 1), dtype=target_probs.dtype, device=device)
    if k > 0:
        ids = draft_token_ids.unsqueeze(-1)
        p_draft = target_probs[:, :k].gather(-1, ids).squeeze(-1)
        q_draft = draft_probs.gather(-1, ids).squeeze(-1)
        ratio = p_draft / q_draft
        for j in range(k):
            weights[:, j + 1] = torch.clamp(weights[:, j] * ratio[:, j], max=1.0)
        stopping = torch.cat(
            [
                _stopping_probabilities(weights[:, :k], target_probs[:, :k], draft_probs),
                weights[:, k:],
            ],
            dim=1,
        )
    else:
        stopping = weights
    stops = accept_uniforms < stopping
    positions = torch.arange(k + 1, device=device)
    n_accepted = torch.where(stops, positions, -1).amax(dim=1).clamp(min=0)
    rows = torch.arange(batch, device=device)
    return n_accepted, weights[rows, n_accepted]


def block_residual(
    target_rows: torch.Tensor, draft_rows: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """Block verification's residual ``norm(max(w p - q, 0))`` (Sun et al. 2024, Alg. 2).

    Where it has no mass (a rejection there has probability 0; only float rounding reaches
    it), ``p`` is returned, so the result is always a distribution.

    Args:
        target_rows: ``[N, V]`` float64 p at the stopping position.
        draft_rows: ``[N, V]`` float64 q at the stopping position.
        weight: ``[N]`` float64 prefix weights ``w_tau`` in [0, 1].

    Returns:
        ``[N, V]`` float64, non-negative with positive row sums (not normalised: the sampler
        normalises).
    """
    residual = (weight.unsqueeze(1) * target_rows - draft_rows).clamp(min=0.0)
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    return torch.where(empty, target_rows, residual)


def verify_block(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """One chain verification step by block verification (Sun et al. 2024, Alg. 2).

    Lossless (the paper's Theorem 1): every emitted token follows p; the accepted prefix is
    decided from the whole block, so the acceptance at positions after 0 can exceed
    ``sum min(p_i, q_i)`` (Theorem 2: the expected number of accepted drafts is the largest
    any valid verifier achieves). Engines ship it as an option: vLLM PR 46781
    (https://github.com/vllm-project/vllm/pull/46781) and SGLang PR 36516
    (https://github.com/sgl-project/sglang/pull/36516), whose Triton chain sampler the issue
    measured with block verification on.

    Args:
        target_probs: ``[B, k+1, V]`` float (computed in float64 after dividing each row by
            its sum), p_0..p_k.
        draft_probs: ``[B, k, V]`` float, q_0..q_{k-1}, on the device of ``target_probs``.
        draft_token_ids: ``[B, k]`` int64, d_j ~ q_j, on the device of ``target_probs``.
        generator: source of all randomness: ``B*(k+1)`` float64 uniforms for the ``eta_j``,
            then ``B`` float64 uniforms for the final token (inverse CDF), on the generator's
            device, moved to the inputs' device.

    Returns:
        ``[B, k+1]`` int64 on the inputs' device: the accepted drafts, the final token, then -1.

    Raises:
        InvalidInputError: see :func:`losslessness.protocol.validate_chain_inputs`; inputs on
            different devices.
    """
    batch, k, _ = validate_chain_inputs(target_probs, draft_probs, draft_token_ids, generator)
    device = target_probs.device
    for name, tensor in (("draft_probs", draft_probs), ("draft_token_ids", draft_token_ids)):
        if tensor.device != device:
            raise InvalidInputError(
                name, f"is on {tensor.device}, but target_probs is on {device}; use one device"
            )
    dtype = compute_dtype(device)
    p = target_probs.to(dtype)
    p = p / p.sum(dim=-1, keepdim=True)
    q = draft_probs.to(dtype)
    if k > 0:
        q = q / q.sum(dim=-1, keepdim=True)
    ids = draft_token_ids.to(torch.int64)
    accept = torch.rand((batch, k + 1), generator=generator, dtype=dtype, device=generator.device)
    sample = torch.rand((batch,), generator=generator, dtype=dtype, device=generator.device)
    n_accepted, weight = block_decisions(p, q, ids, accept.to(device))
    rows = torch.arange(batch, device=device)
    law = p[rows, n_accepted]
    if k > 0:
        at = n_accepted.clamp(max=k - 1)
        residual = block_residual(law, q[rows, at], weight)
        law = torch.where((n_accepted < k).unsqueeze(1), residual, law)
    final = sample_inverse_cdf(law, sample.to(device))
    return emitted_tokens(ids, n_accepted, final)


setattr(verify_block, VERIFICATION_ATTRIBUTE, BLOCK_VERIFICATION)


# ------------------------------------------------------------------------------- exact laws


@dataclass(frozen=True)
class BlockLaws:
    """Exact laws of one block-verification step for one row whose p_j and q_j do not depend
    on the drafted prefix (the audit's cases).

    Attributes:
        reach: ``[k+1]`` float64; P(tau >= m): the first m drafts are all accepted.
        accepted_length: ``[k+1]`` float64; P(tau = m).
        emitted: ``[k+1, V]`` float64; law of the token emitted at position i given the step
            reaches i (equal to p_i: the losslessness the tests check). Rows of unreachable
            positions are all zero.
        states: the largest number of prefix states enumerated at one position.
    """

    reach: np.ndarray
    accepted_length: np.ndarray
    emitted: np.ndarray
    states: int


def _residual_mass_at(weights: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``sum_x max(w p(x) - q(x), 0)`` for every w in ``weights`` (``[N]``), in
    ``O((N + V) log V)``: the sum runs over the tokens with ``q(x) / p(x) < w``."""
    positive = p > 0
    thresholds = q[positive] / p[positive]
    order = np.argsort(thresholds, kind="stable")
    sorted_thresholds = thresholds[order]
    p_cum = np.concatenate([[0.0], np.cumsum(p[positive][order])])
    q_cum = np.concatenate([[0.0], np.cumsum(q[positive][order])])
    count = np.searchsorted(sorted_thresholds, weights, side="left")
    mass: np.ndarray = np.maximum(weights * p_cum[count] - q_cum[count], 0.0)
    return mass


def _stopping_at(weights: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    mass = _residual_mass_at(weights, p, q)
    denominator = mass + (1.0 - weights)
    safe = np.where(denominator > 0, denominator, 1.0)
    stopping: np.ndarray = np.where(denominator > 0, np.clip(mass / safe, 0.0, 1.0), 1.0)
    return stopping


def block_laws(
    target_probs: torch.Tensor | np.ndarray,
    draft_probs: torch.Tensor | np.ndarray,
    *,
    with_emitted: bool = True,
    max_states: int = MAX_BLOCK_STATES,
) -> BlockLaws | None:
    """Exact laws of block verification (Sun et al. 2024, Alg. 2) for one row, by enumerating
    every draft prefix with positive draft probability.

    The prefix weight ``w_j`` is a function of the prefix; given it, the next draft is
    ``~ q_j`` whatever the prefix (p and q are fixed per position). With
    ``F_j(x^j) = P(eta_l = 0 for every l >= j | x^j)``: ``F_k = 1 - w_k`` and
    ``F_j = (1 - h_j) sum_c q_j(c) F_{j+1}(x^j c)``; then ``P(tau >= m) = 1 - E[F_m(X^m)]``,
    ``P(tau = m, x^m) = Q(x^m) h_m E[F_{m+1} | x^m]``, and the token emitted at position i is
    the draft when ``tau > i`` and the block residual of ``w_i`` when ``tau = i``.

    Args:
        target_probs: ``[k+1, V]`` float, p_0..p_k (rows divided by their sums).
        draft_probs: ``[k, V]`` float, q_0..q_{k-1}.
        with_emitted: also compute the emitted laws (``O(states * V)`` memory per position);
            when False, ``emitted`` is an empty ``[0, V]`` array.
        max_states: give up (return None) when more prefixes than this would be enumerated at
            one position.

    Returns:
        :class:`BlockLaws`, or None when the enumeration exceeds ``max_states``.

    Raises:
        ValueError: shapes that are not ``[k+1, V]`` and ``[k, V]``.
    """
    p_all = np.asarray(target_probs, dtype=np.float64)
    q_all = np.asarray(draft_probs, dtype=np.float64)
    if p_all.ndim != 2 or q_all.ndim != 2 or q_all.shape != (p_all.shape[0] - 1, p_all.shape[1]):
        raise ValueError(
            f"target_probs/draft_probs: expected [k+1, V] and [k, V], got {p_all.shape} and "
            f"{q_all.shape}"
        )
    p_all = p_all / p_all.sum(axis=1, keepdims=True)
    if q_all.shape[0]:
        q_all = q_all / q_all.sum(axis=1, keepdims=True)
    k, vocab = q_all.shape
    supports = [np.flatnonzero(q_all[j] > 0) for j in range(k)]
    sizes = [1]
    for support in supports:
        sizes.append(sizes[-1] * len(support))
        if sizes[-1] > max_states:
            return None
    # Forward: prefix weights and draft probabilities of every prefix, level by level; the
    # prefix index at level j+1 is parent * |support_j| + child.
    weights = [np.ones(1)]
    masses = [np.ones(1)]
    for j, support in enumerate(supports):
        ratio = p_all[j, support] / q_all[j, support]
        weights.append(np.minimum(np.outer(weights[j], ratio), 1.0).ravel())
        masses.append(np.outer(masses[j], q_all[j, support]).ravel())
    stopping = [_stopping_at(weights[j], p_all[j], q_all[j]) for j in range(k)] + [weights[k]]
    # Backward: F_j and the expectation of F_{j+1} given the level-j prefix.
    none_after = [np.empty(0)] * (k + 1)
    none_after[k] = 1.0 - stopping[k]
    next_none = [np.empty(0)] * k
    for j in range(k - 1, -1, -1):
        children = none_after[j + 1].reshape(sizes[j], len(supports[j]))
        next_none[j] = children @ q_all[j, supports[j]]
        none_after[j] = (1.0 - stopping[j]) * next_none[j]
    reach = np.array([1.0 - float(masses[m] @ none_after[m]) for m in range(k + 1)])
    reach[0] = 1.0
    stop_here = [masses[m] * stopping[m] * next_none[m] for m in range(k)] + [
        masses[k] * stopping[k]
    ]
    accepted_length = np.array([float(s.sum()) for s in stop_here])
    emitted = np.zeros((k + 1 if with_emitted else 0, vocab))
    if with_emitted:
        for i in range(k + 1):
            if reach[i] <= 0:
                continue
            if i < k:
                law = np.maximum(np.outer(weights[i], p_all[i]) - q_all[i], 0.0)
                sums = law.sum(axis=1, keepdims=True)
                law = np.where(sums > 0, law / np.where(sums > 0, sums, 1.0), p_all[i])
                emitted[i] = stop_here[i] @ law
                continued = masses[i + 1] * (1.0 - none_after[i + 1])
                by_token = continued.reshape(sizes[i], len(supports[i])).sum(axis=0)
                emitted[i, supports[i]] += by_token
            else:
                emitted[i] = float(stop_here[k].sum()) * p_all[k]
            emitted[i] /= reach[i]
    return BlockLaws(reach, accepted_length, emitted, int(max(sizes)))


def expected_accepted_drafts(laws: BlockLaws) -> float:
    """``E[tau] = sum_{m >= 1} P(tau >= m)``: the expected number of accepted drafts per step
    (the quantity Sun et al. 2024, Theorem 2, shows block verification maximises)."""
    return float(math.fsum(float(x) for x in laws.reach[1:]))
