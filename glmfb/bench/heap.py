"""The C heap a CPU comparison runs on: glibc's malloc pinned so that a kernel's temporaries
stop costing page faults that depend on the harness's own allocations.

torch allocates a CPU tensor with ``posix_memalign``. glibc serves a block of 128 KiB or more
with ``mmap`` (every call's temporaries then fault their pages in again) until a freed mmapped
block raises that threshold, and it gives free memory at the top of the heap back to the kernel
(``brk``/``madvise``) once it exceeds the trim threshold (twice the mmap threshold), to fault it
in again on the next call. Which of a kernel's temporaries pay that depends on the heap's state:
on the holes the live input sets of glmfb's allocations leave, on the thresholds the other
side's larger temporaries raised. On the 2-core development VM (AMD EPYC, 4 KiB pages) a page
fault costs about 0.8 µs, and a gated RMS norm on 64x4096 float32 (four temporaries of 1 MiB a
call) took 0.64 ms with no fault and 1.4 ms with 992 a call: one allocation of a side faulted
on every call and the next on none; a candidate on 1.5x the rows read +153% [+89, +237] where
a plain loop read +57% (docs/bench.md, "The size of a slowdown"; issue 53: twice the rows read
+277%).

:func:`pin_heap` sets ``M_TRIM_THRESHOLD`` to -1 (never trim) and ``M_MMAP_THRESHOLD`` to its
largest value, 32 MiB: after warm-up a temporary below 32 MiB reuses heap memory on both sides,
as it does in a long-running process; larger ones are mmapped on every call on both sides. It
lasts for the rest of the process (a probe runs in a child process of its own). Another
allocator (jemalloc, tcmalloc preloaded) or another C library is left as it is, and the
evidence says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's largest on 64-bit (4 MiB * sizeof(long))


@functools.cache
def pin_heap() -> str:
    """Pin glibc's trim and mmap thresholds (once per process); what was done, in words."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return "left as is (not glibc's malloc)"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    version.restype = ctypes.c_char_p
    if mallopt(M_TRIM_THRESHOLD, -1) != 1 or mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) != 1:
        return "left as is (mallopt refused)"
    return (f"glibc {version().decode()} malloc pinned: no trimming, blocks below 32 MiB from the heap "
            "(temporaries reuse memory instead of faulting pages in on some calls)")
