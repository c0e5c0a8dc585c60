"""FlashInfer's samplers (``flashinfer`` and ``flashinfer-joint``): the law of
``flashinfer.sampling.top_k_top_p_sampling_from_logits`` with ``filter_apply_order``
``"top_k_first"`` (the default) or ``"joint"``, and of ``min_p_sampling_from_probs``.

Source: FlashInfer as stored by this project's source index, ``flashinfer-ai/flashinfer`` at
commit ``fb28d7242b3506a2348265962041acc1fb56cca4`` (``nightly-v0.6.18``, 2026-08-22):
``flashinfer/sampling.py`` and ``include/flashinfer/sampling.cuh``. vLLM 0.33.0 pins
``flashinfer-python==0.7.2.post1`` and SGLang 0.5.23 ``0.7.2``; neither wheel could be read
here (it is not installed and the index holds no 0.7.2 tree), so a change between the two
versions would go unnoticed: the rules below are those of the commit read.

The kernels sample by rejection (``TopKTopPSamplingFromProbKernel``,
``TopPSamplingFromProbKernel``, ``MinPSamplingFromProbKernel``): a drawn token ``x`` is
accepted by comparing the other probabilities with ``p_x``, so every rule is by *value* and
tied tokens are kept or removed together:

- top-k: keep ``x`` iff fewer than ``k`` tokens have ``p > p_x`` (``count < k``): ties at the
  ``k``-th are all kept;
- top-p: keep ``x`` iff the mass of the tokens with ``p > p_x`` is ``< top_p``;
- min-p: keep ``x`` iff ``p_x >= min_p * max p`` (``probs_vec[j] >= pivot``);
- ``"joint"``: top-k and top-p both on the *same* unfiltered probabilities;
- ``"top_k_first"``: ``top_k_mask_logits`` (top-k on the logits), ``softmax``, then top-p on
  the renormalised probabilities. ``top_k_mask_logits`` and ``top_k_renorm_probs`` run a radix
  top-k kernel whose handling of ties at the ``k``-th value could not be read: the profile
  keeps them all, as the rejection kernels do (unverified).

The law of an accepted draw is the probabilities restricted to the kept set, renormalised.
Temperature is the caller's (``logits / T`` before the call, as vLLM and SGLang do); FlashInfer
has no greedy sampler (callers take an argmax) and no penalties, biases or masks: a request
with ``temperature == 0``, a penalty, a bias, allowed, bad or stop-token fields raises
:class:`~losslessness.requests.UnsupportedRequest`, as does min-p with top-k or top-p (no single
FlashInfer call takes all three).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from losslessness.reference.profiles import steps
from losslessness.reference.profiles.registry import register
from losslessness.requests import Request

__all__ = [
    "FLASHINFER",
    "FLASHINFER_JOINT",
    "FlashInferProfile",
    "joint_keep",
    "min_p_keep",
    "top_k_value_keep",
    "top_p_value_keep",
]

ENGINE = "flashinfer (commit fb28d72)"


def _strictly_greater(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each entry: how many entries are strictly greater, and their sum (the largest
    summed first, as a descending scan adds them)."""
    ascending = torch.sort(values).values
    count = values.shape[0] - torch.searchsorted(ascending, values, right=True)
    # Only probabilities use the sums; clamping keeps -inf logits from making them NaN.
    descending_sums = torch.cumsum(ascending.flip(0).clamp(min=0.0), dim=0)
    mass = torch.where(count > 0, descending_sums[(count - 1).clamp(min=0)], 0.0)
    return count, mass


def top_k_value_keep(probs: torch.Tensor, top_k: int) -> torch.Tensor:
    """FlashInfer's top-k by value: keep ``x`` iff fewer than ``top_k`` tokens are strictly
    more likely.

    Args:
        probs: ``[V]`` float64 probabilities.
        top_k: ``k >= 1``.

    Returns:
        ``[V]`` bool kept tokens.
    """
    return _strictly_greater(probs)[0] < top_k


def top_p_value_keep(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """FlashInfer's top-p by value: keep ``x`` iff the mass of the strictly more likely tokens
    is ``< top_p`` (zero-probability tokens are never kept).

    Args:
        probs: ``[V]`` float64 probabilities summing to 1.
        top_p: the nucleus mass.

    Returns:
        ``[V]`` bool kept tokens.
    """
    return (_strictly_greater(probs)[1] < top_p) & (probs > 0)


def min_p_keep(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    """FlashInfer's min-p: keep ``x`` iff ``p_x >= min_p * max p`` (and ``p_x > 0``).

    Args:
        probs: ``[V]`` float64 probabilities (unnormalised is fine: the rule is relative).
        min_p: in ``[0, 1]``.

    Returns:
        ``[V]`` bool kept tokens.
    """
    return (probs >= min_p * probs.max()) & (probs > 0)


def joint_keep(probs: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """``filter_apply_order="joint"``: top-k and top-p by value on the same probabilities.

    Args:
        probs: ``[V]`` float64 probabilities summing to 1.
        top_k: ``k`` or None (off).
        top_p: the nucleus mass or None (off).

    Returns:
        ``[V]`` bool kept tokens.
    """
    keep = probs > 0
    if top_k is not None:
        keep &= top_k_value_keep(probs, top_k)
    if top_p is not None:
        keep &= top_p_value_keep(probs, top_p)
    return keep


_UNSUPPORTED = (
    ("logit_bias", lambda r: bool(r.logit_bias)),
    ("frequency_penalty", lambda r: r.frequency_penalty != 0.0),
    ("presence_penalty", lambda r: r.presence_penalty != 0.0),
    ("repetition_penalty", lambda r: r.repetition_penalty != 1.0),
    ("min_tokens", lambda r: r.min_tokens > 0),
    ("allowed_token_ids", lambda r: r.allowed_token_ids is not None),
    ("bad_token_ids", lambda r: bool(r.bad_token_ids)),
)


@dataclass(frozen=True)
class FlashInferProfile:
    """FlashInfer's sampling law under one ``filter_apply_order`` (module docstring).

    Attributes:
        name: ``flashinfer`` (``top_k_first``) or ``flashinfer-joint``.
        source: the commit and files read.
        joint: whether top-k and top-p apply jointly.
    """

    name: str
    source: str
    joint: bool

    def law(self, logits: torch.Tensor, request: Request, history: Sequence[int]) -> torch.Tensor:
        """The distribution FlashInfer samples from (see :class:`EngineProfile`).

        Args:
            logits: ``[V]`` float logits.
            request: the request (temperature, top-k, top-p, min-p only).
            history: output tokens before the position (no FlashInfer step reads it).

        Returns:
            ``[V]`` float64 law.

        Raises:
            ValueError: malformed inputs.
            losslessness.requests.UnsupportedRequest: greedy, penalties, biases, masks, or
                min-p with top-k or top-p.
        """
        for field, used in _UNSUPPORTED:
            if used(request):
                raise steps.unsupported(ENGINE, field, "FlashInfer's samplers take no such input")
        if request.greedy:
            raise steps.unsupported(ENGINE, "temperature", "0 (FlashInfer has no greedy sampler)")
        filters = request.top_k is not None or request.top_p is not None
        if request.min_p is not None and filters:
            raise steps.unsupported(
                ENGINE, "min_p", "min_p_sampling_from_probs takes no top-k or top-p"
            )
        scores = steps.check_position(logits, request, history) / request.temperature
        if request.min_p is not None:
            probs = steps.finish(scores)
            keep = min_p_keep(probs, request.min_p)
        elif self.joint:
            probs = steps.finish(scores)
            keep = joint_keep(probs, request.top_k, request.top_p)
        else:
            if request.top_k is not None:
                scores = torch.where(
                    top_k_value_keep(scores, request.top_k), scores, steps.MINUS_INF
                )
            probs = steps.finish(scores)
            keep = joint_keep(probs, None, request.top_p)
        kept = torch.where(keep, probs, 0.0)
        return kept / kept.sum()


_SOURCE = (
    "flashinfer-ai/flashinfer fb28d7242b3506a2348265962041acc1fb56cca4 (nightly-v0.6.18): "
    "flashinfer/sampling.py (top_k_top_p_sampling_from_logits, min_p_sampling_from_probs), "
    "include/flashinfer/sampling.cuh (TopKTopPSamplingFromProbKernel, "
    "TopPSamplingFromProbKernel, MinPSamplingFromProbKernel)"
)

FLASHINFER = register(FlashInferProfile(name="flashinfer", source=_SOURCE, joint=False))
"""The registered ``flashinfer`` profile (``filter_apply_order="top_k_first"``)."""

FLASHINFER_JOINT = register(
    FlashInferProfile(name="flashinfer-joint", source=_SOURCE, joint=True)
)
"""The registered ``flashinfer-joint`` profile (``filter_apply_order="joint"``)."""
