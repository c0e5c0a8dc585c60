"""A CPU transcription of SGLang 0.5.23's ``TreeSpeculativeSamplingTargetOnly`` for testing
the plumbing around it where CUDA is missing: the layout, coins, probabilities and output
conversion of :class:`losslessness.adapters.sglang_serving.SglangServingTreeVerifier`'s sampled
branch. It is not the engine: the real kernel is CUDA only (JIT), run by the ``sglang-tree``
target on a GPU.

Source: ``sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh`` in the sglang
0.5.23 wheel, kernel ``TreeSpeculativeSamplingTargetOnly``, read line by line: one coin per
level (``uniform_samples[b, slot]`` of the node being left), children walked by
``retrive_next_token``/``retrive_next_sibling``, ``prob_acc += p(child)``, accept iff
``p(child) > 0`` and (``coin < prob_acc / threshold_acc`` or ``p(child) >= threshold_single``),
a rejected child's ``draft_probs`` entry overwritten with its ``p``, then the final token by
inverse CDF of ``relu(p - draft_probs)`` (``draft_probs`` not read at the last level) with
``uniform_samples_for_final_sampling[b]``, written at the last accepted slot. The block-wide
sampling (FlashInfer's ``DeviceSamplingFromProb``) takes the first token whose cumulative mass
exceeds ``u * total``, here :func:`losslessness.reference.sampling.sample_inverse_cdf`.
"""

from __future__ import annotations

import torch

from losslessness.reference.sampling import sample_inverse_cdf

__all__ = ["tree_speculative_sampling_target_only"]


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """The kernel's effect on ``predicts [B*T]``, ``accept_index [B, D+1]``,
    ``accept_token_num [B]`` (int32, written in place) and ``draft_probs [B, T, V]`` (float32,
    rejected children's entries overwritten), for the SGLang layout of
    :func:`losslessness.reference.tree_layouts.to_sglang`; ``deterministic`` changes nothing on
    one CPU thread."""
    batch, slots = candidates.shape
    levels = accept_index.shape[1]
    p = target_probs.reshape(batch * slots, -1)
    q = draft_probs.view(batch * slots, -1)
    threshold_acc = max(threshold_acc, 1e-9)
    for b in range(batch):
        prob_acc = 0.0
        row = b * slots
        coin = float(uniform_samples[b, 0])
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted = 0
        current = 0
        for _ in range(1, levels):
            current = int(retrive_next_token[b, current])
            while current != -1:
                token = int(candidates[b, current])
                single = float(p[row, token])
                prob_acc += single
                if single > 0 and (coin < prob_acc / threshold_acc or single >= threshold_single):
                    prob_acc = 0.0
                    row = b * slots + current
                    coin = float(uniform_samples[b, current])
                    predicts[last] = token
                    accepted += 1
                    last = int(retrive_index[b, current])
                    accept_index[b, accepted] = last
                    break
                q[row, token] = p[row, token]
                current = int(retrive_next_sibling[b, current])
            if current == -1:
                break
        accept_token_num[b] = accepted
        law = p[row] if accepted == levels - 1 else (p[row] - q[row]).clamp(min=0.0)
        final = uniform_samples_for_final_sampling[b : b + 1]
        predicts[last] = int(sample_inverse_cdf(law.unsqueeze(0), final)[0])
