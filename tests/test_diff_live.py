"""Live mode on the planted-bug scenarios: the acceptance tests of the diff probe."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import BundledRun
from typer.testing import CliRunner

from glmfb.cli import app
from glmfb.contract.verdict import Verdict
from glmfb.core.commandline import argv, command_line
from glmfb.diff.config import DiffConfig
from glmfb.diff.requests import read_requests
from glmfb.workflows.suite import load_definitions

ROOT = Path(__file__).resolve().parents[1]
NUMERICS = ROOT / "scenarios" / "numerics"
LLAMA = str(NUMERICS / "llama.py")
SCAN = str(NUMERICS / "scan.py")
runner = CliRunner()


def evidence(verdict: Verdict | dict[str, Any]) -> dict[str, dict[str, Any]]:
    items = [e.to_dict() for e in verdict.evidence] if isinstance(verdict, Verdict) else verdict["evidence"]
    return {e["kind"]: e for e in items}


def run_diff(config: DiffConfig, folder: Path) -> Verdict:
    from helpers import run

    return run("diff", config, folder)


@pytest.fixture(scope="module")
def scan_requests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scan") / "requests.jsonl"
    path.write_text("".join(f'{{"id": "s{n}", "length": {n}, "seed": {n}}}\n' for n in (32, 64, 128, 256)))
    return path


@pytest.mark.slow
def test_llama_live_names_the_patched_projection(tmp_path: Path) -> None:
    result = runner.invoke(app, [
        "diff", f"{LLAMA}:clean", f"{LLAMA}:bf16_output", "--requests", str(NUMERICS / "llama_requests.jsonl"),
        "--candidate-arg", "module=model.layers.1.mlp.down_proj", "--out", str(tmp_path), "--json",
    ])
    assert result.exit_code == 1, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["status"] == "fail" and verdict["layer"] == "numerics"
    assert verdict["where"]["module"] == "model.layers.1.mlp.down_proj"
    assert verdict["where"]["request"].startswith("llama-")
    assert verdict["where"]["position"] == 0
    found = evidence(verdict)
    local = found["local_error"]["rows"]
    assert local[0]["module"] == "model.layers.1.mlp.down_proj" and local[0]["local_exceeds_tolerance"]
    # the modules after it only inherit the error: their own error on the baseline's inputs is zero
    inherited = [r for r in local if r["module"].startswith(("model.layers.2", "model.layers.3", "model.norm", "lm_head"))]
    assert inherited and all(r["local_rel_l2"] == 0.0 and not r["local_exceeds_tolerance"] for r in inherited)
    assert found["precision_signature"]["nearest"] == "bf16"
    assert found["error_shape"]["shape"] == "constant"
    assert found["tokens"]["tap"] == "output[logits]"
    assert "bfloat16" in verdict["why"] and "model.layers.1.mlp.down_proj" in verdict["why"]
    assert Path(verdict["artifacts"]["modules_csv"]).is_file()


def _from_here(ref: str, base_dir: Path | None) -> str:
    """A definition's file reference (relative to its file) as an absolute one."""
    location, _, attr = ref.rpartition(":")
    return f"{((base_dir or Path.cwd()) / location).resolve()}:{attr}"


@pytest.mark.slow
@pytest.mark.bundled("diff.toml")
def test_llama_against_itself_passes_with_zero_error(bundled_run: BundledRun) -> None:
    """This configuration is probes/diff.toml's llama-clean-vs-itself: its verdict in the
    session's one run of the bundled suite (conftest.py)."""
    config = DiffConfig("self", f"{LLAMA}:clean", f"{LLAMA}:clean", requests=NUMERICS / "llama_requests.jsonl")
    name = "llama-clean-vs-itself"
    (definition,) = [d for d in load_definitions([ROOT / "probes" / "diff.toml"]) if d.name == name]
    bundled = definition.config
    assert replace(bundled, name=config.name, baseline=_from_here(bundled.baseline, bundled.base_dir),
                   candidate=_from_here(bundled.candidate, bundled.base_dir), base_dir=None) == config
    verdict = Verdict.from_dict(bundled_run.verdicts("diff.toml")[name])
    assert verdict.status.value == "pass"
    assert verdict.metric is not None and verdict.metric.value == 0.0
    rows = evidence(verdict)["modules"]["rows"]
    assert len(rows) > 50 and all(r["max_abs"] == 0.0 for r in rows)


@pytest.mark.slow
def test_tf32_scan_grows_with_length_and_minimizes(tmp_path: Path, scan_requests: Path) -> None:
    config = DiffConfig("scan", f"{SCAN}:fp32", f"{SCAN}:tf32", requests=scan_requests, rtol=0.01, atol=0.05)
    verdict = run_diff(config, tmp_path)
    assert verdict.status.value == "fail"
    assert verdict.where["module"] == "layers.0.scan"
    assert verdict.where["request"] == "s256"
    found = evidence(verdict)
    shape = found["error_shape"]
    assert shape["shape"] == "growing"
    assert shape["fit"]["loglog_exponent"] > 0.3 and shape["fit"]["loglog_r2"] > 0.7
    assert found["precision_signature"]["nearest"] == "tf32/fp16"
    assert found["requests"]["rows"][0]["status"] == "pass"  # short requests are within tolerance
    assert "TF32" in verdict.why
    minimal = found["minimal_reproducer"]
    assert 1 <= minimal["length"] < minimal["original_length"] == 256
    reproducer = read_requests(minimal["file"])
    assert len(reproducer) == 1 and reproducer[0].length == minimal["length"]
    step = verdict.next[-1]
    command = command_line(step)
    assert command == minimal["command"] and step.command == "diff" and step.arguments["requests"] == minimal["file"]
    # the command in `next` reruns the reproducer, and it still fails
    rerun = runner.invoke(app, ["diff", *argv(step)[2:], "--no-minimize", "--out", str(tmp_path), "--json"])
    assert rerun.exit_code == 1, rerun.stderr
    # at the threshold length, either layer's scan may be the first to cross the tolerance
    assert json.loads(rerun.stdout)["where"]["module"] in ("layers.0.scan", "layers.1.scan")


def test_fixed_scan_passes_with_zero_error(tmp_path: Path, scan_requests: Path) -> None:
    verdict = run_diff(DiffConfig("fixed", f"{SCAN}:fp32", f"{SCAN}:fp32", requests=scan_requests,
                                  rtol=0.01, atol=0.05), tmp_path)
    assert verdict.status.value == "pass" and verdict.why.startswith("All 4 requests match exactly")
    assert Verdict.from_dict(verdict.to_dict()) == verdict


@pytest.mark.slow
@pytest.mark.bundled("diff.toml")
def test_probe_definitions_meet_their_expectations(bundled_run: BundledRun) -> None:
    """probes/diff.toml's verdicts in the session's one run of the bundled suite (conftest.py):
    its exit code and summary for them are what ``glmfb run probes/diff.toml`` reports."""
    part = bundled_run.part("diff.toml")
    assert part.exit_code == 0, bundled_run.stderr[-2000:]
    run = part.to_dict()
    assert run["summary"]["expect_met"] == 4 and run["summary"]["expect_unmet"] == 0
    statuses = {v["name"]: v["status"] for v in run["verdicts"]}
    assert statuses == {"llama-down-proj-bf16": "fail", "llama-clean-vs-itself": "pass",
                        "scan-state-update-tf32": "fail", "scan-state-update-fp32": "pass"}


CHUNKED = str(ROOT / "tests" / "targets" / "chunked_attention.py")


@pytest.mark.slow
def test_the_agents_case_where_is_about_one_thing_and_no_step_repeats_itself(tmp_path: Path) -> None:
    """A chunked attention whose refactor dropped the last token of each chunk from the
    cross-chunk state (tests/targets/chunked_attention.py, an off-by-one of our own): the
    verdict's where fields all describe the blamed module, and the minimal reproducer's rerun,
    once followed, does not offer itself again."""
    requests = tmp_path / "requests.jsonl"
    requests.write_text('{"id": "r300", "length": 300, "seed": 1, "vocab": 128}\n')
    result = runner.invoke(app, ["diff", f"{CHUNKED}:make", f"{CHUNKED}:make", "--candidate-arg", "off_by_one=true",
                                 "--requests", str(requests), "--out", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.stderr
    verdict = json.loads(result.stdout)
    where = verdict["where"]
    assert where["position"] == 64 and where["module"].startswith("layers.0.attn"), where
    modules = evidence(verdict)["modules"]["rows"]
    blamed = next(r for r in modules if r["module"] == where["module"])
    assert where["shape"] == blamed["shape"], (where, blamed)  # the module's own output, not a tap inside it
    assert f"the first tap outside tolerance, {where['module']}.inter#1, is a submodule it calls" in verdict["why"]
    step = Verdict.from_dict(verdict).next
    reruns = [s for s in step if s.command == "diff"]
    assert len(reruns) == 1 and reruns[0].arguments["requests"] != str(requests)  # a shorter request
    again = runner.invoke(app, ["diff", *argv(reruns[0])[2:], "--out", str(tmp_path), "--json"])
    assert again.exit_code == 1, again.stderr
    followed = json.loads(again.stdout)
    assert followed["where"]["position"] == 64
    assert not [s for s in followed["next"] if s.get("command") == "diff"], followed["next"]  # nothing to narrow
    # the same bug gets the same label at either length (the short request has one failing position)
    assert followed["where"]["request"] != verdict["where"]["request"]
    assert evidence(verdict)["error_shape"]["shape"] == evidence(followed)["error_shape"]["shape"] == "step"
    # an error that happens to be the size of some format's rounding is not called consistent with
    # it once rounding the baseline to that format failed to reproduce it
    for found in (evidence(verdict), evidence(followed)):
        signature = found["precision_signature"]
        tried = {t["format"] for t in found["rounding_test"]["trials"]}
        if signature["nearest"] in tried:
            assert signature["rounding_test"] == "not reproduced" and not signature["consistent"], signature
