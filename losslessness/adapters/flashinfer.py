"""FlashInfer's ``chain_speculative_sampling`` kernel, wrapped into the chain protocol.

Two APIs exist (``flashinfer/sampling.py``, https://github.com/flashinfer-ai/flashinfer):

- **up to 0.2.2**: ``chain_speculative_sampling(draft_probs, draft_token_ids, uniform_samples,
  target_probs, maybe_output_accepted_token_num=None, maybe_output_emitted_token_num=None,
  deterministic=True)`` with ``uniform_samples [B, k+1]``. The kernel
  (``include/flashinfer/sampling.cuh``, ``ChainSpeculativeSampling``) accepts draft i iff
  ``u[b, i] * q_i(d) < p_i(d)`` and draws the final token by inverse CDF of
  ``relu(p - q)`` (or p_k) at ``u[b, min(m + 1, k)]``, m the accepted count. Column ``m + 1``
  is never read by a decision (the chain stopped at m), so the adapter calls the kernel twice:
  once with ``[accept_uniforms, sample_uniforms]`` to learn m, then with ``sample_uniforms``
  written into column ``min(m + 1, k)``; the decisions are unchanged and the final token
  inverts the CDF at ``sample_uniforms`` exactly as the protocol says. This version takes the
  protocol's ``uniforms=`` (coupled comparison).
- **0.2.3 and later** (uniforms removed; the signature below is FlashInfer 0.7.2's, read in its
  ``flashinfer/sampling.py``; CUDA only, so never run here):
  ``chain_speculative_sampling(draft_probs, draft_token_ids, target_probs,
  maybe_output_accepted_token_num=None, maybe_output_emitted_draft_token_num=None,
  deterministic=True, generator=None, seed=None, offset=None)`` returning ``(output_token_ids,
  output_accepted_token_num, output_emitted_draft_token_num)``; randomness from a CUDA
  ``torch.Generator`` (Philox), seeded here from the protocol's generator. No uniforms: the
  coupling check compares it statistically.

Both take float32 probabilities ``[B, k(+1), V]`` and int32 drafts on the GPU and return
``[B, k+1]`` int32 with -1 after the last emitted token (the protocol's layout).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from losslessness.adapters.base import (
    Adapter,
    AdapterUnavailable,
    KernelVerifier,
    import_optional,
    require_cuda,
)
from losslessness.protocol import PLACEHOLDER, validate_chain_inputs
from losslessness.reference import ChainUniforms

CHECKED_UP_TO = "0.7.2"
"""The newest FlashInfer whose ``chain_speculative_sampling`` signature this adapter matches."""

GENERATOR_PARAMETERS = (
    "draft_probs",
    "draft_token_ids",
    "target_probs",
    "deterministic",
    "generator",
)
"""Parameters of the >= 0.2.3 ``chain_speculative_sampling`` this adapter passes (0.7.2 adds
``seed`` and ``offset``, left at None)."""


def _first(result: Any) -> torch.Tensor:
    tokens: torch.Tensor = result[0] if isinstance(result, tuple) else result
    return tokens


def _gpu_inputs(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        draft_probs.to(device, torch.float32).contiguous(),
        draft_token_ids.to(device, torch.int32).contiguous(),
        target_probs.to(device, torch.float32).contiguous(),
    )


class FlashInferUniformSampler(KernelVerifier):
    """Chain verifier for FlashInfer <= 0.2.2 (explicit ``uniform_samples``; coupled).

    Args:
        function: ``flashinfer.sampling.chain_speculative_sampling`` (old signature).
        device: the CUDA device.
    """

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
            InvalidInputError: malformed inputs.
            RuntimeError: the two kernel calls disagree on the accepted drafts.
        """
        batch, k, _ = validate_chain_inputs(target_probs, draft_probs, draft_token_ids, generator)
        if uniforms is None:
            uniforms = ChainUniforms.draw(batch, k, generator)
        draft, ids, target = _gpu_inputs(target_probs, draft_probs, draft_token_ids, self.device)
        accept = uniforms.accept_uniforms.to(self.device, torch.float32)
        sample = uniforms.sample_uniforms.to(self.device, torch.float32)
        needles = torch.cat([accept, sample.unsqueeze(1)], dim=1).contiguous()
        first = _first(self.function(draft, ids, needles, target, deterministic=True))
        accepted = (first != PLACEHOLDER).sum(dim=1).to(torch.int64) - 1
        column = torch.clamp(accepted + 1, max=k).unsqueeze(1)
        needles = needles.scatter(1, column, sample.unsqueeze(1)).contiguous()
        second = _first(self.function(draft, ids, needles, target, deterministic=True))
        again = (second != PLACEHOLDER).sum(dim=1).to(torch.int64) - 1
        if not bool((again == accepted).all()):
            raise RuntimeError(
                "flashinfer chain_speculative_sampling accepted different drafts in two calls "
                "with the same decision uniforms (nondeterministic kernel?)"
            )
        return second.to(torch.int64).cpu()


class FlashInferGeneratorSampler(KernelVerifier):
    """Chain verifier for FlashInfer >= 0.2.3 (randomness from a CUDA generator; no uniforms).

    Args:
        function: ``flashinfer.sampling.chain_speculative_sampling`` (new signature).
        device: the CUDA device.
    """

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """One verification step (chain protocol); ``[B, k+1]`` int64 on CPU."""
        validate_chain_inputs(target_probs, draft_probs, draft_token_ids, generator)
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        device_generator = torch.Generator(device=self.device).manual_seed(seed)
        draft, ids, target = _gpu_inputs(target_probs, draft_probs, draft_token_ids, self.device)
        result = self.function(draft, ids, target, deterministic=True, generator=device_generator)
        return _first(result).to(torch.int64).cpu()


def adapter(device: str = "cuda") -> Adapter:
    """Build the ``flashinfer`` adapter for the installed version's API.

    Raises:
        AdapterUnavailable: flashinfer not installed, CUDA missing, or an API this adapter was
            not written against.
    """
    flashinfer = import_optional("flashinfer", "flashinfer")
    sampling = import_optional("flashinfer.sampling", "flashinfer")
    require_cuda("FlashInfer's kernels are CUDA only")
    version = getattr(flashinfer, "__version__", "unknown")
    function = getattr(sampling, "chain_speculative_sampling", None)
    if function is None:
        raise AdapterUnavailable(
            f"flashinfer {version}: API changed, no chain_speculative_sampling"
        )
    parameters = inspect.signature(function).parameters
    chain: FlashInferUniformSampler | FlashInferGeneratorSampler
    if "uniform_samples" in parameters:
        chain = FlashInferUniformSampler(function, device)
        how = "explicit uniform_samples (<= 0.2.2; coupled)"
    elif "generator" in parameters:
        missing = [name for name in GENERATOR_PARAMETERS if name not in parameters]
        if missing:
            raise AdapterUnavailable(
                f"flashinfer {version}: API changed, chain_speculative_sampling lost "
                f"{', '.join(missing)} (checked against 0.2.3-{CHECKED_UP_TO}); install it with: "
                f"pip install flashinfer-python=={CHECKED_UP_TO}"
            )
        chain = FlashInferGeneratorSampler(function, device)
        how = f"CUDA generator (0.2.3-{CHECKED_UP_TO} API; no uniforms)"
    else:
        raise AdapterUnavailable(
            f"flashinfer {version}: API changed, chain_speculative_sampling"
            f"({', '.join(parameters)}) takes neither uniform_samples nor generator"
        )
    return Adapter(
        name="flashinfer",
        description=f"flashinfer {version} sampling.chain_speculative_sampling on {device}, "
        f"float32 probabilities, randomness from {how}",
        chain=chain,
    )
