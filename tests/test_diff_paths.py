"""Two execution paths, the error along positions, the minimizer's request contract, the
counterfactual reruns and what a live diff keeps, on small targets defined here (referenced as
tests/test_diff_paths.py:NAME)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from glmfb.contract.step import Step
from glmfb.contract.units import OptionValueError
from glmfb.contract.verdict import Verdict
from glmfb.diff.config import DiffConfig
from glmfb.diff.counterfactual import parse_counterfactuals
from glmfb.diff.requests import NotShrinkable, draw_ids, parse_request, read_requests

HERE = Path(__file__).resolve()


# ---- targets ------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(x)))


class Attention(nn.Module):
    """Causal attention that uses the mask its parent hands it (None: plain causal)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.out = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / 4.0
        length = x.shape[-2]
        allowed = torch.ones(length, length, dtype=torch.bool).tril() if mask is None else mask
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        return self.out(weights @ v), (weights if self.return_weights else None)

    return_weights = False


class Body(nn.Module):
    """Builds the attention mask in its own forward (a sliding window when ``window`` is set)."""

    def __init__(self, window: int | None) -> None:
        super().__init__()
        self.window = window
        self.attn = Attention()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = None
        if self.window is not None:
            length = x.shape[-2]
            index = torch.arange(length)
            mask = (index[None, :] <= index[:, None]) & (index[:, None] - index[None, :] < self.window)
        y, _ = self.attn(x, mask)
        x = x + y
        return x + self.mlp(x)


class Net(nn.Module):
    def __init__(self, window: int | None = None, weights: bool = False, functional_mlp: bool = False,
                 activation: str = "silu", seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(64, 16)
        self.body = Body(window)
        self.head = nn.Linear(16, 64)
        self.body.attn.return_weights = weights
        if functional_mlp:  # a port that calls F.linear on the weights: up and down never run as modules
            mlp = self.body.mlp
            act = F.silu if activation == "silu" else F.gelu

            def forward(x: torch.Tensor) -> torch.Tensor:
                return F.linear(act(F.linear(x, mlp.up.weight, mlp.up.bias)), mlp.down.weight, mlp.down.bias)

            mlp.forward = forward  # type: ignore[method-assign]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(input_ids)))


def net(window: int | None = None, weights: bool = False, functional_mlp: bool = False, activation: str = "silu",
        precision: str = "ieee") -> nn.Module:
    model = Net(window, weights, functional_mlp, activation)
    if precision == "bf16":  # the head's output rounded, the knob the counterfactual turns
        model.head.register_forward_hook(lambda m, a, out: out.to(torch.bfloat16).to(torch.float32))
    return model


class PositionTable:
    """A callable that reads ``req["length"]`` (and refuses ids of another length), with a
    position table re-drawn from row ``corrupt_from`` on; ``shortest`` makes it raise on shorter
    requests (a target the minimizer cannot shrink)."""

    def __init__(self, corrupt_from: int | None = None, shortest: int = 1) -> None:
        torch.manual_seed(0)
        self.embed = torch.randn(64, 8)
        self.table = torch.randn(128, 8)
        if corrupt_from is not None:
            self.table[corrupt_from:] = torch.randn(128 - corrupt_from, 8, generator=torch.Generator().manual_seed(1))
        self.shortest = shortest

    def __call__(self, request: dict[str, Any]) -> torch.Tensor:
        length = int(request["length"])
        ids = request["input_ids"]
        if ids.shape[-1] != length:
            raise ValueError(f"{ids.shape[-1]} ids, length {length}")
        if length < self.shortest:
            raise RuntimeError(f"needs at least {self.shortest} tokens")
        return self.embed[ids[0]] + self.table[:length]


def position_table(corrupt_from: int | None = None, shortest: int = 1) -> PositionTable:
    return PositionTable(corrupt_from, shortest)


def decay(rate: float = 0.01) -> Any:
    """A callable over named tensors ``x [1, T, 4]``: a running state decaying at ``rate``."""

    def run(request: dict[str, Any]) -> torch.Tensor:
        x = request["x"]
        state = torch.zeros(4)
        outputs = []
        for t in range(x.shape[1]):
            state = (1 - rate) * state + x[0, t]
            outputs.append(state.clone())
        return torch.stack(outputs)[None]

    return run


# ---- helpers ------------------------------------------------------------------------------------


def requests(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def run_diff(config: DiffConfig, folder: Path) -> Verdict:
    from helpers import run

    return run("diff", config, folder)


def evidence(verdict: Verdict) -> dict[str, dict[str, Any]]:
    return {e["kind"]: e for e in verdict.to_dict()["evidence"]}


def rule(verdict: Verdict) -> str:
    return str(evidence(verdict)["diagnosis"]["rule"])


TOKENS = ('{"id": "r16", "length": 16, "seed": 1, "vocab": 64}', '{"id": "r32", "length": 32, "seed": 2, "vocab": 64}')


# ---- two execution paths -------------------------------------------------------------------------


def test_one_path_returns_weights_the_other_none_and_they_pass(tmp_path: Path) -> None:
    config = DiffConfig("weights", f"{HERE}:net", f"{HERE}:net", baseline_args={"weights": True},
                        requests=requests(tmp_path, *TOKENS))
    verdict = run_diff(config, tmp_path)
    assert verdict.status.value == "pass", verdict.why
    tree = evidence(verdict)["tree_differences"]
    assert tree["baseline_only"] == ["body.attn[1]"] and tree["baseline_only_modules"] == []
    assert "module trees differ" in verdict.why


@pytest.mark.slow
def test_a_forward_that_no_longer_runs_its_submodules(tmp_path: Path) -> None:
    path = requests(tmp_path, *TOKENS)
    same = run_diff(DiffConfig("same", f"{HERE}:net", f"{HERE}:net", candidate_args={"functional_mlp": True},
                               requests=path), tmp_path)
    assert same.status.value == "pass" and "match exactly" in same.why
    wrong = run_diff(DiffConfig("gelu", f"{HERE}:net", f"{HERE}:net", requests=path, minimize=False,
                                candidate_args={"functional_mlp": True, "activation": "gelu"}), tmp_path)
    assert wrong.status.value == "fail" and wrong.where["module"] == "body.mlp"
    assert rule(wrong) == "module-tree-differs"
    assert "up, down run as modules in the baseline only" in wrong.why
    assert evidence(wrong)["tree_differences"]["baseline_only_modules"] == ["body.mlp.up", "body.mlp.down"]


# ---- the error along positions ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_mask_built_in_a_parents_forward_is_named_at_the_parent(tmp_path: Path) -> None:
    path = requests(tmp_path, '{"id": "s32", "length": 32, "seed": 3, "vocab": 64}')
    config = DiffConfig("window", f"{HERE}:net", f"{HERE}:net", candidate_args={"window": 8}, requests=path)
    verdict = run_diff(config, tmp_path)
    # body's own error (run on the baseline's input, it builds its own mask) shows it directly
    assert verdict.status.value == "fail" and rule(verdict) == "position-onset"
    assert verdict.where["module"] == "body" and verdict.where["position"] == 8
    assert "up to position 7" in verdict.why and "body (its own error" in verdict.why
    # with the parent beyond the suspects measured, the climb through the inputs finds it
    config = DiffConfig("window", f"{HERE}:net", f"{HERE}:net", candidate_args={"window": 8}, requests=path,
                        max_suspects=2)
    verdict = run_diff(config, tmp_path)
    assert rule(verdict) == "position-onset"
    assert verdict.where["module"] == "body" and verdict.where["position"] == 8
    assert "up to position 7" in verdict.why and "body's own forward" in verdict.why and "mask" in verdict.why
    entry = evidence(verdict)["error_entry"]
    assert entry["module"] == "body" and entry["start"] == "body.attn.out"
    assert [step["module"] for step in entry["steps"]] == ["body.attn.out", "body.attn", "body"]
    assert [d["name"] for d in entry["steps"][1]["differing"]] == ["mask"]
    by_position = evidence(verdict)["error_by_position"]
    assert by_position["bin_edges"][0] == 0 and by_position["bin_edges"][-1] == 32 and by_position["length"] == 32
    assert by_position["outside_fraction"][0] == 0.0 and by_position["outside_fraction"][-1] > 0


def test_a_position_table_with_a_length_request_is_minimized_as_a_length_request(tmp_path: Path) -> None:
    config = DiffConfig("table", f"{HERE}:position_table", f"{HERE}:position_table",
                        candidate_args={"corrupt_from": 12},
                        requests=requests(tmp_path, '{"id": "g30", "length": 30, "seed": 5, "vocab": 64}'))
    verdict = run_diff(config, tmp_path)
    assert verdict.status.value == "fail" and rule(verdict) == "position-onset"
    assert verdict.where == {"request": "g30", "position": 12, "shape": "30x8"}
    minimal = evidence(verdict)["minimal_reproducer"]
    assert minimal["length"] == 13
    (shortest,) = read_requests(minimal["file"])
    assert shortest.raw["length"] == 13 and "input_ids" not in shortest.raw and shortest.raw["seed"] == 5


def test_a_minimizer_that_cannot_run_leaves_the_failure_standing(tmp_path: Path) -> None:
    config = DiffConfig("table", f"{HERE}:position_table", f"{HERE}:position_table",
                        baseline_args={"shortest": 20}, candidate_args={"corrupt_from": 12, "shortest": 20},
                        requests=requests(tmp_path, '{"id": "g30", "length": 30, "seed": 5, "vocab": 64}'))
    verdict = run_diff(config, tmp_path)
    assert verdict.status.value == "fail" and rule(verdict) == "position-onset"
    note = evidence(verdict)["minimizer"]
    assert "raised on the request shortened to length 15" in note["note"] and "stands" in note["note"]
    assert "minimal_reproducer" not in evidence(verdict)


def test_named_tensors_are_shortened_only_along_a_declared_sequence_axis(tmp_path: Path) -> None:
    spec = '"x": {"shape": [1, 40, 4], "seed": 1}'
    undeclared = requests(tmp_path, f'{{"id": "t", "tensors": {{{spec}}}}}')
    verdict = run_diff(DiffConfig("decay", f"{HERE}:decay", f"{HERE}:decay", candidate_args={"rate": 0.02},
                                  requests=undeclared), tmp_path)
    assert verdict.status.value == "fail"
    assert "declare no sequence axis" in evidence(verdict)["minimizer"]["note"]
    declared = requests(tmp_path, f'{{"id": "t", "sequence_axis": 1, "tensors": {{{spec}}}}}')
    verdict = run_diff(DiffConfig("decay", f"{HERE}:decay", f"{HERE}:decay", candidate_args={"rate": 0.02},
                                  requests=declared), tmp_path)
    minimal = evidence(verdict)["minimal_reproducer"]
    assert minimal["length"] == 2  # position 0 is the same on both sides (the state starts at zero)
    (shortest,) = read_requests(minimal["file"])
    assert shortest.raw["tensors"]["x"] == {"shape": [1, 40, 4], "seed": 1, "narrow": {"axis": 1, "length": 2}}
    full = parse_request(json.loads(declared.read_text()), "t").named_tensors()["x"]
    assert torch.equal(shortest.named_tensors()["x"], full[:, :2])  # the same values, cut


def test_a_shortened_request_keeps_its_form() -> None:
    by_length = parse_request({"id": "a", "length": 10, "seed": 3, "vocab": 50}, "t")
    short = by_length.shrink(4)
    assert short.raw == {"id": "a[:4]", "length": 4, "seed": 3, "vocab": 50} and short.input_ids == draw_ids(10, 3, 50)[:4]
    given = parse_request({"id": "b", "input_ids": [5, 6, 7, 8], "note": "x"}, "t").shrink(2)
    assert given.raw == {"id": "b[:2]", "input_ids": [5, 6], "note": "x"}
    tensors = parse_request({"id": "c", "tensors": {"q": {"shape": [1, 8, 2]}, "w": {"shape": [2, 2]}},
                             "sequence_axis": {"q": 1}}, "t")
    assert tensors.length == 8
    cut = tensors.shrink(3)
    assert cut.tensors["q"].final_shape == (1, 3, 2) and cut.tensors["w"].final_shape == (2, 2)
    with pytest.raises(NotShrinkable, match="declare no sequence axis"):
        parse_request({"id": "d", "tensors": {"q": {"shape": [1, 8, 2]}}}, "t").shrink(3)
    assert parse_request({"id": "e", "tensors": {"q": {"shape": [1, 8, 2]}}}, "t").shrink(3, 1).length == 3


# ---- counterfactuals and captures ---------------------------------------------------------------------


def test_counterfactual_knobs_parse_from_toml_and_the_command_line() -> None:
    assert parse_counterfactuals({"merge_precision": ["ieee", "tf32x3"]}) == (("merge_precision", ("ieee", "tf32x3")),)
    assert parse_counterfactuals(["merge_precision=ieee,tf32x3", "torch.backends.cuda.matmul.allow_tf32=false"]) == (
        ("merge_precision", ("ieee", "tf32x3")), ("torch.backends.cuda.matmul.allow_tf32", (False,)))
    assert parse_counterfactuals((("chunk", (32, 64)),)) == (("chunk", (32, 64)),)
    with pytest.raises(OptionValueError, match="does not parse"):
        parse_counterfactuals(["merge_precision"])
    with pytest.raises(OptionValueError, match="not one of torch's precision switches"):
        parse_counterfactuals(["torch.tf32=true"])
    with pytest.raises(OptionValueError, match="is not one of highest, high, medium"):
        parse_counterfactuals({"torch.float32_matmul_precision": "lowest"})


def test_a_counterfactual_names_the_value_that_closes_the_gap(tmp_path: Path) -> None:
    config = DiffConfig("knob", f"{HERE}:net", f"{HERE}:net", candidate_args={"precision": "bf16"},
                        requests=requests(tmp_path, *TOKENS), minimize=False,
                        counterfactuals=(("precision", ("ieee",)),
                                         ("torch.backends.cuda.matmul.allow_tf32", (False,))))
    verdict = run_diff(config, tmp_path)
    assert verdict.status.value == "fail" and verdict.where["module"] == "head"
    knobs = [e for e in verdict.to_dict()["evidence"] if e["kind"] == "counterfactual"]
    assert [k["knob"] for k in knobs] == ["precision", "torch.backends.cuda.matmul.allow_tf32"]
    precision, switch = knobs
    assert precision["candidate_value"] == "bf16" and precision["closes"] == "ieee"
    assert precision["results"] == [{"value": "ieee", "rel_l2": 0.0, "failed": False, "lengths": [16, 32],
                                     "errors": [0.0, 0.0], "tried": True, "note": None}]
    assert "rerun with precision=ieee the diff passes" in verdict.why
    assert verdict.next[0] == Step("set precision=ieee in the candidate: the diff passes with it")
    if not torch.cuda.is_available():
        assert switch["results"][0]["tried"] is False and switch["closes"] is None
        assert "torch.backends.cuda.matmul.allow_tf32 was not tried (no CUDA device here" in verdict.why
    assert not (tmp_path / "knob" / "captures" / "counterfactual-0-ieee").exists()


@pytest.mark.slow
def test_a_live_diff_keeps_captures_of_failing_requests_only(tmp_path: Path) -> None:
    path = requests(tmp_path, '{"id": "short", "length": 6, "seed": 1, "vocab": 64}',
                    '{"id": "long", "length": 24, "seed": 2, "vocab": 64}')
    config = DiffConfig("kept", f"{HERE}:net", f"{HERE}:net", candidate_args={"window": 8}, requests=path,
                        minimize=False)
    verdict = run_diff(config, tmp_path / "a")
    assert [r["status"] for r in evidence(verdict)["requests"]["rows"]] == ["pass", "fail"]
    for side in ("baseline", "candidate"):
        folder = tmp_path / "a" / "kept" / "captures" / side
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["request_ids"] == ["long"] and not (folder / "r0000").exists() and (folder / "r0001").is_dir()
    kept = run_diff(DiffConfig("kept", f"{HERE}:net", f"{HERE}:net", candidate_args={"window": 8}, requests=path,
                               minimize=False, keep_captures=True), tmp_path / "b")
    assert kept.status.value == "fail"
    manifest = json.loads((tmp_path / "b" / "kept" / "captures" / "candidate" / "manifest.json").read_text())
    assert manifest["request_ids"] == ["short", "long"]
    passed = run_diff(DiffConfig("clean", f"{HERE}:net", f"{HERE}:net", requests=path), tmp_path / "c")
    assert passed.status.value == "pass" and not (tmp_path / "c" / "clean" / "captures" / "baseline").exists()
