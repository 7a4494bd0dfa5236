"""Request sets: one JSON object per line (docs/design.md, Requests).

Each request has a unique string ``id`` and one of ``input_ids`` (a list of ints), ``length``
(with optional ``seed`` and ``vocab``: token ids drawn deterministically) or ``tensors``
(``{"name": {"shape": [...], "dtype": "float32", "seed": 0}}``). Other fields pass through to
callable targets. A malformed line is an :class:`InputError` naming the file and line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.errors import InputError
from glmfb.io import write_text_atomic

if TYPE_CHECKING:
    import torch

DEFAULT_VOCAB = 256
TENSOR_DTYPES = ("float64", "float32", "bfloat16", "float16", "int64", "int32")
# Elements one request may ask for (its token count, or its tensors' elements together): 2^28 is
# 1 GiB of float32, so a request and the copies a comparison makes fit in a 24 GB machine.
DEFAULT_MAX_ELEMENTS = 1 << 28


@dataclass(frozen=True)
class TensorSpec:
    """A named input tensor drawn from a seed: normal floats, or ints in [0, 1000)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    seed: int = 0


@dataclass(frozen=True)
class Request:
    """One request of a set. ``input_ids`` is set for token requests (given or drawn)."""

    id: str
    input_ids: tuple[int, ...] | None = None
    tensors: Mapping[str, TensorSpec] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def length(self) -> int | None:
        """Sequence length: tokens, or the leading non-batch dimension of the first tensor."""
        if self.input_ids is not None:
            return len(self.input_ids)
        for spec in self.tensors.values():
            dims = [d for d in spec.shape if d != 1] or list(spec.shape)
            return dims[0] if dims else None
        return None

    def prefix(self, length: int) -> Request:
        """This request cut to its first ``length`` tokens (token requests only)."""
        if self.input_ids is None:
            raise InputError(f"request {self.id!r} has no input_ids to cut")
        ids = self.input_ids[:length]
        raw = {k: v for k, v in self.raw.items() if k not in ("length", "seed", "vocab")}
        raw["id"] = f"{self.id}[:{length}]"
        raw["input_ids"] = list(ids)
        return Request(id=raw["id"], input_ids=ids, extra=self.extra, raw=raw)

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


def make_tensor(spec: TensorSpec) -> torch.Tensor:
    """The tensor a spec names, drawn directly in its dtype (no float64 copy on the way)."""
    import torch

    generator = torch.Generator().manual_seed(spec.seed)
    dtype = getattr(torch, spec.dtype)
    if dtype.is_floating_point:
        return torch.randn(spec.shape, generator=generator, dtype=dtype)
    return torch.randint(0, 1000, spec.shape, generator=generator, dtype=dtype)


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
    allocated."""
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
    if len(kinds) != 1:
        raise InputError(
            f"{label}: request {rid!r} needs exactly one of input_ids, length, tensors",
            f"got {', '.join(kinds) or 'none'}",
        )
    extra = {k: v for k, v in data.items() if k not in ("id", "input_ids", "length", "seed", "vocab", "tensors")}
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
        tensors[name] = TensorSpec(tuple(shape), dtype, seed)
    elements = sum(math.prod(spec.shape) for spec in tensors.values())
    _check_size(label, rid, elements, max_elements)
    return Request(id=rid, tensors=tensors, extra=extra, raw=dict(data))


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
    file = Path(path)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"{file}: no such requests file", "give a JSONL file, one request per line") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{file}: cannot read: {exc}") from exc
    requests: list[Request] = []
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
        request = parse_request(data, label, max_elements)
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
