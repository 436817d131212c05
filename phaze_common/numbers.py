"""Rounding to significant digits that gives every element the same result whatever array it sits
in: a scalar rounded alone and the same number inside a large array round alike, so two callers
that round the same inputs (one problem, or every candidate chip at once) compute the same values.

Each step is an IEEE operation rounded correctly (a product, `rint`, a quotient) or an exact
comparison; the decimal exponent from `log10` is corrected by comparisons with exact powers of ten,
so no vectorised transcendental can move a result by one unit.
"""

from __future__ import annotations

import math

import numpy as np

#: Powers of ten 10**k for k in [-_LOWEST, _HIGHEST], each the float nearest to it.
_LOWEST, _HIGHEST = 300, 300
_POWERS = np.array([float(f"1e{k}") for k in range(-_LOWEST, _HIGHEST + 1)])


def _power(exponent: np.ndarray) -> np.ndarray:
    return _POWERS[np.clip(exponent, -_LOWEST, _HIGHEST) + _LOWEST]


def round_significant(values, digits: int) -> np.ndarray:
    """`values` rounded to `digits` significant digits (to the nearest; one within float error of a
    half-way point may go either way), as a float array of the same shape; zeros, infinities and NaN
    unchanged (numbers below 1e-290 are not rounded correctly). A number's result does not depend on
    its neighbours."""
    if not (isinstance(digits, int) and 1 <= digits <= 15):
        raise ValueError(f"digits: must be an integer in 1..15, got {digits!r}")
    x = np.asarray(values, dtype=float)
    magnitude = np.abs(x)
    regular = np.isfinite(x) & (magnitude > 0)
    safe = np.where(regular, magnitude, 1.0)
    exponent = np.floor(np.log10(safe)).astype(np.int64)
    exponent += safe >= _power(exponent + 1)
    exponent -= safe < _power(exponent)
    # scale by 10**(digits-1-e) when that power is exact (a product), else divide by its inverse
    shift = digits - 1 - exponent
    up = shift >= 0
    scale = _power(np.abs(shift))
    with np.errstate(over="ignore", invalid="ignore"):  # the branch np.where drops may overflow
        rounded = np.rint(np.where(up, x * scale, x / scale))
        return np.where(regular, np.where(up, rounded / scale, rounded * scale), x)


def round_significant_scalar(value: float, digits: int) -> float:
    """`round_significant` of one number, in plain floats: the same steps (exact comparisons, one
    correctly rounded product or quotient, a round to even), so the same result, without numpy's
    cost per call."""
    if value == 0 or not math.isfinite(value):
        return value
    magnitude = abs(value)
    exponent = math.floor(math.log10(magnitude))
    exponent += magnitude >= _scalar_power(exponent + 1)
    exponent -= magnitude < _scalar_power(exponent)
    shift = digits - 1 - exponent
    scale = _scalar_power(abs(shift))
    return round(value * scale) / scale if shift >= 0 else round(value / scale) * scale


def _scalar_power(exponent: int) -> float:
    return float(_POWERS[min(max(exponent, -_LOWEST), _HIGHEST) + _LOWEST])
