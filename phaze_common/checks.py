"""Checks of user input, shared by every layer: each returns the value it checked (converted where
it says so) or raises `InputError` with one line that names the field, what is allowed and what was
given, e.g. `num_devices: must be a positive integer at most 1,048,576, got 0`.

A bool is never a number here (Python's `True == 1` would pass `width: true` as 1), nor are NaN and
the infinities. Checks with side effects (files, imports, sockets) are not here: they belong to the
command that needs them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


class InputError(ValueError):
    """Wrong input; the message is one line that names the field and what is allowed."""


def is_integer(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """An int (not a bool) or a finite float."""
    return is_integer(value) or (isinstance(value, float) and math.isfinite(value))


def amount(value: float) -> str:
    """A limit as people read it: 1,048,576 (a count, seconds) or 1e+15 (a float this large)."""
    return f"{value:g}" if isinstance(value, float) and value >= 1e7 else f"{value:,.0f}"


def integer(field: str, value: object, low: int | None = None, high: int | None = None) -> int:
    """An integer in [low, high] (None: unbounded on that side)."""
    if not is_integer(value) or (low is not None and value < low) or (high is not None and value > high):
        if low is not None and high is not None:
            bound = f"an integer in [{low}, {high}]"
        elif low is not None:
            bound = f"an integer >= {low}"
        else:
            bound = "an integer" if high is None else f"an integer <= {high}"
        raise InputError(f"{field}: must be {bound}, got {value!r}")
    return value


def positive_integer(field: str, value: object, maximum: int | None = None) -> int:
    """An integer >= 1 (at most `maximum`)."""
    if not is_integer(value) or value <= 0 or (maximum is not None and value > maximum):
        limit = "" if maximum is None else f" at most {amount(maximum)}"
        raise InputError(f"{field}: must be a positive integer{limit}, got {value!r}")
    return value


def power_of_two(field: str, value: object) -> int:
    """A positive power of two (1, 2, 4, ...)."""
    if not is_integer(value) or value <= 0 or value & (value - 1):
        raise InputError(f"{field}: must be a positive power of two (1, 2, 4, ...), got {value!r}")
    return value


def positive_number(field: str, value: object, unit: str = "", maximum: float | None = None) -> float:
    """A finite number > 0 (at most `maximum`), as a float; `unit` names what it counts."""
    if not is_number(value) or value <= 0 or (maximum is not None and value > maximum):
        what = f" {unit}" if unit else ""
        allowed = (f"a finite positive number of{what}" if unit else "a finite number > 0") if maximum is None else (
            f"a finite number in (0, {amount(maximum)}]{what}")
        raise InputError(f"{field}: must be {allowed}, got {value!r}")
    return float(value)


def non_negative_number(field: str, value: object) -> float:
    """A finite number >= 0, as a float."""
    if not is_number(value) or value < 0:
        raise InputError(f"{field}: must be a finite number >= 0, got {value!r}")
    return float(value)


def fraction(field: str, value: object, closed_at_zero: bool = False) -> float:
    """A number in (0, 1], or [0, 1) with `closed_at_zero` (a gap, a dropout rate)."""
    if closed_at_zero:
        if not is_number(value) or not 0 <= value < 1:
            raise InputError(f"{field}: must be a number in [0, 1), got {value!r}")
    elif not is_number(value) or not 0 < value <= 1:
        raise InputError(f"{field}: must be in (0, 1], got {value!r}")
    return float(value)


def boolean(field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{field}: must be true or false, got {value!r}")
    return value


def choice(field: str, value: object, allowed: Sequence[str]) -> str:
    """One of `allowed`."""
    if not isinstance(value, str) or value not in allowed:
        raise InputError(f"{field}: unknown {value!r}; allowed: {', '.join(allowed)}")
    return value


def text(field: str, value: object) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise InputError(f"{field}: must be a non-empty text, got {value!r}")
    return value


def values(field: str, value: object) -> list:
    """A scalar or a list (any iterable but a string or a mapping), as a non-empty list."""
    found = list(value) if isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict)) else [value]
    if not found:
        raise InputError(f"{field}: must be a value or a non-empty list")
    return found


def unknown_fields(where: str, given: Iterable[str], allowed: Sequence[str]) -> None:
    """InputError for the first of `given` not in `allowed` (in sorted order)."""
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r}; allowed: {', '.join(allowed)}")
