"""The chain and greedy mutants of the zoo: verifiers that reproduce the mechanisms of real,
publicly reported bugs.

Each mutant is the reference algorithm (Leviathan et al. 2022, Alg. 1) with the one mechanism
of a shipped bug put back, in the chain protocol (or the greedy protocol) of
:mod:`losslessness.protocol`, so that the audit's power can be measured against failures that
happened in practice rather than invented ones. Where the bug lived in the plumbing around
the verifier (how the draft was chosen, which temperature the target used, padded lanes), the
mutant reproduces it inside the protocol: it re-chooses the draft itself, recovers logits as
``log p`` and re-processes them, or pads internally; each docstring says how the protocol-level
mutant maps onto the shipped bug. The lossless controls are correct algorithms that differ from
the reference (a different sampler, log-space arithmetic, an unnormalised residual, or the
lossless-but-suboptimal sample-and-match rule): the audit must pass them.

All mutants are vectorised over the batch (no Python loop over rows), validate their inputs
like the reference (:class:`~losslessness.protocol.InvalidInputError`), compute in float64
unless the bug is about precision, and take all randomness from the ``generator`` argument,
so they are deterministic given it. :data:`CHAIN_ZOO` lists them with the deterministic case
on which each mechanism acts (:data:`PRECISION_ZOO` the precision mutants of issue 13);
:mod:`losslessness.zoo.registry` joins them with the tree zoo. ``losslessness audit
mutant/<name>`` audits one; ``losslessness list`` lists them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch

from losslessness.batteries.builders import dirichlet_rows, probs_tensor
from losslessness.cases import ChainCase, GreedyCase
from losslessness.laws import residual_distribution
from losslessness.protocol import (
    ChainVerifier,
    GreedyVerifier,
    validate_chain_inputs,
    validate_greedy_inputs,
)
from losslessness.reference import (
    accepted_lengths,
    argmax_lowest_index,
    block_decisions,
    emitted_tokens,
    sample_inverse_cdf,
    verify_block,
    verify_with_uniforms,
)
from losslessness.reference.block import BLOCK_VERIFICATION, VERIFICATION_ATTRIBUTE
from losslessness.zoo.entry import Mutant
from losslessness.zoo.steps import draw_uniforms, normalised

CASE_SEED = 20240117
"""Seed of the construction of every mutant's own case (deterministic on every machine)."""

ResidualLaw = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``(p_final [B, V], q_final [B, V], rejected_draft [B]) -> law [B, V]`` after a rejection."""


# ------------------------------------------------------------------------------ chain steps


def _gather(rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``rows[b, i, ids[b, i]]`` for ``rows [B, k', V]`` (k' >= k) and ``ids [B, k]``."""
    k = ids.shape[1]
    return rows[:, :k].gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def _standard_residual(p: torch.Tensor, q: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    return residual_distribution(p, q)


def _finish(
    p: torch.Tensor,
    q: torch.Tensor,
    ids: torch.Tensor,
    accepted: torch.Tensor,
    sample_uniforms: torch.Tensor,
    residual: ResidualLaw = _standard_residual,
) -> torch.Tensor:
    """Emit the leading accepted drafts and one final token (the correction after the first
    rejection, drawn from ``residual``, or the bonus from p_k), by inverse CDF.

    Args:
        p: ``[B, k+1, V]`` float64 target rows. q: ``[B, k, V]`` float64 draft rows.
        ids: ``[B, k]`` int64 drafts. accepted: ``[B, k]`` bool decisions.
        sample_uniforms: ``[B]`` float64 in [0, 1).
        residual: the law sampled after a rejection.

    Returns:
        ``[B, k+1]`` int64 in the protocol's layout.
    """
    batch, k = ids.shape
    n_accepted = accepted_lengths(accepted)
    rows = torch.arange(batch)
    law = p[rows, n_accepted]
    if k > 0:
        at = n_accepted.clamp(max=k - 1)
        rejected_law = residual(law, q[rows, at], ids[rows, at])
        law = torch.where((n_accepted < k).unsqueeze(1), rejected_law, law)
    return emitted_tokens(ids, n_accepted, sample_inverse_cdf(law, sample_uniforms))


def _standard_accept(
    p: torch.Tensor, q: torch.Tensor, ids: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """``u < p(d) / q(d)`` (strict, so p(d) = 0 is never accepted)."""
    return uniforms < _gather(p, ids) / _gather(q, ids)


def _prepare(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate a chain call; return normalised float64 p, q and int64 drafts (CPU)."""
    validate_chain_inputs(target_probs, draft_probs, draft_token_ids, generator)
    return (
        normalised(target_probs.cpu()),
        normalised(draft_probs.cpu()),
        draft_token_ids.cpu().to(torch.int64),
    )


# ----------------------------------------------------------------------------- lossy: chain


def residual_clamped_1e5(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: the residual is ``clamp(p - q, min=1e-5)``, normalised, instead of
    ``max(0, p - q)``, so every token, including those with p = 0, gets residual mass.

    Source: vLLM PR 13933 (V1 random sampling for spec decode), whose first version computed
    ``bonus_prob = torch.clamp(target_probs[:, :-1, :] - draft_probs, min=1e-5)``; review
    asked for a smaller floor and it shipped as ``finfo(float32).tiny``
    (https://github.com/vllm-project/vllm/pull/13933). The protocol-level mutant is that line
    as first written. It emits tokens with p = 0 after rejections (caught exactly where the
    target has zeros) and inflates the tail of the residual by ``V * 1e-5``.
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape

    def clamped(p_row: torch.Tensor, q_row: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
        floored = (p_row - q_row).clamp(min=1e-5)
        return floored / floored.sum(dim=-1, keepdim=True)

    accepted = _standard_accept(p, q, ids, draw_uniforms(generator, batch, k))
    return _finish(p, q, ids, accepted, draw_uniforms(generator, batch), clamped)


def uniform_includes_zero(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: the verification coin can be exactly 0 and the test is inclusive
    (``u <= p(d) / q(d)``), so a draft with p(d) = 0 is accepted whenever u == 0.

    Source: SGLang issue 35771, "Target-only speculative sampler can accept a zero-probability
    draft at RNG boundary": coins from ``torch.rand`` (range includes 0) tested with
    ``coin <= prob_acc / threshold_acc`` (https://github.com/sgl-project/sglang/issues/35771);
    the issue text of this project also names vLLM PR 23803 for the same mechanism. The
    protocol-level mutant draws its coins as ``torch.rand(dtype=torch.bfloat16)``, uniforms in
    the model's dtype, where P(u == 0) is about 2e-3 rather than float32's 2^-24: the same
    mechanism at a rate an audit can see (a draft the target forbids, such as a token its
    top-p removed, is accepted about once in 500 tries).
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    coins = torch.rand((batch, k), generator=generator, dtype=torch.bfloat16)
    accepted = coins.to(torch.float64) <= _gather(p, ids) / _gather(q, ids)
    return _finish(p, q, ids, accepted, draw_uniforms(generator, batch))


def uniform_hard_coded_zero(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: the acceptance coin is the constant ``u = 0``, so the log-space test
    ``log p(d) > log(u) + log q(d)`` is true for every draft with p(d) > 0.

    Source: vllm-ascend issue 13730, "v2 rejection sampler always accepts draft tokens for
    non-greedy sampling on NPU": ``u = tl.full([], 0.0)`` because NPU Triton lacks
    ``tl_rand64`` (https://github.com/vllm-project/vllm-ascend/issues/13730). Reproduced
    exactly: ``log(0) = -inf`` accepts every draft the target allows, and still rejects drafts
    with p(d) = 0 (``-inf > -inf`` is false), whose correction then comes from the residual.
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, _ = ids.shape
    accepted = _gather(p, ids) > 0
    return _finish(p, q, ids, accepted, draw_uniforms(generator, batch))


def residual_zeroes_rejected_token(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: after rejecting d, samples from p with p(d) set to 0 and renormalised, instead
    of from norm(max(0, p - q)).

    Source: EAGLE issue 20, "Is the rejection and adjusting probability implementation
    different from normal speculative sampling?"; the maintainers confirmed that the two
    distributions should be subtracted rather than only the rejected element adjusted
    (https://github.com/SafeAILab/EAGLE/issues/20). That rule is correct only for a one-hot q
    (a greedy drafter); with a sampled q it over-emits the tokens q also proposes. Exact for
    V = 2, where both rules emit the other token.
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape

    def without_rejected(
        p_row: torch.Tensor, _: torch.Tensor, rejected: torch.Tensor
    ) -> torch.Tensor:
        masked = p_row.scatter(1, rejected.unsqueeze(1), 0.0)
        total = masked.sum(dim=-1, keepdim=True)
        # A row whose only mass was on the rejected token is never rejected (p(d)/q(d) >= 1).
        return torch.where(total > 0, masked / total.clamp(min=1e-300), p_row)

    accepted = _standard_accept(p, q, ids, draw_uniforms(generator, batch, k))
    return _finish(p, q, ids, accepted, draw_uniforms(generator, batch), without_rejected)


NAN_ROW_TOKEN_OFFSET = 0
"""A residual row of NaN (0/0) is sampled as id ``V + NAN_ROW_TOKEN_OFFSET``: the first padded
vocabulary lane, which is what a Triton argmax over NaN lanes returns (vLLM PR 21876)."""


def residual_nan_when_p_equals_q(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: the residual is normalised without a guard, so where p == q it is 0/0 = NaN,
    and a rejection there emits garbage (an id outside the vocabulary).

    Source: jaymody/speculative-sampling issue 5, "Adjusting distribution can result in NaNs
    if q[i] == p[i]" (https://github.com/jaymody/speculative-sampling/issues/5). A rejection at
    p == q needs a coin that can equal 1 under a strict test: the mutant draws
    ``u = 1 - torch.rand(dtype=torch.bfloat16)`` in (0, 1] (the "exclude 0" trick that
    vllm-ascend PR 13766 uses) and accepts iff ``u < p(d) / q(d)``, so at p == q about one
    draft in 500 is rejected and meets the all-zero residual. The NaN row is sampled as the
    first padded vocabulary lane, id V, as vLLM PR 21876 reports for NaN rows
    (https://github.com/vllm-project/vllm/pull/21876). With float32 coins the same path fires
    about once in 2^24 rejections at p == q.
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    vocab = p.shape[-1]
    coins = 1.0 - torch.rand((batch, k), generator=generator, dtype=torch.bfloat16).to(
        torch.float64
    )
    accepted = coins < _gather(p, ids) / _gather(q, ids)
    n_accepted = accepted_lengths(accepted)
    rows = torch.arange(batch)
    law = p[rows, n_accepted]
    nan_row = torch.zeros(batch, dtype=torch.bool)
    if k > 0:
        excess = (law - q[rows, n_accepted.clamp(max=k - 1)]).clamp(min=0.0)
        total = excess.sum(dim=-1, keepdim=True)
        rejected = n_accepted < k
        nan_row = rejected & (total.squeeze(1) <= 0)
        law = torch.where((rejected & ~nan_row).unsqueeze(1), excess / total.clamp(min=1e-300), law)
    final = sample_inverse_cdf(law, draw_uniforms(generator, batch))
    final = torch.where(nan_row, vocab + NAN_ROW_TOKEN_OFFSET, final)
    return emitted_tokens(ids, n_accepted, final)


def draft_chosen_greedily(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: the draft is argmax q (greedy drafter) while the acceptance ratio uses q, the
    drafter's softmax, as if the draft had been sampled from it.

    Source: transformers issue 32867, "Speculative sampling does not maintain probability
    distribution of main model": the assistant model always decoded greedily while
    ``_speculative_sampling`` divided by its softmax
    (https://github.com/huggingface/transformers/issues/32867; fixed in PR 33534). The
    protocol-level mutant ignores the caller's d ~ q and re-chooses d = argmax q (lowest index
    on ties), then verifies it with the standard rule.
    """
    p, q, _ = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = draft_token_ids.shape
    ids = argmax_lowest_index(q)
    accepted = _standard_accept(p, q, ids, draw_uniforms(generator, batch, k))
    return _finish(p, q, ids, accepted, draw_uniforms(generator, batch))


DRAFT_TOP_K = 3
"""Top-k of the drafter's logits processor in :func:`draft_from_top_k_logits` (the issue's
reproduction used ``top_k=3``)."""


def draft_from_top_k_logits(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: the draft is sampled from the top-k-processed draft logits while the
    acceptance ratio and the residual use the raw softmax q.

    Source: transformers issue 47932, "Speculative decoding: candidate generators return a
    ``q`` they did not sample from" (https://github.com/huggingface/transformers/issues/47932):
    tokens drawn from processor-applied logits, ``q`` returned from the raw ones, so p/q is
    inflated by 1/Z and the residual is built from mass the drafter never proposes. The
    protocol-level mutant ignores the caller's d ~ q and re-draws d from q restricted to its
    ``DRAFT_TOP_K`` largest entries, renormalised, with uniforms from ``generator``.
    """
    p, q, _ = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = draft_token_ids.shape
    top = min(DRAFT_TOP_K, q.shape[-1])
    kth = q.topk(top, dim=-1).values[..., -1:]
    processed = torch.where(q >= kth, q, 0.0)
    draws = draw_uniforms(generator, batch * k)
    ids = sample_inverse_cdf(processed.reshape(batch * k, -1), draws).reshape(batch, k)
    accepted = _standard_accept(p, q, ids, draw_uniforms(generator, batch, k))
    return _finish(p, q, ids, accepted, draw_uniforms(generator, batch))


REQUEST_TEMPERATURE = 0.7
"""The request's sampling temperature assumed by :func:`target_with_default_temperature`."""


def target_with_default_temperature(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: the target distribution is computed with the default temperature 1.0 while the
    draft (and the law the user asked for) used the request's temperature.

    Source: vLLM issue 9834, fixed by PR 10198 "apply sampling parameters to target
    probabilities for consistency in rejection sampling": the batch-expansion scorer built
    target probabilities with default sampling parameters (temperature 1.0, top_p 1.0)
    (https://github.com/vllm-project/vllm/pull/10198). The protocol's p is the processed
    target law ``softmax(z / T)``; the mutant recovers the logits as ``T log p`` and verifies
    against ``softmax(z) = norm(p^T)`` with T = :data:`REQUEST_TEMPERATURE` (tokens with p = 0
    stay at 0, since their logits cannot be recovered). Its output follows norm(p^T), not p.
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    untempered = normalised(p.pow(REQUEST_TEMPERATURE))
    accepted = _standard_accept(untempered, q, ids, draw_uniforms(generator, batch, k))
    return _finish(untempered, q, ids, accepted, draw_uniforms(generator, batch))


def replacement_from_next_row(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: after rejecting d_i, the replacement token is drawn from the target's next
    logit row (p_{i+1}, the position after the rejected one) instead of the residual at i.

    Source: openvino.genai issue 4190, "Speculative decoding + non-greedy sampling: crash and
    silent output corruption from a one-iteration-late rejection handler": the correct sample
    is discarded and the next iteration draws from the logit row for the position after the
    rejected one (https://github.com/openvinotoolkit/openvino.genai/issues/4190). The
    protocol-level mutant emits, at the first rejection i, a token from p_{i+1} (the bonus row
    p_k when i = k-1).
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    accepted = _standard_accept(p, q, ids, draw_uniforms(generator, batch, k))
    n_accepted = accepted_lengths(accepted)
    rows = torch.arange(batch)
    law = p[rows, (n_accepted + 1).clamp(max=k)]
    law = torch.where((n_accepted < k).unsqueeze(1), law, p[rows, n_accepted])
    final = sample_inverse_cdf(law, draw_uniforms(generator, batch))
    return emitted_tokens(ids, n_accepted, final)


VOCAB_PAD_MULTIPLE = 64
"""The LM head's vocabulary is padded to a multiple of this (as vLLM pads ``padded_vocab``)."""

TARGET_LOGSUMEXP = 10.0
"""Scale of the recovered target logits in :func:`padded_vocab_not_truncated`: their
log-sum-exp, so that a padded lane with logit 0 weighs ``e^-10`` against the whole row."""


def padded_vocab_not_truncated(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: the target's vocabulary padding is not truncated, so padded lanes (ids >= V)
    keep probability mass and can be emitted.

    Source: vLLM security advisory GHSA-8wr5-jm2h-8r4f (out-of-vocabulary ids from speculative
    decoding, https://github.com/vllm-project/vllm/security/advisories/GHSA-8wr5-jm2h-8r4f) and
    vLLM PR 7218, "Fix speculative decoding with MLPSpeculator with padded vocabulary": the
    truncation of the padding operated on the wrong dimension, so the vocab dimension was not
    truncated and ``rejection_sampling.py`` went out of bounds
    (https://github.com/vllm-project/vllm/pull/7218). The protocol-level mutant recovers the
    target logits as ``log p`` (shifted to a log-sum-exp of :data:`TARGET_LOGSUMEXP`), pads
    them to a multiple of :data:`VOCAB_PAD_MULTIPLE` with logit 0 (zero-initialised LM-head
    rows), and verifies with the softmax over the padded vocabulary; the draft is padded with
    zeros. Corrections and bonus tokens then land on ids >= V about 0.3% of the time when V is
    not a multiple of 64.
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    vocab = p.shape[-1]
    padded = -(-vocab // VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE
    logits = torch.zeros((*p.shape[:-1], padded), dtype=torch.float64)
    logits[..., :vocab] = p.log() + TARGET_LOGSUMEXP
    p_padded = torch.softmax(logits, dim=-1)
    q_padded = torch.zeros((*q.shape[:-1], padded), dtype=torch.float64)
    q_padded[..., :vocab] = q
    accepted = _standard_accept(p_padded, q_padded, ids, draw_uniforms(generator, batch, k))
    return _finish(p_padded, q_padded, ids, accepted, draw_uniforms(generator, batch))


PADDED_DRAFT_ID = -1
"""The id an engine pads a short draft with (FlashInfer, vLLM, SGLang)."""


def padded_draft_id_used_as_index(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: a padded draft id -1 is used as an index (reading the last vocabulary entry)
    and can be "accepted", leaving a -1 inside the emitted tokens.

    Source: FlashInfer issue 879, "Possible Bug in chain_speculative_sampling:
    output_emitted_token_num Exceeds Expected Limit": drafts padded with -1 and zero draft-prob
    rows; the kernel indexed with -1 and accepted it (fixed by FlashInfer PR 3551)
    (https://github.com/flashinfer-ai/flashinfer/issues/879). The protocol-level mutant plays
    an engine whose proposer returned k-1 tokens for a kernel of fixed width k: the last slot
    holds -1 and a zero draft row. The kernel's test ``u * q[-1] < p[-1]`` (FlashInfer's form)
    reads token V-1 and accepts the padded slot whenever p_{k-1}(V-1) > 0, writes -1 there and
    then the bonus from p_k after it: a token after a placeholder. When p_{k-1}(V-1) = 0 the
    slot is rejected and the correction comes from norm(max(0, p_{k-1} - 0)) = p_{k-1}.
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    if k == 0:
        return _finish(
            p, q, ids, torch.zeros((batch, 0), dtype=torch.bool), draw_uniforms(generator, batch)
        )
    kernel_ids = ids.clone()
    kernel_ids[:, -1] = PADDED_DRAFT_ID
    kernel_q = q.clone()
    kernel_q[:, -1] = 0.0
    # Negative indices wrap, as the kernel's unchecked pointer arithmetic reads token V-1.
    wrapped = kernel_ids % p.shape[-1]
    u = draw_uniforms(generator, batch, k)
    accepted = u * _gather(kernel_q, wrapped) < _gather(p, wrapped)
    n_accepted = accepted_lengths(accepted)
    rows = torch.arange(batch)
    law = p[rows, n_accepted]
    if k > 0:
        correction = residual_distribution(law, kernel_q[rows, n_accepted.clamp(max=k - 1)])
        law = torch.where((n_accepted < k).unsqueeze(1), correction, law)
    final = sample_inverse_cdf(law, draw_uniforms(generator, batch))
    return emitted_tokens(kernel_ids, n_accepted, final)


def shared_random_stream(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY (independence): every request of the batch reads the same random stream, so
    identical rows of one batch give identical (perfectly dependent) outputs, although each
    row alone follows p exactly.

    Source: TensorRT-LLM issue 19487, "Speculative decoding + TorchSampler: unseeded requests
    share one RNG stream -> identical/degenerate samples at low concurrency"
    (https://github.com/NVIDIA/TensorRT-LLM/issues/19487). The protocol-level mutant draws one
    seed from ``generator`` per call and seeds the same sub-generator for every row: each row
    gets the same accept and sampling uniforms (drawn once and broadcast, which is what
    seeding every row's generator with that seed gives), then runs the reference.
    """
    batch, k, _ = validate_chain_inputs(target_probs, draft_probs, draft_token_ids, generator)
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    stream = torch.Generator().manual_seed(seed)
    accept = draw_uniforms(stream, 1, k).expand(batch, k).contiguous()
    sample = draw_uniforms(stream, 1).expand(batch).contiguous()
    return verify_with_uniforms(
        target_probs,
        draft_probs,
        draft_token_ids,
        accept.to(target_probs.device),
        sample.to(target_probs.device),
    )


SMALL_BATCH = 16
"""Batches below this many rows take :func:`small_batch_correction_from_target`'s path."""


def _correction_from_target(p: torch.Tensor, q: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    return p


def small_batch_correction_from_target(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY only when the batch has fewer than :data:`SMALL_BATCH` rows: that path samples
    the correction after a rejection from p_i instead of norm(max(0, p_i - q_i)); batches of
    16 rows and more run the reference.

    Source: batch-size-dispatched paths of serving engines, e.g. CUDA graphs captured for a
    few padded batch sizes, whose padded-batch path diverged from the real batch in
    vllm-ascend PR 13470 (https://github.com/vllm-project/vllm-ascend/pull/13470). The
    protocol-level mutant puts a small-batch branch with its own correction law in the
    verifier; every call of the audit before issue 21 had B >= 32, so it passed.
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    accepted = _standard_accept(p, q, ids, draw_uniforms(generator, batch, k))
    residual = _correction_from_target if batch < SMALL_BATCH else _standard_residual
    return _finish(p, q, ids, accepted, draw_uniforms(generator, batch), residual)


def _unnormalised_residual_cdf(p: torch.Tensor, q: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
    """The law of comparing the uniform with the *unnormalised* cumulative sum of
    max(0, p - q): the mass ``1 - sum max(0, p - q)`` it misses falls on the last token (the
    search clamps to the last index)."""
    residual = (p - q).clamp(min=0.0)
    residual[..., -1] += 1.0 - residual.sum(dim=-1)
    return residual


def float32_residual_unnormalised(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY only for float32 inputs: the float32 instantiation of the correction sampler
    compares the uniform with the unnormalised cumulative residual, so the missing mass goes
    to the last token; float64 (and bfloat16) inputs take the reference path.

    Source: dtype-dispatched sampler kernels with a bug in one instantiation only, e.g.
    FlashInfer PR 221, "fix sampler's implementation bug when dtype is not float32"
    (https://github.com/flashinfer-ai/flashinfer/pull/221). Every call of the audit before
    issue 21 passed float64 inputs, so it passed.
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    accepted = _standard_accept(p, q, ids, draw_uniforms(generator, batch, k))
    float32 = target_probs.dtype == torch.float32
    residual = _unnormalised_residual_cdf if float32 else _standard_residual
    return _finish(p, q, ids, accepted, draw_uniforms(generator, batch), residual)


def _row_keys(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``[B]`` float64 content keys of the rows (a fixed random projection of p and q), equal
    for equal rows: how a verifier that shares work between duplicate rows groups them."""
    flat = torch.cat([p.reshape(p.shape[0], -1), q.reshape(q.shape[0], -1)], dim=1)
    weights = torch.rand(flat.shape[1], generator=torch.Generator().manual_seed(0),
                         dtype=torch.float64)
    return flat @ weights


def _distinct_rows_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
    restore_order: bool,
) -> torch.Tensor:
    """The reference on rows regrouped by content (sorted by :func:`_row_keys`); the batch's
    own order is restored unless ``restore_order`` is False and every row is distinct."""
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    order = torch.argsort(_row_keys(p, q), stable=True)
    distinct = int(torch.unique(_row_keys(p, q)).numel()) == batch
    if distinct and not restore_order:
        # The no-duplicates shortcut reads p and q in the grouped order, the drafts in the
        # batch's: row b is verified against another row's laws.
        p, q = p[order], q[order]
    accepted = _standard_accept(p, q, ids, draw_uniforms(generator, batch, k))
    return _finish(p, q, ids, accepted, draw_uniforms(generator, batch))


def distinct_rows_index_mixup(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY only when the rows of a call are all distinct: the verifier groups duplicate rows
    to share their work, and when there is no duplicate its shortcut reads p and q in the
    grouped (sorted) order while the drafts stay in the batch's order, a batch-index mix-up.
    With duplicates, or rows that are all alike, the right row is read.

    Source: rows indexed through the map of another order, TensorRT-LLM PR 12588 (review:
    ``logits`` dense in gathered order while ``last_tokens_idx`` points into the pre-gather
    order, "it can index the wrong rows";
    https://github.com/NVIDIA/TensorRT-LLM/pull/12588). Every call of the audit before issue
    21 held copies of at most three row types, so it passed.
    """
    return _distinct_rows_verify(
        target_probs, draft_probs, draft_token_ids, generator, restore_order=False
    )


def distinct_rows_grouped_exact(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """Lossless control of :func:`distinct_rows_index_mixup`: the same grouping of rows by
    content, the batch's order kept on every path (the exact variant of the shortcut).

    Source: the mechanism of TensorRT-LLM PR 12588's fix, every row read in one order
    (https://github.com/NVIDIA/TensorRT-LLM/pull/12588).
    """
    return _distinct_rows_verify(
        target_probs, draft_probs, draft_token_ids, generator, restore_order=True
    )


DRAFT_TEMPERATURE = 0.6
"""Draft sampling temperature in :func:`draft_sampled_in_bfloat16`."""

DRAFT_MAX_LOGIT = 24.0
"""Largest raw draft logit in :func:`draft_sampled_in_bfloat16` (LM logits typically reach
15-30; bfloat16 spacing there is 0.125)."""


def draft_sampled_in_bfloat16(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: the draft is sampled from bfloat16 logits while the acceptance ratio and the
    residual use the float32 draft distribution.

    Source: DeepSpec issue 31, "Draft sampling uses a different distribution than speculative
    rejection": ``sample_tokens`` sampled through the native-dtype (bfloat16) logits while
    rejection used the float32 ``logits_to_probs`` distribution
    (https://github.com/deepseek-ai/DeepSpec/issues/31). The protocol-level mutant recovers the
    raw draft logits ``z = T log q + c`` (temperature T = :data:`DRAFT_TEMPERATURE`, shifted so
    that the largest is :data:`DRAFT_MAX_LOGIT`), rounds them to bfloat16, divides by T in
    bfloat16, re-draws d from that softmax (ignoring the caller's d ~ q), and verifies it
    against q.
    """
    p, q, _ = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = draft_token_ids.shape
    log_q = q.log()
    logits = DRAFT_TEMPERATURE * (log_q - log_q.amax(dim=-1, keepdim=True)) + DRAFT_MAX_LOGIT
    rounded = logits.to(torch.bfloat16) / torch.tensor(DRAFT_TEMPERATURE, dtype=torch.bfloat16)
    sampled_law = torch.softmax(rounded.to(torch.float64), dim=-1)
    draws = draw_uniforms(generator, batch * k)
    ids = sample_inverse_cdf(sampled_law.reshape(batch * k, -1), draws).reshape(batch, k)
    accepted = _standard_accept(p, q, ids, draw_uniforms(generator, batch, k))
    return _finish(p, q, ids, accepted, draw_uniforms(generator, batch))


FLOAT16_MAX_LOGIT = 20.0
"""Largest raw logit in :func:`laws_from_float16_logits` (float16 spacing is 2^-6 in [16, 32))."""

FLOAT16_OFFSET_MAX_LOGIT = 80.0
"""Largest raw logit in :func:`laws_from_offset_float16_logits`: logits carrying a large common
offset (softmax ignores it; float16 spacing is 2^-4 in [64, 128))."""


def _float16_law(probs: torch.Tensor, max_logit: float = FLOAT16_MAX_LOGIT) -> torch.Tensor:
    """The law a kernel sees when it stores the logits ``log probs + c`` (the largest
    ``max_logit``) in float16: rounded logits, softmax in float64 (zeros stay 0).

    Args:
        probs: ``[..., V]`` float64 rows. max_logit: the largest logit of each row.

    Returns:
        ``[..., V]`` float64 rows summing to 1.
    """
    log_probs = probs.log()
    logits = log_probs - log_probs.amax(dim=-1, keepdim=True) + max_logit
    return torch.softmax(logits.to(torch.float16).to(torch.float64), dim=-1)


def _verify_float16_laws(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
    max_logit: float,
) -> torch.Tensor:
    """The chain step of the float16 precision mutants (see :func:`laws_from_float16_logits`)."""
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    p_rounded = _float16_law(p, max_logit)
    q_rounded = _float16_law(q, max_logit)
    ratio = _gather(p_rounded, ids).to(torch.float16) / _gather(q_rounded, ids).to(torch.float16)
    accepted = draw_uniforms(generator, batch, k) < ratio.to(torch.float64)
    return _finish(p_rounded, q_rounded, ids, accepted, draw_uniforms(generator, batch))


def laws_from_float16_logits(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY (below the per-assertion reach): the ratio p(d) / q(d) is computed in float16
    from laws rebuilt from float16 logits, and the residual and bonus use those laws.

    Not from a bug report: the precision example of issue 13 (item 5), a deviation of a few
    thousandths of TV per position that each law test misses at its per-assertion level and
    the run-level uniformity test of the p-values (:mod:`losslessness.checks.pvalues`) is meant
    to catch. The mutant recovers logits ``log p + c`` and ``log q + c'`` (largest
    :data:`FLOAT16_MAX_LOGIT`, float16 spacing 2^-6 there, so each probability is off by up to
    about 0.8%), rounds them to float16, takes the softmax, divides the rounded p~(d) by q~(d)
    in float16, accepts on ``u < ratio`` (u float64) and draws the correction from
    norm(max(0, p~ - q~)) and the bonus from p~: the emitted law is about p~, not p (TV 0.001
    to 0.0026 at the first position of the battery's cases).
    """
    return _verify_float16_laws(
        target_probs, draft_probs, draft_token_ids, generator, FLOAT16_MAX_LOGIT
    )


def laws_from_offset_float16_logits(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY (below the per-assertion reach): :func:`laws_from_float16_logits` with logits that
    carry a large common offset (largest :data:`FLOAT16_OFFSET_MAX_LOGIT`, float16 spacing 2^-4,
    each probability off by up to about 3%): TV 0.004 to 0.013 at the first position of the
    battery's cases, around the 0.006 issue 13 (item 5) names for a ratio computed in float16.
    Synthetic, like its sibling.
    """
    return _verify_float16_laws(
        target_probs, draft_probs, draft_token_ids, generator, FLOAT16_OFFSET_MAX_LOGIT
    )


def match_count_accepts_all(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: the number of matches is computed with the negation applied to the cumulative
    sum of the accept mask rather than to the mask, ``(~is_accepted.cumsum(-1) < 1).sum()``;
    ``~n = -n - 1 < 1`` always, so every draft is kept and the bonus follows.

    Source: transformers PR 28508, "Fix ``_speculative_sampling`` implementation": "accepts the
    draft model tokens all the time due to faulty test of the number of matches (n_matches)"
    (https://github.com/huggingface/transformers/pull/28508). The accept coins are drawn as the
    original did, and ignored by the faulty count; drafts with p(d) = 0 are kept too.
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    is_accepted = _standard_accept(p, q, ids, draw_uniforms(generator, batch, k))
    faulty = ~is_accepted.to(torch.int64).cumsum(dim=-1) < 1
    return _finish(p, q, ids, faulty, draw_uniforms(generator, batch))


# ---------------------------------------------------------------------------- lossy: greedy


def _greedy_output(ids: torch.Tensor, best: torch.Tensor, n_accepted: torch.Tensor) -> torch.Tensor:
    return emitted_tokens(ids, n_accepted, best.gather(1, n_accepted.unsqueeze(1)).squeeze(1))


def greedy_ties_to_highest(
    target_logits: torch.Tensor, draft_token_ids: torch.Tensor
) -> torch.Tensor:
    """LOSSY (greedy protocol): ties at the maximum logit go to the highest index, while
    plain greedy decoding (``torch.argmax``) takes the lowest, so with tied logits speculative
    output diverges from greedy decoding.

    Source: ohdearquant/lattice issue 280, "speculative::argmax tie-break is last-wins;
    engine/sampling/HF greedy are first-wins" (https://github.com/ohdearquant/lattice/issues/280).
    """
    validate_greedy_inputs(target_logits, draft_token_ids)
    ids = draft_token_ids.to(torch.int64)
    vocab = target_logits.shape[-1]
    best = vocab - 1 - argmax_lowest_index(target_logits.flip(-1))
    k = ids.shape[1]
    return _greedy_output(ids, best, accepted_lengths(ids == best[:, :k]))


def greedy_no_bonus_token(
    target_logits: torch.Tensor, draft_token_ids: torch.Tensor
) -> torch.Tensor:
    """LOSSY (greedy protocol): when all k drafts match, the bonus argmax at position k is
    dropped, so the step emits k tokens instead of k+1 and differs from the reference step.

    Source: ohdearquant/lattice PR 509, "expose full-accept bonus token in mtp_verify_draft":
    the bonus token was exposed only when a draft was rejected
    (https://github.com/ohdearquant/lattice/pull/509). (For chain sampling the same drop is
    lossless but wasteful; the greedy protocol demands the reference step token for token.)
    """
    validate_greedy_inputs(target_logits, draft_token_ids)
    ids = draft_token_ids.to(torch.int64)
    best = argmax_lowest_index(target_logits)
    k = ids.shape[1]
    n_accepted = accepted_lengths(ids == best[:, :k])
    out = _greedy_output(ids, best, n_accepted)
    full = n_accepted == k
    if k > 0:
        out[full, k] = -1
    return out


def greedy_first_draft_unverified(
    target_logits: torch.Tensor, draft_token_ids: torch.Tensor
) -> torch.Tensor:
    """LOSSY (greedy protocol): the first draft is committed without comparing it with the
    target's argmax at its position; only later drafts are checked.

    Source: ohdearquant/lattice issue 243, "n-gram speculative decoding is lossy -
    verify_draft commits draft[0] unverified (diverges from greedy)"
    (https://github.com/ohdearquant/lattice/issues/243).
    """
    validate_greedy_inputs(target_logits, draft_token_ids)
    ids = draft_token_ids.to(torch.int64)
    best = argmax_lowest_index(target_logits)
    k = ids.shape[1]
    matches = ids == best[:, :k]
    if k > 0:
        matches[:, 0] = True
    return _greedy_output(ids, best, accepted_lengths(matches))


# ---------------------------------------------------------------------- lossless controls


def sample_and_match(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSLESS but SUBOPTIMAL: draws x_i ~ p_i and accepts d_i iff x_i == d_i, emitting x_i at
    the first mismatch. Every emitted token follows p exactly; the acceptance probability is
    sum p_i q_i <= sum min(p_i, q_i), so the audit must say SUBOPTIMAL, never LOSSY.

    Source: MLX-LM's exact-match verification, described in ml-explore/mlx-lm PR 1709 ("accepts
    a draft token only when it is bit-identical to the token the target model sampled")
    (https://github.com/ml-explore/mlx-lm/pull/1709).
    """
    p, _, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    draws = draw_uniforms(generator, batch, k + 1)
    flat = p.reshape(batch * (k + 1), -1)
    samples = sample_inverse_cdf(flat, draws.reshape(-1)).reshape(batch, k + 1)
    n_accepted = accepted_lengths(samples[:, :k] == ids)
    return emitted_tokens(ids, n_accepted, samples.gather(1, n_accepted.unsqueeze(1)).squeeze(1))


def gumbel_max_residual(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSLESS: draws the correction (and the bonus) by an exponential race,
    ``argmax_x r(x) / E_x`` with ``E_x ~ Exp(1)`` i.i.d., which is the Gumbel-max trick and
    samples exactly from norm(r) without normalising it.

    Source: vLLM's recovered-token sampler, which draws the correction as
    ``argmax(prob / q)`` with exponential ``q`` ("Recovery uses the same exponential-race",
    vLLM PR 41258, https://github.com/vllm-project/vllm/pull/41258).
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    accepted = _standard_accept(p, q, ids, draw_uniforms(generator, batch, k))
    n_accepted = accepted_lengths(accepted)
    rows = torch.arange(batch)
    law = p[rows, n_accepted]
    if k > 0:
        excess = (law - q[rows, n_accepted.clamp(max=k - 1)]).clamp(min=0.0)
        law = torch.where((n_accepted < k).unsqueeze(1), excess, law)
    # 1 - U lies in (0, 1], so the exponentials are finite and positive.
    exponentials = -torch.log1p(-draw_uniforms(generator, batch, p.shape[-1]))
    final = (law / exponentials).argmax(dim=-1)
    return emitted_tokens(ids, n_accepted, final)


def log_space_acceptance(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSLESS: accepts iff ``log u < log p(d) - log q(d)``, the ratio test in log space,
    with u in (0, 1) so ``log u`` is finite (``log p(d) = -inf`` is then always rejected).

    Source: the correct GPU baseline of vllm-ascend issue 13730: ``u = tl_rand32(seed, pos,
    includes_zero=False)`` tested as ``target_log_prob > log(u) + draft_log_prob``
    (https://github.com/vllm-project/vllm-ascend/issues/13730).
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    u = 1.0 - draw_uniforms(generator, batch, k)
    accepted = u.log() < _gather(p, ids).log() - _gather(q, ids).log()
    return _finish(p, q, ids, accepted, draw_uniforms(generator, batch))


def unnormalised_residual_multinomial(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSLESS: hands the unnormalised residual ``max(0, p - q)`` to ``torch.multinomial``,
    which normalises internally, so the correction still follows norm(max(0, p - q)).

    Source: vLLM PR 2336 review, "torch.multinomial does not require the probability to be
    normalized" (https://github.com/vllm-project/vllm/pull/2336).
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    accepted = _standard_accept(p, q, ids, draw_uniforms(generator, batch, k))
    n_accepted = accepted_lengths(accepted)
    rows = torch.arange(batch)
    weights = p[rows, n_accepted]
    if k > 0:
        excess = (weights - q[rows, n_accepted.clamp(max=k - 1)]).clamp(min=0.0)
        weights = torch.where((n_accepted < k).unsqueeze(1), excess, weights)
    if batch == 0:
        return emitted_tokens(ids, n_accepted, torch.zeros(0, dtype=torch.int64))
    final = torch.multinomial(weights, 1, generator=generator).squeeze(1)
    return emitted_tokens(ids, n_accepted, final)


def block_verification_wrong_residual(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """LOSSY: block verification's accepted prefix (Sun et al. 2024, Alg. 2) followed by the
    token-level residual ``norm(max(0, p_tau - q_tau))`` instead of the block residual
    ``norm(max(0, w_tau p_tau - q_tau))``. The two agree where ``w_tau = 1`` (always at
    ``tau = 0``), so the first position is right and the error shows after an accepted prefix
    whose weight fell below 1.

    Source: vllm-ascend issue 7807, "block_verify feature implementation in rejection sampling
    is not correct": ``sample_recovered_tokens`` drew the recovered token "from the same
    distribution, regardless of whether block_verify is enabled", fixed in PR 7808 by sampling
    the block residual (the paper's Eq. 4)
    (https://github.com/vllm-project/vllm-ascend/issues/7807). The protocol-level mutant keeps
    the corrected acceptance and only the residual bug.
    """
    p, q, ids = _prepare(target_probs, draft_probs, draft_token_ids, generator)
    batch, k = ids.shape
    accept_uniforms = draw_uniforms(generator, batch, k + 1)
    n_accepted, _ = block_decisions(p, q, ids, accept_uniforms)
    rows = torch.arange(batch)
    law = p[rows, n_accepted]
    if k > 0:
        token_residual = residual_distribution(law, q[rows, n_accepted.clamp(max=k - 1)])
        law = torch.where((n_accepted < k).unsqueeze(1), token_residual, law)
    return emitted_tokens(ids, n_accepted, sample_inverse_cdf(law, draw_uniforms(generator, batch)))


setattr(block_verification_wrong_residual, VERIFICATION_ATTRIBUTE, BLOCK_VERIFICATION)


# ------------------------------------------------------------------------------------ cases


def _chain_case(
    case_id: str, summary: str, target: np.ndarray, draft: np.ndarray, tags: set[str]
) -> ChainCase:
    """One row type: ``target [k+1, V]`` and ``draft [k, V]``, normalised, as a batch of one."""
    return ChainCase(
        case_id, summary, probs_tensor(target)[None], probs_tensor(draft)[None], frozenset(tags)
    )


def _dense_case(case_id: str, vocab: int, k: int, seed: int, near: float = 0.5) -> ChainCase:
    """Dense Dirichlet(1) target rows; draft rows ``(1 - near) p + near * Dirichlet(1)``."""
    rng = np.random.default_rng([CASE_SEED, seed])
    target = dirichlet_rows(rng, k + 1, vocab, 1.0)
    draft = (1 - near) * target[:k] + near * dirichlet_rows(rng, k, vocab, 1.0)
    return _chain_case(
        case_id, f"V={vocab} k={k} dense, q mixed {near:g} away from p", target, draft, {"dense"}
    )


def _truncated_target_case(case_id: str, vocab: int, k: int, seed: int) -> ChainCase:
    """Target rows with about half the vocabulary cut to 0 (top-p truncation) while the draft
    keeps mass everywhere: drafts with p(d) = 0 are common."""
    rng = np.random.default_rng([CASE_SEED, seed])
    target = dirichlet_rows(rng, k + 1, vocab, 1.0)
    cut = np.sort(target, axis=-1)[:, vocab // 2 : vocab // 2 + 1]
    target = np.where(target >= cut, target, 0.0)
    draft = dirichlet_rows(rng, k, vocab, 1.0)
    return _chain_case(
        case_id, f"V={vocab} k={k} top-p truncated target, dense draft", target, draft, {"zeros"}
    )


def _equal_rows_case(case_id: str, vocab: int, k: int, seed: int) -> ChainCase:
    """Draft rows equal to the target rows (a well-distilled drafter at low temperature)."""
    rng = np.random.default_rng([CASE_SEED, seed])
    target = dirichlet_rows(rng, k + 1, vocab, 1.0)
    return _chain_case(
        case_id, f"V={vocab} k={k} p == q", target, target[:k].copy(), {"p-equals-q"}
    )


def _block_residual_case(case_id: str) -> ChainCase:
    """V = 3, k = 2, built so that block verification often stops at position 1 with a small
    prefix weight: d_0 is usually token 0 (q_0 = 0.9, p_0 = 0.3, so w_1 = 1/3), and at
    position 1 the block residual ``max(w p_1 - q_1, 0)`` keeps only token 0 while the
    token-level ``max(p_1 - q_1, 0)`` also keeps token 2. The wrong residual's law at position
    1 is then 0.127 in TV from p_1 (exact, by enumeration), reached in 40% of steps."""
    target = np.array([[0.3, 0.6, 0.1], [0.5, 0.0, 0.5], [0.2, 0.3, 0.5]])
    draft = np.array([[0.9, 0.05, 0.05], [0.02, 0.78, 0.2]])
    return _chain_case(
        case_id, "V=3 k=2 draft undershooting the target's mode", target, draft, {"dense"}
    )


def _conditioned_case(
    case_id: str, vocab: int, k: int, seed: int, rows: int, call_batch_size: int | None,
    dtype: str,
) -> ChainCase:
    """``rows`` distinct dense row types (q mixed 0.5 away from p) called under call
    conditions: ``call_batch_size`` rows per call, inputs in ``dtype``."""
    rng = np.random.default_rng([CASE_SEED, seed])
    target = dirichlet_rows(rng, rows * (k + 1), vocab, 1.0).reshape(rows, k + 1, vocab)
    draft = 0.5 * target[:, :k] + 0.5 * dirichlet_rows(rng, rows * k, vocab, 1.0).reshape(
        rows, k, vocab
    )
    target_probs = torch.stack([probs_tensor(row) for row in target])
    draft_probs = torch.stack([probs_tensor(row) for row in draft])
    batch = "" if call_batch_size is None else f" B={call_batch_size}"
    summary = f"V={vocab} k={k} dense, {rows} distinct row types,{batch} {dtype}"
    return ChainCase(case_id, summary, target_probs, draft_probs, frozenset({"dense"}),
                     call_batch_size, dtype)


def _greedy_case(case_id: str, vocab: int, k: int, seed: int, ties: bool) -> GreedyCase:
    """Random (or integer, so tied) logits; drafts equal the lowest-index argmax w.p. 0.8."""
    rng = np.random.default_rng([CASE_SEED, seed])
    batch = 256
    if ties:
        logits = rng.integers(0, 3, size=(batch, k + 1, vocab)).astype(np.float64)
    else:
        logits = rng.standard_normal((batch, k + 1, vocab))
    argmax = np.argmax(logits, axis=-1)
    drafts = np.where(
        rng.random((batch, k)) < 0.8, argmax[:, :k], rng.integers(0, vocab, size=(batch, k))
    )
    regime = "tied" if ties else "random"
    return GreedyCase(
        case_id,
        f"V={vocab} k={k} {regime} logits, B={batch}",
        torch.from_numpy(logits),
        torch.from_numpy(drafts.astype(np.int64)),
        frozenset({"ties"} if ties else {"random"}),
    )


# ------------------------------------------------------------------------------------- zoo


def _entry(
    name: str,
    verifier: ChainVerifier | GreedyVerifier,
    *,
    greedy: bool = False,
    lossy: bool,
    mechanism: str,
    source: str,
    case: Callable[[], ChainCase | GreedyCase],
) -> Mutant:
    """A chain (or, with ``greedy``, a greedy) entry whose case ``case()`` builds on first use."""
    protocol = "greedy" if greedy else "chain"
    return Mutant(name, verifier, protocol, lossy, mechanism, source, case)


CHAIN_ZOO: tuple[Mutant, ...] = (
    _entry(
        "residual-clamped-1e-5",
        residual_clamped_1e5,
        lossy=True,
        mechanism="residual clamp(p - q, min=1e-5): tokens with p = 0 get residual mass",
        source="https://github.com/vllm-project/vllm/pull/13933",
        case=functools.partial(_truncated_target_case, "mutant-truncated-v64", 64, 2, 1),
    ),
    _entry(
        "uniform-includes-zero",
        uniform_includes_zero,
        lossy=True,
        mechanism="coin can be exactly 0 (bfloat16) and u <= p/q accepts drafts with p = 0",
        source="https://github.com/sgl-project/sglang/issues/35771",
        case=functools.partial(_truncated_target_case, "mutant-truncated-v32", 32, 2, 2),
    ),
    _entry(
        "uniform-hard-coded-zero",
        uniform_hard_coded_zero,
        lossy=True,
        mechanism="u = 0 constant: log p(d) > log(0) + log q(d) accepts every draft with p > 0",
        source="https://github.com/vllm-project/vllm-ascend/issues/13730",
        case=functools.partial(_dense_case, "mutant-dense-v16", 16, 2, 3),
    ),
    _entry(
        "residual-zeroes-rejected-token",
        residual_zeroes_rejected_token,
        lossy=True,
        mechanism="after a rejection samples p with only p(d) zeroed, not norm(max(0, p - q))",
        source="https://github.com/SafeAILab/EAGLE/issues/20",
        case=functools.partial(_dense_case, "mutant-dense-v8", 8, 2, 4),
    ),
    _entry(
        "residual-nan-when-p-equals-q",
        residual_nan_when_p_equals_q,
        lossy=True,
        mechanism="coin in (0, 1] rejects at p == q, where the unguarded residual is 0/0",
        source="https://github.com/jaymody/speculative-sampling/issues/5",
        case=functools.partial(_equal_rows_case, "mutant-p-equals-q-v16", 16, 2, 5),
    ),
    _entry(
        "draft-chosen-greedily",
        draft_chosen_greedily,
        lossy=True,
        mechanism="draft is argmax q but the ratio divides by the softmax q",
        source="https://github.com/huggingface/transformers/issues/32867",
        case=functools.partial(_dense_case, "mutant-dense-v16-b", 16, 2, 6),
    ),
    _entry(
        "draft-from-top-k-logits",
        draft_from_top_k_logits,
        lossy=True,
        mechanism="draft sampled from top-3-processed q while the ratio uses the raw q",
        source="https://github.com/huggingface/transformers/issues/47932",
        case=functools.partial(_dense_case, "mutant-dense-v32", 32, 2, 7),
    ),
    _entry(
        "target-default-temperature",
        target_with_default_temperature,
        lossy=True,
        mechanism="target law computed at temperature 1.0 instead of the request's 0.7",
        source="https://github.com/vllm-project/vllm/pull/10198",
        case=functools.partial(_dense_case, "mutant-dense-v16-c", 16, 2, 8),
    ),
    _entry(
        "replacement-from-next-row",
        replacement_from_next_row,
        lossy=True,
        mechanism="replacement token after rejecting d_i drawn from p_{i+1}, not the residual",
        source="https://github.com/openvinotoolkit/openvino.genai/issues/4190",
        case=functools.partial(_dense_case, "mutant-dense-v16-d", 16, 2, 9),
    ),
    _entry(
        "padded-vocab-not-truncated",
        padded_vocab_not_truncated,
        lossy=True,
        mechanism="vocabulary padded to a multiple of 64 keeps mass: ids >= V are emitted",
        source="https://github.com/vllm-project/vllm/security/advisories/GHSA-8wr5-jm2h-8r4f",
        case=functools.partial(_dense_case, "mutant-dense-v50", 50, 2, 10),
    ),
    _entry(
        "padded-draft-id-used-as-index",
        padded_draft_id_used_as_index,
        lossy=True,
        mechanism="padded draft id -1 indexes token V-1 and is accepted into the output",
        source="https://github.com/flashinfer-ai/flashinfer/issues/879",
        case=functools.partial(_dense_case, "mutant-dense-v16-e", 16, 2, 11),
    ),
    _entry(
        "shared-random-stream",
        shared_random_stream,
        lossy=True,
        mechanism="one random stream for every request of a batch: identical rows agree",
        source="https://github.com/NVIDIA/TensorRT-LLM/issues/19487",
        case=functools.partial(_dense_case, "mutant-dense-v16-f", 16, 2, 12),
    ),
    _entry(
        "draft-sampled-in-bfloat16",
        draft_sampled_in_bfloat16,
        lossy=True,
        mechanism="draft sampled from bfloat16 logits while the ratio uses the float32 q",
        source="https://github.com/deepseek-ai/DeepSpec/issues/31",
        case=functools.partial(_dense_case, "mutant-dense-v32-b", 32, 2, 13, near=0.3),
    ),
    _entry(
        "match-count-accepts-all",
        match_count_accepts_all,
        lossy=True,
        mechanism="n_matches = (~is_accepted.cumsum() < 1).sum() keeps every draft",
        source="https://github.com/huggingface/transformers/pull/28508",
        case=functools.partial(_dense_case, "mutant-dense-v16-g", 16, 2, 14),
    ),
    _entry(
        "block-verification-wrong-residual",
        block_verification_wrong_residual,
        lossy=True,
        mechanism="block acceptance, but the token-level residual max(0, p - q), not w p - q",
        source="https://github.com/vllm-project/vllm-ascend/issues/7807",
        case=functools.partial(_block_residual_case, "mutant-block-residual-v3"),
    ),
    _entry(
        "greedy-ties-to-highest",
        greedy_ties_to_highest,
        greedy=True,
        lossy=True,
        mechanism="argmax ties broken towards the highest index, greedy decoding takes lowest",
        source="https://github.com/ohdearquant/lattice/issues/280",
        case=functools.partial(_greedy_case, "mutant-greedy-ties-v8", 8, 3, 15, ties=True),
    ),
    _entry(
        "greedy-no-bonus-token",
        greedy_no_bonus_token,
        greedy=True,
        lossy=True,
        mechanism="no bonus token when all k drafts match the target's argmax",
        source="https://github.com/ohdearquant/lattice/pull/509",
        case=functools.partial(_greedy_case, "mutant-greedy-v50", 50, 2, 16, ties=False),
    ),
    _entry(
        "greedy-first-draft-unverified",
        greedy_first_draft_unverified,
        greedy=True,
        lossy=True,
        mechanism="first draft committed without comparing it with the target's argmax",
        source="https://github.com/ohdearquant/lattice/issues/243",
        case=functools.partial(_greedy_case, "mutant-greedy-v50-b", 50, 2, 17, ties=False),
    ),
    _entry(
        "small-batch-correction-from-target",
        small_batch_correction_from_target,
        lossy=True,
        mechanism="batches of B < 16 rows sample the correction from p, not the residual",
        source="https://github.com/vllm-project/vllm-ascend/pull/13470",
        case=functools.partial(_conditioned_case, "mutant-b1-v16", 16, 2, 26, 1, 1, "float64"),
    ),
    _entry(
        "float32-residual-unnormalised",
        float32_residual_unnormalised,
        lossy=True,
        mechanism="float32 inputs: uniform vs unnormalised residual CDF, last token gets the rest",
        source="https://github.com/flashinfer-ai/flashinfer/pull/221",
        case=functools.partial(
            _conditioned_case, "mutant-float32-v16", 16, 2, 27, 1, None, "float32"
        ),
    ),
    _entry(
        "distinct-rows-index-mixup",
        distinct_rows_index_mixup,
        lossy=True,
        mechanism="all-distinct batches read p and q in sorted order, drafts in batch order",
        source="https://github.com/NVIDIA/TensorRT-LLM/pull/12588",
        case=functools.partial(
            _conditioned_case, "mutant-distinct-v16", 16, 2, 28, 4, 4, "float64"
        ),
    ),
    _entry(
        "sample-and-match",
        sample_and_match,
        lossy=False,
        mechanism="x ~ p, accept iff x == d: lossless, acceptance sum p q (SUBOPTIMAL)",
        source="https://github.com/ml-explore/mlx-lm/pull/1709",
        case=functools.partial(_dense_case, "control-dense-v16", 16, 2, 18),
    ),
    _entry(
        "gumbel-max-residual",
        gumbel_max_residual,
        lossy=False,
        mechanism="correction by exponential race argmax r / Exp(1): exact sample of norm(r)",
        source="https://github.com/vllm-project/vllm/pull/41258",
        case=functools.partial(_dense_case, "control-dense-v32", 32, 2, 19),
    ),
    _entry(
        "log-space-acceptance",
        log_space_acceptance,
        lossy=False,
        mechanism="log u < log p(d) - log q(d) with u in (0, 1): the same test in log space",
        source="https://github.com/vllm-project/vllm-ascend/issues/13730",
        case=functools.partial(_truncated_target_case, "control-truncated-v32", 32, 2, 20),
    ),
    _entry(
        "unnormalised-residual-multinomial",
        unnormalised_residual_multinomial,
        lossy=False,
        mechanism="torch.multinomial normalises max(0, p - q) itself: same law",
        source="https://github.com/vllm-project/vllm/pull/2336",
        case=functools.partial(_dense_case, "control-dense-v16-b", 16, 2, 21),
    ),
    _entry(
        "distinct-rows-grouped-exact",
        distinct_rows_grouped_exact,
        lossy=False,
        mechanism="rows grouped by content, the batch's order kept: the exact variant",
        source="https://github.com/NVIDIA/TensorRT-LLM/pull/12588",
        case=functools.partial(
            _conditioned_case, "control-distinct-v16", 16, 2, 29, 4, 4, "float64"
        ),
    ),
    _entry(
        "block-verification",
        verify_block,
        lossy=False,
        mechanism="block verification (Sun et al. 2024, Alg. 2): lossless, accepts more later",
        source="https://github.com/sgl-project/sglang/pull/36516",
        case=functools.partial(_dense_case, "control-dense-v8-k3", 8, 3, 24, near=0.9),
    ),
)
"""Every chain and greedy mutant and control, each with the case on which its mechanism acts
(built on first use), in the zoo's listing order."""


PRECISION_ZOO: tuple[Mutant, ...] = (
    _entry(
        "laws-from-float16-logits",
        laws_from_float16_logits,
        lossy=True,
        mechanism="ratio p/q in float16 from float16 logits (max 20): TV 0.001-0.003 per row",
        source="issue 13 item 5 (synthetic precision mutant, not a reported bug)",
        case=functools.partial(_dense_case, "precision-dense-v32-k3", 32, 3, 25),
    ),
    _entry(
        "laws-from-offset-float16-logits",
        laws_from_offset_float16_logits,
        lossy=True,
        mechanism="ratio p/q in float16 from float16 logits (max 80): TV 0.004-0.013 per row",
        source="issue 13 item 5 (synthetic precision mutant, not a reported bug)",
        case=functools.partial(_dense_case, "precision-dense-v32-k3", 32, 3, 25),
    ),
)
"""Lossy mutants whose deviation lies below every single law test's reach at the default
design (issue 13, item 5): kept out of :data:`CHAIN_ZOO`, whose lossy entries the default audit
must each catch, until the run-level uniformity check (:mod:`losslessness.checks.pvalues`) is
part of the run. ``mutant/<name>`` resolves them too
(:data:`losslessness.zoo.registry.PRECISION_MUTANTS`)."""
