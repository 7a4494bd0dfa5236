"""A vLLM general plugin: :func:`glmfb.capture.recording` inside a vLLM server that glmfb did
not start.

Installed with glmfb as the entry point ``glmfb_capture`` of the group ``vllm.general_plugins``
(``pip install --no-deps -e .`` in the server's environment). vLLM loads general plugins in
every process it starts (the API server, the engine core, each worker); this one does nothing
at all unless ``GLMFB_CAPTURE_DIR`` is set in the server's environment. Then, in each worker,
once the model is loaded, it records the requests whose prompt starts with the token ids of
``GLMFB_CAPTURE_MARK`` into ``$GLMFB_CAPTURE_DIR/rank<N>``, a ``glmfb.capture/1`` folder that
``glmfb diff A B`` compares as any two captures::

    GLMFB_CAPTURE_DIR=captures/a GLMFB_CAPTURE_MARK=256,257,258 GLMFB_CAPTURE_REQUESTS=3 \\
        python -m vllm.entrypoints.openai.api_server --model DIR ...
    # send the 3 marked requests, one at a time; then, with captures/b from the other server:
    glmfb diff captures/a/rank0 captures/b/rank0

The environment (read in the worker when the model is loaded):

- ``GLMFB_CAPTURE_DIR``: where the captures go (one folder per worker rank; a folder that
  exists is not replaced: nothing is recorded and the note says so).
- ``GLMFB_CAPTURE_MARK``: the token ids a marked request's prompt starts with (``256,257,258``).
- ``GLMFB_CAPTURE_REQUESTS``: the capture is finished (complete on disk, the hooks removed)
  once this many marked requests have been written; without it, when the worker stops (which
  needs ``--shutdown-timeout`` above 0: with vLLM's default, 0, the server kills its worker at
  once on SIGTERM).
- ``GLMFB_CAPTURE_MAX_BYTES``: the size cap on tensor bytes (``1GiB``, the default; ``64MiB``,
  or a number of bytes); reaching it finishes the capture with the requests written before.
- ``GLMFB_CAPTURE_MODULES``: globs over module names, comma-separated (default ``*``).

Each marked request is one capture request, named as :func:`~glmfb.capture.recording` names
matched requests (``match:256,257,258``, then ``.2``, ``.3``, ... in the order they arrive), and
each vLLM step of it is one step of the capture (0 the prefill, 1, 2, ... the decode steps).
The worker knows each step's batch: a marked request that shares a step with any other request
is not kept (its module outputs hold the other requests' rows too), and the note lists it, so
marked requests are sent one at a time. Module outputs exist only when the model runs eagerly:
while recording, the worker loads the model without ``torch.compile`` (vLLM's CPU build
compiles by default), and the manifest's ``live.compilation`` says so.

Nothing the plugin does may stop the server: any failure in it writes a note (vLLM's log and
``$GLMFB_CAPTURE_DIR/rank<N>.note.txt``), finishes the capture with what it holds, and lets the
server run on untouched.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

DIR_VARIABLE = "GLMFB_CAPTURE_DIR"
MARK_VARIABLE = "GLMFB_CAPTURE_MARK"
REQUESTS_VARIABLE = "GLMFB_CAPTURE_REQUESTS"
MAX_BYTES_VARIABLE = "GLMFB_CAPTURE_MAX_BYTES"
MODULES_VARIABLE = "GLMFB_CAPTURE_MODULES"
RUNNER_MODULE = "vllm.v1.worker.cpu_model_runner"  # vLLM 0.32's CPU model runner (v1 engine)
RUNNER_CLASS = "CPUModelRunner"
NOTE_SUFFIX = ".note.txt"

logger = logging.getLogger("vllm.glmfb_capture")  # under vLLM's logger: its log, its format

_BYTE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(raw: str) -> int:
    """``"64MiB"``, ``"1GiB"`` or a number of bytes; raises ``ValueError`` naming the value."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", raw)
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in _BYTE_UNITS:
        raise ValueError(f"{raw!r} is not a size: write a number of bytes, or e.g. 64MiB or 1GiB")
    return int(float(found.group(1)) * _BYTE_UNITS[unit])


@dataclass(frozen=True)
class CaptureSettings:
    """What the server's environment asks the plugin for."""

    directory: Path
    mark: tuple[int, ...]
    requests: int | None = None  # finish after this many marked requests (None: when the worker stops)
    max_bytes: int = 1 << 30
    modules: tuple[str, ...] = ("*",)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> CaptureSettings | None:
        """None when ``GLMFB_CAPTURE_DIR`` is not set; a value that does not parse raises
        ``ValueError`` naming its variable."""
        directory = environ.get(DIR_VARIABLE, "").strip()
        if not directory:
            return None
        raw_mark = environ.get(MARK_VARIABLE, "").strip()
        words = [w for w in re.split(r"[,\s]+", raw_mark) if w]
        if not words or not all(re.fullmatch(r"[0-9]+", w) for w in words):
            raise ValueError(f"{MARK_VARIABLE}={raw_mark!r}: give the token ids a marked request's prompt "
                             "starts with, e.g. 256,257,258 (without them nothing is recorded)")
        requests = None
        if raw := environ.get(REQUESTS_VARIABLE, "").strip():
            if not re.fullmatch(r"[0-9]+", raw) or int(raw) < 1:
                raise ValueError(f"{REQUESTS_VARIABLE}={raw!r}: give a number of requests, 1 or more")
            requests = int(raw)
        max_bytes = 1 << 30
        if raw := environ.get(MAX_BYTES_VARIABLE, "").strip():
            try:
                max_bytes = parse_bytes(raw)
            except ValueError as exc:
                raise ValueError(f"{MAX_BYTES_VARIABLE}: {exc}") from None
        modules = tuple(g.strip() for g in environ.get(MODULES_VARIABLE, "*").split(",") if g.strip()) or ("*",)
        return cls(Path(directory), tuple(int(w) for w in words), requests, max_bytes, modules)

    def request_name(self, ordinal: int) -> str:
        """The capture id of the ``ordinal``-th marked request (1-based), as
        :func:`~glmfb.capture.recording` names matched requests."""
        from glmfb.diff.live import matched_id

        return matched_id(self.mark, ordinal)


# ---- the entry point --------------------------------------------------------------------------


def register() -> None:
    """vLLM's entry point (every vLLM process calls it once). Without ``GLMFB_CAPTURE_DIR`` in
    the environment it returns at once, having done nothing; with it, the model runner of
    vLLM's CPU worker is patched when that module is imported (only a worker imports it), so
    that loading the model starts the recording."""
    if not os.environ.get(DIR_VARIABLE, "").strip():
        return
    try:
        after_import(RUNNER_MODULE, _patch_runner_class)
    except Exception as exc:  # the server must start whatever happens here
        note(None, f"the plugin could not hook vLLM's model runner ({type(exc).__name__}: {exc}); nothing is recorded")


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """Call ``then(module)`` once the module ``name`` is imported (now, if it already is),
    whoever imports it; nothing is imported here."""
    if name in sys.modules:
        then(sys.modules[name])
        return
    sys.meta_path.insert(0, _AfterImport(name, then))


class _AfterImport:
    """A meta path finder that finds nothing itself: when ``name`` is about to be imported it
    takes the spec the other finders give and runs ``then`` after the module's code."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module
        then = self.then

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            try:
                then(module)
            except Exception as exc:
                note(None, f"the plugin could not hook {fullname} ({type(exc).__name__}: {exc}); nothing is recorded")

        loader.exec_module = exec_and_patch  # this spec's own loader: no other module is affected
        return spec


def _patch_runner_class(module: ModuleType) -> None:
    runner_class = getattr(module, RUNNER_CLASS)
    original = runner_class.load_model
    if getattr(original, "_glmfb_capture", False):
        return

    @functools.wraps(original)
    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        plan = _guarded(None, "before the model was loaded", lambda: prepare(self))
        result = original(self, *args, **kwargs)
        if plan is not None:
            _guarded(plan.folder, "when the model was loaded", lambda: WorkerRecording.start(self, plan))
        return result

    load_model._glmfb_capture = True  # type: ignore[attr-defined]
    runner_class.load_model = load_model


# ---- in the worker ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What a worker records, decided before its model is loaded."""

    settings: CaptureSettings
    folder: Path  # $GLMFB_CAPTURE_DIR/rank<N>
    compilation: str | None  # what was turned off so that modules run eagerly (None: nothing)


def worker_rank() -> int:
    import torch.distributed

    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def prepare(runner: Any) -> Plan | None:
    """Read the environment and make the model load eagerly; None (with a note) when there
    is nothing to record."""
    settings = CaptureSettings.from_environ(os.environ)
    if settings is None:
        return None
    folder = settings.directory / f"rank{worker_rank()}"
    if folder.exists():
        note(folder, f"{folder} already exists; nothing is recorded (give a new {DIR_VARIABLE}, or remove it)")
        return None
    from vllm.config import CompilationMode

    compilation = runner.vllm_config.compilation_config
    turned_off = None
    if compilation.mode != CompilationMode.NONE:
        turned_off = (f"torch.compile turned off in this worker while it records (compilation mode "
                      f"{compilation.mode.name}, backend {compilation.backend!r}): module outputs exist only eagerly")
        compilation.mode = CompilationMode.NONE  # read by the model's constructor, as --enforce-eager sets it
    if settings.requests is None and getattr(runner.vllm_config, "shutdown_timeout", None) == 0:
        note(folder, f"without {REQUESTS_VARIABLE} the capture is finished when the worker stops, and with "
                     "--shutdown-timeout 0 (vLLM's default) the server kills its worker at once on SIGTERM: the "
                     f"capture would stay incomplete; set {REQUESTS_VARIABLE}, or start the server with "
                     "--shutdown-timeout 10")
    return Plan(settings, folder, turned_off)


class WorkerRecording:
    """The recording of one vLLM worker: which vLLM requests are marked, which one is being
    written, and when the capture is finished. Installed on the runner instance (its
    ``execute_model``, ``sample_tokens`` and ``shutdown``) and removed when it finishes."""

    def __init__(self, runner: Any, plan: Plan) -> None:
        from glmfb.capture import recording

        self.runner = runner
        self.plan = plan
        self.settings = plan.settings
        self._stack = contextlib.ExitStack()
        self.rec = self._stack.enter_context(recording(
            runner.model, plan.folder, modules=self.settings.modules, max_bytes=self.settings.max_bytes))
        self.names: dict[str, str] = {}  # vLLM request id -> capture request id, for the marked requests
        self.done: set[str] = set()  # marked requests written or left out: never begun again
        self.not_kept: list[str] = []  # why each marked request left out was left out
        self.active: str | None = None  # the vLLM id of the request being written
        self._block: contextlib.AbstractContextManager[None] | None = None
        self.finished = False
        # read while the server lives: a capture finished on the way out may outlive it
        self.server = server_process()

    @classmethod
    def start(cls, runner: Any, plan: Plan) -> WorkerRecording:
        recorder = cls(runner, plan)
        recorder._install()
        logger.info("glmfb capture: recording the requests whose prompt starts with %s into %s%s",
                    list(plan.settings.mark), plan.folder,
                    f"; {plan.compilation}" if plan.compilation else "")
        return recorder

    def _install(self) -> None:
        runner = self.runner
        execute_model, sample_tokens, shutdown = runner.execute_model, runner.sample_tokens, runner.shutdown

        def execute_model_recorded(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            self._guard(lambda: self.before_step(scheduler_output))
            return execute_model(scheduler_output, *args, **kwargs)

        def sample_tokens_recorded(*args: Any, **kwargs: Any) -> Any:
            output = sample_tokens(*args, **kwargs)
            self._guard(self.after_step)
            return output

        def shutdown_recorded(*args: Any, **kwargs: Any) -> Any:
            self._guard(lambda: self.finish("the worker stopped"))
            return shutdown(*args, **kwargs)

        runner.execute_model = execute_model_recorded
        runner.sample_tokens = sample_tokens_recorded
        runner.shutdown = shutdown_recorded
        atexit.register(lambda: self._guard(lambda: self.finish("the worker process exited")))

    def _uninstall(self) -> None:
        for name in ("execute_model", "sample_tokens", "shutdown"):
            with contextlib.suppress(AttributeError):
                delattr(self.runner, name)  # the instance's own wrapper: the class's method again

    # ---- one vLLM step ----------------------------------------------------------------------

    def before_step(self, scheduler_output: Any) -> None:
        """Before the step's forward: name the marked requests new in it, end the request
        being written when the step does not run it, and begin the marked request that runs
        alone; a marked request that shares the step with others is not kept."""
        if self.finished:
            return
        for new in scheduler_output.scheduled_new_reqs:
            prompt = new.prompt_token_ids
            if prompt is not None and tuple(prompt[:len(self.settings.mark)]) == self.settings.mark:
                self.names[new.req_id] = self.settings.request_name(len(self.names) + 1)
        scheduled = scheduler_output.num_scheduled_tokens
        if self.active is not None and self.active in (getattr(scheduler_output, "preempted_req_ids", None) or ()):
            self._leave_out(self.active, f"request {self.names[self.active]!r} was preempted: not kept")
        if self.active is not None and self.active not in scheduled:
            self._end(keep=True)  # it finished in a way this worker does not see (a stop string)
        marked = [r for r in scheduled if r in self.names and r not in self.done]
        if not marked:
            return
        if len(scheduled) > 1:
            for request in marked:
                self._leave_out(request, f"request {self.names[request]!r} shared a step with "
                                         f"{len(scheduled) - 1} other request(s): not kept")
            return
        [request] = marked
        if request != self.active:
            self._begin(request)

    def after_step(self) -> None:
        """After sampling: a request whose last token this was ends, and the capture is
        finished when the size cap stopped it or the marked requests asked for are in."""
        if self.finished:
            return
        if self.active is not None and self._request_done(self.active):
            self._end(keep=True)
        if self.rec.stopped is not None:
            self.finish(self.rec.stopped)
        elif self.settings.requests is not None and len(self.rec.requests) >= self.settings.requests:
            self.finish(None)

    def _request_done(self, request: str) -> bool:
        """Whether the token just sampled ends the request, as vLLM's scheduler decides
        (``vllm.v1.core.sched.utils.check_stop``): its end-of-sequence or a stop token, the
        model's length or ``max_tokens``. A stop string or a repetition ends it only at the
        next step that does not run it."""
        state = self.runner.requests.get(request)
        if state is None:
            return True
        params, output = state.sampling_params, state.output_token_ids
        if params is None or not output:
            return False
        last = output[-1]
        if last == params.eos_token_id or last in (params.stop_token_ids or ()):
            return True
        prompt = len(state.prompt_token_ids or ())
        limit = params.max_tokens if params.max_tokens is not None else sys.maxsize
        return prompt + len(output) >= self.runner.max_model_len or len(output) >= limit

    def _begin(self, request: str) -> None:
        if self.active is not None:
            self._end(keep=True)
        block = self.rec.request(self.names[request])
        block.__enter__()
        self._block, self.active = block, request

    def _end(self, keep: bool) -> None:
        block, self._block = self._block, None
        if self.active is not None:
            self.done.add(self.active)
            self.active = None
        if block is None:
            return
        if keep:
            block.__exit__(None, None, None)
        else:
            self.rec.leave_out()  # the request's files go
            block.__exit__(None, None, None)

    def _leave_out(self, request: str, why: str) -> None:
        if request == self.active:
            self._end(keep=False)
        self.done.add(request)
        self.not_kept.append(why)
        note(self.plan.folder, why)

    # ---- the end ----------------------------------------------------------------------------

    def finish(self, why: str | None) -> None:
        """Finish the capture: a request still being written is left out (it did not end),
        the manifest is written complete with the requests written, the hooks are removed.
        ``why`` is noted unless the capture simply has what was asked of it."""
        if self.finished:
            return
        self.finished = True
        self._uninstall()
        if self.active is not None:
            name = self.names.get(self.active, self.active)
            self._end(keep=False)
            self.not_kept.append(f"request {name!r} had not ended when the capture finished: not kept")
        try:
            self._note_live()
        finally:
            self._stack.close()
        if why is not None and self.rec.stopped is None:
            note(self.plan.folder, f"capture finished ({why}) with {len(self.rec.requests)} request(s)")
        elif self.rec.stopped is not None:
            note(self.plan.folder, f"recording {self.rec.stopped}; the capture holds {len(self.rec.requests)} request(s)")
        logger.info("glmfb capture: %s finished, %d request(s), %d tensor bytes",
                    self.plan.folder, len(self.rec.requests), self.rec.bytes)

    def _note_live(self) -> None:
        """What the manifest's ``live`` record holds besides the worker's own provenance."""
        fields = {"plugin": "glmfb.capture.vllm", "server": self.server, "mark": list(self.settings.mark),
                  "compilation": self.plan.compilation, "not_kept": list(self.not_kept)}
        self.rec.note_live(**fields)

    def _guard(self, action: Callable[[], None]) -> None:
        """Run a part of the recording; a failure finishes it, with a note, never reaching vLLM."""
        try:
            action()
        except Exception as exc:
            why = f"error in the glmfb capture plugin ({type(exc).__name__}: {exc})"
            note(self.plan.folder, f"{why}; recording stopped")
            if not self.finished:
                with contextlib.suppress(Exception):
                    self.not_kept.append(why)
                    self.finish(None)


def server_process() -> dict[str, Any] | None:
    """The server's own process (pid and command line): the nearest ancestor of this worker
    that vLLM did not start itself. vLLM spawns its engine core and workers with
    multiprocessing and retitles them (``VLLM::EngineCore``, ``VLLM::Worker``: their command
    line is the title, padded with empty words)."""
    try:
        import psutil

        for process in psutil.Process().parents():
            cmdline = [part for part in process.cmdline() if part]
            if cmdline and not cmdline[0].startswith("VLLM::") and not any("multiprocessing" in p for p in cmdline):
                return {"pid": process.pid, "cmdline": cmdline}
    except Exception:
        return None
    return None


def _guarded(folder: Path | None, when: str, action: Callable[[], Any]) -> Any:
    try:
        return action()
    except Exception as exc:
        note(folder, f"the glmfb capture plugin failed {when} ({type(exc).__name__}: {exc}); nothing is recorded")
        return None


def note(folder: Path | None, text: str) -> None:
    """A note for whoever runs the server: a warning in vLLM's log, and a line in
    ``<folder>.note.txt`` (``$GLMFB_CAPTURE_DIR/capture.note.txt`` before the folder is
    known). Never raises."""
    with contextlib.suppress(Exception):
        logger.warning("glmfb capture: %s", text)
    with contextlib.suppress(Exception):
        if folder is None:
            folder = Path(os.environ.get(DIR_VARIABLE, "").strip()) / "capture"
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f"{folder.name}{NOTE_SUFFIX}", "a", encoding="utf-8") as handle:
            handle.write(f"[pid {os.getpid()}] {text}\n")


def capture_folders(directory: str | Path) -> Sequence[Path]:
    """The per-rank capture folders a server wrote under ``directory``, rank order."""
    found = [p for p in Path(directory).glob("rank*") if p.is_dir() and p.name[4:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[4:]))


__all__ = ["CaptureSettings", "WorkerRecording", "capture_folders", "parse_bytes", "register"]
