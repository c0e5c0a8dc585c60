"""Inverse-CDF sampling from probability rows with explicit uniforms.

A uniform ``u`` in ``[0, 1)`` maps to the first token whose cumulative mass exceeds
``u * total`` (``torch.searchsorted(..., right=True)``); tokens with zero mass are never
returned. The answer depends only on the cumulative table and ``u``, so drawing against one
table shared by many draws (:func:`sample_inverse_cdf_from_tables`) and against a per-draw
copy of that table (:func:`sample_inverse_cdf`) give identical tokens.
"""

from __future__ import annotations

import torch


def compute_dtype(device: torch.device) -> torch.dtype:
    """The floating-point dtype the reference computes in on ``device``.

    float64 everywhere it exists; Apple's MPS backend has no float64, so float32 there (the CPU
    float64 path stays the ground truth).

    Args:
        device: where the computation runs.

    Returns:
        ``torch.float64``, or ``torch.float32`` on ``mps``.
    """
    return torch.float32 if device.type == "mps" else torch.float64


def _label_dtype(n_labels: int) -> torch.dtype:
    """The narrowest signed integer dtype holding labels ``0 .. n_labels - 1``."""
    for dtype in (torch.int8, torch.int16, torch.int32):
        if n_labels - 1 <= torch.iinfo(dtype).max:
            return dtype
    return torch.int64


def _resolve_overflow(index: torch.Tensor, probs: torch.Tensor, table: torch.Tensor | None) -> None:
    """``u * total`` can round up to ``total`` itself: the last positive-mass token is then the
    answer. Fixes ``index`` ([N], in place) where it fell past the end of its row."""
    vocab = probs.shape[-1]
    overflow = index >= vocab
    if not bool(overflow.any()):
        return
    positions = torch.arange(vocab, device=probs.device)
    last = torch.where(probs > 0, positions, -1).max(dim=-1).values
    if table is not None:
        last = last[table]
    index.copy_(torch.where(overflow, last, index))


def sample_inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Draw one token per uniform by inverting the cumulative distribution.

    The row need not be normalised; the draw is computed in float64 (float32 on ``mps``).

    Args:
        probs: ``[V]`` (one table shared by every draw) or ``[N, V]`` (one row per draw),
            non-negative with a positive sum.
        uniforms: ``[N]`` float in ``[0, 1)``, on the device of ``probs``.

    Returns:
        ``[N]`` int64 token ids in ``[0, V)``, on the device of ``probs``.
    """
    dtype = compute_dtype(probs.device)
    cdf = probs.to(dtype).cumsum(dim=-1)
    u = uniforms.to(dtype)
    if cdf.dim() == 1:
        index = torch.searchsorted(cdf, u * cdf[-1], right=True)
        _resolve_overflow(index, probs.unsqueeze(0), torch.zeros_like(index))
    else:
        targets = (u * cdf[:, -1]).unsqueeze(1)
        index = torch.searchsorted(cdf, targets, right=True).squeeze(1)
        _resolve_overflow(index, probs, None)
    return index


def sample_inverse_cdf_from_tables(
    probs: torch.Tensor, table: torch.Tensor, uniforms: torch.Tensor
) -> torch.Tensor:
    """Draw one token per uniform, draw ``n`` from the distribution ``probs[table[n]]``.

    One cumulative table per distribution, shared by every draw that uses it, instead of a
    copy per draw: ``T`` cumulative sums and ``N`` binary searches instead of ``N`` cumulative
    sums, so many draws from a few distributions cost ``O(T V + N log V)``. The tokens equal
    ``sample_inverse_cdf(probs[table], uniforms)`` exactly.

    Args:
        probs: ``[T, V]`` non-negative rows with positive sums (need not be normalised).
        table: ``[N]`` int64 in ``[0, T)``, which row each draw uses.
        uniforms: ``[N]`` float in ``[0, 1)``.

    Returns:
        ``[N]`` int64 token ids in ``[0, V)``, on the device of ``probs``.
    """
    dtype = compute_dtype(probs.device)
    cdf = probs.to(dtype).cumsum(dim=-1)
    index = search_grouped(cdf, table, uniforms.to(dtype) * cdf[table, -1])
    _resolve_overflow(index, probs, table)
    return index


def search_grouped(cdf: torch.Tensor, table: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """For every draw n, the first index j with ``cdf[table[n], j] > targets[n]``.

    Groups the draws by table (a stable sort of small integers), searches each group in its
    own row and scatters back: ``N`` binary searches and no per-table pass over all ``N``
    draws. Sorting the narrowest integer type that holds the labels gives the same
    permutation, about 3x faster than int64.

    Args:
        cdf: ``[T, V]`` float, non-decreasing rows.
        table: ``[N]`` int64 in ``[0, T)``.
        targets: ``[N]`` float, the dtype of ``cdf``.

    Returns:
        ``[N]`` int64 in ``[0, V]``; ``V`` where no entry of the row exceeds the target (the
        caller resolves it).
    """
    order = torch.argsort(table.to(_label_dtype(cdf.shape[0])), stable=True)
    sizes = torch.bincount(table, minlength=cdf.shape[0]).tolist()
    groups = torch.split(targets[order], sizes)
    found = [torch.searchsorted(cdf[row], group, right=True) for row, group in enumerate(groups)]
    index = torch.empty_like(table)
    index[order] = torch.cat(found)
    return index
