"""Parsing of the small value syntaxes users type: ``5%``, ``0.05``, ``8x4096``."""

from __future__ import annotations

from glmfb.errors import UsageError


def parse_fraction(text: str | float | int, what: str = "threshold") -> float:
    """``"5%"`` or ``0.05`` -> 0.05.

    A bare number is a fraction and must lie in [0, 1]: ``5`` is refused (it would mean
    500%, and silently let a 2x slowdown pass), with the hint to write ``5%`` or ``0.05``.
    A percentage must lie in [0%, 1000%).
    """
    if isinstance(text, bool):
        raise UsageError(f"{what} {text!r} is not a number", "write it as 5% or 0.05")
    if isinstance(text, (int, float)):
        raw, value, percent = repr(text), float(text), False
    else:
        raw = str(text).strip()
        percent = raw.endswith("%")
        try:
            value = float(raw[:-1]) / 100.0 if percent else float(raw)
        except ValueError:
            raise UsageError(f"{what} {text!r} is not a number", "write it as 5% or 0.05") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise UsageError(f"{what} {text!r} is not a finite number", "write it as 5% or 0.05")
    if not percent and value > 1.0:
        shown = raw if not raw.endswith(".0") else raw[:-2]
        raise UsageError(
            f"{what} {shown} is a bare number above 1 (it would mean {value:.0%})",
            f"write {shown}% or {value / 100:g}",
        )
    if not 0.0 <= value < 10.0:
        raise UsageError(f"{what} {text!r} is out of range", "use a fraction such as 5% or 0.05")
    return value


def parse_shape(text: str | list[int] | tuple[int, ...]) -> tuple[int, ...]:
    """``"8x4096"`` (or ``[8, 4096]``) -> ``(8, 4096)``; every dimension a positive integer."""
    if isinstance(text, (list, tuple)):
        parts = [str(p) for p in text]
    else:
        parts = str(text).lower().replace("×", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(
            f"shape {text!r} does not parse", "write it as 8x4096 (positive integers joined by x)"
        ) from None
    if not dims or any(d <= 0 for d in dims):
        raise UsageError(f"shape {text!r} has a non-positive dimension", "write it as 8x4096")
    return dims


def format_shape(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)
