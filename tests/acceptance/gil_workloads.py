"""Standard-library and extension C calls that keep or release the GIL: the gil (command) targets
of the acceptance corpus.

``make(work, size, pause_ms, main)`` (a gil target) starts one named worker thread that calls
the C function under test in a loop (with a short pause between calls) and returns the main
thread's step: a 1 ms periodic service loop (``main="serve"``) or torch matmuls back to back
(``main="decode"``: it needs the GIL between ops, thousands of times a second). The C functions are CPython's and libc's: ``re.Pattern.match`` on a
pattern that backtracks exponentially, ``sorted`` of a large list, ``pickle.dumps`` of a large
object (all keep the GIL for the whole call), ``zlib.compress`` and ``hashlib.sha256`` on large
buffers (they release it), libc ``usleep`` through ``ctypes.PyDLL`` (keeps it) or
``ctypes.CDLL`` (releases it); ``json.dumps`` and ``math.factorial`` (keep it), ``bz2.compress``
and an SQLite query (release it). ``--size`` picks how much work one call does; the small sizes
are the clean twins.

``pool(work, size, jobs, main)`` (a gil target) ships the work to a ``ThreadPoolExecutor``
instead, as code that serializes or sorts off its main loop does: each step of the main thread
submits ``jobs`` calls to the pool's two reused threads (``pool-worker_0``, ``pool-worker_1``),
runs its own loop, and waits for them; between jobs the pool's threads wait on the executor's
queue (``queue.SimpleQueue.get``, the GIL released). ``work="sort"`` holds the GIL in
``sorted`` (a builtin py-spy --native cannot show), ``work="sleep"`` only waits (``time.sleep``,
the clean twin).
"""

from __future__ import annotations

import bz2
import ctypes
import ctypes.util
import hashlib
import json
import math
import pickle
import random
import re
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

Work = Callable[[], object]


def regex_work(size: int) -> Work:
    """``(a+)+$`` against ``'a' * size + 'b'``: about 2**size steps, all inside one C call."""
    pattern = re.compile(r"(a+)+$")
    text = "a" * size + "b"
    return partial(pattern.match, text)


def sort_work(size: int) -> Work:
    """``sorted`` of ``size`` random floats (``sorted`` copies the list: every call sorts anew)."""
    rng = random.Random(0)
    data = [rng.random() for _ in range(size)]
    return partial(sorted, data)


def pickle_work(size: int) -> Work:
    """``pickle.dumps`` of ``size`` small dicts (page metadata, say)."""
    pages = [{"layer": i % 32, "offset": i * 4096, "tokens": list(range(i % 7, i % 7 + 8)),
              "id": f"page-{i}"} for i in range(size)]
    return partial(pickle.dumps, pages, pickle.HIGHEST_PROTOCOL)


def zlib_work(size: int) -> Work:
    """``zlib.compress`` of ``size`` KiB of random bytes (releases the GIL)."""
    data = random.Random(0).randbytes(size * 1024)
    return partial(zlib.compress, data, 6)


def hashlib_work(size: int) -> Work:
    """``hashlib.sha256`` of ``size`` MiB (releases the GIL for buffers over 2 KiB)."""
    data = bytes(size * 1024 * 1024)
    return partial(hashlib.sha256, data)


def _usleep(library: type[ctypes.CDLL], size: int) -> Work:
    libc = library(ctypes.util.find_library("c") or "libc.so.6")
    usleep = libc.usleep
    usleep.argtypes = [ctypes.c_uint]
    return partial(usleep, size * 1000)


def pydll_work(size: int) -> Work:
    """libc ``usleep(size ms)`` through ``ctypes.PyDLL``: the GIL stays held while it blocks."""
    return _usleep(ctypes.PyDLL, size)


def cdll_work(size: int) -> Work:
    """libc ``usleep(size ms)`` through ``ctypes.CDLL``: ctypes releases the GIL around it."""
    return _usleep(ctypes.CDLL, size)


def json_work(size: int) -> Work:
    """``json.dumps`` of ``size`` page records: the C encoder keeps the GIL for the whole call."""
    doc = {"pages": [{"id": i, "tokens": list(range(8)), "name": f"p{i}"} for i in range(size)]}
    return partial(json.dumps, doc)


def factorial_work(size: int) -> Work:
    """``math.factorial(size)``: big-integer multiplication in one C call, the GIL held."""
    return partial(math.factorial, size)


def bz2_work(size: int) -> Work:
    """``bz2.compress`` of ``size`` KiB (releases the GIL while it compresses)."""
    return partial(bz2.compress, bytes(range(256)) * (size * 4), 9)


def sqlite_work(size: int) -> Work:
    """A recursive query counting to ``size`` in an in-memory SQLite database: the sqlite3
    module releases the GIL while SQLite steps the statement."""
    connection = sqlite3.connect(":memory:", check_same_thread=False)
    query = f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {size}) SELECT sum(x) FROM c"
    return lambda: connection.execute(query).fetchone()


WORKS: dict[str, tuple[Callable[[int], Work], str]] = {
    "json": (json_work, "encoder"),
    "factorial": (factorial_work, "math-worker"),
    "bz2": (bz2_work, "compressor"),
    "sqlite": (sqlite_work, "db-worker"),
    "regex": (regex_work, "regex-worker"),
    "sort": (sort_work, "sorter"),
    "pickle": (pickle_work, "serializer"),
    "zlib": (zlib_work, "compressor"),
    "hashlib": (hashlib_work, "hasher"),
    "pydll": (pydll_work, "native-call"),
    "cdll": (cdll_work, "native-call"),
}


class Worker:
    """The named worker thread: calls ``work`` in a loop, pausing ``pause_ms`` between calls."""

    def __init__(self, work: Work, name: str, pause_ms: float) -> None:
        self.work = work
        self.pause_s = pause_ms / 1000
        self.calls = 0
        self.thread = threading.Thread(target=self.loop, name=name, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while True:
            self.work()
            self.calls += 1
            time.sleep(self.pause_s)


def serve_step() -> None:
    """One step of a periodic service loop: wait a millisecond, then a little Python work."""
    time.sleep(0.001)
    sum(i * i for i in range(200))


def decode_steps(steps: int = 200) -> Callable[[], None]:
    """Torch matmuls back to back, as a decode loop runs them: each op releases the GIL, and
    the thread needs it back between ops (thousands of times a second)."""
    import torch

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(192, 192, generator=generator) / 192**0.5
    state = [torch.randn(192, 192, generator=generator)]

    def run() -> None:
        x = state[0]
        for _ in range(steps):
            x = torch.tanh(x @ weight)
        state[0] = x

    return run


def make(work: str, size: int, pause_ms: float = 10.0, main: str = "serve") -> Callable[[], None]:
    """gil target: start the worker thread calling ``work`` (see :data:`WORKS`) with ``size``,
    and return the main thread's step: ``serve`` (a 1 ms periodic loop) or ``decode`` (torch
    matmuls back to back)."""
    if work not in WORKS:
        raise ValueError(f"work {work!r}: use one of {', '.join(sorted(WORKS))}")
    if main not in ("serve", "decode"):
        raise ValueError(f"main {main!r}: use 'serve' or 'decode'")
    step = serve_step if main == "serve" else decode_steps()
    build, name = WORKS[work]
    Worker(build(size), name, pause_ms)
    return step


POOL_WORKERS = 2
POOL_PREFIX = "pool-worker"  # the pool's threads: pool-worker_0, pool-worker_1
POOL_WORKS: dict[str, Callable[[int], Work]] = {
    "sort": sort_work,  # holds the GIL in sorted
    "pickle": pickle_work,  # holds it in pickle.dumps
    "sleep": lambda size: partial(time.sleep, size / 1e6),  # waits size microseconds, the GIL released
}


def pool_job(work: Work) -> object:
    """One job a pool thread runs: the call, from code of the target's own (a serializer's
    ``serialize(batch)``), not from the executor's ``_WorkItem.run``."""
    return work()


def pool(work: str, size: int, jobs: int = 8, main: str = "decode") -> Callable[[], None]:
    """gil target: each step submits ``jobs`` calls of ``work`` (see :data:`POOL_WORKS`) with
    ``size`` to a two-thread pool, runs the main thread's step (``serve`` or ``decode``, as
    :func:`make`), and waits for the jobs; the pool's threads wait on its queue in between."""
    if work not in POOL_WORKS:
        raise ValueError(f"work {work!r}: use one of {', '.join(sorted(POOL_WORKS))}")
    if main not in ("serve", "decode"):
        raise ValueError(f"main {main!r}: use 'serve' or 'decode'")
    call = POOL_WORKS[work](size)
    step = serve_step if main == "serve" else decode_steps()
    executor = ThreadPoolExecutor(POOL_WORKERS, thread_name_prefix=POOL_PREFIX)
    for started in [executor.submit(time.sleep, 0.01) for _ in range(POOL_WORKERS)]:
        started.result()  # both threads started (named) before the first step

    def run() -> None:
        pending = [executor.submit(pool_job, call) for _ in range(jobs)]
        step()
        for job in pending:
            job.result()

    return run


class FileExporter:
    """A metrics exporter as services run one beside their request loop: a thread of its own
    (``exporter``) that writes the service's state as JSON to a file once every ``interval_s``.
    ``export`` serializes the whole state with ``json.dumps`` (the C encoder keeps the GIL for the
    whole call) before it writes."""

    def __init__(self, state: dict[str, object], path: str, interval_s: float = 1.0) -> None:
        self.state = state
        self.path = path
        self.interval_s = interval_s
        self.exports = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="exporter", daemon=True)
        self.thread.start()

    def export(self) -> None:
        payload = json.dumps(self.state)
        with open(self.path, "w", encoding="utf-8") as out:
            out.write(payload)
        self.exports += 1

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            self.export()


def exporter(requests: int, interval_s: float = 1.0, main: str = "serve") -> Callable[[], None]:
    """gil target: a :class:`FileExporter` of a state holding ``requests`` request records,
    exporting once every ``interval_s`` to ``os.devnull``, beside the main thread's step (as
    :func:`make`). A large state keeps the GIL for a long time once a second; a small one, the
    clean twin, for well under a millisecond."""
    import os

    if main not in ("serve", "decode"):
        raise ValueError(f"main {main!r}: use 'serve' or 'decode'")
    state: dict[str, object] = {"requests": [{"id": i, "tokens": list(range(8)), "route": f"r{i % 7}"}
                                             for i in range(requests)]}
    FileExporter(state, os.devnull, interval_s)
    return serve_step if main == "serve" else decode_steps()
