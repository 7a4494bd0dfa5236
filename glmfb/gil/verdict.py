"""The verdict of one ``glmfb gil`` trace, assembled: the engine's :class:`Observations` in;
the typed evidence, the :class:`~glmfb.gil.rules.GilFindings` the rules read, and the
:class:`~glmfb.contract.verdict.Verdict` out. The rules (:mod:`glmfb.gil.rules`) decide the status,
the why and the next steps; this module only measures against the thresholds and assembles."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from glmfb.contract.evidence import Evidence, MissingSignal
from glmfb.contract.step import Step
from glmfb.contract.verdict import Layer, Metric, Verdict
from glmfb.core.measure.hostload import HostLoad
from glmfb.core.rules import Rule, diagnose
from glmfb.gil.config import HEARTBEAT_THREAD, GilConfig
from glmfb.gil.evidence import (
    GilHolder,
    GilSignals,
    GilSite,
    GilStartup,
    GilThreads,
    GilTimeline,
    GilWaits,
    HolderThread,
    LoadRun,
    OverlapRow,
    Readiness,
    Starvation,
    StarvedWindow,
    ThreadTimeRow,
    ThreadTimes,
    TimelineThread,
    TraceOverlap,
    WaitingThread,
)
from glmfb.gil.groups import unnamed
from glmfb.gil.heartbeat import Heartbeat, lateness_series
from glmfb.gil.holders import holder_evidence, holder_site, released_fields
from glmfb.gil.pyspy import CallSite, HolderProfile
from glmfb.gil.rules import (
    LONG_HOLD_THRESHOLDS,
    LONG_HOLDS,
    MIN_WAIT_WALL_SHARE_ATTACHED,
    RULES,
    WAIT_SHARE_FAIL,
    GilFindings,
)

MIN_HEARTBEAT_TICKS = 50
MIN_COVERED_S = 0.5
MIN_WAITING_SHARE = 0.05  # a thread waiting for the GIL this share of wall time is starved
# A heartbeat too thin for a p99 (few wake-ups) still starved when it could not run for this
# many thresholds in one stretch while it waited for the GIL in most of that stretch.
STALL_THRESHOLDS = 10
STALL_GIL_SHARE = 0.5
CANARY_PREFIX = "glmfb-"  # glmfb's own threads in the program: never a starved thread we name
MAX_THREAD_ROWS = 16


@dataclass
class Observations:
    """Everything one trace produced, for the rules."""

    config: GilConfig
    heartbeat: Heartbeat | None = None
    holders: HolderProfile | None = None
    waiting: list[dict[str, Any]] = field(default_factory=list)  # target threads seen waiting
    windows: list[dict[str, Any]] = field(default_factory=list)  # the longest, longest first
    window_summary: dict[str, Any] = field(default_factory=dict)  # windows_total, starved_ms_total
    blame: list[dict[str, Any]] | None = None  # trace mode: functions overlapping starved slices
    missing: list[dict[str, str]] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    reproduce_trace: Step | None = None  # the step that reruns the probe in trace mode
    duration_s: float = 0.0
    observed_s: float | None = None  # the sampled window's length
    window_start_s: float | None = None
    thread_times: dict[int, Any] = field(default_factory=dict)  # tid -> procwatch.ThreadTime
    thread_names: dict[int, str] = field(default_factory=dict)
    cpus: dict[int, str] = field(default_factory=dict)  # tid -> Cpus_allowed_list
    native_votes: dict[int, Counter[tuple[str, str]]] = field(default_factory=dict)  # tid -> (name, symbol) seen
    # tid -> library functions below Python, counted once per snapshot they appear in
    native_foreign: dict[int, Counter[str]] = field(default_factory=dict)
    # tid -> what its snapshots found it blocked in with the GIL released (queue.SimpleQueue.get): no votes
    native_released: dict[int, Counter[str]] = field(default_factory=dict)
    native_error: str | None = None
    native_snapshots: int = 0
    stall: dict[str, Any] = field(default_factory=dict)  # the heartbeat's longest stretch without a wake-up
    timeline: dict[int, list[list[Any]]] = field(default_factory=dict)
    own_p99_ms: float | None = None  # p99 net of the heartbeat's own CPU waits only
    holder_cpu_wait_s: float = 0.0  # the holder's CPU waits taken out of late wake-ups
    # tid -> how many short-lived threads of one name it stands for (glmfb.gil.groups; 2+)
    thread_counts: dict[int, int] = field(default_factory=dict)
    startup: HolderProfile | None = None  # who held the GIL inside imports (start-up), apart
    startup_excluded_s: float = 0.0  # seconds at the window's start left out: imports until they settled
    startup_settled: bool | None = None  # the start-up imports settled inside the window (None: no heartbeat)
    rerun_longer: Step | None = None  # the step that reruns with a window long enough to get past start-up
    host_load: HostLoad | None = None  # the rest of the host while sampling ran
    attached: bool = False  # attached by --pid: no heartbeat, decided from py-spy and /proc
    signals_used: tuple[str, ...] = ()  # what was measured, in the words a why uses
    gil_futex: str | None = None  # how the GIL's futex words were found (None: not found)
    waits_measured: bool = False  # /proc ran and the GIL's futex is known: who waited for it is known
    # waiter tid -> holder tid -> (ticks the waiter waited for the GIL, what the holder did then)
    wait_holder_states: dict[int, dict[int, tuple[int, Counter[str]]]] = field(default_factory=dict)
    readiness: Readiness | None = None  # --ready / --ready-log: when the program was ready
    load: LoadRun | None = None  # --load: how the load command ran


def decide(observations: Observations, rules: Sequence[Rule[Any]] | None = None) -> Verdict:
    """The verdict of one trace: typed evidence, findings, the first rule that applies."""
    config = observations.config
    _count_threads(observations)
    starvation = _starvation(observations)
    holders = _holders(observations)
    starved_names = tuple(starved_threads(observations, starvation.starved, holders.site))
    missing = tuple(MissingSignal(signal=m["signal"], reason=m["reason"]) for m in observations.missing)
    overlaps = tuple(OverlapRow(**row) for row in observations.blame[:10]) if observations.blame is not None else None
    evidence = _evidence(observations, starvation, holders, starved_names, missing, overlaps)
    findings = _findings(observations, starvation, holders, starved_names, missing, overlaps)
    outcome = diagnose(list(rules) if rules is not None else list(RULES), findings)
    evidence.append(outcome.record)
    diagnosis = outcome.diagnosis
    why = diagnosis.why
    load = observations.load
    if load is not None and (load.failed or load.ended_s is not None) and "load command" not in why:
        # a load that failed or ended early is said, whatever decided (the load-failed rule
        # says it itself)
        why = f"{why} Meanwhile {load.phrase()}" + ("." if not load.phrase().endswith(".") else "")
    if load is not None and load.reported:
        why = f"{why} Under this load, the load command reported {load.figures()} (its last JSON line)."
    return Verdict(
        probe="gil", name=config.name, status=diagnosis.status, layer=Layer.RUNTIME, why=why,
        where=dict(diagnosis.where or {}),
        metric=Metric("starvation_p99", starvation.p99_ms, "ms", config.starvation_p99_ms),
        evidence=tuple(evidence), next=diagnosis.next, artifacts=observations.artifacts, env=observations.env,
        duration_s=observations.duration_s,
    )


def _count_threads(observations: Observations) -> None:
    """Mark the call sites of a group of short-lived threads with how many threads it stands for."""
    counts, profile = observations.thread_counts, observations.holders
    if counts and profile is not None:
        for site in profile.sites:
            site.thread_count = counts.get(site.thread_id, 1)


@dataclass(frozen=True)
class _Starvation:
    """Whether the heartbeat starved: its p99 lateness against the threshold or, when it woke
    too rarely for a p99, one long stretch blocked on the GIL (``stalled``)."""

    heartbeat_usable: bool
    p99_ms: float | None
    starved: bool
    stalled: bool
    stall_s: float | None
    stall_share: float | None
    p99_interval_ms: tuple[float, float] | None = None  # the p99's 95% interval (block bootstrap)
    hold_ms: tuple[float, ...] = ()  # each window the heartbeat woke late beyond the threshold: its lateness, ms
    held_long: bool = False  # starved by LONG_HOLDS or more holds of LONG_HOLD_THRESHOLDS thresholds


def _holds_ms(heartbeat: Heartbeat, threshold_ms: float) -> tuple[float, ...]:
    """The holds the heartbeat saw: each window in which it woke more than the threshold late
    (net of its CPU waits, so waiting for the GIL), as its longest lateness, longest first."""
    return tuple(sorted((1e3 * w.max_lateness_s for w in heartbeat.windows(threshold_ms / 1e3)), reverse=True))


def _starvation(observations: Observations) -> _Starvation:
    heartbeat = observations.heartbeat
    threshold_ms = observations.config.starvation_p99_ms
    beat_ok = heartbeat is not None and heartbeat_is_usable(heartbeat)
    p99_ms = heartbeat.percentile_ms(99) if beat_ok and heartbeat is not None else None
    starved = p99_ms is not None and p99_ms > threshold_ms
    stall = observations.stall
    stall_s, stall_share = stall.get("stall_s"), stall.get("gil_share")
    stalled = bool(
        heartbeat is not None and heartbeat.ticks < MIN_HEARTBEAT_TICKS and stall_s is not None
        and stall_share is not None and 1e3 * stall_s >= STALL_THRESHOLDS * threshold_ms
        and stall_share >= STALL_GIL_SHARE
    )
    if stalled and heartbeat is not None and stall_s is not None and stall_share is not None:
        beat_ok, starved = True, True
        p99_ms = max(p99_ms or 0.0, _stall_p99_ms(stall_s, stall_share, observations.observed_s or stall_s,
                                                  heartbeat.period_s))
    interval = heartbeat.percentile_interval_ms(99) if beat_ok and heartbeat is not None and not stalled else None
    holds = _holds_ms(heartbeat, threshold_ms) if beat_ok and heartbeat is not None else ()
    held_long = sum(1 for hold in holds if hold >= LONG_HOLD_THRESHOLDS * threshold_ms) >= LONG_HOLDS
    return _Starvation(beat_ok, p99_ms, starved or held_long, stalled, stall_s, stall_share, interval, holds,
                       held_long and not starved)


@dataclass(frozen=True)
class _Holders:
    """Who held the GIL: the top holder's call site and its evidence, the program thread that
    waited for the GIL most, and who held it meanwhile (not that thread itself)."""

    site: CallSite | None
    holder: GilHolder | None
    sample_instants: int
    waiting: tuple[WaitingThread, ...]
    waiter: WaitingThread | None
    wait_holder: GilHolder | None


def _holders(observations: Observations) -> _Holders:
    def top_site(exclude: frozenset[int] = frozenset()) -> CallSite | None:
        return holder_site(observations.holders, observations.config.min_holder_share,
                           observations.native_votes, observations.native_foreign, exclude)

    profile = observations.holders
    total = profile.sample_instants if profile else 0
    site = top_site()
    waiting = _waiting_threads(observations)
    ready = observations.attached and observations.heartbeat is None  # a server's threads: of their time ready to run
    waiter = _top_waiter([w for w in waiting if site is None or w.tid != site.thread_id] or waiting, ready=ready)
    wait_holder = _holder_evidence(observations, top_site(frozenset({waiter.tid})), total) if waiter is not None else None
    return _Holders(site, _holder_evidence(observations, site, total), total, tuple(waiting), waiter, wait_holder)


def _holder_evidence(observations: Observations, site: CallSite | None, total: int) -> GilHolder | None:
    if site is None:
        return None
    found = holder_evidence(site, total, votes=observations.native_votes.get(site.thread_id),
                            released=observations.native_released.get(site.thread_id),
                            foreign=observations.native_foreign.get(site.thread_id))
    assert isinstance(found, GilHolder)
    return found


def _evidence(observations: Observations, starvation: _Starvation, holders: _Holders, starved_names: tuple[str, ...],
              missing: tuple[MissingSignal, ...], overlaps: tuple[OverlapRow, ...] | None) -> list[Evidence]:
    """The typed evidence of the trace, in the order the verdict shows it (the diagnosis last)."""
    evidence: list[Evidence] = []
    if observations.heartbeat is not None:
        evidence.append(_starvation_evidence(observations, observations.heartbeat, starvation, starved_names,
                                             holders.waiting))
    if holders.holder is not None:
        evidence.append(holders.holder)
    startup = _startup_evidence(observations)
    if startup is not None:
        evidence.append(startup)
    profile = observations.holders
    if profile is not None:
        evidence.append(GilThreads(
            samples=profile.total_samples, sample_instants=profile.sample_instants, native=profile.native,
            threads=tuple(HolderThread(**t, thread_count=observations.thread_counts.get(t["tid"], 1))
                          for t in profile.threads[:8]),
            sites=tuple(holder_evidence(s, holders.sample_instants, GilSite)  # type: ignore[misc]
                        for s in profile.sites[1:4]),
        ))
    times = _thread_times(observations)
    if times is not None:
        evidence.append(times)
    timeline = _timeline(observations)
    if timeline is not None:
        evidence.append(timeline)
    if overlaps is not None:
        evidence.append(TraceOverlap(functions=overlaps))
    if observations.host_load is not None:
        evidence.append(observations.host_load.evidence())
    waits = _waits_evidence(observations, holders)
    if waits is not None:
        evidence.append(waits)
    if observations.readiness is not None:
        evidence.append(observations.readiness)
    if observations.load is not None:
        evidence.append(observations.load)
    evidence.append(GilSignals(attached=observations.attached, used=observations.signals_used,
                               missing=tuple(dict.fromkeys(m.signal for m in missing)),
                               gil_futex=observations.gil_futex))
    evidence.extend(missing)
    return evidence


def _waits_evidence(observations: Observations, holders: _Holders) -> GilWaits | None:
    """Without a heartbeat (whose starvation evidence carries them otherwise): the threads that
    waited for the GIL, and what the holder did while the top waiter waited."""
    if observations.heartbeat is not None or not observations.waits_measured:
        return None
    waiter, holder = holders.waiter, holders.wait_holder
    ticks, states = _holder_states(observations, holders)
    return GilWaits(
        observed_s=round(observations.observed_s or 0.0, 4), threshold_share=WAIT_SHARE_FAIL,
        threads=holders.waiting, waiter=waiter.thread if waiter is not None else None,
        holder=holder.thread if holder is not None else None, wait_ticks=ticks,
        holder_states=dict(states.most_common(4)) if states is not None else None,
    )


def _holder_states(observations: Observations, holders: _Holders) -> tuple[int | None, Counter[str] | None]:
    """The /proc ticks at which the top waiter waited for the GIL, and what the thread of the
    holder named beside it did at them."""
    waiter, holder = holders.waiter, holders.wait_holder
    if waiter is None or holder is None:
        return None, None
    found = observations.wait_holder_states.get(waiter.tid, {}).get(holder.tid)
    return found if found is not None else (None, None)


def _startup_evidence(observations: Observations) -> GilStartup | None:
    """The top site that held the GIL inside imports (start-up), with the count of all such
    samples: reported apart, never the verdict's holder."""
    startup = observations.startup
    if startup is None or not startup.sites:
        return None
    site = startup.sites[0]
    found = holder_evidence(site, startup.sample_instants, GilStartup)
    assert isinstance(found, GilStartup)
    return replace(found, samples_total=startup.total_samples)


def _starvation_evidence(observations: Observations, heartbeat: Heartbeat, starvation: _Starvation,
                         starved_names: tuple[str, ...], waiting: tuple[WaitingThread, ...]) -> Starvation:
    """The heartbeat's lateness, the starved windows, the longest stall and who waited."""
    p99_ms, stall_s, stall_share = starvation.p99_ms, starvation.stall_s, starvation.stall_share
    stall = observations.stall
    recorded_p99 = (observations.own_p99_ms if observations.own_p99_ms is not None
                    else heartbeat.percentile_ms(99) if heartbeat.ticks else None)
    summary = heartbeat.summary()
    summary["p99_ms"] = round(p99_ms, 3) if p99_ms is not None else summary["p99_ms"]
    start = observations.window_start_s
    observed = observations.observed_s
    return Starvation(
        threads=starved_names, canary=HEARTBEAT_THREAD, **summary, threshold_ms=observations.config.starvation_p99_ms,
        starved=starvation.starved, waiting_for_gil=waiting,
        **observations.window_summary, windows=tuple(StarvedWindow(**w) for w in observations.windows),
        observed_s=round(observed, 4) if observed is not None else None,
        expected_ticks=int(observed / heartbeat.period_s) if observed else None,
        stall_ms=round(1e3 * stall_s, 1) if stall_s is not None else None,
        stall_start_s=round(stall["start_s"], 4) if "start_s" in stall else None,
        stall_gil_share=round(stall_share, 4) if stall_share is not None else None,
        stall_holder=stall.get("holder"),
        p99_interval_ms=tuple(round(x, 3) for x in starvation.p99_interval_ms) if starvation.p99_interval_ms else None,
        recorded_p99_ms=round(recorded_p99, 3) if recorded_p99 is not None else None,
        holder_cpu_wait_ms=round(1e3 * observations.holder_cpu_wait_s, 1),
        startup_excluded_s=round(observations.startup_excluded_s, 3) if observations.startup_excluded_s else None,
        startup_settled=observations.startup_settled,
        hold_median_ms=round(statistics.median(starvation.hold_ms), 1) if starvation.hold_ms else None,
        held_long=starvation.held_long,
        lateness_series=tuple(lateness_series(heartbeat, start, start + observed))
        if start is not None and observed else (),
    )


def _findings(observations: Observations, starvation: _Starvation, holders: _Holders, starved_names: tuple[str, ...],
              missing: tuple[MissingSignal, ...], overlaps: tuple[OverlapRow, ...] | None) -> GilFindings:
    """What the trace established, in the terms the rules speak."""
    config, heartbeat, profile, site = observations.config, observations.heartbeat, observations.holders, holders.site
    stall_s = starvation.stall_s
    ticks, states = _holder_states(observations, holders)
    return GilFindings(
        threshold_ms=config.starvation_p99_ms, min_holder_share=config.min_holder_share, starved=starvation.starved,
        heartbeat_usable=starvation.heartbeat_usable, p99_ms=starvation.p99_ms,
        ticks=heartbeat.ticks if heartbeat is not None else 0,
        holder=holders.holder, holder_sampled=profile is not None, sample_instants=holders.sample_instants,
        native_known=bool(profile is not None and profile.native and site is not None and site.split_samples > 0),
        starved_threads=starved_names, missing=missing,
        top_overlap=overlaps[0] if overlaps else None, traced=observations.blame is not None,
        reproduce_trace=observations.reproduce_trace,
        stall_ms=1e3 * stall_s if stall_s is not None else None, stall_gil_share=starvation.stall_share,
        stalled=starvation.stalled, observed_s=observations.observed_s, waiter=holders.waiter,
        wait_holder=holders.wait_holder, own_p99_ms=observations.own_p99_ms,
        p99_interval_ms=starvation.p99_interval_ms, host_load=observations.host_load,
        hold_ms=starvation.hold_ms, held_long=starvation.held_long,
        startup_settled=observations.startup_settled, startup=_startup_evidence(observations),
        rerun_longer=observations.rerun_longer,
        attached=observations.attached, waits_measured=observations.waits_measured,
        signals_used=observations.signals_used, wait_ticks=ticks, wait_holder_states=states,
        load=observations.load,
        thread_shares={t["tid"]: t["share"] for t in profile.threads} if profile is not None else None,
        also_waiting=tuple(w for w in holders.waiting if (w.of_ready_share or 0.0) >= WAIT_SHARE_FAIL
                           and w.waiting_share >= MIN_WAIT_WALL_SHARE_ATTACHED
                           and not w.thread.startswith(CANARY_PREFIX)) if observations.attached else (),
    )


def heartbeat_is_usable(heartbeat: Heartbeat) -> bool:
    """Enough ticks, or few ticks that cover a long time: a heavily starved heartbeat wakes
    rarely, and that is the signal, not a lack of data."""
    if not heartbeat.ticks:
        return False
    # The time the heartbeat saw: from its first wake-up (and the wait before it) to its
    # last. Summing lateness alone misses the waits for the GIL after its own file writes,
    # and under heavy starvation that undercounts a 2 s window as 0.5 s (found flaky in CI).
    span_s = max(heartbeat.wake_s) - min(heartbeat.wake_s) if heartbeat.wake_s else 0.0
    covered_s = max(
        span_s + max(0.0, heartbeat.lateness_s[0]) + heartbeat.period_s,
        heartbeat.ticks * heartbeat.period_s + sum(max(0.0, x) for x in heartbeat.lateness_s),
    )
    return heartbeat.ticks >= MIN_HEARTBEAT_TICKS or (
        heartbeat.ticks >= 3 and covered_s >= MIN_COVERED_S
    )


def starved_threads(
    observations: Observations, starved: bool, holder: CallSite | None
) -> list[str]:
    """Threads waiting for the GIL a real share of the time (never the holder itself), and the
    heartbeat when it was late beyond the threshold."""
    names = [
        w["thread"]
        for w in observations.waiting
        if w["waiting_share"] >= MIN_WAITING_SHARE
        and (holder is None or w["tid"] != holder.thread_id)
    ]
    if starved:
        names.append(HEARTBEAT_THREAD)
    return names


def _stall_p99_ms(stall_s: float, share: float, observed_s: float, period_s: float) -> float:
    """The p99 lateness of the wake-ups a heartbeat held back for ``stall_s * share`` would
    have made: each missed deadline counts, the k-th late by the stall less k periods, so 1%
    of the window's deadlines lie beyond the stall less 1% of the window."""
    blocked_s = stall_s * share
    return 1e3 * max(0.0, blocked_s - 0.01 * observed_s)


def _waiting_threads(observations: Observations) -> list[WaitingThread]:
    return [WaitingThread(**w) for w in observations.waiting]


def _top_waiter(waiting: list[WaitingThread], *, ready: bool = False) -> WaitingThread | None:
    """The program thread whose GIL-wait share (of its time off the run queue; ``ready``: of its
    time ready to run) is highest by its interval's low end; among those that waited a real
    share of wall time first, so a thread seen waiting for a moment does not outrank them."""
    def share(w: WaitingThread) -> tuple[float | None, tuple[float, ...]]:
        return (w.of_ready_share, w.of_ready_ci) if ready else (w.of_runnable_share, w.of_runnable_ci)

    program = [w for w in waiting if not w.thread.startswith(CANARY_PREFIX) and share(w)[0] is not None]
    if not program:
        return None
    if ready:
        program = [w for w in program if w.waiting_share >= MIN_WAIT_WALL_SHARE_ATTACHED] or program
    return max(program, key=lambda w: (share(w)[1][0] if share(w)[1] else 0.0, share(w)[0] or 0.0))


def _thread_times(observations: Observations) -> ThreadTimes | None:
    if not observations.thread_times:
        return None
    rows = []
    names = observations.thread_names
    heartbeat_tid = observations.heartbeat.thread_id if observations.heartbeat is not None else None
    for tid, account in sorted(observations.thread_times.items(), key=lambda item: -(item[1].cpu_s + item[1].gil_wait_s)):
        if account.wall_s <= 0:
            continue
        votes = observations.native_votes.get(tid, Counter())
        released = observations.native_released.get(tid, Counter())
        named = Counter({k[0]: v for k, v in votes.items() if k[0]})
        top = named.most_common(1)[0] if named else None
        runnable = account.wall_s - account.runqueue_s
        name = names.get(tid, unnamed(tid))
        rows.append(ThreadTimeRow(
            thread=name, tid=tid, cpu_share=round(account.cpu_share, 4),
            runqueue_share=round(account.runqueue_share, 4), gil_wait_share=round(account.gil_wait_share, 4),
            other_wait_share=round(account.other_wait_share, 4),
            gil_wait_ci=tuple(round(x, 4) for x in account.gil_wait_ci),
            gil_wait_of_runnable=round(account.gil_wait_s / runnable, 4) if runnable > 0 else None,
            gil_wait_of_ready=round(account.of_ready_share, 4) if account.of_ready_share is not None else None,
            longest_gil_wait_ms=round(1e3 * account.longest_gil_wait_s, 1),
            cpus=observations.cpus.get(tid), c_function=top[0] if top else None,
            c_function_share=round(top[1] / sum(votes.values()), 4) if top else None,
            native_snapshots=sum(votes.values()) + sum(released.values()), **released_fields(released),
            glmfb=tid == heartbeat_tid or name.startswith(CANARY_PREFIX),
            thread_count=observations.thread_counts.get(tid, 1),
        ))
        if len(rows) >= MAX_THREAD_ROWS:
            break
    return ThreadTimes(observed_s=round(observations.observed_s or 0.0, 4), threads=tuple(rows),
                       native_snapshots=observations.native_snapshots, native_error=observations.native_error)


def _timeline(observations: Observations) -> GilTimeline | None:
    if not observations.timeline:
        return None
    names = observations.thread_names
    return GilTimeline(observed_s=round(observations.observed_s or 0.0, 4), threads=tuple(
        TimelineThread(thread=names.get(tid, unnamed(tid)), tid=tid, spans=tuple(spans))
        for tid, spans in observations.timeline.items()))
