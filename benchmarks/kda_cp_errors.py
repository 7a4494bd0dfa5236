"""Context-parallel KDA against one device: relative error per context length for each merge
precision, at world sizes 2 and 4, with the fitted growth, measured in one run.

    python benchmarks/kda_cp_errors.py [--lengths 512,1024,2048,4096,8192] [--configs 2:contiguous,2:zigzag,4:contiguous,4:zigzag]
                                       [--atol 2e-3] [--json FILE] [--probe-timing] [--smoke]

For each world size and layout, one ``torch.distributed.run`` launch (gloo on CPU, nccl with
CUDA) runs ``scenarios/kda_cp/check.py``: the CP model on real ranks for every length and
precision (ieee, tf32, tf32x3), against the single-device model in float32 and float64.
Printed per configuration: the relative L2 error of the outputs and of the merge's incoming
states against float32 (and the outputs against float64), the log-log growth exponent of each
precision's error over length with its r², whether the largest element error stays within
``--atol`` (the tolerance the probes use), and the counterfactual: how many times smaller the
error is with tf32x3 (and ieee) than with tf32 at the longest length.

``--probe-timing`` also times what one CP probe does, three times (tf32, tf32x3, ieee), in
this process: capture the single-device target, capture the CP target on ranks, compare.

``--smoke``: world size 2, zigzag, lengths 128, 256 and 512, and the probe timing once (tf32)
on two short requests (CI checks the script runs; its figures are not the benchmark's).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHECK = ROOT / "scenarios" / "kda_cp" / "check.py"
REQUESTS = ROOT / "scenarios" / "kda_cp" / "requests.jsonl"
PRECISIONS = ("ieee", "tf32", "tf32x3")
SMOKE_NOTE = ("smoke run (--smoke): world size 2 zigzag, lengths 128-512, one timed probe (tf32) on two short "
              "requests; the figures are measured but are not the benchmark's")


def loglog_fit(lengths: list[float], errors: list[float]) -> tuple[float, float] | None:
    """Slope and r² of log(error) against log(length); None with a zero error or < 3 points."""
    if len(lengths) < 3 or min(errors) <= 0:
        return None
    xs, ys = [math.log(x) for x in lengths], [math.log(y) for y in errors]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    residual = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in zip(xs, ys, strict=True))
    total = sum((y - mean_y) ** 2 for y in ys)
    return slope, (1 - residual / total) if total > 0 else 1.0


def launch(world_size: int, layout: str, lengths: str, directory: Path) -> tuple[dict[str, Any], float]:
    out = directory / f"kda-{world_size}-{layout}.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world_size),
               "--log-dir", str(directory / "torchelastic"),  # else torchrun leaves a folder in /tmp
               str(CHECK), "--lengths", lengths, "--precisions", ",".join(PRECISIONS), "--layout", layout,
               "--out", str(out)]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    elapsed_s = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return json.loads(out.read_text()), elapsed_s


def table(report: dict[str, Any], atol: float) -> list[str]:
    rows = report["rows"]
    lengths = sorted({r["length"] for r in rows})
    get = {(r["length"], r["precision"]): r for r in rows}
    lines = [f"{'length':>7} | " + " | ".join(f"{p:>8} out  state  out/f64  max|e|" for p in PRECISIONS)]
    for length in lengths:
        cells = []
        for precision in PRECISIONS:
            r = get[(length, precision)]
            worst = max(r["output_max_abs_vs_float32"], r["state_max_abs_vs_float32"])
            cells.append(f"{r['output_vs_float32']:.2e} {r['state_vs_float32']:.2e} {r['output_vs_float64']:.2e} "
                         f"{worst:.1e}{' ' if worst <= atol else '!'}")
        lines.append(f"{length:>7} | " + " | ".join(cells))
    for key, label in (("output_vs_float32", "outputs"), ("state_vs_float32", "merge states")):
        fits = []
        for precision in PRECISIONS:
            fit = loglog_fit([float(n) for n in lengths], [get[(n, precision)][key] for n in lengths])
            fits.append(f"{precision} {fit[0]:+.2f} (r² {fit[1]:.2f})" if fit else f"{precision} n/a (zero error)")
        lines.append(f"  growth exponent, {label}: " + ", ".join(fits))
    longest = lengths[-1]
    tf32 = get[(longest, "tf32")]["output_vs_float32"]
    factors = []
    for precision in ("tf32x3", "ieee"):
        other = get[(longest, precision)]["output_vs_float32"]
        factors.append(f"{precision} {tf32 / other:.0f}x smaller" if other > 0 else f"{precision}: both zero")
    lines.append(f"  counterfactual at {longest}: error with tf32 {tf32:.2e}; " + ", ".join(factors))
    shortest = lengths[0]
    verdict = []
    for precision in PRECISIONS:
        passes = [max(get[(n, precision)]["output_max_abs_vs_float32"], get[(n, precision)]["state_max_abs_vs_float32"]) <= atol
                  for n in (shortest, longest)]
        verdict.append(f"{precision} {'pass' if passes[0] else 'FAIL'} at {shortest}, {'pass' if passes[1] else 'FAIL'} at {longest}")
    lines.append(f"  against atol {atol:g} (every element of outputs and merge states): " + "; ".join(verdict))
    cp_s = sum(r["cp_forward_s"] for r in rows)
    single_s = sum(r["single_forward_s"]["float32"] for r in rows if r["precision"] == PRECISIONS[0])
    lines.append(f"  forward time, all lengths: CP {cp_s:.1f} s over {len(PRECISIONS)} precisions "
                 f"(slowest rank), single device float32 {single_s:.1f} s")
    return lines


def probe_timing(world_size: int, layout: str, atol: float, requests: Path = REQUESTS,
                 precisions: tuple[str, ...] = ("tf32", "tf32x3", "ieee")) -> list[str]:
    """One CP probe's work, once per merge precision, in this process: captures of both
    sides, then the diff."""
    sys.path.insert(0, str(ROOT))
    from glmfb.core.probe import ProbeContext
    from glmfb.diff.config import CaptureConfig, DiffConfig
    from glmfb.diff.distributed import DistributedCaptureConfig, run_distributed_capture
    from glmfb.diff.engine import run_capture, run_diff

    taps = ("layers.*.attn.merge", "layers.*.attn.o_proj")
    lines = [f"probe timing (world {world_size}, {layout}, taps {', '.join(taps)}, atol {atol:g}):"]
    total_s = 0.0
    with tempfile.TemporaryDirectory() as scratch:
        for precision in precisions:
            base = Path(scratch) / precision
            started = time.perf_counter()
            run_capture(CaptureConfig(str(ROOT / "scenarios/kda_cp/model.py:single"), base / "single",
                                      args={"world_size": world_size, "layout": layout}, requests=requests,
                                      taps=taps))
            single_s = time.perf_counter() - started
            run_distributed_capture(DistributedCaptureConfig(
                str(ROOT / "scenarios/kda_cp/model.py:cp"), requests, base / "cp", world_size,
                args={"merge_precision": precision, "layout": layout}, taps=taps))
            cp_s = time.perf_counter() - started - single_s
            verdict = run_diff(DiffConfig(f"kda-cp-{precision}", str(base / "single"), str(base / "cp"),
                                          rtol=0.0, atol=atol),
                               ProbeContext(run_id=f"kda-cp-{precision}", artifact_dir=base / "report"))
            elapsed_s = time.perf_counter() - started
            total_s += elapsed_s
            lines.append(f"  {precision:7s} {verdict.status.value:5s} {json.dumps(dict(verdict.where))}: single capture "
                         f"{single_s:.1f} s, CP capture {cp_s:.1f} s, diff {elapsed_s - single_s - cp_s:.1f} s, "
                         f"total {elapsed_s:.1f} s")
    lines.append(f"  {len(precisions)} probe(s): {total_s:.1f} s")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192")
    parser.add_argument("--configs", default="2:contiguous,2:zigzag,4:contiguous,4:zigzag")
    parser.add_argument("--atol", type=float, default=2e-3)
    parser.add_argument("--json", help="also write the raw rows here")
    parser.add_argument("--probe-timing", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="the smallest run of every section (CI checks the script runs)")
    options = parser.parse_args()
    if options.smoke:
        options.lengths, options.configs, options.probe_timing = "128,256,512", "2:zigzag", True
        print(SMOKE_NOTE, flush=True)
    print(f"cpus {os.cpu_count()}, load {os.getloadavg()[0]:.1f}; relative L2 error ||cp - ref|| / ||ref||; "
          f"'!' marks a largest element error above atol {options.atol:g}", flush=True)
    reports = []
    with tempfile.TemporaryDirectory() as scratch:
        for config in options.configs.split(","):
            world, layout = config.split(":")
            report, wall_s = launch(int(world), layout, options.lengths, Path(scratch))
            reports.append(report)
            print(f"\nworld size {world}, {layout} ({report['backend']}, {report['device']}; launch {wall_s:.1f} s wall)")
            print("\n".join(table(report, options.atol)), flush=True)
    if options.json:
        Path(options.json).write_text(json.dumps(reports, indent=1))
    if options.probe_timing:
        print()
        if options.smoke:
            with tempfile.TemporaryDirectory() as scratch:
                requests = Path(scratch) / "requests.jsonl"
                requests.write_text('{"id": "kda-128", "length": 128, "seed": 0}\n'
                                    '{"id": "kda-256", "length": 256, "seed": 1}\n')
                print("\n".join(probe_timing(2, "zigzag", options.atol, requests, ("tf32",))))
        else:
            print("\n".join(probe_timing(2, "zigzag", options.atol)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
