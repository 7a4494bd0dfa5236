"""Compare throughput of ``glmfb diff`` on captures of a few GB per side, beside
``torch.testing.assert_close`` and a plain tensor copy over the same tensors, in one run.

    python benchmarks/diff_throughput.py [--gib 2] [--tensor-mib 128] [--dir /tmp] [--smoke]

Writes two capture directories (baseline, and a candidate with relative noise 1e-3, which
passes rtol=1e-2 so that every method does its whole check) under a temporary folder, then
measures each method in a fresh subprocess (so peak RSS is the method's own, torch included):

- glmfb: ``compare_captures`` (every metric, one fused chunked pass per pair, read from the
  files in the page cache); GB/s = bytes of tensor data read, both sides, per second.
- assert_close: ``torch.testing.assert_close(candidate, baseline)`` per pair, tensors already
  in memory (loading them is not timed): the same bytes per second.
- copy: ``baseline.clone()`` and ``candidate.clone()`` per pair, in memory: bytes read per second.

The files are deleted at the end. Figures depend on the machine and its load: compare the
ratios printed by one run. ``--smoke``: 20 MiB a side in 4 MiB tensors, two requests (CI checks
the script runs; its figures are not the benchmark's).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RTOL, ATOL = 1e-2, 1e-5
SMOKE_NOTE = ("smoke run (--smoke): 20 MiB a side in 4 MiB tensors; the figures are measured but are not "
              "the benchmark's")


def peak_rss_mib() -> float:
    """Peak resident memory of this process image: VmHWM (ru_maxrss would include the RSS of
    the parent at fork time, which Linux carries across exec)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_captures(root: Path, total_gib: float, tensor_mib: int) -> int:
    import torch

    from glmfb.diff.store import CaptureWriter

    numel = tensor_mib * 2**20 // 4
    tensors = max(1, round(total_gib * 1024 / tensor_mib))
    writers = [
        CaptureWriter(root / side, target=f"synthetic:{side}", args={}, kind="module", tap_globs=(), env={}, git=None, created="")
        for side in ("baseline", "candidate")
    ]
    generator = torch.Generator().manual_seed(0)
    per_request = 4
    for start in range(0, tensors, per_request):
        for writer in writers:
            writer.begin_request()
        for index in range(start, min(start + per_request, tensors)):
            base = torch.randn(numel, generator=generator)
            cand = base * (1 + 1e-3 * torch.randn(numel, generator=generator))
            writers[0].write_call(f"layers.{index}", 0, [(f"layers.{index}", base)])
            writers[1].write_call(f"layers.{index}", 0, [(f"layers.{index}", cand)])
            del base, cand
        # each request's final output (what a model returns; a diff compares requests by it):
        # small, so the bytes measured stay the layers'
        base = torch.randn(1024, generator=generator)
        cand = base * (1 + 1e-3 * torch.randn(1024, generator=generator))
        writers[0].write_call("output", 0, [("output", base)])
        writers[1].write_call("output", 0, [("output", cand)])
        for writer in writers:
            writer.end_request(f"r{start // per_request}", None, ())
    for writer in writers:
        writer.finish()
    return tensors * numel * 4


def worker(method: str, root: Path) -> dict[str, Any]:
    import torch

    from glmfb.diff.compare import compare_captures
    from glmfb.diff.metrics import PairComparer, Tolerances
    from glmfb.diff.store import CaptureReader

    baseline, candidate = CaptureReader(root / "baseline"), CaptureReader(root / "candidate")
    pairs = [(b, c) for rb, rc in zip(baseline.requests, candidate.requests, strict=True)
             for b, c in zip(rb.taps, rc.taps, strict=True)]
    data_bytes = 2 * sum(b.numel * 4 for b, _ in pairs)
    if method == "glmfb":
        started = time.perf_counter()
        with PairComparer() as comparer:
            results = compare_captures(baseline, candidate, Tolerances(RTOL, ATOL), comparer)
        elapsed = time.perf_counter() - started
        assert not any(r.failed for r in results)
        assert all(t.metrics.max_abs > ATOL for r in results for t in r.taps)  # full path taken
    else:
        elapsed = 0.0
        for tap_b, tap_c in pairs:
            b, c = baseline.load(tap_b), candidate.load(tap_c)
            started = time.perf_counter()
            if method == "assert_close":
                torch.testing.assert_close(c, b, rtol=RTOL, atol=ATOL)
            else:
                b.clone()
                c.clone()
            elapsed += time.perf_counter() - started
            del b, c
    threads = "1 torch + 1 reader" if method == "glmfb" else f"{torch.get_num_threads()} torch"
    return {"seconds": elapsed, "gb_per_s": data_bytes / elapsed / 1e9, "bytes": data_bytes,
            "peak_rss_mib": peak_rss_mib(), "threads": threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=2.0, help="tensor data per side (GiB)")
    parser.add_argument("--tensor-mib", type=int, default=128, help="size of one tensor (MiB)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to write the captures")
    parser.add_argument("--worker", choices=["glmfb", "assert_close", "copy"], help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="20 MiB a side (CI checks the script runs)")
    options = parser.parse_args()
    if options.smoke:
        options.gib, options.tensor_mib = 20 / 1024, 4
        print(SMOKE_NOTE, flush=True)
    if options.worker:
        print(json.dumps(worker(options.worker, options.root)))
        return

    root = Path(tempfile.mkdtemp(prefix="glmfb-diff-bench-", dir=options.dir))
    try:
        started = time.perf_counter()
        data = make_captures(root, options.gib, options.tensor_mib)
        print(f"captures: {data / 2**30:.2f} GiB per side in {root} (written in {time.perf_counter() - started:.0f} s)")
        figures: dict[str, dict[str, Any]] = {}
        for method in ("glmfb", "assert_close", "copy"):
            output = subprocess.run(
                [sys.executable, __file__, "--worker", method, "--root", str(root)],
                check=True, capture_output=True, text=True,
            ).stdout
            figures[method] = json.loads(output.strip().splitlines()[-1])
            row = figures[method]
            print(f"{method:>12}: {row['gb_per_s']:6.2f} GB/s read (both sides), {row['seconds']:6.2f} s, "
                  f"peak RSS {row['peak_rss_mib']:6.0f} MiB, threads: {row['threads']}")
        glmfb = figures["glmfb"]["gb_per_s"]
        print(f"ratios: glmfb / assert_close = {glmfb / figures['assert_close']['gb_per_s']:.1f}x, "
              f"glmfb / copy = {glmfb / figures['copy']['gb_per_s']:.2f}x")
        print("glmfb reads the files (page cache); assert_close and copy are timed on tensors already in memory.")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
