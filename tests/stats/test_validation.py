"""Tests of the statistics layer's shared argument validation: every helper returns a plain
Python number and raises ValueError naming the argument."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from losslessness.stats.validation import (
    RATE_CLIP_TOLERANCE,
    check_expected_floor,
    check_nonnegative_int,
    check_open_unit_interval,
    check_rate,
    check_real,
    check_tv,
)


def test_values_in_range_come_back_as_plain_python_numbers() -> None:
    """numpy scalars are converted, so callers compute with plain ints and floats."""
    assert type(check_nonnegative_int(np.int64(7), "n")) is int
    assert check_nonnegative_int(0, "n") == 0
    assert type(check_real(np.float32(0.5), "x")) is float
    assert check_open_unit_interval(np.float64(0.25), "alpha") == 0.25
    assert check_tv(1, "tv") == 1.0
    assert check_expected_floor(0) == 0.0


def test_a_rate_just_outside_the_unit_interval_is_clipped_to_its_end() -> None:
    """Round-off in sum(min(p, q)) may put a rate a hair outside [0, 1]: it is clipped."""
    assert check_rate(1.0 + RATE_CLIP_TOLERANCE / 2, "rate") == 1.0
    assert check_rate(-RATE_CLIP_TOLERANCE / 2, "rate") == 0.0
    assert check_rate(0.3, "rate") == 0.3


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: check_nonnegative_int(True, "n_a"), r"n_a: must be a non-negative .*, got a bool"),
        (lambda: check_nonnegative_int(2.0, "n"), r"n: must be a non-negative integer, got float"),
        (lambda: check_nonnegative_int(-1, "df"), r"df: must be a non-negative integer, got -1"),
        (lambda: check_real("0.1", "x"), r"x: must be a real number, got str"),
        (lambda: check_real(np.bool_(True), "x"), r"x: must be a real number"),
        (lambda: check_real(math.nan, "x"), r"x: must be finite, got nan"),
        (lambda: check_open_unit_interval(1.0, "power"), r"power: must lie in the open interval"),
        (lambda: check_open_unit_interval(0, "alpha"), r"alpha: must lie in the open interval"),
        (lambda: check_rate(1.1, "bound"), r"bound: must lie in \[0, 1\], got 1.1"),
        (lambda: check_tv(0.0), r"tv: must lie in \(0, 1\], got 0.0"),
        (lambda: check_tv(math.inf, "shift"), r"shift: must be finite"),
        (lambda: check_expected_floor(-1.0), r"expected_floor: must be >= 0, got -1.0"),
    ],
)
def test_invalid_values_raise_value_error_naming_the_argument(
    call: Callable[[], object], message: str
) -> None:
    """Each helper raises ValueError whose message starts with the argument's name."""
    with pytest.raises(ValueError, match=message):
        call()
