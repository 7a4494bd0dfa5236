"""Capture directories: one safetensors file per tap call, and a versioned ``manifest.json``.

Layout::

    DIR/manifest.json                      schema "glmfb.capture/1"
    DIR/r0000/00000.safetensors            request 0, first tap call (its flattened outputs)
    DIR/r0000/00001.safetensors            ...

Each tap call is written when it happens (never held for the run), through a temporary name
and a rename. The manifest is written twice, atomically each time: when the capture begins
(``complete`` false, no request) and when it ends (``complete`` true, every request). In
between, each finished request is appended as one JSON line to ``manifest.index.jsonl``
(removed when the capture completes), so that writing N requests costs O(N): rewriting the
whole manifest after every request cost O(N^2) (1,600 requests took 70 s, 100,000 did not
finish). A capture cut short (the process killed) reads as its requests completed so far, with
``complete`` false, as before: :func:`read_manifest` takes them from the index. Nothing is
ever unpickled: tensor files are safetensors, whose header this module parses itself so that
tensors can be read in chunks into preallocated buffers (bounded memory, no mmap of whole
files).

Format history: ``glmfb.capture/1``: first version. Later additions, all optional (a reader
of the first version ignores them and a single-process capture writes none of them): the
manifest's ``distributed`` (``world_size``, ``backend``, the per-rank capture directories, and
for a rank's own capture its ``rank`` and the layouts its target declared) and a tap's
``layout`` (how an unsharded tap was put together from the ranks: see
:mod:`glmfb.diff.distributed`); for a capture recorded inside a running process
(:mod:`glmfb.diff.live`), the manifest's ``live`` (pid, command line, versions, bytes written,
why recording stopped) and a tap's ``step`` (0 the prefill, 1, 2, ... the decode steps). The text layout changed without changing the format: the final
manifest holds each request on one line (compact JSON) instead of indenting every field; any
JSON reader reads both. While a capture is being written its manifest lists no request and
``manifest.index.jsonl`` holds them; a reader of the first version sees such a capture as
incomplete (which it is) and refuses it, as it refused one cut short before.
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
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from glmfb.contract.errors import InputError
from glmfb.contract.verdict import to_json_value
from glmfb.core.io import atomic_writer

if TYPE_CHECKING:
    import torch

CAPTURE_SCHEMA = "glmfb.capture/1"
MANIFEST = "manifest.json"
INDEX = "manifest.index.jsonl"  # the requests finished so far, while a capture is written

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


@dataclass(frozen=True, slots=True)
class TapRecord:
    """One captured tensor: which module call produced it and where it is stored.

    Slotted, since a reader holds one per tap of every request at once: with the shared
    strings of :meth:`from_dict`, 100,000 requests of two taps take 63 MiB (128 before)."""

    name: str  # stable tap name, e.g. "model.layers.1.mlp.down_proj" or "output.logits"
    module: str  # the module (or "output" for final outputs)
    call: int  # 0 for the first call of the module in this request, 1 for the second, ...
    file: str  # relative to the capture directory
    key: str  # tensor name inside the safetensors file
    shape: tuple[int, ...]
    dtype: str
    layout: Mapping[str, Any] | None = None  # distributed captures: how the ranks' parts were joined
    step: int | None = None  # live captures of generation: 0 the prefill, 1, 2, ... the decode steps

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name, "module": self.module, "call": self.call, "file": self.file,
            "key": self.key, "shape": list(self.shape), "dtype": self.dtype,
        }
        if self.layout is not None:
            data["layout"] = dict(self.layout)
        if self.step is not None:
            data["step"] = self.step
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], memo: dict[Any, Any] | None = None) -> TapRecord:
        """A record from its JSON form. ``memo`` (one dict for a whole manifest) makes equal
        names, shapes and dtypes one object each: every request repeats them, and a separate
        copy in each of millions of records multiplied a reader's memory."""
        layout = data.get("layout")
        shape = tuple(map(int, data["shape"]))
        name, module, file, key, dtype = (str(data["name"]), str(data["module"]), str(data["file"]),
                                          str(data["key"]), str(data["dtype"]))
        if memo is not None:
            shape, name, module, file, key, dtype = (memo.setdefault(shape, shape), memo.setdefault(name, name),
                                                     memo.setdefault(module, module), memo.setdefault(file, file),
                                                     memo.setdefault(key, key), memo.setdefault(dtype, dtype))
        step = data.get("step")
        return cls(name=name, module=module, call=int(data["call"]), file=file, key=key, shape=shape, dtype=dtype,
                   layout=dict(layout) if isinstance(layout, Mapping) else None,
                   step=int(step) if step is not None else None)

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True, slots=True)
class RequestRecord:
    id: str
    length: int | None
    taps: tuple[TapRecord, ...]
    skipped: tuple[str, ...] = ()  # outputs that were not tensors (None, ints, caches, ...)
    offsets: tuple[int, ...] | None = None  # a packed request's sequence offsets (cu_seqlens)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id, "length": self.length, "taps": [t.to_dict() for t in self.taps],
            "skipped": list(self.skipped),
        }
        if self.offsets is not None:
            data["offsets"] = list(self.offsets)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], memo: dict[Any, Any] | None = None) -> RequestRecord:
        """A record from its JSON form (``memo``: see :meth:`TapRecord.from_dict`)."""
        return cls(
            id=str(data["id"]), length=data.get("length"),
            taps=tuple(TapRecord.from_dict(t, memo) for t in data["taps"]),
            skipped=tuple(data.get("skipped", ())),
            offsets=tuple(int(o) for o in data["offsets"]) if data.get("offsets") is not None else None,
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
    distributed: Mapping[str, Any] | None = None  # world size, ranks, layouts (multi-rank captures)
    live: Mapping[str, Any] | None = None  # recorded inside a running process (glmfb.diff.live): pid, command line, ...

    def to_dict(self) -> dict[str, Any]:
        data = self.head()
        data["requests"] = [r.to_dict() for r in self.requests]
        if self.distributed is not None:
            data["distributed"] = data.pop("distributed")  # after the requests, as it always was
        return data

    def head(self) -> dict[str, Any]:
        """Every field of the JSON form but ``requests`` (what :func:`write_manifest` writes
        before the requests, one per line)."""
        data: dict[str, Any] = {
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
        }
        if self.distributed is not None:
            data["distributed"] = to_json_value(dict(self.distributed))
        if self.live is not None:
            data["live"] = to_json_value(dict(self.live))
        return data

    @property
    def world_size(self) -> int | None:
        """The number of ranks that made this capture; None for a single process."""
        if self.distributed is None:
            return None
        return int(self.distributed["world_size"])

    @property
    def rank(self) -> int | None:
        """The rank whose own capture this is; None for a single process or an unsharded one."""
        if self.distributed is None or self.distributed.get("rank") is None:
            return None
        return int(self.distributed["rank"])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], requests: Sequence[RequestRecord] | None = None) -> Manifest:
        """A manifest from its JSON form; ``requests``, when given, replace the form's own
        (:func:`read_manifest` converts them itself, freeing the JSON of each as it goes)."""
        if requests is None:
            memo: dict[Any, Any] = {}
            requests = [RequestRecord.from_dict(r, memo) for r in data["requests"]]
        return cls(
            target=str(data.get("target", "")),
            args=dict(data.get("args") or {}),
            kind=str(data.get("kind", "module")),
            tap_globs=tuple(data.get("tap_globs") or ()),
            requests=tuple(requests),
            env=dict(data.get("env") or {}),
            git=data.get("git"),
            created=str(data.get("created", "")),
            complete=bool(data.get("complete", True)),
            distributed=dict(data["distributed"]) if isinstance(data.get("distributed"), Mapping) else None,
            live=dict(data["live"]) if isinstance(data.get("live"), Mapping) else None,
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


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Write ``manifest`` to ``path`` atomically (a temporary file, fsynced, renamed over it).

    The head is indented as before; the requests follow, one compact JSON object per line,
    each encoded by itself. Encoding the whole manifest indented went through Python's pure
    encoder (the C one does no indentation): 12 s for 300,000 requests, where this takes 2 s
    and writes about half the bytes. Nor is the JSON form of every request held at once."""
    head = manifest.head()
    with atomic_writer(path) as handle:
        handle.write("{\n")
        for key, value in head.items():
            indent = 2 if isinstance(value, Mapping) and value else None  # args, env, distributed
            text = json.dumps(value, indent=indent, allow_nan=False).replace("\n", "\n  ")
            handle.write(f"  {json.dumps(key)}: {text},\n")
        handle.write('  "requests": [')
        separator = "\n    "
        for request in manifest.requests:
            handle.write(separator)
            handle.write(json.dumps(request.to_dict(), allow_nan=False))
            separator = ",\n    "
        handle.write("\n  ]\n}\n" if manifest.requests else "]\n}\n")


class CaptureWriter:
    """Writes a capture directory as tensors are produced.

    Each finished request is appended to the folder's index (:data:`INDEX`, one JSON line) and
    the whole manifest is written twice only (empty and incomplete when the writer is made,
    whole and complete by :meth:`finish`): the cost of a capture grows linearly with its
    requests. An index line is handed to the kernel before :meth:`end_request` returns, so a
    process killed at any point leaves a folder that reads (:func:`read_manifest`) as the
    requests it had finished. The index is not fsynced per request: the tensor files are not
    either (a power loss can lose both); the final manifest is."""

    def __init__(self, directory: Path, *, target: str, args: Mapping[str, Any], kind: str,
                 tap_globs: Sequence[str], env: Mapping[str, Any], git: str | None, created: str,
                 force: bool = False, distributed: Mapping[str, Any] | None = None,
                 live: Mapping[str, Any] | None = None) -> None:
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
                          env=dict(env), git=git, created=created,
                          distributed=dict(distributed) if distributed is not None else None,
                          live=dict(live) if live is not None else None)
        self.step: int | None = None  # recorded with each call written while set (live captures of generation)
        self._requests: list[RequestRecord] = []
        self._current: list[tuple[str, int, str, str, str, tuple[int, ...], str, int | None]] = []
        self._request_dir = ""
        self._calls = 0
        # the head first (a folder with a manifest is a capture, an incomplete one), then the index
        write_manifest(self.directory / MANIFEST, self._manifest(complete=False, requests=()))
        self._index: BinaryIO | None = open(self.directory / INDEX, "ab", buffering=0)  # noqa: SIM115 (closed by finish or abandon)

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
                                  str(stored.dtype).removeprefix("torch."), self.step))
        path = self.directory / relative
        temporary = path.with_name(f".{path.name}.tmp")
        save_file(payload, str(temporary))
        os.replace(temporary, path)

    def end_request(self, request_id: str, length: int | None, skipped: Sequence[str],
                    offsets: Sequence[int] | None = None) -> None:
        """Record the request: kept for the final manifest, and appended to the index."""
        counts = call_counts((module, call) for module, call, *_ in self._current)
        taps = tuple(
            TapRecord(tap_name(module, call, counts, part), module, call, relative, key, shape, dtype, step=step)
            for module, call, part, relative, key, shape, dtype, step in self._current
        )
        record = RequestRecord(request_id, length, taps, tuple(skipped),
                               tuple(offsets) if offsets is not None else None)
        self._current = []
        self._append(json.dumps(record.to_dict(), allow_nan=False).encode("utf-8") + b"\n")
        self._requests.append(record)

    def drop_request(self) -> None:
        """Forget the request being written: its files go, and it is not recorded (a live
        capture that stopped half-way through a request)."""
        if self._request_dir:
            shutil.rmtree(self.directory / self._request_dir, ignore_errors=True)
        self._current = []
        self._calls = 0

    def finish(self) -> Manifest:
        """Mark the capture complete and move it into place in one rename: the whole manifest
        is written (and fsynced) before the index goes, so that the folder reads as complete
        or as what the index holds, whenever the process stops."""
        self._close_index()
        manifest = self._manifest(complete=True, requests=tuple(self._requests))
        write_manifest(self.directory / MANIFEST, manifest)
        (self.directory / INDEX).unlink(missing_ok=True)
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
        self._close_index()
        shutil.rmtree(self.directory, ignore_errors=True)

    def note_live(self, **fields: Any) -> None:
        """Add fields to the manifest's ``live`` record (written with the final manifest)."""
        live = self._meta.get("live")
        if isinstance(live, dict):
            live.update(fields)

    def _manifest(self, complete: bool, requests: tuple[RequestRecord, ...]) -> Manifest:
        return Manifest(requests=requests, complete=complete, **self._meta)  # type: ignore[arg-type]

    def _append(self, line: bytes) -> None:
        """One whole line at the end of the index, in as few writes as the kernel takes (one,
        for a line of any ordinary size: a reader drops a last line without its newline)."""
        if self._index is None:
            raise RuntimeError(f"{self.directory}: a request ended after the capture was finished or abandoned")
        view = memoryview(line)
        while view:
            written = self._index.write(view)
            view = view[written or 0:]

    def _close_index(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None


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


def read_manifest(directory: str | Path) -> Manifest:
    """The manifest of a capture folder, complete or not (:class:`CaptureReader` refuses an
    incomplete one). A capture cut short (its manifest says ``complete`` false) holds the
    requests it finished in its index (:data:`INDEX`), which are read from there, a last line
    without its newline (a write the process did not finish) dropped; a folder written by an
    earlier version has none, and its manifest lists them itself. Raises an
    :class:`InputError` for a folder that is no capture, or a manifest or index that is not
    one; the tensor files are not looked at.

    A manifest laid out as :func:`write_manifest` lays it out is read a line at a time (one
    request's JSON in memory at once); any other (an earlier version's, indented throughout,
    or one edited by hand) is parsed whole, and the JSON of each request dropped as soon as
    its record is made. Parsed whole, 300,000 requests of two taps held the text and its
    parsed form at once (a peak of 740 MiB); read a line at a time, 310 MiB."""
    folder = Path(directory)
    path = folder / MANIFEST
    if not folder.is_dir():
        raise InputError(f"{folder}: no such capture directory")
    if not path.is_file():
        raise InputError(
            f"{folder}: no {MANIFEST}; not a capture directory",
            "make one with glmfb capture TARGET --requests FILE --out DIR",
        )
    _check_regular(path)
    memo: dict[Any, Any] = {}
    try:
        by_lines = _read_by_lines(path, memo)
        data = by_lines[0] if by_lines is not None else json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not valid JSON ({exc})") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema != CAPTURE_SCHEMA:
        raise InputError(
            f"{path}: unknown capture schema {schema!r} (this glmfb reads {CAPTURE_SCHEMA})",
            "capture again with this version of glmfb",
        )
    try:
        if not data.get("complete", True) and (folder / INDEX).is_file():
            requests = _read_index(folder / INDEX, memo)
        elif by_lines is not None:
            requests = by_lines[1]
        else:
            items = data["requests"]
            requests = []
            for number in range(len(items)):
                requests.append(RequestRecord.from_dict(items[number], memo))
                items[number] = None  # its JSON is no longer needed
        return Manifest.from_dict(data, requests)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{path}: malformed manifest ({type(exc).__name__}: {exc})") from None


REQUESTS_LINE = '  "requests": [\n'  # where write_manifest's head ends and its requests begin


def _read_by_lines(path: Path, memo: dict[Any, Any]) -> tuple[dict[str, Any], list[RequestRecord]] | None:
    """The head and the requests of a manifest laid out by :func:`write_manifest`, read a line
    at a time: the head (every line up to ``"requests": [``, each field ending in a comma),
    then one request object per line, each but the last followed by a comma, then ``]`` and
    ``}`` and nothing else. None when the file is laid out otherwise, or its head is not this
    version's (another schema) or a request line does not make a record: the caller then
    parses it whole, which accepts any JSON and says what is wrong with it. A line of the
    file is always a line of structure: JSON escapes the newlines inside strings."""
    with open(path, encoding="utf-8") as handle:
        head_lines: list[str] = []
        for line in handle:
            if line == REQUESTS_LINE or line == '  "requests": []\n':
                break
            head_lines.append(line)
        else:
            return None
        try:
            head = json.loads("".join(head_lines) + '  "requests": []\n}')
        except json.JSONDecodeError:
            return None
        if not isinstance(head, dict) or head.get("schema") != CAPTURE_SCHEMA:
            return None
        requests: list[RequestRecord] = []
        expect = "request" if line == REQUESTS_LINE else "}"
        for line in handle:
            if expect == "request":
                last = not line.endswith(",\n")
                if not line.startswith("    {"):
                    return None
                try:
                    requests.append(RequestRecord.from_dict(json.loads(line if last else line[:-2]), memo))
                except (KeyError, TypeError, ValueError):  # JSONDecodeError too
                    return None
                expect = "]" if last else "request"
            elif expect == "]" and line == "  ]\n":
                expect = "}"
            elif expect == "}" and line == "}\n":
                expect = "end"
            else:
                return None  # another layout, or something after the closing brace
    return (head, requests) if expect == "end" else None


def _read_index(path: Path, memo: dict[Any, Any]) -> list[RequestRecord]:
    """The requests an index lists, but for a last line cut short."""
    _check_regular(path)
    requests: list[RequestRecord] = []
    try:
        with open(path, "rb") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.endswith(b"\n"):
                    break  # the process stopped while appending it: the request did not finish
                try:
                    requests.append(RequestRecord.from_dict(json.loads(line), memo))
                except (KeyError, TypeError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError too
                    raise InputError(f"{path}:{number}: malformed index line ({type(exc).__name__}: {exc})") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    return requests


class CaptureReader:
    """A capture directory opened for reading; checks the manifest when opened."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        if not self.manifest.complete:
            raise InputError(f"{self.directory}: the capture is incomplete (it was cut short: interrupted, or the "
                             "target failed half-way)", "capture again")
        checked: set[str] = set()  # folders on the way, and files, found not to be symlinks
        for request in self.manifest.requests:
            for tap in request.taps:
                if tap.file not in checked:
                    self._confine(tap.file, checked)
        self._headers: dict[str, tuple[dict[str, Any], int]] = {}

    def _inside(self, relative: str) -> Path:
        """A file the manifest names, confined to the capture folder: relative, no ``..``,
        no symlink on the way, a regular file (a FIFO would hang the reader)."""
        return self.directory.joinpath(*self._confine(relative))

    def _confine(self, relative: str, checked: set[str] | None = None) -> list[str]:
        """The parts of a relative path the manifest names, checked as :meth:`_inside` says.

        Works on strings with one ``lstat`` per part (pathlib's parsing was most of the time
        of opening a large capture); ``checked`` (when opening) remembers the relative paths
        already found free of symlinks, so that a request's folder is looked at once, not
        once per tap. A missing part is no symlink: reading the file reports it missing."""
        parts = [part for part in relative.split("/") if part and part != "."]
        if relative.startswith("/") or ".." in parts or not parts:
            raise InputError(f"{self.directory}/{MANIFEST}: file {relative!r} lies outside the capture folder",
                             "a manifest names files inside its own folder; capture again")
        base = str(self.directory)
        prefix = ""
        for part in parts:
            prefix = f"{prefix}/{part}" if prefix else part
            if checked is not None and prefix in checked:
                continue
            current = f"{base}/{prefix}"
            try:
                is_link = stat.S_ISLNK(os.lstat(current).st_mode)
            except (FileNotFoundError, NotADirectoryError):
                is_link = False
            except ValueError:  # a NUL byte
                raise InputError(f"{self.directory}/{MANIFEST}: file {relative!r} is not a valid path",
                                 "capture again") from None
            except OSError as exc:
                raise InputError(f"{current}: cannot read: {exc.strerror or exc}") from None
            if is_link:
                raise InputError(f"{current}: a symlink inside the capture; glmfb does not follow it", "capture again")
            if checked is not None:
                checked.add(prefix)
        if checked is not None:
            checked.add(relative)
        return parts

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
