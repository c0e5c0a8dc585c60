"""SGLang's tree speculative sampling kernel, a chain being a degenerate tree.

Written against ``sgl-kernel/python/sgl_kernel/speculative.py`` (sgl-kernel 0.1.x-0.3.x, the
signature with ``uniform_samples_for_final_sampling``; https://github.com/sgl-project/sglang):
``tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates,
retrive_index, retrive_next_token, retrive_next_sibling, uniform_samples,
uniform_samples_for_final_sampling, target_probs, draft_probs, threshold_single=1.0,
threshold_acc=1.0, deterministic=True)``, and its kernel
(``sgl-kernel/csrc/speculative/speculative_sampling.cuh``, ``TreeSpeculativeSamplingTargetOnly``).

The kernel is "target only": it accepts a child token d with coin ``u <= p(d)`` (with
``threshold_acc = threshold_single = 1``), which is Leviathan et al.'s rule ``u < p(d)/q(d)``
for a *deterministic* draft, q = one-hot(d) (EAGLE's top-1 chain); after a rejection it sets
``draft_probs[d] = p(d)`` and samples the final token from ``relu(p - draft_probs)``, i.e.
p without d. SGLang passes zeros as ``draft_probs``; so do we. The verifier therefore requires
one-hot draft rows (``requires_one_hot_draft = True``; other inputs raise InvalidInputError):
on stochastic drafts the kernel is not the chain algorithm, and calling it there would report
a loss SGLang never incurs.

Chain as a tree, per row b (``N = k+1`` nodes, node 0 the root, node j the j-th draft):
``candidates[b] = [0, d_0, .., d_{k-1}]`` int64 (the root's token is never read);
``retrive_index[b, j] = b*N + j``; ``retrive_next_token[b, j] = j+1`` (-1 at j = k);
``retrive_next_sibling = -1``; ``target_probs[b, j] = p_j`` (the law after node j);
``uniform_samples[b, j] = accept_uniforms[b, j]`` (the coin for node j's child; column k
unused); ``uniform_samples_for_final_sampling[b] = sample_uniforms[b]``; ``num_speculative_tokens
= k+1`` (the width of ``accept_index``). Output: ``accept_index[b, 0..m]`` are the accepted
nodes' slots (m = ``accept_token_num[b]``) and ``predicts`` at those slots the emitted tokens:
the drafts, then the final token.
"""

from __future__ import annotations

import inspect

import torch

from losslessness.adapters.base import (
    Adapter,
    AdapterUnavailable,
    KernelVerifier,
    import_optional,
    require_cuda,
)
from losslessness.protocol import PLACEHOLDER, InvalidInputError, validate_chain_inputs
from losslessness.reference import ChainUniforms

EXPECTED_PARAMETERS = (
    "predicts",
    "accept_index",
    "accept_token_num",
    "candidates",
    "retrive_index",
    "retrive_next_token",
    "retrive_next_sibling",
    "uniform_samples",
    "uniform_samples_for_final_sampling",
    "target_probs",
    "draft_probs",
    "threshold_single",
    "threshold_acc",
    "deterministic",
)
"""Parameters of ``tree_speculative_sampling_target_only`` this adapter was written against."""


class SglangTreeSampler(KernelVerifier):
    """Chain verifier calling ``sgl_kernel.tree_speculative_sampling_target_only``.

    Args:
        function: the kernel wrapper.
        device: the CUDA device.
    """

    requires_one_hot_draft = True
    """The kernel implements rejection sampling for deterministic drafts only."""

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
        uniforms: ChainUniforms | None = None,
    ) -> torch.Tensor:
        """One verification step (chain protocol); ``[B, k+1]`` int64 on CPU.

        Raises:
            InvalidInputError: malformed inputs, or a draft row that is not one-hot.
        """
        batch, k, vocab = validate_chain_inputs(
            target_probs, draft_probs, draft_token_ids, generator
        )
        if k and not bool((draft_probs.amax(dim=-1) == 1).all()):
            raise InvalidInputError(
                "draft_probs",
                "SGLang's target-only kernel assumes deterministic drafts: every row of q must "
                "be one-hot (use losslessness.checks.coupling.deterministic_draft_case)",
            )
        if uniforms is None:
            uniforms = ChainUniforms.draw(batch, k, generator)
        device, nodes = self.device, k + 1
        slots = torch.arange(batch * nodes, device=device, dtype=torch.int64).reshape(batch, nodes)
        next_token = torch.arange(1, nodes + 1, device=device, dtype=torch.int64).repeat(batch, 1)
        next_token[:, -1] = -1
        candidates = torch.zeros((batch, nodes), dtype=torch.int64, device=device)
        candidates[:, 1:] = draft_token_ids.to(device, torch.int64)
        coins = torch.zeros((batch, nodes), dtype=torch.float32, device=device)
        coins[:, :k] = uniforms.accept_uniforms.to(device, torch.float32)
        predicts = torch.full((batch * nodes,), PLACEHOLDER, dtype=torch.int32, device=device)
        accept_index = torch.full((batch, nodes), PLACEHOLDER, dtype=torch.int32, device=device)
        accept_token_num = torch.zeros(batch, dtype=torch.int32, device=device)
        self.function(
            predicts,
            accept_index,
            accept_token_num,
            candidates,
            slots,
            next_token,
            torch.full((batch, nodes), -1, dtype=torch.int64, device=device),
            coins,
            uniforms.sample_uniforms.to(device, torch.float32).contiguous(),
            target_probs.to(device, torch.float32).contiguous(),
            torch.zeros((batch, nodes, vocab), dtype=torch.float32, device=device),
            threshold_single=1.0,
            threshold_acc=1.0,
            deterministic=True,
        )
        accepted = accept_token_num.to(torch.int64).cpu()
        index = accept_index.to(torch.int64).cpu()
        tokens = predicts.to(torch.int64).cpu()
        out = torch.full((batch, nodes), PLACEHOLDER, dtype=torch.int64)
        positions = torch.arange(nodes)
        emitted = positions.unsqueeze(0) <= accepted.unsqueeze(1)
        out[emitted] = tokens[index.clamp(min=0)][emitted]
        return out


def adapter(device: str = "cuda") -> Adapter:
    """Build the ``sglang`` adapter.

    Raises:
        AdapterUnavailable: sgl-kernel not installed, CUDA missing, or a different signature.
    """
    sgl_kernel = import_optional("sgl_kernel", "sgl-kernel")
    require_cuda("sgl-kernel is CUDA only")
    version = getattr(sgl_kernel, "__version__", "unknown")
    function = getattr(sgl_kernel, "tree_speculative_sampling_target_only", None)
    if function is None:
        raise AdapterUnavailable(
            f"sgl-kernel {version}: API changed, no tree_speculative_sampling_target_only"
        )
    parameters = tuple(inspect.signature(function).parameters)
    if parameters != EXPECTED_PARAMETERS:
        raise AdapterUnavailable(
            f"sgl-kernel {version}: API changed, tree_speculative_sampling_target_only"
            f"{parameters} differs from the {EXPECTED_PARAMETERS} this adapter was written against"
        )
    return Adapter(
        name="sglang",
        description=f"sgl-kernel {version} tree_speculative_sampling_target_only on {device}, "
        "chain as a degenerate tree, one-hot drafts only, float32 probabilities",
        chain=SglangTreeSampler(function, device),
    )
