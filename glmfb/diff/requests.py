"""Request sets: one JSON object per line (docs/design.md, Requests).

Each request has a unique string ``id`` and one of ``input_ids`` (a list of ints), ``prompt``
(text, turned into ``input_ids`` by a tokenizer before the targets run:
:func:`glmfb.diff.prompts.tokenize_requests`), ``length``
(with optional ``seed`` and ``vocab``: token ids drawn deterministically) or ``tensors``
(``{"name": {"shape": [...], "dtype": "float32", "seed": 0}}``; a spec may add ``"narrow":
{"axis": 1, "length": 128}``, the tensor drawn at its shape and cut to its first 128 along axis
1). A tensor request may declare its sequence axis, ``"sequence_axis": 1`` (every tensor) or
``{"q": 1, "gate": 1}`` (by name): the axis the minimizer may shorten. Other fields pass
through to callable targets. A malformed line is an :class:`InputError` naming the file and
line.

A shortened request (:meth:`Request.shrink`) keeps its form: a ``length`` request stays a
``length`` request (the ids of a shorter length are the prefix of the longer one's), ``input_ids``
are sliced, and named tensors are narrowed along their declared sequence axis only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from glmfb.contract.errors import InputError
from glmfb.core.io import write_text_atomic

if TYPE_CHECKING:
    import torch

DEFAULT_VOCAB = 256
TENSOR_DTYPES = ("float64", "float32", "bfloat16", "float16", "int64", "int32")
# Elements one request may ask for (its token count, or its tensors' elements together): 2^28 is
# 1 GiB of float32, so a request and the copies a comparison makes fit in a 24 GB machine.
DEFAULT_MAX_ELEMENTS = 1 << 28
OFFSETS = "cu_seqlens"  # a packed request's sequence offsets, as varlen kernels name them


@dataclass(frozen=True)
class TensorSpec:
    """A named input tensor drawn from a seed: normal floats, or ints in [0, 1000); with
    ``narrow = (axis, n)``, drawn at ``shape`` and cut to its first ``n`` along ``axis``."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    seed: int = 0
    narrow: tuple[int, int] | None = None

    @property
    def final_shape(self) -> tuple[int, ...]:
        if self.narrow is None:
            return self.shape
        axis, length = self.narrow
        return tuple(length if i == axis else d for i, d in enumerate(self.shape))


class NotShrinkable(InputError):
    """A request that cannot be shortened in its own form (a named tensor with no declared
    sequence axis)."""


@dataclass(frozen=True)
class Request:
    """One request of a set. ``input_ids`` is set for token requests (given or drawn)."""

    id: str
    input_ids: tuple[int, ...] | None = None
    tensors: Mapping[str, TensorSpec] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict)
    sequence_axes: Mapping[str, int] = field(default_factory=dict)  # tensor name -> its sequence axis
    prompt: str | None = None  # a text request not yet tokenized (input_ids None until it is)

    def tokenized(self, ids: Sequence[int]) -> Request:
        """This text request as the token request a tokenizer made of it: its line keeps the
        prompt and gains the ids, so it reads back (a reproducer) without the tokenizer."""
        raw = {**self.raw, "input_ids": list(ids)}
        return Request(id=self.id, input_ids=tuple(ids), extra=self.extra, raw=raw)

    @property
    def length(self) -> int | None:
        """Sequence length: tokens; for tensors, the size along the declared sequence axis, else
        the leading non-batch dimension of the first tensor."""
        if self.input_ids is not None:
            return len(self.input_ids)
        for name, spec in self.tensors.items():
            shape = spec.final_shape
            if name in self.sequence_axes:
                return shape[self.sequence_axes[name]]
        for spec in self.tensors.values():
            dims = [d for d in spec.final_shape if d != 1] or list(spec.final_shape)
            return dims[0] if dims else None
        return None

    @property
    def offsets(self) -> tuple[int, ...] | None:
        """A packed request's sequence offsets (``cu_seqlens``: ``[0, 20, 150]`` is tokens 0-19
        and 20-149), None for one sequence."""
        value = self.raw.get(OFFSETS)
        return tuple(value) if isinstance(value, list) else None

    def prefix(self, length: int) -> Request:
        """This request cut to its first ``length`` tokens (token requests only), in its form."""
        if self.input_ids is None:
            raise InputError(f"request {self.id!r} has no input_ids to cut")
        return self.shrink(length)

    def axes(self, declared: Mapping[str, int] | int | None = None) -> dict[str, int]:
        """The sequence axis of each named tensor: the request's own declaration, else the
        target's (``declared``: one axis for every tensor, or by name)."""
        if self.sequence_axes:
            return dict(self.sequence_axes)
        if isinstance(declared, int) and not isinstance(declared, bool):
            return {name: declared for name, spec in self.tensors.items() if -len(spec.shape) <= declared < len(spec.shape)}
        if isinstance(declared, Mapping):
            return {str(k): int(v) for k, v in declared.items() if str(k) in self.tensors}
        return {}

    def shrinkable_length(self, declared: Mapping[str, int] | int | None = None) -> int:
        """The length :meth:`shrink` cuts: tokens, or the size along the sequence axes (every
        declared tensor must agree). Raises :class:`NotShrinkable`."""
        if self.input_ids is not None:
            return len(self.input_ids)
        axes = self.axes(declared)
        if not axes:
            raise NotShrinkable(
                f"request {self.id!r}: its named tensors declare no sequence axis, so it is not shortened",
                'add "sequence_axis": N to the request (or {"name": N, ...}), or glmfb_sequence_axis to the target',
            )
        sizes = {self.tensors[name].final_shape[axis] for name, axis in axes.items()}
        if len(sizes) != 1:
            raise NotShrinkable(f"request {self.id!r}: its tensors' sequence axes have different sizes ({sorted(sizes)})")
        return sizes.pop()

    def shrink(self, length: int, declared: Mapping[str, int] | int | None = None) -> Request:
        """This request shortened to ``length``, as a valid request of the same form: a
        ``length`` request with the new length (its drawn ids are the prefix of the longer
        draw), ``input_ids`` sliced, named tensors narrowed along their sequence axis only.
        Raises :class:`NotShrinkable`."""
        rid = f"{self.id}[:{length}]"
        if self.input_ids is not None:
            ids = self.input_ids[:length]
            raw: dict[str, Any] = {k: v for k, v in self.raw.items() if k not in ("length", "input_ids")}
            raw["id"] = rid
            if "length" in self.raw:
                seed, vocab = self.raw.get("seed", 0), self.raw.get("vocab", DEFAULT_VOCAB)
                if draw_ids(length, seed, vocab) == ids:
                    raw["length"] = length
                    return Request(id=rid, input_ids=ids, extra=self.extra, raw=_cut_offsets(raw, length))
            raw = {k: v for k, v in raw.items() if k not in ("seed", "vocab")}
            raw["input_ids"] = list(ids)
            return Request(id=rid, input_ids=ids, extra=self.extra, raw=_cut_offsets(raw, length))
        self.shrinkable_length(declared)
        axes = self.axes(declared)
        specs: dict[str, TensorSpec] = {}
        raw_specs: dict[str, Any] = {}
        for name, spec in self.tensors.items():
            raw_spec = dict(self.raw.get("tensors", {}).get(name, {}))
            if name in axes:
                axis = axes[name] % len(spec.shape)
                if spec.narrow is not None and spec.narrow[0] != axis:
                    raise NotShrinkable(f"request {self.id!r}: tensor {name!r} is already narrowed along another axis")
                spec = TensorSpec(spec.shape, spec.dtype, spec.seed, (axis, length))
                raw_spec["narrow"] = {"axis": axis, "length": length}
            specs[name] = spec
            raw_specs[name] = raw_spec
        raw = dict(self.raw)
        raw["id"] = rid
        raw["tensors"] = raw_specs
        return Request(id=rid, tensors=specs, extra=self.extra, raw=_cut_offsets(raw, length),
                       sequence_axes=self.sequence_axes)

    def to_json_line(self) -> str:
        return json.dumps(dict(self.raw), separators=(", ", ": "))

    # ---- materialization -------------------------------------------------------------------

    def input_tensor(self) -> torch.Tensor:
        import torch

        assert self.input_ids is not None
        return torch.tensor([list(self.input_ids)], dtype=torch.long)

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return {name: make_tensor(spec) for name, spec in self.tensors.items()}

    def module_inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Positional and keyword arguments of a module: ids as [1, L], tensors as kwargs."""
        args: tuple[Any, ...] = (self.input_tensor(),) if self.input_ids is not None else ()
        return args, self.named_tensors()

    def as_dict(self) -> dict[str, Any]:
        """What a callable target receives: the JSON object with tensors filled in."""
        data: dict[str, Any] = dict(self.raw)
        if self.input_ids is not None:
            data["input_ids"] = self.input_tensor()
        data.update(self.named_tensors())
        return data


def _cut_offsets(raw: dict[str, Any], length: int) -> dict[str, Any]:
    """A packed request's offsets cut at ``length``: the sequences before it, the one it cuts
    ending there."""
    offsets = raw.get(OFFSETS)
    if isinstance(offsets, list):
        raw[OFFSETS] = [o for o in offsets if o < length] + [length]
    return raw


def make_tensor(spec: TensorSpec) -> torch.Tensor:
    """The tensor a spec names, drawn directly in its dtype (no float64 copy on the way)."""
    import torch

    generator = torch.Generator().manual_seed(spec.seed)
    dtype = getattr(torch, spec.dtype)
    if dtype.is_floating_point:
        tensor = torch.randn(spec.shape, generator=generator, dtype=dtype)
    else:
        tensor = torch.randint(0, 1000, spec.shape, generator=generator, dtype=dtype)
    if spec.narrow is not None:
        axis, length = spec.narrow
        tensor = tensor.narrow(axis, 0, length).contiguous()
    return tensor


def draw_ids(length: int, seed: int, vocab: int) -> tuple[int, ...]:
    """Token ids drawn deterministically (same on every machine: a 64-bit LCG, no torch)."""
    state = (seed * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
    ids: list[int] = []
    for _ in range(length):
        state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        ids.append((state >> 33) % vocab)
    return tuple(ids)


def parse_request(data: Any, label: str, max_elements: int = DEFAULT_MAX_ELEMENTS) -> Request:
    """One request from a decoded JSON value; ``label`` names it in errors (file:line). Its
    size (tokens, or tensor elements) is checked against ``max_elements`` before anything is
    allocated. A packed request's offsets (``cu_seqlens``) must split its length."""
    from glmfb.diff.axes import check_offsets

    request = _parse_request(data, label, max_elements)
    if OFFSETS in request.raw:
        offsets = request.raw[OFFSETS]
        wrong = check_offsets(offsets, request.length) if isinstance(offsets, list) else "must be a list"
        if wrong is not None:
            raise InputError(f"{label}: request {request.id!r}: {OFFSETS} {wrong}",
                             f"{OFFSETS} lists where each packed sequence starts, then the total: [0, 20, 150]")
    return request


def _parse_request(data: Any, label: str, max_elements: int) -> Request:
    if not isinstance(data, dict):
        raise InputError(f"{label}: expected a JSON object, got {type(data).__name__}")
    rid = data.get("id")
    if not isinstance(rid, str) or not rid:
        raise InputError(f"{label}: needs a non-empty string 'id'")
    try:
        rid.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{label}: id {rid!r} is not valid Unicode (a lone surrogate)", "use plain text ids") from None
    kinds = [k for k in ("input_ids", "length", "tensors") if k in data]
    if not kinds and "prompt" in data:  # text; a prompt beside input_ids is the text they came from
        prompt = data["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise InputError(f"{label}: request {rid!r}: prompt must be non-empty text")
        _check_size(label, rid, len(prompt), max_elements)
        extra = {k: v for k, v in data.items() if k not in ("id", "prompt")}
        return Request(id=rid, extra=extra, raw=dict(data), prompt=prompt)
    if len(kinds) != 1:
        raise InputError(
            f"{label}: request {rid!r} needs exactly one of input_ids, prompt, length, tensors",
            f"got {', '.join(kinds) or 'none'}",
        )
    extra = {k: v for k, v in data.items()
             if k not in ("id", "input_ids", "length", "seed", "vocab", "tensors", "sequence_axis", "prompt")}
    if "input_ids" in data:
        ids = data["input_ids"]
        if not isinstance(ids, list) or not ids or not all(_is_int(i) and i >= 0 for i in ids):
            raise InputError(f"{label}: input_ids must be a non-empty list of non-negative ints")
        _check_size(label, rid, len(ids), max_elements)
        return Request(id=rid, input_ids=tuple(ids), extra=extra, raw=dict(data))
    if "length" in data:
        length, seed, vocab = data["length"], data.get("seed", 0), data.get("vocab", DEFAULT_VOCAB)
        for key, value, low in (("length", length, 1), ("seed", seed, 0), ("vocab", vocab, 1)):
            if not _is_int(value) or value < low:
                raise InputError(f"{label}: {key} must be an integer >= {low}, got {value!r}")
        _check_size(label, rid, length, max_elements)
        return Request(id=rid, input_ids=draw_ids(length, seed, vocab), extra=extra, raw=dict(data))
    specs = data["tensors"]
    if not isinstance(specs, dict) or not specs:
        raise InputError(f"{label}: tensors must be a non-empty object of name -> spec")
    tensors: dict[str, TensorSpec] = {}
    for name, spec in specs.items():
        where = f"{label}: tensors.{name}"
        if not isinstance(spec, dict) or not isinstance(spec.get("shape"), list):
            raise InputError(f"{where}: needs a 'shape' list")
        shape = spec["shape"]
        if not all(_is_int(d) and d >= 0 for d in shape):
            raise InputError(f"{where}: shape must hold non-negative ints, got {shape!r}")
        if any(d == 0 for d in shape):
            raise InputError(f"{where}: shape {shape!r} has no elements", "every dimension must be at least 1")
        dtype = spec.get("dtype", "float32")
        if dtype not in TENSOR_DTYPES:
            raise InputError(f"{where}: dtype {dtype!r} not supported", f"use one of {', '.join(TENSOR_DTYPES)}")
        seed = spec.get("seed", 0)
        if not _is_int(seed):
            raise InputError(f"{where}: seed must be an integer")
        tensors[name] = TensorSpec(tuple(shape), dtype, seed, _parse_narrow(spec.get("narrow"), shape, where))
    elements = sum(math.prod(spec.shape) for spec in tensors.values())
    _check_size(label, rid, elements, max_elements)
    axes = _parse_axes(data.get("sequence_axis"), tensors, label)
    return Request(id=rid, tensors=tensors, extra=extra, raw=dict(data), sequence_axes=axes)


def _parse_narrow(raw: Any, shape: Sequence[int], where: str) -> tuple[int, int] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"axis", "length"}:
        raise InputError(f"{where}: narrow must be {{\"axis\": A, \"length\": N}}")
    axis, length = raw["axis"], raw["length"]
    if not _is_int(axis) or not 0 <= axis < len(shape):
        raise InputError(f"{where}: narrow.axis must be an axis of shape {list(shape)}, got {axis!r}")
    if not _is_int(length) or not 1 <= length <= shape[axis]:
        raise InputError(f"{where}: narrow.length must be between 1 and {shape[axis]}, got {length!r}")
    return axis, length


def _parse_axes(raw: Any, tensors: Mapping[str, TensorSpec], label: str) -> dict[str, int]:
    if raw is None:
        return {}
    entries = {name: raw for name in tensors} if _is_int(raw) else raw
    if not isinstance(entries, dict):
        raise InputError(f"{label}: sequence_axis must be an axis (an integer) or {{\"name\": axis, ...}}")
    axes: dict[str, int] = {}
    for name, axis in entries.items():
        if name not in tensors:
            raise InputError(f"{label}: sequence_axis names {name!r}, which is not one of the request's tensors")
        rank = len(tensors[name].shape)
        if not _is_int(axis) or not -rank <= axis < rank:
            raise InputError(f"{label}: sequence_axis of {name!r} must be an axis of shape {list(tensors[name].shape)}")
        axes[name] = axis % rank
    return axes


def _check_size(label: str, rid: str, elements: int, max_elements: int) -> None:
    if elements > max_elements:
        raise InputError(
            f"{label}: request {rid!r} asks for {elements:,} elements, over the limit of {max_elements:,}",
            "make it smaller, or raise --max-elements (max_elements in a definition) if the machine has the memory",
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_requests(path: str | Path, max_elements: int = DEFAULT_MAX_ELEMENTS) -> list[Request]:
    """All requests of a JSONL file, ids unique; blank lines and ``#`` lines are skipped."""
    return read_jsonl_requests(path, lambda data, label: parse_request(data, label, max_elements))


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


R = TypeVar("R", bound=_HasId)


def read_jsonl_requests(path: str | Path, parse: Callable[[Any, str], R]) -> list[R]:
    """The requests of a JSONL file, each line parsed by ``parse(data, "file:line")`` (a model's
    requests, or a serving endpoint's: :func:`glmfb.diff.endpoint.read_serving_requests`); ids
    unique; blank lines and ``#`` lines skipped. Every problem is one :class:`InputError` line
    naming the file and the line."""
    file = Path(path)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"{file}: no such requests file", "give a JSONL file, one request per line") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{file}: cannot read: {exc}") from exc
    requests: list[R] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        label = f"{file}:{number}"
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{label}: not valid JSON: {exc.msg} at column {exc.colno}") from None
        except RecursionError:
            raise InputError(f"{label}: nested too deeply to be a request") from None
        request = parse(data, label)
        if request.id in seen:
            raise InputError(f"{label}: duplicate id {request.id!r} (first on line {seen[request.id]})")
        seen[request.id] = number
        requests.append(request)
    if not requests:
        raise InputError(f"{file}: no requests", "write one JSON object per line")
    return requests


def write_requests(path: str | Path, requests: Sequence[Request]) -> None:
    """Write requests as JSONL, atomically."""
    write_text_atomic(path, "".join(r.to_json_line() + "\n" for r in requests))
