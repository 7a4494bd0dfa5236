"""The bytes a kernel's input sets hold: what its cache regime is read against.

A factory returns a callable that runs the kernel on inputs it already allocated; those inputs
are reachable from the callable (its closure, its defaults, a bound method's object, a
``functools.partial``'s arguments, an object's attributes, the lists and dicts among them).
:func:`input_footprint` walks those references, a few levels deep, and adds up the storage of
every torch tensor (and numpy array) it finds, each storage once however many views or input
sets share it. Resident-memory growth while the sets were allocated is the fallback (a kernel
whose inputs live where the walk does not look: module globals, native objects); it reads low
when the allocator reuses freed memory, which is why it is not the first choice.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 6  # closure -> object -> its dict -> a module -> its parameters -> a tensor
MAX_OBJECTS = 20_000  # objects visited per kernel, at most

_SKIP = (str, bytes, bytearray, int, float, complex, bool, type(None), type, types.ModuleType,
         types.BuiltinFunctionType, types.CodeType)


@dataclass(frozen=True)
class Footprint:
    """The bytes of one side's input sets: all of them together (each storage once) and the
    largest single set; ``source`` says how they were read."""

    total_bytes: int
    set_bytes: int
    source: str  # "tensors the kernel holds" or "resident-memory growth"


def _storage(value: Any) -> tuple[int, int] | None:
    """(an identity of the memory, its bytes) of a torch tensor or a numpy array."""
    storage = getattr(value, "untyped_storage", None)
    if callable(storage) and hasattr(value, "data_ptr"):
        try:
            held = storage()
            return (int(held.data_ptr()), int(held.nbytes()))
        except (RuntimeError, TypeError, AttributeError):
            return None
    interface = getattr(value, "__array_interface__", None)
    if isinstance(interface, dict) and isinstance(getattr(value, "nbytes", None), int):
        base = value
        while getattr(base, "base", None) is not None and hasattr(base.base, "__array_interface__"):
            base = base.base
        return (int(base.__array_interface__["data"][0]), int(base.nbytes))
    return None


def _children(value: Any) -> Iterable[Any]:
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)[:1000]
    if isinstance(value, dict):
        return list(value.values())[:1000]
    if isinstance(value, functools.partial):
        return [value.func, *value.args, *value.keywords.values()]
    if isinstance(value, types.FunctionType):
        cells = []
        for cell in value.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
        return [*cells, *(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values()]
    if isinstance(value, types.MethodType):
        return [value.__self__, value.__func__]
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return list(attributes.values())[:1000]
    return ()


def held_storages(kernel: Callable[[], Any]) -> dict[int, int]:
    """The storages (identity -> bytes) of the tensors and arrays ``kernel`` holds."""
    found: dict[int, int] = {}
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(kernel, 0)]
    while stack and len(seen) < MAX_OBJECTS:
        value, depth = stack.pop()
        if id(value) in seen or isinstance(value, _SKIP):
            continue
        seen.add(id(value))
        storage = _storage(value)
        if storage is not None:
            key, size = storage
            found[key] = max(found.get(key, 0), size)
            continue
        if depth < MAX_DEPTH:
            stack.extend((child, depth + 1) for child in _children(value))
    return found


def input_footprint(kernels: Sequence[Callable[[], Any]], grown_bytes: int | None = None) -> Footprint | None:
    """The footprint of one allocation's input sets (``kernels``, one per set): from the
    tensors they hold, else from ``grown_bytes`` (resident-memory growth while they were
    allocated, shared evenly over the sets), else None."""
    per_set = [held_storages(kernel) for kernel in kernels]
    union: dict[int, int] = {}
    for storages in per_set:
        union.update(storages)
    if union:
        return Footprint(sum(union.values()), max(sum(s.values()) for s in per_set), "tensors the kernel holds")
    if grown_bytes:
        return Footprint(grown_bytes, grown_bytes // max(1, len(kernels)), "resident-memory growth")
    return None


def larger(*footprints: Footprint | None) -> Footprint | None:
    """The footprint with the most bytes (the side whose inputs the cache holds least of)."""
    known = [f for f in footprints if f is not None]
    return max(known, key=lambda f: f.total_bytes) if known else None


__all__ = ["Footprint", "held_storages", "input_footprint", "larger"]
