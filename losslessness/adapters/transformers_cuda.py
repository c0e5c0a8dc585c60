"""Hugging Face transformers' ``_speculative_sampling`` run on a CUDA device.

The conversion (logits = log p, one call per row, global RNG seeded from the audit's
generator, signature inspection) is :class:`losslessness.adapters.transformers.
SpeculativeSamplingVerifier`'s; this module only moves the inputs to the device, so that the
function's ``torch.rand``/``torch.multinomial`` draw from the CUDA generator, and restores the
caller's CUDA RNG state afterwards (``torch.random.fork_rng``). ``seed_global_rng`` inside
the wrapped verifier seeds every device, so runs replay. Written against transformers 5.x
(``generation/utils.py``); the inner verifier's inspection keeps 4.38+ working.
"""

from __future__ import annotations

import torch

from losslessness.adapters import transformers as transformers_adapter
from losslessness.adapters.base import Adapter, AdapterUnavailable, require_cuda
from losslessness.protocol import ChainVerifier


class OnDeviceVerifier:
    """A chain verifier whose inputs are moved to ``device`` (dtype unchanged) before the call.

    Args:
        verifier: the wrapped chain verifier (device-agnostic: it computes where its inputs are).
        device: the device to run on.

    The output is returned on CPU; the device's RNG state is forked around the call.
    """

    def __init__(self, verifier: ChainVerifier, device: str | torch.device) -> None:
        self.verifier = verifier
        self.device = torch.device(device)

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """Move, call (chain protocol; shapes as in :class:`ChainVerifier`), return on CPU."""
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type):
            result = self.verifier(
                target_probs.to(self.device),
                draft_probs.to(self.device),
                draft_token_ids.to(self.device),
                generator,
            )
        return result.cpu()


def adapter(device: str = "cuda") -> Adapter:
    """Build the ``transformers-cuda`` adapter: ``transformers``' chain verifier on ``device``.

    Args:
        device: a CUDA device (``"cuda"``, ``"cuda:1"``).

    Raises:
        AdapterUnavailable: CUDA missing, or transformers missing (see
            :func:`losslessness.adapters.transformers.adapter`).
    """
    if torch.device(device).type != "cuda":
        raise AdapterUnavailable(f"transformers-cuda: {device!r} is not a CUDA device")
    require_cuda("torch.cuda.is_available() is False")
    base = transformers_adapter.adapter()
    if base.chain is None:
        raise AdapterUnavailable("transformers adapter has no chain verifier")
    return Adapter(
        name="transformers-cuda",
        description=f"{base.description}; inputs on {device} (CUDA RNG)",
        chain=OnDeviceVerifier(base.chain, device),
    )
