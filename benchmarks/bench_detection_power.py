"""Detection power and false alarms of glmfb bench beside pytest-benchmark and pyperf, on the
same kernels in the same run; saved (cross-process) comparisons; glmfb gap.

Kernels (one thread, float32), each with a planted slowdown of the kernel's own kind,
calibrated so the slowdown is +4%, +6% and +10% (the elementwise kernels also negate a buffer
of ``extra`` elements; the matrix product also multiplies a 16 x 256 by 256 x ``extra``):

- ``rmsnorm``: a gated RMS norm on 16x4096;
- ``softmax_placed``: a softmax-like kernel on 8x4096 whose buffers land at a random element
  offset inside their allocation at every factory call (drawn from the OS, not the seed, as
  a real allocator's state would be), so its speed depends on where its buffers landed
  (alignment, 4K aliasing between input and output);
- ``matmul``: a 128x256 by 256x256 matrix product (compute-bound).

The true slowdowns are measured by glmfb's own core in this process (24 allocation pairs,
interleaved, no early stop) and printed with their intervals. Then, trials shuffled over
tools and cases so host noise falls on all alike:

- glmfb: ``glmfb bench BASE CAND --shape S --threshold T --json`` (one process, defaults
  otherwise); flagged = status fail, passed = status pass. At ``--threshold 5%``: A/A, +6%,
  +10%; at ``--threshold 2%``: A/A, +4%.
- pytest-benchmark (defaults): two separate pytest runs, the second with
  ``--benchmark-compare --benchmark-compare-fail=median:5%``; flagged at 5% = exit code 1,
  flagged at 2% = its candidate median above 1.02 x the baseline's (the same rule, read from
  the JSON). The two runs' JSON files are also compared by ``glmfb bench a.json b.json``: the
  saved comparison of separate runs.
- pyperf: two separate runs (``-p 3`` worker processes each), ``pyperf compare_to
  --min-speed 5`` (and ``2``); flagged = reported significantly slower.
- saved glmfb runs: pairs of separate ``glmfb bench TARGET --save F`` runs of identical code,
  compared by ``glmfb bench a.json b.json``.
- gap: ``glmfb gap BASE CAND --threshold 5% --repeats 120 --budget 45 --no-attribute`` on a
  ~100 ms torch iteration (4 layers, 1024 wide: a small prefill), A/A and a calibrated +8%
  (more rows through the same layers).
- units: every fraction option given a bare ``5`` must exit 2 with "write 5% or 0.05".

Seconds per comparison are wall seconds of everything a comparison needs, process starts
included. The machine's load average is printed at the start and the end.

    python benchmarks/bench_detection_power.py                       # the full figures (hours)
    python benchmarks/bench_detection_power.py --trials 2 --pyperf-trials 1 --saved-pairs 2 \\
        --gap-trials 2 --kernels rmsnorm                             # a quick check
    python benchmarks/bench_detection_power.py --smoke               # every section, about a minute

``--smoke`` runs every section at its smallest (:data:`SMOKE`: rmsnorm only, sub-second
calibration and true-slowdown measurements, one trial of one case per tool, a 0.5 s glmfb
budget, a short floor, pyperf with one worker process): CI checks the script runs, its
figures are not the benchmark's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHAPES = {"rmsnorm": "16x4096", "softmax_placed": "8x4096", "matmul": "128x256"}
START_SIZES = {"rmsnorm": (2048, 32768), "softmax_placed": (2048, 32768), "matmul": (32, 256)}
KERNELS = textwrap.dedent(
    """
    import os
    import random

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    _PLACEMENT = random.SystemRandom()  # not the seed: where buffers land is not up to the user


    def _pad(extra, generator):
        \"\"\"An elementwise pass over `extra` values: the planted slowdown of the elementwise kernels.\"\"\"
        extra = int(extra)
        pad = torch.randn(max(extra, 1), generator=generator)
        return extra, pad, torch.empty_like(pad)


    def rmsnorm(shape=(16, 4096), extra=0, seed=0):
        shape = tuple(shape)
        generator = torch.Generator().manual_seed(seed)
        x, gate = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
        weight, out = torch.ones(shape[-1]), torch.empty(shape)
        extra, pad, pad_out = _pad(extra, generator)

        def kernel():
            torch.mul(x, torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), out=out)
            out.mul_(weight).mul_(F.silu(gate))
            if extra:
                torch.neg(pad, out=pad_out)  # the planted slowdown: one more elementwise pass
            return out

        return kernel


    def softmax_placed(shape=(8, 4096), extra=0, seed=0):
        shape = tuple(shape)
        n = shape[0] * shape[1]
        generator = torch.Generator().manual_seed(seed)
        x_at, out_at = _PLACEMENT.randrange(1024), _PLACEMENT.randrange(1024)
        x = torch.randn(n + 1024, generator=generator)[x_at:x_at + n].view(shape)
        out = torch.empty(n + 1024)[out_at:out_at + n].view(shape)
        extra, pad, pad_out = _pad(extra, generator)

        def kernel():
            torch.sub(x, x.amax(-1, keepdim=True), out=out)
            out.exp_()
            out.div_(out.sum(-1, keepdim=True))
            if extra:
                torch.neg(pad, out=pad_out)
            return out

        return kernel


    def matmul(shape=(128, 256), extra=0, seed=0):
        m, k = tuple(shape)
        generator = torch.Generator().manual_seed(seed)
        a, b = torch.randn(m, k, generator=generator), torch.randn(k, k, generator=generator)
        out = torch.empty(m, k)
        extra = int(extra)  # one more product, 16 x k by k x `extra`
        a2, b2 = torch.randn(16, k, generator=generator), torch.randn(k, max(extra, 1), generator=generator)
        out2 = torch.empty(16, max(extra, 1))

        def kernel():
            torch.mm(a, b, out=out)
            if extra:
                torch.mm(a2, b2, out=out2)
            return out

        return kernel


    FACTORIES = {"rmsnorm": rmsnorm, "softmax_placed": softmax_placed, "matmul": matmul}
    SHAPES = {"rmsnorm": (16, 4096), "softmax_placed": (8, 4096), "matmul": (128, 256)}


    def from_env():
        name = os.environ["DP_KERNEL"]
        return FACTORIES[name](SHAPES[name], int(os.environ.get("DP_EXTRA", "0")))


    def gap_iteration(extra=0, layers=4, width=1024):
        \"\"\"A ~100 ms iteration: small layers on fresh activations; `extra` rows more of the
        same layer work are the planted gap.\"\"\"
        generator = torch.Generator().manual_seed(0)
        weights = [torch.randn(width, width, generator=generator) * width**-0.5 for _ in range(layers)]
        prompt = torch.randn(width, width, generator=generator)
        extra = int(extra)
        more = torch.randn(max(extra, 1), width, generator=generator)

        def iteration():
            x = prompt
            for w in weights:
                x = torch.tanh(x @ w)
            if extra:
                y = more
                for w in weights:
                    y = torch.tanh(y @ w)
            return {"layers_s": 0.0}

        return iteration
    """
)


@dataclass(frozen=True)
class Sizes:
    """How long each measurement runs: the benchmark's figures (the defaults) or a smoke run's."""

    calibrate_s: float = 4.0  # each calibration measurement
    calibrate_rounds: int = 3  # refits per target slowdown
    verify_s: float = 12.0  # each check at a target's final guess
    verify_steps: int = 3
    true_s: float = 8.0  # each true-slowdown measurement (before and after the trials)
    gap_calibrate_s: tuple[float, float] = (10.0, 15.0)  # the gap target's correction, then its check
    gap_true_s: float = 15.0  # the gap target's slowdown after the trials
    gap_width: int = 1024  # the gap iteration's layers: 1024 wide is ~100 ms an iteration
    gap_repeats: int = 120  # a ~100 ms iteration: up to 120 a side within 45 s
    gap_budget_s: float = 45.0
    pyperf_args: tuple[str, ...] = ("-p", "3")
    pytest_benchmark_args: tuple[str, ...] = ()  # pytest-benchmark's defaults
    floor_args: tuple[str, ...] = ()  # glmfb.core.measure.floor's defaults


SMOKE = Sizes(calibrate_s=0.3, calibrate_rounds=1, verify_s=0.5, verify_steps=1, true_s=0.5,
              gap_calibrate_s=(0.5, 0.5), gap_true_s=0.5, gap_width=256, gap_repeats=8, gap_budget_s=3.0,
              pyperf_args=("-p", "1", "-n", "3", "-w", "1", "-l", "100"),
              pytest_benchmark_args=("--benchmark-max-time=0.1", "--benchmark-min-rounds=3"),
              floor_args=("--processes", "2", "--seconds", "0.2"))
# The one (tool, case) a smoke run keeps per tool: each tool's path and each table, once.
SMOKE_JOBS = frozenset({("glmfb 5%", "+10%"), ("glmfb 2%", "A/A"), ("glmfb saved", "A/A"),
                        ("pytest-benchmark", "A/A"), ("pyperf", "+10%"), ("glmfb gap", "+8%")})
SMOKE_NOTE = ("smoke run (--smoke): every section at its smallest, one trial of one case per tool; the figures "
              "are measured but are not the benchmark's")

PYTEST_FILE = textwrap.dedent(
    """
    from dp_kernels import from_env

    def test_kernel(benchmark):
        benchmark(from_env())
    """
)
PYPERF_FILE = textwrap.dedent(
    """
    import pyperf
    from dp_kernels import FACTORIES, SHAPES

    def add_cmdline_args(cmd, args):
        cmd.extend(("--kernel", args.kernel, "--extra", str(args.extra)))

    runner = pyperf.Runner(add_cmdline_args=add_cmdline_args)
    runner.argparser.add_argument("--kernel", default="rmsnorm")
    runner.argparser.add_argument("--extra", type=int, default=0)
    args = runner.parse_args()
    runner.bench_func("kernel", FACTORIES[args.kernel](SHAPES[args.kernel], args.extra))
    """
)


def write_workdir(directory: Path) -> None:
    (directory / "dp_kernels.py").write_text(KERNELS)
    (directory / "test_dp.py").write_text(PYTEST_FILE)
    (directory / "dp_pyperf.py").write_text(PYPERF_FILE)
    (directory / "pytest.ini").write_text("[pytest]\n")


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


# --------------------------------------------------------------------------------------------
# The true slowdowns, measured in this process by glmfb's own core
# --------------------------------------------------------------------------------------------


def measured_slowdown(directory: Path, kernel: str, extra: int, seconds: float, seed: int) -> tuple[float, float, float, float | None]:
    """The candidate's slowdown over 24 allocation pairs, interleaved, for ``seconds``."""
    sys.path.insert(0, str(ROOT))
    import torch

    from glmfb.bench.allocations import prepare_pairs
    from glmfb.bench.timers import CpuTimer
    from glmfb.contract.units import parse_shape
    from glmfb.core.measure import Settings, compare
    from glmfb.core.targets import Target

    torch.set_num_threads(1)
    ref = f"{directory / 'dp_kernels.py'}:{kernel}"
    setup = prepare_pairs(CpuTimer(), Target(ref), Target(ref, {"extra": extra}), parse_shape(SHAPES[kernel]),
                          input_sets=4, sample_s=1e-3, budget_s=seconds, min_pairs=24)
    comparison = compare(setup.pairs, Settings(threshold=0.05, budget_s=seconds, seed=seed,
                                               stop=lambda _e, _d: False), time.perf_counter)
    if comparison.final is None:  # no look was taken within the budget (a heavily loaded host): no figure
        nan = float("nan")
        return nan, nan, nan, nan
    estimate = comparison.final.interval.at(0.95).estimate
    return estimate.value, estimate.low, estimate.high, comparison.final.interval.between_sd


def calibrate_extras(directory: Path, kernel: str, targets: list[float], sizes: Sizes) -> dict[float, int]:
    """Buffer sizes giving each target slowdown: a weighted least-squares line (slowdown
    against size, weights from each measurement's interval) through every measurement so
    far, refined by measuring ``sizes.calibrate_s`` (4 s) at each new guess."""
    import numpy as np

    points: list[tuple[int, float, float]] = []  # size, slowdown, weight

    def measure(n: int, seed: int) -> None:
        value, low, high, _ = measured_slowdown(directory, kernel, n, sizes.calibrate_s, seed)
        if value == value:  # a measurement that took no look (NaN) is left out of the fit
            points.append((n, value, 1.0 / max(high - low, 1e-3) ** 2))

    for seed, n in enumerate(START_SIZES[kernel]):
        measure(n, seed)
    def guess(target: float) -> int:
        sizes, slowdowns, weights = np.array(points, dtype=float).T
        slope, intercept = np.polyfit(sizes, slowdowns, 1, w=np.sqrt(weights))
        return max(1, int((target - intercept) / slope)) if slope > 0 else 2 * int(sizes.max())

    extras: dict[float, int] = {}
    for target in targets:
        for step in range(sizes.calibrate_rounds):
            measure(guess(target), 10 + step)
        n = guess(target)
        for step in range(sizes.verify_steps):  # verify at the final guess (12 s); refit until within 0.4%
            value, low, high, _ = measured_slowdown(directory, kernel, n, sizes.verify_s, 20 + step)
            if value != value:  # no look within the budget: nothing to refit on
                continue
            points.append((n, value, 1.0 / max(high - low, 1e-3) ** 2))
            if abs(value - target) <= 0.004:
                break
            n = guess(target)
        extras[target] = n
    return extras


# --------------------------------------------------------------------------------------------
# One comparison per tool
# --------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one comparison said: per threshold, flagged (called slower) and passed."""

    flagged: dict[str, bool] = field(default_factory=dict)
    passed: dict[str, bool] = field(default_factory=dict)
    status: str = ""
    seconds: float = 0.0
    saved: str | None = None  # glmfb's verdict on the two saved files, when there are two
    note: str = ""
    files: tuple[Path, Path] | None = None  # two separate runs' result files
    reading: float | None = None  # the change glmfb read (in process)


def _runs() -> Path:
    """A scratch folder the glmfb commands run in, so their run folders land there and never in
    the checkout's reports/ (removed at exit)."""
    global _RUNS
    if _RUNS is None:
        import atexit
        import shutil

        _RUNS = Path(tempfile.mkdtemp(prefix="glmfb-detection-power-"))
        atexit.register(shutil.rmtree, _RUNS, True)
    return _RUNS


_RUNS: Path | None = None


def _glmfb(args: list[str]) -> tuple[dict[str, Any] | None, subprocess.CompletedProcess[str]]:
    done = subprocess.run([sys.executable, "-m", "glmfb", *args, "--json"], capture_output=True, text=True,
                          cwd=_runs(), env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        return json.loads(done.stdout), done
    except json.JSONDecodeError:
        return None, done


def run_glmfb(directory: Path, kernel: str, extra: int, threshold: str, budget: float | None) -> Outcome:
    ref = f"{directory / 'dp_kernels.py'}:{kernel}"
    args = ["bench", ref, ref, "--shape", SHAPES[kernel], "--candidate-arg", f"extra={extra}",
            "--threshold", threshold]
    if budget is not None:
        args += ["--budget", str(budget)]
    verdict, done = _glmfb(args)
    if verdict is None:
        return Outcome(status=f"broken(rc={done.returncode}): {done.stderr.strip()[-200:]}")
    shape: dict[str, Any] = next((e for e in verdict["evidence"] if e.get("kind") == "shape"), {})
    note = (f"{shape.get('change', float('nan')):+.1%} pairs={shape.get('allocations_per_side')} "
            f"between_sd={shape.get('between_allocation_sd') or 0:.2%}")
    status = verdict["status"]
    return Outcome({threshold: status == "fail"}, {threshold: status == "pass"}, status, note=note,
                   reading=shape.get("change"))


def _pytest_median(path: Path) -> float:
    data = json.loads(path.read_text())
    return float(data["benchmarks"][0]["stats"]["median"])


def run_pytest_benchmark(directory: Path, kernel: str, extra: int, keep: Path, options: tuple[str, ...]) -> Outcome:
    with tempfile.TemporaryDirectory(dir=directory) as storage:
        common = [sys.executable, "-m", "pytest", "test_dp.py", "-q", "-p", "no:cacheprovider", *options,
                  "--benchmark-only", "--benchmark-save-data", f"--benchmark-storage=file://{storage}"]
        first_json, second_json = keep.with_suffix(".base.json"), keep.with_suffix(".cand.json")
        first = subprocess.run([*common, "--benchmark-save=base", f"--benchmark-json={first_json}"],
                               capture_output=True, text=True, cwd=directory,
                               env={**os.environ, "DP_KERNEL": kernel, "DP_EXTRA": "0"})
        if first.returncode != 0:
            return Outcome(status=f"broken: {first.stdout[-200:]}")
        second = subprocess.run(
            [*common, "--benchmark-compare", "--benchmark-compare-fail=median:5%",
             f"--benchmark-json={second_json}"],
            capture_output=True, text=True, cwd=directory,
            env={**os.environ, "DP_KERNEL": kernel, "DP_EXTRA": str(extra)},
        )
    if second.returncode not in (0, 1):
        return Outcome(status=f"broken(rc={second.returncode}): {second.stdout[-200:]}")
    ratio = _pytest_median(second_json) / _pytest_median(first_json)
    return Outcome({"5%": second.returncode == 1, "2%": ratio > 1.02},
                   {"5%": second.returncode == 0, "2%": ratio <= 1.02},
                   "fail" if second.returncode == 1 else "pass", note=f"{ratio - 1:+.1%}",
                   files=(first_json, second_json))


def compare_saved_files(first: Path, second: Path, threshold: str = "5%") -> str:
    verdict, done = _glmfb(["bench", str(first), str(second), "--threshold", threshold])
    if verdict is None:
        return f"broken(rc={done.returncode}): {done.stderr.strip()[-160:]}"
    return str(verdict["status"])


def run_pyperf(directory: Path, kernel: str, extra: int, options: tuple[str, ...]) -> Outcome:
    with tempfile.TemporaryDirectory(dir=directory) as out:
        files = []
        for label, value in (("base", 0), ("cand", extra)):
            path = Path(out) / f"{label}.json"
            done = subprocess.run(
                [sys.executable, "dp_pyperf.py", "--quiet", *options, "--kernel", kernel,
                 "--extra", str(value), "-o", str(path)],
                capture_output=True, text=True, cwd=directory,
            )
            if done.returncode != 0:
                return Outcome(status=f"broken: {done.stderr[-200:]}")
            files.append(str(path))
        outcome = Outcome()
        for threshold in ("5", "2"):
            compared = subprocess.run(
                [sys.executable, "-m", "pyperf", "compare_to", *files, "--min-speed", threshold],
                capture_output=True, text=True, cwd=directory,
            )
            text = compared.stdout
            slower = "slower" in text and "Not significant" not in text and "hidden" not in text
            outcome.flagged[f"{threshold}%"] = slower
            outcome.passed[f"{threshold}%"] = not slower
            if threshold == "5":
                outcome.note = text.strip().splitlines()[-1] if text.strip() else "no output"
        outcome.status = "fail" if outcome.flagged["5%"] else "pass"
    return outcome


def run_saved_glmfb(directory: Path, kernel: str, budget: float, keep: Path) -> Outcome:
    ref = f"{directory / 'dp_kernels.py'}:{kernel}"
    files = [keep.with_suffix(".a.json"), keep.with_suffix(".b.json")]
    for path in files:
        verdict, done = _glmfb(["bench", ref, "--shape", SHAPES[kernel], "--budget", str(budget), "--save", str(path)])
        if verdict is None or verdict["status"] != "pass":
            return Outcome(status=f"broken save(rc={done.returncode}): {done.stderr.strip()[-160:]}")
    status = compare_saved_files(files[0], files[1])
    return Outcome({"5%": status == "fail"}, {"5%": status == "pass"}, status)


def run_gap(directory: Path, extra: int, sizes: Sizes) -> Outcome:
    ref = f"{directory / 'dp_kernels.py'}:gap_iteration"
    verdict, done = _glmfb(["gap", ref, ref, "--arg", f"width={sizes.gap_width}", "--candidate-arg", f"extra={extra}",
                            "--threshold", "5%",
                            "--repeats", str(sizes.gap_repeats), "--budget", str(sizes.gap_budget_s),
                            "--no-attribute", "--out", str(directory / "gap-reports")])
    if verdict is None:
        return Outcome(status=f"broken(rc={done.returncode}): {done.stderr.strip()[-200:]}")
    gap = next((e for e in verdict["evidence"] if e["kind"] == "gap"), None)
    if gap is None:
        return Outcome(status=f"{verdict['status']}: {verdict['why'][:160]}")
    status = verdict["status"]
    return Outcome({"5%": status == "fail"}, {"5%": status == "pass"}, status,
                   note=f"{gap['gap']:+.1%} [{gap['ci'][0]:+.1%}, {gap['ci'][1]:+.1%}] "
                        f"{gap['iterations_per_side']} it/side, {gap['stopped_by']}")


def gap_slowdown(directory: Path, extra: int, seconds: float, width: int) -> float:
    """The gap target's slowdown, interleaved in this process over 8 builds a side."""
    sys.path.insert(0, str(directory))
    from glmfb.core.measure import Arm, Pair, Settings, compare

    dp_kernels = __import__("dp_kernels")

    def arm(label: str, index: int, value: int) -> Arm:
        iteration = dp_kernels.gap_iteration(value, width=width)
        iteration()

        def sample() -> float:
            begin = time.perf_counter()
            iteration()
            return time.perf_counter() - begin

        return Arm(label, index, sample)

    pairs = [Pair("ab", j, arm("baseline", j, 0), arm("candidate", j, extra)) for j in range(8)]
    comparison = compare(pairs, Settings(threshold=0.05, budget_s=seconds, pattern="AB", reduce="mean",
                                         stop=lambda _e, _d: False), time.perf_counter)
    assert comparison.final is not None
    return comparison.final.interval.estimate.value


def calibrate_gap_extra(directory: Path, target: float, sizes: Sizes) -> tuple[int, float]:
    """Rows of planted work for ``target``: the extra rows go through the same layers, so the
    slowdown is about rows / width by construction (a fit to timings is too noisy for a
    ~100 ms iteration on a busy host); one correction from a measurement, then measured again."""
    width = sizes.gap_width
    n = max(1, round(target * width))
    correction_s, check_s = sizes.gap_calibrate_s
    measured = gap_slowdown(directory, n, correction_s, width)
    if 0.5 * target < measured < 2.0 * target:  # trust a plausible reading only
        n = max(1, round(n * target / measured))
    return n, gap_slowdown(directory, n, check_s, width)


def check_units(directory: Path) -> list[str]:
    """Every fraction option given a bare 5: exit 2 and the hint, never a silent 500%. The four
    refusals are asked of four glmfb processes at once (none measures anything)."""
    ref = f"{directory / 'dp_kernels.py'}:rmsnorm"
    gap_ref = f"{directory / 'dp_kernels.py'}:gap_iteration"
    started: list[tuple[str, subprocess.Popen[str], Path | None]] = []
    for label, args in (("bench --threshold 5", ["bench", ref, ref, "--shape", "16x4096", "--threshold", "5"]),
                        ("gap --threshold 5", ["gap", gap_ref, gap_ref, "--threshold", "5"])):
        started.append((label, _started([sys.executable, "-m", "glmfb", *args]), None))
    for probe, body in (("bench", f'baseline = "{ref}"\ncandidate = "{ref}"\noptions = {{ shapes = ["16x4096"], threshold = 5 }}\n'),
                        ("gap", f'baseline = "{gap_ref}"\ncandidate = "{gap_ref}"\noptions = {{ threshold = 5 }}\n')):
        toml = directory / f"units-{probe}.toml"
        toml.write_text(f'[[probe]]\nname = "units-{probe}"\nprobe = "{probe}"\n{body}')
        out = directory / f"runs-{probe}"
        started.append((f"TOML {probe} threshold = 5",
                        _started([sys.executable, "-m", "glmfb", "run", str(toml), "--out", str(out)]), out))
    lines = []
    for label, child, out in started:
        stdout, stderr = child.communicate()
        runs = sorted(out.glob("*/run.json")) if out is not None else []
        if runs:
            verdicts = json.loads(runs[-1].read_text())["verdicts"]
            last = "; ".join(f"{v['status']}: {v['why']}" for v in verdicts)
        elif out is not None:
            last = stderr.strip().splitlines()[-1] if stderr.strip() else stdout.strip()[-160:]
        else:
            last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        lines.append(f"{label}: exit {child.returncode}: {last}")
    return lines


def _started(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=_runs(),
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=30, help="glmfb comparisons per kernel and case")
    parser.add_argument("--pytest-benchmark-trials", type=int, default=None,
                        help="default: --trials (A/A: at least --saved-pairs)")
    parser.add_argument("--pyperf-trials", type=int, default=10)
    parser.add_argument("--saved-pairs", type=int, default=20, help="pairs of separate A/A glmfb --save runs a kernel")
    parser.add_argument("--gap-trials", type=int, default=20)
    parser.add_argument("--kernels", default="rmsnorm,softmax_placed,matmul")
    parser.add_argument("--tools", default="glmfb,pytest-benchmark,pyperf")
    parser.add_argument("--budget", type=float, default=None, help="glmfb --budget (default: glmfb's)")
    parser.add_argument("--save-budget", type=float, default=3.0, help="glmfb --budget of each --save run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-floor", action="store_true",
                        help="use the cached between-process floor (measure it in another run)")
    parser.add_argument("--skip-units", action="store_true", help="leave out the units checks")
    parser.add_argument("--smoke", action="store_true",
                        help="every section at its smallest, one trial of one case per tool (CI checks the script runs)")
    args = parser.parse_args()
    sizes = Sizes()
    if args.smoke:
        print(SMOKE_NOTE, flush=True)
        sizes = SMOKE
        args.trials = args.pyperf_trials = args.saved_pairs = args.gap_trials = 1
        args.pytest_benchmark_trials, args.kernels, args.tools = 1, "rmsnorm", "glmfb,pytest-benchmark,pyperf"
        args.budget, args.save_budget, args.skip_floor, args.skip_units = 0.5, 0.5, False, False
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    rng = random.Random(args.seed)
    print(f"start: {load_average()}; {os.cpu_count()} cpus", flush=True)

    with tempfile.TemporaryDirectory(prefix="glmfb-dp-") as tmp:
        directory = Path(tmp)
        write_workdir(directory)
        if args.smoke:  # the smoke run's floor is not this machine's: keep it out of the user's cache
            os.environ["GLMFB_CACHE_DIR"] = str(directory / "cache")
        keep = directory / "keep"
        keep.mkdir()
        for line in [] if args.skip_units else check_units(directory):
            print(f"units: {line}", flush=True)
        if not args.skip_floor:
            floor = subprocess.run([sys.executable, "-m", "glmfb.core.measure.floor", *sizes.floor_args],
                                   capture_output=True, text=True, cwd=ROOT)
            print(f"floor: {floor.stdout.strip() or floor.stderr.strip()[-200:]}", flush=True)

        cases: dict[str, dict[str, int]] = {}
        for kernel in kernels:
            started = time.perf_counter()
            extras = calibrate_extras(directory, kernel, [0.04, 0.06, 0.10], sizes)
            cases[kernel] = {"A/A": 0, "+4%": extras[0.04], "+6%": extras[0.06], "+10%": extras[0.10]}
            print(f"{kernel}: calibrated in {time.perf_counter() - started:.0f} s: "
                  + ", ".join(f"+{t:.0%}: {n} elements" for t, n in extras.items()), flush=True)
            for label, extra in cases[kernel].items():
                value, low, high, between = measured_slowdown(directory, kernel, extra, sizes.true_s, 21)
                print(f"  true {label:4s}: {value:+.2%} [{low:+.2%}, {high:+.2%}] (24 pairs interleaved; "
                      f"between-allocation sd {between or 0:.2%})", flush=True)

        jobs: list[tuple[str, str, str, Callable[[], Outcome]]] = []
        pb_trials = args.pytest_benchmark_trials or args.trials
        counter = iter(range(1 << 30))
        for kernel in kernels:
            c = cases[kernel]
            if "glmfb" in tools:
                for case in ("A/A", "+6%", "+10%"):
                    jobs += [("glmfb 5%", kernel, case, partial(run_glmfb, directory, kernel, c[case], "5%", args.budget))
                             for _ in range(args.trials)]
                for case in ("A/A", "+4%"):
                    jobs += [("glmfb 2%", kernel, case, partial(run_glmfb, directory, kernel, c[case], "2%", args.budget))
                             for _ in range(args.trials)]
                jobs += [("glmfb saved", kernel, "A/A", partial(run_saved_glmfb, directory, kernel, args.save_budget,
                                                                keep / f"saved{next(counter)}"))
                         for _ in range(args.saved_pairs)]
            if "pytest-benchmark" in tools:
                for case in ("A/A", "+4%", "+6%", "+10%"):
                    # A/A pairs of separate runs are also what glmfb's saved comparison is judged on
                    count = max(pb_trials, args.saved_pairs) if case == "A/A" else pb_trials
                    jobs += [("pytest-benchmark", kernel, case, partial(run_pytest_benchmark, directory, kernel, c[case],
                                                                        keep / f"pb{next(counter)}",
                                                                        sizes.pytest_benchmark_args))
                             for _ in range(count)]
            if "pyperf" in tools:
                for case in ("A/A", "+4%", "+6%", "+10%"):
                    jobs += [("pyperf", kernel, case, partial(run_pyperf, directory, kernel, c[case], sizes.pyperf_args))
                             for _ in range(args.pyperf_trials)]
        gap_extra = 0
        if args.gap_trials:
            gap_extra, gap_true = calibrate_gap_extra(directory, 0.08, sizes)
            print(f"gap: +8% planted with {gap_extra} elements; measured interleaved over 8 builds: {gap_true:+.2%}", flush=True)
            for case, extra in (("A/A", 0), ("+8%", gap_extra)):
                jobs += [("glmfb gap", "gap_iteration", case, partial(run_gap, directory, extra, sizes))
                         for _ in range(args.gap_trials)]
        if args.smoke:
            jobs = [job for job in jobs if (job[0], job[2]) in SMOKE_JOBS]
        rng.shuffle(jobs)

        results: dict[tuple[str, str, str], list[Outcome]] = defaultdict(list)
        for index, (tool, kernel, case, job) in enumerate(jobs, 1):
            begin = time.perf_counter()
            try:
                outcome = job()
            except Exception as exc:  # one broken trial is reported, and the others go on
                outcome = Outcome(status=f"broken: {type(exc).__name__}: {exc}"[:200])
            outcome.seconds = time.perf_counter() - begin
            results[(tool, kernel, case)].append(outcome)
            if outcome.files is not None:  # glmfb on the same two separate runs (not timed)
                outcome.saved = compare_saved_files(*outcome.files)
            saved = f" glmfb on the files: {outcome.saved}" if outcome.saved else ""
            print(f"[{index}/{len(jobs)}] {tool:16s} {kernel:14s} {case:5s} {outcome.status:12s} "
                  f"{outcome.note} ({outcome.seconds:.1f} s){saved}", flush=True)
        print_report(results, kernels)
        print()
        print("true slowdowns again, after the trials (how stable the planted work was):")
        for kernel in kernels:
            for label, extra in cases[kernel].items():
                value, low, high, between = measured_slowdown(directory, kernel, extra, sizes.true_s, 31)
                print(f"  {kernel:15s} {label:4s}: {value:+.2%} [{low:+.2%}, {high:+.2%}]", flush=True)
        if args.gap_trials:
            print(f"  gap_iteration   +8%: {gap_slowdown(directory, gap_extra, sizes.gap_true_s, sizes.gap_width):+.2%}", flush=True)
    print(f"end: {load_average()}", flush=True)


def _rate(outcomes: list[Outcome], threshold: str, what: str = "flagged") -> str:
    values = [getattr(o, what).get(threshold) for o in outcomes]
    values = [v for v in values if v is not None]
    return f"{sum(values)}/{len(values)}" if values else "-"


def print_report(results: dict[tuple[str, str, str], list[Outcome]], kernels: list[str]) -> None:
    print()
    print("At threshold 5%: fails (flagged slower) and passes out of trials")
    print(f"{'tool':18s} {'kernel':15s} {'A/A fail':>9s} {'+6% fail':>9s} {'+6% pass':>9s} {'+10% fail':>10s} {'median s':>9s}")
    for tool in ("glmfb 5%", "pytest-benchmark", "pyperf"):
        for kernel in kernels:
            row = {case: results.get((tool, kernel, case), []) for case in ("A/A", "+6%", "+10%")}
            if not any(row.values()):
                continue
            seconds = [o.seconds for outcomes in row.values() for o in outcomes]
            print(f"{tool:18s} {kernel:15s} {_rate(row['A/A'], '5%'):>9s} {_rate(row['+6%'], '5%'):>9s} "
                  f"{_rate(row['+6%'], '5%', 'passed'):>9s} {_rate(row['+10%'], '5%'):>10s} "
                  f"{statistics.median(seconds):>9.1f}")
    print()
    print("At threshold 2%")
    print(f"{'tool':18s} {'kernel':15s} {'A/A fail':>9s} {'+4% fail':>9s} {'+4% pass':>9s} {'median s':>9s}")
    for tool, source in (("glmfb 2%", "glmfb 2%"), ("pytest-benchmark", "pytest-benchmark"), ("pyperf", "pyperf")):
        for kernel in kernels:
            row = {case: results.get((source, kernel, case), []) for case in ("A/A", "+4%")}
            if not any(row.values()):
                continue
            seconds = [o.seconds for outcomes in row.values() for o in outcomes]
            print(f"{tool:18s} {kernel:15s} {_rate(row['A/A'], '2%'):>9s} {_rate(row['+4%'], '2%'):>9s} "
                  f"{_rate(row['+4%'], '2%', 'passed'):>9s} {statistics.median(seconds):>9.1f}")
    print()
    print("Separate runs of identical code, compared by glmfb bench a.json b.json (threshold 5%)")
    for kernel in kernels:
        saved = results.get(("glmfb saved", kernel, "A/A"), [])
        if saved:
            counts = {s: sum(o.status == s for o in saved) for s in sorted({o.status for o in saved})}
            print(f"  glmfb --save runs     {kernel:15s} fails {_rate(saved, '5%')}  {counts}")
    for kernel in kernels:
        for case in ("A/A", "+4%", "+6%", "+10%"):
            outcomes = results.get(("pytest-benchmark", kernel, case), [])
            statuses = [o.saved for o in outcomes if o.saved is not None]
            if statuses:
                counts = {s: statuses.count(s) for s in sorted(set(statuses))}
                print(f"  pytest-benchmark JSON {kernel:15s} {case:5s} fails {statuses.count('fail')}/{len(statuses)}  {counts}")
    gap = {case: results.get(("glmfb gap", "gap_iteration", case), []) for case in ("A/A", "+8%")}
    if any(gap.values()):
        print()
        print("glmfb gap at threshold 5%")
        for case, outcomes in gap.items():
            counts = {s: sum(o.status == s for o in outcomes) for s in sorted({o.status for o in outcomes})}
            median_s = statistics.median([o.seconds for o in outcomes]) if outcomes else 0.0
            print(f"  {case:4s} fails {_rate(outcomes, '5%')}  {counts}  median {median_s:.1f} s")
    print()
    for (tool, kernel, case), outcomes in sorted(results.items()):
        counts = {s: sum(o.status == s for o in outcomes) for s in sorted({o.status for o in outcomes})}
        readings = [o.reading for o in outcomes if o.reading is not None]
        mean = f"  mean reading {statistics.fmean(readings):+.2%} (sd {statistics.pstdev(readings):.2%})" if readings else ""
        print(f"{tool:18s} {kernel:15s} {case:5s} {counts}{mean}")


if __name__ == "__main__":
    main()
