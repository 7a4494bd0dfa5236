"""Why one kernel is slower: a torch.profiler pass of each side and the operator diff.

Each side runs a few calls under ``torch.profiler`` with ``record_shapes=True``; per operator
*and per set of inputs* (shapes, strides, dtypes, scalar arguments) we keep calls and self time
*per kernel call*, the bytes its tensor inputs span and, for a copy, the bytes it writes. The
diff ranks operators by how much of the added (or saved) time they account for, names the
operators only one side runs and the share of the added time they carry, and keys the calls
by operator and inputs so that the same call made k times as often shows as such. The rules
in :mod:`glmfb.bench.rules` read it.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from glmfb.bench.evidence import CallerRow, InputRow, OpDiff, OpRow, OpSite
from glmfb.bench.timers import Kernel

# Operators that reduce along a dimension: repeating them is the signature of recomputation.
REDUCTION_PATTERN = re.compile(
    r"(mean|sum|norm|var|std|amax|amin|max|min|softmax|logsumexp|prod|argmax|argmin|cumsum|"
    r"reduce|all_reduce|topk|sort)",
    re.IGNORECASE,
)
# Views and metadata operators: they move no data (a slice, a transpose, a reshape).
VIEW_PATTERN = re.compile(
    r"::(view|view_as|_unsafe_view|reshape|reshape_as|_reshape_alias|as_strided|transpose|swapaxes|t|permute|"
    r"movedim|expand|expand_as|broadcast_tensors|unsqueeze|squeeze|slice|select|narrow|diagonal|unfold|flatten|"
    r"unflatten|split\w*|_unsafe_split\w*|chunk|unbind|detach|alias|lift_fresh|conj|_conj|resolve_conj|"
    r"resolve_neg|view_as_real|view_as_complex|real|imag|result_type)$"
)
# Operators that only move or allocate data (copies, layout changes, allocations, and the views
# above): they compute nothing, so a rule never calls one of them a fused operator.
MOVEMENT_PATTERN = re.compile(
    r"::(copy_|_copy_from\w*|clone|contiguous|_to_copy|to|repeat\w*|cat|stack|\w+_copy|constant_pad_nd|pad|"
    r"empty\w*|zeros\w*|fill_|zero_|resize_|item|_local_scalar_dense)$"
)
# The operators that write a new tensor from existing data (the leaves of .contiguous(),
# .clone(), .repeat(), .to(dtype), F.pad, torch.cat): what a materialized intermediate costs.
COPY_WRITERS = frozenset({"aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::cat"})
REPEATED = 1.5  # an operator called this many times as often counts as repeated
SAME_CALLS = 0.05  # calls per kernel call within 5% count as "called as often"

# torch.profiler's C++ dtype names -> (torch name, bytes per element)
_DTYPES: dict[str, tuple[str, int]] = {
    "float": ("float32", 4), "double": ("float64", 8), "c10::Half": ("float16", 2),
    "c10::BFloat16": ("bfloat16", 2), "long int": ("int64", 8), "int": ("int32", 4),
    "short int": ("int16", 2), "signed char": ("int8", 1), "unsigned char": ("uint8", 1), "bool": ("bool", 1),
    "c10::complex<float>": ("complex64", 8), "c10::complex<double>": ("complex128", 16),
    "c10::complex<c10::Half>": ("complex32", 4), "c10::Float8_e4m3fn": ("float8_e4m3fn", 1),
    "c10::Float8_e5m2": ("float8_e5m2", 1),
}
_NOT_TENSORS = frozenset({"", "Scalar", "ScalarList", "GenericList", "TensorList", "None"})


@dataclass(frozen=True)
class TensorMeta:
    """One tensor input of a profiled call: what record_shapes gives."""

    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    dtype: str  # torch's name ("float32"), or the profiler's when unknown
    itemsize: int | None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def logical_bytes(self) -> float | None:
        return None if self.itemsize is None else float(self.numel * self.itemsize)

    @property
    def unique_bytes(self) -> float | None:
        """The bytes the tensor's elements span: a dimension of stride 0 (a broadcast) counts once."""
        if self.itemsize is None:
            return None
        if self.strides is None or len(self.strides) != len(self.shape):
            return self.logical_bytes
        return float(math.prod(size for size, stride in zip(self.shape, self.strides, strict=True) if stride != 0)
                     * self.itemsize)

    @property
    def broadcast(self) -> bool:
        return self.strides is not None and any(
            stride == 0 and size > 1 for size, stride in zip(self.shape, self.strides, strict=False))

    @property
    def contiguous(self) -> bool:
        if self.strides is None or len(self.strides) != len(self.shape):
            return True
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def describe(self) -> str:
        text = f"{self.dtype}[{', '.join(map(str, self.shape))}]"
        if not self.contiguous and self.strides is not None:
            text += f" strides ({', '.join(map(str, self.strides))})"
        return text


@dataclass(frozen=True)
class InputStats:
    """One operator on one set of inputs, per kernel call."""

    inputs: str  # "float32[64, 4096], float32[4096]"
    args: str = ""  # the scalar arguments the profiler recorded: "-1, True"
    calls_per_call: float = 0.0
    self_us_per_call: float = 0.0
    tensors: tuple[TensorMeta, ...] = ()
    written_bytes: float = 0.0  # per call of the operator (copies)
    copied_from: str | None = None

    @property
    def key(self) -> str:
        return f"{self.inputs} with arguments {self.args}" if self.args else self.inputs

    @property
    def read_bytes(self) -> float | None:
        """Bytes the tensor inputs span, per call of the operator (None: a dtype the profiler
        named that glmfb does not know)."""
        sizes = [t.unique_bytes for t in self.tensors]
        return None if any(size is None for size in sizes) else float(sum(s for s in sizes if s is not None))


@dataclass(frozen=True)
class CallerStats:
    """One operator's calls from one caller (the operator it runs inside; None: the kernel
    itself), per kernel call."""

    parent: str | None
    calls_per_call: float
    self_us_per_call: float


@dataclass(frozen=True)
class OpStats:
    """One operator on one side, per kernel call, with its calls split by inputs and by caller."""

    name: str
    calls_per_call: float  # operator calls per kernel call
    self_us_per_call: float  # operator self time per kernel call (CPU, or device on CUDA)
    by_inputs: tuple[InputStats, ...] = ()
    called_from: str | None = None  # the operator it most often runs inside; None: the kernel itself
    callers: tuple[CallerStats, ...] = ()  # its calls split by the operator they run inside

    @property
    def read_bytes(self) -> float | None:
        if not self.by_inputs:
            return None
        total = 0.0
        for entry in self.by_inputs:
            size = entry.read_bytes
            if size is None:
                return None
            total += size * entry.calls_per_call
        return total

    @property
    def written_bytes(self) -> float:
        return sum(entry.written_bytes * entry.calls_per_call for entry in self.by_inputs)


# --------------------------------------------------------------------------------------------
# Profiling
# --------------------------------------------------------------------------------------------


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 while the profiler starts and stops: its native library
    prints trace lines there that would clutter the CLI's output."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def _tensor(shape: Any, strides: Any, dtype: str) -> TensorMeta | None:
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) for d in shape):
        return None
    known = _DTYPES.get(dtype)
    name, itemsize = known if known is not None else (dtype or "?", None)
    stride_tuple = tuple(strides) if isinstance(strides, (list, tuple)) and all(
        isinstance(s, int) for s in strides) else None
    return TensorMeta(tuple(shape), stride_tuple, name, itemsize)


def tensors_of(shapes: Sequence[Any], strides: Sequence[Any], dtypes: Sequence[str]) -> tuple[TensorMeta, ...]:
    """The tensor inputs of one profiled call from its recorded shapes, strides and dtypes (a
    TensorList's tensors one by one; their dtype is not recorded)."""
    found: list[TensorMeta] = []
    for index, dtype in enumerate(dtypes):
        shape = shapes[index] if index < len(shapes) else None
        stride = strides[index] if index < len(strides) else None
        if dtype == "TensorList" and isinstance(shape, (list, tuple)):
            for j, inner in enumerate(shape):
                inner_stride = stride[j] if isinstance(stride, (list, tuple)) and j < len(stride) else None
                meta = _tensor(inner, inner_stride, "?")
                if meta is not None:
                    found.append(meta)
        elif dtype not in _NOT_TENSORS:
            meta = _tensor(shape, stride, dtype)
            if meta is not None:
                found.append(meta)
    return tuple(found)


def _args(concrete: Sequence[Any] | None) -> str:
    values = [value for value in concrete or () if value is not None and value != ""]
    return ", ".join(repr(value) if isinstance(value, str) else str(value) for value in values)


def copy_facts(name: str, tensors: Sequence[TensorMeta]) -> tuple[float, str | None]:
    """Bytes a copy writes per call and what it copies from (None for other operators)."""
    if name not in COPY_WRITERS or not tensors:
        return 0.0, None
    if name == "aten::cat":
        sizes = [t.logical_bytes for t in tensors]
        return (float(sum(s for s in sizes if s is not None)), "contiguous") if all(
            s is not None for s in sizes) else (0.0, None)
    target, source = tensors[0], tensors[1] if len(tensors) > 1 else None
    written = target.logical_bytes or 0.0
    if source is None:
        return written, None
    if source.broadcast:
        return written, "broadcast"
    if not source.contiguous:
        return written, "strided"
    if source.dtype != target.dtype:
        return written, "dtype"
    return written, "contiguous"


@dataclass
class _Accumulated:
    count: int = 0
    self_us: float = 0.0
    tensors: tuple[TensorMeta, ...] = ()
    args: str = ""
    inputs: str = ""
    parents: Counter[str] = field(default_factory=Counter)
    parent_us: dict[str, float] = field(default_factory=dict)  # own time by the operator it ran inside


@dataclass(frozen=True)
class _Event:
    """What the operator diff reads of one profiled operator call."""

    name: str
    self_us: float
    shapes: Any
    strides: Any
    dtypes: Sequence[Any]
    concrete: Any
    parent: str | None


# The utility operators torch.profiler leaves out of its events (torch.autograd.profiler_util).
_PROFILER_UTILITY = frozenset({
    "[memory]", "[OutOfMemory]", "profiler::_record_function_enter", "profiler::_record_function_enter_new",
    "profiler::_record_function_exit", "aten::is_leaf", "aten::output_nr", "aten::_version"})


class _Node:
    __slots__ = ("children", "end", "name", "parent", "record", "start", "sync")

    def __init__(self, record: Any, name: str, sync: bool) -> None:
        self.record, self.name, self.sync = record, name, sync
        self.start, self.end = record.start_ns(), record.end_ns()
        self.parent: _Node | None = None
        self.children: list[_Node] = []


def _cpu_events(result: Any) -> list[_Event]:
    """The operator calls of a CPU profile, read from the profiler's own records
    (``kineto_results.events()``) instead of the ``FunctionEvent`` objects ``function_events``
    builds, which is most of what a profiled bench's explanation costs. The same reading as
    torch's (``torch.autograd.profiler_util.EventList._build_tree``): per thread, an interval
    inside another is its child; a call whose parent has its name and no other child is the
    parent's redispatch, and goes; a call's own time is its time less its children's.
    ``tests/test_bench_opdiff.py`` checks that both readings give the same events."""
    import torch

    cpu = torch.autograd.DeviceType.CPU
    nodes = []
    for record in result.events():
        name = record.name()
        if name in _PROFILER_UTILITY or record.is_hidden_event():
            continue
        sync = (record.device_type() == cpu and not record.is_async()
                and record.start_thread_id() == record.end_thread_id())
        nodes.append(_Node(record, name, sync))
    by_thread: dict[int, list[_Node]] = {}
    for node in nodes:
        if node.sync:
            by_thread.setdefault(node.record.start_thread_id(), []).append(node)
    for items in by_thread.values():
        items.sort(key=lambda node: (node.start, -node.end))
        stack: list[_Node] = []
        for node in items:
            while stack:
                parent = stack[-1]
                if node.start >= parent.end or node.end > parent.end:
                    stack.pop()
                    continue
                parent.children.append(node)
                node.parent = parent
                break
            stack.append(node)
    gone: set[int] = set()
    changed = True
    while changed:
        changed = False
        for node in nodes:
            folded_into = node.parent
            if id(node) in gone or folded_into is None or folded_into.name != node.name or \
                    len(folded_into.children) != 1:
                continue
            folded_into.children = node.children
            for child in node.children:
                child.parent = folded_into
            gone.add(id(node))
            changed = True
    events = []
    for node in nodes:
        if id(node) in gone:
            continue
        record = node.record
        own_ns = node.end - node.start - sum(child.end - child.start for child in node.children)
        name = "ProfilerStep*" if node.name.startswith("ProfilerStep#") else node.name
        events.append(_Event(name, own_ns / 1000 if node.sync else 0.0,
                             record.structured_input_shapes() or record.shapes(), record.structured_input_strides(),
                             [str(d) for d in record.dtypes()], record.concrete_inputs(),
                             node.parent.name if node.parent is not None else None))
    return events


def _function_events(prof: Any, device: str) -> list[_Event]:
    """The same from ``prof.function_events`` (``torch.autograd.profiler.profile``): the path
    for a device, whose kernels are counted in their launching operator's self device time."""
    events = []
    for event in prof.function_events:
        if device == "cuda" and getattr(event, "device_type", None) is not None and \
                str(event.device_type).endswith("CUDA"):
            continue  # device kernels are counted in their launching operator's self device time
        if device == "cuda":
            self_us = float(getattr(event, "self_device_time_total", 0.0) or 0.0)
            if self_us == 0.0:
                self_us = float(getattr(event, "self_cpu_time_total", 0.0))
        else:
            self_us = float(getattr(event, "self_cpu_time_total", 0.0))
        parent = getattr(event, "cpu_parent", None)
        events.append(_Event(
            str(event.name), self_us,
            getattr(event, "structured_input_shapes", None) or getattr(event, "input_shapes", None) or [],
            getattr(event, "structured_input_strides", None) or [],
            [str(d) for d in (getattr(event, "input_dtypes", None) or [])],
            getattr(event, "concrete_inputs", None), str(parent.name) if parent is not None else None))
    return events


def profiler_session(device: str) -> Any:
    """A profiler to run kernels under, their input shapes recorded: on the CPU, one whose
    ``function_events`` (torch's ``FunctionEvent`` objects) and ``kineto_results`` (its records)
    are read after it; on a GPU, ``torch.profiler.profile``, whose ``profiler`` is that one.

    On the CPU, ``torch.autograd.profiler.profile``, the profiler ``torch.profiler.profile``
    wraps, with the same settings (CPU activity, Kineto, shapes recorded): the wrapper's start
    asks ``hasattr(torch, "_inductor")``, which imports ``torch._inductor`` and ``torch._dynamo``
    (1.3 s here, once per process, for a flag about CUDA graphs), and every bench that explains
    itself runs in a process of its own, so each paid it. On a GPU, the wrapper (its device
    activities)."""
    import torch

    if device == "cpu":
        return torch.autograd.profiler.profile(use_cpu=True, record_shapes=True, use_kineto=True)
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True)


def _profile_once(kernels: Sequence[Kernel], calls: int, device: str,
                  read: str = "records") -> dict[tuple[str, str], tuple[_Accumulated, int]]:
    """``calls`` kernel calls under torch.profiler, per operator and inputs. ``read``:
    ``records`` (the profiler's own records, on the CPU) or ``function_events``."""
    import torch

    with _quiet_stderr(), profiler_session(device) as session:
        for index in range(calls):
            kernels[index % len(kernels)]()
        if device == "cuda":
            torch.cuda.synchronize()
    prof = session if device == "cpu" else session.profiler  # the autograd profiler the wrapper ran
    events = (_cpu_events(prof.kineto_results) if device == "cpu" and read == "records"
              else _function_events(prof, device))
    found: dict[tuple[str, str], _Accumulated] = {}
    for event in events:
        if event.name.startswith("ProfilerStep") or event.name.startswith("[memory]"):
            continue
        tensors = tensors_of(event.shapes or [], event.strides or [], event.dtypes)
        inputs = ", ".join(t.describe() for t in tensors) or "no tensor inputs"
        args = _args(event.concrete)
        key = (event.name, f"{inputs} ({args})")
        entry = found.get(key)
        if entry is None:
            entry = found[key] = _Accumulated(tensors=tensors, args=args, inputs=inputs)
        entry.count += 1
        entry.self_us += event.self_us
        entry.parents[event.parent if event.parent is not None else ""] += 1
        parent = event.parent if event.parent is not None else ""
        entry.parent_us[parent] = entry.parent_us.get(parent, 0.0) + event.self_us
    return {key: (entry, calls) for key, entry in found.items()}


def _merge(rounds: Sequence[dict[tuple[str, str], tuple[_Accumulated, int]]]) -> dict[str, OpStats]:
    """Per operator and inputs, and per operator and caller: calls per kernel call
    (deterministic) and the *smallest* self time per kernel call over the rounds (noise on a
    shared host only adds time)."""
    best: dict[tuple[str, str], InputStats] = {}
    parents: dict[str, Counter[str]] = {}
    by_caller: dict[tuple[str, str], CallerStats] = {}
    for found in rounds:
        this_round: dict[tuple[str, str], tuple[float, float]] = {}
        for (name, key), (entry, calls) in found.items():
            written, source = copy_facts(name, entry.tensors)
            stats = InputStats(entry.inputs, entry.args, entry.count / calls, entry.self_us / calls, entry.tensors,
                               written, source)
            seen = best.get((name, key))
            if seen is None or stats.self_us_per_call < seen.self_us_per_call:
                best[(name, key)] = stats
            parents.setdefault(name, Counter()).update(entry.parents)
            for parent, count in entry.parents.items():
                calls_so_far, us_so_far = this_round.get((name, parent), (0.0, 0.0))
                this_round[(name, parent)] = (calls_so_far + count / calls,
                                              us_so_far + entry.parent_us[parent] / calls)
        for (name, parent), (calls_per_call, us_per_call) in this_round.items():
            kept = by_caller.get((name, parent))
            if kept is None or us_per_call < kept.self_us_per_call:
                by_caller[(name, parent)] = CallerStats(parent or None, calls_per_call, us_per_call)
    by_name: dict[str, list[InputStats]] = {}
    for (name, _key), stats in best.items():
        by_name.setdefault(name, []).append(stats)
    merged: dict[str, OpStats] = {}
    for name, entries in by_name.items():
        entries.sort(key=lambda e: (-e.calls_per_call, -e.self_us_per_call))
        parent = parents[name].most_common(1)[0][0] if parents.get(name) else ""
        callers = sorted((c for (op, _p), c in by_caller.items() if op == name),
                         key=lambda c: (-c.calls_per_call, c.parent or ""))
        merged[name] = OpStats(name, sum(e.calls_per_call for e in entries), sum(e.self_us_per_call for e in entries),
                               tuple(entries), parent or None, tuple(callers))
    return merged


def profile_pair(
    baseline: Sequence[Kernel], candidate: Sequence[Kernel], calls: int, device: str, rounds: int = 5
) -> tuple[dict[str, OpStats], dict[str, OpStats]]:
    """Profile both sides in alternating rounds; per operator and inputs keep the calls per
    kernel call and the smallest self time per call over the rounds, so a preemption during
    one round does not rewrite the diff."""
    per_round = max(2, calls // rounds)
    found: tuple[list[Any], list[Any]] = ([], [])
    for _ in range(rounds):
        for side, kernels in enumerate((baseline, candidate)):
            found[side].append(_profile_once(kernels, per_round, device))
    return _merge(found[0]), _merge(found[1])


# --------------------------------------------------------------------------------------------
# The lines that call an operator
# --------------------------------------------------------------------------------------------

SITES_PER_OP = 3  # lines kept per operator and side, most calls first
MAX_HOPS = 8  # callers walked up from an operator torch's dispatch does not show


def dispatched_sites(kernels: Sequence[Kernel]) -> dict[str, Counter[Any]] | None:
    """One call of each kernel under a ``TorchDispatchMode``: per operator (``aten::mean``) the
    user's lines that dispatched it (:func:`glmfb.core.sources.user_site`), with their calls.
    The mode sees the operators a kernel's Python code dispatches, after torch decomposes its
    composite ones, never those an operator calls inside (the profile's callers lead there).
    None when the kernel cannot run under the mode (a compiled graph, a custom op refusing it)."""
    import sys

    from torch.utils._python_dispatch import TorchDispatchMode

    from glmfb.core.sources import user_site

    boundary = sys._getframe()
    seen: dict[str, Counter[Any]] = {}

    class Sites(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            site = user_site(boundary)
            if site is not None:
                name = f"{getattr(func, 'namespace', 'aten')}::{func.overloadpacket.__name__}"
                seen.setdefault(name, Counter())[site] += 1
            return func(*args, **(kwargs or {}))

    try:
        with _quiet_stderr(), Sites():
            for kernel in kernels:
                kernel()
    except Exception:  # the kernel is the user's: no lines, and the diff stands without them
        return None
    return seen


def op_sites(kernels: Sequence[Kernel], stats: Mapping[str, OpStats], ops: Sequence[str], side: str) -> list[OpSite]:
    """The lines of ``side``'s code that call each of ``ops``: the operator as dispatched, or
    the nearest operator it runs inside (its profile's ``called_from``) that is."""
    seen = dispatched_sites(kernels)
    if not seen:
        return []
    rows: list[OpSite] = []
    for op in ops:
        name: str | None = op
        for _ in range(MAX_HOPS):
            if name is None or name in seen:
                break
            name = stats[name].called_from if name in stats else None
        if name is None or name not in seen:
            continue
        for site, count in seen[name].most_common(SITES_PER_OP):
            rows.append(OpSite(op=op, side=side, file=site.shown_file, line=site.line, function=site.function,
                               code=site.code, calls=count / len(kernels), via=name if name != op else None))
    return rows


# --------------------------------------------------------------------------------------------
# The diff
# --------------------------------------------------------------------------------------------


def _signs(added: Sequence[float], slower: bool | None) -> tuple[float, float]:
    net = sum(added)
    sign = (1.0 if net >= 0 else -1.0) if slower is None else (1.0 if slower else -1.0)
    # Share of the added time (all increases) when the candidate is slower, of the saved time
    # (all decreases) when it is faster; shares of the same sign sum to 1.
    return sign, sum(a for a in added if a * sign > 0) or sign


def _inputs_change(a: OpStats, b: OpStats) -> str:
    """What differs between the two sides' inputs of one operator: the last of "none",
    "arguments", "strides", "shapes", "dtype" that applies."""
    def tensors(stats: OpStats) -> set[tuple[TensorMeta, ...]]:
        return {e.tensors for e in stats.by_inputs}

    def project(stats: OpStats, part: str) -> set[tuple[Any, ...]]:
        return {tuple(getattr(t, part) for t in e.tensors) for e in stats.by_inputs}

    if project(a, "dtype") != project(b, "dtype"):
        return "dtype"
    if project(a, "shape") != project(b, "shape"):
        return "shapes"
    if tensors(a) != tensors(b):
        return "strides"
    if {e.args for e in a.by_inputs} != {e.args for e in b.by_inputs}:
        return "arguments"
    return "none"


def caller_rows(a: OpStats | None, b: OpStats | None) -> tuple[CallerRow, ...]:
    """One operator's calls by caller on both sides, most candidate calls first."""
    before = {c.parent: c for c in a.callers} if a is not None else {}
    after = {c.parent: c for c in b.callers} if b is not None else {}
    rows = [CallerRow(called_from=parent,
                      baseline_calls=before[parent].calls_per_call if parent in before else 0.0,
                      candidate_calls=after[parent].calls_per_call if parent in after else 0.0,
                      added_us=(after[parent].self_us_per_call if parent in after else 0.0)
                      - (before[parent].self_us_per_call if parent in before else 0.0))
            for parent in dict.fromkeys([*after, *before])]
    rows.sort(key=lambda row: (-row.candidate_calls, -row.baseline_calls, row.called_from or ""))
    return tuple(rows)


def calls_changed(baseline_calls: float, candidate_calls: float) -> bool:
    """More than :data:`SAME_CALLS` apart (or made on one side only)."""
    if baseline_calls == 0 or candidate_calls == 0:
        return baseline_calls != candidate_calls
    return abs(candidate_calls / baseline_calls - 1.0) > SAME_CALLS


def changed_caller(callers: Sequence[CallerRow], sign: float) -> CallerRow | None:
    """Of an operator's callers, the one the change is in: among those whose calls changed in
    the direction of the change (more calls when slower), the one that added the most time;
    else, among those called as often, the one whose self time changed most that way; None
    when no caller changed that way."""
    def moved(row: CallerRow) -> bool:
        return sign * (row.candidate_calls - row.baseline_calls) > 0 and calls_changed(
            row.baseline_calls, row.candidate_calls)

    counted = [row for row in callers if moved(row)]
    timed = [row for row in callers if sign * row.added_us > 0]
    chosen = counted or timed
    return max(chosen, key=lambda row: (sign * row.added_us, row.candidate_calls)) if chosen else None


def diff_ops(
    baseline: Mapping[str, OpStats], candidate: Mapping[str, OpStats], slower: bool | None = None
) -> list[OpRow]:
    """Operators ordered by their part of the change in self time, largest first.

    ``slower`` is the direction the timing measurement established; the profile's own net
    change decides it only when it is not given (a noisy profile must not flip the story)."""
    names = set(baseline) | set(candidate)
    raw = []
    for name in names:
        a, b = baseline.get(name), candidate.get(name)
        added = (b.self_us_per_call if b else 0.0) - (a.self_us_per_call if a else 0.0)
        raw.append((name, a, b, added))
    sign, denominator = _signs([item[3] for item in raw], slower)
    rows = []
    for name, a, b, added in raw:
        a_calls = a.calls_per_call if a else 0.0
        b_calls = b.calls_per_call if b else 0.0
        only_in = "candidate" if a_calls == 0 and b_calls > 0 else "baseline" if b_calls == 0 and a_calls > 0 else None
        copy_source = None
        if b is not None and b.by_inputs:
            sources = [e for e in b.by_inputs if e.copied_from is not None]
            if sources:
                copy_source = max(sources, key=lambda e: e.written_bytes * e.calls_per_call).copied_from
        callers = caller_rows(a, b)
        changed = changed_caller(callers, sign) if len(callers) > 1 else None
        called_from = (changed.called_from if changed is not None
                       else b.called_from if b is not None else a.called_from if a is not None else None)
        rows.append(OpRow(
            op=name, baseline_calls=a_calls, candidate_calls=b_calls,
            baseline_self_us=a.self_us_per_call if a else 0.0, candidate_self_us=b.self_us_per_call if b else 0.0,
            added_us=added, share=added / denominator, reduction=bool(REDUCTION_PATTERN.search(name)),
            input_shapes=tuple(e.inputs for e in b.by_inputs[:3]) if b else (),
            baseline_input_shapes=tuple(e.inputs for e in a.by_inputs[:3]) if a else (),
            only_in=only_in,
            called_from=called_from, callers=callers if len(callers) > 1 else (),
            inputs_change=_inputs_change(a, b) if a is not None and b is not None and a.by_inputs and b.by_inputs
            else None,
            baseline_read_bytes=a.read_bytes if a else None, candidate_read_bytes=b.read_bytes if b else None,
            baseline_written_bytes=a.written_bytes if a else 0.0, candidate_written_bytes=b.written_bytes if b else 0.0,
            copied_from=copy_source, view=bool(VIEW_PATTERN.search(name)),
            movement=bool(MOVEMENT_PATTERN.search(name) or VIEW_PATTERN.search(name)),
        ))
    rows.sort(key=lambda row: (-sign * row.added_us, row.op))
    return rows


def added_time(
    baseline: Mapping[str, OpStats], candidate: Mapping[str, OpStats], slower: bool | None = None
) -> float:
    """The added time per kernel call (the sum of the operators' increases; the saved time,
    negative, when the candidate is faster): what every share in the diff is a share of."""
    added = [(candidate[n].self_us_per_call if n in candidate else 0.0)
             - (baseline[n].self_us_per_call if n in baseline else 0.0) for n in set(baseline) | set(candidate)]
    return _signs(added, slower)[1]


def diff_inputs(
    baseline: Mapping[str, OpStats], candidate: Mapping[str, OpStats], slower: bool | None = None
) -> list[InputRow]:
    """The same diff keyed by operator *and* inputs (shapes, strides, dtypes, scalar arguments).
    Shares are of the operators' added time, as in :func:`diff_ops`, so the two tables add up
    alike."""
    def entries(side: Mapping[str, OpStats]) -> dict[tuple[str, str], InputStats]:
        return {(name, e.key): e for name, stats in side.items() for e in stats.by_inputs}

    a_entries, b_entries = entries(baseline), entries(candidate)
    raw = []
    for key in set(a_entries) | set(b_entries):
        a, b = a_entries.get(key), b_entries.get(key)
        raw.append((key, a, b, (b.self_us_per_call if b else 0.0) - (a.self_us_per_call if a else 0.0)))
    sign, _ = _signs([item[3] for item in raw], slower)
    denominator = added_time(baseline, candidate, slower)
    rows = [
        InputRow(op=name, inputs=label, baseline_calls=a.calls_per_call if a else 0.0,
                 candidate_calls=b.calls_per_call if b else 0.0,
                 baseline_self_us=a.self_us_per_call if a else 0.0,
                 candidate_self_us=b.self_us_per_call if b else 0.0, added_us=added, share=added / denominator,
                 read_bytes=(b or a).read_bytes if (b or a) is not None else None)  # type: ignore[union-attr]
        for (name, label), a, b, added in raw
    ]
    rows.sort(key=lambda row: (-sign * row.added_us, row.op, row.inputs))
    return rows


def call_ratio(baseline_calls: float, candidate_calls: float) -> float:
    """Candidate calls over baseline calls (inf when only the candidate calls it)."""
    if baseline_calls == 0:
        return math.inf if candidate_calls > 0 else 1.0
    return candidate_calls / baseline_calls


def repeated_input(row: InputRow, slower: bool) -> bool:
    """The same operator on the same inputs, called at least 1.5x as often (slower) or at most
    1/1.5 as often (faster), and carrying added (saved) time: both sides must make the call."""
    if row.baseline_calls == 0 or row.candidate_calls == 0:
        return False
    ratio = row.candidate_calls / row.baseline_calls
    if slower:
        return row.added_us > 0 and ratio >= REPEATED
    return row.added_us < 0 and ratio <= 1 / REPEATED


def build_op_diff(
    baseline: Mapping[str, OpStats], candidate: Mapping[str, OpStats], *, shape: str, profiled_calls: int,
    slower: bool, device: str = "cpu", limit: int = 40,
) -> OpDiff:
    """The ``op_diff`` evidence: the operator rows, the rows by operator and inputs, the
    operators only one side runs with the share of the change they carry, and the calls
    repeated on the same inputs."""
    rows = diff_ops(baseline, candidate, slower)
    inputs = diff_inputs(baseline, candidate, slower)
    only_candidate = [row for row in rows if row.only_in == "candidate"]
    only_baseline = [row for row in rows if row.only_in == "baseline"]
    repeated = [row for row in inputs if repeated_input(row, slower)]
    repeated_names = list(dict.fromkeys(row.op for row in repeated))

    def kept(all_rows: Sequence[Any]) -> tuple[Any, ...]:
        # Every row that carries at least 0.5% of the change, or that only one side runs.
        chosen = [r for r in all_rows if abs(r.share) >= 0.005 or getattr(r, "only_in", None)]
        return tuple(chosen[:limit])

    return OpDiff(
        shape=shape, profiled_calls=profiled_calls, ops=kept(rows), device=device,
        repeated_reductions=tuple(name for name in repeated_names if REDUCTION_PATTERN.search(name)),
        inputs=kept(inputs),
        only_in_candidate=tuple(row.op for row in only_candidate),
        only_in_baseline=tuple(row.op for row in sorted(only_baseline, key=lambda r: r.added_us)),
        only_in_candidate_share=sum(row.share for row in only_candidate),
        only_in_baseline_share=sum(row.share for row in only_baseline),
        repeated_inputs=tuple(repeated_names),
        repeated_inputs_share=sum(row.share for row in repeated),
    )
