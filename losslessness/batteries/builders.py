"""Steps shared by every case builder: the batteries' and the mutant zoo's.

Each builder draws from its own seeded :class:`numpy.random.Generator` and turns rows into
the float64 tensors of :mod:`losslessness.cases` with the functions here, so that a case, and
its hash, is the same on every machine and no two builders normalise rows differently.
"""

from __future__ import annotations

import numpy as np
import torch


def normalise(rows: np.ndarray) -> np.ndarray:
    """``rows`` divided by their sums over the last axis.

    Args:
        rows: ``[..., V]`` float rows with positive sums.

    Returns:
        An array of the same shape whose rows sum to 1 (float64 for float64 input).
    """
    normalised: np.ndarray = rows / rows.sum(axis=-1, keepdims=True)
    return normalised


MANTISSA_BITS = 24
"""Bits of mantissa :func:`portable` keeps (float32's precision, float64's range)."""


def portable(values: np.ndarray) -> np.ndarray:
    """``values`` with each mantissa rounded to :data:`MANTISSA_BITS` bits, exponent kept.

    numpy's and torch's ``exp`` differ in the last bit between their SIMD kernels (AVX-512 or
    AVX2, chosen at run time by the CPU: the ``v1000-peaked`` case's p differed between two
    x86-64 machines), and a case's hash, from which its seeds derive, reads every bit. Rounded,
    a one-ulp difference changes a value with probability about ``2**-28``, so a case, its seeds
    and its replay line are the same on every machine.

    Args:
        values: float64 array, any shape (0 and infinities pass unchanged).

    Returns:
        A float64 array of the same shape.
    """
    mantissa, exponent = np.frexp(values)
    scaled = np.round(mantissa * 2.0**MANTISSA_BITS)
    rounded: np.ndarray = np.ldexp(scaled, exponent - MANTISSA_BITS)
    return rounded


def softmax(logits: np.ndarray) -> np.ndarray:
    """The softmax over the last axis, shifted by each row's maximum (no overflow), with
    :func:`portable` exponentials: the same bits on every machine.

    Args:
        logits: ``[..., V]`` float64 logits, each row with a finite maximum (``-inf`` entries
            get probability 0).

    Returns:
        ``[..., V]`` float64 probabilities, each row summing to 1.
    """
    return normalise(portable(np.exp(logits - logits.max(axis=-1, keepdims=True))))


def mix(p: np.ndarray, other: np.ndarray, weight: float) -> np.ndarray:
    """``(1 - weight) p + weight other``: a draft row ``weight`` of the way from p to ``other``.

    Args:
        p, other: ``[V]`` float64 rows. weight: in [0, 1].
    """
    return (1.0 - weight) * p + weight * other


def dirichlet_rows(
    rng: np.random.Generator, count: int, vocab: int, concentration: float
) -> np.ndarray:
    """``[count, V]`` float64 rows drawn from a symmetric Dirichlet(``concentration``).

    Args:
        rng: the builder's generator (advanced by the draw).
        count: rows. vocab: V. concentration: the Dirichlet parameter of every token.
    """
    rows: np.ndarray = rng.dirichlet(np.full(vocab, concentration), size=count)
    return rows


def probs_tensor(rows: list[np.ndarray] | np.ndarray) -> torch.Tensor:
    """Rows as a normalised float64 tensor.

    Args:
        rows: ``R`` rows of length V (a list of ``[V]`` arrays or an ``[R, V]`` array), each
            with a positive sum.

    Returns:
        ``[R, V]`` float64 tensor, each row divided by its sum.
    """
    return torch.from_numpy(normalise(np.array(rows, dtype=np.float64)))


def markov_tables(
    rng: np.random.Generator, vocab: int, depth: int, closeness: float, zeros: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A root p and q and Markov tables for a tree case: p Dirichlet(1), q a mixture of p and
    an independent Dirichlet(1) with weight ``1 - closeness``.

    Args:
        rng: the builder's generator (advanced by the draws).
        vocab: V. depth: the tree's depth D.
        closeness: weight of p in q (1: q equals p).
        zeros: cells of every p row set to 0 (q keeps them positive), then p renormalised.

    Returns:
        ``(root_p [V], root_q [V], target [D, V, V], draft [D, V, V])`` float64 tensors.
    """
    shape = (depth + 1, vocab, vocab)
    p = rng.dirichlet(np.ones(vocab), size=shape[:2])
    other = rng.dirichlet(np.ones(vocab), size=shape[:2])
    q = normalise(closeness * p + (1 - closeness) * other)
    if zeros:
        for index in np.ndindex(*shape[:2]):
            p[index][rng.choice(vocab, size=zeros, replace=False)] = 0.0
        p = normalise(p)
    as_tensor = torch.from_numpy
    return (as_tensor(p[0, 0]).clone(), as_tensor(q[0, 0]).clone(),
            as_tensor(p[1:]).clone(), as_tensor(q[1:]).clone())


def softmax_markov_tables(
    rng: np.random.Generator, vocab: int, depth: int, scale: float, draft_noise: float,
    rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A root p and q and Markov tables shaped like a language model's next-token laws: every
    p row the softmax of i.i.d. normal logits times ``scale`` (a peaked head and a long tail:
    at V = 1024 and scale 3 the top token holds about 0.25 and the tokens outside the top 10
    about 0.37), q the softmax of the same logits plus normal noise of sd ``draft_noise`` (a
    draft model that agrees with the target up to noise).

    Args:
        rng: the builder's generator (advanced by the draws).
        vocab: V. depth: the tree's depth D.
        scale: sd of the target's logits (larger: more peaked).
        draft_noise: sd of the noise added to the target's logits for q (0: q equals p).
        rows: S, the table rows per depth (None: V, one per token); a case maps tokens to
            rows with :attr:`losslessness.cases.TreeCase.token_rows`.

    Returns:
        ``(root_p [V], root_q [V], target [D, S, V], draft [D, S, V])`` float64 tensors, every
        cell positive.
    """
    logits = rng.normal(size=(depth + 1, vocab if rows is None else rows, vocab)) * scale
    noisy = logits + rng.normal(size=logits.shape) * draft_noise
    p, q = softmax(logits), softmax(noisy)
    as_tensor = torch.from_numpy
    return (as_tensor(p[0, 0]).clone(), as_tensor(q[0, 0]).clone(),
            as_tensor(p[1:]).clone(), as_tensor(q[1:]).clone())


def tree_depth(parents: tuple[int, ...]) -> int:
    """Depth of the deepest node of a tree given as parents (node j+1's parent is
    ``parents[j]``, node 0 is the root): 0 for an empty tree."""
    depths = [0]
    for parent in parents:
        depths.append(depths[parent] + 1)
    return max(depths)


def batched_parents(parents: tuple[int, ...], batch: int) -> torch.Tensor:
    """``[B, N]`` int64: the same tree's parents for every tree of a batch."""
    return torch.tensor(parents, dtype=torch.int64).expand(batch, -1).contiguous()
