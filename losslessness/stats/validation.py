"""Argument validation shared by the statistics layer.

Every statistics function validates its scalar arguments eagerly, before any computation, with
these helpers, so that a wrong argument fails with the same message wherever it is passed:
``ValueError("<name>: must ..., got ...")``, naming the argument. Each helper returns the value
converted to a plain Python ``int`` or ``float`` (numpy scalars included), so callers compute
with plain numbers.

Booleans are refused wherever a number is expected: ``bool`` is an ``int`` subclass, and a
``True`` sample size or level is almost surely a bug.
"""

from __future__ import annotations

import math
import operator

import numpy as np

__all__ = [
    "RATE_CLIP_TOLERANCE",
    "check_expected_floor",
    "check_nonnegative_int",
    "check_open_unit_interval",
    "check_rate",
    "check_real",
    "check_tv",
]

RATE_CLIP_TOLERANCE = 1e-12
"""Expected rates this far outside [0, 1] are clipped (float round-off in ``sum(min(p, q))``)."""


def check_real(value: object, name: str) -> float:
    """``value`` as a finite float.

    Raises:
        ValueError: naming ``name``, when ``value`` is a bool, not a real number, NaN or
            infinite.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise ValueError(f"{name}: must be a real number, got {type(value).__name__}")
    result = float(value)
    if not math.isfinite(result):
        raise ValueError(f"{name}: must be finite, got {result!r}")
    return result


def check_nonnegative_int(value: object, name: str) -> int:
    """``value`` (a Python or numpy integer) as a Python int >= 0: sample sizes, counts,
    degrees of freedom.

    Raises:
        ValueError: naming ``name``, when ``value`` is a bool, not an integer, or negative.
    """
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}: must be a non-negative integer, got a bool")
    if not isinstance(value, (int, np.integer)):
        raise ValueError(
            f"{name}: must be a non-negative integer, got {type(value).__name__} {value!r}"
        )
    result = operator.index(value)
    if result < 0:
        raise ValueError(f"{name}: must be a non-negative integer, got {result}")
    return int(result)


def check_open_unit_interval(value: object, name: str) -> float:
    """``value`` as a float in the open interval (0, 1): significance levels and power.

    Raises:
        ValueError: naming ``name``, when ``value`` is not a finite real number
            (:func:`check_real`) or lies outside (0, 1).
    """
    result = check_real(value, name)
    if not 0.0 < result < 1.0:
        raise ValueError(f"{name}: must lie in the open interval (0, 1), got {result!r}")
    return result


def check_rate(value: object, name: str) -> float:
    """``value`` as a rate (a probability) in [0, 1]; values within
    :data:`RATE_CLIP_TOLERANCE` outside it are clipped to the nearest end.

    Raises:
        ValueError: naming ``name``, when ``value`` is not a finite real number
            (:func:`check_real`) or lies further outside [0, 1].
    """
    rate = check_real(value, name)
    if not -RATE_CLIP_TOLERANCE <= rate <= 1.0 + RATE_CLIP_TOLERANCE:
        raise ValueError(f"{name}: must lie in [0, 1], got {rate!r}")
    return min(max(rate, 0.0), 1.0)


def check_tv(value: object, name: str = "tv") -> float:
    """``value`` as a TV distance in (0, 1]: a design discrepancy a test is sized to detect.

    Raises:
        ValueError: naming ``name``, when ``value`` is not a finite real number
            (:func:`check_real`) or lies outside (0, 1].
    """
    tv = check_real(value, name)
    if not 0.0 < tv <= 1.0:
        raise ValueError(f"{name}: must lie in (0, 1], got {tv!r}")
    return tv


def check_expected_floor(value: object) -> float:
    """``value`` as a pooling floor (an expected count >= 0, the argument ``expected_floor``).

    Raises:
        ValueError: naming ``expected_floor``, when ``value`` is not a finite real number
            (:func:`check_real`) or is negative.
    """
    result = check_real(value, "expected_floor")
    if result < 0.0:
        raise ValueError(f"expected_floor: must be >= 0, got {result!r}")
    return result
