"""Running a diff target over requests, recording module outputs with forward hooks.

A diff target is a factory returning a ``torch.nn.Module`` (called with the request's inputs;
every named submodule is a tap, narrowed by ``--tap`` globs) or a callable
``g(request) -> Tensor | tuple | dict`` (only its outputs are recorded). Outputs are flattened
with stable names: ``name`` for a tensor, ``name[0]`` for a tuple item, ``name[key]`` for a
mapping or dataclass field (a Hugging Face ``ModelOutput`` is a mapping); a module called
several times in one forward gets ``name#0``, ``name#1``, ... Final outputs are tapped as
``output``. Values that are not tensors are skipped and listed.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from glmfb.contract.errors import InputError, TargetFailed
from glmfb.core.targets import Target
from glmfb.diff.requests import Request
from glmfb.diff.store import call_counts, tap_name

if TYPE_CHECKING:
    import torch

OUTPUT = "output"


@dataclass
class LoadedSide:
    """A diff target, built: a module or a plain callable."""

    target: Target
    obj: Any
    kind: str  # "module" or "callable"
    label: str = "target"  # which side it is: "baseline", "candidate" or "target"
    names: dict[int, str] = field(default_factory=dict)  # id(module) -> qualified name

    @property
    def module(self) -> torch.nn.Module:
        return self.obj

    def submodule(self, name: str) -> torch.nn.Module:
        return self.module.get_submodule(name)


def load_side(target: Target, label: str = "target") -> LoadedSide:
    """Call the factory; a module is put in eval mode. Raises :class:`TargetFailed`."""
    import torch

    factory = target.load()
    try:
        obj = factory(**dict(target.args))
    except (Exception, SystemExit) as exc:  # a target that exits is a failed target
        raise TargetFailed(label, f"in its factory {target.ref}", exc) from exc
    if isinstance(obj, torch.nn.Module):
        obj.eval()
        names = {id(module): name for name, module in obj.named_modules()}
        return LoadedSide(target, obj, "module", label, names)
    if not callable(obj):
        raise InputError(
            f"diff target {target.ref} returned a {type(obj).__name__}",
            "a diff factory returns a torch.nn.Module or a callable taking the request",
        )
    return LoadedSide(target, obj, "callable", label=label)


def flatten(value: Any, prefix: str) -> tuple[list[tuple[str, torch.Tensor]], list[str]]:
    """Tensors inside an output with stable names, and the names of non-tensor leaves."""
    import torch

    tensors: list[tuple[str, torch.Tensor]] = []
    skipped: list[str] = []

    def walk(item: Any, name: str) -> None:
        if isinstance(item, torch.Tensor):
            tensors.append((name, item))
        elif isinstance(item, Mapping):
            for key, sub in item.items():
                walk(sub, f"{name}[{key}]")
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            for spec in dataclasses.fields(item):
                walk(getattr(item, spec.name), f"{name}[{spec.name}]")
        elif isinstance(item, (tuple, list)):
            for index, sub in enumerate(item):
                walk(sub, f"{name}[{index}]")
        elif item is not None:
            skipped.append(name)

    walk(value, prefix)
    return tensors, skipped


class Sink(Protocol):
    def begin_request(self) -> None: ...
    def write_call(self, module: str, call: int, tensors: Sequence[tuple[str, torch.Tensor]]) -> None: ...
    def end_request(self, request_id: str, length: int | None, skipped: Sequence[str],
                    offsets: Sequence[int] | None = None) -> None: ...


class MemorySink:
    """Keeps the taps of the last request in memory (live localization, minimizer)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, list[tuple[str, torch.Tensor]]]] = []

    def begin_request(self) -> None:
        self.calls = []

    def write_call(self, module: str, call: int, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        self.calls.append((module, call, [(n, t.detach().clone()) for n, t in tensors]))

    def end_request(self, request_id: str, length: int | None, skipped: Sequence[str],
                    offsets: Sequence[int] | None = None) -> None:
        pass

    def tensors(self) -> dict[str, torch.Tensor]:
        """Tap name -> tensor, named as in a capture directory."""
        counts = call_counts((module, call) for module, call, _ in self.calls)
        result: dict[str, torch.Tensor] = {}
        for module, call, parts in self.calls:
            for suffix_name, tensor in parts:
                result[tap_name(module, call, counts, suffix_name)] = tensor
        return result


def select_modules(side: LoadedSide, globs: Sequence[str]) -> list[tuple[str, torch.nn.Module]]:
    """Named submodules to tap (the root is the final output, tapped anyway)."""
    if side.kind != "module":
        return []
    return select_submodules(side.module, globs, side.target.ref)


def select_submodules(root: torch.nn.Module, globs: Sequence[str], what: str,
                      option: str = "--tap") -> list[tuple[str, torch.nn.Module]]:
    """The named submodules of ``root`` that a glob matches (all of them for no glob); none
    matched by a glob is an :class:`InputError` naming ``option`` and ``what`` the root is."""
    chosen = [
        (name, module) for name, module in root.named_modules()
        if name and (not globs or any(fnmatch.fnmatchcase(name, g) for g in globs))
    ]
    if globs and not chosen:
        sample = ", ".join(n for n, _ in list(root.named_modules())[1:6])
        raise InputError(f"{option} {' '.join(globs)} matches no module of {what}", f"modules look like: {sample}")
    return chosen


@contextmanager
def hooks(side: LoadedSide, globs: Sequence[str], sink: Sink) -> Iterator[dict[str, int]]:
    """Forward hooks on the selected modules for the duration of the block; yields the
    per-module call counters (reset them before each request)."""
    with module_hooks(select_modules(side, globs), sink) as counters:
        yield counters


@contextmanager
def module_hooks(modules: Sequence[tuple[str, torch.nn.Module]], sink: Sink) -> Iterator[dict[str, int]]:
    """Forward hooks on named modules, each call's flattened outputs written to ``sink`` as
    ``(name, call)``, for the duration of the block; yields the per-module call counters."""
    counters: dict[str, int] = {}
    handles = []

    def make_hook(name: str) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            call = counters.get(name, 0)
            counters[name] = call + 1
            tensors, _ = flatten(output, name)
            sink.write_call(name, call, tensors)

        return hook

    for name, module in modules:
        handles.append(module.register_forward_hook(make_hook(name)))
    try:
        yield counters
    finally:
        for handle in handles:
            handle.remove()


def forward(side: LoadedSide, request: Request) -> Any:
    """Run one request through the target (no autograd). Raises :class:`TargetFailed`."""
    import torch

    with torch.no_grad():
        try:
            if side.kind == "module":
                args, kwargs = request.module_inputs()
                return side.module(*args, **kwargs)
            return side.obj(request.as_dict())
        except (Exception, SystemExit) as exc:
            raise TargetFailed(side.label, f"({side.target.ref}) on request {request.id!r}", exc) from exc


def run_requests(side: LoadedSide, requests: Sequence[Request], globs: Sequence[str], sink: Sink,
                 progress: Callable[[str], None] | None = None, label: str = "") -> None:
    """Run every request through the target, recording taps and final outputs into ``sink``."""
    with hooks(side, globs, sink) as counters:
        for index, request in enumerate(requests):
            if progress is not None:
                progress(f"{label}request {index + 1}/{len(requests)}: {request.id}")
            counters.clear()
            sink.begin_request()
            output = forward(side, request)
            tensors, skipped = flatten(output, OUTPUT)
            if not tensors:
                raise TargetFailed(
                    side.label, f"({side.target.ref}) on request {request.id!r}",
                    TypeError(f"it returned {type(output).__name__} with no tensor in it"),
                )
            sink.write_call(OUTPUT, 0, tensors)
            sink.end_request(request.id, request.length, skipped, request.offsets)
