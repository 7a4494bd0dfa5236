"""The aten-level trace of a module's operations (glmfb/diff/optrace.py): the operations that
compute in a narrower format than the module's inputs, each with the line of the user's code
that ran it, set against the baseline's; the first operation that gives NaN or Inf on finite
operands; and what they make of a non-finite candidate (float16's range)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
from torch import nn

from glmfb.diff.optrace import float16_seen, new_narrowing, trace_module
from glmfb.diff.rounding import FLOAT16_MAX, float16_range


def _line_of(function: object, text: str) -> int:
    """The line number of the first source line of ``function`` that holds ``text``."""
    lines, start = inspect.getsourcelines(function)  # type: ignore[arg-type]
    return start + next(i for i, line in enumerate(lines) if text in line)


def online_sum(scores: torch.Tensor, bias: torch.Tensor, like_bias: bool) -> torch.Tensor:
    """A running softmax sum over two blocks; from the second on it takes the mask's dtype when
    ``like_bias`` (the planted cast)."""
    like = bias if like_bias else scores
    first, second = (scores + bias).chunk(2, dim=-1)
    total = torch.exp(first).sum(-1)
    total = (total + torch.exp(second).sum(-1)).type_as(like)
    return total.float()


class Summing(nn.Module):
    def __init__(self, like_bias: bool) -> None:
        super().__init__()
        self.like_bias = like_bias

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        bias = torch.zeros(scores.shape[-1], dtype=torch.bfloat16)  # a bfloat16 mask on both sides
        return online_sum(scores, bias, self.like_bias)


def test_a_cast_to_the_masks_dtype_is_named_with_its_line_and_the_shared_mask_is_not() -> None:
    scores = torch.randn(4, 16)
    candidate = trace_module(Summing(True), (scores,), {})
    baseline = trace_module(Summing(False), (scores,), {})
    assert candidate.reference == "float32"
    made = [op for op in baseline.narrowed if op.operation == "aten.zeros"]
    assert made and made[0].site is not None and made[0].site.function == "Summing.forward"  # on both sides
    named = new_narrowing(candidate, baseline)
    assert named is not None and named.operation == "aten._to_copy" and named.cast
    assert (named.inputs, named.output) == (("float32",), "bfloat16")
    assert named.site is not None and named.site.function == "online_sum"
    assert named.site.line == _line_of(online_sum, ".type_as(like)") and named.site.file == __file__
    described = named.describe("float32")
    assert described.startswith("a float32 value is cast to bfloat16 in online_sum, line ")
    assert new_narrowing(baseline, baseline) is None  # nothing new against itself


def test_a_module_run_in_float16_computes_narrower_than_its_inputs_in_torchs_own_code() -> None:
    linear = nn.Linear(8, 8).half()
    trace = trace_module(linear, (torch.randn(2, 8).half(),), {}, reference="float32")
    named = new_narrowing(trace, trace_module(nn.Linear(8, 8), (torch.randn(2, 8),), {}))
    assert named is not None and named.output == "float16" and not named.cast and named.site is None
    assert "computes in float16 on float16 operands in torch's own code" in named.describe("float32")
    assert float16_seen(trace, ["float16"]) == ("its parameters, inputs or outputs are float16",
                                                "aten.addmm takes float16 operands")


class ExpSiLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = torch.exp(x)
        return x * e / (1 + e)


def test_the_first_operation_to_give_nan_or_inf_on_finite_operands_is_named_with_its_line() -> None:
    trace = trace_module(ExpSiLU(), (torch.tensor([1.0, 100.0, -3.0]),), {})
    first = trace.first_nonfinite
    assert first is not None and first.operation == "aten.exp" and first.output == "float32"
    assert first.site is not None and first.site.line == _line_of(ExpSiLU.forward, "torch.exp(x)")
    assert float16_seen(trace, ["float32"]) == ()
    assert trace_module(ExpSiLU(), (torch.tensor([1.0, 2.0]),), {}).first_nonfinite is None


class FilledBySlice(nn.Module):
    """A preallocated output filled column by column (fla's recurrent kernels do this)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = torch.empty_like(x)
        for t in range(x.shape[1]):
            o[:, t] = x[:, t] * 2
        return o


def test_an_uninitialised_output_is_not_an_operation_that_gave_nan() -> None:
    """``empty_like``'s memory may hold NaN bit patterns: garbage that the slice writes
    overwrite, not an operation that overflowed. With deterministic algorithms on, torch fills
    that memory with NaN, so the trace sees it every time; an operation that really gives NaN
    after it is still named."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert torch.isnan(torch.empty_like(torch.ones(3))).all()  # the premise: the memory is NaN
        assert trace_module(FilledBySlice(), (torch.ones(2, 4),), {}).first_nonfinite is None
        overflowing = nn.Sequential(FilledBySlice(), ExpSiLU())
        first = trace_module(overflowing, (torch.full((2, 4), 60.0),), {}).first_nonfinite
        assert first is not None and first.operation == "aten.exp"
    finally:
        torch.use_deterministic_algorithms(deterministic)


def test_float16s_range_against_the_baselines_values() -> None:
    baseline = torch.tensor([1.0, -7.0e4, 2.0e5, 3.0])
    over = float16_range(baseline, "mlp.up", "mlp.up", ("aten.addmm takes float16 operands",), "its operations")
    assert over.beyond == 2 and over.baseline_max_abs == 2.0e5
    text = over.describe()
    assert "computes mlp.up in float16 (aten.addmm takes float16 operands)" in text
    assert f"reach 2e+05 in magnitude, past float16's largest finite value, {FLOAT16_MAX:.0f} (2 of 4" in text
    inside = float16_range(baseline / 100, "mlp.up", "mlp.up", ("its output is float16",), "its operations")
    assert "stay inside float16's range (at most 2e+03" in inside.describe()
    none = float16_range(baseline, "mlp.act", "mlp.act", (), "its parameters and operations", traced=True)
    assert none.describe().startswith("glmfb saw no float16 in mlp.act (its parameters and operations), so it is not")


# ---- issue 53: float16's range read at the operation that made the Inf -----------------------


class HalfScores(nn.Module):
    """q k^T in float16 (or float32), then a softmax: past 65504 the product is Inf, then NaN."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        ones = torch.matmul(q, k.transpose(-1, -2)) * 0.0  # an earlier product of the same operation
        scores = torch.matmul(q.to(self.dtype), k.to(self.dtype).transpose(-1, -2)) + ones.to(self.dtype)
        return torch.softmax(scores, dim=-1).float()


def test_the_baselines_same_run_of_the_operation_that_made_the_inf_is_watched() -> None:
    q = torch.full((1, 4, 8), 100.0)  # q.k = 8e4 everywhere: past float16's range
    half = trace_module(HalfScores(torch.float16), (q, q), {})
    first = half.first_nonfinite
    assert first is not None and first.output == "float16" and half.first_nonfinite_call == 2, half
    watched = trace_module(HalfScores(torch.float32), (q, q), {}, nonfinite=False,
                           watch=(first.operation, 2, FLOAT16_MAX)).watched
    assert watched is not None and watched.call == 2 and watched.output == "float32"
    assert watched.max_abs == 8e4 and watched.beyond == watched.elements == 16 and watched.nonfinite == 0


def test_a_float16_overflow_under_a_later_submodule_is_not_denied(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from helpers import run

    from glmfb.diff.config import DiffConfig

    requests = tmp_path / "r.jsonl"
    requests.write_text("".join(json.dumps({"id": f"h{n}", "tensors": {"x": {"shape": [1, n, 32], "seed": n}},
                                            "sequence_axis": 1}) + "\n" for n in (24, 48)))
    target = f"{Path(__file__).resolve().parent / 'acceptance' / 'half_attention.py'}:half_attention"
    verdict = run("diff", DiffConfig("h", target, target, requests=requests, candidate_args={"core_dtype": "float16"},
                                     minimize=False), tmp_path)
    assert verdict.where["module"] == "attn" and "first at attn.o_proj" in verdict.why
    assert "not float16's range" not in verdict.why and "saw no float16" not in verdict.why, verdict.why
    assert ("the candidate computes attn in float16 (aten.bmm, the first operation to give NaN or Inf, computes in "
            "float16") in verdict.why
    assert "at the baseline's 1st aten.bmm in attn" in verdict.why and "past float16's largest finite value" in verdict.why
    found = next(e for e in verdict.evidence if e.kind == "format_range")
    assert found.traced and found.beyond > 0 and found.first_nonfinite.startswith("aten.bmm in float16")  # type: ignore[attr-defined]
