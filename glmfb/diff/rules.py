"""The rules of ``glmfb diff``: what the comparison found in, a diagnosis out.

Each rule looks at the :class:`DiffFindings` of a diff (what failed, where, the shape of the
error, the precision signature) and, when it applies, says what it saw and what to try next.
They are tried in order (see :mod:`glmfb.rules`); the first that applies wins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from glmfb.diff.metrics import TokenMetrics
from glmfb.diff.shape import ErrorShape, GrowthFit, PrecisionSignature
from glmfb.rules import Diagnosis, Rule
from glmfb.verdict import Status

KIND = "diff"


@dataclass(frozen=True)
class DiffFindings:
    """What the diff established, in the terms the rules speak."""

    failed: bool
    requests: int
    failing_requests: int
    request: str | None = None
    module: str | None = None  # where the error starts (local error in live mode)
    tap: str | None = None
    position: int | None = None
    local: bool | None = None  # the module's own error exceeds tolerance (None: not measured)
    first_divergent: str | None = None  # first tap outside tolerance, in execution order
    shape: ErrorShape = ErrorShape.NONE
    fit: GrowthFit | None = None
    signature: PrecisionSignature | None = None
    dtype: str | None = None
    tokens: TokenMetrics | None = None
    nonfinite_tap: str | None = None
    output_rel_l2: float = 0.0
    rerun: str | None = None  # command that reruns the minimal reproducer

    def saw(self) -> dict[str, Any]:
        seen: dict[str, Any] = {
            "failed": self.failed, "requests": self.requests, "failing_requests": self.failing_requests,
            "shape": self.shape.value, "output_rel_l2": self.output_rel_l2,
        }
        for key in ("request", "module", "position", "local", "first_divergent", "dtype", "nonfinite_tap"):
            value = getattr(self, key)
            if value is not None:
                seen[key] = value
        if self.fit is not None:
            seen.update(fit_basis=self.fit.basis, growth_exponent=self.fit.exponent, growth_r2=self.fit.exponent_r2)
        if self.signature is not None:
            seen.update(signature_nearest=self.signature.nearest, signature_consistent=self.signature.consistent,
                        observed_rel_error=self.signature.observed)
        return seen


def _where(f: DiffFindings) -> str:
    text = f"module {f.module}" if f.module else (f"tap {f.tap}" if f.tap else "the outputs")
    if f.local is True:
        text += " (its own error, measured on the baseline's inputs)"
    return text


def _signature_phrase(f: DiffFindings) -> str:
    s = f.signature
    if s is None or not s.consistent:
        return ""
    u_name = {"bf16": "2^-8", "tf32/fp16": "2^-11", "fp32": "2^-24"}.get(s.nearest, "")
    return f"; its relative error {s.observed:.2g} sits at the {s.nearest} unit roundoff ({u_name})"


def _growth_phrase(f: DiffFindings) -> str:
    if f.fit is None:
        return ""
    basis = "context length" if f.fit.basis == "requests" else "position"
    return f"error grows with {basis} (log-log exponent {f.fit.exponent:.2f}, r² {f.fit.exponent_r2:.2f})"


def _rerun(f: DiffFindings) -> list[str]:
    return [f.rerun] if f.rerun else []


def _nonfinite(f: DiffFindings) -> tuple[str, list[str]]:
    why = f"The candidate produces NaN or Inf where the baseline is finite, first at {f.nonfinite_tap}."
    return why, [
        f"check {f.module or f.nonfinite_tap} for overflow (a narrower dtype's range), division by zero or log of zero",
        *_rerun(f),
    ]


def _growing_tf32(f: DiffFindings) -> tuple[str, list[str]]:
    why = (f"The {_growth_phrase(f)} and starts in {_where(f)}{_signature_phrase(f)}: "
           "products there run in TF32 (10-bit mantissa) and the error accumulates along the sequence.")
    return why, [
        f"compute the products in {f.module} in full fp32 (Triton tl.dot input_precision='ieee' or 'tf32x3'; "
        "torch.backends.cuda.matmul.allow_tf32=False) and rerun the diff",
        *_rerun(f),
    ]


def _growing(f: DiffFindings) -> tuple[str, list[str]]:
    why = (f"The {_growth_phrase(f)} and starts in {_where(f)}{_signature_phrase(f)}: "
           "a precision loss there accumulates along the sequence (accumulation dtype of a state or a reduction).")
    return why, [f"raise the accumulation precision in {f.module} (fp32 state, fp32 accumulators) and rerun", *_rerun(f)]


def _rounded(format_name: str) -> Callable[[DiffFindings], tuple[str, list[str]]]:
    def explain(f: DiffFindings) -> tuple[str, list[str]]:
        why = (f"The {_where(f)} adds error by itself{_signature_phrase(f)}: "
               f"its output or an operand is rounded to {format_name}; the layers after it only inherit the error.")
        return why, [
            f"look for a {format_name} cast or autocast region in {f.module}; keep it in "
            f"{f.dtype or 'the baseline dtype'} or widen the tolerance for it with --tol '{f.module}*=RTOL,ATOL' if intended",
            *_rerun(f),
        ]

    return explain


def _spike(f: DiffFindings) -> tuple[str, list[str]]:
    why = (f"The error is confined to a few positions (first at position {f.position}) in {_where(f)}: "
           "a boundary, mask or indexing problem rather than a precision loss.")
    return why, [f"inspect {f.module} at position {f.position} (masks, chunk boundaries, padding)", *_rerun(f)]


def _inherited(f: DiffFindings) -> tuple[str, list[str]]:
    why = (f"The first tap outside tolerance is {f.first_divergent}, but no module's own error exceeds tolerance on "
           "the baseline's inputs: the error enters in code between tapped modules (a parent's forward), "
           "or grows from differences below tolerance upstream.")
    return why, [
        f"read the code that produces the inputs of {f.first_divergent} in its parent's forward, "
        "or tighten the tolerance on the upstream taps (--tol) to see where the first difference appears",
        *_rerun(f),
    ]


def _generic(f: DiffFindings) -> tuple[str, list[str]]:
    shape = {ErrorShape.CONSTANT: "about constant across lengths", ErrorShape.GROWING: "growing with length"}.get(f.shape, f.shape.value)
    why = f"Outputs differ beyond tolerance; the error starts in {_where(f)} and is {shape}{_signature_phrase(f)}."
    return why, [f"diff {f.module} in isolation (--tap '{f.module}*') and read its per-position error", *_rerun(f)]


def _passed(f: DiffFindings) -> tuple[str, list[str]]:
    if f.output_rel_l2 == 0.0:
        return f"All {f.requests} requests match exactly (zero error on every tap).", []
    return (f"All {f.requests} requests are within tolerance on every tap "
            f"(worst output relative L2 error {f.output_rel_l2:.2g})."), []


def _rule(name: str, applies: Callable[[DiffFindings], bool],
          explain: Callable[[DiffFindings], tuple[str, list[str]]], doc: str,
          status: Status = Status.FAIL) -> Rule[DiffFindings]:
    def check(f: DiffFindings) -> Diagnosis | None:
        if not applies(f):
            return None
        why, steps = explain(f)
        return Diagnosis(status, why, tuple(steps))

    return Rule(name, KIND, check, doc)


def _is_tf32(f: DiffFindings) -> bool:
    return f.signature is not None and f.signature.consistent and f.signature.nearest == "tf32/fp16"


RULES: tuple[Rule[DiffFindings], ...] = (
    _rule("pass", lambda f: not f.failed, _passed, "every request within tolerance", Status.PASS),
    _rule("non-finite", lambda f: f.shape is ErrorShape.NON_FINITE, _nonfinite,
          "NaN or Inf in the candidate where the baseline is finite"),
    _rule("growing-tf32", lambda f: f.shape is ErrorShape.GROWING and _is_tf32(f) and f.dtype == "float32",
          _growing_tf32, "error grows with length, at the TF32 unit roundoff, in float32"),
    _rule("growing", lambda f: f.shape is ErrorShape.GROWING, _growing, "error grows with length"),
    _rule("inherited-only", lambda f: f.local is False, _inherited,
          "no module's own error exceeds tolerance: the error enters between taps"),
    _rule("spike", lambda f: f.shape is ErrorShape.SPIKE, _spike, "error confined to a few positions"),
    _rule("bf16-rounding", lambda f: f.signature is not None and f.signature.consistent
          and f.signature.nearest == "bf16" and f.dtype in ("float32", "float64"), _rounded("bfloat16"),
          "the module's own error sits at the bf16 unit roundoff"),
    _rule("fp16-rounding", lambda f: _is_tf32(f) and f.dtype in ("float32", "float64"), _rounded("fp16 or TF32"),
          "the module's own error sits at the fp16/TF32 unit roundoff"),
    _rule("generic", lambda f: True, _generic, "outputs differ beyond tolerance"),
)
