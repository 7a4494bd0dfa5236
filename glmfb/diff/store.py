"""Capture directories: one safetensors file per tap call, and a versioned ``manifest.json``.

Layout::

    DIR/manifest.json                      schema "glmfb.capture/1"
    DIR/r0000/00000.safetensors            request 0, first tap call (its flattened outputs)
    DIR/r0000/00001.safetensors            ...

Each tap call is written when it happens (never held for the run), through a temporary name
and a rename; the manifest is rewritten atomically after every request, with ``complete``
false until the last one. Nothing is ever unpickled: tensor files are safetensors, whose
header this module parses itself so that tensors can be read in chunks into preallocated
buffers (bounded memory, no mmap of whole files).

Format history: ``glmfb.capture/1``: first version.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import stat
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from glmfb.errors import InputError
from glmfb.io import write_json_atomic
from glmfb.verdict import to_json_value

if TYPE_CHECKING:
    import torch

CAPTURE_SCHEMA = "glmfb.capture/1"
MANIFEST = "manifest.json"

# safetensors dtype tags -> (torch dtype name, bytes per element)
SAFETENSORS_DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "BF16": ("bfloat16", 2),
    "F16": ("float16", 2),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TapRecord:
    """One captured tensor: which module call produced it and where it is stored."""

    name: str  # stable tap name, e.g. "model.layers.1.mlp.down_proj" or "output.logits"
    module: str  # the module (or "output" for final outputs)
    call: int  # 0 for the first call of the module in this request, 1 for the second, ...
    file: str  # relative to the capture directory
    key: str  # tensor name inside the safetensors file
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "module": self.module, "call": self.call, "file": self.file,
            "key": self.key, "shape": list(self.shape), "dtype": self.dtype,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TapRecord:
        return cls(
            name=str(data["name"]), module=str(data["module"]), call=int(data["call"]),
            file=str(data["file"]), key=str(data["key"]),
            shape=tuple(int(d) for d in data["shape"]), dtype=str(data["dtype"]),
        )

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True)
class RequestRecord:
    id: str
    length: int | None
    taps: tuple[TapRecord, ...]
    skipped: tuple[str, ...] = ()  # outputs that were not tensors (None, ints, caches, ...)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "length": self.length, "taps": [t.to_dict() for t in self.taps],
            "skipped": list(self.skipped),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RequestRecord:
        return cls(
            id=str(data["id"]), length=data.get("length"),
            taps=tuple(TapRecord.from_dict(t) for t in data["taps"]),
            skipped=tuple(data.get("skipped", ())),
        )


@dataclass(frozen=True)
class Manifest:
    target: str
    args: Mapping[str, Any]
    kind: str  # "module" or "callable"
    tap_globs: tuple[str, ...]
    requests: tuple[RequestRecord, ...]
    env: Mapping[str, Any] = field(default_factory=dict)
    git: str | None = None
    created: str = ""
    complete: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": CAPTURE_SCHEMA,
            "target": self.target,
            "args": to_json_value(dict(self.args)),  # NaN or Inf arguments as strings
            "kind": self.kind,
            "tap_globs": list(self.tap_globs),
            "created": self.created,
            "complete": self.complete,
            "git": self.git,
            "env": to_json_value(dict(self.env)),
            "request_ids": [r.id for r in self.requests],
            "taps": tap_order(self.requests),
            "requests": [r.to_dict() for r in self.requests],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        return cls(
            target=str(data.get("target", "")),
            args=dict(data.get("args") or {}),
            kind=str(data.get("kind", "module")),
            tap_globs=tuple(data.get("tap_globs") or ()),
            requests=tuple(RequestRecord.from_dict(r) for r in data["requests"]),
            env=dict(data.get("env") or {}),
            git=data.get("git"),
            created=str(data.get("created", "")),
            complete=bool(data.get("complete", True)),
        )


def call_counts(calls: Iterable[tuple[str, int]]) -> dict[str, int]:
    """How many times each module was called in one request."""
    counts: dict[str, int] = {}
    for module, call in calls:
        counts[module] = max(counts.get(module, 0), call + 1)
    return counts


def tap_name(module: str, call: int, counts: Mapping[str, int], part: str) -> str:
    """The stable name of a flattened output ``part`` (which starts with the module name):
    ``mod[0]``, or ``mod#1[0]`` when the module ran more than once in the request."""
    suffix = part[len(module):]
    if counts.get(module, 1) > 1:
        return f"{module}#{call}{suffix}"
    return f"{module}{suffix}"


def tap_order(requests: Sequence[RequestRecord]) -> list[str]:
    """Every tap name, in execution order of the first request that has it."""
    seen: dict[str, None] = {}
    for request in requests:
        for tap in request.taps:
            seen.setdefault(tap.name, None)
    return list(seen)


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


class CaptureWriter:
    """Writes a capture directory as tensors are produced."""

    def __init__(self, directory: Path, *, target: str, args: Mapping[str, Any], kind: str,
                 tap_globs: Sequence[str], env: Mapping[str, Any], git: str | None, created: str,
                 force: bool = False) -> None:
        """Tensors go to a hidden ``.<name>.partial-<pid>`` folder beside ``directory``, which
        :meth:`finish` renames to ``directory``: a capture that was cut short never looks like
        one. An existing ``directory`` is refused unless ``force`` (then replaced whole)."""
        self.final = directory
        if directory.exists() or directory.is_symlink():
            if not force:
                raise InputError(f"{directory} already exists",
                                 "give a new --out folder, or --force to replace it whole")
            if not (directory / MANIFEST).is_file() and any(directory.iterdir()):
                raise InputError(f"{directory} exists and is not a capture directory; glmfb will not replace it",
                                 "give a new --out folder")
        self.force = force
        directory.parent.mkdir(parents=True, exist_ok=True)
        self.directory = directory.parent / f".{directory.name}.partial-{os.getpid()}"
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir()
        self._meta = dict(target=target, args=dict(args), kind=kind, tap_globs=tuple(tap_globs),
                          env=dict(env), git=git, created=created)
        self._requests: list[RequestRecord] = []
        self._current: list[tuple[str, int, str, str, str, tuple[int, ...], str]] = []
        self._request_dir = ""
        self._calls = 0

    def begin_request(self) -> None:
        self._request_dir = f"r{len(self._requests):04d}"
        (self.directory / self._request_dir).mkdir(exist_ok=True)
        self._current = []
        self._calls = 0

    def write_call(self, module: str, call: int, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Store the flattened outputs of one module call: ``[(tap name, tensor), ...]``."""
        from safetensors.torch import save_file

        if not tensors:
            return
        relative = f"{self._request_dir}/{self._calls:05d}.safetensors"
        self._calls += 1
        payload: dict[str, torch.Tensor] = {}
        pointers: set[int] = set()
        for index, (name, tensor) in enumerate(tensors):
            stored = tensor.detach().to("cpu").contiguous()
            if stored.data_ptr() in pointers or stored is tensor:
                stored = stored.clone()
            pointers.add(stored.data_ptr())
            key = f"t{index}"
            payload[key] = stored
            self._current.append((module, call, name, relative, key, tuple(stored.shape),
                                  str(stored.dtype).removeprefix("torch.")))
        path = self.directory / relative
        temporary = path.with_name(f".{path.name}.tmp")
        save_file(payload, str(temporary))
        os.replace(temporary, path)

    def end_request(self, request_id: str, length: int | None, skipped: Sequence[str]) -> None:
        counts = call_counts((module, call) for module, call, *_ in self._current)
        taps = tuple(
            TapRecord(tap_name(module, call, counts, part), module, call, relative, key, shape, dtype)
            for module, call, part, relative, key, shape, dtype in self._current
        )
        self._requests.append(RequestRecord(request_id, length, taps, tuple(skipped)))
        self._current = []
        self._save(complete=False)

    def finish(self) -> Manifest:
        """Mark the capture complete and move it into place in one rename."""
        manifest = self._save(complete=True)
        if self.final.exists() or self.final.is_symlink():
            if self.final.is_symlink() or not self.final.is_dir():
                self.final.unlink()
            else:
                shutil.rmtree(self.final)
        os.replace(self.directory, self.final)
        self.directory = self.final
        return manifest

    def abandon(self) -> None:
        """Remove what was written (a capture that failed half-way)."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def _save(self, complete: bool) -> Manifest:
        manifest = Manifest(requests=tuple(self._requests), complete=complete, **self._meta)  # type: ignore[arg-type]
        write_json_atomic(self.directory / MANIFEST, manifest.to_dict())
        return manifest


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorLocation:
    """Where the raw bytes of one stored tensor are: file, byte offset, length, dtype, shape."""

    path: Path
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def itemsize(self) -> int:
        return next(size for name, size in SAFETENSORS_DTYPES.values() if name == self.dtype)


def _check_regular(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: tensor file missing from the capture") from None
    if stat.S_ISLNK(info.st_mode):
        raise InputError(f"{path}: a symlink inside the capture; glmfb does not follow it", "capture again")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{path}: not a regular file", "a capture holds only regular files; capture again")


def read_safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header of a safetensors file and the offset where its data starts; checks that
    every tensor's bytes lie inside the file (a truncated file is an :class:`InputError`)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise InputError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (header_bytes,) = struct.unpack("<Q", prefix)
            if header_bytes > MAX_HEADER_BYTES or 8 + header_bytes > size:
                raise InputError(f"{path}: truncated or corrupt safetensors file (header of {header_bytes} bytes, file of {size})")
            header = json.loads(handle.read(header_bytes))
    except FileNotFoundError:
        raise InputError(f"{path}: tensor file missing from the capture") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputError(f"{path}: corrupt safetensors header") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: corrupt safetensors header")
    data_start = 8 + header_bytes
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path}: corrupt safetensors header entry {key!r}") from None
        if data_start + end > size:
            raise InputError(
                f"{path}: truncated safetensors file: tensor {key!r} needs bytes up to "
                f"{data_start + end}, the file has {size}",
                "capture again; the file was cut short",
            )
        if begin > end:
            raise InputError(f"{path}: corrupt safetensors header entry {key!r}")
    return header, data_start


class CaptureReader:
    """A capture directory opened for reading; checks the manifest when opened."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        path = self.directory / MANIFEST
        if not self.directory.is_dir():
            raise InputError(f"{self.directory}: no such capture directory")
        if not path.is_file():
            raise InputError(
                f"{self.directory}: no {MANIFEST}; not a capture directory",
                "make one with glmfb capture TARGET --requests FILE --out DIR",
            )
        _check_regular(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{path}: not valid JSON ({exc})") from None
        schema = data.get("schema") if isinstance(data, dict) else None
        if schema != CAPTURE_SCHEMA:
            raise InputError(
                f"{path}: unknown capture schema {schema!r} (this glmfb reads {CAPTURE_SCHEMA})",
                "capture again with this version of glmfb",
            )
        try:
            self.manifest = Manifest.from_dict(data)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{path}: malformed manifest ({type(exc).__name__}: {exc})") from None
        if not self.manifest.complete:
            raise InputError(f"{self.directory}: the capture is incomplete (it was cut short: interrupted, or the "
                             "target failed half-way)", "capture again")
        for request in self.manifest.requests:
            for tap in request.taps:
                self._inside(tap.file)
        self._headers: dict[str, tuple[dict[str, Any], int]] = {}

    def _inside(self, relative: str) -> Path:
        """A file the manifest names, confined to the capture folder: relative, no ``..``,
        no symlink on the way, a regular file (a FIFO would hang the reader)."""
        rel = Path(relative)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise InputError(f"{self.directory}/{MANIFEST}: file {relative!r} lies outside the capture folder",
                             "a manifest names files inside its own folder; capture again")
        current = self.directory
        for part in rel.parts:
            current = current / part
            if current.is_symlink():
                raise InputError(f"{current}: a symlink inside the capture; glmfb does not follow it", "capture again")
        return current

    @property
    def requests(self) -> tuple[RequestRecord, ...]:
        return self.manifest.requests

    def select(self, globs: Sequence[str], keep: str) -> None:
        """Keep only taps of modules matching a glob (and those of module ``keep``)."""
        if not globs:
            return
        requests = tuple(
            replace(r, taps=tuple(t for t in r.taps if t.module == keep or any(fnmatch.fnmatchcase(t.module, g) for g in globs)))
            for r in self.manifest.requests
        )
        self.manifest = replace(self.manifest, requests=requests)

    def locate(self, tap: TapRecord) -> TensorLocation:
        if tap.file not in self._headers:
            if len(self._headers) > 256:
                self._headers.clear()
            path = self._inside(tap.file)
            _check_regular(path)
            self._headers[tap.file] = read_safetensors_header(path)
        header, data_start = self._headers[tap.file]
        entry = header.get(tap.key)
        if entry is None:
            raise InputError(f"{self.directory / tap.file}: tensor {tap.key!r} of tap {tap.name!r} missing")
        dtype = SAFETENSORS_DTYPES.get(entry.get("dtype", ""), ("?", 0))[0]
        shape = tuple(int(d) for d in entry.get("shape", ()))
        if dtype != tap.dtype or shape != tap.shape:
            raise InputError(f"{self.directory / tap.file}: tensor of tap {tap.name!r} does not match the manifest")
        begin, end = (int(x) for x in entry["data_offsets"])
        location = TensorLocation(self.directory / tap.file, data_start + begin, end - begin, dtype, shape)
        if location.nbytes != tap.numel * location.itemsize:
            raise InputError(f"{location.path}: tensor {tap.key!r} has {location.nbytes} bytes, expected {tap.numel * location.itemsize}")
        return location

    def load(self, tap: TapRecord) -> torch.Tensor:
        """A whole tensor in memory (used for the few tensors analysed per position)."""
        import torch

        location = self.locate(tap)
        raw = torch.empty(location.nbytes, dtype=torch.uint8)
        with open(location.path, "rb") as handle:
            handle.seek(location.offset)
            read_exact(handle, raw, location.nbytes)
        return raw.view(getattr(torch, location.dtype)).reshape(location.shape)


class Readable(Protocol):
    def readinto(self, buffer: Any, /) -> int | None: ...


def read_exact(handle: Readable, buffer: torch.Tensor, nbytes: int) -> None:
    """Fill the first ``nbytes`` of a uint8 tensor from ``handle`` (no intermediate copy)."""
    view = buffer.numpy().data.cast("B")[:nbytes]
    done = 0
    while done < nbytes:
        got = handle.readinto(view[done:])
        if not got:
            raise InputError(f"{getattr(handle, 'name', 'tensor file')}: truncated (ended early)")
        done += got
