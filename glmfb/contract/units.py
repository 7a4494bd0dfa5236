"""The small value syntaxes users type, parsed: ``5%``, ``0.05``, ``500ms``, ``100Hz``, ``8x4096``.

Each parser takes what a user wrote (a command-line string, or a TOML string, number or
boolean) and returns the value, or raises :class:`OptionValueError` with the problem and what
to write instead. :mod:`glmfb.contract.options` ties them to declared options.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any


class OptionValueError(ValueError):
    """A value that does not parse: ``problem`` and what to write instead (``hint``)."""

    def __init__(self, problem: str, hint: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.hint = hint


def parse_number(raw: Any, what: str = "a number", hint: str = "write a number") -> float:
    """A finite number from a number or a string."""
    if isinstance(raw, bool):
        raise OptionValueError(f"expected {what}, got {raw!r}", hint)
    if isinstance(raw, (int, float)):
        value = float(raw)
    else:
        try:
            value = float(str(raw).strip())
        except ValueError:
            raise OptionValueError(f"{raw!r} is not {what}", hint) from None
    if not math.isfinite(value):
        raise OptionValueError(f"{raw!r} is not a finite number", hint)
    return value


def parse_fraction(raw: Any) -> float:
    """``"5%"`` or ``0.05`` -> 0.05. A bare number of 1 or more is ambiguous and refused."""
    hint = "write 5% or 0.05"
    if isinstance(raw, str) and raw.strip().endswith("%"):
        value = parse_number(raw.strip()[:-1], "a percentage", hint) / 100.0
    else:
        value = parse_number(raw, "a fraction", hint)
        if value >= 1.0:
            percent = f"{value:g}%"
            raise OptionValueError(
                f"{raw!r} is ambiguous: a fraction is below 1",
                f"write {percent} or {value / 100:g} (or {value * 100:g}% if you meant {value:g}x)",
            )
    if value < 0:
        raise OptionValueError(f"{raw!r} is negative", hint)
    return value


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zµ]*)\s*$")
_DURATION_UNITS_S = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0,
                     "m": 60.0, "h": 3600.0}


def _duration(raw: Any, bare_unit_s: float, bare_name: str) -> float:
    """A duration in seconds: ``"500ms"``, ``"2s"``, ``"1.5min"``, or a bare number in the
    option's own unit (``bare_unit_s`` seconds each)."""
    hint = f"write it with a unit, e.g. 500ms, 2s, 1.5min (a bare number is {bare_name})"
    if isinstance(raw, bool):
        raise OptionValueError(f"expected a duration, got {raw!r}", hint)
    if isinstance(raw, (int, float)):
        seconds = float(raw) * bare_unit_s
    else:
        match = _DURATION.match(str(raw).lower())
        if match is None:
            raise OptionValueError(f"{raw!r} is not a duration", hint)
        number, unit = float(match.group(1)), match.group(2)
        if unit and unit not in _DURATION_UNITS_S:
            raise OptionValueError(f"{raw!r}: unknown unit {unit!r}", hint)
        seconds = number * (_DURATION_UNITS_S[unit] if unit else bare_unit_s)
    if not math.isfinite(seconds) or seconds < 0:
        raise OptionValueError(f"{raw!r} is not a non-negative duration", hint)
    return seconds


def parse_seconds(raw: Any) -> float:
    """A duration in seconds (a bare number is seconds)."""
    return _duration(raw, 1.0, "seconds")


def parse_milliseconds(raw: Any) -> float:
    """A duration in milliseconds (a bare number is milliseconds)."""
    return _duration(raw, 1e-3, "milliseconds") * 1e3


def parse_hertz(raw: Any) -> float:
    text = str(raw).strip().lower() if isinstance(raw, str) else raw
    if isinstance(text, str):
        scale = 1.0
        if text.endswith("khz"):
            text, scale = text[:-3], 1e3
        elif text.endswith("hz"):
            text = text[:-2]
        return parse_number(text, "a rate", "write it in Hz, e.g. 100 or 100Hz") * scale
    return parse_number(text, "a rate", "write it in Hz, e.g. 100 or 100Hz")


def parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise OptionValueError(f"expected true or false, got {raw!r}", "write true or false")


def parse_int(raw: Any) -> int:
    if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
        raise OptionValueError(f"expected an integer, got {raw!r}", "write a whole number")
    if isinstance(raw, (int, float)):
        return int(raw)
    try:
        return int(str(raw).strip())
    except ValueError:
        raise OptionValueError(f"{raw!r} is not an integer", "write a whole number") from None


def parse_str(raw: Any) -> str:
    if not isinstance(raw, str):
        raise OptionValueError(f"expected a string, got {raw!r}", "quote it")
    return raw


def parse_shape(raw: Any) -> tuple[int, ...]:
    """``"8x4096"`` (or ``[8, 4096]``) -> ``(8, 4096)``; every dimension a positive integer."""
    hint = "write it as 8x4096 (positive integers joined by x)"
    if isinstance(raw, (list, tuple)):
        parts = [str(p) for p in raw]
    else:
        parts = str(raw).lower().replace("×", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise OptionValueError(f"shape {raw!r} does not parse", hint) from None
    if not dims or any(d <= 0 for d in dims):
        raise OptionValueError(f"shape {raw!r} has a non-positive dimension", hint)
    return dims


def format_shape(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)
