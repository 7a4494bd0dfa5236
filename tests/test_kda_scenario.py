"""The kda_cp scenario: TF32 rounding bit by bit, the chunked form against the recurrence in
float64, the affine chain, and the context-parallel path on real gloo ranks (slow) against one
device. The CUDA tests (hardware TF32 against the emulation, nccl ranks) need a GPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "scenarios") not in sys.path:  # the scenario package, imported as glmfb imports targets
    sys.path.insert(0, str(ROOT / "scenarios"))

from kda_cp import kda  # noqa: E402
from kda_cp import model as kda_model  # noqa: E402
from kda_cp.check import relative_error, token_ids  # noqa: E402
from kda_cp.precision import check_precision, matmul, round_tf32, split_tf32  # noqa: E402

CHECK = ROOT / "scenarios" / "kda_cp" / "check.py"


# ---- TF32 rounding, bit by bit ----------------------------------------------------------------


def bits_to_float(bits: int) -> torch.Tensor:
    return torch.tensor([bits & 0xFFFFFFFF], dtype=torch.int64).to(torch.int32).view(torch.float32)


def float_bits(x: torch.Tensor) -> int:
    return int(x.view(torch.int32).item()) & 0xFFFFFFFF


def rounded_bits(bits: int) -> int:
    return float_bits(round_tf32(bits_to_float(bits)))


def reference_tf32(value: float) -> float:
    """Round to 11 significant bits, ties to even, by exact arithmetic on a Python float (a
    double holds every float32 exactly); TF32's subnormals share float32's quantum times 2^13."""
    if math.isnan(value) or math.isinf(value) or value == 0.0:
        return value
    _, exponent = math.frexp(value)  # value = m * 2^exponent, 0.5 <= |m| < 1
    quantum = max(2.0 ** (exponent - 11), 2.0 ** -136)
    rounded = round(value / quantum) * quantum  # Python's round() is ties-to-even, exact here
    if abs(rounded) >= 2.0**128:
        return math.copysign(math.inf, value)
    return rounded


def test_tf32_keeps_ten_mantissa_bits_and_leaves_tf32_values_alone() -> None:
    x = torch.randn(10_000) * torch.exp(torch.randn(10_000) * 10)
    rounded = round_tf32(x)
    assert (rounded.view(torch.int32) & 0x1FFF).eq(0).all()  # the 13 dropped bits are zero
    assert torch.equal(round_tf32(rounded), rounded)  # idempotent
    assert ((rounded - x).abs() <= x.abs() * 2.0**-11).all()  # half a TF32 ulp at most


def test_tf32_rounds_to_nearest_with_ties_to_even() -> None:
    one = 0x3F800000  # 1.0: the kept mantissa's lowest bit is 0
    odd = one | 0x2000  # 1 + 2^-10: lowest kept bit 1
    assert rounded_bits(one | 0x1000) == one  # exactly half: down to the even neighbour
    assert rounded_bits(odd | 0x1000) == odd + 0x2000  # exactly half: up to the even neighbour
    assert rounded_bits(one | 0x0FFF) == one  # below half: down
    assert rounded_bits(one | 0x1001) == one + 0x2000  # above half: up
    assert rounded_bits(odd | 0x0FFF) == odd
    assert rounded_bits(0xBF800000 | 0x1001) == 0xBF800000 + 0x2000  # negatives round the magnitude


def test_tf32_carries_into_the_exponent_and_overflows_to_infinity() -> None:
    assert rounded_bits(0x3FFFFFFF) == 0x40000000  # 1.99999988 -> 2.0
    assert rounded_bits(0x7F7FFFFF) == 0x7F800000  # largest float32 -> inf (beyond TF32's largest + half)
    assert rounded_bits(0x7F7FEFFF) == 0x7F7FE000  # just below halfway stays TF32's largest
    assert rounded_bits(0xFF7FFFFF) == 0xFF800000  # and -inf on the other side


def test_tf32_specials() -> None:
    assert rounded_bits(0x7F800000) == 0x7F800000  # +inf
    assert rounded_bits(0xFF800000) == 0xFF800000  # -inf
    assert rounded_bits(0x80000000) == 0x80000000  # -0.0 keeps its sign
    assert rounded_bits(0x00000000) == 0x00000000
    for nan in (0x7FC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF, 0xFFC00001):
        result = round_tf32(bits_to_float(nan))
        assert torch.isnan(result).all()
        assert float_bits(result) == nan  # passed through, the payload cannot carry into the sign
    assert rounded_bits(0x00000FFF) == 0x00000000  # subnormals round on their bits too
    assert rounded_bits(0x00001000) == 0x00000000  # a tie, to even (zero)
    assert rounded_bits(0x00003000) == 0x00004000  # a tie, to even (up)
    assert rounded_bits(0x007FFFFF) == 0x00800000  # the largest subnormal rounds to the smallest normal
    with pytest.raises(TypeError):
        round_tf32(torch.ones(2, dtype=torch.float64))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 0xFFFFFFFF), min_size=1, max_size=64))
def test_tf32_matches_exact_rounding_on_any_bit_pattern(patterns: list[int]) -> None:
    values = torch.tensor(patterns, dtype=torch.int64).to(torch.int32).view(torch.float32)
    rounded = round_tf32(values)
    for original, result in zip(values.tolist(), rounded.tolist(), strict=True):
        expected = reference_tf32(original)
        if math.isnan(expected):
            assert math.isnan(result)
        else:
            assert result == expected, (original, result, expected)


def test_split_tf32_hi_lo_carry_float32() -> None:
    x = torch.randn(100_000)
    hi, lo = split_tf32(x)
    for part in (hi, lo):
        assert (part.view(torch.int32) & 0x1FFF).eq(0).all()
    error = ((hi.double() + lo.double()) - x.double()).abs() / x.double().abs()
    assert float(error.max()) <= 2.0**-21  # about 22 of float32's 24 significand bits survive


def test_matmul_precisions() -> None:
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(64, 128, generator=generator)
    b = torch.randn(128, 64, generator=generator)
    exact = a.double() @ b.double()

    def error(precision: str) -> float:
        return relative_error(matmul(a, b, precision), exact)

    assert error("tf32") > 1e-4  # TF32's 2^-11 per operand
    assert error("tf32x3") < 1e-6  # close to float32
    assert error("ieee") < 1e-6
    assert error("tf32") > 100 * error("tf32x3")
    assert torch.equal(matmul(a.double(), b.double(), "tf32"), a.double() @ b.double())  # float64: exact reference
    assert check_precision("tf32x3") == "tf32x3"
    with pytest.raises(ValueError, match="merge_precision"):
        check_precision("bf16")


# ---- the chunked form against the recurrence, float64 --------------------------------------


def kda_inputs(length: int, heads: int = 2, key_dim: int = 32, value_dim: int = 16, seed: int = 0,
               decay_scale: float = 1.0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    q = torch.nn.functional.normalize(normal(heads, length, key_dim), dim=-1)
    k = torch.nn.functional.normalize(normal(heads, length, key_dim), dim=-1)
    v = normal(heads, length, value_dim)
    rates = torch.exp(torch.empty(heads, 1, key_dim, dtype=torch.float64).uniform_(-12, 1, generator=generator))
    g = -rates * decay_scale * torch.exp(0.3 * normal(heads, length, key_dim))
    beta = torch.sigmoid(normal(heads, length))
    return q, k, v, g, beta


@pytest.mark.parametrize("length", [1, 17, 63, 64, 65, 128, 200, 257])
def test_chunked_matches_recurrent_in_float64(length: int) -> None:
    q, k, v, g, beta = kda_inputs(length, seed=length)
    initial = torch.randn(2, 32, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    o_reference, state_reference = kda.recurrent(q, k, v, g, beta, initial)
    o, state = kda.chunked(q, k, v, g, beta, initial)
    assert o.shape == o_reference.shape == (2, length, 16)
    torch.testing.assert_close(o, o_reference, rtol=1e-11, atol=1e-12)
    torch.testing.assert_close(state, state_reference, rtol=1e-11, atol=1e-12)


def test_chunked_survives_decays_that_would_overflow_a_factored_form() -> None:
    # per-token log-decays down to about -300 per chunk: exp(-G) alone would overflow float32
    q, k, v, g, beta = (x.float() for x in kda_inputs(130, decay_scale=40.0, seed=3))
    o, state = kda.chunked(q, k, v, g, beta)
    o_reference, state_reference = kda.recurrent(*(x.double() for x in (q, k, v, g, beta)))
    assert torch.isfinite(o).all() and torch.isfinite(state).all()
    assert relative_error(o, o_reference) < 1e-5
    assert relative_error(state, state_reference) < 1e-5


def test_chunk_summaries_form_the_affine_chain() -> None:
    length = 300
    q, k, v, g, beta = kda_inputs(length, seed=5)
    chunks = kda.prepare(q, k, v, g, beta)
    initial = torch.randn(2, 32, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    _, state, kept = kda.forward(chunks, initial, keep_states=True)
    assert kept is not None and kept.shape == (chunks.count + 1, 2, 32, 16)
    _, local = kda.forward(chunks)[:2]
    transition = kda.compose_transitions(chunks.transitions(), "ieee")
    torch.testing.assert_close(transition @ initial + local, state, rtol=1e-11, atol=1e-12)
    # S_in(j+1) = M_j S_in(j) + S_j over three segments reproduces the state at each boundary
    bounds = kda.segment_bounds(length, 3)
    pieces = [kda.prepare(q[..., s:e, :], k[..., s:e, :], v[..., s:e, :], g[..., s:e, :], beta[..., s:e]) for s, e in bounds]
    transitions = [kda.compose_transitions(p.transitions(), "ieee") for p in pieces]
    states = [kda.forward(p)[1] for p in pieces]
    for j, (start, _) in enumerate(bounds):
        _, expected = kda.recurrent(q[..., :start, :], k[..., :start, :], v[..., :start, :], g[..., :start, :], beta[..., :start])
        torch.testing.assert_close(kda.chain(transitions, states, j, "ieee"), expected, rtol=1e-10, atol=1e-12)


def test_empty_segments_leave_the_state_alone() -> None:
    q, k, v, g, beta = kda_inputs(0)
    chunks = kda.prepare(q, k, v, g, beta)
    assert chunks.count == 0
    o, state, _ = kda.forward(chunks)
    assert o.shape == (2, 0, 16) and not state.any()
    assert torch.equal(kda.compose_transitions(chunks.transitions(), "tf32"), torch.eye(32, dtype=torch.float64).expand(2, 32, 32))


def test_segment_bounds_split_like_tensor_split() -> None:
    for length in (0, 1, 7, 64, 100, 8192):
        for segments in (1, 2, 3, 4, 8):
            bounds = kda.segment_bounds(length, segments)
            sizes = [e - s for s, e in bounds]
            assert sizes == [len(piece) for piece in torch.arange(length).tensor_split(segments)]


# ---- the models -------------------------------------------------------------------------------


def test_single_device_float32_tracks_float64_and_reports_boundary_states() -> None:
    ids = token_ids(300, 0, 256)
    model32 = kda_model.single(world_size=2, layout="zigzag")
    model64 = kda_model.single(world_size=2, layout="zigzag", dtype="float64")
    caught: dict[str, torch.Tensor] = {}
    model64.attention.merge.register_forward_hook(lambda m, a, out: caught.__setitem__("states", out))
    with torch.no_grad():
        out32, out64 = model32(ids), model64(ids)
    assert relative_error(out32, out64) < 1e-5
    states = caught["states"]
    assert states.shape == (4, 1, 2, 128, 128)
    attn = model64.attention
    with torch.no_grad():
        q, k, v, g, beta = attn.project(model64.embed(ids))
    for j, (start, _) in enumerate(kda.segment_bounds(300, 4)):  # 75, 150, 225: inside chunks
        _, expected = kda.recurrent(q[..., :start, :], k[..., :start, :], v[..., :start, :], g[..., :start, :], beta[..., :start])
        torch.testing.assert_close(states[j], expected, rtol=1e-9, atol=1e-11)


@pytest.mark.slow
def test_emulated_cp_signature_small_on_short_inputs_growing_with_length() -> None:
    model = kda_model.single(world_size=2, layout="zigzag")
    errors: dict[str, list[float]] = {p: [] for p in ("ieee", "tf32", "tf32x3")}
    for length in (256, 1024):
        ids = token_ids(length, 0, 256)
        with torch.no_grad():
            reference = model(ids)
            for precision in errors:
                output, _ = kda_model.emulate_cp(model, ids, 4, precision)
                errors[precision].append(relative_error(output, reference))
    assert max(errors["ieee"] + errors["tf32x3"]) < 2e-6
    assert min(errors["tf32"]) > 2e-5
    assert errors["tf32"][1] > 1.3 * errors["tf32"][0]


def test_cp_target_declares_its_layouts() -> None:
    from glmfb.diff.distributed import Layout, declared_layouts, layout_for

    model = kda_model.ContextParallelKDA(kda_model.KDAConfig(), "tf32", "zigzag")
    layouts = declared_layouts(model, "cp")
    assert layout_for("layers.0.attn.merge", layouts) == Layout("shard", axis=0, order="zigzag")
    assert layout_for("output", layouts) == Layout("shard", axis=1, order="zigzag")
    with pytest.raises(ValueError, match="layout"):
        kda_model.ContextParallelKDA(kda_model.KDAConfig(), "tf32", "ring")


# ---- real ranks (torchrun, gloo) ---------------------------------------------------------------


def run_check(world_size: int, layout: str, lengths: str, tmp_path: Path, precisions: str = "ieee,tf32,tf32x3",
              timeout_s: float = 300) -> dict[str, Any]:
    out = tmp_path / f"check-{world_size}-{layout}.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world_size),
               "--log-dir", str(tmp_path / "torchelastic"),  # else torchrun leaves a folder in /tmp
               str(CHECK), "--lengths", lengths, "--precisions", precisions, "--layout", layout, "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                            env=os.environ.copy())
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return json.loads(out.read_text())


def by_precision(report: dict[str, Any], key: str) -> dict[str, list[float]]:
    rows: dict[str, list[float]] = {}
    for row in report["rows"]:
        rows.setdefault(row["precision"], []).append(row[key])
    return rows


@pytest.mark.slow
@pytest.mark.parametrize(("world_size", "layout"), [(2, "zigzag"), (4, "contiguous"), (4, "zigzag")])
def test_cp_on_gloo_ranks_matches_one_device(world_size: int, layout: str, tmp_path: Path) -> None:
    report = run_check(world_size, layout, "512,2048", tmp_path)
    assert report["backend"] == "gloo"
    outputs = by_precision(report, "output_vs_float32")
    states = by_precision(report, "state_vs_float64")
    assert max(outputs["ieee"] + outputs["tf32x3"]) < 2e-6  # float32 reorderings only
    assert max(states["ieee"] + states["tf32x3"]) < 2e-6
    assert min(outputs["tf32"]) > 2e-5 and min(states["tf32"]) > 5e-5  # TF32 in the merge
    assert outputs["tf32"][1] > 1.3 * outputs["tf32"][0]  # growing with length
    assert states["tf32"][1] > 1.3 * states["tf32"][0]
    # the ranks compute what the in-process emulation computes
    model = kda_model.single(world_size, layout)
    segments = world_size if layout == "contiguous" else 2 * world_size
    ids = token_ids(2048, 0, 256)
    with torch.no_grad():
        emulated, _ = kda_model.emulate_cp(model, ids, segments, "tf32")
        reference = model(ids)
    assert relative_error(emulated, reference) == pytest.approx(outputs["tf32"][1], rel=0.05)


@pytest.mark.slow
def test_contiguous_world_2_has_no_chain_to_round(tmp_path: Path) -> None:
    # rank 1's incoming state is rank 0's local state, never multiplied: TF32 cannot matter
    report = run_check(2, "contiguous", "512,1024", tmp_path, precisions="ieee,tf32")
    outputs = by_precision(report, "output_vs_float32")
    assert outputs["tf32"] == outputs["ieee"]
    assert max(outputs["ieee"]) < 1e-6


@pytest.mark.slow
def test_glmfb_finds_the_tf32_merge_on_ranks_and_passes_the_fixes(tmp_path: Path) -> None:
    from helpers import run

    from glmfb.diff.distributed import (
        DistributedCaptureConfig,
        run_distributed_capture,
        tap_rank_errors,
    )
    from glmfb.diff.engine import CaptureConfig, DiffConfig, run_capture
    from glmfb.diff.metrics import Tolerance
    from glmfb.diff.store import CaptureReader

    model = ROOT / "scenarios" / "kda_cp" / "model.py"
    requests = ROOT / "scenarios" / "kda_cp" / "requests.jsonl"
    taps = ("layers.*.attn.merge", "layers.*.attn.o_proj")
    args = {"layout": "zigzag"}
    run_capture(CaptureConfig(f"{model}:single", tmp_path / "single", args={**args, "world_size": 2}, taps=taps,
                              requests=requests))
    verdicts = {}
    for precision in ("tf32", "tf32x3"):
        run_distributed_capture(DistributedCaptureConfig(f"{model}:cp", requests, tmp_path / precision, 2,
                                                         args={**args, "merge_precision": precision}, taps=taps))
        verdicts[precision] = run("diff", DiffConfig(precision, str(tmp_path / "single"), str(tmp_path / precision),
                                                     rtol=0.0, atol=2e-3), tmp_path / f"report-{precision}")
    failing = verdicts["tf32"]
    assert failing.status.value == "fail" and failing.layer.value == "numerics"
    assert failing.where["module"] == "layers.0.attn.merge" and failing.where["request"] == "kda-8192"
    evidence = {e.kind: e.to_dict() for e in failing.evidence}
    assert evidence["error_shape"]["shape"] == "growing"
    assert evidence["precision_signature"]["nearest"].startswith("tf32")
    rows = {r["request"]: r for r in evidence["requests"]["rows"]}
    assert rows["kda-512"]["status"] == "pass" and rows["kda-8192"]["status"] == "fail"
    assert verdicts["tf32x3"].status.value == "pass"
    # the merge's error starts on rank 1: segment 2 of the zig-zag chain (segments 0 and 1 are exact)
    single, candidate = CaptureReader(tmp_path / "single"), CaptureReader(tmp_path / "tf32")
    tap_b, tap_c = (next(t for t in r.requests[-1].taps if t.module == "layers.0.attn.merge") for r in (single, candidate))
    slices = tap_rank_errors(single, candidate, tap_b, tap_c, Tolerance(0.0, 2e-3))
    assert [sl.max_abs for sl in slices[:2]] == [0.0, 0.0]
    assert next(sl for sl in slices if sl.failed).rank == 1


# ---- CUDA (skipped without a GPU) --------------------------------------------------------------


@pytest.mark.gpu
def test_emulated_tf32_matches_the_tensor_cores() -> None:
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(256, 256, device="cuda", generator=generator)
    b = torch.randn(256, 256, device="cuda", generator=generator)
    exact = a.double() @ b.double()
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        hardware = a @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    emulated = matmul(a, b, "tf32")
    ieee = a @ b
    # the hardware's error is of the emulation's size (a factor 2 would be truncation), not float32's
    ratio = relative_error(hardware, exact) / relative_error(emulated, exact)
    assert 1 / 3 < ratio < 3
    assert relative_error(hardware, exact) > 30 * relative_error(ieee, exact)


@pytest.mark.gpu
def test_cp_on_nccl_ranks(tmp_path: Path) -> None:
    world_size = min(2, torch.cuda.device_count())
    layout = "zigzag"
    report = run_check(world_size, layout, "512,2048", tmp_path)
    assert report["backend"] == "nccl"
    outputs = by_precision(report, "output_vs_float32")
    assert max(outputs["ieee"] + outputs["tf32x3"]) < 2e-6
    assert min(outputs["tf32"]) > 2e-5
