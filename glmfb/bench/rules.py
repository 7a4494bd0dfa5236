"""The rules of ``glmfb bench``: measured changes and the operator diff in, a diagnosis out.

The statistics decide, per shape, whether the candidate is slower (regression), faster
(improvement), equivalent within the threshold, or not decided yet. The rules turn that, plus
the operator diff of the shape that decided the verdict, into the verdict's status and why.
They are tried in order; the first that applies wins:

=========================  ====================================================================
too-few-blocks             the budget did not fit enough blocks on some shape: inconclusive
redundant-recomputation    slower; most added time is in operators called k>1 times as often,
                           reductions among them (the same statistic computed k times)
redundant-work             slower; most added time is in operators called more often
slower-operator            slower; the same operators, called as often, take longer
regression                 slower, without an operator diff that explains it
undecided                  some shape's interval straddles the threshold: inconclusive
environment-differs        not slower, but the sides' environments differ: warn
recomputation-removed      faster; repeated reductions removed
improvement                faster
equivalent                 every interval inside ±threshold
=========================  ====================================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from glmfb.bench.evidence import OpDiff, OpRow
from glmfb.rules import Diagnosis, Rule
from glmfb.verdict import Status

KIND = "bench"
REPEATED = 1.5  # an operator called this many times as often counts as repeated
MAJORITY = 0.5  # of the added time


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
class BenchFindings:
    """What a comparison established, in the terms the rules speak."""

    baseline: str  # kernel names
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
    reproduce: str | None = None  # the command that reruns the comparison on the worst shape
    more_evidence: str | None = None  # the command with the budget that would decide it
    saved: bool = False  # compared from saved files (separate processes), not in one process
    unit: str = "shape"  # what the comparisons are of: "shape", or "benchmark" (pytest-benchmark)
    env_differences: tuple[str, ...] = ()  # "python: 3.11.7 vs 3.12.1", when the sides' environments differ
    approximate: int = 0  # saved comparisons made from summaries only (no raw samples)

    # ---- derived ---------------------------------------------------------------------------

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
            top = [op.op for op in self.op_diff.ops[:3]]
            seen["top_ops"] = top
            seen["repeated_share"] = repeated_share(self.op_diff.ops, slower=self.slower)
        return seen

    @property
    def slower(self) -> bool:
        return bool(self.of("regression"))


# --------------------------------------------------------------------------------------------
# Reading the operator diff
# --------------------------------------------------------------------------------------------


def count_ratio(op: OpRow) -> float:
    if op.baseline_calls == 0:
        return math.inf if op.candidate_calls > 0 else 1.0
    return op.candidate_calls / op.baseline_calls


def _repeated(op: OpRow, slower: bool) -> bool:
    if slower:
        return op.added_us > 0 and count_ratio(op) > REPEATED
    return op.added_us < 0 and count_ratio(op) < 1 / REPEATED


def repeated_share(ops: Sequence[OpRow], slower: bool) -> float:
    """The share of the added (or saved) time in operators called much more (or less) often."""
    return sum(op.share for op in ops if _repeated(op, slower))


def repeated_reductions(ops: Sequence[OpRow], slower: bool) -> list[OpRow]:
    return [op for op in ops if _repeated(op, slower) and op.reduction]


def _times(ratio: float) -> str:
    if math.isinf(ratio):
        return "only in the candidate"
    if ratio >= 1:
        return f"{ratio:.3g}x as often"
    return f"{1 / ratio:.3g}x less often" if ratio > 0 else "no longer"


def describe_op(op: OpRow, slower: bool) -> str:
    """``aten::mean called 4x as often (4 vs 1 per call), +31% of the added time``."""
    what = "added" if slower else "saved"
    if abs(count_ratio(op) - 1.0) < 0.05:
        more = "more" if op.added_us > 0 else "less"
        calls = f"called as often ({op.candidate_calls:.3g} per call), {abs(op.added_us):.3g} µs {more} self time"
    else:
        calls = f"called {_times(count_ratio(op))} ({op.candidate_calls:.3g} vs {op.baseline_calls:.3g} per call)"
    share = f"{op.share:+.0%}" if slower else f"{op.share:.0%}"
    return f"{op.op} {calls}, {share} of the {what} time"


def contributors_clause(ops: Sequence[OpRow], slower: bool, top: int = 3) -> str:
    contributors = [op for op in ops if op.share > 0.05][:top] or list(ops[:1])
    return "; ".join(describe_op(op, slower) for op in contributors)


def _factor(ops: Sequence[OpRow], slower: bool) -> str:
    factors = sorted(count_ratio(op) if slower else 1 / count_ratio(op)
                     for op in ops if count_ratio(op) > 0)
    factor = factors[len(factors) // 2] if factors else math.nan
    return f"{factor:.3g}x" if math.isfinite(factor) else "several times"


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
    return (f"{f.candidate} is slower than {f.baseline} on {slower} of {total} {f.unit}{_plural(total)} "
            f"({_summary(f)}); {_per_shape(f)}")


def _faster_headline(f: BenchFindings) -> str:
    faster, total = len(f.of("improvement")), len(f.shapes)
    focus = f.focus_outcome
    speedup = ""
    if focus is not None and focus.change is not None:
        speedup = f", a {1.0 / (1.0 + focus.change):.2f}x speed-up"
    return (f"{f.candidate} is faster than {f.baseline} on {faster} of {total} {f.unit}{_plural(total)} "
            f"({_summary(f)}); {_per_shape(f)}{speedup}")


def _equivalent_headline(f: BenchFindings) -> str:
    total = len(f.shapes)
    return (f"{f.candidate} and {f.baseline} are equivalent within ±{f.threshold:.0%} on {total} "
            f"{f.unit}{_plural(total)} ({_summary(f)})")


def _notes(f: BenchFindings) -> str:
    notes = _floor_note(f)
    if f.saved:
        notes += " Compared across processes (saved results): noisier than an in-process A/B run."
    if f.env_differences:
        notes += (f" The environments differ ({'; '.join(f.env_differences)}), so part of the change may be "
                  "the environment.")
    if f.approximate:
        notes += f" {f.approximate} comparison(s) from medians and IQR only (no raw samples)."
    return notes


def _why(headline: str, clause: str, f: BenchFindings) -> str:
    return headline + (f": {clause}." if clause else ".") + _notes(f)


def _reproduce(f: BenchFindings) -> tuple[str, ...]:
    return (f.reproduce,) if f.reproduce else ()


def _more(f: BenchFindings) -> tuple[str, ...]:
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
        f"the budget of {f.budget_s:g} s did not fit enough ABBA blocks to estimate a change on {names}.",
        _more(f), where={"kernel": f.candidate, "shape": short[0].shape},
    )


def _recomputation(f: BenchFindings) -> Diagnosis | None:
    if not f.slower or f.op_diff is None:
        return None
    ops = f.op_diff.ops
    reductions = repeated_reductions(ops, slower=True)
    if not reductions or repeated_share(ops, slower=True) <= MAJORITY:
        return None
    listed = ", ".join(op.op for op in reductions[:4])
    factor = _factor(reductions, slower=True)
    clause = (f"{contributors_clause(ops, True)}; the reductions {listed} also run {factor} as often: the same "
              f"reductions are recomputed {factor} per call (redundant recomputation)")
    advice = ("compute each reduction once and reuse it: one block per row, intermediates kept in registers, "
              "a warp-level reduction instead of recomputing per tile" if f.device == "cuda" else
              "compute each reduction once per row and reuse the result instead of recomputing it per tile")
    return Diagnosis(Status.FAIL, _why(_slower_headline(f), clause, f), (advice, *_reproduce(f)))


def _redundant_work(f: BenchFindings) -> Diagnosis | None:
    if not f.slower or f.op_diff is None or repeated_share(f.op_diff.ops, slower=True) <= MAJORITY:
        return None
    clause = f"{contributors_clause(f.op_diff.ops, True)}: more operator calls for the same result (redundant work)"
    return Diagnosis(Status.FAIL, _why(_slower_headline(f), clause, f),
                     ("look for work repeated per tile, per head or per step that could be hoisted", *_reproduce(f)))


def _slower_operator(f: BenchFindings) -> Diagnosis | None:
    if not f.slower or f.op_diff is None or not f.op_diff.ops:
        return None
    clause = f"{contributors_clause(f.op_diff.ops, True)}: the same operators take longer per call"
    return Diagnosis(Status.FAIL, _why(_slower_headline(f), clause, f),
                     ("compare the operators' input layouts, dtypes and dispatch paths (torch.profiler with "
                      "record_shapes=True)", *_reproduce(f)))


def _regression(f: BenchFindings) -> Diagnosis | None:
    if not f.slower:
        return None
    note = "" if f.op_diff is not None else "no operator diff was taken (--no-profile)"
    return Diagnosis(Status.FAIL, _why(_slower_headline(f), note, f), _reproduce(f))


def _undecided(f: BenchFindings) -> Diagnosis | None:
    undecided = f.of("undecided")
    if not undecided:
        return None
    first = undecided[0]
    total = len(f.shapes)
    ran_out = "the samples did not decide" if f.saved else f"the budget of {f.budget_s:g} s ran out before"
    head = (f"{ran_out} {f.candidate} vs {f.baseline} {'' if f.saved else 'was decided '}on "
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
    return Diagnosis(Status.INCONCLUSIVE, why + "." + _notes(f), _more(f),
                     where={"kernel": f.candidate, "shape": first.shape})


def _environment_differs(f: BenchFindings) -> Diagnosis | None:
    if not f.env_differences:
        return None
    headline = _faster_headline(f) if f.of("improvement") else _equivalent_headline(f)
    return Diagnosis(Status.WARN, _why(headline, "", f),
                     ("measure both sides in the same environment to trust a pass",))


def _recomputation_removed(f: BenchFindings) -> Diagnosis | None:
    if not f.of("improvement") or f.op_diff is None:
        return None
    ops = f.op_diff.ops
    reductions = repeated_reductions(ops, slower=False)
    if not reductions or repeated_share(ops, slower=False) <= MAJORITY:
        return None
    listed = ", ".join(op.op for op in reductions[:4])
    clause = (f"{contributors_clause(ops, False)}; the reductions {listed} run {_factor(reductions, False)} less "
              "often: repeated reductions removed")
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
    Rule("redundant-recomputation", KIND, _recomputation, "slower; repeated reductions carry the added time"),
    Rule("redundant-work", KIND, _redundant_work, "slower; operators called more often carry the added time"),
    Rule("slower-operator", KIND, _slower_operator, "slower; the same operators take longer per call"),
    Rule("regression", KIND, _regression, "slower, without an operator diff that explains it"),
    Rule("undecided", KIND, _undecided, "an interval straddles the threshold: inconclusive"),
    Rule("environment-differs", KIND, _environment_differs, "not slower, but the sides ran in different environments: warn"),
    Rule("recomputation-removed", KIND, _recomputation_removed, "faster; repeated reductions removed"),
    Rule("improvement", KIND, _improvement, "faster"),
    Rule("equivalent", KIND, _equivalent, "every interval inside ±threshold"),
)
