"""Live mode: separate the error a module adds by itself from the error it inherits.

For each suspect module call (the taps that diverged, in execution order), both sides are run
again with a forward pre-hook that keeps the call's inputs (positional and keyword) and a
forward hook that keeps its output. The candidate's module of the same name is then called on
the baseline's inputs (cast to the dtypes the candidate's module received in its own run, so
that a module run in bfloat16 gets bfloat16 inputs); the difference between its output and the
baseline's output is the module's *local* error. The first module whose local error exceeds
tolerance is where the error starts; a module whose output differs only because its inputs did
has local error zero. The difference between the inputs the two sides gave the module is its
*inherited* error.

The module where the error starts is also traced at the aten level on both sides
(:mod:`glmfb.diff.optrace`): the operations of the candidate's module in a narrower format than
its inputs, with the line of the user's code that ran each, against the baseline's on the same
inputs, and the first operation whose output is NaN or Inf on finite operands.

When no module's own error exceeds tolerance, the error enters in code between modules: a
parent's own forward (a mask, a position table or a constant made there and handed to its
children). :func:`error_entry` climbs from the first module that diverged through its parents,
comparing the inputs each was called with on the two sides, and names the first whose inputs
agree: its own forward is where the difference is made.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from glmfb.diff.axes import TokenAxes, TokenAxis
from glmfb.diff.capture import LoadedSide, flatten, forward
from glmfb.diff.metrics import (
    PairComparer,
    PositionErrors,
    TensorMetrics,
    Tolerances,
    position_errors,
    typical_relative_error,
)
from glmfb.diff.optrace import OperationTrace, TracedOp, clone_tree, new_narrowing, trace_module
from glmfb.diff.requests import Request
from glmfb.diff.store import tap_name

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LocalError:
    """The error one module call adds on the baseline's inputs (the worst of its outputs)."""

    module: str
    call: int
    tap: str  # the output tap it was measured on
    metrics: TensorMetrics | None  # None when the module could not be run in isolation
    positions: PositionErrors | None
    note: str = ""
    typical_relative: float | None = None  # median element-wise relative error, early positions
    inherited_rel_l2: float | None = None  # relative L2 error of its inputs, candidate against baseline
    axis: TokenAxis | None = None  # the token axis of the output it was measured on

    @property
    def failed(self) -> bool:
        return self.metrics is not None and self.metrics.failed


@dataclass(frozen=True)
class LocalCall:
    """What a further test of one module call needs: the baseline module, the inputs it was
    called with (as recorded), the output part measured, and both sides' values of it."""

    module: str
    call: int
    tap: str
    part: str  # the flattened output's name (as :func:`flatten` names it)
    baseline_module: Any
    args: Any
    kwargs: Any
    baseline: Any  # torch.Tensor: the baseline's output part
    candidate: Any  # torch.Tensor: the candidate module's output part on the baseline's inputs
    dim: int | None  # the position dimension of that output
    candidate_dtypes: tuple[str, ...]  # dtypes of the candidate module's parameters, inputs and outputs
    candidate_ops: tuple[tuple[str, str], ...] | None = None  # (operation, dtype) of its floating operands
    trace: OperationTrace | None = None  # the candidate module's operations on these inputs (None: not recorded)
    baseline_trace: OperationTrace | None = None  # the baseline module's, on the same inputs

    @property
    def narrowing(self) -> TracedOp | None:
        """The candidate's first operation in a narrower format than the module's inputs that
        the baseline's does not run."""
        return new_narrowing(self.trace, self.baseline_trace) if self.trace is not None else None

    def rerun(self, fmt: str, ops: str, scope: str = "") -> torch.Tensor:
        """The baseline module on its recorded inputs with ``fmt`` imposed on ``ops``
        (:func:`glmfb.diff.rounding.rounding_mode`); the same output part. With ``scope`` (a
        submodule, relative to this one), only inside that submodule, whose output is rounded
        to ``fmt`` too."""
        import torch

        from glmfb.diff.rounding import round_to, rounding_mode

        if not scope:
            with torch.no_grad(), rounding_mode(fmt, ops):
                output = self.baseline_module(*clone_tree(self.args), **clone_tree(self.kwargs))
        else:
            inner = self.baseline_module.get_submodule(scope)
            active: list[Any] = []

            def enter(*_: Any) -> None:
                active.append(rounding_mode(fmt, ops))
                active[-1].__enter__()

            def leave(_: Any, __: Any, result: Any) -> Any:
                active.pop().__exit__(None, None, None)
                if isinstance(result, torch.Tensor) and result.is_floating_point():
                    return round_to(result, fmt)
                return result

            handles = [inner.register_forward_pre_hook(enter), inner.register_forward_hook(leave)]
            try:
                with torch.no_grad():
                    output = self.baseline_module(*clone_tree(self.args), **clone_tree(self.kwargs))
            finally:
                for handle in handles:
                    handle.remove()
                while active:
                    active.pop().__exit__(None, None, None)
        parts = dict(flatten(output, self.module)[0])
        if self.part not in parts:
            raise ValueError(f"the rerun returned no {self.part}")
        tensor: torch.Tensor = parts[self.part]
        return tensor


@dataclass(frozen=True)
class Localization:
    """Every suspect's local error, and the first that exceeds tolerance with what testing it
    further needs."""

    errors: tuple[LocalError, ...]
    culprit: LocalCall | None = None


Recorded = dict[tuple[str, int], tuple[Any, Any, Any]]


def record_calls(side: LoadedSide, request: Request, wanted: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[Any, Any, Any]]:
    """Run ``request`` and keep (args, kwargs, output) of the wanted module calls."""
    wanted_set = set(wanted)
    kept: dict[tuple[str, int], tuple[Any, Any, Any]] = {}
    inputs: dict[tuple[str, int], tuple[Any, Any]] = {}
    counters: dict[str, int] = {}

    def make_hooks(name: str) -> tuple[Callable[..., None], Callable[..., None]]:
        def pre(module: Any, args: Any, kwargs: Any) -> None:
            call = counters.get(name, 0)
            counters[name] = call + 1
            if (name, call) in wanted_set:
                inputs[(name, call)] = (clone_tree(args), clone_tree(kwargs))

        def post(module: Any, args: Any, output: Any) -> None:
            key = (name, counters.get(name, 1) - 1)
            if key in inputs:
                kept[key] = (*inputs.pop(key), clone_tree(output))

        return pre, post

    _forward_hooked(side, request, {module for module, _ in wanted}, make_hooks)
    return kept



def _cast_like(value: Any, like: Any) -> Any:
    """``value`` with each floating tensor cast to the dtype of the tensor in the same place of
    ``like`` (the inputs the candidate's module got in its own run)."""
    import torch

    if isinstance(value, torch.Tensor) and isinstance(like, torch.Tensor):
        if value.is_floating_point() and like.is_floating_point() and value.dtype != like.dtype:
            return value.to(like.dtype)
        return value
    if isinstance(value, tuple) and isinstance(like, tuple) and len(value) == len(like) and not hasattr(value, "_fields"):
        return tuple(_cast_like(v, w) for v, w in zip(value, like, strict=True))
    if isinstance(value, list) and isinstance(like, list) and len(value) == len(like):
        return [_cast_like(v, w) for v, w in zip(value, like, strict=True)]
    if isinstance(value, dict) and isinstance(like, Mapping):
        return {k: _cast_like(v, like[k]) if k in like else v for k, v in value.items()}
    return value


def _tensor_dtypes(value: Any) -> list[str]:
    import torch

    found: list[str] = []

    def walk(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            found.append(str(item.dtype).removeprefix("torch."))
        elif isinstance(item, Mapping):
            for sub in item.values():
                walk(sub)
        elif isinstance(item, (tuple, list)):
            for sub in item:
                walk(sub)

    walk(value)
    return found


def operand_dtypes(module: Any, args: Any, kwargs: Any) -> tuple[tuple[str, str], ...]:
    """``(operation, dtype)`` of every floating operand the module's operations take when
    called on ``args``/``kwargs`` (recorded at the aten level: a ``.half()`` inside its forward
    shows as float16 operands of the product after it; a cast is not a computation)."""
    return trace_module(module, args, kwargs, nonfinite=False).operands


def traced(candidate: Any, candidate_call: tuple[Any, Any], baseline: Any,
           baseline_call: tuple[Any, Any]) -> tuple[OperationTrace | None, OperationTrace | None]:
    """The traces of one module call on both sides (:func:`glmfb.diff.optrace.trace_module`),
    narrower formats measured against the baseline's inputs and parameters; None for a side
    whose forward cannot run under a dispatch mode. Where the candidate's first gives NaN or Inf
    on finite operands, the baseline's run of the same operation (the same run of it, counted in
    order) is watched: its values against float16's range."""
    from glmfb.diff.optrace import reference_dtype
    from glmfb.diff.rounding import FLOAT16_MAX

    found: list[OperationTrace | None] = []
    reference = reference_dtype(baseline, *baseline_call)
    for module, (args, kwargs) in ((candidate, candidate_call), (baseline, baseline_call)):
        first = found[0] if found else None
        watch = ((first.first_nonfinite.operation, first.first_nonfinite_call, FLOAT16_MAX)
                 if first is not None and first.first_nonfinite is not None and first.first_nonfinite_call else None)
        try:
            found.append(trace_module(module, args, kwargs, reference, nonfinite=module is candidate, watch=watch))
        except Exception:  # a forward that cannot run under a dispatch mode: not recorded
            found.append(None)
    return found[0], found[1]


def _module_dtypes(module: Any) -> list[str]:
    return [str(t.dtype).removeprefix("torch.") for t in (*module.parameters(), *module.buffers())]


def _input_error(base: tuple[Any, Any], cand: tuple[Any, Any] | None) -> float | None:
    """The largest relative L2 error over the floating input tensors both calls have (None:
    none to compare)."""
    if cand is None:
        return None
    base_leaves, cand_leaves = _leaves(*base), _leaves(*cand)
    worst: float | None = None
    for name, value in base_leaves.items():
        other = cand_leaves.get(name)
        if not (_is_float_tensor(value) and _is_float_tensor(other)) or value.shape != other.shape:  # type: ignore[union-attr]
            continue
        assert other is not None
        error = _rel_l2(value, other)
        worst = error if worst is None else max(worst, error)
    return worst


def local_errors(baseline: LoadedSide, candidate: LoadedSide, request: Request,
                 suspects: Sequence[tuple[str, int, int]], tolerances: Tolerances,
                 comparer: PairComparer, axes: TokenAxes | None = None) -> Localization:
    """Local error of each suspect ``(module, call, calls of that module in the request)``;
    positions along each output's token axis (``axes``: found from every request; without it,
    from this request's length alone)."""
    import torch

    wanted = [(m, c) for m, c, _ in suspects]
    recorded = record_calls(baseline, request, wanted)
    recorded_c = record_calls(candidate, request, wanted)
    results: list[LocalError] = []
    culprit: LocalCall | None = None
    for module_name, call, calls in suspects:
        counts = {module_name: calls}
        name = tap_name(module_name, call, counts, module_name)
        if (module_name, call) not in recorded:
            results.append(LocalError(module_name, call, name, None, None, "the baseline did not call it"))
            continue
        args, kwargs, base_output = recorded[(module_name, call)]
        own = recorded_c.get((module_name, call))
        inherited = _input_error((args, kwargs), (own[0], own[1]) if own else None)
        try:
            module = candidate.submodule(module_name)
        except AttributeError:
            results.append(LocalError(module_name, call, name, None, None, "no such module in the candidate",
                                      inherited_rel_l2=inherited))
            continue
        call_args, call_kwargs = (_cast_like(args, own[0]), _cast_like(kwargs, own[1])) if own else (args, kwargs)
        try:
            with torch.no_grad():
                cand_output = module(*clone_tree(call_args), **clone_tree(call_kwargs))
        except (Exception, SystemExit) as exc:
            detail = str(exc).strip().splitlines()
            note = f"run in isolation, it raised {type(exc).__name__}" + (f": {detail[0]}" if detail else "")
            results.append(LocalError(module_name, call, name, None, None, note, inherited_rel_l2=inherited))
            continue
        base_parts = dict(flatten(base_output, module_name)[0])
        cand_parts = dict(flatten(cand_output, module_name)[0])
        worst: tuple[str, str, TensorMetrics, torch.Tensor, torch.Tensor] | None = None
        for part, base_tensor in base_parts.items():
            cand_tensor = cand_parts.get(part)
            if cand_tensor is None or cand_tensor.shape != base_tensor.shape:
                continue
            dtype = str(base_tensor.dtype).removeprefix("torch.")
            part_tap = tap_name(module_name, call, counts, part)
            metrics = comparer.compare_tensors(base_tensor, cand_tensor, tolerances.for_tap(part_tap, dtype))
            if worst is None or (metrics.failed, metrics.rel_l2) > (worst[2].failed, worst[2].rel_l2):
                worst = (part, part_tap, metrics, base_tensor, cand_tensor)
        if worst is None:
            results.append(LocalError(module_name, call, name, None, None, "no comparable tensor output",
                                      inherited_rel_l2=inherited))
            continue
        part, part_tap, metrics, base_tensor, cand_tensor = worst
        axis = (axes or TokenAxes({})).of(part_tap, tuple(base_tensor.shape), request.length)
        dim = axis.axis
        positions = None
        if dim is not None:
            tolerance = tolerances.for_tap(part_tap, str(base_tensor.dtype).removeprefix("torch."))
            positions = position_errors(base_tensor, cand_tensor, dim, tolerance).in_sequence(request.offsets)
        typical = typical_relative_error(base_tensor, cand_tensor, dim)
        entry = LocalError(module_name, call, part_tap, metrics, positions, typical_relative=typical,
                           inherited_rel_l2=inherited, axis=axis)
        results.append(entry)
        if culprit is None and entry.failed:
            dtypes = tuple(dict.fromkeys([*_module_dtypes(module), *_tensor_dtypes(call_args),
                                          *_tensor_dtypes(call_kwargs), *_tensor_dtypes(cand_output)]))
            base_module = baseline.submodule(module_name)
            traces = traced(module, (call_args, call_kwargs), base_module, (args, kwargs))
            culprit = LocalCall(module_name, call, part_tap, part, base_module, args, kwargs, base_tensor, cand_tensor,
                                dim, dtypes, traces[0].operands if traces[0] is not None else None, *traces)
    return Localization(tuple(results), culprit)


# --------------------------------------------------------------------------------------------
# Where the error enters when no module adds it: a parent's own forward
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputDifference:
    """One input a module call got differently on the two sides."""

    name: str
    detail: str  # "None in the baseline, a tensor [1, 1, 64, 64] in the candidate", "relative L2 error 0.65"


@dataclass(frozen=True)
class EntryStep:
    """A module on the way up from the first divergent module, and the inputs it got differently."""

    module: str  # "" for the top-level module
    differing: tuple[InputDifference, ...]
    compared: int  # inputs compared
    note: str = ""


@dataclass(frozen=True)
class ErrorEntry:
    """The module whose own forward makes the difference (its inputs agree on both sides, the
    inputs it hands a child do not), and the steps that led there."""

    module: str | None  # None: not found (every step's inputs differ, or none could be recorded)
    steps: tuple[EntryStep, ...]
    root_class: str = ""  # the top-level module's class, when the entry is the top level
    upstream: tuple[str, float] | None = None  # the first tap with any error, when the climb stopped there
    trace: OperationTrace | None = None  # the candidate's entry module on its inputs (None: not recorded)
    baseline_trace: OperationTrace | None = None  # the baseline's, on its own

    @property
    def narrowing(self) -> TracedOp | None:
        """The candidate's first operation in the entry module narrower than its inputs that the
        baseline's does not run."""
        return new_narrowing(self.trace, self.baseline_trace) if self.trace is not None else None

    @property
    def handed(self) -> tuple[str, tuple[InputDifference, ...]] | None:
        """The child of the entry module that got different inputs, and which."""
        if self.module is None:
            return None
        for index, step in enumerate(self.steps):
            if step.module == self.module and index > 0:
                below = self.steps[index - 1]
                return below.module, below.differing
        return None


def ancestors(module: str) -> list[str]:
    """``a.b.c`` -> ``["a.b", "a", ""]`` ("" is the top-level module)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, -1, -1)]


def _record_enclosing(side: LoadedSide, request: Request, module: str, call: int) -> dict[str, tuple[Any, Any]]:
    """The inputs of ``module``'s call ``call`` and of each ancestor's call that encloses it."""
    names = [module, *ancestors(module)]
    counters: dict[str, int] = {}
    open_calls: dict[str, list[int]] = {name: [] for name in names}
    pending: dict[tuple[str, int], tuple[Any, Any]] = {}
    kept: dict[str, tuple[Any, Any]] = {}
    enclosing: dict[str, int] = {}

    def make_hooks(name: str) -> tuple[Callable[..., None], Callable[..., None]]:
        def pre(_: Any, args: Any, kwargs: Any) -> None:
            number = counters.get(name, 0)
            counters[name] = number + 1
            open_calls[name].append(number)
            if name == module:
                if number == call:
                    kept[name] = (clone_tree(args), clone_tree(kwargs))
                    for ancestor in names[1:]:
                        if open_calls[ancestor]:
                            enclosing[ancestor] = open_calls[ancestor][-1]
                            key = (ancestor, enclosing[ancestor])
                            if key in pending:
                                kept[ancestor] = pending[key]
            else:
                pending[(name, number)] = (clone_tree(args), clone_tree(kwargs))

        def post(_: Any, __: Any, ___: Any) -> None:
            if open_calls[name]:
                number = open_calls[name].pop()
                pending.pop((name, number), None)

        return pre, post

    _forward_hooked(side, request, names, make_hooks)
    return kept



def _forward_hooked(side: LoadedSide, request: Request, names: Any, make_hooks: Any) -> None:
    """One forward of ``side`` on ``request`` with ``make_hooks(name)``'s pre- and post-hooks on
    each named module ("" is the whole model; a name the side lacks is skipped), removed after."""
    handles = []
    for name in names:
        try:
            target = side.submodule(name) if name else side.module
        except AttributeError:
            continue
        pre, post = make_hooks(name)
        handles.append(target.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(target.register_forward_hook(post))
    try:
        forward(side, request)
    finally:
        for handle in handles:
            handle.remove()


def error_entry(baseline: LoadedSide, candidate: LoadedSide, request: Request, module: str, call: int,
                tolerances: Tolerances, upstream: tuple[str, float] | None = None) -> ErrorEntry:
    """Climb from ``module`` (call ``call``, whose output diverged though no module's own error
    exceeds tolerance) to the first module whose inputs agree on both sides.

    Inputs that differ only below tolerance do not agree: the module passes on (and may
    amplify) a difference made before it. When a tap before ``module`` already shows an error
    (``upstream``: its name and relative L2 error, within tolerance), that is where the
    difference comes from and the climb stops there (no entry); else the difference is made
    between taps, in an ancestor's forward, and the climb goes on to the first ancestor whose
    inputs are the same on both sides."""
    recorded_b = _record_enclosing(baseline, request, module, call)
    recorded_c = _record_enclosing(candidate, request, module, call)
    steps: list[EntryStep] = []
    for name in [module, *ancestors(module)]:
        if name not in recorded_b or name not in recorded_c:
            continue  # never called (a container such as a ModuleList)
        target = baseline.submodule(name) if name else baseline.module
        differing, compared = compare_inputs(target, recorded_b[name], recorded_c[name], tolerances)
        below = None if differing else _input_error(recorded_b[name], recorded_c[name])
        note = f"its inputs differ below tolerance (relative L2 {below:.2g})" if below else ""
        steps.append(EntryStep(name, differing, compared, note))
        if not differing and not below:
            root = type(baseline.module).__name__ if name == "" else ""
            try:
                candidate_module = candidate.submodule(name) if name else candidate.module
            except AttributeError:
                return ErrorEntry(name, tuple(steps), root)
            trace, base_trace = traced(candidate_module, recorded_c[name], target, recorded_b[name])
            return ErrorEntry(name, tuple(steps), root, trace=trace, baseline_trace=base_trace)
        if below and upstream is not None:
            return ErrorEntry(None, tuple(steps), upstream=upstream)
    return ErrorEntry(None, tuple(steps))


def _named_inputs(module: Any, args: Any, kwargs: Any) -> dict[str, Any]:
    """A call's inputs by parameter name where the forward's signature binds them."""
    try:
        bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        named = {f"args[{i}]": a for i, a in enumerate(args)}
        named.update(kwargs)
        return named
    named = {}
    for key, value in bound.arguments.items():
        parameter = bound.signature.parameters[key]
        if parameter.kind is inspect.Parameter.VAR_KEYWORD and isinstance(value, Mapping):
            named.update(value)
        elif parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            named.update({f"{key}[{i}]": v for i, v in enumerate(value)})
        else:
            named[key] = value
    return named


def _leaves(args: Any, kwargs: Any, module: Any = None) -> dict[str, Any]:
    """Tensors, None and plain values inside a call's inputs, by a stable name; other objects
    (caches, configs) are left out."""
    import torch

    named = _named_inputs(module, args, kwargs) if module is not None else {
        **{f"args[{i}]": a for i, a in enumerate(args)}, **dict(kwargs)}
    leaves: dict[str, Any] = {}

    def walk(item: Any, name: str) -> None:
        if isinstance(item, torch.Tensor) or item is None or isinstance(item, (bool, int, float, str)):
            leaves[name] = item
        elif isinstance(item, Mapping):
            for key, sub in item.items():
                walk(sub, f"{name}[{key}]")
        elif isinstance(item, (tuple, list)):
            for index, sub in enumerate(item):
                walk(sub, f"{name}[{index}]")

    for key, value in named.items():
        walk(value, key)
    return leaves


def _is_float_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.is_floating_point()


def _rel_l2(base: torch.Tensor, cand: torch.Tensor) -> float:
    import math

    import torch

    b = base.detach().to(torch.float64)
    c = cand.detach().to(torch.float64)
    finite = torch.isfinite(b) & torch.isfinite(c)
    if not bool(finite.all()):
        return math.inf
    norm_b = float(b.norm())
    norm_d = float((c - b).norm())
    return norm_d / norm_b if norm_b > 0 else (0.0 if norm_d == 0 else math.inf)


def _describe(value: Any) -> str:
    import torch

    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor {list(value.shape)}"
    return repr(value)[:40]


def compare_inputs(module: Any, base: tuple[Any, Any], cand: tuple[Any, Any],
                   tolerances: Tolerances) -> tuple[tuple[InputDifference, ...], int]:
    """The inputs of one call that differ between the sides (tensors beyond tolerance, integer
    and boolean tensors and plain values exactly, a value against None), and how many were
    compared."""
    import torch

    base_leaves = _leaves(base[0], base[1], module)
    cand_leaves = _leaves(cand[0], cand[1], module)
    differing: list[InputDifference] = []
    names = list(dict.fromkeys([*base_leaves, *cand_leaves]))
    for name in names:
        b, c = base_leaves.get(name), cand_leaves.get(name)
        if b is None and c is None:
            continue
        if (b is None) != (c is None) or type(b) is not type(c):
            differing.append(InputDifference(name, f"{_describe(b)} in the baseline, {_describe(c)} in the candidate"))
            continue
        if isinstance(b, torch.Tensor):
            assert isinstance(c, torch.Tensor)
            if b.shape != c.shape:
                differing.append(InputDifference(name, f"{_describe(b)} in the baseline, {_describe(c)} in the candidate"))
            elif b.is_floating_point() and c.is_floating_point():
                tolerance = tolerances.for_tap(name, str(b.dtype).removeprefix("torch."))
                b64, c64 = b.detach().to(torch.float64), c.detach().to(torch.float64)
                outside = (c64 - b64).abs() > tolerance.atol + tolerance.rtol * b64.abs()
                outside |= torch.isnan(b64) != torch.isnan(c64)
                if bool(outside.any()):
                    differing.append(InputDifference(name, f"relative L2 error {_rel_l2(b, c):.3g}"))
            elif not torch.equal(b, c.to(b.dtype)):
                changed = int((b != c.to(b.dtype)).sum())
                differing.append(InputDifference(name, f"{changed} of {b.numel()} elements differ"))
        elif b != c:
            differing.append(InputDifference(name, f"{b!r} in the baseline, {c!r} in the candidate"))
    return tuple(differing), len(names)
