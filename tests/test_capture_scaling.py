"""A capture's manifest costs O(requests) to write and to read, and a capture cut short reads
as the requests it finished.

The writer used to rewrite (and fsync) the whole manifest after every request: O(N^2) bytes,
1,600 requests in 70 s, 100,000 never done. These tests count what reaches the disk instead of
timing it (benchmarks/capture_scaling.py has the figures). The names this change added are
reached through the module (``store.INDEX``), so that on the earlier code each test fails on
its own instead of the module failing to import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from glmfb.contract.errors import InputError
from glmfb.core.io import write_json_atomic
from glmfb.diff import store
from glmfb.diff.store import CAPTURE_SCHEMA, MANIFEST, CaptureReader, CaptureWriter, Manifest

ROOT = Path(__file__).resolve().parents[1]


def new_writer(out: Path, **extra: Any) -> CaptureWriter:
    return CaptureWriter(out, target="synthetic:scaling", args={"width": 4}, kind="module", tap_globs=(),
                         env={"python": "3"}, git=None, created="now", **extra)


def write_requests(writer: CaptureWriter, first: int, count: int) -> None:
    """``count`` requests of two tiny taps each (a module call and the final output)."""
    for index in range(first, first + count):
        writer.begin_request()
        writer.write_call("layer", 0, [("layer", torch.full((3,), float(index)))])
        writer.write_call("output", 0, [("output", torch.ones(2))])
        writer.end_request(f"q{index}", 3, ())


def manifest_writes(tmp_path: Path, requests: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int, int]:
    """Capture ``requests`` requests; how many times a whole manifest was put in place, the
    bytes of those manifests together, and the fsyncs (counted where glmfb calls them)."""
    replaced: list[int] = []
    fsyncs: list[int] = []
    real_replace, real_fsync = os.replace, os.fsync

    def counting_replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if Path(dst).name == MANIFEST:
            replaced.append(os.stat(src).st_size)
        real_replace(src, dst, *args, **kwargs)

    def counting_fsync(fd: Any) -> None:
        fsyncs.append(1)
        real_fsync(fd)

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", counting_replace)
        patch.setattr(os, "fsync", counting_fsync)
        writer = new_writer(tmp_path / f"cap{requests}")
        write_requests(writer, 0, requests)
        manifest = writer.finish()
    assert [r.id for r in manifest.requests] == [f"q{i}" for i in range(requests)]
    return len(replaced), sum(replaced), len(fsyncs)


def test_writing_n_requests_writes_the_manifest_a_constant_number_of_times(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small_writes, small_bytes, small_fsyncs = manifest_writes(tmp_path, 60, monkeypatch)
    large_writes, large_bytes, large_fsyncs = manifest_writes(tmp_path, 240, monkeypatch)
    # once when the capture begins (empty, incomplete), once when it ends (before: once per request)
    assert small_writes == large_writes == 2
    assert small_fsyncs == large_fsyncs == 2
    # four times the requests, about four times the bytes (before: sixteen times, O(N^2))
    assert large_bytes < 4.5 * small_bytes, (small_bytes, large_bytes)
    final = (tmp_path / "cap240" / MANIFEST).stat().st_size
    assert large_bytes < 1.1 * final


def test_the_final_capture_holds_the_whole_manifest_and_no_index(tmp_path: Path) -> None:
    writer = new_writer(tmp_path / "cap")
    write_requests(writer, 0, 5)
    partial = writer.directory
    assert (partial / store.INDEX).is_file()
    manifest = writer.finish()
    out = tmp_path / "cap"
    assert not partial.exists() and not (out / store.INDEX).exists()
    data = json.loads((out / MANIFEST).read_text())
    assert data == json.loads(json.dumps(manifest.to_dict()))  # the same fields, whatever their order
    assert data["schema"] == CAPTURE_SCHEMA and data["complete"] is True
    assert data["request_ids"] == [f"q{i}" for i in range(5)] and data["taps"] == ["layer", "output"]
    reader = CaptureReader(out)
    assert reader.manifest == manifest
    assert torch.equal(reader.load(reader.requests[3].taps[0]), torch.full((3,), 3.0))


CRASHING_WRITER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    import torch
    from glmfb.diff.store import CaptureWriter

    out, finished = Path(sys.argv[1]), int(sys.argv[2])
    writer = CaptureWriter(out, target="synthetic:crash", args={}, kind="module", tap_globs=(), env={},
                           git=None, created="now")
    for index in range(finished):
        writer.begin_request()
        writer.write_call("layer", 0, [("layer", torch.full((3,), float(index)))])
        writer.write_call("output", 0, [("output", torch.ones(2))])
        writer.end_request(f"q{index}", 3, ())
    writer.begin_request()  # one more, killed before it ends
    writer.write_call("layer", 0, [("layer", torch.zeros(3))])
    print(os.getpid(), flush=True)
    os._exit(1)
""")


def test_a_writer_killed_mid_run_leaves_a_folder_that_reads_as_the_requests_it_finished(tmp_path: Path) -> None:
    out, finished = tmp_path / "cap", 7
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    child = subprocess.run([sys.executable, "-c", CRASHING_WRITER, str(out), str(finished)], env=env,
                           capture_output=True, text=True, timeout=120, check=False)
    assert child.returncode == 1, child.stderr
    partial = tmp_path / f".cap.partial-{child.stdout.strip()}"
    assert partial.is_dir() and not out.exists()  # never looks like a finished capture
    manifest = store.read_manifest(partial)
    assert manifest.complete is False
    assert [r.id for r in manifest.requests] == [f"q{i}" for i in range(finished)]
    assert manifest.target == "synthetic:crash"
    assert all((partial / tap.file).is_file() for r in manifest.requests for tap in r.taps)
    # the manifest itself is whole JSON that says incomplete: an earlier glmfb refuses it too
    assert json.loads((partial / MANIFEST).read_text())["complete"] is False
    with pytest.raises(InputError, match="the capture is incomplete"):
        CaptureReader(partial)


def test_an_index_line_cut_short_is_dropped_and_a_malformed_one_refused(tmp_path: Path) -> None:
    writer = new_writer(tmp_path / "cap")
    write_requests(writer, 0, 3)
    partial = writer.directory
    with open(partial / store.INDEX, "ab") as index:  # the process stopped in the middle of a line
        index.write(b'{"id": "q3", "length": 3, "ta')
    assert [r.id for r in store.read_manifest(partial).requests] == ["q0", "q1", "q2"]
    lines = (partial / store.INDEX).read_bytes().split(b"\n")
    (partial / store.INDEX).write_bytes(b"\n".join([lines[0], b'{"id": "q1"', *lines[2:]]))
    with pytest.raises(InputError, match=rf"{store.INDEX}:2: malformed index line"):
        store.read_manifest(partial)
    writer.abandon()
    assert not partial.exists()


def test_a_complete_manifest_wins_over_an_index_left_beside_it(tmp_path: Path) -> None:
    """Stopped between the final manifest and the index's removal: the capture is complete."""
    writer = new_writer(tmp_path / "cap")
    write_requests(writer, 0, 4)
    manifest = writer.finish()
    (tmp_path / "cap" / store.INDEX).write_bytes(b'{"id": "stale"}\n')
    assert CaptureReader(tmp_path / "cap").manifest == manifest


def test_manifests_laid_out_otherwise_read_the_same(tmp_path: Path) -> None:
    """An earlier version's manifest (indented throughout), one rewritten whole (as a diff's
    pruning and unsharding write it), and an earlier version's capture cut short (its
    requests in its manifest, no index)."""
    writer = new_writer(tmp_path / "cap", distributed={"world_size": 2, "rank": 0, "layouts": {}})
    write_requests(writer, 0, 6)
    manifest = writer.finish()
    path = tmp_path / "cap" / MANIFEST
    assert store.read_manifest(tmp_path / "cap") == manifest  # read a line at a time
    write_json_atomic(path, manifest.to_dict())
    assert "\n    {\n" in path.read_text()  # indented throughout: not the line layout
    assert store.read_manifest(tmp_path / "cap") == manifest
    path.write_text(json.dumps(manifest.to_dict()))
    assert CaptureReader(tmp_path / "cap").manifest == manifest
    old_partial = Manifest.from_dict({**manifest.to_dict(), "complete": False})
    write_json_atomic(path, old_partial.to_dict())
    read = store.read_manifest(tmp_path / "cap")
    assert read.complete is False and read.requests == manifest.requests


def test_a_malformed_manifest_in_the_written_layout_is_still_refused(tmp_path: Path) -> None:
    writer = new_writer(tmp_path / "cap")
    write_requests(writer, 0, 3)
    writer.finish()
    path = tmp_path / "cap" / MANIFEST
    text = path.read_text()
    path.write_text(text.replace("},\n    {", "}\n    {", 1))  # a comma missing between two requests
    with pytest.raises(InputError, match="not valid JSON"):
        CaptureReader(tmp_path / "cap")
    path.write_text(text.replace('"schema": "glmfb.capture/1"', '"schema": "glmfb.capture/9"'))
    with pytest.raises(InputError, match="unknown capture schema"):
        CaptureReader(tmp_path / "cap")
    path.write_text(text.replace('"key": "t0", ', "", 1))
    with pytest.raises(InputError, match="malformed manifest"):
        CaptureReader(tmp_path / "cap")
