"""The verdict rules of ``glmfb gil``, kept in one place.

- A thread starved beyond the p99 threshold while another thread holds the GIL: **fail**,
  ``where`` = the holder's thread, function, file and line. Held mostly while blocked in a
  native call (idle + GIL): a missing GIL release. Held while computing (active + GIL):
  work hogging the interpreter, with the hot frames.
- Starved, but the holder is unknown (py-spy missing, ptrace refused) or nobody held the GIL
  for long (the CPU was busy, not the GIL): **inconclusive**, naming what is missing.
- Not starved: **pass**; **warn** when a signal was missing or a thread still held the GIL
  while blocked in a native call for a large share of the time.
- No heartbeat (attached by pid, or not a Python process): **inconclusive**; never a pass.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmfb.gil.config import HEARTBEAT_THREAD, GilConfig
from glmfb.gil.heartbeat import Heartbeat
from glmfb.gil.pyspy import CallSite, HolderProfile
from glmfb.verdict import Layer, Metric, ProbeKind, Status, Verdict

MIN_HEARTBEAT_TICKS = 50
MIN_COVERED_S = 0.5
_LIBRARY_PREFIXES = tuple(
    {
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["platstdlib"],
        sysconfig.get_paths()["purelib"],
    }
)
IDLE_MAJORITY = 0.5  # a holder blocked in this share of its samples holds the GIL while idle
WARN_IDLE_SHARE = 0.2  # without starvation, still worth a warning
MIN_WAITING_SHARE = 0.05  # a thread seen waiting for the GIL in this share of ticks is starved


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
    reproduce_trace: str = ""
    duration_s: float = 0.0


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


def _is_library(file: str) -> bool:
    return file.startswith(_LIBRARY_PREFIXES) or "site-packages" in file or file.startswith("<")


def caller_frame(stack: tuple[str, ...]) -> str | None:
    """The innermost frame outside the standard library and installed packages."""
    for label in reversed(stack):
        location = label.rpartition(" (")[2].rstrip(")")
        if not _is_library(location.rpartition(":")[0]):
            return label
    return None


def holder_evidence(site: CallSite, total: int) -> dict[str, Any]:
    native = site.native_calls.most_common(1)
    stack = site.stacks.most_common(1)[0][0] if site.stacks else ()
    known = site.split_samples > 0
    idle_share = site.idle / site.samples if site.samples and known else 0.0
    return {
        "kind": "gil_holder",
        "thread": site.thread_name,
        "tid": site.thread_id,
        "function": _short(site.function),
        "qualname": site.function,
        "file": display_path(site.file),
        "line": site.line,
        "samples": site.samples,
        "share_of_time": round(site.samples / total, 4) if total else None,
        # The same figure under its first name (glmfb gap reads it): kept for compatibility.
        "share_of_samples": round(site.samples / total, 4) if total else None,
        "active_share": round(1.0 - idle_share, 4) if known else None,
        "idle_share": round(idle_share, 4) if known else None,
        "native_frame": native[0][0] if native else None,
        "native_samples": site.split_samples,
        "caller": caller_frame(stack),
        "stack": list(stack[-8:]),
    }


def display_path(file: str) -> str:
    """A file as users read it: relative to the working directory when under it."""
    path = Path(file)
    if path.is_absolute():
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            return file
    return file


def _short(function: str) -> str:
    return function if function.startswith("<") else function.rsplit(".", 1)[-1]


def holder_site(observations: Observations) -> CallSite | None:
    """The thread that held the GIL most (heartbeat excluded), and its top call site; None when
    no thread held it in ``min_holder_share`` of the samples."""
    profile = observations.holders
    if profile is None or not profile.sites or not profile.sample_instants:
        return None
    candidates = [t for t in profile.threads if not t["excluded"]]
    sites_by_thread = {s.thread_id for s in profile.sites}
    candidates = [t for t in candidates if t["tid"] in sites_by_thread]
    if not candidates:
        return None
    top_thread = candidates[0]  # threads come ranked by samples
    if top_thread["samples"] / profile.sample_instants < observations.config.min_holder_share:
        return None
    return next(s for s in profile.sites if s.thread_id == top_thread["tid"])


def starved_threads(
    observations: Observations, starved: bool, holder: CallSite | None
) -> list[str]:
    """Threads seen waiting for the GIL often enough (never the holder itself), and the
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


def decide(observations: Observations) -> Verdict:
    config = observations.config
    heartbeat = observations.heartbeat
    threshold_ms = config.starvation_p99_ms
    beat_ok = heartbeat is not None and heartbeat_is_usable(heartbeat)
    p99_ms = heartbeat.percentile_ms(99) if beat_ok and heartbeat is not None else None
    starved = p99_ms is not None and p99_ms > threshold_ms
    holder = holder_site(observations)
    total = observations.holders.sample_instants if observations.holders else 0
    starved_names = starved_threads(observations, starved, holder)

    evidence: list[dict[str, Any]] = []
    if heartbeat is not None:
        evidence.append(
            {
                "kind": "starvation",
                "threads": starved_names,
                "canary": HEARTBEAT_THREAD,
                **heartbeat.summary(),
                "threshold_ms": threshold_ms,
                "starved": starved,
                "waiting_for_gil": observations.waiting,
                **observations.window_summary,
                "windows": observations.windows,
            }
        )
    if holder is not None:
        evidence.append(holder_evidence(holder, total))
    if observations.holders is not None:
        evidence.append(
            {
                "kind": "gil_threads",
                "samples": observations.holders.total_samples,
                "sample_instants": observations.holders.sample_instants,
                "native": observations.holders.native,
                "threads": list(observations.holders.threads[:8]),
                "sites": [
                    holder_evidence(s, total) | {"kind": "site"}
                    for s in observations.holders.sites[1:4]
                ],
            }
        )
    if observations.blame is not None:
        evidence.append({"kind": "trace_overlap", "functions": observations.blame[:10]})
    evidence.extend({"kind": "missing_signal", **m} for m in observations.missing)

    metric = Metric("starvation_p99", p99_ms, "ms", threshold_ms)
    where: dict[str, Any] = {}
    next_steps: list[str] = []
    missing_text = "; ".join(f"{m['signal']}: {m['reason']}" for m in observations.missing)
    idle_share = holder.idle / holder.samples if holder is not None and holder.samples else 0.0
    native_known = (
        observations.holders is not None
        and observations.holders.native
        and holder is not None
        and holder.split_samples > 0
    )
    starved_text = ", ".join(starved_names) or HEARTBEAT_THREAD

    if holder is not None:
        where = {
            "thread": holder.thread_name,
            "function": _short(holder.function),
            "file": display_path(holder.file),
            "line": holder.line,
        }

    if starved and holder is not None:
        status = Status.FAIL
        late = f"{starved_text} starved (p99 wake-up {p99_ms:.1f} ms late > {threshold_ms:g} ms)"
        function = _short(holder.function)
        if native_known and idle_share >= IDLE_MAJORITY:
            native = holder.native_calls.most_common(1)
            inside = f" ({native[0][0]})" if native else ""
            why = (
                f"{function} holds the GIL inside a native call{inside}; release it around the call "
                f"(py::gil_scoped_release, Py_BEGIN_ALLOW_THREADS). {late} while thread "
                f"{holder.thread_name} held the GIL blocked in {100 * idle_share:.0f}% of its samples."
            )
            next_steps.append(
                f"wrap the native call under {function} ({display_path(holder.file)}:{holder.line}) in "
                "py::gil_scoped_release / Py_BEGIN_ALLOW_THREADS, then rerun this probe"
            )
        else:
            stack = holder.stacks.most_common(1)[0][0] if holder.stacks else ()
            hot = " <- ".join(reversed(stack[-3:]))
            caller = caller_frame(stack)
            if caller is not None and caller not in stack[-3:]:
                hot += f", called from {caller}"
            held = f"{100 * holder.samples / total:.0f}% of sample instants"
            if native_known:
                native = holder.native_calls.most_common(1)
                inside = f", mostly inside native {native[0][0]}" if native else ""
                why = (
                    f"{function} on thread {holder.thread_name} hogs the interpreter: it held the GIL "
                    f"in {held}, active (computing) in {100 * (1 - idle_share):.0f}% of its samples"
                    f"{inside}; {late}. Hot frames: {hot}."
                )
                next_steps.append(
                    f"move the work in {function} ({display_path(holder.file)}:{holder.line}) off the GIL "
                    "(a native call that releases it, a process pool) or cut it into shorter pieces"
                )
            else:
                why = (
                    f"{function} on thread {holder.thread_name} held the GIL in {held}; {late}. Whether "
                    "it computes or blocks inside a native call while holding it is unknown without "
                    f"py-spy --native (active/idle split unknown). Hot frames: {hot}."
                )
                next_steps.append(
                    f"py-spy dump --native --pid <pid>  # is {function} blocked in a native call "
                    "(release the GIL around it) or computing?"
                )
        if observations.blame is None and observations.reproduce_trace:
            next_steps.append(
                f"{observations.reproduce_trace}  # ranks what overlaps the starved slices"
            )
    elif starved:
        status = Status.INCONCLUSIVE
        if observations.holders is None:
            cause = f"the GIL holder is unknown ({missing_text or 'holder sampling did not run'})"
            next_steps.append(
                "install py-spy (pip install py-spy) and run as root or with CAP_SYS_PTRACE"
            )
        else:
            cause = (
                f"no thread held the GIL in {100 * config.min_holder_share:.0f}% or more of "
                f"{total} sample instants: the CPU (other processes), not the GIL, may be the cause"
            )
            next_steps.append("rerun on a quiet machine; check the load with top/pidstat")
        why = f"{starved_text} starved (p99 wake-up {p99_ms:.1f} ms late > {threshold_ms:g} ms), but {cause}."
        if observations.blame:
            top = observations.blame[0]
            why += f" The trace ranks {top['function']} on thread {top['thread']} first by overlap."
    elif not beat_ok:
        status = Status.INCONCLUSIVE
        reason = "no heartbeat data"
        if heartbeat is not None:
            reason = f"only {heartbeat.ticks} heartbeat ticks"
        held = ""
        if holder is not None:
            held = (
                f" Meanwhile {_short(holder.function)} on thread {holder.thread_name} held the GIL in "
                f"{100 * holder.samples / total:.0f}% of sample instants"
                + (f", blocked in {100 * idle_share:.0f}% of them." if native_known else ".")
            )
        missing_or_guess = missing_text or "the program may not be Python"
        why = f"Starvation was not measured ({reason}; {missing_or_guess}).{held}"
        next_steps.append(
            "start the program under glmfb (glmfb gil -- python prog.py) so the heartbeat is injected"
        )
    else:
        if observations.missing:
            status = Status.WARN
            why = (
                f"No thread was starved (heartbeat p99 {p99_ms:.1f} ms <= {threshold_ms:g} ms), "
                f"but a signal is missing: {missing_text}."
            )
        elif (
            holder is not None
            and native_known
            and idle_share >= WARN_IDLE_SHARE
            and holder.samples / total >= 0.2
        ):
            status = Status.WARN
            why = (
                f"No thread was starved (heartbeat p99 {p99_ms:.1f} ms <= {threshold_ms:g} ms), yet "
                f"{_short(holder.function)} holds the GIL while blocked in a native call in "
                f"{100 * idle_share:.0f}% of its samples: a release is missing there."
            )
        else:
            status = Status.PASS
            why = (
                f"No thread was starved: heartbeat p99 wake-up lateness {p99_ms:.1f} ms <= "
                f"{threshold_ms:g} ms over {heartbeat.ticks if heartbeat else 0} ticks."
            )
            where = {}
    return Verdict(
        probe=ProbeKind.GIL,
        name=config.name,
        status=status,
        layer=Layer.RUNTIME,
        why=why,
        where=where,
        metric=metric,
        evidence=tuple(evidence),
        next=tuple(next_steps),
        artifacts=observations.artifacts,
        env=observations.env,
        duration_s=observations.duration_s,
    )
