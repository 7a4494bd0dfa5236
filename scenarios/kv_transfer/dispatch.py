"""The MoE dispatch stand-in: a native call that waits, with or without the GIL.

DeepEP v1.2.1's ``intranode_dispatch`` held the GIL while it waited for the other ranks
(bug 2 of docs/background.md). Here the wait is libc ``usleep`` called through ctypes: through
``ctypes.PyDLL`` the GIL stays held for the whole call (the bug), through ``ctypes.CDLL`` it is
released around it (the fix). Either way the calling thread is idle inside a native call,
which is what a GIL sampler sees in the real bug.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

DISPATCH_MODES = ("holding", "releasing")


def _libc_usleep(holds_gil: bool) -> Callable[[int], int]:
    name = ctypes.util.find_library("c")
    library = ctypes.PyDLL(name) if holds_gil else ctypes.CDLL(name)
    usleep = library.usleep
    usleep.argtypes = [ctypes.c_uint]
    usleep.restype = ctypes.c_int
    return usleep  # type: ignore[no-any-return]


class NativeDispatch:
    """``intranode_dispatch(wait_us)``: the native wait of one MoE dispatch."""

    def __init__(self, mode: str) -> None:
        if mode not in DISPATCH_MODES:
            raise ValueError(f"dispatch mode {mode!r}: use one of {', '.join(DISPATCH_MODES)}")
        self.mode = mode
        self._usleep = _libc_usleep(holds_gil=mode == "holding")

    def intranode_dispatch(self, wait_us: int) -> None:
        """One dispatch: waits ``wait_us`` microseconds inside a native call."""
        self._usleep(wait_us)  # the GIL is held here in "holding" mode
