"""Sampling parameters (temperature, top-k, top-p, min-p) and their exact float64 effect.

The one implementation of logits processing: the reference spec-decode loop
(:mod:`losslessness.reference.decoding`) applies it identically to target and draft, and the
Hypothesis strategies (:mod:`strategies.parameters`) draw parameters for it.

:func:`apply_sampling_parameters` turns logits ``[..., V]`` into the float64 distribution a
sampler draws from, applying the filters in the order of Hugging Face transformers'
``GenerationMixin._get_logits_processor`` (``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
``TopPLogitsWarper``, ``MinPLogitsWarper``, each with ``min_tokens_to_keep=1``):

1. **temperature** ``T > 0``: ``logits / T``;
2. **top-k**: keep every token whose scaled logit is ``>=`` the ``k``-th largest (ties at the
   ``k``-th value are all kept, as ``scores < topk(scores, k)[..., -1]`` does);
3. **top-p**: keep the most likely tokens until the mass ranked strictly before a token
   reaches ``top_p`` (transformers' "remove where the ascending cumulative mass is
   ``<= 1 - top_p``"); tokens tied with the last kept one are kept too, so the result does not
   depend on how a sort orders ties;
4. **min-p**: keep the tokens with ``prob >= min_p * max prob``, probabilities taken after the
   earlier filters;

then ``softmax`` in float64. Each filter keeps the most likely token, so at least one token
always survives. vLLM's v1 sampler applies min-p *before* top-k/top-p (it is an
argmax-invariant logits processor there); the two orders agree whenever min-p or both of
top-k/top-p are off, which is how an adapter for vLLM should draw its parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = [
    "SamplingParameters",
    "apply_sampling_parameters",
    "min_p_filter",
    "top_k_filter",
    "top_p_filter",
]

_MINUS_INF = torch.tensor(-math.inf, dtype=torch.float64)


@dataclass(frozen=True)
class SamplingParameters:
    """How a sampler reshapes logits before drawing; None turns a filter off.

    Attributes:
        temperature: ``T``, a finite float ``> 0`` (greedy decoding is a separate protocol).
        top_k: keep the ``k`` largest logits (ties at the ``k``-th kept), an int ``>= 1``.
        top_p: nucleus mass, a float in ``(0, 1]``.
        min_p: keep tokens with at least ``min_p`` times the top probability, in ``[0, 1]``.

    Raises:
        ValueError: at construction, naming the first invalid field.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self) -> None:
        temperature = self.temperature
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not (math.isfinite(temperature) and temperature > 0)
        ):
            raise ValueError(f"temperature={temperature!r} must be a finite float > 0")
        top_k = self.top_k
        if top_k is not None and (
            isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1
        ):
            raise ValueError(f"top_k={top_k!r} must be None or an int >= 1")
        for name, value, open_low in (("top_p", self.top_p, True), ("min_p", self.min_p, False)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name}={value!r} must be None or a float")
            low_ok = value > 0 if open_low else value >= 0
            if not (low_ok and value <= 1):
                raise ValueError(
                    f"{name}={value!r} must lie in {'(' if open_low else '['}0, 1] or be None"
                )


def _check_logits(logits: object) -> torch.Tensor:
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point torch.Tensor, got {type(logits)}")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have shape [..., V] with V >= 1, got {tuple(logits.shape)}")
    wide = logits.to(torch.float64)
    if bool(torch.isnan(wide).any()) or bool((wide == math.inf).any()):
        raise ValueError("logits must contain no NaN and no +inf")
    if bool((wide == -math.inf).all(dim=-1).any()):
        raise ValueError("logits must have at least one finite value in every row")
    return wide


def apply_sampling_parameters(logits: torch.Tensor, params: SamplingParameters) -> torch.Tensor:
    """The float64 distribution sampled from ``logits`` under ``params`` (order in the module
    docstring: temperature, top-k, top-p, min-p, as transformers applies them).

    Args:
        logits: ``[..., V]`` float tensor (any float dtype; converted to float64 first), no
            NaN or ``+inf``, at least one finite value per row (``-inf`` masks a token).
        params: the :class:`SamplingParameters`.

    Returns:
        ``[..., V]`` float64 tensor: non-negative rows summing to 1 within 1e-12, zero on
        ``-inf`` and on filtered tokens, at least one positive entry per row (the argmax).

    Raises:
        ValueError: naming ``logits`` when it is malformed.
    """
    scores = _check_logits(logits) / params.temperature
    if params.top_k is not None:
        scores = top_k_filter(scores, params.top_k)
    if params.top_p is not None:
        scores = top_p_filter(scores, params.top_p)
    if params.min_p is not None:
        scores = min_p_filter(scores, params.min_p)
    return torch.softmax(scores, dim=-1)


def top_k_filter(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """Top-k on float64 scores, ties at the ``k``-th value kept (step 2 of the module
    docstring; transformers' ``TopKLogitsWarper``: ``scores < topk(scores, k)[..., -1]``
    removed).

    Args:
        scores: ``[..., V]`` float64 logits (``-inf`` masks a token).
        top_k: ``k >= 1``; ``k >= V`` keeps every token.

    Returns:
        ``[..., V]`` float64, the removed tokens set to ``-inf``.
    """
    kept = min(top_k, scores.shape[-1])
    kth = torch.topk(scores, kept, dim=-1).values[..., -1:]
    return torch.where(scores < kth, _MINUS_INF, scores)


def top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p on float64 scores, every token tied with the last kept one kept (step 3 of the
    module docstring: the result does not depend on how a sort orders ties).

    Args:
        scores: ``[..., V]`` float64 logits (``-inf`` masks a token).
        top_p: the nucleus mass in ``(0, 1]``; ``1`` keeps every token.

    Returns:
        ``[..., V]`` float64, the removed tokens set to ``-inf``.
    """
    if top_p >= 1.0:
        return scores
    probs = torch.softmax(scores, dim=-1)
    ordered = probs.sort(dim=-1, descending=True).values
    before = ordered.cumsum(dim=-1) - ordered  # mass ranked strictly before each token
    keep = before < top_p
    keep[..., 0] = True
    cutoff = torch.where(keep, ordered, torch.ones_like(ordered)).amin(dim=-1, keepdim=True)
    return torch.where(probs < cutoff, _MINUS_INF, scores)


def min_p_filter(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    """Min-p on float64 scores: remove the tokens whose probability (softmax of ``scores``) is
    below ``min_p`` times the largest (step 4 of the module docstring; transformers'
    ``MinPLogitsWarper``).

    Args:
        scores: ``[..., V]`` float64 logits (``-inf`` masks a token).
        min_p: in ``[0, 1]``; ``0`` keeps every token.

    Returns:
        ``[..., V]`` float64, the removed tokens set to ``-inf``.
    """
    if min_p <= 0.0:
        return scores
    probs = torch.softmax(scores, dim=-1)
    floor = min_p * probs.amax(dim=-1, keepdim=True)
    return torch.where(probs < floor, _MINUS_INF, scores)
