"""Requests, capture directories, and comparing captures through the CLI (bad input included)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from glmfb.cli import app
from glmfb.contract.errors import InputError
from glmfb.contract.verdict import Verdict
from glmfb.diff.engine import CaptureConfig, run_capture
from glmfb.diff.requests import draw_ids, read_requests
from glmfb.diff.store import CAPTURE_SCHEMA, CaptureReader

runner = CliRunner()
HERE = Path(__file__).resolve()


@pytest.fixture(autouse=True)
def in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about captures and comparisons, so the targets run in this process
    (GLMFB_ISOLATE=0); the supervised child is covered by test_isolation.py and the test of a
    target that fails half-way below."""
    monkeypatch.setenv("GLMFB_ISOLATE", "0")


# ---- targets used by these tests (referenced as tests/test_diff_capture.py:NAME) -------------


@dataclass
class Pair:
    left: torch.Tensor
    right: torch.Tensor


class Shared(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


class Toy(nn.Module):
    """Tuple, dict and dataclass outputs, a module called twice, a non-tensor output."""

    def __init__(self, scale: float = 1.0, width: int = 8, watch: str = "") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(50, width)
        self.shared = Shared()
        self.split = SplitOut()
        self.scale = scale
        self.watch = Path(watch) if watch else None
        self.files_seen: list[int] = []

    def forward(self, input_ids: torch.Tensor) -> dict[str, Any]:
        x = self.shared(self.embed(input_ids))
        if self.watch is not None:  # the taps so far are already on disk
            self.files_seen.append(len(list(self.watch.rglob("*.safetensors"))))
        pair, extra = self.split(x)
        y = self.shared(pair.left * self.scale)
        return {"y": y, "extra": extra, "note": "not a tensor"}


class SplitOut(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[Pair, dict[str, torch.Tensor]]:
        return Pair(x + 1, x - 1), {"sum": x.sum(dim=-1)}


def toy(scale: float = 1.0, width: int = 8, watch: str = "") -> nn.Module:
    return Toy(scale, width, watch)


class Plain(nn.Module):
    """One tensor out: an embedding, widened."""

    def __init__(self, width: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(50, width)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.embed(input_ids))


def plain(width: int = 8) -> nn.Module:
    return Plain(width)


def toy_half(width: int = 8) -> nn.Module:
    return Toy(1.0, width).to(torch.float64)


def explode(**kwargs: Any) -> nn.Module:
    class Broken(nn.Module):
        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("kernel exploded on purpose")

    return Broken()


def exits(**kwargs: Any) -> nn.Module:
    class Exits(nn.Module):
        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            import os

            os._exit(7)  # the process ends without answering

    return Exits()


# ---- helpers ------------------------------------------------------------------------------------


def write_requests(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def requests_file(tmp_path: Path) -> Path:
    return write_requests(tmp_path / "requests.jsonl", [
        '{"id": "a", "length": 5, "seed": 1, "vocab": 50}',
        '{"id": "b", "input_ids": [1, 2, 3, 4, 5, 6, 7]}',
    ])


def capture(tmp_path: Path, requests: Path, name: str, target: str = "toy", *args: str) -> Path:
    out = tmp_path / name
    result = runner.invoke(app, ["capture", f"{HERE}:{target}", "--requests", str(requests), "--out", str(out), *args])
    assert result.exit_code == 0, result.stderr
    return out


def diff_json(*args: str) -> tuple[int, dict[str, Any] | None, str]:
    result = runner.invoke(app, ["diff", *args, "--json"])
    data = json.loads(result.stdout) if result.stdout.strip() else None
    return result.exit_code, data, result.stderr


def one_line_error(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# ---- requests -------------------------------------------------------------------------------------


def test_requests_parse_and_draw_deterministically(requests_file: Path) -> None:
    requests = read_requests(requests_file)
    assert [r.id for r in requests] == ["a", "b"]
    assert requests[0].input_ids == draw_ids(5, 1, 50)
    assert all(0 <= i < 50 for i in requests[0].input_ids or ())
    assert requests[1].length == 7
    assert requests[1].prefix(3).input_ids == (1, 2, 3)
    assert requests[1].module_inputs()[0][0].shape == (1, 7)


@pytest.mark.parametrize(
    ("line", "phrase"),
    [
        ('{"id": "x"}', "exactly one of"),
        ('{"id": "x", "length": 0}', "length must be an integer >= 1"),
        ('{"length": 4}', "needs a non-empty string 'id'"),
        ('{"id": "x", "input_ids": [1, -2]}', "input_ids"),
        ('{"id": "x", "tensors": {"h": {"shape": [2], "dtype": "complex"}}}', "dtype 'complex'"),
        ("not json", "not valid JSON"),
        ('{"id": "a", "length": 3}', "duplicate id 'a'"),
    ],
)
def test_bad_request_lines_name_the_line(tmp_path: Path, line: str, phrase: str) -> None:
    path = write_requests(tmp_path / "bad.jsonl", ['{"id": "a", "length": 2}', line])
    with pytest.raises(InputError) as caught:
        read_requests(path)
    assert f"{path}:2" in str(caught.value)
    assert phrase in str(caught.value)


# ---- capture --------------------------------------------------------------------------------------


def test_capture_writes_taps_in_execution_order_with_stable_names(tmp_path: Path, requests_file: Path) -> None:
    out = tmp_path / "cap"
    watch_args = {"watch": str(out)}
    manifest = run_capture(CaptureConfig(f"{HERE}:toy", out, args=watch_args, requests=requests_file))
    reader = CaptureReader(out)
    data = json.loads((out / "manifest.json").read_text())
    assert data["schema"] == CAPTURE_SCHEMA and data["complete"] is True
    assert data["request_ids"] == ["a", "b"]
    assert data["env"]["python"] and "git" in data
    names = [t.name for t in manifest.requests[0].taps]
    assert names == [
        "embed", "shared#0", "split[0][left]", "split[0][right]", "split[1][sum]", "shared#1",
        "output[y]", "output[extra][sum]",
    ]
    assert manifest.requests[0].skipped == ("output[note]",)
    tap = manifest.requests[1].taps[0]
    assert tap.shape == (1, 7, 8) and tap.dtype == "float32"
    with torch.no_grad():
        expected = toy().embed(torch.tensor([[1, 2, 3, 4, 5, 6, 7]]))
    assert torch.equal(reader.load(tap), expected)
    assert not list(out.rglob("*.pickle")) and all(p.suffix in (".safetensors", ".json") for p in out.rglob("*.*"))


def test_capture_writes_tensors_as_they_are_produced(tmp_path: Path, requests_file: Path) -> None:
    import os

    from glmfb.core.targets import Target
    from glmfb.diff.capture import load_side, run_requests
    from glmfb.diff.engine import capture as capture_side

    out = tmp_path / "cap"
    partial = tmp_path / f".cap.partial-{os.getpid()}"  # where a capture is written until complete
    side = load_side(Target(f"{HERE}:toy", {"watch": str(partial)}))
    capture_side(side, read_requests(requests_file), out, ())
    # one file per module call: during request 2, request 1's five calls and this one's first
    # two (embed, shared#0) were already on disk
    assert side.obj.files_seen == [2, 5 + 2]
    assert not partial.exists() and (out / "manifest.json").is_file()
    assert run_requests  # imported for the public API


def test_tap_globs_narrow_and_unknown_globs_are_usage_errors(tmp_path: Path, requests_file: Path) -> None:
    out = capture(tmp_path, requests_file, "cap", "toy", "--tap", "split")
    names = [t.name for t in CaptureReader(out).requests[0].taps]
    assert names == ["split[0][left]", "split[0][right]", "split[1][sum]", "output[y]", "output[extra][sum]"]
    result = runner.invoke(app, ["capture", f"{HERE}:toy", "--requests", str(requests_file),
                                 "--out", str(tmp_path / "x"), "--tap", "nothing*"])
    assert result.exit_code == 2
    assert "matches no module" in one_line_error(result.stderr)


def test_capture_of_a_target_that_raises_is_one_line_exit_3(tmp_path: Path, requests_file: Path) -> None:
    result = runner.invoke(app, ["capture", f"{HERE}:explode", "--requests", str(requests_file), "--out", str(tmp_path / "x")])
    assert result.exit_code == 3
    assert "kernel exploded on purpose" in one_line_error(result.stderr)


# ---- compare captures -----------------------------------------------------------------------------


def test_identical_captures_pass_with_zero_error(tmp_path: Path, requests_file: Path) -> None:
    a = capture(tmp_path, requests_file, "a")
    b = capture(tmp_path, requests_file, "b")
    code, verdict, _ = diff_json(str(a), str(b), "--out", str(tmp_path / "reports"))
    assert code == 0 and verdict is not None
    assert verdict["status"] == "pass" and verdict["layer"] == "numerics"
    assert verdict["metric"]["value"] == 0.0
    assert "match exactly" in verdict["why"]
    assert Verdict.from_dict(verdict).to_dict() == verdict


def test_differing_captures_fail_and_name_the_first_divergent_tap(tmp_path: Path, requests_file: Path) -> None:
    a = capture(tmp_path, requests_file, "a")
    b = capture(tmp_path, requests_file, "b", "toy", "--arg", "scale=1.01")
    code, verdict, _ = diff_json(str(a), str(b), "--out", str(tmp_path / "reports"))
    assert code == 1 and verdict is not None
    assert verdict["status"] == "fail"
    assert verdict["where"]["module"] == "shared#1"  # the first tap after the scaled one
    assert verdict["where"]["position"] == 0
    kinds = {e["kind"]: e for e in verdict["evidence"]}
    assert [row["status"] for row in kinds["requests"]["rows"]] == ["fail", "fail"]
    rows = kinds["modules"]["rows"]
    assert [r["status"] for r in rows[:5]] == ["pass"] * 5
    csv_path = Path(verdict["artifacts"]["modules_csv"])
    assert csv_path.is_file() and csv_path.read_text().startswith("order,tap,module,call")
    assert "local_error" not in kinds  # captures alone cannot separate local from inherited
    # a loose enough tolerance for that tap passes it
    code, verdict, _ = diff_json(str(a), str(b), "--tol", "shared#1=0.1,0", "--tol", "output*=0.1,0",
                                 "--out", str(tmp_path / "reports"))
    assert code == 0, verdict


@pytest.mark.parametrize(
    ("other_requests", "other_args", "phrase"),
    [
        (['{"id": "a", "length": 5, "seed": 1, "vocab": 50}', '{"id": "c", "input_ids": [1, 2]}'], [],
         "request #1 is 'b' in the baseline and 'c' in the candidate"),
        (['{"id": "a", "length": 5, "seed": 1, "vocab": 50}'], [], "request 'b' is in the baseline only"),
        (None, ["plain", "--arg", "width=4"], "request 'a', tap 'embed': shape [1, 5, 8] in the baseline, [1, 5, 4] "
                                              "in the candidate; no final output has the same name and shape"),
    ],
)
def test_mismatched_captures_name_the_first_mismatch(tmp_path: Path, requests_file: Path, other_requests: list[str] | None,
                                                     other_args: list[str], phrase: str) -> None:
    target = other_args[0] if other_args and not other_args[0].startswith("-") else "toy"
    a = capture(tmp_path, requests_file, "a", target)
    other = requests_file if other_requests is None else write_requests(tmp_path / "other.jsonl", other_requests)
    b = capture(tmp_path, other, "b", target, *[a for a in other_args if a != target])
    code, verdict, stderr = diff_json(str(a), str(b), "--out", str(tmp_path / "reports"))
    assert code == 2 and verdict is None
    assert phrase in one_line_error(stderr)


def test_taps_one_side_lacks_are_listed_and_the_shared_ones_compared(tmp_path: Path, requests_file: Path) -> None:
    a = capture(tmp_path, requests_file, "a")
    b = capture(tmp_path, requests_file, "b", "toy", "--tap", "split")  # the candidate has only split's taps
    code, verdict, stderr = diff_json(str(a), str(b), "--out", str(tmp_path / "reports"))
    assert code == 0 and verdict is not None, stderr
    tree = {e["kind"]: e for e in verdict["evidence"]}["tree_differences"]
    assert "embed" in tree["baseline_only"] and "shared#0" in tree["baseline_only"] and not tree["candidate_only"]
    assert tree["baseline_only_modules"] == ["embed", "shared"]
    compared = {r["tap"] for r in {e["kind"]: e for e in verdict["evidence"]}["modules"]["rows"]}
    assert "embed" not in compared and {"split[0][left]", "output[y]"} <= compared
    assert "module trees differ" in verdict["why"] and "baseline only" in verdict["why"]
    # a planted difference is still found on the shared taps
    c = capture(tmp_path, requests_file, "c", "toy", "--tap", "split", "--arg", "scale=1.01")
    code, verdict, stderr = diff_json(str(a), str(c), "--out", str(tmp_path / "reports"))
    assert code == 1 and verdict is not None and verdict["status"] == "fail", stderr


def test_shared_taps_of_another_shape_are_listed_and_the_rest_compared(tmp_path: Path, requests_file: Path) -> None:
    a = capture(tmp_path, requests_file, "a")
    b = capture(tmp_path, requests_file, "b", "toy", "--arg", "width=4")  # every tap narrower but split's sum
    code, verdict, stderr = diff_json(str(a), str(b), "--out", str(tmp_path / "reports"))
    assert code == 1 and verdict is not None, stderr
    found = {e["kind"]: e for e in verdict["evidence"]}
    shapes = {s["tap"]: s for s in found["tree_differences"]["shapes"]}
    assert shapes["embed"] == {"tap": "embed", "baseline": [1, 5, 8], "candidate": [1, 5, 4]}
    assert [r["tap"] for r in found["modules"]["rows"]] == ["split[1][sum]", "output[extra][sum]"]
    assert "differ in shape (not compared)" in verdict["why"]


def test_a_dtype_difference_is_measured_in_a_common_dtype(tmp_path: Path, requests_file: Path) -> None:
    a = capture(tmp_path, requests_file, "a")
    b = capture(tmp_path, requests_file, "b", "toy_half")  # the same model in float64
    code, verdict, stderr = diff_json(str(a), str(b), "--out", str(tmp_path / "reports"))
    assert code == 0 and verdict is not None, stderr
    found = {e["kind"]: e for e in verdict["evidence"]}
    assert {"tap": "embed", "baseline": "float32", "candidate": "float64"} in found["tree_differences"]["dtypes"]
    rows = {r["tap"]: r for r in found["modules"]["rows"]}
    assert rows["embed"]["max_abs"] == 0.0  # float32 weights widened to float64: the same values
    assert 0.0 < rows["output[y]"]["max_abs"] < 1e-6  # tanh in float64 against float32: measured, within tolerance


def test_broken_captures_give_one_line_and_exit_2(tmp_path: Path, requests_file: Path) -> None:
    a = capture(tmp_path, requests_file, "a")
    b = capture(tmp_path, requests_file, "b")
    victim = b / "r0001" / "00002.safetensors"
    victim.write_bytes(victim.read_bytes()[:-7])
    code, _, stderr = diff_json(str(a), str(b), "--out", str(tmp_path / "reports"))
    assert code == 2
    assert "truncated safetensors file" in one_line_error(stderr) and "00002.safetensors" in stderr

    (b / "manifest.json").unlink()
    code, _, stderr = diff_json(str(a), str(b), "--out", str(tmp_path / "reports"))
    assert code == 2 and "no manifest.json" in one_line_error(stderr)

    manifest = json.loads((a / "manifest.json").read_text())
    manifest["schema"] = "glmfb.capture/99"
    (a / "manifest.json").write_text(json.dumps(manifest))
    code, _, stderr = diff_json(str(a), str(a), "--out", str(tmp_path / "reports"))
    assert code == 2 and "unknown capture schema 'glmfb.capture/99'" in one_line_error(stderr)

    code, _, stderr = diff_json(str(tmp_path / "missing"), str(tmp_path / "missing2"), "--out", str(tmp_path / "r"))
    assert code == 2 and "no such capture directory" in one_line_error(stderr)


def test_target_side_without_requests_is_a_usage_error(tmp_path: Path) -> None:
    code, _, stderr = diff_json(f"{HERE}:toy", f"{HERE}:toy", "--out", str(tmp_path / "r"))
    assert code == 2 and "needs requests (--requests FILE" in one_line_error(stderr)


def test_target_that_raises_gives_an_error_verdict(tmp_path: Path, requests_file: Path) -> None:
    code, verdict, _ = diff_json(f"{HERE}:toy", f"{HERE}:explode", "--requests", str(requests_file),
                                 "--out", str(tmp_path / "r"))
    assert code == 3 and verdict is not None
    assert verdict["status"] == "error" and verdict["layer"] == "harness"
    assert "RuntimeError: kernel exploded on purpose" in verdict["why"]


# ---- callable targets, named tensors, non-finite outputs, mixed sides ----------------------------


def scaled(factor: float = 1.0) -> Any:
    """A callable target: gets the request dict, returns a dict of tensors."""

    def run(request: dict[str, Any]) -> dict[str, torch.Tensor]:
        x = request["x"]
        return {"y": x * request.get("gain", 1.0) * factor, "count": torch.tensor([x.numel()])}

    return run


def test_callable_target_gets_named_tensors_and_extra_fields(tmp_path: Path) -> None:
    requests = write_requests(tmp_path / "t.jsonl", [
        '{"id": "t1", "tensors": {"x": {"shape": [1, 40, 6], "dtype": "float32", "seed": 3}}, "gain": 2.0}',
        '{"id": "t2", "tensors": {"x": {"shape": [1, 80, 6], "dtype": "float32", "seed": 4}}, "gain": 0.5}',
    ])
    a = capture(tmp_path, requests, "a", "scaled")
    reader = CaptureReader(a)
    assert [t.name for t in reader.requests[0].taps] == ["output[y]", "output[count]"]
    assert reader.manifest.kind == "callable"
    assert reader.requests[1].length == 80
    code, verdict, _ = diff_json(str(a), f"{HERE}:scaled", "--requests", str(requests),
                                 "--candidate-arg", "factor=1.001", "--out", str(tmp_path / "r"))
    assert code == 1 and verdict is not None
    assert verdict["where"]["request"] in ("t1", "t2") and verdict["where"]["position"] == 0
    kinds = {e["kind"] for e in verdict["evidence"]}
    assert "local_error" not in kinds and "minimal_reproducer" not in kinds  # not live on both sides
    assert {"requests", "modules", "error_by_position", "precision_signature"} <= kinds


def test_nan_in_the_candidate_is_classified_non_finite(tmp_path: Path, requests_file: Path) -> None:
    code, verdict, _ = diff_json(f"{HERE}:toy", f"{HERE}:toy", "--requests", str(requests_file),
                                 "--candidate-arg", "scale=NaN", "--out", str(tmp_path / "r"))
    assert code == 1 and verdict is not None
    found = {e["kind"]: e for e in verdict["evidence"]}
    assert found["error_shape"]["shape"] == "non-finite"
    assert found["diagnosis"]["rule"] == "non-finite"
    assert "NaN or Inf" in verdict["why"]
    # the NaN enters in the root's own code, between modules: shared#1 is the first tap that shows it
    assert verdict["where"]["module"] == "shared#1"
    assert Verdict.from_dict(verdict).to_dict() == verdict


def test_live_error_from_code_between_modules_is_traced_to_the_parent(tmp_path: Path, requests_file: Path) -> None:
    code, verdict, _ = diff_json(f"{HERE}:toy", f"{HERE}:toy", "--requests", str(requests_file),
                                 "--candidate-arg", "scale=1.01", "--out", str(tmp_path / "r"))
    assert code == 1 and verdict is not None
    found = {e["kind"]: e for e in verdict["evidence"]}
    rows = found["local_error"]["rows"]
    assert rows and all(r["local_exceeds_tolerance"] is False and r["local_rel_l2"] == 0.0 for r in rows)
    # a scale: systematic (measured at the first tap that shows it), made in the parent's forward
    assert found["diagnosis"]["rule"] == "systematic-bias" and found["bias"]["explained"] > 0.8  # tanh bends the scale a little
    # the scale is applied in Toy.forward itself: the climb from shared#1 ends at the top level
    assert found["error_entry"]["module"] == "" and found["error_entry"]["root_class"] == "Toy"
    assert verdict["where"]["module"] == "shared#1"  # the top level has no path: the first module that shows it
    assert "no module's own error exceeds tolerance" in verdict["why"]
    assert "the top-level module (Toy)'s own forward" in verdict["why"]


def test_tap_globs_narrow_a_comparison_of_captures(tmp_path: Path, requests_file: Path) -> None:
    a = capture(tmp_path, requests_file, "a")
    b = capture(tmp_path, requests_file, "b", "toy", "--arg", "scale=1.01")
    code, verdict, _ = diff_json(str(a), str(b), "--tap", "split", "--out", str(tmp_path / "r"))
    assert code == 1 and verdict is not None  # the outputs are always compared
    rows = {e["kind"]: e for e in verdict["evidence"]}["modules"]["rows"]
    assert [r["tap"] for r in rows] == ["split[0][left]", "split[0][right]", "split[1][sum]", "output[y]", "output[extra][sum]"]
    assert "module" not in verdict["where"]  # only the outputs differ among these taps


# ---- captures that are cut short, reused or tampered with ----------------------------------------


def test_an_existing_out_is_refused_unless_force_replaces_it_whole(tmp_path: Path, requests_file: Path) -> None:
    out = capture(tmp_path, requests_file, "cap")
    (out / "r0009").mkdir()  # a stale request folder from an older capture
    again = runner.invoke(app, ["capture", f"{HERE}:toy", "--requests", str(requests_file), "--out", str(out)])
    assert again.exit_code == 2 and "already exists" in one_line_error(again.stderr)
    forced = runner.invoke(app, ["capture", f"{HERE}:toy", "--requests", str(requests_file), "--out", str(out),
                                 "--force"])
    assert forced.exit_code == 0, forced.stderr
    assert not (out / "r0009").exists()  # replaced whole, nothing stale kept
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    refused = runner.invoke(app, ["capture", f"{HERE}:toy", "--requests", str(requests_file), "--out", str(other),
                                  "--force"])
    assert refused.exit_code == 2 and "is not a capture directory" in one_line_error(refused.stderr)
    assert (other / "todo.txt").read_text() == "mine"


def test_a_target_that_fails_half_way_leaves_no_capture(tmp_path: Path, requests_file: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLMFB_ISOLATE", "1")  # through the supervised child, as a user runs it
    out = tmp_path / "cap"
    result = runner.invoke(app, ["capture", f"{HERE}:explode", "--requests", str(requests_file), "--out", str(out)])
    assert result.exit_code == 3
    assert not out.exists() and not list(tmp_path.glob(".cap.partial-*"))


def test_capture_leaves_its_child_logs_only_when_the_child_ended_without_answering(
        tmp_path: Path, requests_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    monkeypatch.setenv("TMPDIR", str(system_tmp))
    monkeypatch.setenv("GLMFB_ISOLATE", "1")  # through the supervised child, as a user runs it
    for target, code in (("toy", 0), ("explode", 3)):
        result = runner.invoke(app, ["capture", f"{HERE}:{target}", "--requests", str(requests_file),
                                     "--out", str(tmp_path / target)])
        assert result.exit_code == code, result.stderr
        assert list(system_tmp.iterdir()) == [], f"capture of {target} left its child's logs behind"
    result = runner.invoke(app, ["capture", f"{HERE}:exits", "--requests", str(requests_file),
                                 "--out", str(tmp_path / "exits")])
    assert result.exit_code == 3
    kept = list(system_tmp.iterdir())
    assert [p.name.startswith("glmfb-capture-") for p in kept] == [True]
    assert str(kept[0] / "probe-stderr.txt") in result.stderr  # the error says where to read


def test_an_incomplete_capture_is_refused(tmp_path: Path, requests_file: Path) -> None:
    out = capture(tmp_path, requests_file, "cap")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["complete"] = False
    (out / "manifest.json").write_text(json.dumps(manifest))
    code, verdict, stderr = diff_json(str(out), str(out), "--out", str(tmp_path / "r"))
    assert code == 2 and verdict is None and "the capture is incomplete" in one_line_error(stderr)


@pytest.mark.parametrize("tamper", ["outside", "absolute", "symlink", "fifo"])
def test_manifest_paths_stay_inside_the_capture(tmp_path: Path, requests_file: Path, tamper: str) -> None:
    import os

    out = capture(tmp_path, requests_file, "cap")
    manifest = json.loads((out / "manifest.json").read_text())
    tap = manifest["requests"][0]["taps"][0]
    victim = out / tap["file"]
    if tamper == "outside":
        tap["file"] = "../../etc/passwd"
    elif tamper == "absolute":
        tap["file"] = "/etc/passwd"
    elif tamper == "symlink":
        victim.unlink()
        victim.symlink_to("/etc/passwd")
    else:
        victim.unlink()
        os.mkfifo(victim)
    (out / "manifest.json").write_text(json.dumps(manifest))
    code, _, stderr = diff_json(str(out), str(out), "--out", str(tmp_path / "r"))
    assert code == 2
    phrase = {"outside": "lies outside the capture folder", "absolute": "lies outside the capture folder",
              "symlink": "a symlink inside the capture", "fifo": "not a regular file"}[tamper]
    assert phrase in one_line_error(stderr)


@pytest.mark.parametrize(
    ("line", "phrase"),
    [
        ('{"id": "huge", "length": 1000000000}', "asks for 1,000,000,000 elements, over the limit"),
        ('{"id": "wide", "tensors": {"x": {"shape": [100000, 100000]}}}', "over the limit"),
        ('{"id": "empty", "tensors": {"x": {"shape": [1, 0, 8]}}}', "has no elements"),
        ('{"id": "\\ud800"}', "not valid Unicode"),
        ('{"id": "deep", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ],
)
def test_bad_requests_are_refused_before_anything_is_allocated(tmp_path: Path, line: str, phrase: str) -> None:
    requests = write_requests(tmp_path / "r.jsonl", [line])
    code, verdict, stderr = diff_json(f"{HERE}:toy", f"{HERE}:toy", "--requests", str(requests),
                                      "--out", str(tmp_path / "r"))
    assert code == 2 and verdict is None
    assert phrase in one_line_error(stderr)


def test_max_elements_raises_the_limit(tmp_path: Path) -> None:
    requests = write_requests(tmp_path / "r.jsonl", ['{"id": "a", "length": 600}'])
    code, _, stderr = diff_json(f"{HERE}:toy", f"{HERE}:toy", "--requests", str(requests), "--max-elements", "500",
                                "--out", str(tmp_path / "r"))
    assert code == 2 and "over the limit of 500" in one_line_error(stderr)


def test_an_out_that_is_a_file_is_a_usage_error(tmp_path: Path, requests_file: Path) -> None:
    (tmp_path / "reports").write_text("not a folder")
    code, _, stderr = diff_json(f"{HERE}:toy", f"{HERE}:toy", "--requests", str(requests_file),
                                "--out", str(tmp_path / "reports"))
    assert code == 2 and "is a file" in one_line_error(stderr)
