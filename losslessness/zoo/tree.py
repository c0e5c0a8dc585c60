"""The tree mutants of the zoo: tree verifiers with one mechanism of a real implementation put back.

Each lossy mutant is the reference tree verifier (:mod:`losslessness.reference.tree`) with one
mechanism changed: a sibling tested against the wrong law, the rule of one draft scheme applied
to drafts of another, the final token drawn from the wrong node's row, a repeated sibling token
counted twice, Medusa's typical acceptance, SGLang's relaxed acceptance thresholds, the residual
sampled among the target's top 10 only (a sparse fast path), or a greedy
walk that picks the wrong child or the wrong final row. The lossless controls are correct
algorithms that differ from the reference (siblings tried in another valid order, the final
token by an exponential race, the test in log space, sample-and-match per level, SGLang's
one-coin cumulative rule at its default thresholds, greedy path marking); the audit must pass
them on every draft scheme.

Every verifier here follows :class:`~losslessness.protocol.TreeVerifier` (or
:class:`~losslessness.protocol.GreedyTreeVerifier`), validates its inputs like the reference
(:func:`~losslessness.protocol.validate_tree_inputs`, raising
:class:`~losslessness.protocol.InvalidInputError`), works in float64 on CPU, is vectorised over
the batch (the loops run over depth, sibling slot or node index only) and draws all its
randomness from the ``generator`` argument. :data:`TREE_ZOO` lists them with the deterministic
case on which each mechanism acts; :mod:`losslessness.zoo.registry` joins them with the chain
zoo as ``mutant/tree-<name>``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from losslessness.batteries.builders import (
    batched_parents,
    dirichlet_rows,
    normalise,
    tree_depth,
)
from losslessness.cases import GreedyTreeCase, TreeCase
from losslessness.laws import residual_distribution
from losslessness.protocol import (
    PLACEHOLDER,
    GreedyTreeVerifier,
    TreeOutput,
    TreeVerifier,
    tree_depths,
    validate_greedy_tree_inputs,
    validate_tree_inputs,
)
from losslessness.reference.greedy import argmax_lowest_index
from losslessness.reference.sampling import sample_inverse_cdf
from losslessness.reference.tree import child_table
from losslessness.reference.tree_layouts import root_to_leaf_paths
from losslessness.zoo.entry import Mutant
from losslessness.zoo.steps import draw_uniforms, normalised, renormalise

TREE_PREFIX = "tree-"
"""Every tree mutant's name starts with this (``mutant/tree-<name>``)."""

MEDUSA_POSTERIOR_THRESHOLD = 0.09
"""Medusa's default ``posterior_threshold`` (epsilon), ``medusa_generate`` in
https://github.com/FasterDecoding/Medusa/blob/main/medusa/model/medusa_model.py."""

MEDUSA_POSTERIOR_ALPHA = 0.3
"""Medusa's default ``posterior_alpha`` (delta; "recommended to be sqrt(posterior_threshold)")."""

MEDUSA_ENTROPY_EPS = 1e-5
"""Medusa computes the entropy as ``-sum p log(p + 1e-5)`` (``evaluate_posterior``)."""

SGLANG_THRESHOLD_SINGLE = 0.5
"""The relaxed ``--speculative-accept-threshold-single`` of the lossy SGLang mutant (default 1)."""

SGLANG_THRESHOLD_ACC = 0.5
"""The relaxed ``--speculative-accept-threshold-acc`` of the lossy SGLang mutant (default 1)."""

SGLANG_MIN_THRESHOLD_ACC = 1e-9
"""SGLang clamps ``threshold_acc`` to at least this before dividing by it."""

SGLANG_SOURCE = (
    "https://github.com/sgl-project/sglang/blob/main/sgl-kernel/csrc/speculative/"
    "speculative_sampling.cuh"
)
FAST_PATH_TOP_K = 10
"""k of the sparse top-k fast path of :func:`residual_top_10_only` and its exact control."""

MEDUSA_SOURCE = "https://github.com/FasterDecoding/Medusa/blob/main/medusa/model/utils.py"
FLASHINFER_SAMPLING_SOURCE = (
    "https://github.com/flashinfer-ai/flashinfer/blob/main/include/flashinfer/sampling.cuh"
)
SPECINFER_SOURCE = "https://github.com/flexflow/FlexFlow"
MCSD_SOURCE = "https://github.com/NJUNLP/MCSD"
LLAMA_CPP_TREE_SOURCE = "https://github.com/ggml-org/llama.cpp/pull/5625"
EAGLE_SOURCE = "https://github.com/SafeAILab/EAGLE/blob/main/eagle/model/utils.py"
SGLANG_GREEDY_SOURCE = (
    "https://github.com/sgl-project/sglang/blob/main/sgl-kernel/csrc/speculative/eagle_utils.cu"
)
VLLM_SAMPLER_SOURCE = (
    "https://github.com/vllm-project/vllm/blob/main/vllm/v1/sample/ops/topk_topp_sampler.py"
)


# ------------------------------------------------------------------------------- tree steps


def _prepare(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate a tree call like the reference; return float64 p, q and int64 parents, ids on
    CPU (rows renormalised, which leaves the audit's normalised rows unchanged)."""
    validate_tree_inputs(target_probs, draft_probs, parents, token_ids, draft_scheme, generator)
    p = normalised(target_probs.detach().cpu())
    q = normalised(draft_probs.detach().cpu())
    return p, q, parents.detach().cpu().long(), token_ids.detach().cpu().long()


def _node_tokens(ids: torch.Tensor) -> torch.Tensor:
    """``[B, N+1]``: node n's token in column n (a 0 for the root, never read as a token)."""
    return torch.cat([torch.zeros((ids.shape[0], 1), dtype=torch.int64), ids], dim=1)


def _parent_of(parents: torch.Tensor) -> torch.Tensor:
    """``[B, N+1]``: node n's parent in column n (the root is its own parent)."""
    return torch.cat([torch.zeros((parents.shape[0], 1), dtype=torch.int64), parents], dim=1)


def _update(law: torch.Tensor, draft_law: torch.Tensor, token: torch.Tensor,
            scheme: str) -> torch.Tensor:
    """The running law after a rejected sibling with ``token [B, 1]``: ``norm(max(0, r - q))``
    for the sampled schemes, r with the token zeroed and renormalised for ``top-k``."""
    if scheme == "top-k":
        zeroed = renormalise(law.scatter(1, token, 0.0))
        return torch.where(zeroed.sum(dim=-1, keepdim=True) > 0, zeroed, law)
    return residual_distribution(law, draft_law)


def _exponential_race(law: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """``argmin_v E_v / law_v`` with ``E = -log(1 - U)`` i.i.d. Exp(1): an exact draw from
    ``norm(law)`` (the exponential-race / Gumbel-max trick). ``law, uniforms: [B, V]``."""
    exponentials = -torch.log1p(-uniforms)
    times = torch.where(law > 0, exponentials / torch.where(law > 0, law, 1.0), math.inf)
    return times.argmin(dim=-1)


def _top_k_final(law: torch.Tensor, p_row: torch.Tensor, uniforms: torch.Tensor, top_k: int,
                 exact: bool) -> torch.Tensor:
    """The final token by a sparse top-k fast path: inverse CDF over ``law`` gathered at the
    ``top_k`` most likely tokens of the node's target row ``p_row`` (``law, p_row: [B, V]``,
    ``uniforms: [B]``). ``exact``: the sparse path only where ``law`` has no mass outside those
    tokens, the dense draw elsewhere; otherwise the sparse path wherever the top k hold any
    of ``law``'s mass (the mass outside them is dropped)."""
    count = min(top_k, law.shape[-1])
    top = p_row.topk(count, dim=-1).indices
    sparse = law.gather(1, top)
    inside = sparse.sum(dim=-1)
    outside = law.sum(dim=-1) - inside
    use_sparse = (outside <= 0) if exact else (inside > 0)
    dense = sample_inverse_cdf(law, uniforms)
    if not bool(use_sparse.any()):
        return dense
    picked = sample_inverse_cdf(
        torch.where(use_sparse.unsqueeze(1), sparse, 1.0), uniforms
    )
    return torch.where(use_sparse, top.gather(1, picked.unsqueeze(1)).squeeze(1), dense)


@dataclass(frozen=True)
class _Walk:
    """Options of :func:`_walk`, each one mechanism (all False/None: the reference)."""

    against_p: bool = False
    rule_scheme: str | None = None
    final_row: str = "current"
    reverse_exchangeable: bool = False
    log_space: bool = False
    exponential_final: bool = False
    final_top_k: int | None = None
    final_top_k_exact: bool = False


def _walk(
    p: torch.Tensor,
    q: torch.Tensor,
    parents: torch.Tensor,
    ids: torch.Tensor,
    scheme: str,
    generator: torch.Generator,
    options: _Walk,
) -> TreeOutput:
    """The reference tree walk (module docstring of :mod:`losslessness.reference.tree`) with
    the mechanisms of ``options`` switched in. Randomness: ``B * N`` accept uniforms (node
    ``j+1`` uses column j), then ``B`` final uniforms (``B * V`` for the exponential race)."""
    batch, nodes = ids.shape
    vocab = p.shape[-1]
    rule = options.rule_scheme or scheme
    accept_u = draw_uniforms(generator, batch, nodes)
    final_u = (draw_uniforms(generator, batch, vocab) if options.exponential_final
               else draw_uniforms(generator, batch))
    depth = int(tree_depths(parents).max())
    table = child_table(parents)
    slots = list(range(table.shape[2]))
    if options.reverse_exchangeable and scheme in ("iid", "top-k"):
        slots.reverse()
    rows = torch.arange(batch)
    node_tokens = _node_tokens(ids)
    parent_of = _parent_of(parents)
    node_u = torch.cat([torch.ones((batch, 1), dtype=torch.float64), accept_u], dim=1)
    tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64)
    accepted = torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64)
    current = torch.zeros(batch, dtype=torch.int64)
    active = torch.ones(batch, dtype=torch.bool)
    for level in range(depth + 1):
        p_row = p[rows, current]
        residual = p_row
        draft_law = q[rows, current]
        if options.final_row == "root":
            final_law = p[:, 0]
        elif options.final_row == "parent":
            final_law = p[rows, parent_of[rows, current]]
        else:
            final_law = residual
        chosen = torch.full((batch,), PLACEHOLDER, dtype=torch.int64)
        for slot in slots:
            child = table[rows, current, slot]
            trying = active & (chosen < 0) & (child >= 0)
            if not bool(trying.any()):
                continue
            safe = child.clamp(min=0)
            token = node_tokens[rows, safe].unsqueeze(1)
            tested = p_row if options.against_p else residual
            r_x = tested.gather(1, token).squeeze(1)
            # Top-k siblings are deterministic: q only ranks them, the test is u < r(x).
            q_x = (torch.ones_like(r_x) if rule == "top-k"
                   else draft_law.gather(1, token).squeeze(1))
            u = node_u[rows, safe]
            if options.log_space:
                log_q = torch.log(torch.where(q_x > 0, q_x, 1.0))
                accept = torch.log(u) < torch.log(r_x) - log_q
            else:
                accept = u < r_x / torch.where(q_x > 0, q_x, 1.0)
            accept = trying & accept
            chosen = torch.where(accept, child, chosen)
            reject = (trying & ~accept).unsqueeze(1)
            if options.against_p:
                updated = residual_distribution(p_row, draft_law)
            else:
                updated = _update(residual, draft_law, token, rule)
            if options.final_row != "current":
                final_law = torch.where(reject, _update(final_law, draft_law, token, rule),
                                        final_law)
            if rule == "without-replacement":
                draft_law = torch.where(
                    reject, renormalise(draft_law.scatter(1, token, 0.0)), draft_law
                )
            residual = torch.where(reject, updated, residual)
        if options.final_row == "current":
            final_law = residual
        moved = chosen >= 0
        if level < depth:
            tokens[:, level] = torch.where(moved, node_tokens[rows, chosen.clamp(min=0)],
                                           tokens[:, level])
            accepted[:, level] = torch.where(moved, chosen, accepted[:, level])
        stopping = active & ~moved
        if bool(stopping.any()):
            if options.exponential_final:
                final = _exponential_race(final_law[stopping], final_u[stopping])
            elif options.final_top_k is not None:
                final = _top_k_final(final_law[stopping], p_row[stopping], final_u[stopping],
                                     options.final_top_k, options.final_top_k_exact)
            else:
                final = sample_inverse_cdf(final_law[stopping], final_u[stopping])
            tokens[stopping, level] = final
        active = active & moved
        current = torch.where(moved, chosen, current)
        if not bool(active.any()):
            break
    return TreeOutput(tokens, accepted)


TreeFunction = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str, torch.Generator], TreeOutput
]


# ----------------------------------------------------------------------------- lossy: sampling


def iid_siblings_against_p(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSY: every sibling is tested against the node's original p (``u < p(x) / q(x)``) as if
    it were the only draft, and the final token after all are rejected comes from the one-draft
    residual ``norm(max(0, p - q))``, instead of updating the running law after each rejection.

    Source: SpecInfer's multi-step speculative sampling (Miao et al. 2024, "SpecInfer",
    Alg. 2; implementation https://github.com/flexflow/FlexFlow) tests sibling i against the
    residual left by siblings 1..i-1; running the chain rule of Leviathan et al. once per
    branch omits that update. With two or more i.i.d. siblings the emitted law over-weights
    ``min(p, q)`` (each sibling gets its own ``min(1, p/q)`` chance) and the residual is
    under-weighted.

    Args and returns: :class:`~losslessness.protocol.TreeVerifier` (``[B, N+1, V]`` p and q,
    ``[B, N]`` parents and ids; :class:`TreeOutput`). Raises
    :class:`~losslessness.protocol.InvalidInputError` on invalid inputs.
    """
    p, q, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    return _walk(p, q, par, ids, draft_scheme, generator, _Walk(against_p=True))


def replacement_rule_on_distinct_drafts(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSY: siblings drawn without replacement are verified with the with-replacement (iid)
    rule: ``u < r(x) / q(x)`` and ``r <- norm(max(0, r - q))`` with the draft law q never
    updated, instead of the running ``q'`` (q with the tried siblings removed).

    Source: the two rules are distinct strategies in multi-candidate speculative decoding
    (Yang et al. 2024, "Multi-Candidate Speculative Decoding", code https://github.com/NJUNLP/MCSD,
    with and without replacement; Jeon et al. 2024, "Recursive Speculative Decoding", Alg. 2);
    llama.cpp's stochastic tree speculation (https://github.com/ggml-org/llama.cpp/pull/5625)
    drafts siblings without replacement ("if token in sampled_tokens: continue"). Sibling i>1
    was drawn from ``q'``, not q, so ``min(1, r/q)`` accepts it with the wrong probability.

    Args and returns: as :func:`iid_siblings_against_p`.
    """
    p, q, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    rule = "iid" if draft_scheme == "without-replacement" else draft_scheme
    return _walk(p, q, par, ids, draft_scheme, generator, _Walk(rule_scheme=rule))


def distinct_rule_on_replacement_drafts(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSY: the reverse of :func:`replacement_rule_on_distinct_drafts`: i.i.d. siblings (which
    may repeat a token) are verified with the without-replacement rule, dividing by ``q'`` (q
    with the tried siblings removed and renormalised) although sibling i was drawn from q.

    Source: as :func:`replacement_rule_on_distinct_drafts` (https://github.com/NJUNLP/MCSD and
    Jeon et al. 2024): the without-replacement rule is exact only for drafts drawn from the
    running ``q'``; a repeated token has ``q'(x) = 0`` and a fresh token is tested against an
    inflated ``q'``.

    Args and returns: as :func:`iid_siblings_against_p`.
    """
    p, q, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    rule = "without-replacement" if draft_scheme == "iid" else draft_scheme
    return _walk(p, q, par, ids, draft_scheme, generator, _Walk(rule_scheme=rule))


def final_from_root_row(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSY: the final token (the correction after the last node's children are all rejected,
    or the bonus at a leaf) is drawn from the root's target row (with the same rejected
    siblings removed) instead of the last accepted node's row.

    Source: SGLang's tree kernel moves ``cur_prob_offset`` to the accepted node's row at every
    acceptance and draws the final token from ``relu(target_probs - draft_probs)`` at that
    offset (``tree_speculative_sampling_target_only``,
    https://github.com/sgl-project/sglang/blob/main/sgl-kernel/csrc/speculative/speculative_sampling.cuh);
    an offset left at its initial value (row 0) is this mutant. The accepted path is right;
    only the final token of a step past the root follows the wrong law.

    Args and returns: as :func:`iid_siblings_against_p`.
    """
    p, q, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    return _walk(p, q, par, ids, draft_scheme, generator, _Walk(final_row="root"))


def final_from_parent_row(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSY: the final token is drawn from the target row of the last accepted node's parent
    (an off-by-one in the accepted-path index: ``accept_index[n - 1]`` for ``accept_index[n]``),
    with the rejected siblings removed, instead of the last accepted node's own row.

    Source: the same final draw of SGLang's ``tree_speculative_sampling_target_only``
    (https://github.com/sgl-project/sglang/blob/main/sgl-kernel/csrc/speculative/speculative_sampling.cuh),
    whose row is the last entry of ``accept_index``; reading the entry before it is this
    mutant. At the root the parent is the root itself, so the root's law is right.

    Args and returns: as :func:`iid_siblings_against_p`.
    """
    p, q, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    return _walk(p, q, par, ids, draft_scheme, generator, _Walk(final_row="parent"))


def residual_top_10_only(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSY: the final token (the correction after the last node's children are all rejected,
    or the bonus at a leaf) is sampled among the 10 tokens of largest target probability at
    that node only: the running residual gathered at p's top 10 and renormalised, the mass
    of every other token dropped. At V <= 10 this is exact; at a language model's vocabulary
    the tail outside the top 10 is never emitted after a rejection.

    Source: a sparse top-k fast path for the residual draw, the shape of FlashInfer's
    ``top_k_sampling_from_probs`` and of samplers that keep only the top-k logits
    (https://github.com/flashinfer-ai/flashinfer/blob/main/include/flashinfer/sampling.cuh)
    reused for the residual without a check that the residual's support fits in the top k;
    issue 21 of this project (a tree verifier sampling the residual among the target's top 10
    passed every tree case at V <= 8). No shipped engine bug of exactly this shape was found
    in the engines' trackers.

    Args and returns: as :func:`iid_siblings_against_p`.
    """
    p, q, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    return _walk(p, q, par, ids, draft_scheme, generator, _Walk(final_top_k=FAST_PATH_TOP_K))


DEEP_TOP_K_DEPTH = 2
"""Shallowest depth whose nodes :func:`deep_nodes_top_10_only` cuts to the top 10."""


def deep_nodes_top_10_only(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSY: at every node of depth >= 2 the target law is cut to its 10 most likely tokens
    and renormalised (the acceptance tests, the residual and the bonus token all use the cut
    law); the root and its children are exact. At V <= 10 this is exact; at a language
    model's vocabulary the tail of p is never emitted after a deeper node.

    The error lives only beyond the root's children, where the nodes split into one
    (depth, token) class per drafted token: at V = 1024 none is reached often enough for an
    identity test of its own, so only the law check's pooled PIT test sees it (it passed the
    default tree audit before that test existed).

    Source: the sparse top-k shape of :func:`residual_top_10_only` (FlashInfer's
    ``top_k_sampling_from_probs``,
    https://github.com/flashinfer-ai/flashinfer/blob/main/include/flashinfer/sampling.cuh,
    applied without a check that the law's support fits in the top k), moved past depth 1.
    No shipped engine bug of exactly this shape was found in the engines' trackers.

    Args and returns: as :func:`iid_siblings_against_p`.
    """
    p, q, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    top = p.topk(min(FAST_PATH_TOP_K, p.shape[-1]), dim=-1).indices
    cut = renormalise(torch.zeros_like(p).scatter(-1, top, p.gather(-1, top)))
    deep = (tree_depths(par) >= DEEP_TOP_K_DEPTH).unsqueeze(-1)
    return _walk(torch.where(deep, cut, p), q, par, ids, draft_scheme, generator, _Walk())


def _sglang_target_only(
    p: torch.Tensor,
    parents: torch.Tensor,
    ids: torch.Tensor,
    generator: torch.Generator,
    *,
    threshold_single: float,
    threshold_acc: float,
    skip_repeats: bool,
) -> TreeOutput:
    """SGLang's target-only tree rule, vectorised: one coin per level (node n's coin is column
    n of ``B * (N+1)`` uniforms, the root's column 0), siblings tried in order with
    ``prob_acc += p(x)``, accept iff ``coin <= prob_acc / threshold_acc`` or ``p(x) >=
    threshold_single``; a rejected token's p is removed from the final law, drawn from
    ``relu(p - removed)`` with one more uniform per row. ``skip_repeats``: a sibling whose token
    an earlier sibling already had is skipped (no test, nothing added)."""
    batch, nodes = ids.shape
    coins = draw_uniforms(generator, batch, nodes + 1)
    final_u = draw_uniforms(generator, batch)
    threshold_acc = max(threshold_acc, SGLANG_MIN_THRESHOLD_ACC)
    depth = int(tree_depths(parents).max())
    table = child_table(parents)
    rows = torch.arange(batch)
    node_tokens = _node_tokens(ids)
    tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64)
    accepted = torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64)
    current = torch.zeros(batch, dtype=torch.int64)
    active = torch.ones(batch, dtype=torch.bool)
    for level in range(depth + 1):
        p_row = p[rows, current]
        coin = coins[rows, current]
        prob_acc = torch.zeros(batch, dtype=torch.float64)
        removed = torch.zeros_like(p_row)
        tried = torch.zeros_like(p_row, dtype=torch.bool)
        chosen = torch.full((batch,), PLACEHOLDER, dtype=torch.int64)
        for slot in range(table.shape[2]):
            child = table[rows, current, slot]
            trying = active & (chosen < 0) & (child >= 0)
            token = node_tokens[rows, child.clamp(min=0)].unsqueeze(1)
            if skip_repeats:
                trying = trying & ~tried.gather(1, token).squeeze(1)
            if not bool(trying.any()):
                continue
            p_x = p_row.gather(1, token).squeeze(1)
            prob_acc = torch.where(trying, prob_acc + p_x, prob_acc)
            accept = trying & ((coin <= prob_acc / threshold_acc) | (p_x >= threshold_single))
            chosen = torch.where(accept, child, chosen)
            reject = (trying & ~accept).unsqueeze(1)
            removed = torch.where(reject, removed.scatter(1, token, p_x.unsqueeze(1)), removed)
            tried = tried | (reject & torch.zeros_like(tried).scatter(1, token, True))
        moved = chosen >= 0
        if level < depth:
            tokens[:, level] = torch.where(moved, node_tokens[rows, chosen.clamp(min=0)],
                                           tokens[:, level])
            accepted[:, level] = torch.where(moved, chosen, accepted[:, level])
        stopping = active & ~moved
        if bool(stopping.any()):
            law = (p_row - removed).clamp(min=0.0)
            law = torch.where(law.sum(dim=-1, keepdim=True) > 0, law, p_row)
            tokens[stopping, level] = sample_inverse_cdf(law[stopping], final_u[stopping])
        active = active & moved
        current = torch.where(moved, chosen, current)
        if not bool(active.any()):
            break
    return TreeOutput(tokens, accepted)


def duplicate_siblings_counted_twice(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSY: SGLang's one-coin cumulative rule (exact for distinct siblings) applied to
    siblings that repeat a token: a repeated token's p is added to ``prob_acc`` a second time,
    so a token drafted twice is accepted with probability up to ``2 p(x)``.

    Source: ``tree_speculative_sampling_target_only`` in sgl-kernel
    (https://github.com/sgl-project/sglang/blob/main/sgl-kernel/csrc/speculative/speculative_sampling.cuh)
    accumulates ``prob_acc += target_probs[draft_token_id]`` over the tried siblings and
    accepts iff ``coin <= prob_acc``: inverse-CDF sampling of p over the siblings' tokens,
    which assumes the siblings are distinct (EAGLE's top-k trees). With i.i.d. drafted siblings
    (``iid`` scheme) a repeat occupies a second interval of width p(x) of the coin. The final
    draw (``relu(p - removed)``) is unaffected (removing a token twice is idempotent).
    Thresholds at SGLang's defaults (1, 1).

    Args and returns: as :func:`iid_siblings_against_p` (q is not used: target-only).
    """
    p, _, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    return _sglang_target_only(p, par, ids, generator, threshold_single=1.0, threshold_acc=1.0,
                               skip_repeats=False)


def sglang_threshold_single(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSY: SGLang's tree rule with ``threshold_single = 0.5``: any sibling with
    ``p(x) >= 0.5`` is accepted whatever the coin, so a likely token the coin should have
    rejected (probability ``1 - p(x)`` past the earlier siblings) is kept.

    Source: ``--speculative-accept-threshold-single`` (default 1.0) as used by
    ``tree_speculative_sampling_target_only``
    (https://github.com/sgl-project/sglang/blob/main/sgl-kernel/csrc/speculative/speculative_sampling.cuh):
    ``if (coin <= prob_acc / threshold_acc || target_prob_single >= threshold_single)`` accept.
    Modelled exactly: one coin per level, repeats not skipped, final from ``relu(p - removed)``.

    Args and returns: as :func:`duplicate_siblings_counted_twice`.
    """
    p, _, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    return _sglang_target_only(p, par, ids, generator, threshold_single=SGLANG_THRESHOLD_SINGLE,
                               threshold_acc=1.0, skip_repeats=False)


def sglang_threshold_acc(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSY: SGLang's tree rule with ``threshold_acc = 0.5``: the cumulative test
    ``coin <= prob_acc / 0.5`` accepts sibling i with about twice its target probability.

    Source: ``--speculative-accept-threshold-acc`` (default 1.0), divided into ``prob_acc``
    in ``tree_speculative_sampling_target_only`` after clamping to at least 1e-9
    (https://github.com/sgl-project/sglang/blob/main/sgl-kernel/csrc/speculative/speculative_sampling.cuh).

    Args and returns: as :func:`duplicate_siblings_counted_twice`.
    """
    p, _, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    return _sglang_target_only(p, par, ids, generator, threshold_single=1.0,
                               threshold_acc=SGLANG_THRESHOLD_ACC, skip_repeats=False)


def medusa_typical_acceptance(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSY BY DESIGN: Medusa's typical acceptance. A node x under parent n is plausible iff
    ``p_n(x) > min(epsilon, delta * exp(-H(p_n)))`` with ``H(p) = -sum p log(p + 1e-5)``,
    epsilon = 0.09 and delta = 0.3 (Medusa's defaults); the accepted path is the deepest node
    whose whole path is plausible (ties: the largest sum of log p along the path, then the
    lowest index); the final token is drawn from p at that node.

    Source: ``evaluate_posterior`` (``posterior_threshold``, ``posterior_alpha``) in
    https://github.com/FasterDecoding/Medusa/blob/main/medusa/model/utils.py and Cai et al.
    2024, "Medusa", section 2.3.1: typical acceptance trades the target law for acceptance;
    it keeps every plausible draft, so tokens q proposes often are over-emitted.

    Args and returns: as :func:`iid_siblings_against_p` (q is not used).
    """
    p, _, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    batch, nodes = ids.shape
    final_u = draw_uniforms(generator, batch)
    entropy = -(p * torch.log(p + MEDUSA_ENTROPY_EPS)).sum(dim=-1)
    threshold = torch.minimum(torch.full_like(entropy, MEDUSA_POSTERIOR_THRESHOLD),
                              torch.exp(-entropy) * MEDUSA_POSTERIOR_ALPHA)
    parent_of = _parent_of(par)
    node_tokens = _node_tokens(ids)
    depths = tree_depths(par)
    ok = torch.ones((batch, nodes + 1), dtype=torch.bool)
    loglik = torch.zeros((batch, nodes + 1), dtype=torch.float64)
    rows = torch.arange(batch)
    for node in range(1, nodes + 1):
        parent = parent_of[:, node]
        prob = p[rows, parent, node_tokens[:, node]]
        plausible = prob > threshold[rows, parent]
        ok[:, node] = plausible & ok[rows, parent]
        loglik[:, node] = loglik[rows, parent] + torch.log(prob)
    length = torch.where(ok, depths, -1)
    deepest = length == length.max(dim=1, keepdim=True).values
    score = torch.where(deepest, loglik, -math.inf)
    best = score.argmax(dim=1)
    depth = int(depths.max())
    best_depth = depths[rows, best]
    tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64)
    accepted = torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64)
    walker = best
    for level in range(depth, 0, -1):
        on = best_depth >= level
        accepted[:, level - 1] = torch.where(on, walker, accepted[:, level - 1])
        tokens[:, level - 1] = torch.where(on, node_tokens[rows, walker], tokens[:, level - 1])
        walker = torch.where(on, parent_of[rows, walker], walker)
    final = sample_inverse_cdf(p[rows, best], final_u)
    tokens[rows, best_depth] = final
    return TreeOutput(tokens, accepted)


# ----------------------------------------------------------------------------- lossy: greedy


def _greedy_prepare(
    target_logits: torch.Tensor, parents: torch.Tensor, token_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate a greedy tree call; return the argmax table ``[B, N+1]`` (lowest index on
    ties), parents and ids, int64 on CPU."""
    validate_greedy_tree_inputs(target_logits, parents, token_ids)
    best = argmax_lowest_index(target_logits.detach().cpu())
    return best, parents.detach().cpu().long(), token_ids.detach().cpu().long()


def _greedy_walk(best: torch.Tensor, parents: torch.Tensor, ids: torch.Tensor, *,
                 pick: str, final_row: str) -> TreeOutput:
    """Greedy tree walk: ``pick`` the matching child (``lowest``, ``highest`` or ``first-only``:
    only slot 0 is compared); the final token is the argmax of the current node's row or, for
    ``final_row="parent"``, of its parent's row."""
    batch = ids.shape[0]
    depth = int(tree_depths(parents).max())
    table = child_table(parents)
    rows = torch.arange(batch)
    node_tokens = torch.cat([torch.full((batch, 1), -2, dtype=torch.int64), ids], dim=1)
    parent_of = _parent_of(parents)
    tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64)
    accepted = torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64)
    current = torch.zeros(batch, dtype=torch.int64)
    active = torch.ones(batch, dtype=torch.bool)
    for level in range(depth + 1):
        wanted = best[rows, current]
        children = table[rows, current]
        if pick == "first-only":
            children = children[:, :1]
        matches = (children >= 0) & (node_tokens.gather(1, children.clamp(min=0))
                                     == wanted.unsqueeze(1))
        if pick == "highest":
            first = torch.where(matches, children, -1).max(dim=1).values
        else:
            first = torch.where(matches, children, torch.iinfo(torch.int64).max).min(dim=1).values
        moved = active & matches.any(dim=1)
        stopping = active & ~moved
        final = best[rows, parent_of[rows, current]] if final_row == "parent" else wanted
        tokens[:, level] = torch.where(moved, wanted, torch.where(stopping, final,
                                                                  tokens[:, level]))
        if level < depth:
            accepted[:, level] = torch.where(moved, first, accepted[:, level])
        active = moved
        current = torch.where(moved, first, current)
        if not bool(active.any()):
            break
    return TreeOutput(tokens, accepted)


def greedy_first_child_only(
    target_logits: torch.Tensor, parents: torch.Tensor, token_ids: torch.Tensor
) -> TreeOutput:
    """LOSSLESS control, SUBOPTIMAL: only each node's first child is compared with the target's
    argmax (the tree is walked as the chain of first children), so a matching later sibling is
    never accepted; every emitted token is still greedy decoding's, so the audit must warn
    (SUBOPTIMAL), never call it LOSSY.

    Source: EAGLE's and Medusa's greedy ``evaluate_posterior`` compare every candidate path
    (``candidates[:, 1:] == argmax(logits[:, :-1])``) and keep the longest
    (https://github.com/SafeAILab/EAGLE/blob/main/eagle/model/utils.py); verifying only the
    first retrieved path (candidate 0, their fallback) is this mutant. Its tokens stay a prefix
    of greedy decoding, but the output differs from the greedy tree protocol's (fewer accepted
    nodes, another final position).

    Args:
        target_logits: ``[B, N+1, V]`` float. parents, token_ids: ``[B, N]`` int64.

    Returns:
        :class:`TreeOutput` (int64, CPU).

    Raises:
        InvalidInputError: see :func:`~losslessness.protocol.validate_greedy_tree_inputs`.
    """
    best, par, ids = _greedy_prepare(target_logits, parents, token_ids)
    return _greedy_walk(best, par, ids, pick="first-only", final_row="current")


def greedy_highest_index_match(
    target_logits: torch.Tensor, parents: torch.Tensor, token_ids: torch.Tensor
) -> TreeOutput:
    """LOSSLESS control: among a node's children whose token is the argmax, the highest-index
    one is followed instead of the lowest-index one. With repeated sibling tokens the walk
    enters another subtree than the reference's, but both duplicates continue greedy decoding
    (under a real model they share their logits), so the audit must not call it LOSSY.

    Source: SGLang's ``verify_tree_greedy`` walks siblings in ``retrive_next_sibling`` order
    and takes the first match
    (https://github.com/sgl-project/sglang/blob/main/sgl-kernel/csrc/speculative/eagle_utils.cu);
    scanning the sibling list from its end is this mutant.

    Args and returns: as :func:`greedy_first_child_only`.
    """
    best, par, ids = _greedy_prepare(target_logits, parents, token_ids)
    return _greedy_walk(best, par, ids, pick="highest", final_row="current")


def greedy_final_from_parent(
    target_logits: torch.Tensor, parents: torch.Tensor, token_ids: torch.Tensor
) -> TreeOutput:
    """LOSSY: the walk is right, but the final token is the argmax of the last accepted node's
    parent's row (the row of the second-to-last ``accept_index`` entry) instead of its own.

    Source: the final (bonus) token of SGLang's ``verify_tree_greedy`` is
    ``target_predict[last_accepted_retrive_idx]``
    (https://github.com/sgl-project/sglang/blob/main/sgl-kernel/csrc/speculative/eagle_utils.cu);
    reading the previous path entry is this mutant.

    Args and returns: as :func:`greedy_first_child_only`.
    """
    best, par, ids = _greedy_prepare(target_logits, parents, token_ids)
    return _greedy_walk(best, par, ids, pick="lowest", final_row="parent")


def greedy_first_matching_path(
    target_logits: torch.Tensor, parents: torch.Tensor, token_ids: torch.Tensor
) -> TreeOutput:
    """LOSSY: the accepted length is the longest match over the tree's root-to-leaf paths, but
    the tokens are read from the first path that matches at all, so past that path's own match
    it emits drafted tokens the target never chose.

    Source: EAGLE's and Medusa's greedy ``evaluate_posterior`` compute every candidate path's
    match length (``torch.cumprod(candidates[:, 1:] == argmax(logits[:, :-1]), 1).sum(1)``),
    then ``accept_length = max`` and ``best_candidate = argmax`` of those lengths
    (https://github.com/SafeAILab/EAGLE/blob/main/eagle/model/utils.py,
    https://github.com/FasterDecoding/Medusa/blob/main/medusa/model/utils.py); taking the
    candidate index from the first nonzero match instead of the argmax is this mutant.

    Args:
        target_logits: ``[B, N+1, V]`` float. parents, token_ids: ``[B, N]`` int64.

    Returns:
        :class:`TreeOutput` (int64, CPU): the first matching path's nodes up to the longest
        match's length, then the argmax at the last of them.

    Raises:
        InvalidInputError: see :func:`~losslessness.protocol.validate_greedy_tree_inputs`.
    """
    best, par, ids = _greedy_prepare(target_logits, parents, token_ids)
    batch = ids.shape[0]
    depth = int(tree_depths(par).max())
    tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64)
    accepted = torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64)
    node_tokens = _node_tokens(ids)
    parent_of = _parent_of(par)
    for b in range(batch):
        paths = root_to_leaf_paths(par[b])
        real = paths >= 0
        nodes = paths.clamp(min=0)
        matches = real & (node_tokens[b, nodes] == best[b, parent_of[b, nodes]])
        lengths = torch.cumprod(matches.long(), dim=1).sum(dim=1)
        longest = int(lengths.max())
        nonzero = torch.nonzero(lengths > 0)
        chosen = int(nonzero[0]) if len(nonzero) else 0
        length = min(longest, int(real[chosen].sum()))
        path = paths[chosen, :length]
        accepted[b, :length] = path
        tokens[b, :length] = node_tokens[b, path]
        last = int(path[-1]) if length else 0
        tokens[b, length] = best[b, last]
    return TreeOutput(tokens, accepted)


# ----------------------------------------------------------------------------- controls


def siblings_reversed(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSLESS CONTROL: for ``iid`` and ``top-k`` siblings the children are tried from the last
    to the first; ``without-replacement`` siblings keep their drawing order.

    Why lossless: i.i.d. siblings are exchangeable, so any fixed order gives SpecInfer's
    multi-step rule on a relabelled draw (Miao et al. 2024, Thm. 4.2; implementation
    https://github.com/flexflow/FlexFlow); for the deterministic top-k set, trying the tokens
    in any order samples x ~ p one candidate at a time. Siblings drawn without replacement are
    not exchangeable (their order carries the draw's conditioning), so their order is kept.

    Args and returns: as :func:`iid_siblings_against_p`.
    """
    p, q, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    return _walk(p, q, par, ids, draft_scheme, generator, _Walk(reverse_exchangeable=True))


def exponential_race_final(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSLESS CONTROL: the reference rule, with the final token drawn by an exponential race
    ``argmin_v E_v / r(v)`` (``E_v`` i.i.d. Exp(1)) instead of by inverse CDF: an exact sample of
    ``norm(r)`` (the Gumbel-max trick in exponential form).

    Source: vLLM's ``random_sample`` draws tokens this way (``probs / Exp(1)``, argmax;
    https://github.com/vllm-project/vllm/blob/main/vllm/v1/sample/ops/topk_topp_sampler.py),
    the Gumbel-max trick in exponential form. Uses ``B * N`` accept uniforms then ``B * V``.

    Args and returns: as :func:`iid_siblings_against_p`.
    """
    p, q, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    return _walk(p, q, par, ids, draft_scheme, generator, _Walk(exponential_final=True))


def log_space_acceptance(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSLESS CONTROL: the reference rule with the test in log space,
    ``log u < log r(x) - log q'(x)`` (``log u < log r(x)`` for top-k): the same event as
    ``u < r(x) / q'(x)`` for u in [0, 1) (``log 0 = -inf`` accepts only tokens with r(x) > 0,
    whose acceptance has that measure-zero extra point).

    Source: multi-candidate speculative decoding with and without replacement
    (https://github.com/NJUNLP/MCSD) and Jeon et al. 2024's recursive rejection sampling,
    tested as log-ratios as vLLM's and vllm-ascend's rejection samplers do.

    Args and returns: as :func:`iid_siblings_against_p`.
    """
    p, q, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    return _walk(p, q, par, ids, draft_scheme, generator, _Walk(log_space=True))


def sample_and_match(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSLESS CONTROL: at every level draw ``x ~ p`` at the current node; move to the first
    child whose token is x, or emit x as the final token if none has it. Every emitted token is
    a fresh draw from p at its node, whatever the scheme (lossless, and for top-k it accepts
    exactly as often as the reference; for sampled drafts less often).

    Source: SpecInfer's "naive sampling" verification (Miao et al. 2024, section 4.2) and the
    top-k rule as EAGLE implements it for deterministic trees (``evaluate_posterior``,
    https://github.com/SafeAILab/EAGLE/blob/main/eagle/model/utils.py), written as
    sample-and-match per level. Randomness: ``B * (D+1)`` uniforms, column l for level l.

    Args and returns: as :func:`iid_siblings_against_p` (q is not used).
    """
    p, _, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    batch = ids.shape[0]
    depth = int(tree_depths(par).max())
    level_u = draw_uniforms(generator, batch, depth + 1)
    table = child_table(par)
    rows = torch.arange(batch)
    node_tokens = torch.cat([torch.full((batch, 1), -2, dtype=torch.int64), ids], dim=1)
    tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64)
    accepted = torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64)
    current = torch.zeros(batch, dtype=torch.int64)
    active = torch.ones(batch, dtype=torch.bool)
    for level in range(depth + 1):
        drawn = sample_inverse_cdf(p[rows, current], level_u[:, level])
        children = table[rows, current]
        matches = (children >= 0) & (node_tokens.gather(1, children.clamp(min=0))
                                     == drawn.unsqueeze(1))
        first = torch.where(matches, children, torch.iinfo(torch.int64).max).min(dim=1).values
        moved = active & matches.any(dim=1)
        tokens[:, level] = torch.where(active, drawn, tokens[:, level])
        if level < depth:
            accepted[:, level] = torch.where(moved, first, accepted[:, level])
        active = moved
        current = torch.where(moved, first, current)
        if not bool(active.any()):
            break
    return TreeOutput(tokens, accepted)


def exact_top_k_fast_path(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSLESS CONTROL: the reference rule with a sparse top-k fast path for the final token
    that is exact: the residual is sampled among p's 10 most likely tokens only where its whole
    support lies in them (always at V <= 10, and where rejections removed every other token),
    by the dense inverse CDF otherwise. Same law as the reference, other draws.

    Source: the guarded fast path of :func:`residual_top_10_only` (FlashInfer's
    ``top_k_sampling_from_probs``,
    https://github.com/flashinfer-ai/flashinfer/blob/main/include/flashinfer/sampling.cuh,
    is exact only when the distribution's support fits in its top k).

    Args and returns: as :func:`iid_siblings_against_p`.
    """
    p, q, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    return _walk(p, q, par, ids, draft_scheme, generator,
                 _Walk(final_top_k=FAST_PATH_TOP_K, final_top_k_exact=True))


def one_coin_cumulative(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    parents: torch.Tensor,
    token_ids: torch.Tensor,
    draft_scheme: str,
    generator: torch.Generator,
) -> TreeOutput:
    """LOSSLESS CONTROL: SGLang's target-only rule at its default thresholds (1, 1), one coin
    per level and ``coin <= sum of p over the tried siblings``, with a sibling whose token was
    already tried skipped: inverse-CDF sampling of p over the distinct sibling tokens, then
    the final token from p with those tokens removed. Lossless for every scheme (it never
    reads q).

    Source: ``tree_speculative_sampling_target_only``
    (https://github.com/sgl-project/sglang/blob/main/sgl-kernel/csrc/speculative/speculative_sampling.cuh);
    :func:`duplicate_siblings_counted_twice` is the same rule without the skip.

    Args and returns: as :func:`iid_siblings_against_p` (q is not used).
    """
    p, _, par, ids = _prepare(target_probs, draft_probs, parents, token_ids, draft_scheme,
                              generator)
    return _sglang_target_only(p, par, ids, generator, threshold_single=1.0, threshold_acc=1.0,
                               skip_repeats=True)


def greedy_path_marking(
    target_logits: torch.Tensor, parents: torch.Tensor, token_ids: torch.Tensor
) -> TreeOutput:
    """LOSSLESS CONTROL: greedy tree verification by marking, node by node in index order, the
    lowest-index child of each on-path node whose token is its parent's argmax, then reading
    the marked path from the root: the same output as walking the tree level by level.

    Source: greedy tree verification (Miao et al. 2024, section 4.2; SGLang's
    ``verify_tree_greedy``,
    https://github.com/sgl-project/sglang/blob/main/sgl-kernel/csrc/speculative/eagle_utils.cu),
    computed over nodes instead of levels.

    Args and returns: as :func:`greedy_first_child_only`.
    """
    best, par, ids = _greedy_prepare(target_logits, parents, token_ids)
    batch, nodes = ids.shape
    rows = torch.arange(batch)
    next_on_path = torch.full((batch, nodes + 1), PLACEHOLDER, dtype=torch.int64)
    on_path = torch.zeros((batch, nodes + 1), dtype=torch.bool)
    on_path[:, 0] = True
    for node in range(1, nodes + 1):
        parent = par[:, node - 1]
        takes = (on_path[rows, parent] & (ids[:, node - 1] == best[rows, parent])
                 & (next_on_path[rows, parent] < 0))
        next_on_path[rows, parent] = torch.where(takes, node, next_on_path[rows, parent])
        on_path[:, node] = takes
    depth = int(tree_depths(par).max())
    tokens = torch.full((batch, depth + 1), PLACEHOLDER, dtype=torch.int64)
    accepted = torch.full((batch, depth), PLACEHOLDER, dtype=torch.int64)
    current = torch.zeros(batch, dtype=torch.int64)
    active = torch.ones(batch, dtype=torch.bool)
    for level in range(depth + 1):
        tokens[:, level] = torch.where(active, best[rows, current], tokens[:, level])
        following = next_on_path[rows, current]
        moved = active & (following >= 0)
        if level < depth:
            accepted[:, level] = torch.where(moved, following, accepted[:, level])
        active = moved
        current = torch.where(moved, following, current)
    return TreeOutput(tokens, accepted)


# ----------------------------------------------------------------------------- cases


CASE_SEED = 20240511
"""Seed of the construction of every tree mutant's own case (deterministic everywhere)."""


def _rows(rng: np.random.Generator, count: int, vocab: int, concentration: float) -> np.ndarray:
    """``[count, V]`` Dirichlet rows (all positive)."""
    return normalise(np.maximum(dirichlet_rows(rng, count, vocab, concentration), 1e-6))


def _tree_case(
    case_id: str,
    parents: tuple[int, ...],
    scheme: str,
    root_target: list[float] | np.ndarray,
    root_draft: list[float] | np.ndarray,
    seed: int,
    *,
    concentration: float = 0.5,
    tables: tuple[np.ndarray, np.ndarray] | None = None,
    tags: frozenset[str] = frozenset(),
) -> TreeCase:
    """A :class:`TreeCase` with the given root laws and Dirichlet Markov tables (or ``tables``)
    for the deeper nodes, drawn from ``CASE_SEED + seed``."""
    p0 = np.asarray(root_target, dtype=np.float64)
    q0 = np.asarray(root_draft, dtype=np.float64)
    vocab = p0.shape[0]
    depth = tree_depth(parents)
    if tables is None:
        rng = np.random.default_rng(CASE_SEED + seed)
        target = _rows(rng, depth * vocab, vocab, concentration).reshape(depth, vocab, vocab)
        draft = _rows(rng, depth * vocab, vocab, concentration).reshape(depth, vocab, vocab)
    else:
        target, draft = tables
    return TreeCase(
        case_id,
        f"V={vocab} N={len(parents)} {scheme} siblings, Markov p/q per depth and token",
        parents,
        torch.from_numpy(normalise(p0)),
        torch.from_numpy(normalise(q0)),
        torch.from_numpy(np.ascontiguousarray(target)),
        torch.from_numpy(np.ascontiguousarray(draft)),
        scheme,
        tags=tags,
    )


def _greedy_tree_case(case_id: str, parents: tuple[int, ...], seed: int, *, vocab: int = 8,
                      batch: int = 256, repeat_first: bool = True) -> GreedyTreeCase:
    """A :class:`GreedyTreeCase` with random logits whose drafted tokens often equal their
    parent's argmax (80%); with ``repeat_first`` the second sibling of the root repeats the
    first's token, so two subtrees compete for the same greedy token."""
    rng = np.random.default_rng(CASE_SEED + seed)
    nodes = len(parents)
    logits = rng.normal(size=(batch, nodes + 1, vocab)) * 2.0
    best = logits.argmax(axis=-1)
    ids = np.zeros((batch, nodes), dtype=np.int64)
    for j, parent in enumerate(parents):
        guess = rng.integers(0, vocab, size=batch)
        ids[:, j] = np.where(rng.random(batch) < 0.8, best[:, parent], guess)
    if repeat_first:
        root_children = [j for j, parent in enumerate(parents) if parent == 0]
        ids[:, root_children[1]] = ids[:, root_children[0]]
    return GreedyTreeCase(
        case_id,
        f"V={vocab} N={nodes} greedy tree, random logits, B={batch}",
        torch.from_numpy(logits),
        batched_parents(parents, batch),
        torch.from_numpy(ids),
        frozenset({"duplicates"} if repeat_first else {"random"}),
    )


# ----------------------------------------------------------------------------- zoo


def _wide_root(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A root p and q at V = 256, Dirichlet(0.5) rows drawn from ``CASE_SEED + 100 + seed``."""
    rows = _rows(np.random.default_rng(CASE_SEED + 100 + seed), 2, 256, 0.5)
    return rows[0], rows[1]


def _deep_chain_case() -> TreeCase:
    """The case of :func:`deep_nodes_top_10_only` (see its comment in :func:`_case_builders`)."""
    vocab = 256
    peaked = np.full(vocab, 0.2 / (vocab - 1))
    peaked[0] = 0.8
    target = _rows(np.random.default_rng(CASE_SEED + 21), 2 * vocab, vocab, 0.5)
    target = target.reshape(2, vocab, vocab)
    target[0] = peaked
    draft = np.broadcast_to(peaked, (2, vocab, vocab)).copy()
    return _tree_case("tree-deep-chain2-v256-iid", (0, 1), "iid", peaked, peaked, 21,
                      tables=(target, draft))


def _case_builders() -> dict[str, Callable[[], TreeCase | GreedyTreeCase]]:
    """Every tree mutant's case builder by mutant name (see each builder's comment for why its
    case makes the mechanism act); a case is built on first use."""
    vocab4_p = [0.15, 0.15, 0.35, 0.35]
    vocab4_q = [0.55, 0.35, 0.05, 0.05]
    star3 = (0, 0, 0)
    cases: dict[str, Callable[[], TreeCase | GreedyTreeCase]] = {
        # Three i.i.d. siblings of a q far from p: each gets its own min(1, p/q) chance.
        "tree-iid-siblings-against-p": functools.partial(
            _tree_case, "tree-iid-against-p-v4", (*star3, 1), "iid", vocab4_p, vocab4_q, 1),
        # Three siblings without replacement: siblings 2 and 3 come from q', not q (exact root
        # TV 0.175, tests/adapters/test_tree_mutants.py).
        "tree-replacement-rule-on-distinct-drafts": functools.partial(
            _tree_case, "tree-wr-as-iid-v4", (*star3, 1), "without-replacement",
            [0.2, 0.1, 0.3, 0.4], [0.1, 0.6, 0.2, 0.1], 2),
        # Three i.i.d. siblings from a peaked q: repeats are common and q' is inflated (exact
        # root TV 0.14).
        "tree-distinct-rule-on-replacement-drafts": functools.partial(
            _tree_case, "tree-iid-as-wr-v4", (*star3, 1), "iid", [0.2, 0.2, 0.3, 0.3],
            [0.1, 0.1, 0.7, 0.1], 3),
        # A chain of depth 3 whose deeper p rows are far from the root's and whose q is far
        # from p (frequent rejections, so the final row matters).
        "tree-final-from-root-row": functools.partial(
            _tree_case, "tree-chain3-v6", (0, 1, 2), "iid", [0.6, 0.2, 0.05, 0.05, 0.05, 0.05],
            [0.3, 0.3, 0.1, 0.1, 0.1, 0.1], 4, concentration=0.3),
        "tree-final-from-parent-row": functools.partial(
            _tree_case, "tree-chain3-v6-b", (0, 1, 2), "iid", [0.6, 0.2, 0.05, 0.05, 0.05, 0.05],
            [0.3, 0.3, 0.1, 0.1, 0.1, 0.1], 5, concentration=0.3),
        # Four i.i.d. siblings of a q concentrated on token 0, which p rarely emits.
        "tree-duplicate-siblings-counted-twice": functools.partial(
            _tree_case, "tree-iid-repeats-v4", (0, 0, 0, 0), "iid", [0.2, 0.2, 0.3, 0.3],
            [0.8, 0.1, 0.05, 0.05], 6),
        # Top-k trees of a flat-ish p: Medusa keeps every token above its small threshold.
        "tree-medusa-typical-acceptance": functools.partial(
            _tree_case, "tree-topk-medusa-v8", (0, 0, 1, 1, 2), "top-k",
            [0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05],
            [0.25, 0.25, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05], 7, concentration=1.0),
        # p has a token of probability 0.55 that top-k drafting puts second.
        "tree-sglang-threshold-single": functools.partial(
            _tree_case, "tree-topk-single-v6", (0, 0, 1), "top-k",
            [0.3, 0.55, 0.05, 0.05, 0.03, 0.02], [0.5, 0.3, 0.05, 0.05, 0.05, 0.05], 8),
        "tree-sglang-threshold-acc": functools.partial(
            _tree_case, "tree-topk-acc-v6", (0, 0, 1), "top-k", [0.2, 0.2, 0.2, 0.2, 0.1, 0.1],
            [0.3, 0.3, 0.1, 0.1, 0.1, 0.1], 9),
        # A star of 3 i.i.d. drafts at V = 256 with Dirichlet(0.5) rows: the tokens outside p's
        # top 10 hold most of the residual's mass.
        "tree-residual-top-10-only": functools.partial(
            _tree_case, "tree-star3-v256-iid", (0, 0, 0), "iid", *_wide_root(19), 19),
        # A chain of depth 2 at V = 256 whose root and depth-1 rows put 0.8 on token 0 (p and
        # q), so the depth-2 node of token 0 is reached in about 60% of the trees; its row is
        # Dirichlet(0.5), most of whose mass lies outside its top 10.
        "tree-deep-nodes-top-10-only": _deep_chain_case,
        "tree-greedy-first-child-only": functools.partial(
            _greedy_tree_case, "tree-greedy-v8-first", (0, 0, 1, 2, 2), 10, repeat_first=False),
        "tree-greedy-highest-index-match": functools.partial(
            _greedy_tree_case, "tree-greedy-dup-v8-b", (0, 0, 1, 2, 2), 11),
        "tree-greedy-first-matching-path": functools.partial(
            _greedy_tree_case, "tree-greedy-v8-paths", (0, 0, 1, 2, 2), 14, repeat_first=False),
        "tree-greedy-final-from-parent": functools.partial(
            _greedy_tree_case, "tree-greedy-v8", (0, 0, 1, 2, 2), 12, repeat_first=False),
        # Controls: one per scheme at least.
        "tree-siblings-reversed": functools.partial(
            _tree_case, "tree-control-iid-v6", (0, 0, 0, 1, 1, 2), "iid",
            [0.3, 0.25, 0.2, 0.1, 0.1, 0.05], [0.1, 0.2, 0.3, 0.2, 0.1, 0.1], 13),
        "tree-exponential-race-final": functools.partial(
            _tree_case, "tree-control-wr-v6", (0, 0, 0, 1, 1, 2), "without-replacement",
            [0.3, 0.25, 0.2, 0.1, 0.1, 0.05], [0.1, 0.2, 0.3, 0.2, 0.1, 0.1], 14),
        "tree-log-space-acceptance": functools.partial(
            _tree_case, "tree-control-wr-v6-b", (0, 0, 1, 1, 2, 3), "without-replacement",
            [0.3, 0.3, 0.2, 0.1, 0.1, 0.0], [0.1, 0.2, 0.3, 0.2, 0.1, 0.1], 15),
        "tree-sample-and-match": functools.partial(
            _tree_case, "tree-control-topk-v6", (0, 0, 0, 1, 1, 2), "top-k",
            [0.3, 0.25, 0.2, 0.1, 0.1, 0.05], [0.1, 0.2, 0.3, 0.2, 0.1, 0.1], 16),
        # V = 8 <= 10: the fast path is taken at every final draw here (the battery's V = 1024
        # cases take the dense path).
        "tree-exact-top-k-fast-path": functools.partial(
            _tree_case, "tree-control-wr-v8", (0, 0, 0, 1, 1, 2), "without-replacement",
            [0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05],
            [0.1, 0.2, 0.3, 0.1, 0.1, 0.1, 0.05, 0.05], 20),
        "tree-one-coin-cumulative": functools.partial(
            _tree_case, "tree-control-iid-v4", (0, 0, 0, 1), "iid", [0.2, 0.2, 0.3, 0.3],
            [0.8, 0.1, 0.05, 0.05], 17),
        "tree-greedy-path-marking": functools.partial(
            _greedy_tree_case, "tree-greedy-control-v8", (0, 0, 1, 2, 2), 18),
    }
    return cases


def _specs() -> tuple[Mutant, ...]:
    cases = _case_builders()
    table: list[tuple[str, TreeVerifier | GreedyTreeVerifier, bool, bool, str, str]] = [
        ("tree-iid-siblings-against-p", iid_siblings_against_p, False, True,
         "each sibling tested against the original p, no running residual", SPECINFER_SOURCE),
        ("tree-replacement-rule-on-distinct-drafts", replacement_rule_on_distinct_drafts, False,
         True, "drafts without replacement verified with the i.i.d. rule (q never updated)",
         MCSD_SOURCE),
        ("tree-distinct-rule-on-replacement-drafts", distinct_rule_on_replacement_drafts, False,
         True, "i.i.d. drafts verified with the without-replacement rule (divides by q')",
         MCSD_SOURCE),
        ("tree-final-from-root-row", final_from_root_row, False, True,
         "final token drawn from the root's target row, not the last accepted node's",
         SGLANG_SOURCE),
        ("tree-final-from-parent-row", final_from_parent_row, False, True,
         "final token drawn from the last accepted node's parent's row", SGLANG_SOURCE),
        ("tree-duplicate-siblings-counted-twice", duplicate_siblings_counted_twice, False, True,
         "one-coin cumulative rule adds a repeated sibling token's p twice", SGLANG_SOURCE),
        ("tree-medusa-typical-acceptance", medusa_typical_acceptance, False, True,
         "accept iff p(x) > min(0.09, 0.3 exp(-H(p))); deepest plausible path", MEDUSA_SOURCE),
        ("tree-sglang-threshold-single", sglang_threshold_single, False, True,
         "threshold_single = 0.5: any sibling with p(x) >= 0.5 accepted", SGLANG_SOURCE),
        ("tree-sglang-threshold-acc", sglang_threshold_acc, False, True,
         "threshold_acc = 0.5: coin <= prob_acc / 0.5 doubles acceptance", SGLANG_SOURCE),
        ("tree-residual-top-10-only", residual_top_10_only, False, True,
         "final token sampled among p's top 10 only (sparse top-k fast path)",
         FLASHINFER_SAMPLING_SOURCE),
        ("tree-deep-nodes-top-10-only", deep_nodes_top_10_only, False, True,
         "target law cut to its top 10 at nodes of depth >= 2 (sparse top-k past the root)",
         FLASHINFER_SAMPLING_SOURCE),
        ("tree-greedy-first-matching-path", greedy_first_matching_path, True, True,
         "longest match's length, first matching path's tokens", EAGLE_SOURCE),
        ("tree-greedy-final-from-parent", greedy_final_from_parent, True, True,
         "final token is the argmax of the last accepted node's parent", SGLANG_GREEDY_SOURCE),
        ("tree-greedy-first-child-only", greedy_first_child_only, True, False,
         "only each node's first child compared: greedy tokens, fewer accepted (SUBOPTIMAL)",
         EAGLE_SOURCE),
        ("tree-greedy-highest-index-match", greedy_highest_index_match, True, False,
         "highest-index duplicate child followed: either duplicate continues greedy decoding",
         SGLANG_GREEDY_SOURCE),
        ("tree-siblings-reversed", siblings_reversed, False, False,
         "iid/top-k siblings tried last to first: exchangeable, still exact", SPECINFER_SOURCE),
        ("tree-exponential-race-final", exponential_race_final, False, False,
         "final token by exponential race argmin E / r: exact sample of norm(r)",
         VLLM_SAMPLER_SOURCE),
        ("tree-log-space-acceptance", log_space_acceptance, False, False,
         "log u < log r(x) - log q'(x): the same test in log space", MCSD_SOURCE),
        ("tree-sample-and-match", sample_and_match, False, False,
         "x ~ p per level, follow the child with token x: lossless for every scheme",
         EAGLE_SOURCE),
        ("tree-exact-top-k-fast-path", exact_top_k_fast_path, False, False,
         "top-10 fast path only where the residual's support fits in it: exact",
         FLASHINFER_SAMPLING_SOURCE),
        ("tree-one-coin-cumulative", one_coin_cumulative, False, False,
         "SGLang's rule at thresholds 1 with repeated tokens skipped: inverse CDF of p",
         SGLANG_SOURCE),
        ("tree-greedy-path-marking", greedy_path_marking, True, False,
         "greedy path marked node by node in index order: same output as the walk",
         SGLANG_GREEDY_SOURCE),
    ]
    return tuple(
        Mutant(name, verifier, "greedy-tree" if greedy else "tree", lossy, mechanism, source,
               cases[name])
        for name, verifier, greedy, lossy, mechanism, source in table
    )


TREE_ZOO: tuple[Mutant, ...] = _specs()
"""Every tree mutant and control with its case (built on first use): the lossy ones first."""
