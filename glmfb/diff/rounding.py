"""Precision claims, checked: does rounding the baseline to a narrower format reproduce the error?

A relative error near a format's unit roundoff is not evidence that the format caused it (a
changed norm epsilon gives an error of a few bf16 units too). So a format is claimed only when
rounding the *baseline* to it reproduces the error the candidate shows, in size and element by
element:

- the module's own error ``e = c - b`` is measured (the candidate module on the baseline's
  inputs, or a tap's error between captures);
- the baseline module is run again on its recorded inputs with a format imposed on it, in
  several ways (:data:`VARIANTS`): its output rounded; the operands of its matrix products
  rounded (what TF32 tensor cores or a bf16 matmul do); the operands of every product rounded,
  elementwise ones too (a kernel that writes its products as multiplies); every operation's
  inputs and outputs rounded (the module run in that format);
- each simulated error ``s`` is set against ``e``: its size ``||s|| / ||e||``, the cosine of
  the two error patterns ``<s, e> / (||s|| ||e||)`` (rounding errors are centred, so this is
  their correlation) and the share of elements where both errors have the same sign.

A variant *reproduces* the error when its size is within a factor of 2 of the observed one
and the correlation is at least 0.5; an independent rounding of the same size correlates at
about 0, and formats 8x apart in unit roundoff (bf16 against fp16 / TF32) are 8x apart in size.
fp16 and TF32 share a 10-bit mantissa and round values inside fp16's range identically; when
both reproduce, the dtypes the candidate's module really holds, sees or computes with decide
(float16 weights, or float16 operands in its operations: fp16), and otherwise neither is named
alone: "a 10-bit-mantissa format (float16 or TF32)".

When the two module trees differ below the module tested (its forward calls ``F.linear`` on a
submodule's weight instead of the submodule), the format is also imposed inside only the
submodules the candidate does not run (:data:`SCOPED_VARIANTS`): the shared part of the module
computed alike on both sides, so the part the candidate replaced is what to test.

The bias test says whether an error is *systematic*: the share of its energy that a
per-position scale and shift of the baseline output explains (``c ≈ a b + d`` fitted row by
row). A changed constant (an epsilon, a scale) is explained almost entirely; rounding, whose
errors are independent of the value's sign and size, hardly at all (about 2 / row width).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from glmfb.diff.optrace import TracedOp

from glmfb.diff.claims import NOT_FLOAT16_RANGE
from glmfb.diff.optrace import UNINITIALISED

FORMATS = ("bf16", "fp16", "tf32")
FORMAT_NAMES = {"bf16": "bfloat16", "fp16": "float16", "tf32": "TF32"}
MANTISSA_BITS = {"bf16": 7, "fp16": 10, "tf32": 10}  # explicit mantissa bits
UNIT_ROUNDOFF = {fmt: 2.0 ** -(bits + 1) for fmt, bits in MANTISSA_BITS.items()}

# (name, operations whose operands are rounded, whether the output is rounded too)
VARIANTS: tuple[tuple[str, str, bool], ...] = (
    ("output", "none", True),
    ("matmul operands", "matmul", False),
    ("matmul operands and output", "matmul", True),
    ("product operands", "products", False),
    ("every operation", "all", True),
)
# Imposed inside one submodule of the module only (the part the candidate does not run as a
# module); the submodule's output is rounded in each.
SCOPED_VARIANTS: tuple[tuple[str, str, bool], ...] = (
    ("output", "none", True),
    ("matmul operands and output", "matmul", True),
    ("every operation", "all", True),
)
SIZE_FACTOR = 2.0  # a reproduction's error is within this factor of the observed one
ABSURD_REL_L2 = 1.0  # a trial whose error is this large against the output itself (and no reproduction) broke
LEFT_OUT = "left out: "  # the note of a trial whose own result is invalid (never read as evidence)
MIN_CORRELATION = 0.5  # ... and its pattern correlates at least this well
TIE_CORRELATION = 0.05  # formats whose best correlations are this close reproduce equally well
MAX_ELEMENTS = 1 << 22  # the error patterns are compared on at most this many elements

SYSTEMATIC_SHARE = 0.5  # share of the error a per-position scale and shift must explain
MIN_ROW_WIDTH = 16  # narrower rows are fitted as one (a fit of 2 numbers to few elements explains noise)


# --------------------------------------------------------------------------------------------
# Rounding
# --------------------------------------------------------------------------------------------


def _round_tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to a 10-bit mantissa, round to nearest even (NaN kept)."""
    import torch

    bits = x.contiguous().view(torch.int32)
    lowest_kept = (bits >> 13) & 1
    rounded = ((bits + 0x0FFF + lowest_kept) & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isnan(x), x, rounded)


def round_to(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """``x`` rounded to ``fmt`` (``bf16``, ``fp16``, ``tf32``), in its own dtype. Only float32
    and float64 tensors are rounded (a narrower tensor already is what it is)."""
    import torch

    if x.dtype not in (torch.float32, torch.float64):
        return x
    if fmt == "bf16":
        return x.to(torch.bfloat16).to(x.dtype)
    if fmt == "fp16":
        return x.to(torch.float16).to(x.dtype)
    if fmt == "tf32":
        return _round_tf32(x.to(torch.float32)).to(x.dtype)
    raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")


def _op_sets() -> tuple[frozenset[Any], frozenset[Any]]:
    import torch

    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul", "linear",
             "_addmm_activation", "convolution", "_convolution", "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math")
    matmul = frozenset(getattr(aten, n) for n in names if hasattr(aten, n))
    products = matmul | frozenset(getattr(aten, n) for n in ("mul", "mul_", "addcmul", "addcmul_") if hasattr(aten, n))
    return matmul, products




@contextmanager
def rounding_mode(fmt: str, ops: str) -> Iterator[None]:
    """Within the block, round the float32/float64 operands of ``ops`` (``matmul``: matrix
    products and attention; ``products``: those and elementwise multiplies; ``all``: every
    operation, its outputs too) to ``fmt``. ``none`` changes nothing.

    Rounding an operand makes a new tensor, so the modes keep every alias the code relies on: a
    view (``out[:, t]``, ``x.view(...)``) is taken of the tensor itself, never of a rounded copy
    (a slice assignment into a preallocated output writes into the output; rounding the view's
    input wrote it into a copy and left the output uninitialised); an operation's written
    operand (``copy_``'s destination, ``out=``) is the tensor itself, and what it writes is
    rounded there (the values written, not a copy); the output of ``empty`` and its kind
    (:data:`glmfb.diff.optrace.UNINITIALISED`) is not rounded."""
    if ops == "none":
        yield
        return
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_map

    matmul, products = _op_sets()
    selected = {"matmul": matmul, "products": products}.get(ops)

    def rounded(value: Any) -> Any:
        return round_to(value, fmt) if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    class Rounding(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if selected is not None and func.overloadpacket not in selected:
                return func(*args, **kwargs)
            returns = func._schema.returns
            if any(r.alias_info is not None and not r.alias_info.is_write for r in returns):
                # a view of an input: of the tensor itself (its values were rounded where they were made)
                return func(*args, **kwargs)
            if func.overloadpacket.__name__ in UNINITIALISED:
                return func(*args, **kwargs)
            schema = func._schema.arguments
            written = {a.name for a in schema if a.alias_info is not None and a.alias_info.is_write}
            args = tuple(a if index < len(schema) and schema[index].name in written else tree_map(rounded, a)
                         for index, a in enumerate(args))
            kwargs = {k: v if k in written else tree_map(rounded, v) for k, v in kwargs.items()}
            out = func(*args, **kwargs)
            if ops != "all":
                return out
            if any(r.alias_info is not None and r.alias_info.is_write for r in returns):
                for item in (out if isinstance(out, (tuple, list)) else (out,)):
                    if isinstance(item, torch.Tensor) and item.is_floating_point():
                        item.copy_(round_to(item, fmt))
                return out
            return tree_map(rounded, out)

    with Rounding():
        yield


# --------------------------------------------------------------------------------------------
# The test
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One way of imposing a format on the baseline, against the observed error."""

    format: str
    variant: str
    rel_l2: float  # ||s|| / ||b||
    size_ratio: float  # ||s|| / ||e||
    correlation: float  # <s, e> / (||s|| ||e||)
    sign_agreement: float  # share of elements where s and e are both nonzero with the same sign
    reproduces: bool
    note: str = ""
    scope: str = ""  # the submodule the format was imposed inside ("": the whole module)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format": self.format, "variant": self.variant, "rel_l2": self.rel_l2, "size_ratio": self.size_ratio,
            "correlation": self.correlation, "sign_agreement": self.sign_agreement, "reproduces": self.reproduces,
        }
        if self.note:
            data["note"] = self.note
        if self.scope:
            data["scope"] = self.scope
        return data

    @property
    def what(self) -> str:
        """What was rounded, for a why: ``matmul operands`` or ``matmul operands and output of
        its down_proj``."""
        return f"{self.variant} of its {self.scope}" if self.scope else self.variant


@dataclass(frozen=True)
class RoundingTest:
    """Every trial, and the format they support (None: no rounding reproduces the error)."""

    subject: str  # what the observed error is, e.g. "own error of model.layers.1.mlp.down_proj"
    observed_rel_l2: float
    elements: int
    trials: tuple[Trial, ...]
    format: str | None = None
    best: Trial | None = None  # the claimed format's best trial, or the closest one when none reproduces
    equally: tuple[str, ...] = ()  # other formats that reproduce it as well (fp16 and TF32)
    dtype_evidence: str | None = None  # what the candidate's dtypes say, when they decided
    live: bool = True  # the module could be rerun (else only its output could be rounded)
    computes_in: tuple[str, ...] = ()  # floating dtypes of the candidate module's operands (when recorded)
    same_rounding: bool = False  # fp16 and TF32 gave the same errors (size and correlation) here
    operands: tuple[tuple[str, str], ...] = ()  # (operation, dtype) the candidate's module computed with

    @property
    def reproduced(self) -> bool:
        return self.format is not None

    @property
    def left_out(self) -> tuple[Trial, ...]:
        """The trials whose own result was invalid (NaN or Inf where the baseline is finite, an
        error larger than the output): never read as evidence, for or against a format."""
        return tuple(t for t in self.trials if t.note.startswith(LEFT_OUT))

    def left_out_text(self) -> str:
        """``2 of the 15 rounding trials were left out ...`` for a why ("" when none was)."""
        left = self.left_out
        if not left:
            return ""
        reasons = []
        if any("NaN or Inf" in t.note for t in left):
            reasons.append("NaN or Inf where the baseline's output is finite")
        if any("larger than the output" in t.note for t in left):
            reasons.append("an error larger than the output itself")
        return (f"{len(left)} of the {len(self.trials)} rounding trials {'was' if len(left) == 1 else 'were'} left "
                f"out as invalid, not read as evidence: {'their' if len(left) > 1 else 'its'} own result had "
                f"{' or '.join(reasons)} (each trial and why it was left out is in the rounding_test evidence)")

    @property
    def ten_bit(self) -> bool:
        """fp16 and TF32 both reproduce it and nothing measured tells them apart."""
        return (self.format in ("fp16", "tf32") and {"fp16", "tf32"} <= {self.format, *self.equally}
                and self.dtype_evidence is None)

    @property
    def name(self) -> str:
        """The format named in a why."""
        if self.format is None:
            return ""
        return "a 10-bit-mantissa format (float16 or TF32)" if self.ten_bit else FORMAT_NAMES[self.format]

    def describe(self) -> str:
        """The claim and its numbers, for a why (names only what the trials tell apart)."""
        if self.best is None or self.format is None:
            return ""
        best = self.best
        details = [f"size {best.size_ratio:.2f}x the observed error", f"correlation {best.correlation:.2f}",
                   f"same sign in {100 * best.sign_agreement:.0f}% of elements"]
        if self.dtype_evidence:
            details.append(self.dtype_evidence)
        elif self.ten_bit:
            details.append("float16 and TF32 " + ("round these values alike (the same error size and correlation)"
                                                  if self.same_rounding else "reproduce it equally well"))
            if self.computes_in:
                details.append("no float16 tensor in the candidate module's operations "
                               f"({', '.join(self.computes_in)} only), so not a float16 cast in torch code")
        target = f"the baseline's {best.what}"
        if best.scope:
            target += " (a submodule the candidate's forward does not run as a module)"
        return f"rounding {target} to {self.name} reproduces it ({'; '.join(details)})"


def _pattern(base: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    import torch

    flat_b = base.detach().reshape(-1)[:MAX_ELEMENTS].to(torch.float64)
    flat_o = other.detach().reshape(-1)[:MAX_ELEMENTS].to(torch.float64)
    return flat_o - flat_b


def compare_errors(observed: torch.Tensor, simulated: torch.Tensor, base_norm: float) -> tuple[float, float, float, float]:
    """(rel_l2 of the simulated error, size ratio, correlation, sign agreement) over elements
    where both errors are finite."""
    import torch

    finite = torch.isfinite(observed) & torch.isfinite(simulated)
    if not bool(finite.all()):
        if not bool(torch.isfinite(simulated).all()):
            return math.inf, math.inf, 0.0, 0.0
        observed, simulated = observed[finite], simulated[finite]
    norm_e = float(observed.norm())
    norm_s = float(simulated.norm())
    rel = norm_s / base_norm if base_norm > 0 else math.inf
    if norm_e == 0.0:
        return rel, math.inf if norm_s > 0 else 1.0, 0.0, 0.0
    if norm_s == 0.0:
        return rel, 0.0, 0.0, 0.0
    correlation = float(torch.dot(observed, simulated)) / (norm_e * norm_s)
    both = (observed != 0) & (simulated != 0)
    agree = float(((observed > 0) == (simulated > 0))[both].to(torch.float64).mean()) if bool(both.any()) else 0.0
    return rel, norm_s / norm_e, correlation, agree


def _invalid(simulated: torch.Tensor, observed: torch.Tensor, base: torch.Tensor) -> str:
    """Why a trial's own result is not a rounding of the baseline ("": it is one): NaN or Inf
    where the baseline and the candidate are finite (a trial that read an uninitialised buffer,
    or a value past the format's range)."""
    import torch

    broken = ~torch.isfinite(simulated) & torch.isfinite(observed) & torch.isfinite(base)
    count = int(broken.sum())
    if not count:
        return ""
    return (f"{LEFT_OUT}its output is NaN or Inf at {count} of {simulated.numel()} elements where the baseline's "
            "and the candidate's are finite")


def _reproduces(size_ratio: float, correlation: float) -> bool:
    return 1.0 / SIZE_FACTOR <= size_ratio <= SIZE_FACTOR and correlation >= MIN_CORRELATION


def rounding_test(baseline: torch.Tensor, candidate: torch.Tensor, subject: str,
                  rerun: Callable[..., torch.Tensor] | None = None,
                  candidate_dtypes: Sequence[str] = (), scopes: Sequence[str] = (),
                  candidate_ops: Sequence[tuple[str, str]] | None = None) -> RoundingTest | None:
    """Test each format against the error ``candidate - baseline``. ``rerun(fmt, ops)`` runs
    the baseline module on its recorded inputs inside :func:`rounding_mode` and returns the
    output being tested (None: only the output can be rounded); ``rerun(fmt, ops, scope=S)``
    imposes the format inside the submodule ``S`` only, its output rounded (each of
    ``scopes``: the submodules the candidate does not run). ``candidate_dtypes``: the dtypes the
    candidate's module holds and sees (its parameters, inputs and outputs); ``candidate_ops``:
    ``(operation, dtype)`` of the floating operands its operations took (None: not recorded).
    None when there is no finite error to test."""
    import torch

    if baseline.shape != candidate.shape or not baseline.is_floating_point():
        return None
    observed = _pattern(baseline, candidate)
    base_flat = baseline.detach().reshape(-1)[:MAX_ELEMENTS].to(torch.float64)
    finite = torch.isfinite(observed) & torch.isfinite(base_flat)
    if not bool(finite.any()) or float(observed[finite].abs().max()) == 0.0:
        return None
    base_norm = float(base_flat[finite].norm())
    observed_rel = float(observed[finite].norm()) / base_norm if base_norm > 0 else math.inf
    trials: list[Trial] = []
    plan = [(fmt, variant, ops, round_output, "") for fmt in FORMATS for variant, ops, round_output in VARIANTS]
    if rerun is not None:
        plan += [(fmt, variant, ops, True, scope) for scope in scopes for fmt in FORMATS
                 for variant, ops, _ in SCOPED_VARIANTS]
    for fmt, variant, ops, round_output, scope in plan:
        if (ops != "none" or scope) and rerun is None:
            continue
        note = ""
        try:
            if scope:
                assert rerun is not None
                simulated_out = rerun(fmt, ops, scope=scope)
                round_output = False  # the submodule's output was rounded inside
            elif ops == "none":
                simulated_out = baseline
            else:
                assert rerun is not None
                simulated_out = rerun(fmt, ops)
            if simulated_out.shape != baseline.shape:
                raise ValueError(f"shape {tuple(simulated_out.shape)}, expected {tuple(baseline.shape)}")
            if round_output:
                simulated_out = round_to(simulated_out, fmt)
            simulated = _pattern(baseline, simulated_out)
            note = _invalid(simulated, observed, base_flat)
            rel, size, correlation, agree = compare_errors(observed, simulated, base_norm)
            if not note and rel >= ABSURD_REL_L2 and size > SIZE_FACTOR:
                note = (f"{LEFT_OUT}its error is {rel:.2g} of the output's own size ({size:.2g}x the observed "
                        "error): larger than the output, no rounding; the trial itself broke")
        except Exception as exc:  # a module that cannot run under the mode: that variant is not tested
            detail = str(exc).strip().splitlines()
            note = f"could not run: {type(exc).__name__}" + (f": {detail[0][:120]}" if detail else "")
            rel, size, correlation, agree = math.nan, math.nan, math.nan, math.nan
        trials.append(Trial(fmt, variant, rel, size, correlation, agree,
                            not note and _reproduces(size, correlation), note, scope))
    return _decide(subject, observed_rel, int(observed.numel()), trials, candidate_dtypes, rerun is not None,
                   candidate_ops)


def _best(trials: Sequence[Trial]) -> Trial | None:
    usable = [t for t in trials if not t.note and math.isfinite(t.correlation)]
    if not usable:
        return None
    return max(usable, key=lambda t: (t.reproduces, t.correlation, -abs(math.log(max(t.size_ratio, 1e-300)))))


def _same_rounding(trials: Sequence[Trial]) -> bool:
    """Whether fp16 and TF32 gave the same error in every way tried (values inside fp16's
    range round alike in both)."""
    pairs = {(t.variant, t.scope): t for t in trials if t.format == "fp16" and not t.note}
    matched = [(pairs[(t.variant, t.scope)], t) for t in trials
               if t.format == "tf32" and not t.note and (t.variant, t.scope) in pairs]
    return bool(matched) and all(math.isclose(a.rel_l2, b.rel_l2, rel_tol=1e-6) and
                                 math.isclose(a.correlation, b.correlation, rel_tol=1e-6, abs_tol=1e-9)
                                 for a, b in matched)


def _decide(subject: str, observed_rel: float, elements: int, trials: Sequence[Trial],
            candidate_dtypes: Sequence[str], live: bool,
            candidate_ops: Sequence[tuple[str, str]] | None = None) -> RoundingTest:
    best_by_format = {fmt: _best([t for t in trials if t.format == fmt]) for fmt in FORMATS}
    reproducing = {fmt: t for fmt, t in best_by_format.items() if t is not None and t.reproduces}
    computes_in = tuple(dict.fromkeys(d for _, d in candidate_ops or ()))
    if not reproducing:
        closest = _best(trials)
        return RoundingTest(subject, observed_rel, elements, tuple(trials), None, closest, live=live,
                            computes_in=computes_in, operands=tuple(candidate_ops or ()))
    top = max(t.correlation for t in reproducing.values())
    equal = sorted((fmt for fmt, t in reproducing.items() if t.correlation >= top - TIE_CORRELATION),
                   key=lambda fmt: -reproducing[fmt].correlation)
    chosen, evidence = equal[0], None
    held = {"bfloat16": "bf16", "float16": "fp16"}
    hinted = [held[d] for d in candidate_dtypes if d in held and held[d] in equal]
    computed = [(op, held[d]) for op, d in candidate_ops or () if d in held and held[d] in equal]
    if len(equal) > 1 and hinted:
        chosen = hinted[0]
        evidence = f"the candidate's module holds or sees {FORMAT_NAMES[chosen]} tensors"
    elif len(equal) > 1 and computed:
        chosen = computed[0][1]
        ops = ", ".join(dict.fromkeys(op for op, fmt in computed if fmt == chosen))
        evidence = f"the candidate's module computes with {FORMAT_NAMES[chosen]} operands ({ops})"
    elif len(equal) > 1 and "tf32" in equal and "fp16" in equal:
        chosen = "tf32"  # nothing tells them apart: RoundingTest.ten_bit names both
    return RoundingTest(subject, observed_rel, elements, tuple(trials), chosen, reproducing[chosen],
                        tuple(f for f in equal if f != chosen), evidence, live, computes_in,
                        _same_rounding(trials), tuple(candidate_ops or ()))


# --------------------------------------------------------------------------------------------
# Bias
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BiasTest:
    """How much of an error a per-position scale and shift of the baseline explains."""

    subject: str
    explained: float  # share of the error's energy explained by c = a b + d, row by row
    mean_scale: float  # the fitted a, averaged over rows (1: no scaling)
    mean_shift: float  # the fitted d, averaged over rows, relative to the baseline's RMS
    rows: int
    row_width: int

    @property
    def systematic(self) -> bool:
        return self.explained >= SYSTEMATIC_SHARE

    def describe(self) -> str:
        parts = [f"a per-position scale and shift of the baseline output explains {100 * self.explained:.1f}% of it"]
        if abs(self.mean_scale - 1.0) > 1e-9:
            parts.append(f"the outputs are scaled by {self.mean_scale:.5g} on average")
        if abs(self.mean_shift) > 1e-6:
            parts.append(f"shifted by {self.mean_shift:.3g} of their RMS")
        return ", ".join(parts)


def bias_test(baseline: torch.Tensor, candidate: torch.Tensor, dim: int | None, subject: str) -> BiasTest | None:
    """Fit ``c = a b + d`` per row (rows along ``dim``, the positions; one row without it or when
    rows are narrower than :data:`MIN_ROW_WIDTH`) and measure the share of ``||c - b||²`` the fit
    removes. None when there is no finite error."""
    import torch

    if baseline.shape != candidate.shape or not baseline.is_floating_point() or baseline.numel() == 0:
        return None
    b = baseline.detach().to(torch.float64)
    c = candidate.detach().to(torch.float64)
    if dim is not None:
        b, c = b.movedim(dim, 0), c.movedim(dim, 0)
        b, c = b.reshape(b.shape[0], -1), c.reshape(c.shape[0], -1)
    if dim is None or b.shape[1] < MIN_ROW_WIDTH:
        b, c = b.reshape(1, -1), c.reshape(1, -1)
    if b.shape[1] > MAX_ELEMENTS:
        b, c = b[:, :MAX_ELEMENTS], c[:, :MAX_ELEMENTS]
    rows_ok = torch.isfinite(b).all(dim=1) & torch.isfinite(c).all(dim=1)
    b, c = b[rows_ok], c[rows_ok]
    if b.numel() == 0:
        return None
    error = float((c - b).pow(2).sum())
    if error == 0.0:
        return None
    mean_b = b.mean(dim=1, keepdim=True)
    mean_c = c.mean(dim=1, keepdim=True)
    centred = b - mean_b
    var_b = centred.pow(2).sum(dim=1, keepdim=True)
    scale = torch.where(var_b > 0, (centred * (c - mean_c)).sum(dim=1, keepdim=True) / var_b.clamp_min(1e-300),
                        torch.ones_like(var_b))
    shift = mean_c - scale * mean_b
    residual = float((c - (scale * b + shift)).pow(2).sum())
    rms = float(b.pow(2).mean().sqrt())
    return BiasTest(subject, max(0.0, 1.0 - residual / error), float(scale.mean()),
                    float(shift.mean()) / rms if rms > 0 else 0.0, int(b.shape[0]), int(b.shape[1]))


# --------------------------------------------------------------------------------------------
# The size of the dtype's own rounding
# --------------------------------------------------------------------------------------------

# Unit roundoff of the dtypes whose own rounding is measured (2^-(mantissa bits + 1)). Narrower
# dtypes are left to the rounding test: a few units of bf16 are the size of real bugs too.
DTYPE_UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float64": 2.0 ** -53}
ROUNDING_SIZE_UNITS = 32.0  # at most this many units of roundoff, where it starts and at the outputs


@dataclass(frozen=True)
class RoundingSize:
    """An error measured against the unit roundoff of the dtype it is computed in: where it
    starts (``rel_l2``: ||c - b|| / ||b||) and at the final outputs. A few units is what the
    same float32 operations in another order give (a reordered sum, another kernel's blocking):
    each addition rounds to within one unit of its result."""

    subject: str
    dtype: str
    unit: float
    rel_l2: float
    output_rel_l2: float
    max_abs: float
    largest: float  # the largest |b| there
    failing: int  # elements outside tolerance there
    elements: int
    failing_largest: float  # the largest |b| among them
    rtol: float
    atol: float
    passing_atol: float | None = None  # with the rtol kept, the atol at which every failing tap passes

    @property
    def units(self) -> float:
        return self.rel_l2 / self.unit

    @property
    def output_units(self) -> float:
        return self.output_rel_l2 / self.unit

    @property
    def max_units(self) -> float:
        """The largest element error in units of roundoff of the largest value there."""
        return self.max_abs / (self.unit * self.largest) if self.largest > 0 else math.inf

    @property
    def applies(self) -> bool:
        return (math.isfinite(self.units) and self.units <= ROUNDING_SIZE_UNITS
                and self.output_units <= ROUNDING_SIZE_UNITS)

    def to_dict(self) -> dict[str, Any]:
        return {"subject": self.subject, "dtype": self.dtype, "unit_roundoff": self.unit, "rel_l2": self.rel_l2,
                "units": self.units, "output_rel_l2": self.output_rel_l2, "output_units": self.output_units,
                "max_abs": self.max_abs, "largest": self.largest, "max_units": self.max_units,
                "failing": self.failing, "elements": self.elements, "failing_largest": self.failing_largest,
                "rtol": self.rtol, "atol": self.atol, "passing_atol": self.passing_atol,
                "limit_units": ROUNDING_SIZE_UNITS, "rounding_size": self.applies}


def rounding_size(baseline: torch.Tensor, candidate: torch.Tensor, dtype: str, subject: str,
                  output_rel_l2: float, rtol: float, atol: float) -> RoundingSize | None:
    """The error ``candidate - baseline`` against ``dtype``'s unit roundoff (None: a dtype not
    measured, or no finite error)."""
    import torch

    unit = DTYPE_UNIT_ROUNDOFF.get(dtype)
    if unit is None or baseline.shape != candidate.shape or baseline.numel() == 0:
        return None
    b = baseline.detach().reshape(-1).to(torch.float64)
    d = candidate.detach().reshape(-1).to(torch.float64) - b
    if not bool(torch.isfinite(d).all()) or not bool(torch.isfinite(b).all()):
        return None
    norm_b = float(b.norm())
    if norm_b == 0.0 or float(d.abs().max()) == 0.0:
        return None
    outside = d.abs() > atol + rtol * b.abs()
    failing = int(outside.sum())
    return RoundingSize(subject, dtype, unit, float(d.norm()) / norm_b, output_rel_l2, float(d.abs().max()),
                        float(b.abs().max()), failing, int(b.numel()),
                        float(b.abs()[outside].max()) if failing else 0.0, rtol, atol)


def passing_atol(pairs: Sequence[tuple[torch.Tensor, torch.Tensor, float]]) -> float:
    """The smallest absolute tolerance (two significant digits, rounded up) at which every
    ``(baseline, candidate, rtol)`` pair is within ``atol + rtol |b|``."""
    import torch

    need = 0.0
    for base, cand, rtol in pairs:
        b = base.detach().reshape(-1).to(torch.float64)
        d = (cand.detach().reshape(-1).to(torch.float64) - b).abs()
        need = max(need, float((d - rtol * b.abs()).max()))
    if need <= 0:
        return 0.0
    scale = 10.0 ** (math.floor(math.log10(need)) - 1)
    return math.ceil(need / scale * (1 + 1e-9)) * scale


# --------------------------------------------------------------------------------------------
# float16's range
# --------------------------------------------------------------------------------------------

FLOAT16_MAX = 65504.0  # float16's largest finite value: past it, a value rounds to Inf


@dataclass(frozen=True)
class Float16Range:
    """Where the candidate first gives NaN or Inf: what shows float16 there (``seen``; empty:
    none, where glmfb looked: ``looked_at``; ``traced``: whether that includes the operations of
    the module that makes it), and the baseline's largest magnitude there (``values_at``: the
    first non-finite tap, or the baseline's run of the operation that first gave NaN or Inf)
    against float16's largest finite value."""

    tap: str
    module: str | None
    baseline_max_abs: float
    beyond: int  # baseline elements past FLOAT16_MAX
    elements: int
    seen: tuple[str, ...]
    looked_at: str
    first_nonfinite: TracedOp | None = None  # the candidate's first operation giving NaN or Inf on finite operands
    traced: bool = False  # the operations of the module that makes it were traced
    values_at: str = "there"  # where the baseline's values were read, as the why says it

    def saw(self) -> dict[str, Any]:
        """What the why's claims about float16 rest on (the diagnosis records it)."""
        seen: dict[str, Any] = {"float16_seen": list(self.seen), "baseline_max_abs": self.baseline_max_abs,
                                "beyond_float16": self.beyond, "float16_traced": self.traced}
        op = self.first_nonfinite
        if op is not None:
            seen["first_nonfinite"] = {"operation": op.operation, "inputs": list(op.inputs), "output": op.output}
        return seen

    def describe(self) -> str:
        """The clause a non-finite why adds: the format, the values against its range, and the
        first operation that gave NaN or Inf."""
        place = self.module or self.tap
        largest = f"{self.baseline_max_abs:.3g}"
        if self.seen and self.beyond:
            text = (f"the candidate computes {place} in float16 ({'; '.join(self.seen)}), and the baseline's values "
                    f"{self.values_at} reach {largest} in magnitude, past float16's largest finite value, "
                    f"{FLOAT16_MAX:.0f} ({self.beyond} of {self.elements} elements beyond it): in float16 they "
                    "overflow to Inf")
        elif self.seen:
            text = (f"the candidate computes {place} in float16 ({'; '.join(self.seen)}), but the baseline's values "
                    f"{self.values_at} stay inside float16's range (at most {largest} in magnitude, against "
                    f"{FLOAT16_MAX:.0f}): what overflows is a value inside it, or something other than the range")
        elif NOT_FLOAT16_RANGE.holds(self.saw()):
            text = (f"glmfb saw no float16 in {place} ({self.looked_at}), so it is not float16's range"
                    + (f" (the baseline's values {self.values_at} reach {largest} in magnitude)"
                       if self.baseline_max_abs else ""))
        else:
            text = (f"glmfb saw no float16 in {place}, but it looked only at {self.looked_at}, not at the operations "
                    "that made the NaN or Inf, so whether float16's range is the cause is not tested")
        first = self.first_nonfinite
        if first is not None:
            text += (f"; the first operation whose output is NaN or Inf on finite operands is {first.operation} in "
                     f"{first.output}" + (f", in {first.site.describe()}" if first.site is not None else ""))
        return text


def float16_range(baseline: torch.Tensor, tap: str, module: str | None, seen: Sequence[str], looked_at: str,
                  first_nonfinite: TracedOp | None = None, traced: bool = False) -> Float16Range:
    """The baseline's finite values at the first non-finite tap against float16's range."""
    import torch

    values = baseline.detach().reshape(-1).to(torch.float64).abs()
    values = values[torch.isfinite(values)]
    largest = float(values.max()) if values.numel() else 0.0
    return Float16Range(tap, module, largest, int((values > FLOAT16_MAX).sum()), int(baseline.numel()), tuple(seen),
                        looked_at, first_nonfinite, traced)
