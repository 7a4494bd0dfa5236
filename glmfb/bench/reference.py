"""A fixed reference workload, timed in the same process as a kernel measured alone, so that the
kernel's time can also be read in units of the machine's speed at that moment.

On a shared VM a kernel's own time moves between runs by more than a 9% change: over 16 fresh
processes on the 2-core development VM one pure-Python kernel's median read 118-224 µs (cv
16.9%), and a fixed Python workload timed between its samples moved with it (cv 15.7%), so
their ratio scattered by 3.4%. Most of the spread is the machine's speed at the time (other
tenants, the clock, where the process landed), which both take in. ``normalized_time``, the
kernel's time per call divided by the reference's time per call measured interleaved in the
same process, is the series that follows the kernel's own code with that part cancelled out;
``median_time`` stays the kernel's time in seconds. ``benchmarks/reference_ratio.py`` measures
how much each scatters, run to run, for a pure-Python and a torch kernel.

The work is fixed: integer arithmetic, a dict updated and a list sorted, all in the interpreter,
none of it reading the kernel's data. It never changes under the same ``VERSION``, which the
evidence records beside the ratio; and since a new work would move every ``normalized_time``
series by itself, a new version also needs a new series name (the history keys a series by
its definition, metric and machine, not by this version).
"""

from __future__ import annotations

import time
from collections.abc import Callable

VERSION = 1  # the work below; recorded beside every ratio


def work() -> int:
    """One call of the reference: about 25 µs of interpreter work on the development VM."""
    total = 0
    table: dict[int, int] = {}
    for i in range(256):
        total = (total * 31 + i) & 0xFFFFFFFF
        table[i & 63] = total
    ordered = sorted(table.values())
    return total ^ ordered[0] ^ len(ordered)


class Reference:
    """The reference timed in samples of about ``sample_s``: :meth:`sample` gives one sample's
    seconds per call."""

    def __init__(self, sample_s: float, clock: Callable[[], float] = time.perf_counter) -> None:
        from glmfb.bench.allocations import calls_per_sample, per_call_s

        self.clock = clock
        self.calls = calls_per_sample(per_call_s(self._run, sample_s), sample_s)  # as bench calibrates a kernel

    def _run(self, calls: int) -> float:
        began = self.clock()
        for _ in range(calls):
            work()
        return self.clock() - began

    def sample(self) -> float:
        """One sample: seconds per call of the reference."""
        return self._run(self.calls) / self.calls
