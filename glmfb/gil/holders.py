"""Who held the GIL: the call site a thread held it in most, the C function it held it in, and
that site as typed evidence (:class:`~glmfb.gil.evidence.GilHolder`), from py-spy's profile and
the native snapshots of each thread."""

from __future__ import annotations

import builtins
import importlib
import linecache
import re
import sys
import sysconfig
import types
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from glmfb.gil.evidence import GilHolder, HeldSite
from glmfb.gil.pyspy import CallSite, HolderProfile

_LIBRARY_PREFIXES = tuple(
    {
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["platstdlib"],
        sysconfig.get_paths()["purelib"],
    }
)


def _is_library(file: str) -> bool:
    return file.startswith(_LIBRARY_PREFIXES) or "site-packages" in file or file.startswith("<")


def library_file(file: str) -> bool:
    """A file of the standard library or an installed package (as written in evidence: a path
    under the working directory may be relative), never the user's own code."""
    return _is_library(file) or _is_library(str(Path(file).resolve())) if file else False


def caller_frame(stack: tuple[str, ...]) -> str | None:
    """The innermost frame outside the standard library and installed packages."""
    for label in reversed(stack):
        location = label.rpartition(" (")[2].rstrip(")")
        if not _is_library(location.rpartition(":")[0]):
            return label
    return None


def glmfb_file(file: str) -> bool:
    """A file of glmfb itself (its runner, its heartbeat): never the cause."""
    import glmfb

    package = Path(glmfb.__file__).resolve().parent
    try:
        return Path(file).resolve().is_relative_to(package)
    except (OSError, ValueError):
        return False


def _names_callee(file: str, line: int, symbol: str) -> bool:
    """Whether the source line calls the foreign function by (a variable of) its name:
    ``usleep(wait_us)``, ``self._usleep(wait_us)``."""
    text = linecache.getline(file, line) if file and line else ""
    callees = re.findall(r"([A-Za-z_][\w]*)\s*\(", text)
    wanted = symbol.lower().strip("_")
    return bool(wanted) and any(wanted in callee.lower() for callee in callees)


# How a C function was named when no native frame of the site was sampled: the site's line
# calls one function, and that name resolves to a C function of Python's own library.
SOURCE_LINE = "the line's only call"
# The other sources of a C function's name: frames py-spy --native sampled below the site, or
# the thread's native snapshots while it ran.
SOURCE_NATIVE = "py-spy --native"
SOURCE_SNAPSHOTS = "native snapshots"
_KEYWORDS = frozenset({"if", "elif", "while", "for", "in", "not", "and", "or", "return", "assert",
                       "yield", "await", "lambda", "with"})
_IMPORT_HAS_EFFECTS = frozenset({"antigravity", "this", "turtle", "tkinter", "idlelib"})  # never imported to look


def only_c_call(file: str, line: int) -> str | None:
    """The function the source line calls, when it calls exactly one and that one is a C
    function of Python's own library under the name written (``pickle.dumps``, ``sorted``):
    a thread sampled holding the GIL on that line with no Python frame below it was inside
    that call (or in the line's own bytecode, which takes nanoseconds). None for anything
    else: a call through a variable or an alias, a library outside the standard one, a line
    with two calls."""
    text = linecache.getline(file, line) if file and line else ""
    code = text.split("#", 1)[0]
    callees = [c for c in re.findall(r"([A-Za-z_][\w.]*)\s*\(", code) if c not in _KEYWORDS]
    if len(callees) != 1 or code.count("(") != 1:
        return None
    parts = callees[0].split(".")
    if len(parts) == 1:
        target = getattr(builtins, parts[0], None)
    elif len(parts) == 2 and parts[0] in sys.stdlib_module_names and parts[0] not in _IMPORT_HAS_EFFECTS:
        try:
            target = getattr(importlib.import_module(parts[0]), parts[1], None)
        except Exception:  # a module this interpreter cannot import names nothing
            return None
    else:
        return None
    return callees[0] if isinstance(target, types.BuiltinFunctionType) else None


def c_function_of(site: CallSite, votes: Counter[tuple[str, str]] | None,
                  foreign: Counter[str] | None = None) -> tuple[str | None, str | None, str | None]:
    """``(python name, C symbol, source)`` of the C function the site held the GIL in: from
    py-spy --native's frames below it, else from native snapshots of its thread while it ran
    (py-spy leaves the interpreter's own functions out: ``sorted``, ``list.sort``). A foreign
    function (a library's, through ctypes) whose call is written on the site's own line
    (``usleep(...)`` in ``intranode_dispatch``) leaves the site's Python function as the name:
    that function is the binding; through an indirection (``self.work()`` of a partial) the
    foreign function is named.

    A snapshot's frames come from scanning its stack for return addresses, so a stale one (a
    ``clock_gettime`` an earlier call left in a slot the foreign call's frames did not
    overwrite) can sit above the function really called. So a library function that the
    site's own line calls and that is below Python in most snapshots (``foreign``) is taken
    before the outermost library frame the votes name.

    When py-spy --native never sampled the site and the snapshots name no C function in half
    of them, the name comes from the site's source line when :func:`only_c_call` finds one
    and no snapshot names another function more often (source :data:`SOURCE_LINE`): a loaded
    host can leave the --native sampler without a sample and the snapshots split between
    the call and the stale frames around it."""
    from glmfb.gil.native import ENTRY_NAMES

    found: tuple[str, str, str] | None = None
    if site.c_calls:
        (name, symbol), count = site.c_calls.most_common(1)[0]
        if count >= 0.5 * max(1, site.split_samples):
            found = (name, symbol, SOURCE_NATIVE)
    if found is None and votes:
        total = sum(votes.values())
        (name, symbol), count = votes.most_common(1)[0]
        if name and count >= 0.5 * total:
            found = (name, symbol, SOURCE_SNAPSHOTS)
        if name == symbol and foreign and not glmfb_file(site.file):  # the votes name a library function
            for called, seen in foreign.most_common():
                if seen >= 0.5 * total and _names_callee(site.file, site.line, called):
                    return None, called, SOURCE_SNAPSHOTS
    if found is None:
        written = None if site.split_samples or glmfb_file(site.file) else only_c_call(site.file, site.line)
        named = Counter({key: n for key, n in (votes or Counter()).items() if key[0]})
        if written is not None and (not named or named.most_common(1)[0][0][0] == written):
            return written, named.most_common(1)[0][0][1] if named else None, SOURCE_LINE
        return None, None, None
    name, symbol, source = found
    library = name == symbol and symbol not in ENTRY_NAMES
    if library and not glmfb_file(site.file) and _names_callee(site.file, site.line, symbol):
        return None, symbol, source
    return name, symbol, source


# The standard library's waits, by file and function: each blocks in a C wait that releases the
# GIL (a lock's acquire, a queue's get, select), so a thread sampled holding the GIL inside one
# was waking from it (it takes the GIL back before it returns) or going into it.
STDLIB_WAITS: dict[str, frozenset[str]] = {
    "threading.py": frozenset({"Condition.wait", "Condition.wait_for", "Event.wait", "Semaphore.acquire",
                               "Barrier.wait", "Thread.join", "Thread._wait_for_tstate_lock"}),
    "queue.py": frozenset({"Queue.get", "Queue.put", "Queue.join"}),
    "concurrent/futures/thread.py": frozenset({"_worker"}),  # a pool thread's loop: the queue's get between jobs
    "concurrent/futures/_base.py": frozenset({"Future.result", "Future.exception", "wait", "as_completed"}),
    "selectors.py": frozenset({"SelectSelector.select", "PollSelector.select", "EpollSelector.select",
                               "DevpollSelector.select", "KqueueSelector.select", "_PollLikeSelector.select"}),
    "subprocess.py": frozenset({"Popen.wait", "Popen._wait", "Popen.communicate", "Popen._communicate"}),
    "multiprocessing/connection.py": frozenset({"wait", "Connection.poll", "Connection._recv", "Connection._poll"}),
    "socket.py": frozenset({"socket.accept", "SocketIO.readinto"}),
}


def is_wait(c_function: str | None) -> bool:
    """Whether a C function is one that releases the GIL while it blocks (``queue.SimpleQueue.get``,
    ``time.sleep``, ``select.select``: :data:`glmfb.gil.native.RELEASING_WAITS`) or the GIL's own
    hand-over: never where a thread holds the GIL, only where it waits."""
    from glmfb.gil.native import HANDOVER, RELEASING_WAITS

    return c_function is not None and (c_function == HANDOVER or c_function in RELEASING_WAITS.values())


def waited_in(site: CallSite, c_function: str | None) -> str | None:
    """The wait a site is, when it is one: its C function releases the GIL while it blocks
    (:func:`is_wait`), or its function is one of the standard library's waits
    (:data:`STDLIB_WAITS`: ``threading.Condition.wait``, the pool's ``_worker`` loop). A thread
    sampled holding the GIL there was waking from the wait; its work is elsewhere. None for
    anything else."""
    if is_wait(c_function):
        return c_function
    if not _is_library(site.file):
        return None
    path = site.file.replace("\\", "/")
    for suffix, functions in STDLIB_WAITS.items():
        if path.endswith("/" + suffix) and site.function in functions:
            module = suffix.removesuffix(".py").replace("/", ".")
            return f"{module}.{site.function}"
    return None


def holder_evidence(site: CallSite, total: int, cls: type[HeldSite] = GilHolder,
                    votes: Counter[tuple[str, str]] | None = None, foreign: Counter[str] | None = None,
                    released: Counter[str] | None = None) -> HeldSite:
    """The site as evidence; ``votes``, ``foreign`` and ``released``: its thread's native
    snapshots (:func:`glmfb.gil.native.snapshot_calls`), counted in it as the why quotes them."""
    native = site.native_calls.most_common(1)
    stack = site.stacks.most_common(1)[0][0] if site.stacks else ()
    known = site.split_samples > 0
    idle_share = site.idle / site.samples if site.samples and known else 0.0
    c_function, c_symbol, c_source = c_function_of(site, votes, foreign)
    return cls(
        wait=waited_in(site, c_function),
        thread=site.thread_name, tid=site.thread_id, function=_short(site.function), qualname=site.function,
        file=display_path(site.file), line=site.line, samples=site.samples,
        share_of_time=round(site.samples / total, 4) if total else None,
        active_share=round(1.0 - idle_share, 4) if known else None,
        idle_share=round(idle_share, 4) if known else None,
        native_frame=native[0][0] if native else None, native_samples=site.split_samples,
        caller=caller_frame(stack), stack=tuple(stack[-8:]),
        c_function=c_function, c_symbol=c_symbol, c_source=c_source, thread_count=site.thread_count,
        c_votes=_c_votes(c_function, c_symbol, c_source, votes, foreign),
        native_votes=sum((votes or Counter()).values()), **released_fields(released),
    )


def released_fields(released: Counter[str] | None) -> dict[str, Any]:
    """A thread's snapshots set aside as waits with the GIL released, as the evidence carries
    them: how many (``released_snapshots``) and the wait most of them found (``released_in``)."""
    return {"released_snapshots": sum((released or Counter()).values()),
            "released_in": released.most_common(1)[0][0] if released else None}


def _c_votes(c_function: str | None, c_symbol: str | None, source: str | None,
             votes: Counter[tuple[str, str]] | None, foreign: Counter[str] | None) -> int:
    """The native snapshots that named the C function (0 when it was not named from them): by
    its Python name, or, for a library function the site's line calls, below Python."""
    if source != SOURCE_SNAPSHOTS:
        return 0
    if c_function is not None:
        return sum(n for (name, _symbol), n in (votes or Counter()).items() if name == c_function)
    return (foreign or Counter()).get(c_symbol or "", 0)


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


def holder_site(profile: HolderProfile | None, min_holder_share: float,
                native_votes: Mapping[int, Counter[tuple[str, str]]], native_foreign: Mapping[int, Counter[str]],
                exclude: frozenset[int] = frozenset()) -> CallSite | None:
    """The thread that held the GIL most (heartbeat and ``exclude`` left out), and its top call
    site; None when no thread held it in ``min_holder_share`` of the samples. A site in glmfb's
    own code (the target runner's loop) is passed over unless it held the GIL inside a C call
    it made for the target (then that call is the cause). So is a wait (:func:`waited_in`: a
    queue's get, a condition's wait, the GIL's hand-over): never chosen over the work the same
    thread holds the GIL in, and a thread seen holding it only in its waits is not the holder."""
    if profile is None or not profile.sites or not profile.sample_instants:
        return None
    candidates = [t for t in profile.threads if not t["excluded"] and t["tid"] not in exclude]
    for thread in candidates:  # ranked by samples
        if thread["samples"] / profile.sample_instants < min_holder_share:
            return None
        votes, foreign = native_votes.get(thread["tid"]), native_foreign.get(thread["tid"])
        for site in (s for s in profile.sites if s.thread_id == thread["tid"]):
            c_function = c_function_of(site, votes, foreign)[0]
            if glmfb_file(site.file) and c_function is None:
                continue
            if waited_in(site, c_function) is None:
                return site
    return None
