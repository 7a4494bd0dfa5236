"""Precision claims checked by rounding the baseline: the rounding and bias tests on real
modules, and live diffs of small models with a module really run in bfloat16 or float16, or a
changed norm epsilon (targets referenced as tests/test_diff_precision.py:NAME)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from glmfb.contract.verdict import Verdict
from glmfb.core.commandline import shell_line
from glmfb.diff.config import DiffConfig
from glmfb.diff.rounding import bias_test, round_to, rounding_mode, rounding_test

HERE = Path(__file__).resolve()


# ---- targets ------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Small(nn.Module):
    """embed -> norm -> proj -> act -> head; ``proj`` optionally run in a narrower dtype (its
    weights cast, its input cast on the way in, its output cast back)."""

    def __init__(self, dtype: str = "float32", eps: float = 1e-6, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(64, 32)
        self.norm = RMSNorm(32, eps)
        self.proj = nn.Linear(32, 48)
        self.act = nn.SiLU()
        self.head = nn.Linear(48, 64)
        self.proj_dtype = getattr(torch, dtype)
        if self.proj_dtype != torch.float32:
            self.proj.to(self.proj_dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.embed(input_ids))
        x = self.proj(x.to(self.proj_dtype)).to(torch.float32)
        return self.head(self.act(x))


def small(dtype: str = "float32", eps: float = 1e-6) -> nn.Module:
    return Small(dtype, eps)


# ---- helpers ------------------------------------------------------------------------------------


@pytest.fixture
def requests_file(tmp_path: Path) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(f'{{"id": "r{n}", "length": {n}, "seed": {n}, "vocab": 64}}\n' for n in (16, 32, 64)))
    return path


def run_diff(config: DiffConfig, folder: Path) -> Verdict:
    from helpers import run

    return run("diff", config, folder)


def evidence(verdict: Verdict) -> dict[str, dict[str, Any]]:
    return {e["kind"]: e for e in verdict.to_dict()["evidence"]}


def diagnosis(verdict: Verdict) -> str:
    return str(evidence(verdict)["diagnosis"]["rule"])


# ---- the tests on tensors and modules -----------------------------------------------------------


def test_rounding_to_each_format() -> None:
    x = torch.tensor([1.0 + 2**-9, 1.0 + 2**-12, 98304.0, 1e-6], dtype=torch.float32)
    assert round_to(x, "bf16")[0] == 1.0 and round_to(x, "fp16")[0] == 1.0 + 2**-9  # 7 vs 10 mantissa bits
    assert round_to(x, "tf32")[1] == 1.0 and round_to(x, "fp16")[1] == 1.0
    assert torch.isinf(round_to(x, "fp16")[2]) and round_to(x, "tf32")[2] == 98304.0  # fp16's range, TF32's
    assert round_to(x.to(torch.bfloat16), "fp16").dtype == torch.bfloat16  # a narrower tensor is left alone


def test_rounding_mode_rounds_only_the_operations_asked_for() -> None:
    lin = nn.Linear(8, 4)
    x = torch.randn(3, 8)
    with torch.no_grad():
        exact = lin(x)
        with rounding_mode("bf16", "matmul"):
            products = lin(x)
        expected = torch.addmm(round_to(lin.bias, "bf16"), round_to(x, "bf16"), round_to(lin.weight, "bf16").t())
        assert torch.equal(products, expected) and not torch.equal(products, exact)
        y = torch.ones(4)
        with rounding_mode("bf16", "all"):
            y.mul_(1.0 + 2**-10)  # in place: the tensor itself holds the rounded value
        assert y[0] == 1.0


def test_the_rounding_test_reproduces_a_real_cast_and_names_it() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(64, 96)
    x = torch.randn(1, 32, 64)

    def rerun(fmt: str, ops: str) -> torch.Tensor:
        with torch.no_grad(), rounding_mode(fmt, ops):
            return lin(x)

    with torch.no_grad():
        base = lin(x)
        for dtype, fmt, name in ((torch.bfloat16, "bf16", "bfloat16"), (torch.float16, "fp16", "float16")):
            narrow = nn.Linear(64, 96).to(dtype)
            narrow.load_state_dict({k: v.to(dtype) for k, v in lin.state_dict().items()})
            test = rounding_test(base, narrow(x.to(dtype)).float(), "own error", rerun, [str(dtype)[6:]])
            assert test is not None and test.format == fmt, test
            assert test.best is not None and 0.8 <= test.best.size_ratio <= 1.25 and test.best.correlation > 0.9
            assert name in test.describe()
            wrong = [t for t in test.trials if t.format == ("fp16" if fmt == "bf16" else "bf16")]
            assert wrong and not any(t.reproduces for t in wrong)  # 8x apart in size


def test_fp16_and_tf32_tie_on_a_float32_module_and_both_are_named() -> None:
    """A 10-bit mantissa whose values lie inside fp16's range: the trials cannot tell fp16 from
    TF32, so neither is named alone; the dtypes the module's operations take decide."""
    torch.manual_seed(1)
    lin = nn.Linear(32, 32)
    x = torch.randn(1, 16, 32)

    def rerun(fmt: str, ops: str) -> torch.Tensor:
        with torch.no_grad(), rounding_mode(fmt, ops):
            return lin(x)

    with torch.no_grad():
        base = lin(x)
        candidate = rerun("tf32", "matmul")  # what TF32 tensor cores compute
    test = rounding_test(base, candidate, "own error", rerun, ["float32"], candidate_ops=[("aten.addmm", "float32")])
    assert test is not None and test.ten_bit and {test.format, *test.equally} >= {"fp16", "tf32"}
    assert test.same_rounding and test.name == "a 10-bit-mantissa format (float16 or TF32)"
    described = test.describe()
    assert "float16 or TF32" in described and "round these values alike" in described
    assert "no float16 tensor in the candidate module's operations (float32 only)" in described
    # the same error from a module whose product takes float16 operands (a .half() inside it)
    half = rounding_test(base, candidate, "own error", rerun, ["float32"],
                         candidate_ops=[("aten._to_copy", "float32"), ("aten.mm", "float16")])
    assert half is not None and half.format == "fp16" and not half.ten_bit
    assert "computes with float16 operands (aten.mm)" in half.describe() and "TF32" not in half.describe()


def test_operand_dtypes_see_a_half_inside_a_float32_module() -> None:
    from glmfb.diff.localize import operand_dtypes

    class Halved(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return torch.matmul(q.half(), k.half().transpose(-1, -2)).float()

    seen = operand_dtypes(Halved(), (torch.randn(1, 4, 8), torch.randn(1, 4, 8)), {})
    assert any(dtype == "float16" and "mm" in op for op, dtype in seen), seen
    assert not any(op == "aten._to_copy" for op, _ in seen)  # a cast is not a computation


def test_the_rounding_test_runs_inside_a_submodule_the_candidate_does_not_run() -> None:
    """An MLP whose candidate calls F.linear on ``down``'s weight in float16: rounding the whole
    MLP's operands does not reproduce it (``up`` ran in float32 on both sides); rounding inside
    ``down`` only does."""
    from glmfb.diff.localize import LocalCall

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(3)
            self.up, self.down = nn.Linear(32, 128), nn.Linear(128, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(torch.relu(self.up(x)))

    mlp = MLP().eval()
    x = torch.randn(1, 16, 32)
    with torch.no_grad():
        base = mlp(x)
        hidden = torch.relu(mlp.up(x))
        cand = torch.nn.functional.linear(hidden.half(), mlp.down.weight.half(), mlp.down.bias.half()).float()
    call = LocalCall("mlp", 0, "mlp", "mlp", mlp, (x,), {}, base, cand, 1, ("float32",))
    test = rounding_test(base, cand, "own error of mlp", call.rerun, ["float32"], scopes=["down"],
                         candidate_ops=[("aten.addmm", "float16")])
    assert test is not None and test.format == "fp16" and test.best is not None and test.best.scope == "down"
    assert test.best.size_ratio == pytest.approx(1.0, abs=0.2) and test.best.correlation > 0.9
    assert "of its down (a submodule the candidate's forward does not run as a module)" in test.describe()
    assert not any(t.reproduces for t in test.trials if not t.scope and t.variant != "output" and t.format == "fp16")


def _block_cumsum(h: torch.Tensor, blocks: int, off_by_one: bool = False) -> torch.Tensor:
    parts = list(h.chunk(blocks, dim=1))
    carry, out = torch.zeros_like(h[:, :1]), []
    for part in parts:
        local = torch.cumsum(part, dim=1)
        out.append(local + carry)
        carry = carry + (local[:, -1:] - part[:, -1:] if off_by_one else local[:, -1:])
    return torch.cat(out, dim=1)


def test_a_reordered_float32_sum_is_rounding_size_and_an_off_by_one_is_not() -> None:
    from glmfb.diff.rounding import passing_atol, rounding_size

    h = 4.0 * torch.randn(1, 1024, 16, generator=torch.Generator().manual_seed(0))
    whole = torch.cumsum(h, dim=1)
    blocks = _block_cumsum(h, 4)
    size = rounding_size(whole, blocks, "float32", "error of scan", 1e-7, 1.3e-6, 1e-5)
    assert size is not None and size.applies and 0 < size.units < 8, size
    assert size.max_units < 16 and size.to_dict()["rounding_size"] is True
    atol = passing_atol([(whole, blocks, 1.3e-6)])
    assert bool(((blocks - whole).abs() <= atol + 1.3e-6 * whole.abs()).all()) and atol < 1e-3
    wrong = rounding_size(whole, _block_cumsum(h, 4, off_by_one=True), "float32", "error of scan", 1e-2, 1.3e-6, 1e-5)
    assert wrong is not None and not wrong.applies and wrong.units > 1e4
    assert rounding_size(whole.bfloat16(), blocks.bfloat16(), "bfloat16", "s", 1e-3, 1.6e-2, 1e-5) is None


class BlockScan(nn.Module):
    """proj -> a prefix sum in the forward (whole, or in 4 blocks) -> out."""

    def __init__(self, blocks: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj, self.out = nn.Linear(16, 16), nn.Linear(16, 16)
        with torch.no_grad():
            self.proj.weight.mul_(16.0)
        self.blocks = blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        return self.out(torch.cumsum(h, dim=1) if self.blocks == 1 else _block_cumsum(h, self.blocks))


def block_scan(blocks: int = 1) -> nn.Module:
    return BlockScan(blocks)


def test_a_block_scan_is_rounding_size_and_enters_between_modules(tmp_path: Path) -> None:
    requests = tmp_path / "scan.jsonl"
    requests.write_text("".join(f'{{"id": "x{n}", "tensors": {{"x": {{"shape": [1, {n}, 16], "seed": {n}}}}}, '
                                f'"sequence_axis": 1}}\n' for n in (256, 512)))
    config = DiffConfig("scan", f"{HERE}:block_scan", f"{HERE}:block_scan", candidate_args={"blocks": 4},
                        requests=requests, minimize=False)
    verdict = run_diff(config, tmp_path / "out")
    found = evidence(verdict)
    assert verdict.status.value == "fail" and diagnosis(verdict) == "rounding-size", verdict.why
    assert found["rounding_size"]["rounding_size"] and found["rounding_size"]["units"] < 8
    assert found["error_entry"]["module"] == "" and found["error_entry"]["steps"][0]["note"].startswith(
        "its inputs differ below tolerance")
    assert "enters between modules" in verdict.why and "out's own forward" not in verdict.why
    assert "tighter than float32 allows" in verdict.why
    atol = found["rounding_size"]["passing_atol"]
    passing = run_diff(DiffConfig("scan", f"{HERE}:block_scan", f"{HERE}:block_scan", candidate_args={"blocks": 4},
                                  requests=requests, minimize=False, atol=atol), tmp_path / "again")
    assert passing.status.value == "pass", passing.why  # the tolerance the why names does pass


def test_a_changed_scale_is_systematic_and_no_rounding_reproduces_it() -> None:
    torch.manual_seed(2)
    base = torch.randn(1, 64, 64)
    rows = 1.0 - 0.01 * torch.rand(1, 64, 1)  # every row scaled a little below 1, as a larger epsilon does
    candidate = base * rows
    test = rounding_test(base, candidate, "error", None)
    assert test is not None and test.format is None
    bias = bias_test(base, candidate, 1, "error")
    assert bias is not None and bias.systematic and bias.explained > 0.99 and bias.mean_scale < 1
    rounded = bias_test(base, round_to(base, "bf16"), 1, "error")
    assert rounded is not None and not rounded.systematic and rounded.explained < 0.2


# ---- live diffs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "phrase", "never"), [("bfloat16", "bfloat16", "float16"),
                                                         ("float16", "float16", "bfloat16")])
def test_a_module_really_run_narrower_is_named_by_the_rounding_test(tmp_path: Path, requests_file: Path, dtype: str,
                                                                    phrase: str, never: str) -> None:
    config = DiffConfig("narrow", f"{HERE}:small", f"{HERE}:small", candidate_args={"dtype": dtype},
                        requests=requests_file, atol=1e-8, minimize=False)
    verdict = run_diff(config, tmp_path)
    assert verdict.status.value == "fail" and verdict.where["module"] == "proj"
    assert diagnosis(verdict) == "precision-rounding"
    assert phrase in verdict.why and never not in verdict.why.replace(phrase, "")
    found = evidence(verdict)
    test = found["rounding_test"]
    assert test["reproduced_by"] == {"bfloat16": "bf16", "float16": "fp16"}[dtype]
    assert {t["format"] for t in test["trials"]} == {"bf16", "fp16", "tf32"} and test["live"]
    # proj's output is cast back after the call: its tap is narrower, compared in float32
    assert found["tree_differences"]["dtypes"] == [{"tap": "proj", "baseline": "float32", "candidate": dtype}]
    rows = {r["module"]: r for r in found["local_error"]["rows"]}
    # the parent casts proj's input before the call: measured as the error proj inherits, and
    # proj's own run on the baseline's input gets that input in the candidate's dtype
    assert rows["proj"]["local_exceeds_tolerance"] and 0 < rows["proj"]["inherited_rel_l2"] < 1e-2
    assert rows["head"]["local_rel_l2"] == 0.0 and rows["head"]["inherited_rel_l2"] > 0


def test_a_changed_epsilon_is_systematic_not_rounding(tmp_path: Path, requests_file: Path) -> None:
    config = DiffConfig("eps", f"{HERE}:small", f"{HERE}:small", candidate_args={"eps": 1e-2},
                        requests=requests_file, minimize=False)
    verdict = run_diff(config, tmp_path)
    assert verdict.status.value == "fail" and verdict.where["module"] == "norm"
    assert diagnosis(verdict) == "systematic-bias"
    assert "systematic, not rounding" in verdict.why
    for text in (verdict.why, *map(shell_line, verdict.next)):
        assert not any(word in text.lower() for word in ("bf16", "bfloat16", "fp16", "float16", "tf32"))
    found = evidence(verdict)
    assert found["bias"]["systematic"] and found["rounding_test"]["reproduced_by"] is None


# ---- in-place writes into a preallocated output, and trials that break ---------------------------


class SliceScan(nn.Module):
    """A recurrence whose state is kept in ``state`` and whose outputs are written into a
    preallocated buffer (``fill``: ``empty`` + slice assignment, ``index_put`` with a tensor
    index, ``out=``) or collected with ``torch.stack``."""

    def __init__(self, state: torch.dtype = torch.float32, fill: str = "slice") -> None:
        super().__init__()
        self.state, self.fill = state, fill

    def forward(self, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        batch, length, width = k.shape
        state = torch.zeros(batch, width, width, dtype=self.state)
        out = torch.empty(batch, length, width)
        rows = []
        for t in range(length):
            state = (0.99 * state + k[:, t, :, None] * v[:, t, None, :]).to(self.state)
            row = state.to(torch.float32).sum(1)
            if self.fill == "slice":
                out[:, t] = row
            elif self.fill == "index_put":
                out[:, torch.tensor([t])] = row[:, None]
            elif self.fill == "out":
                torch.add(row, 0.0, out=out[:, t])
            else:
                rows.append(row)
        return torch.stack(rows, 1) if self.fill == "stack" else out


@pytest.mark.parametrize("fill", ["slice", "index_put", "out"])
def test_a_rounding_trial_keeps_the_writes_into_a_preallocated_output(fill: str) -> None:
    """Rounding an operand makes a copy: a view of a rounded copy (``out[:, t]``) took the slice
    writes and left the output uninitialised (garbage of 7e31, or Inf in float16). Each way of
    imposing a format gives what the same code collecting its outputs with torch.stack gives."""
    torch.manual_seed(0)
    k, v = torch.randn(1, 48, 8), torch.randn(1, 48, 8)
    for fmt in ("bf16", "fp16", "tf32"):
        for ops in ("matmul", "products", "all"):
            with torch.no_grad(), rounding_mode(fmt, ops):
                filled = SliceScan(fill=fill)(k, v)
                stacked = SliceScan(fill="stack")(k, v)
            assert torch.equal(filled, stacked), (fmt, ops)


def test_the_every_operation_trial_names_a_bfloat16_state_written_by_slice() -> None:
    torch.manual_seed(0)
    k, v = torch.randn(1, 64, 8), torch.randn(1, 64, 8)
    for fill in ("slice", "stack"):
        base_module = SliceScan(torch.float32, fill)

        def rerun(fmt: str, ops: str, module: nn.Module = base_module) -> torch.Tensor:
            with torch.no_grad(), rounding_mode(fmt, ops):
                return module(k.clone(), v.clone())

        with torch.no_grad():
            base, cand = base_module(k, v), SliceScan(torch.bfloat16, fill)(k, v)
        test = rounding_test(base, cand, "own error of scan", rerun, ["float32"])
        assert test is not None and test.format == "bf16" and not test.left_out, (fill, test)
        assert test.best is not None and test.best.variant == "every operation" and test.best.correlation > 0.8


def test_a_trial_whose_own_result_broke_is_left_out_and_said_so() -> None:
    """A trial whose output is NaN or Inf where the baseline and the candidate are finite, or
    whose error is larger than the output itself, is no rounding: it is left out, never read for
    or against a format, and its reason is kept."""
    torch.manual_seed(2)
    lin = nn.Linear(32, 32)
    x = torch.randn(1, 16, 32)

    def rerun(fmt: str, ops: str) -> torch.Tensor:
        with torch.no_grad(), rounding_mode(fmt, ops):
            out = lin(x)
        if ops == "all":  # what an uninitialised buffer gave: garbage, and Inf in float16
            return torch.full_like(out, math.inf) if fmt == "fp16" else out * 0 + 7e31
        return out

    with torch.no_grad():
        base = lin(x)
        cand = rerun("bf16", "matmul")
    test = rounding_test(base, cand, "own error", rerun, ["float32"])
    assert test is not None and test.format == "bf16"
    left = {(t.format, t.variant): t.note for t in test.left_out}
    assert set(left) == {("bf16", "every operation"), ("fp16", "every operation"), ("tf32", "every operation")}
    assert "NaN or Inf at 512 of 512 elements" in left[("fp16", "every operation")]
    assert "larger than the output" in left[("bf16", "every operation")]
    assert not any(t.reproduces for t in test.left_out)
    assert test.left_out_text().startswith("3 of the 15 rounding trials were left out as invalid, not read as evidence")
