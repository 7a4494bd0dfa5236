"""Captures recorded inside a running process (glmfb.capture.recording), compared by glmfb diff."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from glmfb.capture import recording
from glmfb.cli import app
from glmfb.diff.store import CaptureReader

runner = CliRunner()
PROMPTS = {"a": [1, 2, 3, 4], "b": [5, 6, 7], "c": [8, 9, 10, 11, 12]}
STEPS = 4  # decode steps after the prefill


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.proj(x))


class Decoder(nn.Module):
    """A tiny causal decoder: embedding, two blocks (each mixing a running mean of the
    positions before it), a head."""

    def __init__(self, vocab: int = 32, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList([Block(width), Block(width)])
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            counts = torch.arange(1, x.shape[1] + 1, dtype=x.dtype).view(1, -1, 1)
            x = block(x.cumsum(dim=1) / counts)
        return self.head(x)


def model(scale_block: int | None = None) -> Decoder:
    torch.manual_seed(0)
    decoder = Decoder().eval()
    if scale_block is not None:
        with torch.no_grad():
            decoder.blocks[scale_block].proj.weight.mul_(1.01)
    return decoder


def generate(decoder: Decoder, prompt: list[int], steps: int = STEPS) -> list[int]:
    """Greedy: the prefill, then each decode step reruns the growing sequence."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(steps + 1):
            logits = decoder(ids)
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    return ids[0].tolist()


def record(decoder: Decoder, out: Path, ids: tuple[str, ...] = ("a",), **options: Any) -> list[list[int]]:
    tokens = []
    with recording(decoder, out, **options) as rec:
        for request_id, prompt in PROMPTS.items():
            if request_id in ids:
                with rec.request(request_id):
                    tokens.append(generate(decoder, prompt))
            else:
                tokens.append(generate(decoder, prompt))
    return tokens


def diff(a: Path, b: Path, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["diff", str(a), str(b), "--json", "--out", str(tmp_path / "reports")])
    assert result.stdout.strip(), result.stderr
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.slow  # a diff through the CLI: over 2 s here (its report, the supervised child)
def test_identical_runs_pass(tmp_path: Path) -> None:
    record(model(), tmp_path / "a", ids=("a", "b"))
    record(model(), tmp_path / "b", ids=("a", "b"))
    code, verdict = diff(tmp_path / "a", tmp_path / "b", tmp_path)
    assert code == 0 and verdict["status"] == "pass", verdict["why"]
    sides = [e for e in verdict["evidence"] if e["kind"] == "side"]
    assert [s["live"]["pid"] for s in sides] == [os.getpid(), os.getpid()]
    manifest = CaptureReader(tmp_path / "a").manifest
    taps = {t.name: t for t in manifest.requests[0].taps}
    assert [taps[f"blocks.1#{k}"].step for k in range(STEPS + 1)] == list(range(STEPS + 1))
    assert taps["output#4"].shape == (1, len(PROMPTS["a"]) + 4, 32)


@pytest.mark.slow  # a diff through the CLI: over 2 s here (its report, the supervised child)
def test_scaled_block_fails_naming_it_and_the_step(tmp_path: Path) -> None:
    record(model(), tmp_path / "a")
    record(model(scale_block=1), tmp_path / "b")
    code, verdict = diff(tmp_path / "a", tmp_path / "b", tmp_path)
    assert code == 1 and verdict["status"] == "fail", verdict
    assert verdict["where"]["module"] == "blocks.1.proj#0", verdict["where"]  # the scaled weight's module
    assert "module blocks.1.proj#0 (the prefill, step 0)" in verdict["why"], verdict["why"]


class LateBlock(Block):
    """A block that parts from the baseline's once the sequence reaches 6 tokens."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out * 1.01 if x.shape[1] >= 6 else out


@pytest.mark.slow  # a diff through the CLI: over 2 s here
def test_a_divergence_at_a_decode_step_is_named_with_its_step(tmp_path: Path) -> None:
    record(model(), tmp_path / "a")
    late = model()
    replacement = LateBlock(16)
    replacement.load_state_dict(late.blocks[1].state_dict())
    late.blocks[1] = replacement
    record(late, tmp_path / "b")
    code, verdict = diff(tmp_path / "a", tmp_path / "b", tmp_path)
    assert code == 1 and verdict["where"]["module"] == "blocks.1#2", verdict["where"]  # prompt 'a' has 4 tokens
    assert "module blocks.1#2 (decode step 2)" in verdict["why"], verdict["why"]


def test_unmarked_requests_are_not_written(tmp_path: Path) -> None:
    tokens = record(model(), tmp_path / "a", ids=("b",))
    assert len(tokens) == 3
    manifest = CaptureReader(tmp_path / "a").manifest
    assert [r.id for r in manifest.requests] == ["b"]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["manifest.json", "r0000"]
    calls = {(t.module, t.call) for t in manifest.requests[0].taps}
    assert ("blocks.0", STEPS) in calls and ("blocks.0", STEPS + 1) not in calls


def test_a_token_pattern_marks_the_request(tmp_path: Path) -> None:
    decoder = model()
    with recording(decoder, tmp_path / "b", match=[6, 7], match_id="b") as rec:
        for prompt in PROMPTS.values():
            generate(decoder, prompt)
    assert rec.requests == ["b"]
    request = CaptureReader(tmp_path / "b").manifest.requests[0]
    assert max(t.step for t in request.taps if t.step is not None) == STEPS


def test_size_cap_stops_recording_and_generation_completes(tmp_path: Path) -> None:
    expected = [generate(model(), prompt) for prompt in PROMPTS.values()]
    decoder = model()
    with recording(decoder, tmp_path / "probe") as rec:
        with rec.request("a"):
            generate(decoder, PROMPTS["a"])
        one_request = rec.bytes
    tokens = record(model(), tmp_path / "a", ids=("a", "b", "c"), max_bytes=one_request + 100)
    assert tokens == expected
    manifest = CaptureReader(tmp_path / "a").manifest
    assert [r.id for r in manifest.requests] == ["a"]
    assert manifest.live is not None
    assert manifest.live["stopped"] == (f"stopped: size cap of {one_request + 100} bytes reached after request 'a' "
                                        "(request 'b' was not kept)")
    assert not (tmp_path / "a" / "r0001").exists()


def test_manifest_carries_the_process(tmp_path: Path) -> None:
    record(model(), tmp_path / "a")
    data = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert data["complete"] is True and data["live"]["pid"] == os.getpid()
    with open("/proc/self/cmdline", "rb") as handle:
        argv = [p.decode() for p in handle.read().split(b"\0") if p]
    assert data["live"]["cmdline"] == argv
    assert data["live"]["versions"]["torch"] == torch.__version__
    assert data["live"]["stopped"] is None


def test_an_error_while_recording_never_reaches_the_engine(tmp_path: Path) -> None:
    decoder = model()
    with recording(decoder, tmp_path / "a") as rec:
        with rec.request("a"):
            generate(decoder, PROMPTS["a"])
        rec._writer.write_call = None  # type: ignore[assignment,method-assign]  # every write now fails
        with rec.request("b"):
            tokens = generate(decoder, PROMPTS["b"])
    assert len(tokens) == len(PROMPTS["b"]) + STEPS + 1
    manifest = CaptureReader(tmp_path / "a").manifest
    assert [r.id for r in manifest.requests] == ["a"]
    assert manifest.live is not None and manifest.live["stopped"].startswith("stopped: error while recording (TypeError")
