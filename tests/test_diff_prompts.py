"""Requests as text (issue 50): a golden file of prompts is diffed without tokenizing it by
hand. The ids come from ``--tokenizer DIR`` (a Hugging Face folder, as a served model has) or
the target's own tokenizer (an attribute of what its factory returns, or ``tokenize`` in its
module); the evidence keeps the ids used, and the reproducer reads back without a tokenizer."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from glmfb.cli import app
from glmfb.diff.requests import read_requests

runner = CliRunner()

OWN = textwrap.dedent('''
    import torch

    WORDS = ["<s>"] + [f"w{i}" for i in range(63)]


    def tokenize(text):
        return [0] + [WORDS.index(word) for word in text.split()]


    class Tiny(torch.nn.Module):
        def __init__(self, scale):
            super().__init__()
            torch.manual_seed(0)
            self.embed = torch.nn.Embedding(64, 16)
            self.proj = torch.nn.Linear(16, 16)
            self.scale = scale

        def forward(self, input_ids):
            return self.proj(self.embed(input_ids)) * self.scale


    def make(scale=1.0):
        return Tiny(scale)


    class Words:  # a tokenizer object the factory hands out beside its model
        def encode(self, text):
            return [len(word) for word in text.split()]


    def with_attribute(scale=1.0):
        model = Tiny(scale)
        model.tokenizer = Words()
        return model
''')


def diff(tmp_path: Path, baseline: str, candidate: str, prompts: list[str], *args: str) -> tuple[int, dict[str, Any]]:
    (tmp_path / "own.py").write_text(OWN)
    requests = tmp_path / "golden.jsonl"
    requests.write_text("".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n" for i, text in enumerate(prompts)))
    result = runner.invoke(app, ["diff", baseline, candidate, "--requests", str(requests), "--no-minimize", "--json",
                                 "--out", str(tmp_path / "reports"), *args])
    assert result.exit_code in (0, 1), result.output[-1500:]
    return result.exit_code, json.loads(result.stdout)


def prompts_of(verdict: dict[str, Any]) -> dict[str, Any]:
    return next(e for e in verdict["evidence"] if e["kind"] == "prompts")


def test_prompts_tokenized_by_the_targets_own_tokenize(tmp_path: Path) -> None:
    own = f"{tmp_path / 'own.py'}"
    code, verdict = diff(tmp_path, f"{own}:make", f"{own}:make", ["w3 w1 w4", "w1 w5 w9 w2 w6"],
                         "--candidate-arg", "scale=1.5")
    assert code == 1 and verdict["status"] == "fail"
    evidence = prompts_of(verdict)
    assert evidence["tokenizer"].startswith("tokenize() in ") and evidence["requests"] == 2
    assert [(r["request"], r["input_ids"]) for r in evidence["rows"]] == [("p0", [0, 4, 2, 5]), ("p1", [0, 2, 6, 10, 3, 7])]
    tokenized = read_requests(verdict["artifacts"]["requests_tokenized"])  # reads back without a tokenizer
    assert [r.input_ids for r in tokenized] == [(0, 4, 2, 5), (0, 2, 6, 10, 3, 7)]
    assert tokenized[0].raw["prompt"] == "w3 w1 w4"


def test_prompts_tokenized_by_a_tokenizer_attribute_and_the_same_model_passes(tmp_path: Path) -> None:
    own = f"{tmp_path / 'own.py'}"
    code, verdict = diff(tmp_path, f"{own}:with_attribute", f"{own}:with_attribute", ["a bb ccc", "dddd"])
    assert code == 0 and verdict["status"] == "pass", verdict["why"]
    evidence = prompts_of(verdict)
    assert "tokenizer attribute" in evidence["tokenizer"]
    assert [r["input_ids"] for r in evidence["rows"]] == [[1, 2, 3], [4]]


@pytest.mark.slow
def test_prompts_tokenized_by_a_hugging_face_folder(tmp_path: Path) -> None:
    """The served scenario's folders: the tokenizer saved beside the weights, the candidate a
    folder with one layer's down projection scaled: named at that module."""
    pytest.importorskip("transformers")
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scenarios" / "serving"))
    try:
        from make_hf_models import SCALED_LAYER, make_models
    finally:
        sys.path.pop(0)
    from transformers import AutoTokenizer

    folders = make_models(tmp_path / "models")
    (tmp_path / "load.py").write_text("from transformers import LlamaForCausalLM\n\n"
                                      "def make(folder):\n    return LlamaForCausalLM.from_pretrained(folder)\n")
    load = f"{tmp_path / 'load.py'}:make"
    prompts = ["w12 w7 w200 w3", "w1 w2 w3 w4 w5 w6"]
    code, verdict = diff(tmp_path, load, load, prompts, "--baseline-arg", f"folder={folders['llama']}",
                         "--candidate-arg", f"folder={folders['llama-scaled']}", "--tokenizer", str(folders["llama"]))
    assert code == 1 and verdict["where"]["module"] == f"model.layers.{SCALED_LAYER}.mlp.down_proj", verdict["where"]
    expected = AutoTokenizer.from_pretrained(str(folders["llama"])).encode(prompts[0])
    evidence = prompts_of(verdict)
    assert evidence["rows"][0]["input_ids"] == expected and evidence["tokenizer"] == f"the tokenizer in {folders['llama']}"


def test_prompts_without_any_tokenizer_are_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "plain.py").write_text("import torch\n\ndef make():\n    return torch.nn.Embedding(8, 4)\n")
    (tmp_path / "golden.jsonl").write_text('{"id": "p0", "prompt": "hello there"}\n')
    result = runner.invoke(app, ["diff", f"{tmp_path / 'plain.py'}:make", f"{tmp_path / 'plain.py'}:make", "--requests",
                                 str(tmp_path / "golden.jsonl"), "--out", str(tmp_path / "reports")])
    assert result.exit_code == 2, result.output
    assert "give text (prompt) and no tokenizer was found" in result.output and "--tokenizer DIR" in result.output
