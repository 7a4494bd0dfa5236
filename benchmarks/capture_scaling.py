"""How writing and reading a capture scale with the number of requests.

    python benchmarks/capture_scaling.py [--sizes 1000,10000,100000] [--dir /tmp] [--store FILE] [--smoke]

For each size N, one subprocess writes a capture of N requests with the real
:class:`~glmfb.diff.store.CaptureWriter` (each request: one module call and the final output,
each a tensor of four floats, so that the time is the capture's bookkeeping, not tensor
bytes), and then another subprocess opens it with :class:`~glmfb.diff.store.CaptureReader`
(what a diff does first with each side) and matches its taps against themselves
(:func:`~glmfb.diff.compare.match_taps`, the diff's pass over every record before any tensor
is read). Each prints requests per second and its peak RSS: ``VmHWM`` of its own process
image (a fresh process per phase and size, so that one size's memory does not hide the next
one's), beside its RSS when it started (the interpreter and imports). Writing imports torch
(a tap is a tensor); reading does not.

A capture written in linear time writes each finished request once (one line appended to an
index) and the whole manifest once, at the end; one that rewrites the whole manifest after
every request slows down with every request (quadratic: 1,600 requests took 70 s that way).
``--store FILE`` runs the phases with another copy of ``glmfb/diff/store.py`` (for instance
the previous version, from ``git show HEAD~1:glmfb/diff/store.py``), so that the two can be
compared on one machine in one run; give it small sizes, a quadratic writer takes hours at
100,000. The capture folders are deleted at the end. ``--smoke``: 200 requests (CI checks
that the script runs; its figures are not the benchmark's).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

DEFAULT_SIZES = (1_000, 10_000, 100_000)
SMOKE_SIZES = (200,)


def memory_mib(field: str) -> float:
    """``VmHWM`` (peak) or ``VmRSS`` (now) of this process image, in MiB (``ru_maxrss`` would
    count the parent's RSS at fork time, which Linux carries across exec)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_store(path: str | None) -> ModuleType:
    """``glmfb.diff.store``, or the copy of it at ``path`` loaded under another name."""
    if not path:
        import glmfb.diff.store as store

        return store
    spec = importlib.util.spec_from_file_location("capture_scaling_store", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write_phase(store: ModuleType, directory: Path, requests: int) -> dict[str, Any]:
    """Write a capture of ``requests`` requests; timed from the writer's creation to
    :meth:`finish` (the final manifest written and the folder renamed into place)."""
    import torch

    layer, output = torch.arange(4, dtype=torch.float32), torch.ones(4)
    started_rss = memory_mib("VmRSS")
    started = time.perf_counter()
    writer = store.CaptureWriter(directory, target="synthetic:scaling", args={}, kind="module",
                                 tap_globs=(), env={}, git=None, created="")
    for index in range(requests):
        writer.begin_request()
        writer.write_call("layers.0", 0, [("layers.0", layer)])
        writer.write_call("output", 0, [("output", output)])
        writer.end_request(f"q{index}", 4, ())
    writer.finish()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "start_rss_mib": started_rss, "peak_rss_mib": memory_mib("VmHWM"),
            "manifest_bytes": (directory / "manifest.json").stat().st_size}


def read_phase(store: ModuleType, directory: Path, requests: int) -> dict[str, Any]:
    """Open the capture and match its taps, as a diff begins; timed from the open."""
    from glmfb.diff.compare import match_taps

    started_rss = memory_mib("VmRSS")
    started = time.perf_counter()
    reader = store.CaptureReader(directory)
    assert len(reader.requests) == requests
    pairs, _ = match_taps(reader.requests, reader.requests)
    assert sum(len(p) for p in pairs) == 2 * requests
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "start_rss_mib": started_rss, "peak_rss_mib": memory_mib("VmHWM")}


def run_phase(phase: str, directory: Path, requests: int, store: str | None) -> dict[str, Any]:
    """One phase in a fresh interpreter; its measurements as a dict."""
    command = [sys.executable, __file__, "--phase", phase, "--requests", str(requests), "--dir", str(directory)]
    if store:
        command += ["--store", store]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{phase} of {requests} requests failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in DEFAULT_SIZES),
                        help="request counts, comma-separated (default 1000,10000,100000)")
    parser.add_argument("--dir", default=None, help="where the captures are written (default: the system temp folder)")
    parser.add_argument("--store", default=None, help="another copy of glmfb/diff/store.py to measure instead")
    parser.add_argument("--smoke", action="store_true", help="200 requests: checks the path, not the figure")
    parser.add_argument("--phase", choices=("write", "read"), help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.phase:
        store = load_store(options.store)
        phase = write_phase if options.phase == "write" else read_phase
        print(json.dumps(phase(store, Path(options.dir), options.requests)))
        return 0
    sizes = SMOKE_SIZES if options.smoke else tuple(int(s) for s in options.sizes.split(",") if s.strip())
    if options.smoke:
        print("smoke run (--smoke): 200 requests; its figures are not the benchmark's")
    store_name = options.store or "glmfb/diff/store.py"
    print(f"capture scaling, {store_name}; python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
          "each request: 2 taps of 4 floats, one file each")
    print(f"{'requests':>9}  {'phase':<5}  {'seconds':>8}  {'requests/s':>10}  {'peak RSS MiB':>12}  "
          f"{'start RSS MiB':>13}  {'manifest MB':>11}")
    root = Path(tempfile.mkdtemp(prefix="glmfb-capture-scaling-", dir=options.dir))
    try:
        for size in sizes:
            directory = root / f"cap{size}"
            for phase in ("write", "read"):
                result = run_phase(phase, directory, size, options.store)
                if phase == "write":
                    manifest_mb = f"{result['manifest_bytes'] / 1e6:11.1f}"
                else:
                    manifest_mb = f"{'':>11}"
                print(f"{size:>9}  {phase:<5}  {result['seconds']:8.2f}  {size / result['seconds']:10.0f}  "
                      f"{result['peak_rss_mib']:12.0f}  {result['start_rss_mib']:13.0f}  {manifest_mb}", flush=True)
            shutil.rmtree(directory, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if options.smoke:
        print("smoke run (--smoke): done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
