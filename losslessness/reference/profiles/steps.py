"""The steps engine profiles compose: input checks, penalties, masks, cut-offs with stated tie
rules, the final softmax and the greedy pick.

Every step works on one position's float64 scores ``[V]`` (logits, ``-inf`` for a removed
token) or on its probabilities, and returns a new tensor; a profile is an ordered composition
of them (:mod:`losslessness.reference.profiles.vllm_v1` and its siblings cite which engine
function each step states). The temperature-free top-k (ties kept), the tie-free top-p and
min-p are :mod:`losslessness.reference.processing`'s filters, reused here.

Tie rules. Engines that cut by *rank* order tied tokens by a sort. ``torch.sort`` is stable on
CPU for short rows only (torch 2.13, CPU: a 5000-long row with ties came back in a non-stable
order), and CUDA's sorts make no promise either, so where a tie straddles a rank cut the
engine's law is implementation-defined. The steps below fix one of its possible outcomes and
say which; agreement with the engines is tested away from such ties, and the hand-computed tests
pin the stated rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from losslessness.reference.processing import min_p_filter, top_k_filter, top_p_filter
from losslessness.requests import Request, UnsupportedRequest

__all__ = [
    "MINUS_INF",
    "NoTokenLeft",
    "add_logit_bias",
    "check_position",
    "finish",
    "frequency_presence_penalties",
    "greedy_one_hot",
    "keep_only",
    "mask_min_tokens",
    "mask_tokens",
    "min_p_filter",
    "repetition_penalty",
    "token_counts",
    "top_k_by_rank",
    "top_k_filter",
    "top_p_ascending_cut",
    "top_p_descending_cut",
    "top_p_filter",
    "unsupported",
]

MINUS_INF = -math.inf


def check_position(
    logits: torch.Tensor, request: Request, history: Sequence[int]
) -> torch.Tensor:
    """Validate one position's inputs and return its logits as float64.

    Args:
        logits: ``[V]`` float tensor, no NaN or ``+inf``, at least one finite entry.
        request: the request (its token ids must lie in ``[0, V)``).
        history: the output tokens before the position, ids in ``[0, V)``.

    Returns:
        ``[V]`` float64 copy of ``logits``.

    Raises:
        ValueError: naming ``logits``, ``request`` or ``history``.
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point torch.Tensor, got {type(logits)}")
    if logits.dim() != 1 or logits.shape[0] < 1:
        raise ValueError(f"logits must have shape [V] with V >= 1, got {tuple(logits.shape)}")
    scores = logits.detach().to(device="cpu", dtype=torch.float64).clone()
    if bool(torch.isnan(scores).any()) or bool((scores == math.inf).any()):
        raise ValueError("logits must contain no NaN and no +inf")
    if bool((scores == MINUS_INF).all()):
        raise ValueError("logits must have at least one finite entry")
    vocab = scores.shape[0]
    request.check_vocabulary(vocab)
    for token in history:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
            raise ValueError(f"history holds {token!r}, not a token id in [0, {vocab})")
    return scores


def unsupported(engine: str, field: str, detail: str) -> UnsupportedRequest:
    """The error a profile raises for a request field its engine lacks.

    Returns:
        An :class:`UnsupportedRequest` whose message names ``field`` and ``engine``.
    """
    return UnsupportedRequest(f"{engine} does not support the request field {field}: {detail}")


def token_counts(tokens: Iterable[int], vocab: int) -> torch.Tensor:
    """How often each id occurs in ``tokens``.

    Returns:
        ``[vocab]`` float64 counts.
    """
    counts = torch.zeros(vocab, dtype=torch.float64)
    ids = torch.tensor(list(tokens), dtype=torch.int64)
    if ids.numel():
        counts.index_add_(0, ids, torch.ones(ids.shape[0], dtype=torch.float64))
    return counts


def mask_tokens(scores: torch.Tensor, ids: Iterable[int]) -> torch.Tensor:
    """Set the scores of ``ids`` to ``-inf`` (bad tokens, stop tokens under min_tokens).

    Returns:
        ``[V]`` float64.
    """
    out = scores.clone()
    index = torch.tensor(sorted(set(ids)), dtype=torch.int64)
    if index.numel():
        out[index] = MINUS_INF
    return out


def keep_only(scores: torch.Tensor, ids: Iterable[int] | None) -> torch.Tensor:
    """Set every score outside ``ids`` to ``-inf`` (allowed token ids); None keeps all.

    Returns:
        ``[V]`` float64.
    """
    if ids is None:
        return scores
    allowed = torch.zeros(scores.shape[0], dtype=torch.bool)
    allowed[torch.tensor(sorted(set(ids)), dtype=torch.int64)] = True
    return torch.where(allowed, scores, MINUS_INF)


def add_logit_bias(scores: torch.Tensor, bias: Iterable[tuple[int, float]]) -> torch.Tensor:
    """Add each ``(token, bias)`` to its score (OpenAI's ``logit_bias``; ``-inf`` stays).

    Returns:
        ``[V]`` float64.
    """
    out = scores.clone()
    for token, value in bias:
        out[token] = out[token] + value
    return out


def repetition_penalty(scores: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019, eq. 2) on the tokens in ``seen``: a
    positive score divided by ``penalty``, any other multiplied (``0`` and ``-inf`` stay).
    vLLM, SGLang and transformers write ``where(s > 0, s / r, s * r)`` or its mirror
    ``where(s < 0, s * r, s / r)``; they agree because ``0 * r == 0 / r``.

    Args:
        scores: ``[V]`` float64.
        seen: ``[V]`` bool, the tokens the engine penalises.
        penalty: ``r > 0``.

    Returns:
        ``[V]`` float64.
    """
    penalised = torch.where(scores > 0, scores / penalty, scores * penalty)
    return torch.where(seen, penalised, scores)


def frequency_presence_penalties(
    scores: torch.Tensor, counts: torch.Tensor, frequency: float, presence: float
) -> torch.Tensor:
    """OpenAI's penalties: ``s - frequency * count - presence * (count > 0)``.

    Args:
        scores: ``[V]`` float64.
        counts: ``[V]`` float64 occurrences in the history the engine counts.
        frequency: the frequency penalty.
        presence: the presence penalty.

    Returns:
        ``[V]`` float64.
    """
    return scores - frequency * counts - presence * (counts > 0).to(torch.float64)


def mask_min_tokens(scores: torch.Tensor, request: Request, emitted: int) -> torch.Tensor:
    """Mask the request's stop tokens while fewer than ``min_tokens`` tokens were emitted.

    Args:
        scores: ``[V]`` float64.
        request: its ``min_tokens`` and ``stop_token_ids``.
        emitted: the output tokens before this position.

    Returns:
        ``[V]`` float64.
    """
    if emitted < request.min_tokens:
        return mask_tokens(scores, request.stop_token_ids)
    return scores


def top_k_by_rank(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep exactly ``min(k, V)`` tokens: the largest scores, ties at the ``k``-th broken
    toward the lower id (a stable descending sort). Engines that cut a sorted array at
    position ``k`` (SGLang's torch sampler, llama.cpp's ``llama_sampler_top_k_impl``) break such
    ties by their sort's order, which no engine specifies: this is the profile's choice.

    Args:
        scores: ``[V]`` float64.
        top_k: ``k >= 1``.

    Returns:
        ``[V]`` float64, the others ``-inf``.
    """
    order = torch.sort(scores, descending=True, stable=True).indices
    out = torch.full_like(scores, MINUS_INF)
    kept = order[: min(top_k, scores.shape[0])]
    out[kept] = scores[kept]
    return out


def top_p_ascending_cut(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p as vLLM's ``apply_top_k_top_p`` and transformers' ``TopPLogitsWarper`` write it:
    sort the scores ascending, softmax, cumulative sum, remove where it is ``<= 1 - top_p``,
    the largest always kept. In exact arithmetic a token is kept iff the mass ranked strictly
    above it is below ``top_p``. Ties: the sort is taken stable, so among tied tokens the
    lower ids rank lower and are removed first (the higher id of a tie straddling the cut is
    kept).

    Args:
        scores: ``[V]`` float64 (``-inf`` entries have mass 0 and are removed).
        top_p: in ``(0, 1]``; ``1`` keeps every finite token.

    Returns:
        ``[V]`` float64, the removed tokens ``-inf``.
    """
    if top_p >= 1.0:
        return scores
    ordered, index = torch.sort(scores, stable=True)
    cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
    remove = cumulative <= 1.0 - top_p
    remove[-1] = False
    removed = torch.zeros_like(remove).scatter(0, index, remove)
    return torch.where(removed, MINUS_INF, scores)


def top_p_descending_cut(probs: torch.Tensor, top_p: float, *, inclusive: bool) -> torch.Tensor:
    """Top-p on a descending sort of probabilities: keep a token iff the mass ranked strictly
    before it is ``< top_p`` (``inclusive=False``: llama.cpp's ``llama_sampler_top_p_apply``
    stops at the first cumulative sum ``>= p``) or ``<= top_p`` (``inclusive=True``: SGLang's
    ``top_k_top_p_min_p_sampling_from_probs_torch`` zeroes ``probs_sum - probs_sort >
    top_p``). Ties: stable descending sort, the lower id ranked first (kept first).

    Args:
        probs: ``[V]`` float64 probabilities (not necessarily normalised: the engine's
            cumulative sum is of these values as they are).
        top_p: the nucleus mass.
        inclusive: the engine's comparison, as above.

    Returns:
        ``[V]`` bool, the kept tokens (the most likely always among them).
    """
    ordered, index = torch.sort(probs, descending=True, stable=True)
    before = ordered.cumsum(dim=-1) - ordered
    keep = before <= top_p if inclusive else before < top_p
    keep[0] = True
    return torch.zeros_like(keep).scatter(0, index, keep)


class NoTokenLeft(ValueError):
    """The request's masks (allowed, bad, stop tokens under min_tokens) removed every token
    with a finite logit: no engine defines a law there (their softmax gives NaN)."""


def _check_some_token_left(scores: torch.Tensor) -> None:
    if bool((scores == MINUS_INF).all()):
        raise NoTokenLeft(
            "the request masks every token with a finite logit (allowed, bad or stop tokens): "
            "the engine's law is undefined"
        )


def finish(scores: torch.Tensor) -> torch.Tensor:
    """The law a sampler draws from after its last step: ``softmax(scores)`` in float64.

    Returns:
        ``[V]`` float64 summing to 1.

    Raises:
        NoTokenLeft: every score is ``-inf``.
    """
    _check_some_token_left(scores)
    return torch.softmax(scores, dim=-1)


def greedy_one_hot(scores: torch.Tensor) -> torch.Tensor:
    """The one-hot of ``torch.argmax(scores)`` (the first index among tied maxima, as every
    engine's greedy path here computes it on CPU).

    Returns:
        ``[V]`` float64 one-hot.

    Raises:
        NoTokenLeft: every score is ``-inf``.
    """
    _check_some_token_left(scores)
    out = torch.zeros_like(scores)
    out[int(torch.argmax(scores))] = 1.0
    return out
