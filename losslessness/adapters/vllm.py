"""vLLM's V1 rejection sampler (Triton kernels), wrapped into the chain protocol.

Written against ``vllm/v1/sample/rejection_sampler.py`` as of vLLM v0.9-v0.11 (read at
https://github.com/vllm-project/vllm/blob/main/vllm/v1/sample/rejection_sampler.py; the same
module-level API since v0.8.2): ``rejection_sample(draft_token_ids, num_draft_tokens,
max_spec_len, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
sampling_metadata)`` and ``generate_uniform_probs(num_tokens, num_draft_tokens, generators,
device)``. ``RejectionSampler.forward`` is not called: its signature changed between versions
(v0.8 took ``target_logits`` and ``bonus_token_ids``; later versions take the flattened logits
and sample the bonus inside) and it applies temperature, top-k/top-p and penalties from a full
``SamplingMetadata``; ``rejection_sample`` is the kernel path every version runs on
probabilities. Conversion of our tensors (the ``SpecDecodeMetadata.make_dummy`` layout):

- ``draft_token_ids [B, k]`` -> flattened ``[B*k]`` int32; ``num_draft_tokens = [k] * B``;
  ``cu_num_draft_tokens`` the int32 cumulative sum; ``max_spec_len = k`` (at most vLLM's
  ``MAX_SPEC_LEN``);
- ``target_probs [B, k+1, V]`` -> rows 0..k-1 flattened to ``[B*k, V]`` float32 (vLLM computes
  them by softmax; we pass probabilities directly); ``draft_probs [B, k, V]`` -> ``[B*k, V]``;
- the bonus row p_k: vLLM samples the bonus token outside the rejection sampler (with its
  ordinary sampler) and passes ``bonus_token_ids [B, 1]``; we draw it from p_k by inverse CDF
  (float64) with the protocol's randomness;
- ``sampling_metadata``: only ``all_greedy`` (False), ``all_random`` (True), ``temperature``
  (ones, so no request is greedy) and ``generators`` (one CUDA generator per request, seeded from
  the protocol's generator) are read on this path; we pass an object with exactly these;
- output ``[B, k+1]`` int32 with ``PLACEHOLDER_TOKEN_ID = -1``: the protocol's layout already.

Uniforms: vLLM accepts iff ``target_prob / draft_prob >= uniform`` with uniforms from
``generate_uniform_probs``; given ``uniforms=``, that function is replaced for the duration of
the call by one returning ``uniforms.accept_uniforms`` flattened (float64, as vLLM >= 0.9
draws them). The recovered token is an exponential race (``argmax(max(p - q, 0) / E)``,
``E ~ Exp(1)`` from the request's generator), not an inverse CDF, so it cannot be coupled:
the verifier sets ``coupled_final_token = False`` and the coupling check compares decisions
only (the recovered token's law is tested statistically).
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from losslessness.adapters.base import Adapter, AdapterUnavailable, import_optional, require_cuda
from losslessness.protocol import InvalidInputError, validate_chain_inputs
from losslessness.reference import ChainUniforms, sample_inverse_cdf

EXPECTED_PARAMETERS = (
    "draft_token_ids",
    "num_draft_tokens",
    "max_spec_len",
    "cu_num_draft_tokens",
    "draft_probs",
    "target_probs",
    "bonus_token_ids",
    "sampling_metadata",
)
"""Parameters of ``rejection_sample`` this adapter was written against, in order."""

_PATCH_LOCK = threading.Lock()


@dataclass
class RandomSamplingMetadata:
    """The fields of vLLM's ``SamplingMetadata`` that ``rejection_sample`` reads for requests
    that all sample at temperature 1 (no greedy request).

    Attributes:
        temperature: ``[B]`` float32 ones on the device.
        generators: request index -> CUDA ``torch.Generator``.
    """

    temperature: torch.Tensor
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    all_greedy: bool = False
    all_random: bool = True


class VllmRejectionSampler:
    """Chain verifier calling ``vllm.v1.sample.rejection_sampler.rejection_sample``.

    Args:
        module: the imported ``vllm.v1.sample.rejection_sampler`` module.
        device: the CUDA device the kernels run on.
    """

    coupled_final_token = False
    """The recovered token is an exponential race, not an inverse CDF of a uniform."""

    def __init__(self, module: ModuleType, device: str | torch.device = "cuda") -> None:
        self.module = module
        self.device = torch.device(device)
        self.max_spec_len = int(getattr(module, "MAX_SPEC_LEN", 32))

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
        uniforms: ChainUniforms | None = None,
    ) -> torch.Tensor:
        """One verification step on the GPU (chain protocol; shapes as in
        :class:`losslessness.protocol.ChainVerifier`); returns ``[B, k+1]`` int64 on CPU.

        Raises:
            InvalidInputError: malformed inputs, ``k == 0`` or ``k > MAX_SPEC_LEN``.
        """
        batch, k, vocab = validate_chain_inputs(
            target_probs, draft_probs, draft_token_ids, generator
        )
        if not 1 <= k <= self.max_spec_len:
            raise InvalidInputError(
                "draft_token_ids",
                f"vLLM's rejection sampler needs 1 <= k <= MAX_SPEC_LEN = {self.max_spec_len}, "
                f"got k = {k}",
            )
        device = self.device
        seeds = torch.randint(0, 2**62, (batch,), generator=generator).tolist()
        if uniforms is None:
            sample = torch.rand((batch,), generator=generator, dtype=torch.float64)
        else:
            sample = uniforms.sample_uniforms.detach().cpu().to(torch.float64)
        bonus = sample_inverse_cdf(target_probs[:, k].detach().cpu(), sample)
        metadata = RandomSamplingMetadata(
            temperature=torch.ones(batch, dtype=torch.float32, device=device),
            generators={
                b: torch.Generator(device=device).manual_seed(seed) for b, seed in enumerate(seeds)
            },
        )
        arguments = (
            draft_token_ids.to(device, torch.int32).reshape(-1).contiguous(),
            [k] * batch,
            k,
            torch.arange(1, batch + 1, device=device, dtype=torch.int32) * k,
            draft_probs.to(device, torch.float32).reshape(batch * k, vocab).contiguous(),
            target_probs[:, :k].to(device, torch.float32).reshape(batch * k, vocab).contiguous(),
            bonus.to(device, torch.int32).reshape(batch, 1).contiguous(),
            metadata,
        )
        if uniforms is None:
            output: torch.Tensor = self.module.rejection_sample(*arguments)
        else:
            accept = uniforms.accept_uniforms.to(device, torch.float64).reshape(-1).contiguous()
            output = self._with_uniforms(accept, arguments)
        return output.to(torch.int64).cpu()

    def _with_uniforms(self, accept: torch.Tensor, arguments: tuple[Any, ...]) -> torch.Tensor:
        """Run ``rejection_sample`` with ``generate_uniform_probs`` returning ``accept``."""

        def given_uniforms(*_args: object, **_kwargs: object) -> torch.Tensor:
            return accept

        # rejection_sample looks the function up as a module global at call time.
        with _PATCH_LOCK:
            original = getattr(self.module, "generate_uniform_probs")  # noqa: B009
            setattr(self.module, "generate_uniform_probs", given_uniforms)  # noqa: B010
            try:
                output: torch.Tensor = self.module.rejection_sample(*arguments)
            finally:
                setattr(self.module, "generate_uniform_probs", original)  # noqa: B010
        return output


def adapter(device: str = "cuda") -> Adapter:
    """Build the ``vllm`` adapter.

    Raises:
        AdapterUnavailable: vLLM not installed, CUDA missing, or the API differs from the one
            this adapter was written against (the reason says which).
    """
    vllm = import_optional("vllm", "vllm")
    rejection_sampler = import_optional("vllm.v1.sample.rejection_sampler", "vllm")
    require_cuda("vLLM's rejection sampler is Triton")
    for name in ("rejection_sample", "generate_uniform_probs"):
        if not callable(getattr(rejection_sampler, name, None)):
            raise AdapterUnavailable(
                f"vllm {vllm.__version__}: API changed, rejection_sampler.{name} is missing"
            )
    parameters = tuple(inspect.signature(rejection_sampler.rejection_sample).parameters)
    if parameters != EXPECTED_PARAMETERS:
        raise AdapterUnavailable(
            f"vllm {vllm.__version__}: API changed, rejection_sample{parameters} differs from "
            f"the {EXPECTED_PARAMETERS} this adapter was written against"
        )
    return Adapter(
        name="vllm",
        description=f"vllm {vllm.__version__} v1.sample.rejection_sampler.rejection_sample "
        f"(Triton) on {device}, float32 probabilities; bonus token drawn by the adapter from "
        "p_k; accept uniforms coupled, recovered token not",
        chain=VllmRejectionSampler(rejection_sampler, device),
    )
