"""Recording a capture from inside a running process (an engine's own code, or a plugin in its
worker): ``recording(model, DIR)`` taps the model's modules with the forward hooks of
:mod:`glmfb.diff.capture` and writes the calls of marked requests with the
:class:`~glmfb.diff.store.CaptureWriter`, so that ``glmfb diff A B`` compares two engines'
runs afterwards::

    from glmfb.capture import recording

    with recording(model, "captures/engine-a") as rec:
        with rec.request("prompt-1"):
            generate(model, prompt)          # prefill + decode steps

A request is marked by ``rec.request(id)`` around its forwards, or by ``match=`` a token
pattern (a forward whose ``input_ids`` holds it starts a request). Each top-level forward of a
marked request is one step (0 the prefill, 1, 2, ... the decode steps): a module is called once
per step, so its calls are the taps ``name#0``, ``name#1``, ... and each tap records its
``step``. Forwards of unmarked requests are not written. Nothing raised while recording reaches
the engine: recording stops, with a note in the manifest (``live.stopped``), and the model runs
on; so does reaching ``max_bytes``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.core.env import fingerprint
from glmfb.diff.capture import OUTPUT, module_hooks, select_submodules
from glmfb.diff.store import CaptureWriter, Manifest

if TYPE_CHECKING:
    import torch

DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB of tensors


def provenance() -> dict[str, Any]:
    """Where a live capture was made: the process id, its command line (``/proc/self/cmdline``,
    else ``sys.argv``), and the versions of torch and of an engine that is importable."""
    try:
        with open("/proc/self/cmdline", "rb") as handle:
            argv = [part.decode("utf-8", "replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        argv = [sys.executable, *sys.argv]
    record: dict[str, Any] = {"pid": os.getpid(), "cmdline": argv}
    versions: dict[str, str] = {}
    for name in ("torch", "vllm", "sglang"):
        module = sys.modules.get(name)
        if module is None and name == "vllm":  # an engine not loaded yet: imported only if installed
            try:
                import importlib.util

                if importlib.util.find_spec(name) is not None:
                    module = __import__(name)
            except Exception:
                module = None
        version = getattr(module, "__version__", None) if module is not None else None
        if version is not None:
            versions[name] = str(version)
    record["versions"] = versions
    return record


def _input_ids(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The token ids of a top-level forward: an ``input_ids`` keyword, else the first
    positional tensor."""
    import torch

    value = kwargs.get("input_ids")
    if isinstance(value, torch.Tensor):
        return value
    return next((a for a in args if isinstance(a, torch.Tensor)), None)


def _rows(ids: torch.Tensor) -> list[list[int]]:
    flat = ids.detach().to("cpu")
    if flat.dim() == 0:
        return [[int(flat)]]
    return [list(map(int, row)) for row in flat.reshape(-1, flat.shape[-1]).tolist()]


def _contains(rows: Sequence[Sequence[int]], pattern: Sequence[int]) -> bool:
    n = len(pattern)
    return any(list(row[i:i + n]) == list(pattern) for row in rows for i in range(len(row) - n + 1))


def matched_id(match: Sequence[int], ordinal: int) -> str:
    """The capture id of the ``ordinal``-th request (from 1) marked by the token pattern
    ``match``: ``match:253,254,255``, then ``match:253,254,255.2``, ...; an engine's plugin that
    marks the requests itself names them so too."""
    return numbered(f"match:{','.join(map(str, match))}", ordinal)


def numbered(name: str, ordinal: int) -> str:
    """``name`` for the first, ``name.2``, ``name.3``, ... for the next."""
    return name if ordinal == 1 else f"{name}.{ordinal}"


class Recording:
    """The handle ``recording`` yields: marks requests, and says what was recorded."""

    def __init__(self, writer: CaptureWriter, max_bytes: int, match: Sequence[int] | None,
                 match_id: str | None) -> None:
        self._writer = writer
        self._lock = threading.RLock()
        self.max_bytes = max_bytes
        self.bytes = 0  # tensor bytes written so far
        self.stopped: str | None = None  # why recording stopped (None: it did not)
        self.requests: list[str] = []  # ids of the requests written, in order
        self._match = [int(t) for t in match] if match is not None else None
        self._match_id = match_id or (matched_id(self._match, 1) if self._match else None)
        self._matched = 0
        self._active: str | None = None  # the request being written
        self._by_match = False  # it was started by the token pattern
        self._step = 0
        self._last: list[list[int]] | None = None  # the previous forward's ids (pattern matching)
        self.counters: dict[str, int] = {}

    # ---- marking ----------------------------------------------------------------------------

    @contextmanager
    def request(self, request_id: str) -> Iterator[None]:
        """Write every forward inside the block as request ``request_id`` (one step each). A
        block that raises leaves the request out of the capture."""
        with self._lock:
            self._end_matched()
            self._begin(str(request_id), by_match=False)
        try:
            yield
        except BaseException:
            with self._lock:
                self._drop()
            raise
        with self._lock:
            self._end()

    def leave_out(self) -> None:
        """Leave the request being written out of the capture (its files go); the block that
        marked it then ends without writing it (an engine that finds the request was not
        alone in its steps)."""
        with self._lock:
            self._drop()

    def note_live(self, **fields: Any) -> None:
        """Add fields to the manifest's ``live`` record, written with the final manifest (what
        an engine's plugin knows about the process: its server, its mark, what it left out)."""
        with self._lock:
            self._guard(lambda: self._writer.note_live(**fields))

    def _begin(self, request_id: str, by_match: bool) -> None:
        if self.stopped is not None:
            return
        if self._active is not None:
            self._end()
        self._guard(self._writer.begin_request)
        if self.stopped is not None:
            return
        self.counters.clear()
        self._active, self._by_match, self._step = request_id, by_match, 0

    def _end(self) -> None:
        if self._active is None:
            return
        request_id, self._active = self._active, None
        if self.stopped is None:
            self._guard(lambda: self._writer.end_request(request_id, None, ()))
            if self.stopped is None:
                self.requests.append(request_id)

    def _drop(self) -> None:
        if self._active is not None:
            self._active = None
            self._guard(self._writer.drop_request)

    def _end_matched(self) -> None:
        if self._active is not None and self._by_match:
            self._end()
        self._last = None

    def _stop(self, reason: str) -> None:
        """Stop recording for good: the request being written is dropped, the reason noted."""
        if self.stopped is not None:
            return
        self.stopped = reason
        if self._active is not None:
            self._active = None
            with contextlib.suppress(Exception):  # recording has stopped; the engine must run on
                self._writer.drop_request()

    def _guard(self, action: Any) -> None:
        try:
            action()
        except Exception as exc:
            self._stop(f"stopped: error while recording ({type(exc).__name__}: {exc})")

    # ---- hooks ------------------------------------------------------------------------------

    def before_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A top-level forward starts: the token pattern may start or end a request; a
        forward of the request being written is its next step."""
        with self._lock:
            if self.stopped is not None:
                return
            try:
                if self._match is not None and not (self._active is not None and not self._by_match):
                    self._follow_pattern(args, kwargs)
                if self._active is not None:
                    self._writer.step = self._step
                    self._step += 1
            except Exception as exc:
                self._stop(f"stopped: error while recording ({type(exc).__name__}: {exc})")

    def _follow_pattern(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A forward holding the pattern starts a request, unless it extends the previous
        forward's tokens (a generation that reruns the growing sequence); one without it
        continues the matched request when it feeds one token per sequence (a decode step
        with a KV cache), and ends it otherwise."""
        assert self._match is not None
        ids = _input_ids(args, kwargs)
        rows = _rows(ids) if ids is not None else []
        last, self._last = self._last, rows
        if rows and _contains(rows, self._match):
            extends = (self._active is not None and last is not None and len(last) == len(rows)
                       and all(row[:len(old)] == old for row, old in zip(rows, last, strict=True)))
            if not extends:
                self._matched += 1
                self._begin(numbered(str(self._match_id), self._matched), by_match=True)
        elif self._active is not None and not (rows and all(len(row) == 1 for row in rows)):
            self._end()

    def write_call(self, module: str, call: int, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        """The sink of the hooks: a call of the request being written, within the size cap."""
        with self._lock:
            if self._active is None or self.stopped is not None:
                return
            size = sum(t.numel() * t.element_size() for _, t in tensors)
            if self.bytes + size > self.max_bytes:
                after = f"request {self.requests[-1]!r}" if self.requests else "no complete request"
                self._stop(f"stopped: size cap of {self.max_bytes} bytes reached after {after} "
                           f"(request {self._active!r} was not kept)")
                return
            self.bytes += size
            self._guard(lambda: self._writer.write_call(module, call, tensors))

    def begin_request(self) -> None:  # the Sink protocol; requests are begun by marking
        pass

    def end_request(self, request_id: str, length: int | None, skipped: Sequence[str],
                    offsets: Sequence[int] | None = None) -> None:
        pass

    def close(self) -> None:
        with self._lock:
            if self._active is not None and self._by_match:
                self._end()
            else:
                self._drop()


@contextmanager
def recording(model: torch.nn.Module, directory: str | Path, *, modules: Sequence[str] = ("*",),
              match: Sequence[int] | None = None, match_id: str | None = None,
              max_bytes: int = DEFAULT_MAX_BYTES, force: bool = False) -> Iterator[Recording]:
    """Record the outputs of ``model``'s submodules (``modules``: globs over their qualified
    names) and of the model itself (the tap ``output``) into the capture folder ``directory``,
    for the requests marked with :meth:`Recording.request` or by ``match`` (token ids; the
    request is named ``match_id``, else ``match:1,2,3``, then ``.2``, ``.3`` for the next
    requests that hold it). Written aside and moved into place when the block ends, with the
    process's provenance in the manifest's ``live``. A folder that exists is refused
    (:class:`~glmfb.contract.errors.InputError`) unless ``force``; so is a glob that matches no module.
    After that nothing raises into the caller: a failure, or ``max_bytes`` of tensors, stops the
    recording with a note in ``live.stopped``."""
    chosen = select_submodules(model, list(modules), type(model).__name__, option="modules=")
    chosen = [*chosen, (OUTPUT, model)]  # the model's own outputs: the final outputs a diff compares
    live = provenance()
    writer = CaptureWriter(
        Path(directory), target=f"live:{type(model).__module__}.{type(model).__qualname__}", args={},
        kind="module", tap_globs=list(modules), env=fingerprint(), git=None,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), force=force, live=live,
    )
    rec = Recording(writer, max_bytes, match, match_id)

    def pre_hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        rec.before_forward(args, kwargs)

    handle = model.register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        with module_hooks(chosen, rec) as counters:
            rec.counters = counters
            yield rec
    finally:
        handle.remove()
        rec.close()
        finish(writer, rec)


def finish(writer: CaptureWriter, rec: Recording) -> Manifest | None:
    """Write the final manifest, with the note of a recording that stopped; None when even
    that failed (the folder then stays as the hidden partial one, readable as incomplete)."""
    try:
        writer.note_live(bytes=rec.bytes, stopped=rec.stopped)
        return writer.finish()
    except Exception:
        return None
