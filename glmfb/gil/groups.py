"""Threads that come and go, taken as one: a sender started for each iteration (or layer) and
joined at its end is a new thread each time, with its own id. Counted thread by thread, 40
one-iteration senders hold the GIL 2% of the time each and none is "the holder"; taken as one,
they held it 80% of the time in ``pickle.dumps``.

A thread is *short-lived* when the sampled window did not see it from its first tick to its
last (it started or ended inside the window, or lived between two ticks). Short-lived threads
whose names agree once their numbers are left out (``Thread-12 (_send_loop)`` and ``Thread-13
(_send_loop)``: Python's default name carries the target function; ``kv-sender-3`` and
``kv-sender-4``) form a group, named with ``N`` for the numbers (``Thread-N (_send_loop)``).
Threads that lived through the whole window keep their own rows, even when their names agree
(a pool's long-lived workers are told apart). A thread without a name (seen only by its id:
not a Python thread) is never grouped.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

_NUMBER = re.compile(r"\d+")
_UNNAMED = re.compile(r"^thread \d+$")

K = TypeVar("K")


def group_key(name: str | None) -> str | None:
    """The name with its numbers written ``N``; None for a thread known only by its id."""
    if not name or _UNNAMED.match(name):
        return None
    return _NUMBER.sub("N", name)


@dataclass(frozen=True)
class ThreadGroups:
    """Groups of short-lived threads: each group stands under its first member's id."""

    members: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # representative -> tids
    names: Mapping[int, str] = field(default_factory=dict)  # representative -> the group's name
    _of: Mapping[int, int] = field(default_factory=dict)  # tid -> its representative

    def of(self, tid: int) -> int:
        """The id a thread is counted under (its group's, or its own)."""
        return self._of.get(tid, tid)

    def count(self, tid: int) -> int:
        """How many threads the id ``tid`` stands for."""
        return len(self.members.get(tid, ())) or 1

    def tids(self, tid: int) -> tuple[int, ...]:
        return self.members.get(tid) or (tid,)

    def merge(self, per_tid: Mapping[int, Counter[K]]) -> dict[int, Counter[K]]:
        """Per-thread counters added up per group."""
        merged: dict[int, Counter[K]] = {}
        for tid, counter in per_tid.items():
            merged.setdefault(self.of(tid), Counter()).update(counter)
        return merged

    def __bool__(self) -> bool:
        return bool(self.members)


def thread_groups(names: Mapping[int, str], tids: Iterable[int], short_lived: Iterable[int],
                  exclude: Iterable[int] = ()) -> ThreadGroups:
    """Group the ``short_lived`` threads among ``tids`` whose names agree but for their numbers
    (two at least to a group); ``exclude`` (glmfb's own threads) never joins one."""
    transient = set(short_lived) - set(exclude)
    by_key: dict[str, list[int]] = {}
    for tid in sorted(set(tids) & transient):
        key = group_key(names.get(tid))
        if key is not None:
            by_key.setdefault(key, []).append(tid)
    members: dict[int, tuple[int, ...]] = {}
    group_names: dict[int, str] = {}
    of: dict[int, int] = {}
    for key, group in by_key.items():
        if len(group) < 2:
            continue
        representative = group[0]
        members[representative] = tuple(group)
        spelled = {names[t] for t in group}
        group_names[representative] = spelled.pop() if len(spelled) == 1 else key
        of.update({tid: representative for tid in group})
    return ThreadGroups(members, group_names, of)


UNNAMED = "thread "  # how a thread without a name is labelled: ``thread <tid>``


def unnamed(tid: int) -> str:
    """The label of a thread whose name is unknown."""
    return f"{UNNAMED}{tid}"


def describe(thread: str, count: int) -> str:
    """``thread X``, or ``41 short-lived threads X`` for a group (taken as one). An unnamed
    thread is already labelled ``thread <tid>`` (:data:`UNNAMED`), and Python's default names say
    ``Thread-3 (target)``: not ``thread thread <tid>``, nor ``thread Thread-3``."""
    if count <= 1:
        return thread if thread.lower().startswith(UNNAMED.strip()) else f"{UNNAMED}{thread}"
    return f"{count} short-lived threads {thread} (taken as one)"
