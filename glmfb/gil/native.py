"""Native stacks of a traced thread that py-spy does not show: the C function a thread is in.

py-spy ``--native`` drops the frames of the interpreter itself (libpython) except a few
prefixes (``time``, ``sre``, ``PyThread``...), so a thread inside ``sorted`` or ``list.sort``
shows only the Python frame that called it. Here a thread is stopped for a moment (ptrace
``PTRACE_SEIZE`` + ``PTRACE_INTERRUPT``, no signal to the program), its stack pointer and
program counter are read from ``/proc/PID/task/TID/syscall`` (a stopped thread shows
``-1 SP PC`` there, on every architecture), its stack is read from ``/proc/PID/mem``, and the
words on it that are return addresses (they point into executable code of a mapped file,
right after a call instruction) are named from the ELF symbol tables (``.symtab``, else
``.dynsym``) of the files they point into. Scanning finds the callers of the live frames
without unwinding tables; an occasional stale return address left in a frame's slots is
outvoted across snapshots.

:func:`c_call` turns the C frames below the innermost Python frame into the Python name of the
function that was called: ``builtin_sorted`` -> ``sorted``, ``_pickle_dumps`` ->
``pickle.dumps``, ``_sre_SRE_Pattern_match`` -> ``re.Pattern.match``, ``zlib_compress`` ->
``zlib.compress``, ``list_sort_impl`` -> ``list.sort``; a foreign function (libc ``usleep``
through ctypes) keeps its own name. A snapshot that finds a thread blocked with the GIL released
(:func:`released_gil`: in a queue's or a lock's wait, a sleep, a select, or the GIL's own
hand-over) is not where that thread holds the GIL, and names no C function of it.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import ctypes.util
import errno
import os
import platform
import struct
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
WALL = 0x40000000  # __WALL: wait for any child, threads included
WNOHANG = 1
STOP_WAIT_S = 2.0  # a thread waiting for a CPU stops only once it runs
STACK_BYTES = 256 * 1024
EVAL_FRAMES = ("_PyEval_EvalFrameDefault", "PyEval_EvalFrameDefault", "_PyEval_EvalFrame", "PyEval_EvalFrameEx")
_ARCH = platform.machine().lower()


@dataclass(frozen=True)
class Region:
    """An executable mapping of a file in the traced process."""

    start: int
    end: int
    offset: int
    path: str


@dataclass(frozen=True)
class Symbol:
    name: str
    path: str


class _Elf:
    """Function symbols of one ELF file, by virtual address, and its PT_LOAD segments. Only
    the headers and the symbol table are read (libtorch is hundreds of MB); names are read
    from the string table when a symbol is looked up."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd
        self.starts: Any = []  # numpy int64 arrays once parsed
        self.ends: Any = []
        self.name_offsets: Any = []
        self.strtab_offset = 0
        self.loads: list[tuple[int, int, int]] = []  # (offset, vaddr, filesz)
        self._names: dict[int, str] = {}

    def vaddr(self, file_offset: int) -> int | None:
        for offset, vaddr, size in self.loads:
            if offset <= file_offset < offset + size:
                return file_offset - offset + vaddr
        return None

    def name_at(self, vaddr: int) -> str | None:
        if not len(self.starts):
            return None
        import numpy as np

        index = int(np.searchsorted(self.starts, vaddr, side="right")) - 1
        if index < 0 or not int(self.starts[index]) < vaddr <= int(self.ends[index]):
            return None
        if index not in self._names:
            raw = os.pread(self.fd, 512, self.strtab_offset + int(self.name_offsets[index]))
            self._names[index] = raw.split(b"\0", 1)[0].decode("ascii", "replace").split("@", 1)[0]
        return self._names[index]

    def code(self, file_offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, file_offset)


_SYMBOL_FIELDS = [("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"),
                  ("size", "<u8")]
_SYMBOL: Any = None


@lru_cache(maxsize=64)
def _elf(path: str) -> _Elf | None:
    """The function symbols of an ELF64 little-endian file; None when it is not one."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        header = os.pread(fd, 64, 0)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            os.close(fd)
            return None
        phoff, shoff = struct.unpack_from("<QQ", header, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 0x36)
        elf = _Elf(path, fd)
        programs = os.pread(fd, phentsize * phnum, phoff)
        for index in range(phnum):
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
                "<IIQQQQ", programs, index * phentsize)
            if p_type == 1:  # PT_LOAD
                elf.loads.append((p_offset, p_vaddr, p_filesz))
        table = os.pread(fd, shentsize * shnum, shoff)
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
        for wanted in (2, 11):  # SHT_SYMTAB first (static functions too), then SHT_DYNSYM
            chosen = [sec for sec in sections if sec[1] == wanted and sec[9]]
            if not chosen:
                continue
            _n, _t, _f, _a, sh_offset, sh_size, sh_link, _i, _al, _entsize = chosen[0]
            import numpy as np  # a million symbols in libtorch: parsed in tens of ms, not seconds

            global _SYMBOL
            if _SYMBOL is None:
                _SYMBOL = np.dtype(_SYMBOL_FIELDS)

            data = os.pread(fd, sh_size, sh_offset)
            entries = np.frombuffer(data[: len(data) - len(data) % 24], dtype=_SYMBOL)
            keep = entries[((entries["info"] & 0xF) == 2) & (entries["value"] != 0) & (entries["shndx"] != 0)]
            if not len(keep):
                continue
            keep = keep[np.argsort(keep["value"], kind="stable")]
            elf.starts = keep["value"].astype(np.int64)
            elf.ends = elf.starts + np.maximum(keep["size"].astype(np.int64), 1)
            elf.name_offsets = keep["name"].astype(np.int64)
            elf.strtab_offset = sections[sh_link][4]
            break
        return elf
    except (OSError, struct.error, IndexError):
        os.close(fd)
        return None


def executable_regions(pid: int) -> list[Region]:
    regions = []
    try:
        with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as handle:
            for line in handle:
                parts = line.split(maxsplit=5)
                if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
                    continue
                start, end = (int(x, 16) for x in parts[0].split("-"))
                regions.append(Region(start, end, int(parts[2], 16), parts[5].strip()))
    except OSError:
        return []
    return sorted(regions, key=lambda r: r.start)


class _Symbolizer:
    def __init__(self, pid: int) -> None:
        self.regions = executable_regions(pid)
        self.starts = [r.start for r in self.regions]

    def region(self, address: int) -> Region | None:
        index = bisect.bisect_right(self.starts, address) - 1
        if index >= 0 and address < self.regions[index].end:
            return self.regions[index]
        return None

    def symbol(self, address: int) -> Symbol | None:
        region = self.region(address)
        if region is None:
            return None
        elf = _elf(region.path)
        if elf is None:
            return None
        vaddr = elf.vaddr(address - region.start + region.offset)
        name = elf.name_at(vaddr) if vaddr is not None else None
        return Symbol(name, region.path) if name else None

    def follows_call(self, address: int) -> bool:
        """Whether the instruction before ``address`` is a call (so it is a return address)."""
        region = self.region(address)
        if region is None:
            return False
        offset = address - region.start + region.offset
        elf = _elf(region.path)
        if elf is None or offset < 8:
            return False
        try:
            before = elf.code(offset - 8, 8)
        except OSError:
            return False
        if len(before) < 8:
            return False
        if _ARCH in ("x86_64", "amd64"):
            if before[-5] == 0xE8:  # call rel32
                return True
            for length in (2, 3, 4, 6, 7):  # call r/m64: FF /2 with its ModRM (+SIB, disp)
                op = before[-length:]
                if op[0] == 0xFF and (op[1] >> 3) & 7 == 2:
                    return True
                if length >= 3 and op[0] in (0x41, 0x42, 0x43) and op[1] == 0xFF and (op[2] >> 3) & 7 == 2:
                    return True
            return False
        if _ARCH in ("aarch64", "arm64"):
            word = int.from_bytes(before[-4:], "little")
            return word & 0xFC000000 == 0x94000000 or word & 0xFFFFFC1F == 0xD63F0000  # BL, BLR
        return True



def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    return libc


@dataclass(frozen=True)
class NativeStack:
    """One snapshot: the C functions from the leaf outwards (``frames[0]`` is where it was)."""

    tid: int
    frames: tuple[Symbol, ...]
    in_syscall: bool


class NativeSampler:
    """Stops one thread at a time, briefly, to read its native stack (Linux; ptrace allowed)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.error: str | None = None
        self._libc = _libc() if sys.platform.startswith("linux") else None
        if self._libc is None:
            self.error = "no ptrace here (not Linux, or libc not found)"
        self._symbols: _Symbolizer | None = None

    def snapshot(self, tid: int) -> NativeStack | None:
        """The native stack of thread ``tid`` now, or None (thread gone, ptrace refused or busy:
        another tracer such as py-spy holds it)."""
        libc = self._libc
        if libc is None:
            return None
        if libc.ptrace(PTRACE_SEIZE, tid, None, None) != 0:
            code = ctypes.get_errno()
            if code == errno.EPERM and self.error is None:
                self.error = "ptrace refused (or another tracer held the thread)"
            return None
        try:
            if libc.ptrace(PTRACE_INTERRUPT, tid, None, None) != 0:
                return None
            if not self._stopped(tid):
                return None
            registers = self._registers(tid)
            if registers is None:
                return None
            in_syscall, sp, pc = registers
            stack = self._read(sp, STACK_BYTES)
        finally:
            libc.ptrace(PTRACE_DETACH, tid, None, None)
        return self._frames(tid, in_syscall, sp, pc, stack)

    def _stopped(self, tid: int) -> bool:
        """Wait (briefly, never blocking) for the interrupted thread to stop."""
        assert self._libc is not None
        status = ctypes.c_int(0)
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            got = self._libc.waitpid(tid, ctypes.byref(status), WALL | WNOHANG)
            if got == tid:
                return True
            if got < 0:
                return False
            time.sleep(0.0002)
        # Never leave it behind: a thread interrupted but not yet stopped would stay stopped
        # once it stops, with nobody to let it go. Wait for the stop itself.
        return self._libc.waitpid(tid, ctypes.byref(status), WALL) == tid

    def _registers(self, tid: int) -> tuple[bool, int, int] | None:
        try:
            with open(f"/proc/{self.pid}/task/{tid}/syscall", encoding="ascii") as handle:
                fields = handle.read().split()
        except OSError:
            return None
        if len(fields) < 3 or fields[0] == "running":
            return None
        return fields[0] != "-1", int(fields[-2], 16), int(fields[-1], 16)

    def _read(self, address: int, length: int) -> bytes:
        data = b""
        try:
            with open(f"/proc/{self.pid}/mem", "rb", buffering=0) as handle:
                while length > 0:
                    try:
                        handle.seek(address)
                        chunk = handle.read(min(length, 65536))
                    except OSError:
                        break
                    if not chunk:
                        break
                    data += chunk
                    address += len(chunk)
                    length -= len(chunk)
        except OSError:
            return data
        return data

    def _frames(self, tid: int, in_syscall: bool, sp: int, pc: int, stack: bytes) -> NativeStack:
        if self._symbols is None:
            self._symbols = _Symbolizer(self.pid)
        symbols = self._symbols
        frames: list[Symbol] = []
        leaf = symbols.symbol(pc)
        if leaf is not None:
            frames.append(leaf)
        for (word,) in struct.iter_unpack("<Q", stack[: len(stack) - len(stack) % 8]):
            if symbols.region(word) is None or not symbols.follows_call(word):
                continue
            symbol = symbols.symbol(word - 1)
            if symbol is None:
                continue
            if frames and frames[-1] == symbol:
                continue
            frames.append(symbol)
            if symbol.name in EVAL_FRAMES:
                break
        return NativeStack(tid, tuple(frames), in_syscall)


# CPython's C functions that release the GIL while they block (Py_BEGIN_ALLOW_THREADS around the
# wait), with the name a why gives the wait: a queue's get, a lock's acquire (Lock, Condition.wait,
# Event.wait, queue.Queue.get and Thread.join all wait in one), time.sleep, select and poll, a
# socket's or a file's wait. Stopped below one of them, a thread is not holding the GIL.
RELEASING_WAITS = {
    "_queue_SimpleQueue_get_impl": "queue.SimpleQueue.get", "_queue_SimpleQueue_get": "queue.SimpleQueue.get",
    "lock_PyThread_acquire_lock": "_thread.lock.acquire", "rlock_acquire": "_thread.RLock.acquire",
    "acquire_timed": "_thread.lock.acquire", "time_sleep": "time.sleep", "pysleep": "time.sleep",
    "select_select_impl": "select.select", "select_poll_poll_impl": "select.poll.poll",
    "select_epoll_poll_impl": "select.epoll.poll", "select_devpoll_poll_impl": "select.devpoll.poll",
    "sock_call_ex": "a socket's wait", "sock_recv_impl": "a socket's wait", "sock_recv_into_impl": "a socket's wait",
    "sock_recvfrom_impl": "a socket's wait", "sock_accept_impl": "a socket's wait",
    "sock_connect_impl": "a socket's wait", "sock_send_impl": "a socket's wait",
    "_Py_read": "a read", "_Py_write": "a write", "os_waitpid_impl": "os.waitpid", "os_wait_impl": "os.wait",
    "os_wait4_impl": "os.wait4", "os_waitid_impl": "os.waitid",
}
# The GIL's own hand-over: a thread stopped inside one of these is waiting for the GIL (take_gil)
# or letting it go (drop_gil), not holding it.
GIL_HANDOVER = frozenset({"take_gil", "drop_gil", "PyEval_RestoreThread", "PyEval_SaveThread",
                          "PyEval_AcquireThread", "PyEval_ReleaseThread", "PyGILState_Ensure"})
HANDOVER = "the GIL's hand-over"
# The blocking primitives a wait ends in (the C library's, and CPython's lock under its waits).
_BLOCKING_LIBRARIES = ("libc.so", "libc-", "libpthread", "ld-linux")


def _blocking_primitive(frame: Symbol) -> bool:
    return (os.path.basename(frame.path).startswith(_BLOCKING_LIBRARIES) or frame.name.startswith("PyThread_")
            or "futex" in frame.name)


def released_gil(stack: NativeStack) -> str | None:
    """What a snapshot shows a thread blocked in with the GIL released: a wait of
    :data:`RELEASING_WAITS` (``queue.SimpleQueue.get``) or the GIL's hand-over (:data:`HANDOVER`:
    waiting for it in ``take_gil``, letting it go in ``drop_gil``); None for a thread that was
    running, or blocked in anything else (a native call that keeps the GIL: ``usleep`` through
    ``ctypes.PyDLL`` stays its holder's).

    Read from the leaf outwards past the blocking primitive (libc's futex, sleep or poll, and
    CPython's ``PyThread_acquire_lock_timed``): the first frame beyond it decides, so a stale
    return address further out cannot. The snapshots are of threads the last /proc tick saw
    running; a pool thread that finished its job in between is found back in its queue's get,
    one just woken from it waiting in ``take_gil``. Neither says where the thread holds the GIL."""
    if not stack.in_syscall:
        return None
    for frame in stack.frames:  # the leaf first
        if _blocking_primitive(frame):
            continue
        if frame.name in GIL_HANDOVER:
            return HANDOVER
        return RELEASING_WAITS.get(frame.name)
    return None


def below_python(stack: NativeStack) -> tuple[Symbol, ...]:
    """The C frames from the innermost Python frame's eval loop to the leaf, outermost first;
    empty when the snapshot reached no eval frame (the thread was not below Python code)."""
    names = [frame.name for frame in stack.frames]
    for index, name in enumerate(names):
        if name in EVAL_FRAMES:
            return tuple(reversed(stack.frames[:index]))
    return ()


# ---- naming ----------------------------------------------------------------------------------

# Frames of the call machinery between the eval loop and the function called.
_PLUMBING = ("PyObject_", "_PyObject_", "PyVectorcall", "_PyVectorcall", "cfunction_", "method_vectorcall",
             "vectorcall_", "_PyFunction_", "partial_", "slot_tp_call", "_PyEval_Vector", "PyCFunction_",
             "_PyCFunction", "call_function", "object_vacall", "_ctypes", "PyCFuncPtr", "ffi_", "_call_function_pointer",
             "method_vectorcall_", "wrapperdescr_", "wrapper_call", "_Py_", "Py_")
_PLUMBING_EXACT = frozenset({"do_call_core", "PyCFuncPtr_call", "_ctypes_callproc"})
# C types whose Python names their C names do not give.
TYPE_NAMES = {"SRE_Pattern": "re.Pattern", "SRE_Match": "re.Match", "SRE_Scanner": "re.Scanner",
              "unicode": "str", "long": "int", "PyBytes": "bytes"}
BUILTIN_TYPES = ("list", "dict", "set", "frozenset", "tuple", "bytes", "bytearray", "unicode", "float",
                 "long", "deque", "str")
# C modules whose public Python module has another name.
PUBLIC_MODULES = {"_sre": "re", "_io": "io", "_socket": "socket", "posix": "os", "_thread": "threading"}
# C entry points of stdlib objects whose Python name is not in their symbol.
ENTRY_NAMES = {"encoder_call": "json.encoder.c_make_encoder", "scanner_call": "json.scanner.c_make_scanner"}


# The call machinery's frames that call a C function's own code (a builtin function, a method
# descriptor, a slot wrapper, a type's tp_call): what follows one is the function called.
_DISPATCH = ("cfunction_", "method_vectorcall", "wrapperdescr_", "wrapper_call", "_PyObject_MakeTpCall",
             "PyCFunction_Call", "_PyCFunction")


def is_dispatch(name: str) -> bool:
    return name.startswith(_DISPATCH)


def is_plumbing(name: str) -> bool:
    return name in _PLUMBING_EXACT or name.startswith(_PLUMBING) or name.startswith("0x")


def _module_of(path: str) -> str | None:
    base = os.path.basename(path)
    if not base or base.startswith("libpython"):
        return None
    return base.split(".", 1)[0]


@lru_cache(maxsize=1)
def known_modules() -> tuple[str, ...]:
    """The C modules of this interpreter: built in, and in the standard library's lib-dynload
    (longest first, so ``_sha256`` is tried before ``_sha``)."""
    names = set(sys.builtin_module_names)
    dynload = os.path.join(os.path.dirname(os.__file__), "lib-dynload")  # the base install's, not a venv's
    with contextlib.suppress(OSError):
        names.update(entry.split(".", 1)[0] for entry in os.listdir(dynload))
    return tuple(sorted(names, key=len, reverse=True))


def demangle(name: str) -> str:
    """``_ZN5torch8autogradL18THPVariable_linearEP7_objectS2_S2_`` ->
    ``torch::autograd::THPVariable_linear``: the nested name of an Itanium C++ symbol (no
    templates or arguments); the symbol itself when it is not that simple."""
    if not name.startswith("_Z"):
        return name
    text, index, parts = name[2:], 0, []
    nested = text.startswith("N")
    index = 1 if nested else 0
    while index < len(text):
        if text[index] in "LK":
            index += 1
            continue
        digits = ""
        while index < len(text) and text[index].isdigit():
            digits += text[index]
            index += 1
        if not digits:
            break
        length = int(digits)
        parts.append(text[index:index + length])
        index += length
        if not nested:
            break
    return "::".join(parts) if parts and all(parts) else name


def python_name(symbol: Symbol) -> str:
    """The Python name of a C function, by CPython's naming conventions (Argument Clinic's
    ``module_function`` / ``module_Type_method``, ``builtin_name``, ``type_method``); the
    symbol itself when none applies."""
    if symbol.name in ENTRY_NAMES:
        return ENTRY_NAMES[symbol.name]
    if symbol.name.startswith("_Z"):
        return demangle(symbol.name)
    name = symbol.name.removesuffix("_impl")
    if name.startswith("stringlib_"):  # the templated bodies of str/bytes methods (bytes.join's)
        name = name.removeprefix("stringlib_")
    if name.startswith("builtin_") and len(name) > len("builtin_"):
        return name.removeprefix("builtin_")
    module = _module_of(symbol.path)
    base = os.path.basename(symbol.path)
    shared_object = ".so" in base and not base.startswith("libpython")
    # A library's symbol is named after its own module only (libc's posix_memalign is not os.memalign).
    candidates = [module] if shared_object and module else (
        ([module] if module else []) + [m for m in known_modules() if m != module])
    for prefix in candidates:
        if name.startswith(prefix + "_") and len(name) > len(prefix) + 1:
            rest = name[len(prefix) + 1:]
            public = PUBLIC_MODULES.get(prefix, prefix.lstrip("_"))
            for type_name, shown in TYPE_NAMES.items():
                if rest.startswith(type_name + "_"):
                    return f"{shown}.{rest[len(type_name) + 1:]}"
            head, _, tail = rest.partition("_")
            if head[:1].isupper() and tail:
                return f"{public}.{head}.{tail}"
            return f"{public}.{rest}"
    if module is None or not _foreign(symbol):
        for type_name in BUILTIN_TYPES:
            if name.startswith(type_name + "_") and len(name) > len(type_name) + 1:
                return f"{TYPE_NAMES.get(type_name, type_name)}.{name[len(type_name) + 1:]}"
    return symbol.name


def _foreign(symbol: Symbol) -> bool:
    """A function outside the interpreter and the call machinery: an extension module's or a
    library's (libc ``usleep``, zlib's ``deflate``)."""
    base = os.path.basename(symbol.path)
    return not base.startswith(("libpython", "python", "libffi"))


def foreign_calls(frames: tuple[Symbol, ...]) -> set[str]:
    """The library functions (outside the interpreter and the call machinery) among the
    frames below Python, each once."""
    return {frame.name for frame in frames if not is_plumbing(frame.name) and _foreign(frame)}


def c_call(frames: tuple[Symbol, ...]) -> str | None:
    """The Python name of the C function called from Python; see :func:`c_call_symbol`."""
    found = c_call_symbol(frames)
    return found[0] if found else None


def c_call_symbol(frames: tuple[Symbol, ...]) -> tuple[str, str] | None:
    """``(python name, C symbol)`` of the C function called from Python (``frames`` outermost
    first): the outermost frame below the eval loop that has a Python name by CPython's
    conventions (``builtin_sorted`` before the ``list_sort_impl`` it calls); else, for a
    library's function reached without one (libc ``usleep`` through ctypes), the outermost
    frame outside the interpreter and the call machinery. Interpreter internals without a
    Python name (``take_gil``, ``PyDict_GetItem``: often a stale return address a frame left
    on the stack) are passed over, and so is a stale library frame beside a named one. A named
    frame that a dispatch frame (``cfunction_vectorcall_O``, ``method_vectorcall_*``, a type's
    tp_call) calls comes before one that none does (a stale ``time_sleep`` left by the last
    ``time.sleep`` above the ``bytes.join`` running now)."""
    def named(frame: Symbol) -> str | None:
        name = python_name(frame)
        return name if name != frame.name and not frame.name.startswith("_Z") else None

    # First the outermost named frame that a dispatch frame calls (unnamed frames between are
    # stale slots): a stale frame an earlier call left on the stack, such as the time_sleep of
    # the loop's last time.sleep above the bytes.join running now, follows no dispatch frame.
    after_dispatch = False
    for frame in frames:
        if is_dispatch(frame.name):
            after_dispatch = True
        elif after_dispatch and not is_plumbing(frame.name) and (name := named(frame)):
            return name, frame.name
    candidates = [frame for frame in frames if not is_plumbing(frame.name)]
    for frame in candidates:
        if name := named(frame):
            return name, frame.name
    for frame in candidates:
        if _foreign(frame):
            return python_name(frame), frame.name
    return None


# ---- data objects --------------------------------------------------------------------------


def _object_symbol(path: str, name: str) -> tuple[int, int, list[tuple[int, int, int]]] | None:
    """``(value, size, PT_LOAD segments as (offset, vaddr, filesz))`` of the data object
    ``name`` in ELF64 little-endian file ``path`` (``.dynsym`` first: an exported object is
    there even in a stripped file; then ``.symtab``), or None."""
    wanted = name.encode("ascii")
    try:
        with open(path, "rb") as handle:
            header = handle.read(64)
            if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
                return None
            phoff, shoff = struct.unpack_from("<QQ", header, 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 0x36)
            handle.seek(phoff)
            programs = handle.read(phentsize * phnum)
            loads = []
            for index in range(phnum):
                p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
                    "<IIQQQQ", programs, index * phentsize)
                if p_type == 1:  # PT_LOAD
                    loads.append((p_offset, p_vaddr, p_filesz))
            handle.seek(shoff)
            table = handle.read(shentsize * shnum)
            sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
            for kind in (11, 2):  # SHT_DYNSYM, then SHT_SYMTAB
                for section in sections:
                    if section[1] != kind or not section[5]:
                        continue
                    strtab = sections[section[6]]
                    handle.seek(strtab[4])
                    strings = handle.read(strtab[5])
                    at = strings.find(b"\0" + wanted + b"\0")
                    if at < 0:
                        continue
                    handle.seek(section[4])
                    symbols = handle.read(section[5])
                    for offset in range(0, len(symbols) - 23, 24):
                        st_name, info, _other, shndx, value, size = struct.unpack_from("<IBBHQQ", symbols, offset)
                        if st_name == at + 1 and (info & 0xF) == 1 and shndx != 0 and value:  # STT_OBJECT
                            return value, size, loads
    except (OSError, struct.error, IndexError):
        return None
    return None


def find_object(pid: int, name: str, files: tuple[str, ...] = ("python", "libpython")) -> tuple[int, int, str] | None:
    """Where the data object ``name`` (``_PyRuntime``) lies in process ``pid``: ``(start, end,
    path)`` from the symbol tables of the mapped files whose names start with one of ``files``
    (the interpreter's executable, libpython), or None (not CPython, no /proc, symbol stripped)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as handle:
            lines = handle.readlines()
    except OSError:
        return None
    first: dict[str, tuple[int, int]] = {}  # path -> (start, file offset) of its lowest mapping
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].strip()
        if not os.path.basename(path).startswith(files) or path in first:
            continue
        first[path] = (int(parts[0].split("-")[0], 16), int(parts[2], 16))
    for path, (start, file_offset) in first.items():
        found = _object_symbol(f"/proc/{pid}/root{path}" if os.path.exists(f"/proc/{pid}/root{path}") else path,
                               name)
        if found is None:
            continue
        value, size, loads = found
        segment = next(((o, v) for o, v, n in loads if o <= file_offset < o + max(n, 1)), None)
        if segment is None:
            continue
        base = start - (file_offset - segment[0] + segment[1])  # the load bias
        return base + value, base + value + max(size, 1), path
    return None


# ---- what the snapshots say per thread ------------------------------------------------------


@dataclass
class SnapshotCalls:
    """Per thread, what its native snapshots show: ``votes``, the C call below Python of each
    snapshot in which it could hold the GIL (``(name, symbol)``, ``("", "")`` for none named);
    ``foreign``, the library functions below Python in those; ``released``, the snapshots that
    found it blocked with the GIL released (:func:`released_gil`), by what it waited in. Those
    are no vote: the C function a thread waits in is not where it holds the GIL."""

    votes: dict[int, Counter[tuple[str, str]]] = field(default_factory=dict)
    foreign: dict[int, Counter[str]] = field(default_factory=dict)
    released: dict[int, Counter[str]] = field(default_factory=dict)


def snapshot_calls(stacks: Iterable[NativeStack]) -> SnapshotCalls:
    """The votes, library functions and released-GIL waits of ``stacks`` per thread."""
    calls = SnapshotCalls()
    for stack in stacks:
        waited = released_gil(stack)
        if waited is not None:
            calls.released.setdefault(stack.tid, Counter())[waited] += 1
            continue
        frames = below_python(stack)
        call = c_call_symbol(frames)
        calls.votes.setdefault(stack.tid, Counter())[call or ("", "")] += 1
        calls.foreign.setdefault(stack.tid, Counter()).update(foreign_calls(frames))
    return calls
