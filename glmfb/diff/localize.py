"""Live mode: separate the error a module adds by itself from the error it inherits.

For each suspect module call (the taps that diverged, in execution order), the baseline is
run again with a forward pre-hook that keeps the call's inputs (positional and keyword) and a
forward hook that keeps its output. The candidate's module of the same name is then called on
the baseline's inputs; the difference between its output and the baseline's output is the
module's *local* error. The first module whose local error exceeds tolerance is where the
error starts; a module whose output differs only because its inputs did has local error zero.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from glmfb.diff.capture import LoadedSide, flatten, forward
from glmfb.diff.metrics import (
    PairComparer,
    PositionErrors,
    TensorMetrics,
    Tolerances,
    position_dim,
    position_errors,
    typical_relative_error,
)
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

    @property
    def failed(self) -> bool:
        return self.metrics is not None and self.metrics.failed


def _clone_tree(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_clone_tree(v) for v in value)
    if isinstance(value, list):
        return [_clone_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: _clone_tree(v) for k, v in value.items()}
    return value


def record_calls(side: LoadedSide, request: Request, wanted: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[Any, Any, Any]]:
    """Run ``request`` and keep (args, kwargs, output) of the wanted module calls."""
    wanted_set = set(wanted)
    kept: dict[tuple[str, int], tuple[Any, Any, Any]] = {}
    inputs: dict[tuple[str, int], tuple[Any, Any]] = {}
    counters: dict[str, int] = {}
    handles = []

    def make_hooks(name: str) -> tuple[Callable[..., None], Callable[..., None]]:
        def pre(module: Any, args: Any, kwargs: Any) -> None:
            call = counters.get(name, 0)
            counters[name] = call + 1
            if (name, call) in wanted_set:
                inputs[(name, call)] = (_clone_tree(args), _clone_tree(kwargs))

        def post(module: Any, args: Any, output: Any) -> None:
            key = (name, counters.get(name, 1) - 1)
            if key in inputs:
                kept[key] = (*inputs.pop(key), _clone_tree(output))

        return pre, post

    for name in {module for module, _ in wanted}:
        try:
            module = side.submodule(name)
        except AttributeError:
            continue
        pre, post = make_hooks(name)
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post))
    try:
        forward(side, request)
    finally:
        for handle in handles:
            handle.remove()
    return kept


def local_errors(baseline: LoadedSide, candidate: LoadedSide, request: Request,
                 suspects: Sequence[tuple[str, int, int]], tolerances: Tolerances,
                 comparer: PairComparer) -> list[LocalError]:
    """Local error of each suspect ``(module, call, calls of that module in the request)``."""
    import torch

    recorded = record_calls(baseline, request, [(m, c) for m, c, _ in suspects])
    results: list[LocalError] = []
    for module_name, call, calls in suspects:
        counts = {module_name: calls}
        name = tap_name(module_name, call, counts, module_name)
        if (module_name, call) not in recorded:
            results.append(LocalError(module_name, call, name, None, None, "the baseline did not call it"))
            continue
        args, kwargs, base_output = recorded[(module_name, call)]
        try:
            module = candidate.submodule(module_name)
        except AttributeError:
            results.append(LocalError(module_name, call, name, None, None, "no such module in the candidate"))
            continue
        try:
            with torch.no_grad():
                cand_output = module(*args, **kwargs)
        except (Exception, SystemExit) as exc:
            detail = str(exc).strip().splitlines()
            note = f"run in isolation, it raised {type(exc).__name__}" + (f": {detail[0]}" if detail else "")
            results.append(LocalError(module_name, call, name, None, None, note))
            continue
        base_parts = dict(flatten(base_output, module_name)[0])
        cand_parts = dict(flatten(cand_output, module_name)[0])
        worst: tuple[str, TensorMetrics, torch.Tensor, torch.Tensor] | None = None
        for part, base_tensor in base_parts.items():
            cand_tensor = cand_parts.get(part)
            if cand_tensor is None or cand_tensor.shape != base_tensor.shape:
                continue
            dtype = str(base_tensor.dtype).removeprefix("torch.")
            part_tap = tap_name(module_name, call, counts, part)
            metrics = comparer.compare_tensors(base_tensor, cand_tensor, tolerances.for_tap(part_tap, dtype))
            if worst is None or (metrics.failed, metrics.rel_l2) > (worst[1].failed, worst[1].rel_l2):
                worst = (part_tap, metrics, base_tensor, cand_tensor)
        if worst is None:
            results.append(LocalError(module_name, call, name, None, None, "no comparable tensor output"))
            continue
        part_tap, metrics, base_tensor, cand_tensor = worst
        dim = position_dim(tuple(base_tensor.shape), request.length)
        positions = None
        if dim is not None:
            tolerance = tolerances.for_tap(part_tap, str(base_tensor.dtype).removeprefix("torch."))
            positions = position_errors(base_tensor, cand_tensor, dim, tolerance)
        typical = typical_relative_error(base_tensor, cand_tensor, dim)
        results.append(LocalError(module_name, call, part_tap, metrics, positions, typical_relative=typical))
    return results
