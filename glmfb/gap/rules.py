"""The rules of ``glmfb gap``: the measured gap and its attribution in, a diagnosis out.

Tried in order; the first that applies wins:

=====================  ========================================================================
undecided              the interval straddles the threshold when the budget or repeats ran out:
                       inconclusive
pass                   the whole interval lies below the threshold
gil-starved-sender     over the threshold; the gil probe saw a thread of the candidate wait for
                       the GIL a large share of its time beside a holder on another thread (a
                       missing GIL release when the holder idles in a native call), unless the
                       holder is the thread CPU contention slowed and the waiter what took its
                       CPU (then the GIL wait follows from the contention); fail
bandwidth-bound        over the threshold; the transfer runs at the link's ceiling, or its bytes
                       alone, at the fastest ceiling measured, take longer than the threshold
                       allows a whole iteration
cpu-contention         over the threshold; a thread of the candidate waited for a CPU a large
                       share of its time while another of its threads ran on the same CPUs,
                       and the GIL does not explain it; fail
undecided-busy-host    over the threshold, no attribution explains it, and other processes kept
                       a quarter of a CPU or more busy while it measured: inconclusive
over-threshold         over the threshold, no attribution explains it
=====================  ========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glmfb.gap.attribution import GilFinding
from glmfb.gap.bandwidth import BandwidthCheck, rate_text
from glmfb.gap.phases import PhaseChange
from glmfb.measure.hostload import HostLoad, busy_note
from glmfb.rules import Diagnosis, Rule
from glmfb.step import Step
from glmfb.verdict import Status

KIND = "gap"


@dataclass(frozen=True)
class GapFindings:
    """What a gap check established, in the terms the rules speak."""

    gap: float
    low: float
    high: float
    threshold: float
    iterations: int
    stopped_by: str  # decided | repeats | budget
    budget_s: float
    repeats: int
    grown: tuple[PhaseChange, ...]
    bandwidth: BandwidthCheck | None = None
    gil: GilFinding | None = None
    attribute: bool = True
    rerun: Step | None = None  # the same gap, to run after a fix
    more_evidence: Step | None = None  # the gap with more repeats and budget
    gil_rerun: Step | None = None  # the gil probe on the candidate, sampled longer
    host_load: HostLoad | None = None  # the rest of the host while the iterations ran
    baseline_median_s: float | None = None  # the baseline's median iteration time

    @property
    def gap_text(self) -> str:
        return (f"the candidate takes {self.gap:+.1%} [{self.low:+.1%}, {self.high:+.1%}] against the baseline "
                f"({self.iterations} interleaved iterations a side, threshold {self.threshold:.0%})")

    @property
    def over(self) -> bool:
        return self.low > self.threshold

    @property
    def bytes_alone(self) -> float | None:
        """What an iteration's bytes take at the link's fastest measured ceiling, as a multiple
        of the baseline's median iteration."""
        floor = self.bandwidth.seconds_at_ceiling if self.bandwidth is not None else None
        return floor / self.baseline_median_s if floor is not None and self.baseline_median_s else None

    @property
    def bytes_keep_over(self) -> bool:
        """The bytes alone, moved at the link's fastest measured ceiling, take longer than the
        threshold allows a whole iteration (an iteration waits for its transfer), by more than
        the gap's own interval reaches below the gap (as a factor)."""
        alone = self.bytes_alone
        return alone is not None and alone * (1 + self.low) / (1 + self.gap) > 1 + self.threshold

    def saw(self) -> dict[str, Any]:
        seen: dict[str, Any] = {"gap": self.gap, "ci": [self.low, self.high], "threshold": self.threshold,
                                "iterations": self.iterations, "stopped_by": self.stopped_by,
                                "grown_phases": [c.name for c in self.grown]}
        if self.host_load is not None:
            seen["other_busy_cpus"] = round(self.host_load.other_cpus, 3)
        if self.bandwidth is not None:
            seen.update(bandwidth_bound=self.bandwidth.bandwidth_bound, ceiling_share=self.bandwidth.ceiling_share,
                        page_rate_share=self.bandwidth.page_rate_share, bytes_alone=self.bytes_alone)
        if self.gil is not None:
            seen.update(gil_available=self.gil.available, gil_status=self.gil.status,
                        holder_function=self.gil.holder_function, holder_idle_share=self.gil.holder_idle_share,
                        starved_thread=self.gil.starved_thread, starved_of_runnable=self.gil.starved_of_runnable,
                        cpu_victim=self.gil.cpu_victim, cpu_victim_runqueue_share=self.gil.cpu_victim_runqueue_share,
                        competitor_thread=self.gil.competitor_thread,
                        competitor_function=self.gil.competitor_function,
                        competitor_cpu_share=self.gil.competitor_cpu_share)
        return seen


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.0f} ms" if abs(seconds) >= 0.0095 else f"{1e3 * seconds:.1f} ms"


def _phase_phrase(change: PhaseChange) -> str:
    if change.baseline_s is None:
        return f"{change.name} {_ms(change.delta_s)} (only in the candidate)"
    relative = f", {change.change:+.0%}" if change.change is not None else ""
    return f"{change.name} +{_ms(change.delta_s)}{relative}"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _link_phrase(f: GapFindings, bandwidth: BandwidthCheck) -> str:
    """Whether the link was the limit, and when not, whether its bytes alone keep the gap over."""
    if bandwidth.bandwidth_bound:
        return "the link is saturated: bandwidth, not the interpreter, limits the transfer"
    if bandwidth.bound_unsettled:
        phrase = "whether the link was the limit is not settled: the ceiling's own spread decides it"
    else:
        phrase = "the sender was held back" if bandwidth.starved else "the link was not the limit"
    floor = bandwidth.seconds_at_ceiling
    if not f.bytes_keep_over or floor is None or f.baseline_median_s is None or bandwidth.fastest_ceiling is None:
        return phrase + (", not the link" if bandwidth.starved and not bandwidth.bound_unsettled else "")
    allowed = (1 + f.threshold) * f.baseline_median_s
    return (f"{phrase}, yet the bytes alone keep it over the threshold: at the fastest ceiling measured "
            f"({rate_text(bandwidth.fastest_ceiling)}) an iteration's {bandwidth.bytes_per_iteration / 1e6:.0f} MB "
            f"take {_ms(floor)}, longer than the {_ms(allowed)} the threshold allows a whole iteration (the "
            f"baseline's {_ms(f.baseline_median_s)} + {f.threshold:.0%})")


def _failure_sentences(f: GapFindings, cpu: bool = False) -> list[str]:
    sentences = [f"Over the threshold: {f.gap_text}."]
    if f.grown:
        sentences.append("The time went to " + " and ".join(_phase_phrase(c) for c in f.grown[:3]) + ".")
    else:
        sentences.append("No single reported phase grew beyond noise.")
    bandwidth = f.bandwidth
    if bandwidth is not None and bandwidth.achieved_bytes_per_s is not None:
        on_link = _link_phrase(f, bandwidth)
        sentences.append(f"{_capital(bandwidth.summary())}: {on_link}.")
    elif bandwidth is not None and bandwidth.error:
        sentences.append(f"Bandwidth unknown ({bandwidth.error}).")
    if f.gil is not None and cpu:
        sentences.append(f.gil.cpu_sentence())
    elif f.gil is not None:
        sentences.append(f.gil.sentence())
    elif not f.attribute:
        sentences.append("Attribution was switched off.")
    return sentences


def _after_fix(f: GapFindings) -> tuple[Step, ...]:
    return (f.rerun,) if f.rerun is not None else ()


def _gil_next(f: GapFindings) -> list[Step]:
    steps: list[Step] = []
    if f.gil is not None:
        steps.extend(f.gil.next)
        if (not f.gil.available or not f.gil.holder_known) and f.gil_rerun is not None:
            steps.append(f.gil_rerun)
    return steps


def _gil_where(f: GapFindings) -> dict[str, Any]:
    gil = f.gil
    assert gil is not None
    where: dict[str, Any] = {"thread": gil.starved_thread or gil.holder_thread, "function": gil.holder_function}
    if gil.holder_file:
        where["file"] = gil.holder_file
    if gil.holder_line is not None:
        where["line"] = gil.holder_line
    return where


def _undecided(f: GapFindings) -> Diagnosis | None:
    if f.over or f.high < f.threshold:
        return None
    ran_out_text = (f"the repeats ran out (at most {f.repeats} a side, in whole rounds over the builds)"
                    if f.stopped_by == "repeats" else
                    f"the {f.budget_s:g} s budget ran out" if f.stopped_by == "budget" else "the limits ran out")
    why = (f"Not decided: {f.gap_text}; the interval straddles the threshold and "
           f"{ran_out_text}.") + busy_note(f.host_load)
    return Diagnosis(Status.INCONCLUSIVE, why, (f.more_evidence,) if f.more_evidence is not None else ())


def _within(f: GapFindings) -> Diagnosis | None:
    if f.high >= f.threshold:
        return None
    why = f"Within the threshold: {f.gap_text}."
    if f.bandwidth is not None and f.bandwidth.achieved_bytes_per_s is not None:
        why += f" {_capital(f.bandwidth.summary())}."
    return Diagnosis(Status.PASS, why, (), {})


def _gil_starved_sender(f: GapFindings) -> Diagnosis | None:
    gil = f.gil
    if not (f.over and gil is not None and gil.gil_bound) or gil.gil_wait_follows_cpu_wait:
        return None
    sentences = _failure_sentences(f)
    if gil.idle_in_native:
        sentences.append(f"A missing GIL release in {gil.holder_function}: release the GIL around its native call "
                         "and rerun this gap.")
    return Diagnosis(Status.FAIL, " ".join(sentences), (*_gil_next(f), *_after_fix(f)), _gil_where(f))


def _cpu_contention(f: GapFindings) -> Diagnosis | None:
    gil = f.gil
    if not (f.over and gil is not None and gil.cpu_bound):
        return None
    where: dict[str, Any] = {"thread": gil.cpu_victim}
    if gil.competitor_function:
        where["function"] = gil.competitor_function
    steps = (Step(f"give {gil.competitor_thread} its own CPU, or move its work ({gil.competitor_function or 'its loop'}) "
                  f"off the CPUs {gil.cpu_victim} runs on (check the CPU mask and torch.get_num_threads())"),
             *_after_fix(f))
    return Diagnosis(Status.FAIL, " ".join(_failure_sentences(f, cpu=True)), steps, where)


def _bandwidth_bound(f: GapFindings) -> Diagnosis | None:
    if not (f.over and f.bandwidth is not None and (f.bandwidth.bandwidth_bound or f.bytes_keep_over)):
        return None
    return Diagnosis(Status.FAIL, " ".join(_failure_sentences(f)), (
        *_gil_next(f), Step("cut the bytes moved (KV precision, fewer layers sent) or add bandwidth"), *_after_fix(f)),
        {})


def _unexplained_on_busy_host(f: GapFindings) -> Diagnosis | None:
    load = f.host_load
    if not (f.over and load is not None and load.busy):
        return None
    sentences = _failure_sentences(f)
    sentences[0] = (f"Not decided: {f.gap_text}, over the threshold as measured, but nothing measured explains "
                    "the gap and the host was busy, so it may be the other processes' doing.")
    why = " ".join(sentences) + busy_note(load)
    more = (f.more_evidence,) if f.more_evidence is not None else ()
    return Diagnosis(Status.INCONCLUSIVE, why, (*more, *_gil_next(f)), {})


def _over(f: GapFindings) -> Diagnosis | None:
    return Diagnosis(Status.FAIL, " ".join(_failure_sentences(f)), (*_gil_next(f), *_after_fix(f)), {})


RULES: tuple[Rule[GapFindings], ...] = (
    Rule("undecided", KIND, _undecided, "the interval straddles the threshold: inconclusive"),
    Rule("pass", KIND, _within, "the interval lies below the threshold"),
    Rule("gil-starved-sender", KIND, _gil_starved_sender, "a thread of the candidate waits for the GIL held by another"),
    Rule("bandwidth-bound", KIND, _bandwidth_bound, "the transfer runs at the link's ceiling"),
    Rule("cpu-contention", KIND, _cpu_contention, "a thread of the candidate waits for a CPU another of its threads uses"),
    Rule("undecided-busy-host", KIND, _unexplained_on_busy_host,
         "over the threshold, unexplained, on a busy host: inconclusive"),
    Rule("over-threshold", KIND, _over, "over the threshold, unexplained"),
)
