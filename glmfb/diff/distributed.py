"""Distributed diff targets: capture on N ranks launched by torch.distributed's own launcher,
put each tap back together, and say which rank an error belongs to.

``run_distributed_capture`` starts ``python -m torch.distributed.run --standalone
--nproc-per-node N --max-restarts 0 -m glmfb.diff.rank_worker SPEC`` (torchrun, elastic). Each
rank initializes the default process group (gloo, or nccl with CUDA), builds the target, runs
every request through it and captures its taps into ``DIR/rank<r>/``, an ordinary capture
directory whose manifest records the rank, the world size and the layouts the target declared.
When every rank is done, the ranks are checked to agree on their taps and each tap is
unsharded into ``DIR/r0000/...`` with ``DIR/manifest.json`` describing it: ``DIR`` is then an
ordinary capture (same file layout, same tap names) that compares with a single-device capture
like any other, and the ranks' own captures stay beside it.

Layouts. The object the factory returns may carry ``glmfb_layouts``: a mapping from a tap-name
glob (first match wins) to one of

- ``{"axis": A, "order": "contiguous"}``: the tap is sharded along axis ``A``, rank ``r``
  holding the ``r``-th piece; the pieces are concatenated in rank order;
- ``{"axis": A, "order": "zigzag"}``: the axis is cut into ``2W`` segments as
  ``torch.tensor_split`` cuts it, rank ``r`` holding segments ``r`` and ``2W-1-r`` one after the
  other (the load-balanced layout of causal context parallelism);
- ``{"replicated": true}``: every rank holds the same tensor (checked bit for bit);
- ``{"unshard": "path/to/file.py:function"}``: a target-provided function
  ``f(tap_name, [tensor of rank 0, rank 1, ...]) -> tensor``.

A tap no glob matches is taken as replicated. A rank-local value (a CP merge's incoming
state, say) is declared sharded along a leading segment axis, and the single-device target
exposes the same tap with the state at each segment boundary stacked along that axis: the two
then compare element for element, and :func:`rank_of` / :func:`rank_errors` name the rank.

Failures. A rank that raises, dies (a signal, a non-zero exit), or makes no progress for
``timeout_s`` (hung; the others are then usually waiting for it inside a collective, which
its Python stack, dumped through ``faulthandler`` on SIGUSR1, shows) is a :class:`RankFailure`
naming the rank; so is a rank whose taps differ from the others'. Every process of the
launch is gone when the function returns or raises.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.contract.errors import HarnessError, InputError
from glmfb.core.io import write_json_atomic
from glmfb.core.process import ProcessTree

if TYPE_CHECKING:
    import torch

    from glmfb.diff.metrics import Tolerance
    from glmfb.diff.store import CaptureReader, Manifest, TapRecord

Progress = Callable[[str], None]

ORDERS = ("contiguous", "zigzag")
STATUS_DIR = ".ranks"
DEFAULT_TIMEOUT_S = 300.0
STACK_WAIT_S = 6.0  # how long the stacks of hung ranks get to arrive after SIGUSR1
STACK_ASK_AGAIN_S = 1.0  # SIGUSR1 again to a rank whose stack has not arrived after this long
TEARDOWN_WAIT_S = 5.0  # SIGTERM, then SIGKILL after this long
POLL_S = 0.1


# --------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """How the per-rank tensors of a tap make the whole one (see the module docstring)."""

    kind: str  # "shard", "replicated" or "function"
    axis: int = 0
    order: str = "contiguous"
    function: str | None = None  # target reference of a custom unshard function

    @classmethod
    def parse(cls, spec: Any, label: str) -> Layout:
        """A layout from its declaration; an :class:`InputError` saying what is wrong."""
        if isinstance(spec, Layout):
            return spec
        if not isinstance(spec, Mapping):
            raise InputError(f"{label}: a layout is a dict, got {type(spec).__name__}",
                             'write {"axis": 1, "order": "contiguous"}, {"replicated": true} or {"unshard": "file.py:f"}')
        keys = set(spec)
        if "unshard" in keys:
            if keys - {"unshard"} or not isinstance(spec["unshard"], str) or ":" not in spec["unshard"]:
                raise InputError(f"{label}: 'unshard' takes a target reference 'file.py:function' and nothing else")
            return cls("function", function=spec["unshard"])
        if "replicated" in keys:
            if keys - {"replicated"} or spec["replicated"] is not True:
                raise InputError(f"{label}: write a replicated tap as {{\"replicated\": true}}")
            return cls("replicated")
        unknown = keys - {"axis", "order"}
        if unknown or "axis" not in keys:
            raise InputError(f"{label}: a sharded layout has 'axis' and optionally 'order'"
                             + (f", not {', '.join(sorted(unknown))}" if unknown else ""))
        axis, order = spec["axis"], spec.get("order", "contiguous")
        if not isinstance(axis, int) or isinstance(axis, bool) or axis < 0:
            raise InputError(f"{label}: axis must be a non-negative int, got {axis!r}")
        if order not in ORDERS:
            raise InputError(f"{label}: order {order!r} is not one of {', '.join(ORDERS)}")
        return cls("shard", axis=axis, order=order)

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "function":
            return {"unshard": self.function}
        if self.kind == "replicated":
            return {"replicated": True}
        return {"axis": self.axis, "order": self.order}


Layouts = tuple[tuple[str, Layout], ...]


def declared_layouts(obj: Any, label: str) -> Layouts:
    """The ``glmfb_layouts`` a built target carries (empty when it has none)."""
    declared = getattr(obj, "glmfb_layouts", None)
    if declared is None:
        return ()
    if not isinstance(declared, Mapping):
        raise InputError(f"{label}: glmfb_layouts must map tap globs to layouts, got {type(declared).__name__}")
    return tuple((str(glob), Layout.parse(spec, f"{label}: glmfb_layouts[{glob!r}]")) for glob, spec in declared.items())


def layouts_from_json(data: Any) -> Layouts:
    """Layouts as stored in a rank manifest: ``[[glob, spec], ...]``."""
    return tuple((str(glob), Layout.parse(spec, f"layout of {glob!r}")) for glob, spec in data or ())


def layouts_to_json(layouts: Layouts) -> list[list[Any]]:
    return [[glob, layout.to_dict()] for glob, layout in layouts]


def layout_for(tap: str, layouts: Layouts) -> Layout:
    """The layout of a tap: the first glob that matches its name; replicated if none does."""
    for glob, layout in layouts:
        if fnmatch.fnmatchcase(tap, glob):
            return layout
    return Layout("replicated")


def segment_sizes(total: int, segments: int) -> list[int]:
    """Sizes of ``segments`` pieces of ``total`` as ``torch.tensor_split`` cuts them."""
    base, extra = divmod(total, segments)
    return [base + (1 if j < extra else 0) for j in range(segments)]


def zigzag_segments(rank: int, world_size: int) -> tuple[int, int]:
    """The two segments (of ``2W``) rank ``rank`` holds in the zig-zag order."""
    return rank, 2 * world_size - 1 - rank


def unshard(parts: Sequence[torch.Tensor], layout: Layout, tap: str,
            function: Callable[[str, list[torch.Tensor]], torch.Tensor] | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """The whole tensor from the ranks' parts (rank order) and the record of how it was made
    (kept on the unsharded tap, for :func:`rank_of`). Parts that do not fit the layout raise an
    :class:`InputError` naming the tap and the rank."""
    import torch

    world_size = len(parts)
    if layout.kind == "function":
        if function is None:
            raise InputError(f"tap {tap!r}: no unshard function given for {layout.function}")
        whole = function(tap, list(parts))
        if not isinstance(whole, torch.Tensor):
            raise InputError(f"tap {tap!r}: unshard function {layout.function} returned {type(whole).__name__}, not a tensor")
        return whole, {"kind": "function", "function": layout.function, "world_size": world_size}
    if layout.kind == "replicated":
        for rank, part in enumerate(parts[1:], start=1):
            if part.shape != parts[0].shape or part.dtype != parts[0].dtype or not torch.equal(part, parts[0]):
                what = (f"shape {list(part.shape)} on rank {rank}, {list(parts[0].shape)} on rank 0"
                        if part.shape != parts[0].shape else f"values differ between rank 0 and rank {rank}")
                raise InputError(
                    f"tap {tap!r}: {what}, and the target declares no layout for it (taken as replicated)",
                    "declare it in glmfb_layouts on the target, e.g. {\"" + tap + "\": {\"axis\": 1, \"order\": \"contiguous\"}}",
                )
        return parts[0], {"kind": "replicated", "world_size": world_size}
    axis = layout.axis
    for rank, part in enumerate(parts):
        if part.dim() <= axis:
            raise InputError(f"tap {tap!r}: rank {rank}'s part has {part.dim()} dimensions, the layout shards axis {axis}")
        other = [d for i, d in enumerate(part.shape) if i != axis]
        first = [d for i, d in enumerate(parts[0].shape) if i != axis]
        if other != first or part.dtype != parts[0].dtype:
            raise InputError(f"tap {tap!r}: rank {rank}'s part is {part.dtype} {list(part.shape)}, rank 0's "
                             f"{parts[0].dtype} {list(parts[0].shape)}: they differ outside the sharded axis {axis}")
    sizes = [int(part.shape[axis]) for part in parts]
    total = sum(sizes)
    record: dict[str, Any] = {"kind": "shard", "axis": axis, "order": layout.order, "world_size": world_size, "sizes": sizes}
    if layout.order == "contiguous":
        return torch.cat(list(parts), dim=axis), record
    segments = segment_sizes(total, 2 * world_size)
    pieces: dict[int, torch.Tensor] = {}
    for rank, part in enumerate(parts):
        front, back = zigzag_segments(rank, world_size)
        expected = segments[front] + segments[back]
        if part.shape[axis] != expected:
            raise InputError(f"tap {tap!r}: rank {rank} holds {part.shape[axis]} along axis {axis}; a zig-zag split of "
                             f"{total} over {world_size} ranks gives it {expected} (segments {front} and {back})")
        pieces[front], pieces[back] = part.split([segments[front], segments[back]], dim=axis)
    return torch.cat([pieces[j] for j in range(2 * world_size)], dim=axis), record


def owner_rank(layout: Mapping[str, Any] | None, index: int) -> int | None:
    """The rank that held element ``index`` along the sharded axis of an unsharded tap (its
    ``layout`` record); None when the tap is not sharded (replicated, custom, single process)."""
    if not layout or layout.get("kind") != "shard":
        return None
    sizes = [int(s) for s in layout["sizes"]]
    world_size = len(sizes)
    if layout.get("order") == "zigzag":
        bounds = segment_sizes(sum(sizes), 2 * world_size)
        start = 0
        for segment, size in enumerate(bounds):
            if index < start + size:
                return segment if segment < world_size else 2 * world_size - 1 - segment
            start += size
        return None
    start = 0
    for rank, size in enumerate(sizes):
        if index < start + size:
            return rank
        start += size
    return None


def rank_of(tap: TapRecord, index: Sequence[int]) -> int | None:
    """The rank an element of an unsharded tap came from (``index``: its full index, e.g. a
    metric's ``worst_index``); None where that cannot be said."""
    layout = tap.layout
    if not layout or layout.get("kind") != "shard":
        return None
    axis = int(layout["axis"])
    return owner_rank(layout, int(index[axis])) if axis < len(index) else None


@dataclass(frozen=True)
class RankSlice:
    """The error of one rank's piece of a sharded tap (one segment of it, in zig-zag)."""

    rank: int
    segment: int
    start: int  # along the sharded axis of the whole tensor
    end: int
    rel_l2: float
    max_abs: float
    outside: int  # elements with |c - b| > atol + rtol * |b|

    @property
    def failed(self) -> bool:
        return self.outside > 0

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "segment": self.segment, "start": self.start, "end": self.end,
                "rel_l2": self.rel_l2, "max_abs": self.max_abs, "outside": self.outside, "failed": self.failed}


def rank_errors(baseline: torch.Tensor, candidate: torch.Tensor, layout: Mapping[str, Any] | None,
                tolerance: Tolerance) -> list[RankSlice]:
    """Per-rank errors of a sharded tap, in sequence order (so the first failing slice is
    where the error first appears); empty when the tap is not sharded. ``candidate`` is the
    unsharded tensor whose ``layout`` record is given; ``baseline`` has the same shape."""
    import torch

    if not layout or layout.get("kind") != "shard":
        return []
    axis = int(layout["axis"])
    sizes = [int(s) for s in layout["sizes"]]
    world_size = len(sizes)
    if layout.get("order") == "zigzag":
        lengths = segment_sizes(sum(sizes), 2 * world_size)
        owners = [j if j < world_size else 2 * world_size - 1 - j for j in range(2 * world_size)]
    else:
        lengths, owners = sizes, list(range(world_size))
    slices: list[RankSlice] = []
    start = 0
    for segment, (size, rank) in enumerate(zip(lengths, owners, strict=True)):
        if size == 0:
            continue
        b = baseline.narrow(axis, start, size).double()
        c = candidate.narrow(axis, start, size).double()
        difference = (c - b).abs()
        norm = float(b.norm())
        outside = difference > tolerance.atol + tolerance.rtol * b.abs()
        outside |= torch.isnan(c) != torch.isnan(b)
        slices.append(RankSlice(
            rank=rank, segment=segment, start=start, end=start + size,
            rel_l2=float((c - b).norm()) / norm if norm > 0 else (0.0 if float(difference.max()) == 0 else float("inf")),
            max_abs=float(torch.nan_to_num(difference, nan=float("inf")).max()), outside=int(outside.sum()),
        ))
        start += size
    return slices


def tap_rank_errors(baseline: CaptureReader, candidate: CaptureReader, baseline_tap: TapRecord,
                    candidate_tap: TapRecord, tolerance: Tolerance) -> list[RankSlice]:
    """:func:`rank_errors` of one tap of two captures, by the layout of whichever side was
    captured on ranks (the candidate's if both were); empty when neither was. The first failing
    slice's ``rank`` is the verdict's ``where.rank``."""
    layout = candidate_tap.layout if candidate_tap.layout is not None else baseline_tap.layout
    if not layout or layout.get("kind") != "shard":
        return []
    return rank_errors(baseline.load(baseline_tap), candidate.load(candidate_tap), layout, tolerance)


# --------------------------------------------------------------------------------------------
# Rank status files (written by glmfb.diff.rank_worker, read by the launcher)
# --------------------------------------------------------------------------------------------


def status_path(status_dir: Path, rank: int) -> Path:
    return status_dir / f"rank{rank}.json"


def stack_path(status_dir: Path, rank: int) -> Path:
    return status_dir / f"rank{rank}.stack"


def read_status(status_dir: Path, rank: int) -> dict[str, Any] | None:
    """A rank's last status, or None before it wrote one (or while it is being replaced)."""
    try:
        data = json.loads(status_path(status_dir, rank).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# --------------------------------------------------------------------------------------------
# Launching
# --------------------------------------------------------------------------------------------


class RankFailure(HarnessError):
    """A rank raised, died, hung, or disagrees with the others. ``rank`` is the rank to blame
    (the first if several), ``ranks`` all of them, ``reason`` one of ``raised``, ``crashed``,
    ``hung``, ``disagrees``, ``launcher``."""

    def __init__(self, message: str, *, reason: str, ranks: Sequence[int] = (), hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.reason = reason
        self.ranks = tuple(ranks)
        self.rank = self.ranks[0] if self.ranks else None


@dataclass(frozen=True)
class DistributedCaptureConfig:
    """``glmfb capture --nproc N``: the target on ``nproc`` ranks over a request set."""

    target: str
    requests: Path
    out: Path
    nproc: int
    args: Mapping[str, Any] = field(default_factory=dict)
    taps: tuple[str, ...] = ()
    base_dir: Path | None = None
    backend: str | None = None  # None: nccl when CUDA is available, else gloo
    timeout_s: float = DEFAULT_TIMEOUT_S  # a rank without progress this long counts as hung
    python: str = sys.executable


def default_backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def launch_command(python: str, nproc: int, spec: Path) -> list[str]:
    """The torchrun command line that starts the ranks (``--max-restarts 0``: a failing rank
    ends the launch instead of restarting the group). Its log directory is beside ``spec``:
    without ``--log-dir`` torchrun makes a ``torchelastic_*`` directory in the system's temporary
    directory on every launch and never removes it."""
    return [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "--max-restarts", "0", "--monitor-interval", "0.1", "--log-dir", str(spec.parent / "torchelastic"),
            "-m", "glmfb.diff.rank_worker", str(spec)]


def run_distributed_capture(config: DistributedCaptureConfig, progress: Progress | None = None) -> Manifest:
    """Capture ``config.target`` on ``config.nproc`` ranks into ``config.out`` and unshard it.

    Returns the manifest of the unsharded capture (``out/manifest.json``). Raises
    :class:`InputError` for bad input, :class:`RankFailure` when a rank raises, dies, hangs or
    disagrees on taps. No process of the launch outlives the call."""
    from glmfb.core.targets import Target
    from glmfb.diff.requests import read_requests

    if config.nproc < 1:
        raise InputError(f"--nproc must be at least 1, got {config.nproc}")
    if config.timeout_s <= 0:
        raise InputError(f"the rank timeout must be positive, got {config.timeout_s}")
    read_requests(config.requests)  # bad requests are one line here, not N tracebacks
    Target(config.target, dict(config.args), config.base_dir).load()  # so is a bad target
    backend = config.backend or default_backend()
    out = _prepare_out(config.out)
    status_dir = out / STATUS_DIR
    status_dir.mkdir(parents=True)
    spec = status_dir / "spec.json"
    write_json_atomic(spec, {
        "target": config.target, "args": dict(config.args), "taps": list(config.taps),
        "base_dir": str(config.base_dir.resolve()) if config.base_dir is not None else None,
        "requests": str(Path(config.requests).resolve()), "out": str(out.resolve()),
        "status_dir": str(status_dir.resolve()), "backend": backend, "cwd": os.getcwd(),
    })
    log_path = status_dir / "launcher.log"
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if progress is not None:
        progress(f"launching {config.nproc} ranks ({backend}) with torch.distributed.run")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(launch_command(config.python, config.nproc, spec), stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environment,
                                   start_new_session=True)
    tree = ProcessTree(process.pid)  # workers run in sessions of their own: followed, not orphaned
    try:
        code = _supervise(process, tree, status_dir, config.nproc, config.timeout_s, progress)
        if code != 0:
            raise _failure(code, status_dir, log_path, config.nproc)
        statuses = {rank: read_status(status_dir, rank) or {} for rank in range(config.nproc)}
        missing = [rank for rank, status in statuses.items() if status.get("state") != "done"]
        if missing:
            raise RankFailure(f"torchrun exited cleanly but rank {missing[0]} did not finish its capture",
                              reason="launcher", ranks=missing, hint=f"see {log_path}")
    finally:
        tree.stop(TEARDOWN_WAIT_S)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(TEARDOWN_WAIT_S)  # reap the launcher
    if progress is not None:
        progress("checking the ranks agree, unsharding taps")
    return unshard_capture(out, base_dir=config.base_dir, backend=backend)


def _prepare_out(out: Path) -> Path:
    """``out`` ready for a new distributed capture: absent, empty, or an earlier capture
    (replaced); anything else is not overwritten."""
    import shutil

    from glmfb.diff.store import MANIFEST

    if out.exists():
        if not out.is_dir():
            raise InputError(f"{out}: exists and is not a directory")
        entries = list(out.iterdir())
        if entries and not (out / MANIFEST).is_file() and not (out / STATUS_DIR).is_dir():
            raise InputError(f"{out}: not empty and not a capture directory", "give an empty or new --out directory")
        for entry in entries:
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out


def _supervise(process: subprocess.Popen[bytes], tree: ProcessTree, status_dir: Path, world_size: int,
               timeout_s: float, progress: Progress | None) -> int:
    """Wait for torchrun to exit, watching each rank's progress; returns its exit code or raises
    :class:`RankFailure` for a rank that stays without progress for ``timeout_s``."""
    started = time.monotonic()
    last_seq: dict[int, Any] = {}
    last_change = dict.fromkeys(range(world_size), started)
    raised_at: float | None = None
    while True:
        code = process.poll()
        now = time.monotonic()
        tree.refresh()
        statuses = {rank: read_status(status_dir, rank) for rank in range(world_size)}
        for rank, status in statuses.items():
            if status is None:
                continue
            if status.get("pid"):
                tree.add(int(status["pid"]))
            if status.get("seq") != last_seq.get(rank):
                last_seq[rank] = status.get("seq")
                last_change[rank] = now
                if progress is not None and status.get("request"):
                    progress(f"rank {rank}: {status.get('state')} request {status.get('index', '?')}: {status['request']}")
        if code is not None:
            return code
        if any((s or {}).get("state") == "raised" for s in statuses.values()):
            raised_at = raised_at or now
            if now - raised_at > TEARDOWN_WAIT_S:  # torchrun should have ended the others by now
                tree.stop(TEARDOWN_WAIT_S)
                return process.wait()
        stalled = [rank for rank in range(world_size)
                   if (statuses[rank] or {}).get("state") not in ("done", "raised") and now - last_change[rank] > timeout_s]
        if stalled:
            raise _hung(stalled, statuses, status_dir, timeout_s)
        time.sleep(POLL_S)


def _hung(stalled: Sequence[int], statuses: Mapping[int, dict[str, Any] | None], status_dir: Path,
          timeout_s: float) -> RankFailure:
    """Name the hung rank(s). Every unfinished rank dumps its Python stack; those waiting
    inside a torch.distributed collective wait for the others, so the ranks that are not are
    the hung ones (all unfinished ranks when every one of them waits in a collective)."""
    unfinished = sorted({rank for rank, status in statuses.items() if (status or {}).get("state") not in ("done", "raised")}
                        | set(stalled))
    stacks: dict[int, str] = {}
    started = time.monotonic()
    asked_at = -STACK_ASK_AGAIN_S
    while time.monotonic() - started < STACK_WAIT_S and len(stacks) < len(unfinished):
        if time.monotonic() - asked_at >= STACK_ASK_AGAIN_S:  # ask again whoever has not answered
            asked_at = time.monotonic()
            for rank in unfinished:
                pid = (statuses.get(rank) or {}).get("pid")
                if pid and rank not in stacks:
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGUSR1)
        time.sleep(POLL_S)
        for rank in unfinished:
            text = _read_text(stack_path(status_dir, rank))
            if "File " in text and rank not in stacks:
                stacks[rank] = text
    waiting = sorted(rank for rank, text in stacks.items() if _in_collective(text))
    culprits = [rank for rank in unfinished if rank not in waiting] or unfinished
    parts = []
    for rank in culprits:
        status = statuses.get(rank) or {}
        state = "before its first request" if not status.get("request") else f"in request {status['request']!r}"
        where = _innermost_frame(stacks.get(rank, ""))
        at = f" (at {where})" if where else f" (its stack did not arrive within {STACK_WAIT_S:g} s)"
        parts.append(f"rank {rank} hung {state}{at}")
    if waiting and culprits != unfinished:
        parts.append(f"rank {', '.join(str(r) for r in waiting)} waiting for it in a collective")
    elif waiting:
        parts.append("every unfinished rank waits in a collective (mismatched collectives?)")
    return RankFailure(f"no progress for {timeout_s:g} s: " + "; ".join(parts), reason="hung", ranks=culprits,
                       hint="fix the rank's hang, or raise the rank timeout if it is only slow")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _in_collective(stack: str) -> bool:
    return "torch/distributed/" in stack.replace("\\", "/") or "distributed_c10d" in stack


def _innermost_frame(stack: str) -> str | None:
    """``file:line in function`` of the most recent frame of the first thread dumped (the one
    that took the signal: the main thread here) outside glmfb, torch and the standard library;
    the most recent frame of all if every frame is theirs. Frames are told apart by the folders
    those packages are installed in, never by a name in the path (a user's checkout may well sit
    in a folder called ``glmfb`` or ``torch``)."""
    from glmfb.core.sources import is_users

    first: str | None = None
    for line in stack.splitlines():
        if first is not None and not line.startswith(" "):
            break  # the next thread
        match = re.match(r'\s*File "(.+)", line (\d+) in (\S+)', line)
        if match is None:
            continue
        path = match.group(1)
        frame = f"{os.path.basename(path.replace(chr(92), '/'))}:{match.group(2)} in {match.group(3)}"
        first = first or frame
        if is_users(path):
            return frame
    return first


def _failure(code: int, status_dir: Path, log_path: Path, world_size: int) -> RankFailure:
    """What went wrong when torchrun exits non-zero, most direct cause first: a rank that raised
    in its own code; else a rank that died (torchrun's root cause: rank, exit code, signal);
    else a rank whose torch.distributed call raised (typically because a peer went away);
    else the launcher itself."""
    statuses = {rank: read_status(status_dir, rank) or {} for rank in range(world_size)}
    raised = sorted((s.get("time", 0.0), rank) for rank, s in statuses.items() if s.get("state") == "raised")
    primary = [rank for _, rank in raised if not statuses[rank].get("in_collective")]
    if primary:
        return _raised(primary, statuses)
    crashed = _crashed(_read_text(log_path), statuses, log_path)
    if crashed is not None:
        return crashed
    if raised:
        return _raised([rank for _, rank in raised], statuses)
    log = _read_text(log_path)
    last = next((line for line in reversed(log.splitlines()) if line.strip()), "no output")
    return RankFailure(f"torch.distributed.run exited with code {code}: {last.strip()[:300]}", reason="launcher",
                       hint=f"see {log_path}")


def _raised(ranks: Sequence[int], statuses: Mapping[int, dict[str, Any]]) -> RankFailure:
    status = statuses[ranks[0]]
    where = f" in request {status['request']!r}" if status.get("request") else ""
    return RankFailure(f"rank {ranks[0]} raised{where}: {status.get('error', 'an exception')}", reason="raised",
                       ranks=ranks, hint="fix the target, or run that rank's request alone")


TEARDOWN_SIGNALS = (signal.SIGTERM, signal.SIGKILL)  # how torchrun ends the ranks that did not fail


def _torchrun_failures(log: str) -> list[tuple[int, int]]:
    """``(rank, exit code)`` of every failure in torchrun's report, the root cause first."""
    banner = log.rfind("Failures:")
    report = log[banner:] if banner >= 0 else log[log.rfind("Root Cause"):] if "Root Cause" in log else ""
    root = report.find("Root Cause")
    sections = [report[root:], report[:root]] if root >= 0 else [report]
    found = []
    for section in sections:
        for match in re.finditer(r"rank\s*:\s*(\d+)[^\n]*\n(?:[^\n]*\n)*?\s*exitcode\s*:\s*(-?\d+)", section):
            found.append((int(match.group(1)), int(match.group(2))))
    return found


def _crashed(log: str, statuses: Mapping[int, dict[str, Any]], log_path: Path) -> RankFailure | None:
    """A rank that died without reporting an exception: by a signal other than torchrun's own
    teardown, or with an exit code of its own; torchrun's root cause otherwise."""
    failures = [(rank, code) for rank, code in _torchrun_failures(log) if statuses.get(rank, {}).get("state") != "raised"]
    if not failures:
        return None
    torn_down = {-int(sig) for sig in TEARDOWN_SIGNALS}
    rank, exit_code = next(((r, c) for r, c in failures if c not in torn_down), failures[0])
    detail = f"exit code {exit_code}"
    if exit_code < 0:
        try:
            detail = f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            detail = f"killed by signal {-exit_code}"
    status = statuses.get(rank, {})
    where = f" in request {status['request']!r}" if status.get("request") else ""
    return RankFailure(f"rank {rank} crashed{where}: {detail}", reason="crashed", ranks=[rank],
                       hint=f"torchrun's log: {log_path}")


# --------------------------------------------------------------------------------------------
# Agreement and unsharding
# --------------------------------------------------------------------------------------------


def check_ranks_agree(manifests: Sequence[Manifest]) -> None:
    """Raise :class:`RankFailure` (``disagrees``) naming the first rank whose request ids or
    taps (names, order, dtypes) differ from the others' (the majority; rank 0 breaks ties)."""
    def signature(manifest: Manifest) -> tuple[Any, ...]:
        return tuple((r.id, tuple((t.name, t.dtype) for t in r.taps)) for r in manifest.requests)

    signatures = [signature(m) for m in manifests]
    counts: dict[tuple[Any, ...], int] = {}
    for sig in signatures:
        counts[sig] = counts.get(sig, 0) + 1
    reference = max(counts, key=lambda sig: (counts[sig], sig == signatures[0]))
    anchor = signatures.index(reference)
    odd = [rank for rank, sig in enumerate(signatures) if sig != reference]
    if not odd:
        return
    rank = odd[0]
    raise RankFailure(f"rank {rank} disagrees with rank {anchor} on taps: "
                      f"{_first_difference(manifests[anchor], manifests[rank], anchor, rank)}",
                      reason="disagrees", ranks=odd, hint="every rank must run the same modules on every request")


def _first_difference(reference: Manifest, other: Manifest, anchor: int, rank: int) -> str:
    ids_a, ids_b = [r.id for r in reference.requests], [r.id for r in other.requests]
    if ids_a != ids_b:
        return f"requests {ids_b} on rank {rank}, {ids_a} on rank {anchor}"
    for request_a, request_b in zip(reference.requests, other.requests, strict=True):
        names_a = [t.name for t in request_a.taps]
        names_b = [t.name for t in request_b.taps]
        for index, (name_a, name_b) in enumerate(zip(names_a, names_b, strict=False)):
            if name_a != name_b:
                return f"request {request_a.id!r}, tap #{index} is {name_b!r} on rank {rank}, {name_a!r} on rank {anchor}"
        if len(names_a) != len(names_b):
            longer, name = (anchor, names_a[len(names_b)]) if len(names_a) > len(names_b) else (rank, names_b[len(names_a)])
            return f"request {request_a.id!r}: tap {name!r} only on rank {longer} ({len(names_b)} taps on rank {rank}, {len(names_a)} on rank {anchor})"
        for tap_a, tap_b in zip(request_a.taps, request_b.taps, strict=True):
            if tap_a.dtype != tap_b.dtype:
                return f"request {request_a.id!r}, tap {tap_a.name!r}: {tap_b.dtype} on rank {rank}, {tap_a.dtype} on rank {anchor}"
    return "their manifests differ"


def unshard_capture(directory: Path, base_dir: Path | None = None, backend: str | None = None) -> Manifest:
    """Join the per-rank captures ``directory/rank<r>/`` into ``directory/r<request>/`` and write
    ``directory/manifest.json`` for them. Checks the ranks agree first."""
    from safetensors.torch import save_file

    from glmfb.core.targets import resolve
    from glmfb.diff.store import MANIFEST, CaptureReader, Manifest, RequestRecord, write_manifest

    rank_dirs = sorted((p for p in directory.glob("rank*") if p.is_dir() and p.name[4:].isdigit()),
                       key=lambda p: int(p.name[4:]))
    if not rank_dirs:
        raise InputError(f"{directory}: no rank captures (rank0/, rank1/, ...) to unshard")
    readers = [CaptureReader(p) for p in rank_dirs]
    world_size = len(readers)
    for rank, reader in enumerate(readers):
        if reader.manifest.rank != rank or reader.manifest.world_size != world_size:
            raise InputError(f"{rank_dirs[rank]}: manifest says rank {reader.manifest.rank} of {reader.manifest.world_size}, "
                             f"expected rank {rank} of {world_size}")
        if not reader.manifest.complete:
            raise RankFailure(f"rank {rank}'s capture is incomplete", reason="launcher", ranks=[rank])
    check_ranks_agree([r.manifest for r in readers])
    first = readers[0].manifest
    assert first.distributed is not None
    layouts = layouts_from_json(first.distributed.get("layouts"))
    functions: dict[str, Callable[..., Any]] = {}
    requests: list[RequestRecord] = []
    for number, request in enumerate(first.requests):
        folder = f"r{number:04d}"
        (directory / folder).mkdir(exist_ok=True)
        groups: dict[str, list[int]] = {}
        for index, tap in enumerate(request.taps):  # one file per module call, as captured
            groups.setdefault(tap.file, []).append(index)
        taps: list[TapRecord] = []
        for call_number, indices in enumerate(groups.values()):
            relative = f"{folder}/{call_number:05d}.safetensors"
            payload = {}
            for key_number, index in enumerate(indices):
                tap = request.taps[index]
                parts = [reader.load(reader.manifest.requests[number].taps[index]) for reader in readers]
                layout = layout_for(tap.name, layouts)
                function = None
                if layout.kind == "function":
                    assert layout.function is not None
                    if layout.function not in functions:
                        functions[layout.function] = resolve(layout.function, base_dir=base_dir)
                    function = functions[layout.function]
                whole, record = unshard(parts, layout, tap.name, function)
                key = f"t{key_number}"
                payload[key] = whole.detach().to("cpu").contiguous().clone()
                taps.append(replace(tap, file=relative, key=key, shape=tuple(whole.shape),
                                    dtype=str(whole.dtype).removeprefix("torch."), layout=record))
            path = directory / relative
            temporary = path.with_name(f".{path.name}.tmp")
            save_file(payload, str(temporary))
            os.replace(temporary, path)
        length = request.length
        requests.append(RequestRecord(request.id, length, tuple(taps), request.skipped, request.offsets))
    distributed = {
        "world_size": world_size, "backend": backend or first.distributed.get("backend"),
        "ranks": [{"rank": rank, "dir": p.name, "env": dict(r.manifest.env)} for rank, (p, r) in enumerate(zip(rank_dirs, readers, strict=True))],
        "layouts": layouts_to_json(layouts),
    }
    manifest = Manifest(target=first.target, args=first.args, kind=first.kind, tap_globs=first.tap_globs,
                        requests=tuple(requests), env=first.env, git=first.git, created=first.created,
                        complete=True, distributed=distributed)
    write_manifest(directory / MANIFEST, manifest)
    return manifest


__all__ = [
    "DistributedCaptureConfig", "Layout", "RankFailure", "RankSlice", "check_ranks_agree", "declared_layouts",
    "launch_command", "layout_for", "owner_rank", "rank_errors", "rank_of", "run_distributed_capture",
    "tap_rank_errors", "unshard", "unshard_capture",
]
