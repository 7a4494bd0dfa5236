"""Matrix products at the precisions a GPU's tensor cores offer for float32 inputs.

- ``ieee``: a plain float32 product (what a CPU, or a GPU with TF32 off, computes).
- ``tf32``: each operand rounded to TF32 first (float32's 8-bit exponent, 10 explicit mantissa
  bits instead of 23, round to nearest, ties to even), then multiplied with float32
  accumulation. The product of two 11-bit significands fits in float32's 24 bits, so after the
  rounding the only other error is the float32 accumulation, as on a tensor core. This is what
  a Triton ``tl.dot`` on float32 inputs computes by default.
- ``tf32x3``: each operand split into ``hi = tf32(x)`` and ``lo = tf32(x - hi)``, and the
  product taken as ``lo_a @ hi_b + hi_a @ lo_b + hi_a @ hi_b`` (small terms first). Only
  ``lo_a @ lo_b`` (about 2^-22 relative) and the rounding of the remainders are lost: close to
  float32, for three TF32 products' cost (Triton's ``input_precision="tf32x3"``).

On a float64 input every precision is the plain float64 product: the emulation is defined for
float32, and float64 runs serve as the exact reference.
"""

from __future__ import annotations

import torch

PRECISIONS = ("ieee", "tf32", "tf32x3")
TF32_MANTISSA_BITS = 10
FLOAT32_MANTISSA_BITS = 23
DROPPED_BITS = FLOAT32_MANTISSA_BITS - TF32_MANTISSA_BITS  # 13
_HALF_MINUS_ONE = (1 << (DROPPED_BITS - 1)) - 1  # 0x0FFF
_KEEP_MASK = ~((1 << DROPPED_BITS) - 1)  # clears the 13 dropped bits


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`; a ``ValueError`` naming them if not."""
    if precision not in PRECISIONS:
        raise ValueError(f"merge_precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    return precision


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) rounded to TF32: 10 mantissa bits, round to nearest, ties to even.

    Works on the bit pattern: adding ``0x0FFF`` plus the lowest kept bit and clearing the 13
    dropped bits rounds the magnitude to nearest with ties to even (a carry out of the mantissa
    bumps the exponent, and past the largest finite value gives infinity, as rounding should).
    Infinities keep their pattern; NaNs are passed through unchanged (the addition could carry
    a NaN's payload into the sign bit). Subnormals are rounded the same way, on their bits.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"round_tf32 takes float32, got {x.dtype}")
    bits = x.contiguous().view(torch.int32)
    lowest_kept = (bits >> DROPPED_BITS) & 1
    rounded = ((bits + _HALF_MINUS_ONE + lowest_kept) & _KEEP_MASK).view(torch.float32)
    return torch.where(torch.isnan(x), x, rounded)


def split_tf32(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hi, lo)`` with ``hi = tf32(x)`` and ``lo = tf32(x - hi)``: ``hi + lo`` carries about
    21 of float32's 24 significand bits."""
    hi = round_tf32(x)
    return hi, round_tf32(x - hi)


def matmul(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    """``a @ b`` at ``precision`` (see the module docstring); batched like ``torch.matmul``."""
    if a.dtype == torch.float64 or precision == "ieee":
        return a @ b
    if precision == "tf32":
        return round_tf32(a) @ round_tf32(b)
    if precision == "tf32x3":
        a_hi, a_lo = split_tf32(a)
        b_hi, b_lo = split_tf32(b)
        return (a_lo @ b_hi + a_hi @ b_lo) + a_hi @ b_hi
    raise ValueError(f"merge_precision {precision!r} is not one of {', '.join(PRECISIONS)}")
