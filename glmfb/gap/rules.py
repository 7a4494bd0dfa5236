"""The rules of ``glmfb gap``: the measured gap and its attribution in, a diagnosis out.

Tried in order; the first that applies wins:

=====================  ========================================================================
undecided              the interval straddles the threshold when the budget or repeats ran out:
                       inconclusive
pass                   the whole interval lies below the threshold
gil-starved-sender     over the threshold; the gil probe saw a thread of the candidate wait for
                       the GIL beside a holder on another thread, a large share of its time or
                       a wait that explains most of the time the gap added (a missing GIL
                       release when the holder idles in a native call), unless the holder is
                       the thread CPU contention slowed and the waiter what took its CPU (then
                       the GIL wait follows from the contention); fail
bandwidth-bound        over the threshold; the transfer runs at the link's ceiling, or its bytes
                       alone, at the fastest ceiling measured, take longer than the threshold
                       allows a whole iteration
cpu-contention         over the threshold; a thread of the candidate waited for a CPU a large
                       share of its time while another of its threads ran on the same CPUs,
                       and the GIL does not explain it (on a busy host, not when the slowed
                       thread is a guess the baseline's gil run contradicts); fail
candidate-only-phase   over the threshold; critical-path phases only the candidate runs come to
                       half or more of the time the gap added (a quarter at the gap's high
                       end): they are the explanation, with their share; fail (on a busy host,
                       not when the candidate also runs an activity of its own beside the
                       iteration, a ``*_busy_s`` only it reports, which the other processes may
                       have slowed: then undecided-busy-host names the phase as the lead)
undecided-busy-host    over the threshold, no attribution explains it, and other processes kept
                       a quarter of a CPU or more busy while it measured: inconclusive
over-threshold         over the threshold, no attribution explains it
=====================  ========================================================================

Every kind of sentence a why can say has a precondition on the findings, written once below
the rules (:data:`CLAIMS`): a why never states what its evidence contradicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glmfb.contract.step import Step
from glmfb.contract.verdict import Status
from glmfb.core.measure.hostload import HostLoad, busy_note
from glmfb.core.rules import Claim, Diagnosis, Rule
from glmfb.gap.attribution import GilFinding
from glmfb.gap.bandwidth import BandwidthCheck, rate_text
from glmfb.gap.phases import PhaseChange
from glmfb.gil import describe_threads as describe

KIND = "gap"
# A GIL wait that comes to this share of the time the gap added to an iteration explains the
# gap, whatever share of the waiting thread's own time it is; at the ends of both intervals (the
# wait's low end, the gap's high end) it must still come to GIL_EXPLAINS_LOW of it. Issue 37: a
# prefill beside two pool threads running pickle.dumps(tensor.tolist()) waited 13% [11.8%, 15.3%]
# of its runnable time, under the gil-wait share's fixed 20%, and the gap was +22-30%.
GIL_EXPLAINS_SHARE = 0.5
GIL_EXPLAINS_LOW = 0.25
# Critical-path phases only the candidate runs explain the gap when they come to this share of
# the time it added at the estimate, and to PHASE_EXPLAINS_LOW of it at the gap's high end (issue
# 53: a synchronous staging copy per layer, staging_s only in the candidate, read "nothing
# measured explains the gap" on a busy host while the same why laid the time on it).
PHASE_EXPLAINS_SHARE = 0.5
PHASE_EXPLAINS_LOW = 0.25


@dataclass(frozen=True)
class GilWeight:
    """A thread's GIL wait against the time the gap added to an iteration. The gil probe gives
    the wait as a share w of the time the thread was not waiting for a CPU; over a candidate
    iteration, baseline x (1 + gap), that is w (1 + gap) baseline seconds, against the gap's
    gap x baseline: the wait explains w (1 + gap) / gap of the added time, whatever the
    iteration takes."""

    thread: str
    wait_share: float  # of the time off the run queue (of wall time for an older gil verdict)
    wait_low: float  # the low end of its interval
    gap: float
    gap_high: float
    baseline_s: float | None = None  # the baseline's median iteration, for the figures in seconds

    @property
    def explains(self) -> float:
        """The GIL wait over the time the gap added (1.0: all of it)."""
        return self.wait_share * (1 + self.gap) / self.gap

    @property
    def explains_low(self) -> float:
        """The same at the ends of both intervals: the wait's low end, the gap's high end."""
        return self.wait_low * (1 + self.gap_high) / self.gap_high

    @property
    def substantial(self) -> bool:
        return self.explains >= GIL_EXPLAINS_SHARE and self.explains_low >= GIL_EXPLAINS_LOW

    def phrase(self) -> str:
        """``5.3 ms of each candidate iteration, 25% of the 21 ms the gap added (at least 12% at
        the ends of both intervals)``; in shares of an iteration without the baseline's time."""
        low = f" (at least {self.explains_low:.0%} at the ends of both intervals)"
        if self.baseline_s is None:
            return (f"{self.wait_share:.0%} of each candidate iteration against the {self.gap / (1 + self.gap):.0%} "
                    f"of it the gap added: {self.explains:.0%} of that time{low}")
        wait_s = self.wait_share * (1 + self.gap) * self.baseline_s
        return (f"{_ms(wait_s)} of each candidate iteration, {self.explains:.0%} of the "
                f"{_ms(self.gap * self.baseline_s)} the gap added{low}")

    def sentence(self, fired: bool) -> str:
        """What the weight says, in the verdict's terms: ``fired``, the GIL rule decided the gap."""
        weighed = f"That wait comes to {self.phrase()}"
        if fired and self.substantial:
            return f"{weighed}: the GIL wait explains the gap."
        if fired:  # decided by the share of the waiter's own time
            return f"{weighed}."
        if self.explains >= GIL_EXPLAINS_SHARE:
            return (f"{weighed}: not settled enough to lay the gap on the GIL (under {GIL_EXPLAINS_LOW:.0%} at the "
                    "ends of both intervals).")
        return f"{weighed}: too little to lay the gap on the GIL."


@dataclass(frozen=True)
class PhaseWeight:
    """Critical-path phases only the candidate runs against the time the gap added to an
    iteration: their medians summed, over gap x the baseline's median iteration."""

    phases: tuple[PhaseChange, ...]  # largest first
    gap: float
    gap_high: float
    baseline_s: float

    @property
    def seconds(self) -> float:
        return sum(change.candidate_s or 0.0 for change in self.phases)

    @property
    def explains(self) -> float:
        """The phases over the time the gap added (1.0: all of it)."""
        return self.seconds / (self.gap * self.baseline_s)

    @property
    def explains_low(self) -> float:
        """The same at the gap's high end."""
        return self.seconds / (self.gap_high * self.baseline_s)

    @property
    def substantial(self) -> bool:
        return self.explains >= PHASE_EXPLAINS_SHARE and self.explains_low >= PHASE_EXPLAINS_LOW

    @property
    def names(self) -> str:
        return " and ".join(change.name for change in self.phases[:3])

    def phrase(self) -> str:
        """``only the candidate runs staging_s: 38 ms of each candidate iteration, 92% of the 41
        ms the gap added (at least 61% at the gap's high end)``."""
        added = self.gap * self.baseline_s
        share = (f"more than all of the {_ms(added)} the gap added ({self.explains:.0%}: other phases took less)"
                 if self.explains > 1.005 else f"{self.explains:.0%} of the {_ms(added)} the gap added")
        return (f"only the candidate runs {self.names}: {_ms(self.seconds)} of each candidate iteration, {share} "
                f"(at least {min(self.explains_low, 1.0):.0%} at the gap's high end)")


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
    # *_busy_s activities only the candidate reports: work it runs beside the iteration (a
    # transfer thread) that other processes on a busy host can slow, and a phase that waits for it
    added_activities: tuple[str, ...] = ()

    @property
    def gap_text(self) -> str:
        return (f"the candidate takes {self.gap:+.1%} [{self.low:+.1%}, {self.high:+.1%}] against the baseline "
                f"({self.iterations} interleaved iterations a side, threshold {self.threshold:.0%})")

    @property
    def over(self) -> bool:
        return self.low > self.threshold

    def weigh(self, gil: GilFinding | None) -> GilWeight | None:
        """The starved thread's GIL wait against the time the gap added; None without a
        starved thread with a share of its time, or a gap to weigh it against."""
        wait = gil.starved_wait if gil is not None and gil.available else None
        if gil is None or gil.starved_thread is None or wait is None or self.gap <= 0:
            return None
        return GilWeight(gil.starved_thread, wait[0], wait[1], self.gap, max(self.high, self.gap),
                         self.baseline_median_s)

    def explained_by(self, gil: GilFinding | None) -> bool:
        """The GIL decides the gap: a thread waited for it beside a holder on another thread,
        a large share of its own time (:attr:`GilFinding.gil_bound`) or for most of the time the
        gap added (:attr:`GilWeight.substantial`), and that wait does not follow from CPU
        contention that slowed the holder (:attr:`GilFinding.waiter_took_holders_cpu`)."""
        if not (self.over and gil is not None and gil.holder_apart) or gil.waiter_took_holders_cpu:
            return False
        weight = self.weigh(gil)
        return gil.gil_bound or (weight is not None and weight.substantial)

    @property
    def gil_seen(self) -> GilFinding | None:
        """The gil finding the rules read: the gil probe's holder and the thread it names most
        starved; or, when that thread's wait does not explain the gap, no CPU contention does,
        and the top holder's own wait for the GIL does (:attr:`GilFinding.holder_own_wait`), that
        one: the iteration's thread can hold the GIL most overall (its Python between torch ops)
        and still lose the gap waiting for it behind a helper's long C calls."""
        gil = self.gil
        if gil is None or self.explained_by(gil) or gil.cpu_bound:
            return gil
        own = gil.holder_own_wait
        return own if own is not None and self.explained_by(own) else gil

    @property
    def gil_weight(self) -> GilWeight | None:
        return self.weigh(self.gil_seen)

    @property
    def gil_explains_gap(self) -> bool:
        return self.explained_by(self.gil_seen)

    @property
    def phase_weight(self) -> PhaseWeight | None:
        """The critical-path phases only the candidate runs, weighed against the time the gap
        added; None without one, a positive gap or the baseline's median iteration."""
        only = tuple(change for change in self.grown
                     if change.baseline_s is None and not change.concurrent and (change.candidate_s or 0.0) > 0)
        # the time the gap added must be a time: a gap of a subnormal fraction of an iteration
        # multiplies out to 0 s (hypothesis found 5e-324), and nothing can be a share of it
        if not only or not self.baseline_median_s or not self.gap * self.baseline_median_s > 0:
            return None
        return PhaseWeight(only, self.gap, max(self.high, self.gap), self.baseline_median_s)

    @property
    def phase_explains(self) -> bool:
        """Phases only the candidate runs account for the time the gap added
        (:attr:`PhaseWeight.substantial`)."""
        weight = self.phase_weight
        return weight is not None and weight.substantial

    @property
    def phase_may_be_the_hosts(self) -> bool:
        """On a busy host, the candidate also runs an activity of its own beside the iteration
        (``added_activities``): a phase only it runs may be a wait for that activity, which the
        other processes' load slows and the baseline's iterations do not share."""
        return bool(self.added_activities) and self.host_load is not None and self.host_load.busy

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
        gil = self.gil_seen
        if gil is not None:
            seen.update(gil_available=gil.available, gil_status=gil.status,
                        holder_function=gil.holder_function, holder_idle_share=gil.holder_idle_share,
                        starved_thread=gil.starved_thread, starved_of_runnable=gil.starved_of_runnable,
                        starved_waiting_share=gil.starved_waiting_share,
                        cpu_victim=gil.cpu_victim, cpu_victim_runqueue_share=gil.cpu_victim_runqueue_share,
                        competitor_thread=gil.competitor_thread,
                        competitor_function=gil.competitor_function,
                        competitor_cpu_share=gil.competitor_cpu_share)
            if gil is not self.gil:
                seen["gil_waiter"] = "the top holder's own wait"
        weight = self.gil_weight
        if weight is not None:
            seen.update(gil_explains=round(weight.explains, 4), gil_explains_low=round(weight.explains_low, 4))
        phases = self.phase_weight
        if phases is not None:
            seen.update(candidate_only_phases=[c.name for c in phases.phases],
                        phase_explains=round(phases.explains, 4), phase_explains_low=round(phases.explains_low, 4))
        if self.added_activities:
            seen["added_activities"] = list(self.added_activities)
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


def _failure_sentences(f: GapFindings, cpu: bool = False, gil_rule: bool = False) -> list[str]:
    """The why of a failing gap. Only the GIL rule (``gil_rule``) names the GIL's holder: its
    ``where`` carries it; any other rule says what waited for the GIL, and how much of the gap
    that wait explains."""
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
    gil, weight = f.gil_seen, f.gil_weight
    if gil is not None and cpu:
        sentences.append(gil.cpu_sentence())
    elif gil is not None:
        sentences.append(gil.sentence(name_holder=gil_rule))
        if weight is not None and gil.starved:
            sentences.append(weight.sentence(fired=gil_rule))
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
    gil = f.gil_seen
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
           f"{ran_out_text}.") + _lead(f) + busy_note(f.host_load)
    return Diagnosis(Status.INCONCLUSIVE, why, (f.more_evidence,) if f.more_evidence is not None else ())


def _lead(f: GapFindings) -> str:
    """`` The lead: staging_s, a phase only the candidate runs, takes ...`` when phases only the
    candidate runs come to half or more of the time the gap added at its estimate, else ""."""
    weight = f.phase_weight
    if weight is None or weight.explains < PHASE_EXPLAINS_SHARE:
        return ""
    return f" The lead: {weight.phrase()}."


def _within(f: GapFindings) -> Diagnosis | None:
    if f.high >= f.threshold:
        return None
    why = f"Within the threshold: {f.gap_text}."
    if f.bandwidth is not None and f.bandwidth.achieved_bytes_per_s is not None:
        why += f" {_capital(f.bandwidth.summary())}."
    return Diagnosis(Status.PASS, why, (), {})


def _gil_starved_sender(f: GapFindings) -> Diagnosis | None:
    gil = f.gil_seen
    if gil is None or not f.gil_explains_gap:
        return None
    sentences = _failure_sentences(f, gil_rule=True)
    if gil.idle_in_native:
        sentences.append(f"A missing GIL release in {gil.holder_function}: release the GIL around its native call "
                         "and rerun this gap.")
    return Diagnosis(Status.FAIL, " ".join(sentences), (*_gil_next(f), *_after_fix(f)), _gil_where(f))


def _cpu_guessed_backwards_on_busy_host(f: GapFindings) -> bool:
    """On a host other processes kept busy, where every thread waits for a CPU, the CPU finding
    had to guess the slowed thread (no thread the baseline also runs waited longer for a CPU:
    the thread that held the GIL most), and the guess is a thread the baseline's gil run did not
    see, slowed by one it did: the candidate's own helper slowed by the baseline's iteration
    thread is not the gap's cause. A busy-host run of the tolist pool (other processes on 1.7 of
    2 CPUs) named pool thread kv-serializer_0 slowed by the prefill; the zlib sender's runs, whose
    guess is the prefill slowed by the sender, keep their verdict."""
    gil, load = f.gil, f.host_load
    return (gil is not None and not gil.baseline_compared and gil.cpu_victim_in_baseline is False
            and gil.competitor_in_baseline is True and load is not None and load.busy)


def _cpu_contention(f: GapFindings) -> Diagnosis | None:
    gil = f.gil
    if not (f.over and gil is not None and gil.cpu_bound) or _cpu_guessed_backwards_on_busy_host(f):
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


def _candidate_only_phase(f: GapFindings) -> Diagnosis | None:
    weight = f.phase_weight
    if not (f.over and f.phase_explains and weight is not None) or f.phase_may_be_the_hosts:
        return None
    sentences = _failure_sentences(f)
    accounts = "that phase accounts" if len(weight.phases) == 1 else "those phases account"
    sentences.insert(2, f"{_capital(weight.phrase())}: {accounts} for the gap.")
    steps = (Step(f"cut or overlap {weight.names}: the baseline's iteration does without it"), *_gil_next(f),
             *_after_fix(f))
    return Diagnosis(Status.FAIL, " ".join(sentences) + busy_note(f.host_load), steps, {})


def _unexplained_on_busy_host(f: GapFindings) -> Diagnosis | None:
    load = f.host_load
    if not (f.over and load is not None and load.busy):
        return None
    sentences = _failure_sentences(f)
    weight = f.phase_weight
    if f.phase_explains and weight is not None:  # only when it may be the host's (the rule above)
        sentences[0] = (f"Not decided: {f.gap_text}, over the threshold as measured. The lead: {weight.phrase()}; "
                        f"but the candidate also runs {', '.join(f.added_activities)} beside the iteration, which "
                        "the other processes on this busy host may have slowed, so the phase may be their doing.")
    else:
        sentences[0] = (f"Not decided: {f.gap_text}, over the threshold as measured, but nothing measured explains "
                        "the gap and the host was busy, so it may be the other processes' doing.")
    gil = f.gil
    if gil is not None and gil.cpu_bound and _cpu_guessed_backwards_on_busy_host(f):
        sentences.append(f"The {gil.cpu_victim} thread, which the baseline does not run, waited for a CPU "
                         f"{gil.cpu_victim_runqueue_share or 0.0:.0%} of the time beside "
                         f"{describe(gil.competitor_thread or '', gil.competitor_thread_count)}, which it does, but "
                         f"{gil.baseline_reason or 'no thread the baseline also runs waited longer for a CPU'}: on a "
                         "host this busy that does not tell which thread the contention slowed.")
    why = " ".join(sentences) + busy_note(load)
    more = (f.more_evidence,) if f.more_evidence is not None else ()
    return Diagnosis(Status.INCONCLUSIVE, why, (*more, *_gil_next(f)), {})


def _over(f: GapFindings) -> Diagnosis | None:
    return Diagnosis(Status.FAIL, " ".join(_failure_sentences(f)), (*_gil_next(f), *_after_fix(f)), {})


RULES: tuple[Rule[GapFindings], ...] = (
    Rule("undecided", KIND, _undecided, "the interval straddles the threshold: inconclusive"),
    Rule("pass", KIND, _within, "the interval lies below the threshold"),
    Rule("gil-starved-sender", KIND, _gil_starved_sender,
         "a thread of the candidate waits for the GIL held by another, for a large share of its time or of the gap"),
    Rule("bandwidth-bound", KIND, _bandwidth_bound, "the transfer runs at the link's ceiling"),
    Rule("cpu-contention", KIND, _cpu_contention, "a thread of the candidate waits for a CPU another of its threads uses"),
    Rule("candidate-only-phase", KIND, _candidate_only_phase,
         "critical-path phases only the candidate runs account for the time the gap added"),
    Rule("undecided-busy-host", KIND, _unexplained_on_busy_host,
         "over the threshold, unexplained, on a busy host: inconclusive"),
    Rule("over-threshold", KIND, _over, "over the threshold, unexplained"),
)


# What each kind of sentence of a gap why needs of the findings (tests/test_gap_rules.py runs the
# rules over generated findings against these).
CLAIMS: tuple[Claim[GapFindings], ...] = (
    Claim("over", r"^Over the threshold", lambda f: f.over),
    Claim("within", r"^Within the threshold", lambda f: f.high < f.threshold),
    Claim("nothing-explains", r"nothing measured explains the gap",
          lambda f: not f.phase_explains and not f.gil_explains_gap),
    Claim("phase-accounts", r"accounts? for the gap", lambda f: f.phase_explains),
    Claim("lead", r"The lead: only the candidate runs",
          lambda f: f.phase_weight is not None and f.phase_weight.explains >= PHASE_EXPLAINS_SHARE),
    Claim("only-in-candidate", r"\(only in the candidate\)",
          lambda f: any(change.baseline_s is None for change in f.grown)),
    Claim("gil-explains", r"the GIL wait explains the gap", lambda f: f.gil_explains_gap),
    Claim("busy", r"The host was busy", lambda f: f.host_load is not None and f.host_load.busy),
)
