"""Hypothesis strategy for sampling parameters (temperature, top-k, top-p, min-p).

:class:`SamplingParameters` and :func:`apply_sampling_parameters` (the filters' order and exact
float64 effect) live in :mod:`losslessness.reference.processing`, the one implementation the
reference spec-decode loop also uses; they are re-exported here.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from losslessness.reference.processing import SamplingParameters, apply_sampling_parameters
from strategies._common import check_float, check_int, label, log_uniform

__all__ = [
    "MIN_P_RANGE",
    "SAMPLING_TEMPERATURE_RANGE",
    "TOP_P_RANGE",
    "SamplingParameters",
    "apply_sampling_parameters",
    "sampling_parameters",
]

SAMPLING_TEMPERATURE_RANGE = (0.05, 2.0)
"""Range of the temperature drawn by :func:`sampling_parameters` (log-uniform; 1.0 is drawn
on its own a quarter of the time)."""

TOP_P_RANGE = (0.05, 1.0)
"""Range of ``top_p`` drawn by :func:`sampling_parameters`."""

MIN_P_RANGE = (0.0, 0.5)
"""Range of ``min_p`` drawn by :func:`sampling_parameters`."""

DEFAULT_MAX_TOP_K = 64
"""Default largest ``top_k`` drawn by :func:`sampling_parameters`."""


def sampling_parameters(
    *,
    max_top_k: int = DEFAULT_MAX_TOP_K,
    temperature_range: tuple[float, float] = SAMPLING_TEMPERATURE_RANGE,
) -> SearchStrategy[SamplingParameters]:
    """Sampling parameters as users set them: each filter on or off (None) half the time.

    The temperature is 1.0 a quarter of the time, else log-uniform in ``temperature_range``;
    ``top_k`` in ``[1, max_top_k]``, ``top_p`` in :data:`TOP_P_RANGE`, ``min_p`` in
    :data:`MIN_P_RANGE`. Each draw reports ``event("sampling: top-k")`` (``top-p``,
    ``min-p``, ``temperature != 1``) for each filter that is on, or ``"sampling: temperature
    1 only"``.

    Args:
        max_top_k: largest ``top_k``, an int ``>= 1``.
        temperature_range: ``(low, high)`` with ``0 < low <= high``, finite.

    Returns:
        A strategy of frozen :class:`SamplingParameters`.

    Raises:
        hypothesis.errors.InvalidArgument: eagerly, naming ``max_top_k`` or
            ``temperature_range``.
    """
    top_k_bound = check_int(max_top_k, "max_top_k", 1)
    if not isinstance(temperature_range, tuple) or len(temperature_range) != 2:
        raise InvalidArgument(
            f"temperature_range={temperature_range!r} must be a (low, high) tuple"
        )
    low = check_float(temperature_range[0], "temperature_range", 0.0, 1e6, open_minimum=True)
    high = check_float(temperature_range[1], "temperature_range", low, 1e6)

    @st.composite
    def parameters(draw: st.DrawFn) -> SamplingParameters:
        unit = draw(st.integers(0, 3)) == 0
        temperature = 1.0 if unit else log_uniform(draw, low, high)
        top_k = draw(st.none() | st.integers(1, top_k_bound))
        top_p = draw(st.none() | st.floats(*TOP_P_RANGE, exclude_min=True))
        min_p = draw(st.none() | st.floats(*MIN_P_RANGE))
        active = [
            name
            for name, on in (
                ("temperature != 1", temperature != 1.0),
                ("top-k", top_k is not None),
                ("top-p", top_p is not None),
                ("min-p", min_p is not None),
            )
            if on
        ]
        for name in active:
            label(f"sampling: {name}")
        if not active:
            label("sampling: temperature 1 only")
        return SamplingParameters(temperature, top_k, top_p, min_p)

    return parameters()
