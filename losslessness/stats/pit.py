"""The randomized probability integral transform (PIT) of draws from discrete laws, and its
histogram: many small samples from *different* laws pooled into one exact identity test.

A token x drawn from a law p over ``[0, V)`` is mapped to ``u = F(x-) + v p(x)``, with ``F(x-)``
the mass of the tokens before x in a fixed order and ``v ~ U(0, 1)`` drawn independently
(Brockwell 2007, "Universal residuals: a multivariate transformation", Stat. Probab. Lett.
77(14), 1473-1478, eq. (1); Czado, Gneiting & Held 2009, "Predictive model assessment for count
data", Biometrics 65(4), 1254-1261, section 2.1). The intervals ``[F(x-), F(x-) + p(x))``
partition [0, 1) with lengths p(x), so u is *exactly* U(0, 1) when x ~ p, whatever p. When each
draw follows its own law given everything drawn before it (the next token at a tree node, given
the path that reached the node), the u's are i.i.d. U(0, 1), so their histogram over
:data:`PIT_CELLS` equal cells is multinomial with equal cell probabilities: one identity test
(:func:`losslessness.stats.identity_test`) over draws from thousands of laws that each have
too few draws for a test of their own.

The order is decreasing p (ties by token index): a law that drops the tail of p (a top-k
truncation) or sharpens or flattens it (a wrong temperature) moves u towards 0 or 1. A
deviation that only exchanges mass between tokens of nearly equal p moves u little: the test's
minimum detectable TV is the TV distance of the *histogram of u* from uniform, which is at most
the TV distance of the draws' laws from p (never more).
"""

from __future__ import annotations

import numpy as np

from losslessness.stats.identity import as_probs

__all__ = ["PIT_CELLS", "mass_before", "pit_histogram", "randomized_pit"]

PIT_CELLS = 10
"""Equal cells of the PIT histogram (10: at the battery's sample sizes a finer histogram costs
power against a spread deviation, ``identity_minimum_detectable_tv`` of the uniform law)."""


def mass_before(probs: np.ndarray) -> np.ndarray:
    """``F(x-)`` for every token x: the mass of the tokens that come before x in decreasing p
    (ties by token index).

    Args:
        probs: ``[V]`` probabilities (validated as :func:`losslessness.stats.identity.as_probs`
            does: finite, non-negative, summing to 1).

    Returns:
        ``[V]`` float64, ``F(x-)`` in [0, 1).

    Raises:
        ValueError: ``probs`` not a probability vector (named as ``probs``).
    """
    p = as_probs(probs, "probs")
    order = np.lexsort((np.arange(p.size), -p))
    before = np.empty_like(p)
    before[order] = np.concatenate(([0.0], np.cumsum(p[order])[:-1]))
    return before


def randomized_pit(before: np.ndarray, mass: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """``u = F(x-) + v p(x)`` for draws x, given ``F(x-)`` and ``p(x)`` of each draw.

    Args:
        before: ``[n]`` float64 ``F(x-)`` of each draw (:func:`mass_before` at x).
        mass: ``[n]`` float64 ``p(x)`` of each draw, > 0.
        uniforms: ``[n]`` float64 independent U(0, 1) draws ``v``.

    Returns:
        ``[n]`` float64 in [0, 1], U(0, 1) for draws that follow their laws.

    Raises:
        ValueError: the arrays' shapes differ, or a ``mass`` is not positive or a ``uniforms``
            value lies outside [0, 1] (named).
    """
    before, mass, uniforms = (np.asarray(a, dtype=np.float64) for a in (before, mass, uniforms))
    if not before.shape == mass.shape == uniforms.shape or before.ndim != 1:
        raise ValueError(
            f"before, mass, uniforms: must be 1-D of one shape, got {before.shape}, "
            f"{mass.shape}, {uniforms.shape}"
        )
    if np.any(~(mass > 0)):
        raise ValueError("mass: every draw's probability must be > 0 (a draw with p = 0 is a "
                         "violation for an exact check, not a PIT)")
    if np.any(~((uniforms >= 0) & (uniforms <= 1))):
        raise ValueError("uniforms: must lie in [0, 1]")
    return np.minimum(before + uniforms * mass, 1.0)


def pit_histogram(u: np.ndarray, cells: int = PIT_CELLS) -> np.ndarray:
    """``[cells]`` int64 counts of ``u`` in the equal cells ``[j/cells, (j+1)/cells)`` (1.0 in
    the last).

    Raises:
        ValueError: ``cells`` < 2, or a ``u`` outside [0, 1] (named).
    """
    if cells < 2:
        raise ValueError(f"cells: must be >= 2, got {cells}")
    values = np.asarray(u, dtype=np.float64)
    if np.any(~((values >= 0) & (values <= 1))):
        raise ValueError("u: must lie in [0, 1]")
    index = np.minimum((values * cells).astype(np.int64), cells - 1)
    counts: np.ndarray = np.bincount(index, minlength=cells).astype(np.int64)
    return counts
