"""Parsing of the small value syntaxes users type: ``5%``, ``0.05``, ``8x4096``."""

from __future__ import annotations

from glmfb.errors import UsageError


def parse_fraction(text: str | float | int, what: str = "threshold") -> float:
    """``"5%"`` or ``0.05`` -> 0.05. Must lie in [0, 10)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        raw = str(text).strip()
        try:
            value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
        except ValueError:
            raise UsageError(f"{what} {text!r} is not a number", "write it as 5% or 0.05") from None
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
