"""The rules of ``glmfb diff``: what the comparison found in, a diagnosis out.

Each rule looks at the :class:`DiffFindings` of a diff (what failed, where, the shape of the
error along positions and across lengths, the rounding and bias tests, what the two module
trees do not share, the counterfactual reruns) and, when it applies, says what it saw and what
to try next. They are tried in order (see :mod:`glmfb.core.rules`); the first that applies wins.
Every claim a why makes is a measurement in the evidence: a format is named only when rounding
the baseline to it reproduces the error (``rounding_test``), "systematic" only when a scale and
shift of the baseline explain it (``bias``), a position only where the error starts there, and
a boundary (a step, a block of a reordered sum) only where the quiet positions before it are
more than chance gives (:class:`glmfb.diff.shape.QuietRun`).

| rule | fires when |
|---|---|
| ``pass`` | every request is within tolerance on every tap both sides share |
| ``non-finite`` | NaN or Inf in the candidate where the baseline is finite |
| ``rounding-size`` | the error is a few units of its float32/float64 dtype's own roundoff |
| ``position-onset`` | within one request, zero error up to a position and a step there |
| ``growing-with-length`` | the output error grows with the request length across requests |
| ``growing-along-sequence`` | within one request, the error grows with the position |
| ``precision-rounding`` | rounding the baseline's output or operands to a format reproduces the error |
| ``module-tree-differs`` | the error starts in a module whose submodules ran on one side only |
| ``systematic-bias`` | a per-position scale and shift of the baseline explains the error |
| ``parent-forward`` | no module adds the error: it enters in a parent's own forward |
| ``spike`` | the error is confined to a few positions |
| ``generic`` | anything else that fails |
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from glmfb.contract.step import Step, as_step
from glmfb.contract.verdict import Status
from glmfb.core.rules import Diagnosis, Rule
from glmfb.diff.axes import FOLLOWS, Segment
from glmfb.diff.claims import POSITION, Claim
from glmfb.diff.compare import TreeDifferences, group_names, tap_module
from glmfb.diff.counterfactual import KnobResult
from glmfb.diff.evidence import Tokens
from glmfb.diff.localize import ErrorEntry
from glmfb.diff.optrace import TracedOp
from glmfb.diff.rounding import (
    FORMAT_NAMES,
    ROUNDING_SIZE_UNITS,
    BiasTest,
    Float16Range,
    RoundingSize,
    RoundingTest,
)
from glmfb.diff.shape import (
    CHANCE_LEVEL,
    ErrorShape,
    GrowthFit,
    PositionShape,
    PrecisionSignature,
    ZeroRegion,
)

KIND = "diff"


@dataclass(frozen=True)
class DiffFindings:
    """What the diff established, in the terms the rules speak."""

    failed: bool
    requests: int
    failing_requests: int
    request: str | None = None
    module: str | None = None  # where the error starts (local error, or the parent whose forward makes it)
    tap: str | None = None
    position: int | None = None
    local: bool | None = None  # the module's own error exceeds tolerance (None: not measured)
    first_divergent: str | None = None  # first tap outside tolerance, in execution order
    shape: ErrorShape = ErrorShape.NONE
    fit: GrowthFit | None = None  # across requests, else along positions (the error_shape evidence's fit)
    signature: PrecisionSignature | None = None
    dtype: str | None = None  # the baseline's dtype at the first divergent tap
    tokens: Tokens | None = None
    nonfinite_tap: str | None = None
    output_rel_l2: float = 0.0
    rerun: Step | None = None  # the step that reruns the minimal reproducer
    length_fit: GrowthFit | None = None  # output error against request length (three lengths or more)
    profile: PositionShape | None = None  # error along the worst request's positions where it starts
    profile_tap: str | None = None
    onsets: tuple[tuple[int, int], ...] = ()  # (length, onset) of each failing request, when the error steps
    rounding: RoundingTest | None = None
    bias: BiasTest | None = None
    tree: TreeDifferences | None = None
    entry: ErrorEntry | None = None
    counterfactuals: tuple[KnobResult, ...] = ()
    minimize_note: str | None = None
    distributed: tuple[tuple[str, int, str | None], ...] = ()  # (side, world size, backend) of sides on ranks
    on_cuda: bool = False  # the candidate ran on a CUDA device (torch's CUDA switches can act on it)
    size: RoundingSize | None = None  # the error against its dtype's own unit roundoff
    zeros: ZeroRegion | None = None  # the exactly-zero region the error starts with, against chance and across requests
    step: int | None = None  # the generation step of the module call it starts in (live captures: 0 the prefill)
    narrowing: TracedOp | None = None  # the first operation narrower than its inputs where it starts, not the baseline's
    narrowing_module: str | None = None  # the module traced (where the error starts)
    reference: str | None = None  # the dtype of that module's inputs narrowing is measured against
    first_carries: bool | None = None  # the first divergent tap's module's own error is within tolerance
    range: Float16Range | None = None  # non-finite: float16 where it starts, against its range
    token_axis: int | None = None  # the axis read as tokens where the positions are read (None: none found)
    token_axis_basis: str | None = None  # how it was found (glmfb.diff.axes)
    token_axis_note: str | None = None  # which axis, and how it was found, in words
    sequence: Segment | None = None  # a packed request: the sequence the positions are of

    def saw(self) -> dict[str, Any]:
        seen: dict[str, Any] = {
            "failed": self.failed, "requests": self.requests, "failing_requests": self.failing_requests,
            "shape": self.shape.value, "output_rel_l2": self.output_rel_l2,
        }
        for key in ("request", "module", "position", "local", "first_divergent", "dtype", "nonfinite_tap",
                    "token_axis", "token_axis_basis"):
            value = getattr(self, key)
            if value is not None:
                seen[key] = value
        if self.sequence is not None:
            seen.update(sequence=self.sequence.index, sequence_start=self.sequence.start)
        if self.fit is not None:
            seen.update(fit_basis=self.fit.basis, growth_exponent=self.fit.exponent, growth_r2=self.fit.exponent_r2)
        if self.length_fit is not None:
            seen.update(length_growth=self.length_fit.growing, length_growth_factor=self.length_fit.growth_factor)
        if self.profile is not None:
            seen.update(onset=self.profile.onset, step=self.profile.step, growing_along_sequence=self.profile.growing)
        if self.zeros is not None:
            seen.update(zero_run=self.zeros.run.length, zero_run_needed=self.zeros.run.needed,
                        zero_run_boundary=self.zeros.backed)
        if self.signature is not None:
            seen.update(signature_nearest=self.signature.nearest, signature_consistent=self.signature.consistent,
                        observed_rel_error=self.signature.observed)
        if self.rounding is not None:
            seen["rounding_reproduced_by"] = self.rounding.format
            if self.rounding.best is not None:
                seen.update(rounding_size_ratio=self.rounding.best.size_ratio,
                            rounding_correlation=self.rounding.best.correlation)
        if self.bias is not None:
            seen.update(bias_explained=self.bias.explained, systematic=self.bias.systematic)
        if self.size is not None:
            seen.update(roundoff_units=self.size.units, output_roundoff_units=self.size.output_units,
                        rounding_size=self.size.applies)
        if self.tree is not None and self.tree.any:
            seen.update(baseline_only_taps=len(self.tree.baseline_only), candidate_only_taps=len(self.tree.candidate_only),
                        dtype_differences=len(self.tree.dtypes))
        if self.entry is not None and self.entry.module is not None:
            seen["entry"] = self.entry.module
        if self.counterfactuals:
            seen["counterfactual_closes"] = {k.knob: k.closes for k in self.counterfactuals}
        if self.distributed:
            seen["distributed"] = [list(entry) for entry in self.distributed]
        if self.narrowing is not None:
            seen["narrowing"] = self.narrowing.describe(self.reference or "")
        if self.range is not None:
            seen.update(self.range.saw())
        return seen

    def allows(self, claim: Claim) -> bool:
        """Whether what the rules saw meets ``claim``'s precondition (:mod:`glmfb.diff.claims`)."""
        return claim.holds(self.saw())


# --------------------------------------------------------------------------------------------
# Phrases
# --------------------------------------------------------------------------------------------


def _module_text(module: str | None) -> str:
    return "the top-level module" if module == "" else f"{module}"


def _step_text(step: int | None) -> str:
    """' (decode step 2)' for a call of a capture that recorded generation steps."""
    if step is None:
        return ""
    return " (the prefill, step 0)" if step == 0 else f" (decode step {step})"


def _where(f: DiffFindings) -> str:
    if f.module is not None and f.local is True:
        return f"module {f.module} (its own error, measured on the baseline's inputs)"
    if f.module is not None:
        return f"module {_module_text(f.module)}{_step_text(f.step)}"
    if f.tap is not None and (f.tap == "output" or f.tap.startswith("output[")):
        return f"the final outputs ({f.tap}; no module tap shows it earlier)"
    return f"tap {f.tap}" if f.tap else "the outputs"


def _entry_phrase(f: DiffFindings) -> str:
    """'it enters in model's own forward ...' when no module adds the error by itself."""
    entry = f.entry
    if entry is None or entry.module is None:
        return ""
    name = f"{entry.module}" if entry.module else f"the top-level module ({entry.root_class})"
    text = (f"it enters in {name}'s own forward, not in a submodule: no module's own error exceeds tolerance "
            "on the baseline's inputs")
    handed = entry.handed
    if handed is not None:
        child, differing = handed
        names = ", ".join(d.name for d in differing[:3])
        text += f", and {name} hands {child} a different {names} while its own inputs agree on both sides"
    return text


def _upstream_phrase(f: DiffFindings) -> str:
    """'it grows from a difference below tolerance that starts at X' when the climb stopped there."""
    entry = f.entry
    if entry is None or entry.upstream is None:
        return ""
    tap, rel = entry.upstream
    return (f"no module's own error exceeds tolerance on the baseline's inputs: the error grows from a difference "
            f"below tolerance that is already there at {tap} (relative L2 {rel:.2g}, the first tap with any error), "
            f"and {f.first_divergent} only carries it past the tolerance")


def _location(f: DiffFindings) -> str:
    entry = _entry_phrase(f)
    narrowing = _narrowing_clause(f)
    if entry:
        return entry + (f"; {narrowing}" if narrowing else "")
    return f"it starts in {_where(f)}" + (f"; {narrowing}" if narrowing else "") + _first_tap_phrase(f)


def _narrowing_clause(f: DiffFindings) -> str:
    """``there a float32 value is cast to bfloat16 in flash_attention, line 83 of f.py (`...`),
    the first operation ...``: the first operation in the module where the error starts that
    computes in a narrower format than the module's inputs and that the baseline's module, on the
    same inputs, does not run (``dtype_trace``)."""
    op = f.narrowing
    if op is None:
        return ""
    code = f" (`{op.site.code}`)" if op.site is not None and op.site.code else ""
    inputs = f"its {f.reference} inputs" if f.reference else "its inputs"
    return (f"there {op.describe(f.reference or '')}{code}, the first operation in {_module_text(f.narrowing_module)} "
            f"that computes in a narrower format than {inputs} and that the baseline's does not run")


def _narrowing_sentence(f: DiffFindings) -> str:
    clause = _narrowing_clause(f)
    return f" In {_module_text(f.narrowing_module)}, {clause.removeprefix('there ')}." if clause else ""


def _first_tap_phrase(f: DiffFindings) -> str:
    """How the first divergent tap relates to the blamed module, when it is one of the
    module's own submodules (the tap is seen first; the module is where the error is made).
    When that submodule's own error on the baseline's inputs is within tolerance, it comes
    after the computation that makes the error and only carries it: said so, so that it is
    never read as where the error enters."""
    first, module = f.first_divergent, f.module
    if not first or not module or first.partition("#")[0] == module.partition("#")[0]:
        return ""
    if not first.startswith(module.partition("#")[0] + "."):
        return ""
    if f.first_carries:
        return (f"; the first tap outside tolerance, {first}, is a submodule it calls after the computation in "
                f"{module}'s own forward that makes the error, and only carries it (its own error on the baseline's "
                "inputs is within tolerance)")
    return f"; the first tap outside tolerance, {first}, is a submodule it calls"


VARIANT_MEANING = {
    "output": "its output is rounded to {name}",
    "matmul operands": "its matrix products take {name} operands",
    "matmul operands and output": "its matrix products take {name} operands and it returns {name}",
    "product operands": "its products take {name} operands",
    "every operation": "it computes in {name}",
}


SCOPED_MEANING = {
    "output": "what it computes in place of its {scope} is rounded to {name}",
    "matmul operands and output": "what it computes in place of its {scope} takes {name} operands and returns {name}",
    "every operation": "it computes what replaced its {scope} in {name}",
}


def _meaning(r: RoundingTest) -> str:
    assert r.format is not None and r.best is not None
    name = "10-bit-mantissa (float16 or TF32)" if r.ten_bit else r.name
    if r.best.scope:
        return SCOPED_MEANING.get(r.best.variant, "it rounds what replaced its {scope} to {name}").format(
            name=name, scope=r.best.scope)
    return VARIANT_MEANING.get(r.best.variant, "it rounds to {name}").format(name=name)


def _rounding_clause(f: DiffFindings) -> str:
    r = f.rounding
    if r is None or not r.reproduced:
        return ""
    return f"; {r.describe()}"


def _rerun(f: DiffFindings) -> list[Step]:
    return [f.rerun] if f.rerun is not None else []


def _tree_phrase(f: DiffFindings) -> str:
    tree = f.tree
    if tree is None or not tree.any:
        return ""
    parts = []
    if tree.baseline_only or tree.candidate_only:
        parts.append(_only_clause(tree))
    if tree.shapes:
        n = len(tree.shapes)
        parts.append(f"{n} shared {'tap differs' if n == 1 else 'taps differ'} in shape (not compared)")
    if tree.dtypes:
        name, b_dtype, c_dtype = tree.dtypes[0]
        n = len(tree.dtypes)
        parts.append(f"{n} shared {'tap differs' if n == 1 else 'taps differ'} in dtype and "
                     f"{'was' if n == 1 else 'were'} compared in a common one "
                     f"({name}: {b_dtype} in the baseline, {c_dtype} in the candidate)")
    if tree.order_differs:
        parts.append("the shared taps run in another order in the candidate (compared by name)")
    shared = "the one tap" if tree.shared == 1 else f"the {tree.shared} taps"
    return (f" The two paths' module trees differ: glmfb compared {shared} both sides share; "
            + "; ".join(parts) + ".")


def _one_side_only(taps: Sequence[str], modules: Sequence[str]) -> tuple[int, str, tuple[bool, bool], str]:
    """What one side only has, counted and grouped: how many, ``12 modules`` / ``1 tap`` /
    ``2 modules and 1 tap``, which of the two kinds it has, and the names grouped
    (``q_proj, k_proj, v_proj in 4 layers``). A tap of a module the other side also runs (an
    output the other side's module does not return) counts as a tap."""
    whole = set(modules)
    loose = [t for t in taps if tap_module(t) not in whole]
    counts = [f"{n} {unit}{'' if n == 1 else 's'}" for n, unit in ((len(modules), "module"), (len(loose), "tap")) if n]
    return (len(modules) + len(loose), " and ".join(counts), (bool(modules), bool(loose)),
            group_names([*modules, *loose]))


def _only_clause(tree: TreeDifferences) -> str:
    """``12 modules are in the baseline only (q_proj, k_proj, v_proj in 4 layers) and 4 in the
    candidate only (qkv_proj in 4 layers), not compared (the full lists are in the evidence)``:
    one clause however many layers repeat the difference; ``tree_differences`` lists them all."""
    b = (*_one_side_only(tree.baseline_only, tree.baseline_only_modules), "baseline")
    c = (*_one_side_only(tree.candidate_only, tree.candidate_only_modules), "candidate")
    first, second = (b, c) if b[0] else (c, b)
    count, units, kinds, names, side = first
    text = f"{units} {'is' if count == 1 else 'are'} in the {side} only ({names})"
    count2, units2, kinds2, names2, side2 = second
    if not count2:
        text += f" and none in the {side2} only"
    else:
        shown = str(count2) if kinds2 == kinds and count > 1 and count2 > 1 else units2
        text += f" and {shown} in the {side2} only ({names2})"
    return text + ", not compared (the full lists are in the evidence)"


def _counterfactual_phrase(f: DiffFindings) -> str:
    if not f.counterfactuals:
        return ""
    return " Counterfactual: " + "; ".join(k.describe() for k in f.counterfactuals) + "."


def _counterfactual_steps(f: DiffFindings) -> list[str]:
    steps = []
    for knob in f.counterfactuals:
        run = knob.closing_run
        if run is not None:
            value = "true" if run.value is True else "false" if run.value is False else str(run.value)
            steps.append(f"set {knob.knob}={value} in the candidate: the diff passes with it")
    return steps


def _narrowing_steps(f: DiffFindings) -> list[str]:
    """Reading the line that narrows, when the trace found one in the user's code."""
    op = f.narrowing
    if op is None or op.site is None:
        return []
    keep = f.reference or "the module's own dtype"
    return [f"read line {op.site.line} of {op.site.shown_file} ({op.site.function}: `{op.site.code}`): it "
            f"{'casts to' if op.cast else 'computes in'} {op.output}; keep that value in {keep} and rerun the diff"]


def _suffix(f: DiffFindings, tree: bool = True, narrowing: bool = True) -> str:
    return ((_narrowing_sentence(f) if narrowing else "") + _left_out_phrase(f) + (_tree_phrase(f) if tree else "")
            + _counterfactual_phrase(f))


def _left_out_phrase(f: DiffFindings) -> str:
    """`` 2 of the 15 rounding trials were left out as invalid ...``: a trial whose own result
    broke is said, never read as evidence."""
    text = f.rounding.left_out_text() if f.rounding is not None else ""
    return f" {text[0].upper()}{text[1:]}." if text else ""


# --------------------------------------------------------------------------------------------
# The rules' explanations
# --------------------------------------------------------------------------------------------

Explained = tuple[str, list[Step | str]]  # why, and the next steps (a string is a plain step)


def _passed(f: DiffFindings) -> Explained:
    tree = _tree_phrase(f)
    if f.output_rel_l2 == 0.0 and not (f.tree is not None and f.tree.any):
        return f"All {f.requests} requests match exactly (zero error on every tap).", []
    what = "every tap both sides share" if f.tree is not None and f.tree.any else "every tap"
    exact = "match exactly on" if f.output_rel_l2 == 0.0 else "are within tolerance on"
    why = f"All {f.requests} requests {exact} {what}"
    if f.output_rel_l2 > 0:
        why += f" (worst output relative L2 error {f.output_rel_l2:.2g})"
    return why + "." + _ranks_phrase(f) + tree, []


def _ranks_phrase(f: DiffFindings) -> str:
    """`` The candidate ran on 2 torch.distributed ranks (gloo), the baseline in one process.``"""
    if not f.distributed:
        return ""
    on_ranks = {side: (size, backend) for side, size, backend in f.distributed}
    parts = [f"the {side} ran on {size} torch.distributed ranks" + (f" ({backend})" if backend else "")
             for side, (size, backend) in on_ranks.items()]
    parts += [f"the {side} in one process" for side in ("baseline", "candidate") if side not in on_ranks]
    sentence = ", ".join(parts)
    return f" {sentence[0].upper()}{sentence[1:]}."


def _nonfinite(f: DiffFindings) -> Explained:
    why = f"The candidate produces NaN or Inf where the baseline is finite, first at {f.nonfinite_tap}"
    why += f": {f.range.describe()}." if f.range is not None else "."
    return why + _suffix(f, narrowing=False), [
        *_counterfactual_steps(f), *_narrowing_steps(f),
        f"check {f.module or f.nonfinite_tap} for overflow (a narrower dtype's range), division by zero or log of zero",
        *_rerun(f),
    ]


def _dtype_rounding(f: DiffFindings) -> bool:
    """The error is a few units of its own dtype's roundoff where it starts and at the outputs,
    no narrower format reproduces it and no scale or shift explains it."""
    return (f.size is not None and f.size.applies and not (f.rounding is not None and f.rounding.reproduced)
            and not (f.bias is not None and f.bias.systematic))


def _rounding_size(f: DiffFindings) -> Explained:
    z = f.size
    assert z is not None
    name = z.dtype
    where = "where it starts" if f.local is True else "where it is first seen"
    why = (f"The error is the size of {name}'s own rounding: {where} ({z.subject}) its relative L2 error is "
           f"{z.rel_l2:.2g}, {z.units:.1f} units of {name} roundoff ({z.unit:.2g}), and its largest element error is "
           f"{z.max_units:.1f} units of roundoff of the largest value there; at the final outputs {z.output_units:.1f} units. "
           f"The same {name} operations in another order give errors of this size (a sum split into blocks and "
           "added in another order, as a chunked or context-parallel scan does, or another kernel's blocking)")
    r = f.rounding
    if r is not None and r.best is not None:
        ratio = r.best.size_ratio
        why += (", and no rounding of the baseline to a narrower format reproduces it (closest: size "
                + (f"{ratio:.0f}x" if ratio >= 100 else f"{ratio:.2g}x") + " the observed error)")
    why += "."
    why += _zero_region_phrase(f)
    entry = f.entry
    if entry is not None and entry.module is not None:
        name_e = f"{entry.module}" if entry.module else f"the top-level module ({entry.root_class})"
        shown = f.first_divergent or "the first tap outside tolerance"
        why += (f" It enters between modules, in {name_e}'s own forward: no module's own error exceeds tolerance on "
                f"the baseline's inputs and {shown}'s inputs already differ, so {shown} is only the first module "
                "after the computation that makes it.")
    elif f.local is True and f.module is not None:
        why += f" It is made in module {f.module} by itself (its own error on the baseline's inputs)."
    elif _upstream_phrase(f):
        why += f" {_upstream_phrase(f)[0].upper()}{_upstream_phrase(f)[1:]}."
    elif f.first_divergent is not None:
        why += (f" It is first seen at {f.first_divergent}; between captures glmfb cannot rerun it, so whether "
                f"{f.first_divergent} or the code that computes its input makes it is not tested.")
    steps: list[Step | str] = [*_counterfactual_steps(f)]
    if z.failing:
        why += (f" The tolerance (rtol {z.rtol:.2g}, atol {z.atol:.2g}) is tighter than {name} allows for such a "
                f"computation: the {z.failing} of {z.elements} elements outside it there are small next to the "
                f"values computed (|b| at most {z.failing_largest:.3g}, against up to {z.largest:.3g}), and a "
                "reordered sum's error scales with the terms it adds, not with its result")
        if z.passing_atol:
            why += f"; with rtol kept, an atol of {z.passing_atol:.2g} passes every tap of every request"
            steps.append(f"if the other order is intended, widen the absolute tolerance to {z.passing_atol:.2g} "
                         "(--atol): with it every tap of every request passes")
        why += "."
    steps.append("if the candidate must match the baseline bit for bit, make it add in the baseline's order "
                 "(the same blocks, the same order of the partial sums)")
    return why + _suffix(f), steps


def _zero_region_phrase(f: DiffFindings) -> str:
    """Where the reordering starts along the sequence, only when the evidence backs it: a region
    of exactly zero error at the start, longer than chance gives (``f.zeros``: at least 4
    positions, and a run that short is below 1% likely when the share of zero-error positions
    after it is the chance of one), and seen in another request at the same position or fraction
    of the length where other requests show the error. Otherwise no position is named."""
    z = f.zeros
    if z is None or z.run.length == 0 or not f.allows(POSITION):
        return ""
    run = z.run
    n, length = run.length, run.positions
    if z.backed:
        text = (f" The error is exactly zero before position {n} ({n / length:.3g} of the {length} positions) and "
                "of that size after it")
        agreeing = z.agreeing
        if agreeing:
            at = "position" if z.same_position else "fraction of the length"
            listing = ", ".join(f"{o.length} of {o.positions}" for o in agreeing)
            text += (f", and so in {len(agreeing)} other request{'' if len(agreeing) == 1 else 's'} at the same "
                     f"{at} ({listing} positions)")
        return text + ": the reordering starts there (a block boundary)."
    first = "Its first position has" if n == 1 else f"Its first {n} positions have"
    if not run.beyond_chance and run.chance < CHANCE_LEVEL:
        return (f" {first} zero error, fewer than the {run.floor} positions a region of zero error needs before "
                "glmfb names where the reordering starts, so it names none.")
    if not run.beyond_chance:
        return (f" {first} zero error, but {100 * run.rate:.0f}% of the positions after "
                f"{'it' if n == 1 else 'them'} have zero error too: a run of {n} comes by chance "
                f"({run.chance:.2g}; {run.needed} would not), so glmfb names no position where the reordering starts.")
    return (f" {first} zero error, but in none of the {len(z.others)} other "
            f"request{'' if len(z.others) == 1 else 's'} that show the error does such a region end at the same "
            "position or fraction of the length, so glmfb names no position where the reordering starts.")


def _onsets_phrase(f: DiffFindings) -> str:
    """Whether the onset sits at one position in every request (a window, a mask, a table row)
    or at the same fraction of each (a boundary that moves with the length: segments, shards)."""
    by_length = sorted(set(f.onsets))
    if len({length for length, _ in by_length}) < 2 or not f.allows(POSITION):
        return ""
    listing = ", ".join(f"{onset} of {length}" for length, onset in by_length)
    each = "every failing request" if f.sequence is None else "the first failing sequence of every failing request"
    if len({onset for _, onset in by_length}) == 1:
        return f" It starts at the same position in {each} ({listing} positions): a fixed position."
    fractions = [onset / length for length, onset in by_length]
    if max(fractions) - min(fractions) <= 1.0 / min(length for length, _ in by_length):
        return (f" It starts at the same fraction of {each} ({listing} positions, "
                f"{fractions[0]:.3g} of the length): a boundary that moves with the length (segments or shards).")
    return f" Its onset differs between requests ({listing} positions)."


def _failing_share(share: float, positions: int) -> str:
    """``80% of the 20 positions``; ``the one position`` when there is one."""
    return "the one position" if positions == 1 else f"{100 * share:.0f}% of the {positions} positions"


def _axis_sentence(f: DiffFindings) -> str:
    """How the positions' axis was found, when it was not seen to follow the length: an
    assumption the why states."""
    if f.token_axis is None or f.token_axis_basis in (None, FOLLOWS) or not f.token_axis_note:
        return ""
    note = f.token_axis_note
    return f" {note[0].upper()}{note[1:]}."


def _sequence_phrase(f: DiffFindings) -> str:
    """`` of sequence 1`` when the positions are those of one sequence of a packed request."""
    return f" of sequence {f.sequence.index}" if f.sequence is not None else ""


def _packed_sentence(f: DiffFindings) -> str:
    """Which sequence of a packed request the positions are of, and where it lies in it."""
    s = f.sequence
    if s is None:
        return ""
    return (f"In request {f.request}, packed, the positions are those of its sequence {s.index} (its tokens {s.start} "
            f"to {s.end - 1}, the sequence that holds the first failing one), counted from its start: ")


def _onset(f: DiffFindings) -> Explained:
    p = f.profile
    assert p is not None
    after = p.positions - p.onset
    zero = "Zero error" if f.sequence is None else "zero error"
    why = (f"{_packed_sentence(f)}{zero} up to position {p.onset - 1}, large from position {p.onset} on: "
           f"{_failing_share(p.failing_after, after)} from there fail{'s' if after == 1 else ''} (median relative error "
           f"{p.after_median:.2g}, at most {p.before_max:.2g} before), a step at position {p.onset}"
           f"{_sequence_phrase(f)} rather than a growth; {_location(f)}.")
    why += _onsets_phrase(f) + _axis_sentence(f)
    if f.length_fit is not None and f.length_fit.growing:
        why += f" Across requests the error also grows with context length ({_fit_text(f.length_fit, 'length')} tokens)."
    where = _module_text(f.module) if f.module is not None else (f.tap or "the outputs")
    return why + _suffix(f, narrowing=False), [
        *_counterfactual_steps(f), *_narrowing_steps(f),
        f"read what {where} does at position {p.onset}{_sequence_phrase(f)}: what changes there (an attention mask "
        "or window, a table "
        "indexed by position, a chunk or segment boundary)",
        *_rerun(f),
    ]


def _fit_text(fit: GrowthFit, unit: str) -> str:
    low, high = min(fit.lengths), max(fit.lengths)
    return (f"log-log exponent {fit.exponent:.2f}, r² {fit.exponent_r2:.2f}, {fit.growth_factor:.1f}x from "
            f"{unit} {low:g} to {high:g}")


def _rise_text(p: PositionShape) -> str:
    assert p.fit is not None
    if p.fit.growing:
        return _fit_text(p.fit, "position")
    return (f"it rises {p.rise:.1f}x from the first positions and levels off, rank correlation with the "
            f"position {p.rank_correlation:.2f}; log-log exponent {p.fit.exponent:.2f}, r² {p.fit.exponent_r2:.2f}")


def _tf32_claimed(f: DiffFindings) -> bool:
    return f.rounding is not None and f.rounding.format == "tf32"


def _full_fp32_switches(f: DiffFindings) -> str:
    """Where a kernel is told to keep full fp32 products; torch's switch only on CUDA, where the
    candidate ran (on a CPU the TF32 rounding is in the code itself)."""
    if f.on_cuda:
        return "Triton tl.dot input_precision='ieee' or 'tf32x3'; torch.backends.cuda.matmul.allow_tf32=False"
    return "the code that rounds the operands; in a Triton kernel, tl.dot input_precision='ieee' or 'tf32x3'"


def _growth_steps(f: DiffFindings, what: str) -> list[Step | str]:
    steps: list[Step | str] = [*_counterfactual_steps(f), *_narrowing_steps(f)]
    if f.rounding is not None and f.rounding.ten_bit:
        steps.append(f"keep the products in {f.module or f.tap} in float32: no float16 cast of their operands, "
                     f"and no TF32 ({_full_fp32_switches(f)}), then rerun the diff")
    elif _tf32_claimed(f):
        steps.append(f"compute the products in {f.module or f.tap} in full fp32 ({_full_fp32_switches(f)}) and "
                     "rerun the diff")
    elif f.rounding is not None and f.rounding.format is not None:
        steps.append(f"keep {f.module or f.tap} out of {f.rounding.name} (an fp32 state, fp32 accumulators) and rerun")
    else:
        steps.append(what)
    return [*steps, *_rerun(f)]


_ROUNDOFF_NAMES = {"bf16": "bf16 (8-bit mantissa, 2^-8)", "tf32/fp16": "TF32/fp16 (10-bit mantissa, 2^-11)",
                   "fp32": "fp32 (2^-24)"}


def _closed_by_a_knob(f: DiffFindings) -> str:
    """When the rounding test could not be run where the error starts (captures only) but a
    counterfactual knob closes the gap, the error's size and that knob together are the
    evidence of a precision loss: say both, with their numbers, and name no more than that."""
    closing = next((k for k in f.counterfactuals if k.closing_run is not None), None)
    s = f.signature
    if closing is None or s is None or not s.consistent or s.nearest not in _ROUNDOFF_NAMES:
        return ""
    run = closing.closing_run
    assert run is not None
    return (f": its relative error {s.observed:.2g} is the size of {_ROUNDOFF_NAMES[s.nearest]} rounding, and "
            f"{closing.knob}={_show_value(run.value)} closes the gap (the counterfactual below), so the precision "
            "of what it computes there accumulates over the context.")


def _show_value(value: Any) -> str:
    return "true" if value is True else "false" if value is False else str(value)


def _growing_with_length(f: DiffFindings) -> Explained:
    fit = f.length_fit
    assert fit is not None
    why = f"The error grows with context length ({_fit_text(fit, 'length')} tokens); {_location(f)}"
    why += _rounding_clause(f)
    if f.rounding is not None and f.rounding.reproduced:
        why += f", so {_meaning(f.rounding)}, and the rounding accumulates over the context."
    elif _closed_by_a_knob(f):
        why += _closed_by_a_knob(f)
    else:
        why += ": something there accumulates over the context (a recurrent state, a reduction, a table indexed by position)."
    place = f.module if f.module is not None else (f.tap or "the outputs")
    return why + _suffix(f, narrowing=False), _growth_steps(
        f, f"find what in {_module_text(place)} depends on the context length (an accumulated state, a "
           "position-dependent table) and compare it at the longest request")


def _growing_along_sequence(f: DiffFindings) -> Explained:
    p = f.profile
    assert p is not None and p.fit is not None
    why = (f"Within request {f.request}, the error grows along the sequence from position {p.start} on "
           f"({_rise_text(p)}); {_location(f)}{_rounding_clause(f)}")
    if f.rounding is not None and f.rounding.reproduced:
        why += f", so {_meaning(f.rounding)}, and the rounding accumulates from position to position."
    else:
        why += (": a quantity that depends on the position drifts further at every step (rotary angles, a decay "
                "gate, a recurrent state).")
    why += _axis_sentence(f)
    place = f.module if f.module is not None else (f.tap or "the outputs")
    return why + _suffix(f, narrowing=False), _growth_steps(
        f, f"compare what {_module_text(place)} computes from the position (rotary angles, decay gates, a "
           "recurrent state) at the last positions of the request")


def _rounded(f: DiffFindings) -> Explained:
    r = f.rounding
    assert r is not None and r.format is not None
    name = "float16 or TF32" if r.ten_bit else FORMAT_NAMES[r.format]
    why = f"The {_where(f)} adds error by itself: {r.describe()}, so {_meaning(r)}"
    why += "; the layers after it only inherit the error." if f.local is True else "."
    place = f.module or f.tap or "the module"
    keep = f.dtype if f.dtype and f.dtype not in ("bfloat16", "float16") else "the baseline's dtype"
    return why + _suffix(f), [
        *_counterfactual_steps(f), *_narrowing_steps(f),
        (f"look for a float16 cast or an autocast region in {place}, or TF32 in its products "
         + ("(torch.backends.cuda.matmul.allow_tf32, Triton tl.dot input_precision)" if f.on_cuda else
            "(operands rounded to 10 mantissa bits in the code, Triton tl.dot input_precision)") if r.ten_bit else
         f"look for a {name} cast or an autocast region in {place}")
        + f"; keep it in {keep}, or widen the tolerance for it with --tol '{place}*=RTOL,ATOL' if intended",
        *_rerun(f),
    ]


def _tree_differs(f: DiffFindings) -> Explained:
    assert f.tree is not None and f.module is not None
    only_b, only_c = f.tree.modules_below(f.module)
    parts = []
    if only_b:
        parts.append(f"{group_names([_short(m, f.module) for m in only_b], parent=f.module)} run as modules in the "
                     "baseline only")
    if only_c:
        parts.append(f"{group_names([_short(m, f.module) for m in only_c], parent=f.module)} in the candidate only")
    why = (f"The error starts in {_where(f)}, and below it the two paths differ: {'; '.join(parts)}. glmfb "
           f"compared the {f.tree.shared} taps both sides share and cannot look inside the candidate's "
           f"{f.module}: the computation that replaced its submodules computes something else.")
    return why + _suffix(f, tree=False), [
        *_counterfactual_steps(f), *_narrowing_steps(f),
        f"compare the candidate's forward of {f.module} with the baseline's (what replaced "
        f"{group_names([_short(m, f.module) for m in (only_b or only_c)], parent=f.module)}: activation, order of "
        "operations, weights used)",
        *_rerun(f),
    ]


def _short(module: str, parent: str) -> str:
    return module[len(parent) + 1:] if module.startswith(parent + ".") else module


def _systematic(f: DiffFindings) -> Explained:
    b = f.bias
    assert b is not None
    why = f"The error is systematic, not rounding: in {_where(f)}, {b.describe()}"
    r = f.rounding
    if r is not None and not r.reproduced and r.best is not None:
        why += (f", and no rounding of the baseline to a narrower format reproduces it (closest: size "
                f"{r.best.size_ratio:.2g}x the observed error, correlation {r.best.correlation:.2f})")
    why += ": a changed constant (an epsilon, a scale, an offset) rather than lost bits."
    entry = _entry_phrase(f)
    if entry:
        why += f" {entry[0].upper()}{entry[1:]}."
    place = f.module or f.tap or "the module"
    return why + _suffix(f), [
        *_counterfactual_steps(f), *_narrowing_steps(f),
        f"compare the constants {place} uses on the two sides (an epsilon, a scale, an offset, the config "
        "fields it reads)",
        *_rerun(f),
    ]


def _parent_forward(f: DiffFindings) -> Explained:
    entry = _entry_phrase(f)
    upstream = _upstream_phrase(f)
    if upstream and f.entry is not None and f.entry.upstream is not None:
        why = f"The first tap outside tolerance is {f.first_divergent}, but {upstream}."
        step = (f"diff {f.entry.upstream[0]} with a tolerance tight enough to see its error (--tol "
                f"'{f.entry.upstream[0]}*=RTOL,ATOL'): the error is made there or before it")
    elif entry:
        why = f"The first tap outside tolerance is {f.first_divergent}; {entry}."
        module = f.entry.module if f.entry is not None else None
        step = (f"read {_module_text(module)}'s forward: what it computes and hands its submodules "
                "(a mask, a position table, a constant)")
    else:
        why = (f"The first tap outside tolerance is {f.first_divergent}, but no module's own error exceeds "
               "tolerance on the baseline's inputs: the error enters in code between tapped modules (a parent's "
               "forward), or grows from differences below tolerance upstream.")
        step = (f"read the code that produces the inputs of {f.first_divergent} in its parent's forward, "
                "or tighten the tolerance on the upstream taps (--tol) to see where the first difference appears")
    return why + _suffix(f), [*_counterfactual_steps(f), *_narrowing_steps(f), step, *_rerun(f)]


def _spike(f: DiffFindings) -> Explained:
    why = (f"The error is confined to a few positions (first at position {f.position}) in {_where(f)}: "
           "a boundary, mask or indexing problem rather than a precision loss." + _axis_sentence(f))
    return why + _suffix(f), [*_counterfactual_steps(f), *_narrowing_steps(f),
                              f"inspect {f.module or f.tap} at position {f.position} (masks, chunk boundaries, padding)",
                              *_rerun(f)]


def _generic(f: DiffFindings) -> Explained:
    shape = {ErrorShape.CONSTANT: "about constant across lengths", ErrorShape.GROWING: "growing with length"}.get(
        f.shape, f.shape.value)
    why = f"Outputs differ beyond tolerance; the error starts in {_where(f)} and is {shape}."
    r = f.rounding
    if r is not None and not r.reproduced and r.best is not None:
        why += (f" No rounding of the baseline to a narrower format reproduces it (closest: size "
                f"{r.best.size_ratio:.2g}x, correlation {r.best.correlation:.2f}).")
    place = f.module or f.tap or "output"
    return why + _suffix(f), [*_counterfactual_steps(f), *_narrowing_steps(f),
                              f"diff {place} in isolation (--tap '{place}*') and read its per-position error",
                              *_rerun(f)]


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


def _rule(name: str, applies: Callable[[DiffFindings], bool], explain: Callable[[DiffFindings], Explained],
          doc: str, status: Status = Status.FAIL) -> Rule[DiffFindings]:
    def check(f: DiffFindings) -> Diagnosis | None:
        if not applies(f):
            return None
        why, steps = explain(f)
        return Diagnosis(status, why, tuple(map(as_step, steps)))

    return Rule(name, KIND, check, doc)


def _tree_below(f: DiffFindings) -> bool:
    if f.tree is None or f.module is None or f.local is not True:
        return False
    only_b, only_c = f.tree.modules_below(f.module)
    return bool(only_b or only_c)


def _growing_profile(f: DiffFindings) -> bool:
    return f.profile is not None and f.profile.growing and f.profile.fit is not None and f.allows(POSITION)


RULES: tuple[Rule[DiffFindings], ...] = (
    _rule("pass", lambda f: not f.failed, _passed, "every request within tolerance on every shared tap", Status.PASS),
    _rule("non-finite", lambda f: f.shape is ErrorShape.NON_FINITE, _nonfinite,
          "NaN or Inf in the candidate where the baseline is finite"),
    _rule("rounding-size", _dtype_rounding, _rounding_size,
          f"the error is at most {ROUNDING_SIZE_UNITS:g} units of its float32/float64 dtype's roundoff where it starts "
          "and at the outputs, no narrower format reproduces it and no scale explains it"),
    _rule("position-onset", lambda f: f.profile is not None and f.profile.step and f.allows(POSITION), _onset,
          "within one request, zero error up to a position and a step there"),
    _rule("growing-with-length", lambda f: f.length_fit is not None and f.length_fit.growing, _growing_with_length,
          "the output error grows with the request length (exponent >= 0.3, r² >= 0.7, 2x or more over the lengths)"),
    _rule("growing-along-sequence", _growing_profile, _growing_along_sequence,
          "within one request, the error grows with the position from its onset on"),
    _rule("precision-rounding", lambda f: f.rounding is not None and f.rounding.reproduced, _rounded,
          "rounding the baseline's output or operands to a narrower format reproduces the error"),
    _rule("module-tree-differs", _tree_below, _tree_differs,
          "the error starts in a module whose submodules ran on one side only"),
    _rule("systematic-bias", lambda f: f.bias is not None and f.bias.systematic, _systematic,
          "a per-position scale and shift of the baseline explains most of the error, and no rounding does"),
    _rule("parent-forward", lambda f: f.local is False, _parent_forward,
          "no module's own error exceeds tolerance: the error enters in a parent's forward"),
    _rule("spike", lambda f: f.shape is ErrorShape.SPIKE and f.allows(POSITION), _spike,
          "error confined to a few positions"),
    _rule("generic", lambda f: True, _generic, "outputs differ beyond tolerance"),
)


def rule_table() -> Sequence[tuple[str, str]]:
    """(name, what makes it fire) of every built-in rule, in order."""
    return [(rule.name, rule.doc) for rule in RULES]
