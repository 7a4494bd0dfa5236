"""Across processes: --save files, comparing them, pytest-benchmark JSON, env mismatches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from glmfb.bench.config import BenchConfig
from glmfb.bench.evidence import ProcessFloorEvidence, SavedComparison, ShapeChange
from glmfb.bench.saved import SAVED_SCHEMA, load_runs, load_side
from glmfb.cli import app
from glmfb.contract.errors import InputError
from glmfb.contract.verdict import Status, Verdict
from glmfb.core.targets import Target

HERE = __file__
runner = CliRunner()


def scaled(shape: tuple[int, ...], times: int = 1) -> Any:
    x = torch.randn(shape)
    out = torch.empty_like(x)

    def kernel() -> torch.Tensor:
        for _ in range(times):
            torch.mul(x, 1.5, out=out)
        return out

    return kernel


def write_glmfb(path: Path, samples: dict[str, dict[str, list[float]]], env: dict[str, Any] | None = None) -> Path:
    sides = {label: {"ref": f"k.py:{label}", "kernel": f"kernel_{label}"}
             for label in next(iter(samples.values()))}
    path.write_text(json.dumps({
        "schema": SAVED_SCHEMA, "created": "now", "env": env or {"python": "3.11.7", "cpu": "x"},
        "device": "cpu", "threads": 1, "timer": {}, "sides": sides,
        "shapes": {shape: {"calls_per_sample": 10, **values} for shape, values in samples.items()},
    }))
    return path


def noisy(median: float, n: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(median * np.exp(rng.normal(0, 0.01, n)))


def pytest_benchmark_file(path: Path, median: float, *, data: bool, python: str = "3.11.7") -> Path:
    stats: dict[str, Any] = {"median": median, "iqr": median * 0.01, "rounds": 200, "mean": median,
                             "min": median * 0.98, "max": median * 1.1, "stddev": median * 0.01}
    if data:
        stats["data"] = noisy(median, 200, int(median * 1e9) % 1000)
    path.write_text(json.dumps({
        "machine_info": {"python_version": python, "machine": "x86_64", "cpu": {"brand_raw": "cpu"}},
        "commit_info": {"id": "abc", "dirty": False},
        "benchmarks": [{"name": "test_kernel", "fullname": "t.py::test_kernel", "stats": stats}],
        "version": "5.1.0",
    }))
    return path


def compare_saved(name: str, baseline: str, candidate: str, folder: Path, threshold: float = 0.05) -> Verdict:
    from helpers import run

    return run("bench", BenchConfig(name=name, baseline=Target(baseline), candidate=Target(candidate),
                                    threshold=threshold), folder)


def test_saved_comparison_flags_a_slowdown_as_cross_process(tmp_path: Path) -> None:
    old = write_glmfb(tmp_path / "old.json", {"8x4096": {"baseline": noisy(1e-4, 200, 1)}})
    new = write_glmfb(tmp_path / "new.json", {"8x4096": {"baseline": noisy(1.2e-4, 200, 2)}})
    verdict = compare_saved("s", str(old), str(new), tmp_path)
    assert verdict.status is Status.FAIL
    assert verdict.where["shape"] == "8x4096"
    assert "across processes" in verdict.why
    assert verdict.evidence[0].in_process is False  # type: ignore[attr-defined]
    assert Verdict.from_dict(verdict.to_dict()) == verdict


def test_one_run_a_side_is_judged_against_the_process_floor(tmp_path: Path) -> None:
    old = write_glmfb(tmp_path / "old.json", {"8x4096": {"baseline": noisy(1e-4, 200, 11)}})
    new = write_glmfb(tmp_path / "new.json", {"8x4096": {"baseline": noisy(1.04e-4, 200, 12)}})
    verdict = compare_saved("s", str(old), str(new), tmp_path, threshold=0.02)
    # +4% with intervals +-0.2% wide inside each run: tight, but two processes differ by more
    assert verdict.status is Status.INCONCLUSIVE
    assert "between-process floor (sd 2.0%" in verdict.why
    floor = verdict.find(ProcessFloorEvidence)
    assert floor is not None and floor.sd == 0.02 and floor.processes == 8 and floor.source == "cache"
    shape = verdict.find(ShapeChange)
    assert shape is not None and shape.method == "one run a side + process floor"


def test_several_runs_a_side_resample_runs(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    for i in range(3):
        write_glmfb(tmp_path / f"base-{i}.json", {"s": {"baseline": noisy(1e-4 * rng.lognormal(0, 0.02), 100, i)}})
        write_glmfb(tmp_path / f"cand-{i}.json", {"s": {"baseline": noisy(1.3e-4 * rng.lognormal(0, 0.02), 100, 9 + i)}})
    verdict = compare_saved("s", str(tmp_path / "base-*.json"),
                            f"{tmp_path / 'cand-0.json'},{tmp_path / 'cand-1.json'},{tmp_path / 'cand-2.json'}", tmp_path)
    assert verdict.status is Status.FAIL
    saved = verdict.find(SavedComparison)
    assert saved is not None and saved.runs == (3, 3)
    assert "3 run(s) against 3" in verdict.why
    assert verdict.find(ProcessFloorEvidence) is None
    with pytest.raises(InputError, match="no file matches"):
        load_runs(str(tmp_path / "nothing-*.json"))


def test_two_sided_file_needs_a_selector(tmp_path: Path) -> None:
    both = write_glmfb(tmp_path / "ab.json", {"8x8": {"baseline": noisy(1e-4, 50, 3), "candidate": noisy(1e-4, 50, 4)}})
    with pytest.raises(InputError, match="pick one"):
        load_side(str(both))
    verdict = compare_saved("s", f"{both}#baseline", f"{both}#candidate", tmp_path)
    assert verdict.status is Status.PASS
    assert "equivalent" in verdict.why


def test_environment_mismatch_is_stated_and_downgrades_a_pass(tmp_path: Path) -> None:
    old = write_glmfb(tmp_path / "old.json", {"s": {"baseline": noisy(1e-4, 100, 5)}}, {"python": "3.11.7", "torch": "2.12"})
    new = write_glmfb(tmp_path / "new.json", {"s": {"baseline": noisy(1e-4, 100, 6)}}, {"python": "3.11.7", "torch": "2.13"})
    # one run a side against this machine's between-process floor: equivalence is within reach at 10%
    verdict = compare_saved("s", str(old), str(new), tmp_path, threshold=0.10)
    assert verdict.status is Status.WARN
    assert "environments differ (torch: 2.12 vs 2.13)" in verdict.why
    from glmfb.contract.evidence import EnvDifferences

    assert verdict.find(EnvDifferences) is not None


def test_pytest_benchmark_json_with_and_without_raw_data(tmp_path: Path) -> None:
    base = pytest_benchmark_file(tmp_path / "base.json", 1e-4, data=True)
    slow = pytest_benchmark_file(tmp_path / "slow.json", 1.3e-4, data=True)
    verdict = compare_saved("p", str(base), str(slow), tmp_path)
    assert verdict.status is Status.FAIL
    assert verdict.where["function"] == "test_kernel"
    summary_only = pytest_benchmark_file(tmp_path / "summary.json", 1.3e-4, data=False, python="3.12.1")
    verdict = compare_saved("p", str(base), str(summary_only), tmp_path)
    assert verdict.status is Status.FAIL
    assert "medians and IQR only" in verdict.why
    assert "python: 3.11.7 vs 3.12.1" in verdict.why


def test_no_common_shapes_is_an_input_error(tmp_path: Path) -> None:
    a = write_glmfb(tmp_path / "a.json", {"8x8": {"baseline": noisy(1e-4, 20, 7)}})
    b = write_glmfb(tmp_path / "b.json", {"16x16": {"baseline": noisy(1e-4, 20, 8)}})
    with pytest.raises(InputError, match="in common"):
        compare_saved("s", str(a), str(b), tmp_path)


def test_not_a_results_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    result = runner.invoke(app, ["bench", str(bad), str(bad), "--json", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "not a glmfb bench file" in result.output


@pytest.mark.slow
def test_cli_save_then_compare_saved_runs(tmp_path: Path) -> None:
    first, second = tmp_path / "rev1.json", tmp_path / "rev2.json"
    out = ["--out", str(tmp_path / "reports")]

    def save(*args: str) -> Any:
        """``glmfb bench ... --save``: a kernel timed alone on a busy host is inconclusive (no time
        of its own), so run it again, as a user would, up to three times."""
        for _ in range(3):
            result = runner.invoke(app, ["bench", f"{HERE}:scaled", *args, "--shape", "64x512", "--budget", "1",
                                         "--json", *out])
            if result.exit_code != 4 or "The host was busy" not in result.stdout:
                return result
        pytest.skip("the host stayed busy through three runs: no time of the kernel alone to save")

    result = save("--save", str(first))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["status"] == "pass" and "nothing compared" in data["why"]
    assert data["artifacts"]["saved"] == str(first) and Path(data["artifacts"]["samples"]).is_file()
    saved = json.loads(first.read_text())
    assert saved["schema"] == SAVED_SCHEMA and saved["env"]["threads"] == 1
    assert len(saved["shapes"]["64x512"]["baseline"]) > 10
    result = save("--arg", "times=3", "--save", str(second))
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["bench", str(first), str(second), "--json", *out])
    assert result.exit_code == 1, result.output
    verdict = json.loads(result.stdout)
    assert verdict["status"] == "fail" and verdict["metric"]["value"] > 0.5
