"""The rules of ``glmfb bench``: measured changes and the operator diff in, a diagnosis out.

The statistics decide, per shape, whether the candidate is slower (regression), faster
(improvement), equivalent within the threshold, or not decided yet. The rules turn that, plus
the operator diff of the shape that decided the verdict (:mod:`glmfb.bench.opdiff`), into the
verdict's status and why. They are tried in order; the first that applies wins:

=========================  ====================================================================
too-few-blocks             the budget did not fit enough blocks on some shape: inconclusive
redundant-recomputation    slower; most added time is in the same operator on the same inputs
                           (shapes, strides, dtypes, arguments) called k >= 1.5 times as often
lost-fusion                slower; a computing operator of the baseline is gone, and operators
                           only the candidate runs (two or more) carry most of the added time
memory-traffic             slower; a copy only the candidate makes (or makes larger) writes a
                           materialized intermediate, and the copy with the operators that read
                           more bytes per call carries most of the added time
slower-op                  slower; operators called as often (views aside) carry most of the
                           added time (the why says what differs in their inputs: strides,
                           dtype, shapes, arguments, or nothing the profile records), or one
                           operator of the baseline replaced by one other
extra-ops                  slower; operators only the candidate runs carry most of the added
                           time (and none of the rules above applies)
more-calls                 slower; operators both run, called k >= 1.5 times as often on other
                           inputs, carry most of the added time
regression                 slower, and no pattern above carries most of the added time (or no
                           operator diff was taken)
undecided                  some shape's interval straddles the threshold: inconclusive
environment-differs        not slower, but the sides' environments differ: warn
recomputation-removed      faster; the same calls on the same inputs, made k times less often,
                           carry most of the saved time
improvement                faster
equivalent                 every interval inside ±threshold
=========================  ====================================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from glmfb.bench.evidence import InputRow, OpDiff, OpRow
from glmfb.bench.opdiff import REPEATED, SAME_CALLS, call_ratio, repeated_input
from glmfb.contract.step import Step
from glmfb.contract.verdict import Status
from glmfb.core.measure.hostload import HostLoad, busy_note
from glmfb.core.rules import Claim, Diagnosis, Rule
from glmfb.core.targets import side_labels

KIND = "bench"
MAJORITY = 0.5  # of the added time
MORE_BYTES = 1.25  # an operator reading this many times the bytes per call reads "more"
MIN_COPY_SHARE = 0.03  # of the added time, at least, in the copy of a materialized intermediate (it costs something)
MIN_COPY_SIZE = 0.1  # the copy writes at least this fraction of the largest operator's input bytes
MIN_FUSED_SHARE = 0.1  # of the baseline's self time, at least, in the operator the candidate lost


@dataclass(frozen=True)
class ShapeOutcome:
    """What the statistics said about one shape."""

    shape: str
    decision: str  # regression | improvement | equivalent | undecided | too-few-blocks
    change: float | None = None
    low: float | None = None
    high: float | None = None
    blocks: int = 0
    needed_blocks: float | None = None  # more blocks that would decide it (undecided only)
    blocks_per_s: float = 0.0
    aa_change: float | None = None
    aa_biased: bool = False
    floor: float = 0.0


@dataclass(frozen=True)
class HotFigure:
    """The hot check of the focus shape: the change with one input set reused (inputs hot in
    cache), its 95% interval, and whether it differs from the main measurement's
    (:func:`hot_differs`)."""

    change: float
    low: float
    high: float
    differs: bool


def hot_differs(cold: tuple[float, float, float], hot: tuple[float, float, float], threshold: float) -> bool:
    """Whether the hot change differs from the main (cold) one: each ``(value, low, high)``, at
    one confidence level (the engine puts both at 95%); their intervals do not overlap and the
    two changes, as ratios, lie further apart than the threshold (+49% and +98% do at 5%:
    1.98 / 1.49 = 1.33; noise between two short runs of the same change does not)."""
    apart = hot[1] > cold[2] or hot[2] < cold[1]
    if not apart or min(cold[0], hot[0]) <= -1.0:
        return False
    return abs(math.log1p(hot[0]) - math.log1p(cold[0])) > math.log1p(threshold)


@dataclass(frozen=True)
class BenchFindings:
    """What a comparison established, in the terms the rules speak."""

    baseline: str  # kernel names (the candidate's is where.kernel)
    candidate: str
    threshold: float
    budget_s: float
    shapes: tuple[ShapeOutcome, ...]
    geomean: float | None = None
    geomean_low: float | None = None
    geomean_high: float | None = None
    focus: str | None = None  # the shape the verdict speaks about
    op_diff: OpDiff | None = None
    device: str = "cpu"
    reproduce: Step | None = None  # the step that reruns the comparison on the worst shape
    more_evidence: Step | None = None  # the step with the budget that would decide it
    saved: bool = False  # compared from saved files, not measured now
    saved_in_process: bool = False  # both saved sides come from one in-process run (one file)
    saved_runs_note: str = ""  # what a saved comparison's interval carries between processes
    unit: str = "shape"  # what the comparisons are of: "shape", or "benchmark" (pytest-benchmark)
    env_differences: tuple[str, ...] = ()  # "python: 3.11.7 vs 3.12.1", when the sides' environments differ
    approximate: int = 0  # saved comparisons made from summaries only (no raw samples)
    host_load: HostLoad | None = None  # the rest of the host while the shapes were measured
    labels: tuple[str, str] | None = None  # how a why names (baseline, candidate); None: from the kernel names
    # The focus shape's cache regime in words (glmfb.core.measure.cache.Regime.clause: "inputs cold in
    # cache (4 rotated input sets, 64 MiB in all, beyond the 32 MiB last-level cache)"); "" unknown.
    regime: str = ""
    hot: HotFigure | None = None  # the hot check of the focus shape (a pair measured now)

    # ---- derived ---------------------------------------------------------------------------

    @property
    def names(self) -> tuple[str, str]:
        """(baseline, candidate) as a why names them, told apart (:func:`glmfb.core.targets.side_labels`):
        two kernels both called ``make_norm`` never read "make_norm is slower than make_norm"."""
        return self.labels if self.labels is not None else side_labels(self.baseline, self.candidate)

    def of(self, decision: str) -> list[ShapeOutcome]:
        return [s for s in self.shapes if s.decision == decision]

    @property
    def focus_outcome(self) -> ShapeOutcome | None:
        return next((s for s in self.shapes if s.shape == self.focus), None)

    def saw(self) -> dict[str, Any]:
        seen: dict[str, Any] = {
            "shapes": len(self.shapes),
            "regression": len(self.of("regression")),
            "improvement": len(self.of("improvement")),
            "equivalent": len(self.of("equivalent")),
            "undecided": len(self.of("undecided")),
            "threshold": self.threshold,
        }
        focus = self.focus_outcome
        if focus is not None and focus.change is not None:
            seen.update(focus=focus.shape, change=focus.change, ci=[focus.low, focus.high])
        if self.op_diff is not None:
            diff = self.op_diff
            seen["top_ops"] = [op.op for op in diff.ops[:3]]
            seen["repeated_inputs_share"] = round(diff.repeated_inputs_share, 3)
            seen["only_in_candidate"] = list(diff.only_in_candidate[:6])
            seen["only_in_candidate_share"] = round(diff.only_in_candidate_share, 3)
            seen["only_in_baseline"] = list(diff.only_in_baseline[:6])
            seen["only_in_baseline_share"] = round(diff.only_in_baseline_share, 3)
        return seen

    @property
    def slower(self) -> bool:
        return bool(self.of("regression"))


# --------------------------------------------------------------------------------------------
# Reading the operator diff
# --------------------------------------------------------------------------------------------


def count_ratio(op: OpRow) -> float:
    return call_ratio(op.baseline_calls, op.candidate_calls)


def _same_calls(op: OpRow) -> bool:
    return op.baseline_calls > 0 and op.candidate_calls > 0 and abs(count_ratio(op) - 1.0) <= SAME_CALLS


def _share_of(ops: Sequence[OpRow]) -> float:
    return sum(op.share for op in ops)


def work_share(diff: OpDiff) -> float:
    """The share of the added time outside views (slices, transposes, reshapes move no data:
    their time is per-call overhead, not work); the rules weigh a pattern against this."""
    return sum(op.share for op in diff.ops if op.share > 0 and not op.view) or 1.0


def _decides(share: float, diff: OpDiff) -> bool:
    """Whether a pattern carrying ``share`` of the added time carries most of the work added."""
    return share / work_share(diff) > MAJORITY


def _of_work(share: float, diff: OpDiff) -> str:
    """``+71% of the added time`` (with the share of the work when views carry part of it)."""
    work = work_share(diff)
    text = f"{share:+.0%} of the added time"
    if share > 1.005:
        # Shares by operator and inputs can exceed the operators' net added time when other
        # calls of the same operators took less.
        text += " (more than all of it: other calls of the same operators took less)"
    if work < 0.9:
        views = [op.op for op in diff.ops if op.view and op.share > 0.02][:2]
        text += f" ({share / work:+.0%} of the time added outside views{' such as ' + ', '.join(views) if views else ''})"
    return text


def _reads_more(op: OpRow) -> bool:
    before, after = op.baseline_read_bytes, op.candidate_read_bytes
    return before is not None and after is not None and before > 0 and after >= MORE_BYTES * before


def size(value: float | None) -> str:
    """Bytes for a reader: ``4 MiB``, ``16 KiB``."""
    if value is None:
        return "an unknown number of bytes"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def duration(us: float) -> str:
    """Microseconds for a reader: ``340 µs``, ``17.6 ms``."""
    return f"{us / 1000:.3g} ms" if us >= 1000 else f"{us:.3g} µs"


def _times(ratio: float) -> str:
    if math.isinf(ratio):
        return "only in the candidate"
    if ratio >= 1:
        return f"{ratio:.3g}x as often"
    return f"{1 / ratio:.3g}x less often" if ratio > 0 else "no longer"


def _of_time(share: float, slower: bool) -> str:
    return f"{share:+.0%} of the added time" if slower else f"{share:.0%} of the saved time"


def describe_op(op: OpRow, slower: bool) -> str:
    """``aten::mean called 4x as often (4 vs 1 per call), +31% of the added time``."""
    if _same_calls(op):
        more = "more" if op.added_us > 0 else "less"
        calls = f"called as often ({op.candidate_calls:.3g} per call), {duration(abs(op.added_us))} {more} self time"
    else:
        calls = f"called {_times(count_ratio(op))} ({op.candidate_calls:.3g} vs {op.baseline_calls:.3g} per call)"
    return f"{op.op} {calls}, {_of_time(op.share, slower)}"


def describe_repeat(row: InputRow, slower: bool) -> str:
    """``aten::exp called 4x as often on the same inputs, float32[64, 4096] (4 vs 1 per call), +70% ...``."""
    ratio = call_ratio(row.baseline_calls, row.candidate_calls)
    return (f"{row.op} called {_times(ratio)} on the same inputs, {row.inputs} ({row.candidate_calls:.3g} vs "
            f"{row.baseline_calls:.3g} per call), {_of_time(row.share, slower)}")


def contributors_clause(ops: Sequence[OpRow], slower: bool, top: int = 3) -> str:
    contributors = [op for op in ops if op.share > 0.05][:top] or list(ops[:1])
    return "; ".join(describe_op(op, slower) for op in contributors)


def _factor(ratios: Sequence[float], slower: bool) -> str:
    factors = sorted(r if slower else 1 / r for r in ratios if r > 0 and math.isfinite(r))
    factor = factors[len(factors) // 2] if factors else math.nan
    return f"{factor:.3g}x" if math.isfinite(factor) else "several times"


def _chain(op: OpRow, ops: Sequence[OpRow]) -> str:
    """``aten::contiguous > aten::clone > aten::copy_``: the operators a copy runs inside (each
    one's caller whose calls or time changed, when it has several)."""
    by_name = {row.op: row for row in ops}
    names = [op.op]
    parent = op.called_from
    while parent is not None and parent not in names and len(names) < 5:
        names.append(parent)
        parent = by_name[parent].called_from if parent in by_name else None
    return " > ".join(reversed(names))


def call_counts(op: OpRow) -> str:
    """``1 vs 0 per call``; for an operator called from several operators, the count from the
    caller the chain names and from the others: ``1 vs 0 per call inside aten::clone; 2 per
    call inside aten::_to_copy on both sides``."""
    def counts(after: float, before: float) -> str:
        if abs(after - before) <= SAME_CALLS * max(after, before):
            return f"{after:.3g} per call on both sides"
        return f"{after:.3g} vs {before:.3g} per call"

    if not op.callers:
        return counts(op.candidate_calls, op.baseline_calls)
    named = [row for row in op.callers if row.called_from == op.called_from]
    rest = [row for row in op.callers if row.called_from != op.called_from]
    return "; ".join(f"{counts(row.candidate_calls, row.baseline_calls)} "
                     f"{'inside ' + row.called_from if row.called_from else 'from the kernel itself'}"
                     for row in [*named, *rest][:3])


def _fused_label(removed: Sequence[OpRow]) -> tuple[str, list[OpRow]]:
    """The baseline's lost operator as a reader knows it (the one the kernel calls), with the
    operators it runs inside it: ``aten::layer_norm (aten::native_layer_norm inside it)``."""
    names = {op.op for op in removed}
    tops = [op for op in removed if op.called_from not in names] or list(removed[:1])
    inner = [op.op for op in removed if op not in tops]
    label = " and ".join(op.op for op in tops)
    if inner:
        label += f" ({', '.join(inner[:3])} inside it)"
    return label, tops


def _first(shapes: Sequence[str]) -> str:
    return shapes[0] if shapes else "inputs not recorded"


def _changed_inputs(op: OpRow, diff: OpDiff) -> str:
    """The inputs of ``op`` whose calls changed most in the candidate's direction (more calls,
    else more added time): what a copy called from several places copies now; the candidate's
    most frequent inputs when the diff by inputs does not have the operator."""
    rows = [row for row in diff.inputs if row.op == op.op and row.added_us > 0]
    if not rows:
        return _first(op.input_shapes)
    more = [row for row in rows if row.candidate_calls > row.baseline_calls] or rows
    return max(more, key=lambda row: row.added_us).inputs


def _input_detail(op: OpRow, diff: OpDiff) -> tuple[str, str]:
    """What differs in one operator's inputs between the sides, in words, and the next step it
    suggests. Says only what the recorded shapes, strides, dtypes and arguments show."""
    after, before = _first(op.input_shapes), _first(op.baseline_input_shapes)
    change = op.inputs_change
    if change == "strides":
        if "strides (" in after and "strides (" not in before:
            return (f"on a non-contiguous input ({after}, against {before} in the baseline)",
                    f"give {op.op} a contiguous input, or reduce along the contiguous dimension: the strided read "
                    "is what changed")
        return (f"on inputs with other strides ({after}, against {before} in the baseline)",
                f"compare the layouts {op.op} reads on the two sides: only the strides differ")
    if change == "dtype":
        return (f"in another dtype ({after}, against {before} in the baseline)",
                f"check why the candidate runs {op.op} in another dtype")
    if change == "shapes":
        read = ""
        if op.candidate_read_bytes is not None and op.baseline_read_bytes is not None:
            read = f"; it reads {size(op.candidate_read_bytes)} per kernel call against {size(op.baseline_read_bytes)}"
        return (f"on other input shapes ({after}, against {before} in the baseline{read})",
                f"check why {op.op} gets other inputs in the candidate")
    if change == "arguments":
        rows = [r for r in diff.inputs if r.op == op.op]
        new = next((r.inputs for r in rows if r.baseline_calls == 0 and r.candidate_calls > 0), after)
        old = next((r.inputs for r in rows if r.candidate_calls == 0 and r.baseline_calls > 0), before)
        return (f"on the same tensors with other scalar arguments ({new}, against {old} in the baseline)",
                f"compare the arguments {op.op} gets on the two sides")
    return (f"on the same inputs ({after}) with the same recorded arguments: the operator itself takes longer "
            f"per call, and the profile records nothing that tells why (another algorithm or code path inside "
            f"{op.op})",
            f"compare what {op.op} runs on each side: the arguments the profiler does not record (an approximation "
            "or algorithm flag) and the backend it dispatches to")


# --------------------------------------------------------------------------------------------
# Sentences
# --------------------------------------------------------------------------------------------


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f}%"


def interval(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return "[n/a]"
    return f"[{low * 100:+.1f}, {high * 100:+.1f}]"


def _plural(n: int) -> str:
    return "s" if n > 1 else ""


def _summary(f: BenchFindings) -> str:
    return f"geomean {pct(f.geomean)} {interval(f.geomean_low, f.geomean_high)}"


def _per_shape(f: BenchFindings) -> str:
    focus = f.focus_outcome
    if focus is None:
        return ""
    return f"on {focus.shape} {pct(focus.change)} {interval(focus.low, focus.high)}"


def _floor_note(f: BenchFindings) -> str:
    focus = f.focus_outcome
    if focus is None:
        return ""
    if focus.floor > f.threshold:
        return (f" The A/A noise floor here, ±{focus.floor:.1%}, exceeds the threshold; effects were judged "
                "against it.")
    if focus.aa_biased and focus.aa_change is not None:
        return (f" The A/A calibration read {pct(focus.aa_change)} between the baseline and itself; effects "
                "smaller than that are not called.")
    return ""


def _slower_headline(f: BenchFindings) -> str:
    slower, total = len(f.of("regression")), len(f.shapes)
    baseline, candidate = f.names
    return (f"{candidate} is slower than {baseline} on {slower} of {total} {f.unit}{_plural(total)} "
            f"({_summary(f)}); {_per_shape(f)}")


def _faster_headline(f: BenchFindings) -> str:
    faster, total = len(f.of("improvement")), len(f.shapes)
    focus = f.focus_outcome
    speedup = ""
    if focus is not None and focus.change is not None:
        speedup = f", a {1.0 / (1.0 + focus.change):.2f}x speed-up"
    baseline, candidate = f.names
    return (f"{candidate} is faster than {baseline} on {faster} of {total} {f.unit}{_plural(total)} "
            f"({_summary(f)}); {_per_shape(f)}{speedup}")


def _equivalent_headline(f: BenchFindings) -> str:
    total = len(f.shapes)
    baseline, candidate = f.names
    return (f"{candidate} and {baseline} are equivalent within ±{f.threshold:.0%} on {total} "
            f"{f.unit}{_plural(total)} ({_summary(f)})")


def _hot_meaning(cold: float, hot: float, threshold: float) -> str:
    """What a hot change unlike the cold one says about the difference between the kernels."""
    log_cold, log_hot, bar = math.log1p(cold), math.log1p(hot), math.log1p(threshold)
    if abs(log_cold) > bar and abs(log_hot) > bar and log_cold * log_hot < 0:
        return "which kernel is faster depends on whether its inputs come from memory or stay in cache"
    if abs(log_hot) > abs(log_cold):
        if hot > 0:
            return ("the candidate's extra work is compute (or reads of data already in cache) that waiting on "
                    "memory hides when the inputs come from memory")
        return "the work the candidate saves is compute that waiting on memory hides when the inputs come from memory"
    if cold > 0:
        return "the candidate's extra time is memory traffic, which inputs kept in cache avoid"
    return "the time the candidate saves is memory traffic, which matters less when the inputs stay in cache"


def _regime_note(f: BenchFindings) -> str:
    """The cache regime the focus shape was measured in, once; with the hot figure beside the
    main one when the hot check differs."""
    if not f.regime:
        return ""
    where = f" on {f.focus}" if f.focus is not None and len(f.shapes) > 1 else ""
    focus, hot = f.focus_outcome, f.hot
    if hot is None or not hot.differs or focus is None or focus.change is None:
        return f" Measured with {f.regime}{where}."
    return (f" Measured with {f.regime}{where}, it reads {pct(focus.change)}; with one input set reused, hot in "
            f"cache, {pct(hot.change)} {interval(hot.low, hot.high)}: "
            f"{_hot_meaning(focus.change, hot.change, f.threshold)}.")


def _notes(f: BenchFindings) -> str:
    notes = _regime_note(f) + _floor_note(f)
    if f.saved and f.saved_in_process:
        notes += " Both sides come from one saved in-process run."
    elif f.saved:
        notes += " Compared across processes (saved results): noisier than an in-process A/B run."
    if f.saved_runs_note:
        notes += f" {f.saved_runs_note[0].upper()}{f.saved_runs_note[1:]}."
    if f.env_differences:
        notes += (f" The environments differ ({'; '.join(f.env_differences)}), so part of the change may be "
                  "the environment.")
    if f.approximate:
        notes += f" {f.approximate} comparison(s) from medians and IQR only (no raw samples)."
    return notes


def _why(headline: str, clause: str, f: BenchFindings) -> str:
    return headline + (f": {clause}." if clause else ".") + _notes(f)


def _reproduce(f: BenchFindings) -> tuple[Step, ...]:
    return (f.reproduce,) if f.reproduce else ()


def _more(f: BenchFindings) -> tuple[Step, ...]:
    return (f.more_evidence,) if f.more_evidence else ()


# --------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------


def _too_few_blocks(f: BenchFindings) -> Diagnosis | None:
    short = f.of("too-few-blocks")
    if not short:
        return None
    names = ", ".join(s.shape for s in short)
    return Diagnosis(
        Status.INCONCLUSIVE,
        f"the budget of {f.budget_s:g} s did not fit enough ABBA blocks to estimate a change on {names}."
        + _regime_note(f),
        _more(f), where={"kernel": f.candidate, "shape": short[0].shape},
    )


def _diff_if_slower(f: BenchFindings) -> OpDiff | None:
    return f.op_diff if f.slower and f.op_diff is not None and f.op_diff.ops else None


def _recomputation(f: BenchFindings) -> Diagnosis | None:
    diff = _diff_if_slower(f)
    if diff is None:
        return None
    repeated = [row for row in diff.inputs if repeated_input(row, True)]
    if not repeated or not _decides(diff.repeated_inputs_share, diff):
        return None
    factor = _factor([call_ratio(r.baseline_calls, r.candidate_calls) for r in repeated], slower=True)
    reductions = list(diff.repeated_reductions)
    among = f", the reductions {', '.join(reductions[:4])} among them" if reductions else ""
    clause = (f"{'; '.join(describe_repeat(row, True) for row in repeated[:3])}; the same calls on the same inputs, "
              f"made {factor} as often, carry {_of_work(diff.repeated_inputs_share, diff)}{among}: the same "
              f"results are recomputed {factor} per call (redundant recomputation)")
    names = ", ".join(dict.fromkeys(row.op for row in repeated[:4]))
    advice = f"compute {names} once per kernel call and reuse the result instead of recomputing it per tile, head or step"
    if f.device == "cuda" and reductions:
        advice += ("; on the GPU: one block per row, the statistics kept in registers, a warp-level reduction instead "
                   "of recomputing them per tile")
    return Diagnosis(Status.FAIL, _why(_slower_headline(f), clause, f), (Step(advice), *_reproduce(f)))


def _lost_fusion(f: BenchFindings) -> Diagnosis | None:
    diff = _diff_if_slower(f)
    if diff is None:
        return None
    removed = [op for op in diff.ops if op.only_in == "baseline" and not op.movement]
    added = [op for op in diff.ops if op.only_in == "candidate" and not op.movement]
    if not removed or len(added) < 2 or not _decides(diff.only_in_candidate_share, diff):
        return None
    baseline_us = sum(op.baseline_self_us for op in diff.ops)
    removed_us = sum(op.baseline_self_us for op in removed)
    if baseline_us <= 0 or removed_us < MIN_FUSED_SHARE * baseline_us:
        return None
    fused, tops = _fused_label(removed)
    calls = tops[0].baseline_calls
    listed = ", ".join(f"{op.op} ({op.candidate_calls:.3g} per call, {op.share:+.0%})" for op in added[:4])
    more = f" and {len(added) - 4} more" if len(added) > 4 else ""
    clause = (f"{fused}, {calls:.3g} call{'s' if calls != 1 else ''} per kernel call and {duration(removed_us)} of self "
              f"time in the baseline, does not run in the candidate; instead the candidate runs {len(added)} operators "
              f"the baseline does not: {listed}{more}, together {_of_work(diff.only_in_candidate_share, diff)}")
    fused_read = [op.baseline_read_bytes for op in tops]
    direct = [op for op in added if op.called_from is None]
    direct_read = [op.candidate_read_bytes for op in direct]
    if direct and None not in fused_read and None not in direct_read:
        clause += (f"; the {len(direct)} of them the kernel calls directly read {size(sum(direct_read))} per kernel "  # type: ignore[arg-type]
                   f"call, against {size(sum(fused_read))} for {tops[0].op}")  # type: ignore[arg-type]
    clause += f": one fused operator replaced by {len(added)} separate ones (lost fusion)"
    advice = (f"use the fused operator the baseline calls ({tops[0].op}) instead of composing it from {len(added)} "
              "operators, or let torch.compile fuse them")
    if f.device == "cuda":
        advice += "; each separate operator is a kernel launch of its own that writes its intermediate to device memory"
    return Diagnosis(Status.FAIL, _why(_slower_headline(f), clause, f), (Step(advice), *_reproduce(f)))


_SOURCES = {
    "broadcast": ("a broadcast (stride-0) view copied into a full tensor",
                  "pass the broadcast view to the operator that reads it (drop the .contiguous(), .repeat() or "
                  ".clone() of the expanded tensor): it broadcasts without the copy"),
    "strided": ("a non-contiguous view copied into a contiguous tensor",
                "let the consumer read the strided view, or produce the tensor in the layout the consumer reads, "
                "instead of copying it on every call"),
    "dtype": ("a tensor converted to another dtype",
              "convert once, outside the kernel, or compute in the input's dtype"),
    "contiguous": ("a copy of a tensor that was already contiguous",
                   "compute from the original tensor instead of a copy, or fuse the copy into its consumer"),
}


def _memory_traffic(f: BenchFindings) -> Diagnosis | None:
    diff = _diff_if_slower(f)
    if diff is None:
        return None
    copies = [op for op in diff.ops
              if op.added_us > 0 and op.candidate_written_bytes > MORE_BYTES * op.baseline_written_bytes]
    written = sum(op.candidate_written_bytes - op.baseline_written_bytes for op in copies)
    largest = max((op.candidate_read_bytes or 0.0 for op in diff.ops), default=0.0)
    if not copies or written <= 0 or written < MIN_COPY_SIZE * largest:
        return None
    movers = [op for op in diff.ops
              if op.added_us > 0 and op.movement and (op in copies or op.candidate_calls > op.baseline_calls)]
    readers = [op for op in diff.ops
               if op.added_us > 0 and not op.movement and _same_calls(op) and op.inputs_change != "dtype"
               and _reads_more(op)]
    moved = _share_of(movers)
    if moved < MIN_COPY_SHARE or not _decides(moved + _share_of(readers), diff):
        return None
    copy = max(copies, key=lambda op: op.candidate_written_bytes - op.baseline_written_bytes)
    source, advice = _SOURCES.get(copy.copied_from or "", ("a copy", "avoid writing the intermediate: compute "
                                                           "from the original tensor or fuse the copy into its consumer"))
    where = "runs only in the candidate and" if copy.only_in == "candidate" else "in the candidate"
    clause = (f"{_chain(copy, diff.ops)} ({call_counts(copy)}) {where} writes {size(copy.candidate_written_bytes - copy.baseline_written_bytes)} "
              f"per kernel call, {source} ({_changed_inputs(copy, diff)}); the copy with its allocation and the operators "
              f"around it carries {moved:+.0%} of the added time")
    for op in readers[:2]:
        clause += (f"; {op.op}, called as often, reads {size(op.candidate_read_bytes)} per kernel call against "
                   f"{size(op.baseline_read_bytes)} in the baseline ({_first(op.input_shapes)}, against "
                   f"{_first(op.baseline_input_shapes)}), {op.share:+.0%} of the added time")
    clause += (": a materialized intermediate, written and read again (more memory traffic)" if readers else
               ": a materialized intermediate (more memory traffic)")
    return Diagnosis(Status.FAIL, _why(_slower_headline(f), clause, f), (Step(advice), *_reproduce(f)))


def _slower_op(f: BenchFindings) -> Diagnosis | None:
    diff = _diff_if_slower(f)
    if diff is None:
        return None
    removed = [op for op in diff.ops if op.only_in == "baseline" and not op.movement]
    added = [op for op in diff.ops if op.only_in == "candidate" and not op.movement]
    if removed and len(added) == 1 and _decides(added[0].share, diff):
        lost, _tops = _fused_label(removed)
        clause = (f"{describe_op(added[0], True)} ({_first(added[0].input_shapes)}); {lost} runs only in the baseline: "
                  "one operator of the baseline replaced by another that takes longer")
        return Diagnosis(Status.FAIL, _why(_slower_headline(f), clause, f),
                         (Step(f"compare {added[0].op} with the baseline's {_tops[0].op} on these inputs"), *_reproduce(f)))
    same = [op for op in diff.ops if op.added_us > 0 and _same_calls(op) and not op.view]
    if not _decides(_share_of(same), diff):
        return None
    parts, steps = [], []
    for op in same[:2]:
        detail, step = _input_detail(op, diff)
        parts.append(f"{describe_op(op, True)}, {detail}")
        steps.append(step)
    clause = "; ".join(parts) + ": the same operators, called as often, take longer per call"
    return Diagnosis(Status.FAIL, _why(_slower_headline(f), clause, f), (*map(Step, steps[:1]), *_reproduce(f)))


def _extra_ops(f: BenchFindings) -> Diagnosis | None:
    diff = _diff_if_slower(f)
    if diff is None:
        return None
    added = [op for op in diff.ops if op.only_in == "candidate" and not op.movement]
    if not added or not _decides(diff.only_in_candidate_share, diff):
        return None
    clause = (f"operators only the candidate runs carry {_of_work(diff.only_in_candidate_share, diff)}: "
              f"{'; '.join(describe_op(op, True) for op in added[:3])}; the profile shows that they were added, not "
              "whether the result needs them (extra operators)")
    return Diagnosis(Status.FAIL, _why(_slower_headline(f), clause, f),
                     (Step(f"check whether {', '.join(op.op for op in added[:3])} are needed: the baseline gets "
                           "its result without them"), *_reproduce(f)))


def _more_calls(f: BenchFindings) -> Diagnosis | None:
    diff = _diff_if_slower(f)
    if diff is None:
        return None
    more = [op for op in diff.ops if op.added_us > 0 and op.baseline_calls > 0 and count_ratio(op) >= REPEATED]
    if not _decides(_share_of(more), diff):
        return None
    parts = [f"{op.op} called {_times(count_ratio(op))} ({op.candidate_calls:.3g} vs {op.baseline_calls:.3g} per call) "
             f"on other inputs ({_first(op.input_shapes)}, against {_first(op.baseline_input_shapes)}), "
             f"{_of_time(op.share, True)}" for op in more[:3]]
    before = [op.baseline_read_bytes for op in more]
    after = [op.candidate_read_bytes for op in more]
    if None in before or None in after:
        tail = "more calls of the same operators, on other inputs than the baseline's (more calls)"
    else:
        total_before, total_after = sum(before), sum(after)  # type: ignore[arg-type]
        if total_before > 0 and abs(total_after / total_before - 1) < MORE_BYTES - 1:
            tail = (f"they read {size(total_after)} per kernel call against {size(total_before)} in the baseline: "
                    "about the same data in more, smaller calls (more calls)")
        else:
            tail = (f"they read {size(total_after)} per kernel call against {size(total_before)} in the baseline: "
                    "more calls on more data (more calls)")
    clause = "; ".join(parts) + "; " + tail
    return Diagnosis(Status.FAIL, _why(_slower_headline(f), clause, f),
                     (Step("issue fewer, larger calls: one call on the whole tensor instead of one per piece"),
                      *_reproduce(f)))


def _regression(f: BenchFindings) -> Diagnosis | None:
    if not f.slower:
        return None
    if f.op_diff is None or not f.op_diff.ops:
        note = "no operator diff was taken (--no-profile)" if f.op_diff is None else "the profile recorded no operators"
        return Diagnosis(Status.FAIL, _why(_slower_headline(f), note, f), _reproduce(f))
    diff = f.op_diff
    note = (f"{contributors_clause(diff.ops, True)}; no one pattern carries most of the added time (the same calls "
            f"repeated {diff.repeated_inputs_share:+.0%}, operators only in the candidate "
            f"{diff.only_in_candidate_share:+.0%})")
    return Diagnosis(Status.FAIL, _why(_slower_headline(f), note, f), _reproduce(f))


def _undecided(f: BenchFindings) -> Diagnosis | None:
    undecided = f.of("undecided")
    if not undecided:
        return None
    first = undecided[0]
    total = len(f.shapes)
    ran_out = "the samples did not decide" if f.saved else f"the budget of {f.budget_s:g} s ran out before"
    baseline, candidate = f.names
    head = (f"{ran_out} {candidate} vs {baseline} {'' if f.saved else 'was decided '}on "
            f"{len(undecided)} of {total} {f.unit}{_plural(total)}: on {first.shape} {pct(first.change)} "
            f"{interval(first.low, first.high)} straddles ±{f.threshold:.0%}")
    if not f.saved:
        head += f" after {first.blocks} blocks"
    needed = first.needed_blocks
    if needed is not None and math.isfinite(needed) and first.blocks_per_s > 0:
        why = f"{head}; about {needed:,.0f} blocks (~{needed / first.blocks_per_s:,.0f} s of measuring) would decide it"
    elif f.saved:
        why = f"{head}; measure both sides in one process to decide it"
    else:
        why = f"{head}; the change sits on the threshold, so no sample size decides it (move the threshold)"
    return Diagnosis(Status.INCONCLUSIVE, why + "." + busy_note(f.host_load) + _notes(f), _more(f),
                     where={"kernel": f.candidate, "shape": first.shape})


def _environment_differs(f: BenchFindings) -> Diagnosis | None:
    if not f.env_differences:
        return None
    headline = _faster_headline(f) if f.of("improvement") else _equivalent_headline(f)
    return Diagnosis(Status.WARN, _why(headline, "", f),
                     (Step("measure both sides in the same environment to trust a pass"),))


def _recomputation_removed(f: BenchFindings) -> Diagnosis | None:
    if not f.of("improvement") or f.op_diff is None:
        return None
    diff = f.op_diff
    repeated = [row for row in diff.inputs if repeated_input(row, False)]
    if not repeated or not _decides(diff.repeated_inputs_share, diff):
        return None
    factor = _factor([call_ratio(r.baseline_calls, r.candidate_calls) for r in repeated], slower=False)
    clause = (f"{'; '.join(describe_repeat(row, False) for row in repeated[:3])}; the same calls on the same inputs, "
              f"made {factor} less often, carry {diff.repeated_inputs_share:.0%} of the saved time: repeated work "
              "removed")
    return Diagnosis(Status.PASS, _why(_faster_headline(f), clause, f))


def _improvement(f: BenchFindings) -> Diagnosis | None:
    if not f.of("improvement"):
        return None
    clause = contributors_clause(f.op_diff.ops, False) if f.op_diff is not None and f.op_diff.ops else ""
    return Diagnosis(Status.PASS, _why(_faster_headline(f), clause, f))


def _equivalent(f: BenchFindings) -> Diagnosis | None:
    return Diagnosis(Status.PASS, _why(_equivalent_headline(f), "", f))


RULES: tuple[Rule[BenchFindings], ...] = (
    Rule("too-few-blocks", KIND, _too_few_blocks, "the budget did not fit enough blocks: inconclusive"),
    Rule("redundant-recomputation", KIND, _recomputation,
         "slower; the same operator on the same inputs, called k times as often, carries the added time"),
    Rule("lost-fusion", KIND, _lost_fusion,
         "slower; a fused operator of the baseline replaced by several operators only the candidate runs"),
    Rule("memory-traffic", KIND, _memory_traffic,
         "slower; a copy writes a materialized intermediate that is read again"),
    Rule("slower-op", KIND, _slower_op, "slower; the same operators, called as often, take longer per call"),
    Rule("extra-ops", KIND, _extra_ops, "slower; operators only the candidate runs carry the added time"),
    Rule("more-calls", KIND, _more_calls, "slower; operators called more often on other inputs carry the added time"),
    Rule("regression", KIND, _regression, "slower, and no one pattern of the operator diff explains it"),
    Rule("undecided", KIND, _undecided, "an interval straddles the threshold: inconclusive"),
    Rule("environment-differs", KIND, _environment_differs, "not slower, but the sides ran in different environments: warn"),
    Rule("recomputation-removed", KIND, _recomputation_removed, "faster; repeated calls on the same inputs removed"),
    Rule("improvement", KIND, _improvement, "faster"),
    Rule("equivalent", KIND, _equivalent, "every interval inside ±threshold"),
)


# What each kind of sentence of a bench why needs of the findings (tests/test_bench_rules.py runs
# the rules over generated findings against these).
CLAIMS: tuple[Claim[BenchFindings], ...] = (
    Claim("slower", r"is slower than", lambda f: f.slower),
    Claim("no-diff", r"no operator diff was taken", lambda f: f.op_diff is None),
    Claim("memory-traffic", r"more memory traffic",
          lambda f: f.op_diff is not None and any(op.candidate_written_bytes > op.baseline_written_bytes
                                                  for op in f.op_diff.ops)),
)
