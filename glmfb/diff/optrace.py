"""What a module's operations compute in, and where in the user's code: an aten-level trace.

A module called on recorded inputs runs under a ``TorchDispatchMode`` that sees every aten
operation: the dtypes of its floating operands and of its output, whether its output holds NaN
or Inf where its operands do not, and, for the operations that matter, the line of the user's
code that ran it (the innermost Python frame outside torch, glmfb and the standard library).

Two things are read from it:

- the operations that computed in a narrower format than the module's inputs (a float32 value
  cast to bfloat16, a bfloat16 tensor made, a product on float16 operands), each with its
  source line; set against the baseline module's trace on the same inputs, the first that the
  baseline does not run is where a narrower format enters (:func:`new_narrowing`): a
  ``.type_as(bias)`` that rounds a running sum to the dtype of a bfloat16 mask shows as
  ``aten._to_copy`` float32 -> bfloat16 at that line;
- the first operation whose output is NaN or Inf while its operands are finite (an overflow, a
  division by zero), with its dtypes and line.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from glmfb.core.sources import SourceSite, user_site

# Operations that move or view values without computing with them. A cast among them
# (``_to_copy`` or ``copy_`` into a narrower dtype) still counts as narrowing.
MOVES = frozenset({"_to_copy", "copy_", "copy", "detach", "clone", "view", "_unsafe_view", "t", "transpose",
                   "expand", "slice", "select", "unsqueeze", "squeeze", "permute", "contiguous", "alias",
                   "as_strided", "split", "split_with_sizes", "chunk", "unbind", "lift_fresh", "_reshape_alias",
                   "reshape", "view_as", "expand_as", "diagonal", "unfold", "narrow"})
CASTS = frozenset({"_to_copy", "copy_", "copy"})
# Operations whose output holds no values yet (uninitialised memory, filled later by slice
# assignment or ``out=``): rounding it would round garbage, and a NaN in it is garbage too, not
# an operation that overflowed.
UNINITIALISED = frozenset({"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided",
                           "empty_permuted"})


@dataclass(frozen=True)
class TracedOp:
    """One operation (with its dtypes and line) as the trace saw it, and how often it ran so."""

    operation: str  # "aten._to_copy"
    inputs: tuple[str, ...]  # the floating dtypes of its operands, in order
    output: str  # the floating dtype of its output
    site: SourceSite | None
    calls: int = 1

    @property
    def cast(self) -> bool:
        """A wider floating operand went in: a value was cast down."""
        return any(bits(d) > bits(self.output) for d in self.inputs)

    @property
    def key(self) -> tuple[Any, ...]:
        """What matches it to the same operation in another trace (the line's function and
        text, not its number: a patch above it moves the number)."""
        site = (self.site.function, self.site.code) if self.site is not None else None
        return self.operation, self.inputs, self.output, site

    def describe(self, reference: str) -> str:
        """``a float32 value is cast to bfloat16 in flash_attention, line 83 of f.py``."""
        if self.cast:
            wider = max(self.inputs, key=bits)
            what = f"a {wider} value is cast to {self.output}"
        elif not self.inputs:
            what = f"a {self.output} tensor is made ({self.operation})"
        else:
            what = f"{self.operation} computes in {self.output} on {', '.join(dict.fromkeys(self.inputs))} operands"
        where = f" in {self.site.describe()}" if self.site is not None else " in torch's own code (no line of the user's)"
        return what + where

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"operation": self.operation, "inputs": list(self.inputs), "output": self.output,
                                "cast": self.cast, "calls": self.calls}
        if self.site is not None:
            data.update(file=self.site.file, line=self.site.line, function=self.site.function, code=self.site.code)
        return data


@dataclass(frozen=True)
class Watched:
    """The values one operation of a traced call gave: its ``call``-th run of ``operation`` (the
    operation the other side's trace first saw give NaN or Inf, matched by order)."""

    operation: str
    call: int  # 1-based, among the module's runs of that operation
    output: str  # its output's floating dtype
    max_abs: float  # the largest finite magnitude of its output
    beyond: int  # finite elements past ``limit``
    nonfinite: int  # elements that are NaN or Inf
    elements: int
    limit: float


@dataclass(frozen=True)
class OperationTrace:
    """A module's operations on one call: the floating dtypes they computed with, those narrower
    than its inputs, and the first whose output is NaN or Inf on finite operands (and which run
    of that operation it was), and the values of an operation it was asked to watch."""

    reference: str | None  # the widest floating dtype among the module's inputs and parameters
    operands: tuple[tuple[str, str], ...]  # (operation, dtype) of every floating operand of a computation
    narrowed: tuple[TracedOp, ...]  # in order of first appearance
    first_nonfinite: TracedOp | None = None
    first_nonfinite_call: int | None = None  # which run of its operation, 1-based
    watched: Watched | None = None


def bits(dtype: str) -> int:
    """The width of a floating dtype by name (``float32`` -> 32); 0 when it is not one."""
    import torch

    value = getattr(torch, dtype, None)
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        return 0
    return int(torch.finfo(value).bits)


def clone_tree(value: Any) -> Any:
    """Tensors inside tuples, lists and dicts cloned (detached); anything else, a named tuple
    included, kept as it is."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(clone_tree(v) for v in value)
    if isinstance(value, list):
        return [clone_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: clone_tree(v) for k, v in value.items()}
    return value


def _floating(value: Any) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()]


def _dtype(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def reference_dtype(module: Any, args: Any, kwargs: Any) -> str | None:
    """The widest floating dtype among a call's inputs and the module's parameters."""
    found = [_dtype(t) for t in _floating((args, kwargs))]
    found += [_dtype(p) for p in (*module.parameters(), *module.buffers()) if p.is_floating_point()]
    return max(found, key=bits) if found else None


def trace_module(module: Any, args: Any, kwargs: Any, reference: str | None = None,
                 nonfinite: bool = True, watch: tuple[str, int, float] | None = None) -> OperationTrace:
    """Run ``module(*args, **kwargs)`` (on clones, without gradients) under the trace.
    ``reference``: the dtype narrower formats are measured against (default: the widest floating
    dtype of the inputs and parameters); ``nonfinite``: look for the first operation whose
    output is NaN or Inf on finite operands; ``watch``: ``(operation, call, limit)``, the values
    of that run of that operation against ``limit``."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    reference = reference or reference_dtype(module, args, kwargs)
    boundary = sys._getframe()
    limit = bits(reference) if reference else 0
    operands: dict[tuple[str, str], None] = {}
    narrowed: dict[tuple[Any, ...], TracedOp] = {}
    first_bad: list[tuple[TracedOp, int]] = []
    runs: dict[str, int] = {}  # runs of each computing operation so far
    watched: list[Watched] = []

    class Tracing(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = str(func.overloadpacket.__name__)
            if name not in MOVES:
                runs[name] = runs.get(name, 0) + 1
            inputs = _floating((args, kwargs))
            in_dtypes = tuple(_dtype(t) for t in inputs)
            if name not in MOVES:
                for dtype in in_dtypes:
                    operands[(f"aten.{name}", dtype)] = None
            outputs = _floating(out)
            if not outputs:
                return out
            out_dtype = _dtype(outputs[0])
            narrower = bits(out_dtype) < limit
            is_cast = name in CASTS and any(bits(d) > bits(out_dtype) for d in in_dtypes)
            if narrower and (name not in MOVES or is_cast):
                op = TracedOp(f"aten.{name}", in_dtypes, out_dtype, user_site(boundary))
                known = narrowed.get(op.key)
                narrowed[op.key] = op if known is None else TracedOp(op.operation, op.inputs, op.output,
                                                                     known.site, known.calls + 1)
            if (nonfinite and not first_bad and name not in MOVES and name not in UNINITIALISED
                    and not all(bool(torch.isfinite(t).all()) for t in outputs)
                    and all(bool(torch.isfinite(t).all()) for t in inputs)):
                first_bad.append((TracedOp(f"aten.{name}", in_dtypes, out_dtype, user_site(boundary)), runs[name]))
            if watch is not None and not watched and (f"aten.{name}", runs.get(name)) == watch[:2]:
                watched.append(_watched(f"aten.{name}", watch[1], outputs[0], watch[2]))
            return out

    with torch.no_grad(), Tracing():
        module(*clone_tree(args), **clone_tree(kwargs))
    return OperationTrace(reference, tuple(operands), tuple(narrowed.values()),
                          first_bad[0][0] if first_bad else None, first_bad[0][1] if first_bad else None,
                          watched[0] if watched else None)


def _watched(operation: str, call: int, output: Any, limit: float) -> Watched:
    import torch

    values = output.detach().reshape(-1).to(torch.float64).abs()
    finite = torch.isfinite(values)
    kept = values[finite]
    return Watched(operation, call, _dtype(output), float(kept.max()) if kept.numel() else 0.0,
                   int((kept > limit).sum()), int((~finite).sum()), int(values.numel()), limit)


def new_narrowing(candidate: OperationTrace, baseline: OperationTrace | None) -> TracedOp | None:
    """The candidate's first operation narrower than its module's inputs that the baseline's
    module, on the same inputs, does not run (the same operation, dtypes and line of code); with
    no baseline trace, the candidate's first."""
    seen = {op.key for op in baseline.narrowed} if baseline is not None else set()
    return next((op for op in candidate.narrowed if op.key not in seen), None)


def float16_seen(trace: OperationTrace | None, dtypes: Sequence[str]) -> tuple[str, ...]:
    """What shows float16 in a module: its own tensors (``dtypes``: parameters, inputs,
    outputs) and its operations' operands."""
    found: list[str] = []
    if "float16" in dtypes:
        found.append("its parameters, inputs or outputs are float16")
    if trace is not None:
        ops = list(dict.fromkeys(op for op, dtype in trace.operands if dtype == "float16"))
        if ops:
            found.append(f"{', '.join(ops[:3])} {'takes' if len(ops) == 1 else 'take'} float16 operands")
    return tuple(found)
