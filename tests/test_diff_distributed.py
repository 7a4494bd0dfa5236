"""glmfb.diff.distributed: layouts and unsharding (fast), and real torchrun launches on gloo
(slow): a capture with ranks recorded, a rank that raises, hangs, crashes or disagrees on taps,
each named, with no process of the launch left behind (checked in the process table)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
from torch import nn

from glmfb.contract.errors import InputError
from glmfb.diff.distributed import (
    DistributedCaptureConfig,
    Layout,
    RankFailure,
    _failure,
    _hung,
    _innermost_frame,
    check_ranks_agree,
    declared_layouts,
    launch_command,
    layout_for,
    owner_rank,
    rank_errors,
    rank_of,
    run_distributed_capture,
    tap_rank_errors,
    unshard,
)
from glmfb.diff.metrics import Tolerance
from glmfb.diff.store import CAPTURE_SCHEMA, CaptureReader, Manifest, RequestRecord, TapRecord

HERE = Path(__file__).resolve()


# ---- targets run on the ranks (referenced as tests/test_diff_distributed.py:NAME) -------------


class Mix(nn.Module):
    """Adds the sequence mean to every token: an all_reduce across ranks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        total = x.sum(dim=1, keepdim=True)
        count = torch.tensor([float(x.shape[1])], dtype=x.dtype)
        if dist.is_initialized():
            dist.all_reduce(total)
            dist.all_reduce(count)
        return x + total / count


class Toy(nn.Module):
    """Token ids -> embed -> mix -> head, on one device or sharded over the ranks along the
    sequence (contiguous or zig-zag); ``fault`` plants a failure on rank ``fault_rank``."""

    def __init__(self, layout: str | None, fault: str = "", fault_rank: int = 1) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = nn.Embedding(64, 8).double()
        self.mix = Mix()
        self.head = nn.Linear(8, 4).double()
        self.extra = nn.Identity()
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64))
        self.layout = layout
        self.fault = fault
        self.fault_rank = fault_rank
        if layout is not None:
            self.glmfb_layouts = {"*": {"axis": 1, "order": layout}}

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.layout is not None:
            import torch.distributed as dist

            rank, world_size = dist.get_rank(), dist.get_world_size()
            if rank == self.fault_rank:
                self._plant()
            input_ids = shard(input_ids, self.layout, rank, world_size)
        x = self.mix(self.embed(input_ids))
        if getattr(self, "perturb", False):
            x = x * 1.01  # this rank's piece of the sequence is off by 1%
        if self.fault == "disagree" and self.layout is not None and _rank() == self.fault_rank:
            x = self.extra(x)
        return self.head(x)

    def _plant(self) -> None:
        if self.fault == "perturb":
            self.perturb = True
            return
        if self.fault == "raise":
            raise ValueError("planted failure on this rank")
        if self.fault == "hang":
            threading.Event().wait()  # blocks forever; the others wait for it in all_reduce
        if self.fault == "crash":
            ctypes.string_at(0)  # a segmentation fault


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def shard(ids: torch.Tensor, layout: str, rank: int, world_size: int) -> torch.Tensor:
    if layout == "contiguous":
        return ids.tensor_split(world_size, dim=1)[rank]
    pieces = ids.tensor_split(2 * world_size, dim=1)
    return torch.cat([pieces[rank], pieces[2 * world_size - 1 - rank]], dim=1)


def toy_single() -> nn.Module:
    return Toy(None)


def toy_sharded(layout: str = "contiguous", fault: str = "", fault_rank: int = 1) -> nn.Module:
    return Toy(layout, fault, fault_rank)


class Stacked(nn.Module):
    """Each rank returns a row of its own; a custom unshard function stacks them in reverse."""

    def __init__(self) -> None:
        super().__init__()
        self.glmfb_layouts = {"output": {"unshard": f"{HERE}:reverse_stack"}}

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.full((1, 3), float(_rank()))


def stacked() -> nn.Module:
    return Stacked()


def reverse_stack(tap: str, parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts[::-1], dim=0)


# ---- layouts and unsharding (no launch) --------------------------------------------------------


def test_layouts_parse_and_match_by_glob() -> None:
    obj = Toy("zigzag")
    obj.glmfb_layouts = {"mix": {"replicated": True}, "*": {"axis": 1, "order": "zigzag"}}
    layouts = declared_layouts(obj, "toy")
    assert layout_for("mix", layouts) == Layout("replicated")
    assert layout_for("head", layouts) == Layout("shard", axis=1, order="zigzag")
    assert layout_for("anything", ()) == Layout("replicated")
    assert Layout.parse({"axis": 2}, "x") == Layout("shard", axis=2, order="contiguous")
    assert Layout.parse({"unshard": "f.py:g"}, "x").to_dict() == {"unshard": "f.py:g"}
    for bad, message in (({"axis": -1}, "non-negative"), ({"axis": 1, "order": "ring"}, "order"),
                         ({"axis": 1, "stride": 2}, "stride"), ("rows", "a dict"), ({"replicated": 1}, "replicated"),
                         ({"unshard": "nocolon"}, "unshard")):
        with pytest.raises(InputError, match=message):
            Layout.parse(bad, "x")


def test_unshard_contiguous_and_zigzag_restore_the_sequence() -> None:
    whole = torch.arange(2 * 11 * 3).reshape(2, 11, 3)
    for world_size in (1, 2, 3, 4):
        for order in ("contiguous", "zigzag"):
            parts = [shard(whole, order, r, world_size) for r in range(world_size)]
            joined, record = unshard(parts, Layout("shard", axis=1, order=order), "t")
            assert torch.equal(joined, whole), (world_size, order)
            assert record["sizes"] == [p.shape[1] for p in parts]
            # every position goes back to the rank that held it
            for position in range(11):
                owner = owner_rank(record, position)
                assert owner is not None
                local = shard(torch.arange(11)[None, :, None], order, owner, world_size)
                assert position in local.flatten().tolist()


def test_unshard_refuses_parts_that_do_not_fit() -> None:
    whole = torch.arange(12.0).reshape(1, 12)
    parts = [whole[:, :5], whole[:, 5:]]  # a contiguous cut, but declared zig-zag: 6 + 6 expected
    with pytest.raises(InputError, match="rank 0 holds 5 along axis 1"):
        unshard(parts, Layout("shard", axis=1, order="zigzag"), "out")
    with pytest.raises(InputError, match="rank 1's part"):
        unshard([torch.zeros(1, 4, 2), torch.zeros(1, 4, 3)], Layout("shard", axis=1), "out")
    with pytest.raises(InputError, match=r"values differ between rank 0 and rank 2.*declares no layout"):
        unshard([torch.zeros(3), torch.zeros(3), torch.ones(3)], Layout("replicated"), "mix")
    same, record = unshard([torch.ones(3), torch.ones(3)], Layout("replicated"), "mix")
    assert torch.equal(same, torch.ones(3)) and record["kind"] == "replicated"
    joined, record = unshard([torch.zeros(1, 2), torch.ones(1, 2)], Layout("function", function="f.py:g"), "out",
                             reverse_stack)
    assert torch.equal(joined, torch.tensor([[1.0, 1.0], [0.0, 0.0]])) and owner_rank(record, 0) is None


def test_rank_of_and_rank_errors_name_where_an_error_starts() -> None:
    world_size = 2
    baseline = torch.zeros(1, 4, 3)  # four segments along axis 1 (zig-zag over 2 ranks: 0,1 | 1,0)
    parts = [shard(baseline, "zigzag", r, world_size).clone() for r in range(world_size)]
    parts[1][:, 1] += 1.0  # rank 1's second segment, segment 2 of the sequence, is off
    candidate, record = unshard(parts, Layout("shard", axis=1, order="zigzag"), "m")
    tap = TapRecord("m", "m", 0, "f", "t0", tuple(candidate.shape), "float32", record)
    assert [rank_of(tap, (0, j, 0)) for j in range(4)] == [0, 1, 1, 0]
    slices = rank_errors(baseline, candidate, record, Tolerance(0.0, 0.5))
    assert [(s.segment, s.rank, s.failed) for s in slices] == [(0, 0, False), (1, 1, False), (2, 1, True), (3, 0, False)]
    assert next(s for s in slices if s.failed).rank == 1
    assert slices[2].to_dict()["max_abs"] == 1.0
    assert rank_errors(baseline, candidate, None, Tolerance(0.0, 0.5)) == []
    assert rank_of(TapRecord("x", "x", 0, "f", "t0", (2,), "float32"), (1,)) is None


def manifest(ranks_taps: list[list[str]], rank: int) -> Manifest:
    taps = tuple(TapRecord(name, name, 0, "f", "t0", (1,), "float32") for name in ranks_taps[rank])
    return Manifest("t", {}, "module", (), (RequestRecord("a", 3, taps),), distributed={"world_size": len(ranks_taps), "rank": rank})


def test_the_rank_that_disagrees_on_taps_is_named() -> None:
    three = [["embed", "head"], ["embed", "head"], ["embed", "extra", "head"]]
    with pytest.raises(RankFailure, match="rank 2 disagrees with rank 0 on taps: request 'a', tap #1 is 'extra'") as caught:
        check_ranks_agree([manifest(three, r) for r in range(3)])
    assert caught.value.rank == 2 and caught.value.reason == "disagrees"
    two = [["embed", "head"], ["embed"]]
    with pytest.raises(RankFailure, match=r"rank 1 disagrees.*'head' only on rank 0") as caught:
        check_ranks_agree([manifest(two, r) for r in range(2)])
    check_ranks_agree([manifest(three[:2], r) for r in range(2)])


def test_manifest_rank_fields_are_optional_and_backward_compatible() -> None:
    old = {"schema": CAPTURE_SCHEMA, "target": "t", "requests": [
        {"id": "a", "length": 2, "taps": [{"name": "x", "module": "x", "call": 0, "file": "f", "key": "t0",
                                          "shape": [2], "dtype": "float32"}]}]}
    parsed = Manifest.from_dict(old)
    assert parsed.world_size is None and parsed.rank is None and parsed.requests[0].taps[0].layout is None
    written = parsed.to_dict()
    assert "distributed" not in written and "layout" not in written["requests"][0]["taps"][0]
    ranked = Manifest.from_dict({**old, "distributed": {"world_size": 4, "rank": 2}})
    assert (ranked.world_size, ranked.rank) == (4, 2)
    assert Manifest.from_dict(ranked.to_dict()).distributed == {"world_size": 4, "rank": 2}


def test_torchrun_root_cause_names_the_crashed_rank(tmp_path: Path) -> None:
    log = tmp_path / "launcher.log"
    log.write_text(
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n======\nRoot Cause (first observed failure):\n"
        "[0]:\n  time      : 2026-12-01_10:00:00\n  host      : box\n  rank      : 3 (local_rank: 3)\n"
        "  exitcode  : -11 (pid: 4242)\n  error_file: <N/A>\n  traceback : Signal 11 (SIGSEGV) received by PID 4242\n")
    failure = _failure(1, tmp_path, log, 4)
    assert failure.reason == "crashed" and failure.rank == 3
    assert "rank 3 crashed: killed by SIGSEGV" in str(failure)
    # the crashed rank's peer raised first (its collective lost the connection): still the crash
    (tmp_path / "rank0.json").write_text(json.dumps({"rank": 0, "state": "raised", "in_collective": True,
                                                     "error": "RuntimeError: Connection closed by peer", "request": "a"}))
    log.write_text(
        "Failures:\n[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -11 (pid: 7)  (SIGSEGV)\n"
        "------\nRoot Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 6)\n")
    failure = _failure(1, tmp_path, log, 2)
    assert (failure.reason, failure.rank) == ("crashed", 1) and "SIGSEGV" in str(failure)
    # a rank torn down by torchrun (SIGTERM) is not the one to blame when another died first
    (tmp_path / "rank0.json").unlink()
    log.write_text(
        "Failures:\n[1]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 6)\n"
        "------\nRoot Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : 3 (pid: 7)\n")
    failure = _failure(1, tmp_path, log, 2)
    assert (failure.reason, failure.rank) == ("crashed", 1) and "exit code 3" in str(failure)
    log.write_text("something else broke\n")
    assert _failure(1, tmp_path, log, 4).reason == "launcher"


def test_innermost_frame_skips_glmfb_torch_and_the_standard_library() -> None:
    import threading

    import glmfb.diff.rank_worker

    # The user's checkout sits in a folder named glmfb (as CI's clone does): still the user's.
    stack = ('Current thread 0x00007f (most recent call first):\n'
             f'  File "{threading.__file__}", line 629 in wait\n'
             f'  File "{glmfb.diff.rank_worker.__file__}", line 5 in run_rank\n'
             '  File "/ci/glmfb/torch/tests/test_diff_distributed.py", line 88 in _plant\n'
             f'  File "{nn.modules.module.__file__}", line 1 in _call_impl\n'
             '\nThread 0x00007e (most recent call first):\n  File "/x/other.py", line 3 in run\n')
    assert _innermost_frame(stack) == "test_diff_distributed.py:88 in _plant"
    only_library = f'Current thread 0x1 (most recent call first):\n  File "{threading.__file__}", line 9 in wait\n'
    assert _innermost_frame(only_library) == "threading.py:9 in wait"
    assert _innermost_frame("") is None


LATE_DUMPER = """
import faulthandler, signal, sys, time
signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # the first request for a stack goes unanswered
print("ready", flush=True)
time.sleep(float(sys.argv[2]))
if sys.argv[1] != "-":
    faulthandler.register(signal.SIGUSR1, file=open(sys.argv[1], "w"), all_threads=True)
def hang_here():
    time.sleep(60)
hang_here()
"""


@pytest.mark.parametrize("answers", [True, False], ids=["asked-again", "never"])
def test_a_hung_ranks_stack_is_asked_for_again_and_its_absence_said(tmp_path: Path, answers: bool) -> None:
    from glmfb.diff.distributed import STACK_WAIT_S, stack_path

    stack = stack_path(tmp_path, 0)
    child = subprocess.Popen([sys.executable, "-c", LATE_DUMPER, str(stack) if answers else "-", "1.5"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        started = time.monotonic()
        failure = _hung([0], {0: {"pid": child.pid, "state": "running", "request": "a"}}, tmp_path, 8.0)
        elapsed_s = time.monotonic() - started
    finally:
        child.kill()
        child.wait()
    if answers:
        assert "rank 0 hung in request 'a' (at <string>:" in str(failure) and "in hang_here)" in str(failure)
        assert elapsed_s < STACK_WAIT_S
    else:
        assert f"rank 0 hung in request 'a' (its stack did not arrive within {STACK_WAIT_S:g} s)" in str(failure)


def test_launch_goes_through_torch_distributed_run() -> None:
    command = launch_command("python", 4, Path(".ranks/spec.json"))
    assert command[:3] == ["python", "-m", "torch.distributed.run"]
    assert command[command.index("--nproc-per-node") + 1] == "4"
    assert command[command.index("--max-restarts") + 1] == "0"
    assert command[command.index("--log-dir") + 1] == str(Path(".ranks/torchelastic"))
    assert command[-3:] == ["-m", "glmfb.diff.rank_worker", str(Path(".ranks/spec.json"))]


def test_bad_input_is_refused_before_any_launch(tmp_path: Path) -> None:
    requests = write_requests(tmp_path)
    with pytest.raises(InputError, match="--nproc"):
        run_distributed_capture(DistributedCaptureConfig(f"{HERE}:toy_sharded", requests, tmp_path / "o", 0))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not empty and not a capture"):
        run_distributed_capture(DistributedCaptureConfig(f"{HERE}:toy_sharded", requests, tmp_path / "busy", 2))
    from glmfb.contract.errors import TargetError

    with pytest.raises(TargetError):
        run_distributed_capture(DistributedCaptureConfig(f"{HERE}:nothing_here", requests, tmp_path / "o", 2))


# ---- real launches (torchrun, gloo) ------------------------------------------------------------


def write_requests(directory: Path) -> Path:
    path = directory / "requests.jsonl"
    path.write_text('{"id": "a", "length": 12, "seed": 0, "vocab": 64}\n{"id": "b", "length": 7, "seed": 1, "vocab": 64}\n')
    return path


def launch_processes(out: Path) -> list[psutil.Process]:
    """Processes of a launch into ``out`` (torchrun's and the ranks' command lines name its spec)."""
    marker = str(out.resolve())
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def out_dir(tmp_path: Path) -> Iterator[Path]:
    out = tmp_path / "capture"
    yield out
    assert launch_processes(out) == [], "processes of the launch outlived it"


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_capture_on_ranks_unshards_to_the_single_process_capture(layout: str, tmp_path: Path, out_dir: Path) -> None:
    from glmfb.diff.engine import CaptureConfig, run_capture

    requests = write_requests(tmp_path)
    config = DistributedCaptureConfig(f"{HERE}:toy_sharded", requests, out_dir, 3, args={"layout": layout}, timeout_s=120)
    manifest_ = run_distributed_capture(config)
    assert manifest_.world_size == 3 and manifest_.rank is None
    assert [r["rank"] for r in manifest_.distributed["ranks"]] == [0, 1, 2]  # type: ignore[index]
    for rank in range(3):
        own = CaptureReader(out_dir / f"rank{rank}").manifest
        assert (own.rank, own.world_size) == (rank, 3)
        assert own.requests[0].taps[0].shape[1] == len(shard(torch.zeros(1, 12), layout, rank, 3)[0])
    run_capture(CaptureConfig(f"{HERE}:toy_single", tmp_path / "single", requests=requests))
    single, joined = CaptureReader(tmp_path / "single"), CaptureReader(out_dir)
    assert [t.name for t in joined.requests[0].taps] == [t.name for t in single.requests[0].taps]
    for request_s, request_j in zip(single.requests, joined.requests, strict=True):
        for tap_s, tap_j in zip(request_s.taps, request_j.taps, strict=True):
            assert tap_j.layout is not None and tap_j.layout["order"] == layout
            torch.testing.assert_close(joined.load(tap_j), single.load(tap_s), rtol=1e-12, atol=1e-12)
    slices = tap_rank_errors(single, joined, single.requests[0].taps[-1], joined.requests[0].taps[-1], Tolerance(0.0, 1e-9))
    assert [sl.rank for sl in slices] == ([0, 1, 2] if layout == "contiguous" else [0, 1, 2, 2, 1, 0])
    assert not any(sl.failed for sl in slices)
    data = json.loads((out_dir / "manifest.json").read_text())
    assert data["distributed"]["world_size"] == 3 and data["schema"] == CAPTURE_SCHEMA


@pytest.mark.slow
def test_a_target_provided_unshard_function(tmp_path: Path, out_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    requests = write_requests(tmp_path)
    system_tmp = tmp_path / "system-tmp"  # the launch's temporary directory: it must stay empty
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))
    run_distributed_capture(DistributedCaptureConfig(f"{HERE}:stacked", requests, out_dir, 2, timeout_s=120))
    assert [p.name for p in system_tmp.iterdir()] == [], "the launch left files in the temporary directory"
    reader = CaptureReader(out_dir)
    tap = reader.requests[0].taps[-1]
    assert tap.name == "output" and tap.layout is not None and tap.layout["kind"] == "function"
    assert torch.equal(reader.load(tap), torch.tensor([[1.0] * 3, [0.0] * 3]))


def failing_capture(tmp_path: Path, out: Path, fault: str, world_size: int = 2, timeout_s: float = 60,
                    fault_rank: int = 1) -> tuple[RankFailure, float]:
    requests = write_requests(tmp_path)
    config = DistributedCaptureConfig(f"{HERE}:toy_sharded", requests, out, world_size,
                                      args={"fault": fault, "fault_rank": fault_rank}, timeout_s=timeout_s)
    started = time.monotonic()
    with pytest.raises(RankFailure) as caught:
        run_distributed_capture(config)
    return caught.value, time.monotonic() - started


@pytest.mark.slow
def test_a_rank_that_raises_is_named(tmp_path: Path, out_dir: Path) -> None:
    failure, elapsed_s = failing_capture(tmp_path, out_dir, "raise", timeout_s=60)
    assert failure.reason == "raised" and failure.rank == 1
    assert "rank 1 raised in request 'a'" in str(failure) and "ValueError: planted failure on this rank" in str(failure)
    assert elapsed_s < 60  # torchrun ends the others at once; the hang timeout never comes into it


@pytest.mark.slow
def test_a_rank_that_hangs_is_named_when_its_timeout_passes(tmp_path: Path, out_dir: Path) -> None:
    timeout_s = 8.0
    failure, elapsed_s = failing_capture(tmp_path, out_dir, "hang", world_size=3, timeout_s=timeout_s, fault_rank=2)
    assert failure.reason == "hung" and failure.ranks == (2,)
    message = str(failure)
    assert "no progress for 8 s: rank 2 hung in request 'a'" in message
    assert "test_diff_distributed.py" in message and "_plant" in message  # where it hangs
    assert "rank 0, 1 waiting for it in a collective" in message
    assert timeout_s <= elapsed_s < timeout_s + 40  # start-up (~5 s here) + timeout + teardown


@pytest.mark.slow
def test_one_rank_raises_while_another_hangs(tmp_path: Path, out_dir: Path) -> None:
    # rank 1 raises, rank 2 blocks forever: torchrun's teardown of the failed group ends both
    requests = write_requests(tmp_path)

    config = DistributedCaptureConfig(f"{HERE}:raise_and_hang", requests, out_dir, 3, timeout_s=30)
    started = time.monotonic()
    with pytest.raises(RankFailure) as caught:
        run_distributed_capture(config)
    elapsed_s = time.monotonic() - started
    assert caught.value.reason == "raised" and caught.value.rank == 1
    assert elapsed_s < 30


def raise_and_hang() -> nn.Module:
    return RaiseAndHang()


class RaiseAndHang(nn.Module):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rank = _rank()
        if rank == 1:
            raise RuntimeError("rank 1 gives up")
        if rank == 2:
            threading.Event().wait()
        return input_ids.double()


@pytest.mark.slow
def test_a_rank_that_crashes_is_named(tmp_path: Path, out_dir: Path) -> None:
    failure, elapsed_s = failing_capture(tmp_path, out_dir, "crash", timeout_s=60)
    assert failure.reason == "crashed" and failure.rank == 1
    assert "rank 1 crashed in request 'a': killed by SIGSEGV" in str(failure)
    assert elapsed_s < 60


@pytest.mark.slow
def test_a_rank_that_disagrees_on_taps_is_named(tmp_path: Path, out_dir: Path) -> None:
    failure, _ = failing_capture(tmp_path, out_dir, "disagree")
    assert failure.reason == "disagrees" and failure.rank == 1
    assert "rank 1 disagrees with rank 0 on taps" in str(failure) and "'extra'" in str(failure)


# ---- through glmfb diff: a rank that raises or hangs is an error verdict naming the rank -------


@pytest.mark.slow
@pytest.mark.parametrize(("target", "args", "phrase"), [
    ("toy_sharded", ["--candidate-arg", "fault=raise", "--candidate-nproc", "2"], "rank 1 raised"),
    ("toy_sharded", ["--candidate-arg", "fault=hang", "--candidate-nproc", "2", "--rank-timeout", "8s"], "rank 1 hung"),
    ("raise_and_hang", ["--candidate-nproc", "3", "--rank-timeout", "30s"], "rank 1 raised"),
])
def test_a_rank_that_raises_or_hangs_is_an_error_verdict(tmp_path: Path, target: str, args: list[str],
                                                          phrase: str) -> None:
    import json
    import os
    import subprocess
    import sys
    import uuid

    from test_isolation import MARK, wait_for_no_leftovers

    requests = write_requests(tmp_path)
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "glmfb", "diff", f"{HERE}:toy_single", f"{HERE}:{target}", "--requests", str(requests),
         *args, "--json", "--out", str(tmp_path / "reports"), "--timeout", "120s"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180)
    elapsed_s = time.monotonic() - started
    assert result.returncode == 3, result.stderr[-2000:]
    verdict = json.loads(result.stdout)
    assert verdict["status"] == "error" and verdict["layer"] == "harness"
    assert phrase in verdict["why"], verdict["why"]
    assert elapsed_s < 90, elapsed_s
    assert wait_for_no_leftovers(mark, within_s=10) == []


@pytest.mark.slow
def test_glmfb_capture_on_ranks_then_diff_names_the_rank(tmp_path: Path) -> None:
    """glmfb capture --nproc 3, then glmfb diff of the single-process capture against it, with
    rank 2's piece of the sequence perturbed: where.rank = 2."""
    import json

    from typer.testing import CliRunner

    from glmfb.cli import app

    requests = write_requests(tmp_path)
    runner = CliRunner()
    single = runner.invoke(app, ["capture", f"{HERE}:toy_single", "--requests", str(requests), "--out",
                                 str(tmp_path / "single")])
    assert single.exit_code == 0, single.stderr
    ranks = runner.invoke(app, ["capture", f"{HERE}:toy_sharded", "--requests", str(requests), "--out",
                                str(tmp_path / "ranks"), "--nproc", "3", "--arg", "fault=perturb", "--arg", "fault_rank=2"])
    assert ranks.exit_code == 0, ranks.stderr
    again = runner.invoke(app, ["capture", f"{HERE}:toy_sharded", "--requests", str(requests), "--out",
                                str(tmp_path / "ranks"), "--nproc", "3"])
    assert again.exit_code == 2 and "already exists" in again.stderr
    result = runner.invoke(app, ["diff", str(tmp_path / "single"), str(tmp_path / "ranks"), "--json",
                                 "--out", str(tmp_path / "reports")])
    assert result.exit_code == 1, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["where"]["rank"] == 2, verdict["where"]
    slices = next(e for e in verdict["evidence"] if e["kind"] == "rank_errors")["slices"]
    assert [s["failed"] for s in slices] == [False, False, True]


@pytest.mark.slow
def test_a_pass_on_ranks_says_it_ran_on_ranks(tmp_path: Path) -> None:
    """A passing diff whose candidate ran on 3 gloo ranks records it (evidence ``side``, env
    ``distributed``) and says it in the why: a pass on ranks never looks like a single-process
    pass to a gate or an agent."""
    import json

    from typer.testing import CliRunner

    from glmfb.cli import app

    requests = write_requests(tmp_path)
    runner = CliRunner()
    for target, out, extra in (("toy_single", "single", []), ("toy_sharded", "ranks", ["--nproc", "3"])):
        made = runner.invoke(app, ["capture", f"{HERE}:{target}", "--requests", str(requests), "--out",
                                   str(tmp_path / out), *extra])
        assert made.exit_code == 0, made.stderr
    result = runner.invoke(app, ["diff", str(tmp_path / "single"), str(tmp_path / "ranks"), "--json",
                                 "--out", str(tmp_path / "reports")])
    assert result.exit_code == 0, result.stderr
    verdict = json.loads(result.stdout)
    sides = {e["side"]: e for e in verdict["evidence"] if e["kind"] == "side"}
    assert (sides["baseline"]["world_size"], sides["candidate"]["world_size"]) == (1, 3)
    assert sides["candidate"]["backend"] == "gloo" and sides["candidate"]["layouts"]
    assert verdict["env"]["distributed"] == {"candidate": {"world_size": 3, "backend": "gloo"}}
    assert "The candidate ran on 3 torch.distributed ranks (gloo), the baseline in one process." in verdict["why"]
    single = runner.invoke(app, ["diff", str(tmp_path / "single"), str(tmp_path / "single"), "--json",
                                 "--out", str(tmp_path / "reports")])
    plain = json.loads(single.stdout)
    assert "distributed" not in plain["env"] and "ranks" not in plain["why"]
