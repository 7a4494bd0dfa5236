"""One rank of a distributed capture; started by torch.distributed.run, never by hand.

    python -m torch.distributed.run ... -m glmfb.diff.rank_worker SPEC.json

Reads the launch spec written by :func:`glmfb.diff.distributed.run_distributed_capture`,
initializes the default process group from the torchrun environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``), builds the target, and captures
every request into ``OUT/rank<r>/``. Its status file (``OUT/.ranks/rank<r>.json``, replaced
atomically) tells the launcher its pid, which request it is in and how it ended; SIGUSR1 makes
``faulthandler`` dump its Python stack to ``OUT/.ranks/rank<r>.stack`` (how a hang is located).
An exception ends the rank with exit code 1 after writing one line about it to the status.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from glmfb.core.io import write_json_atomic
from glmfb.diff.distributed import layouts_to_json, stack_path, status_path

if TYPE_CHECKING:
    import torch

    from glmfb.diff.store import CaptureWriter


class RankStatus:
    """This rank's status file: each update bumps ``seq`` (the launcher's sign of progress)."""

    def __init__(self, status_dir: Path, rank: int) -> None:
        self.path = status_path(status_dir, rank)
        self.data: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "state": "starting", "seq": 0}
        self.write()

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        self.data["seq"] = int(self.data["seq"]) + 1
        self.write()

    def write(self) -> None:
        self.data["time"] = time.time()
        write_json_atomic(self.path, self.data)


class _StatusSink:
    """A capture sink that reports each finished request to the status file."""

    def __init__(self, writer: CaptureWriter, status: RankStatus) -> None:
        self.writer = writer
        self.status = status

    def begin_request(self) -> None:
        self.writer.begin_request()

    def write_call(self, module: str, call: int, tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
        self.writer.write_call(module, call, tensors)

    def end_request(self, request_id: str, length: int | None, skipped: Sequence[str],
                    offsets: Sequence[int] | None = None) -> None:
        self.writer.end_request(request_id, length, skipped, offsets)
        self.status.update(state="finished", request=request_id)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _raised_in_distributed(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return any("torch/distributed/" in frame.filename.replace("\\", "/") for frame in frames[-3:])


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    spec = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    status_dir = Path(spec["status_dir"])
    status = RankStatus(status_dir, rank)
    stack_file: IO[str] = open(stack_path(status_dir, rank), "w", encoding="utf-8")  # noqa: SIM115 (kept open for faulthandler)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    if spec.get("cwd"):
        os.chdir(spec["cwd"])
    try:
        return _capture(spec, rank, world_size, local_rank, status)
    except (Exception, SystemExit) as exc:
        from glmfb.contract.errors import TargetFailed

        original = exc.error if isinstance(exc, TargetFailed) else exc
        message = str(exc) if isinstance(exc, TargetFailed) else _one_line(exc)
        # raised inside torch.distributed: usually a peer that died or left (the effect, not the cause)
        status.update(state="raised", error=message, in_collective=_raised_in_distributed(original))
        return 1


def _capture(spec: dict[str, Any], rank: int, world_size: int, local_rank: int, status: RankStatus) -> int:
    import torch
    import torch.distributed as dist

    from glmfb.core.env import fingerprint, git_revision
    from glmfb.core.targets import Target
    from glmfb.diff.capture import load_side, run_requests
    from glmfb.diff.distributed import declared_layouts
    from glmfb.diff.requests import read_requests
    from glmfb.diff.store import CaptureWriter

    backend = spec["backend"]
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend)
    base_dir = Path(spec["base_dir"]) if spec.get("base_dir") else None
    target = Target(spec["target"], dict(spec["args"]), base_dir)
    requests = read_requests(spec["requests"])
    status.update(state="loading")
    side = load_side(target)
    layouts = declared_layouts(side.obj, target.ref)
    from datetime import datetime, timezone

    writer = CaptureWriter(
        Path(spec["out"]) / f"rank{rank}", target=target.ref, args=target.args, kind=side.kind,
        tap_globs=tuple(spec["taps"]), env=fingerprint(), git=git_revision(),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        distributed={"world_size": world_size, "rank": rank, "local_rank": local_rank, "backend": backend,
                     "layouts": layouts_to_json(layouts)},
    )
    by_label = {f"request {i + 1}/{len(requests)}: {r.id}": (i, r.id) for i, r in enumerate(requests)}

    def progress(label: str) -> None:
        index, request_id = by_label[label]
        status.update(state="running", request=request_id, index=index + 1)

    run_requests(side, requests, tuple(spec["taps"]), _StatusSink(writer, status), progress)
    writer.finish()
    status.update(state="done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
