"""Names a reader can tell apart (issue 37 item 6).

- Two sides that share an attribute name (``stack_v1/kernels.py:make_norm`` against
  ``stack_v2/kernels.py:make_norm``) read "make_norm is slower than make_norm": one function,
  :func:`glmfb.core.targets.side_labels`, names the two sides so that they differ, and every why that
  names sides goes through it.
- A refactor that fuses q/k/v in every layer listed "12 taps in the baseline only and 4 in the
  candidate only": the why now says it in one clause, the repeated per-layer names grouped
  (:func:`glmfb.diff.compare.group_names`); the full lists stay in the evidence.

Pure logic is tested directly; one ``glmfb bench`` and one ``glmfb diff`` run through the CLI
on third-party-style targets written here, each with a clean twin."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from glmfb.bench.rules import RULES as BENCH_RULES
from glmfb.bench.rules import BenchFindings, ShapeOutcome
from glmfb.cli import app
from glmfb.core.rules import diagnose
from glmfb.core.targets import side_labels
from glmfb.diff.compare import TreeDifferences, group_names, tap_module
from glmfb.diff.rules import RULES as DIFF_RULES
from glmfb.diff.rules import DiffFindings

runner = CliRunner()


# ---- side labels -----------------------------------------------------------------------------


@pytest.mark.parametrize(("baseline", "candidate", "args", "expected"), [
    ("k.py:gated_norm_fused", "k.py:gated_norm_tiled", ({}, {}), ("gated_norm_fused", "gated_norm_tiled")),
    ("stack_v1/kernels.py:make_norm", "stack_v2/kernels.py:make_norm", ({}, {}),
     ("stack_v1/kernels.py:make_norm", "stack_v2/kernels.py:make_norm")),
    ("/src/a/stack/kernels.py:f", "/src/b/stack/kernels.py:f", ({}, {}), ("a/stack/kernels.py:f", "b/stack/kernels.py:f")),
    ("kernels.py:f", "v2/kernels.py:f", ({}, {}), ("kernels.py:f", "v2/kernels.py:f")),
    ("pkg_v1.kernels:make", "pkg_v2.kernels:make", ({}, {}), ("pkg_v1.kernels:make", "pkg_v2.kernels:make")),
    ("k.py:make_norm", "k.py:make_norm", ({"block": 64}, {"block": 128}), ("make_norm(block=64)", "make_norm(block=128)")),
    ("k.py:make_norm", "./k.py:make_norm", ({"n": 1}, {"n": 1, "impl": "fast"}),
     ("make_norm(impl unset)", "make_norm(impl=fast)")),
    ("k.py:make_norm", "k.py:make_norm", ({"mode": "a b"}, {"mode": "c"}), ('make_norm(mode="a b")', "make_norm(mode=c)")),
    ("k.py:make_norm", "k.py:make_norm", ({"n": 1}, {"n": 1}), ("the baseline", "the candidate")),
    ("runs/v1/res.json#baseline", "runs/v2/res.json#baseline", ({}, {}), ("v1/res.json#baseline", "v2/res.json#baseline")),
    ("res.json#baseline", "res.json#candidate", ({}, {}), ("res.json#baseline", "res.json#candidate")),
], ids=["names differ", "same name, other folders", "the shortest suffix", "one path inside the other", "modules",
        "an argument differs", "an argument on one side", "a value with a space", "nothing differs",
        "saved files in other folders", "one saved file's two sides"])
def test_side_labels_tell_the_two_sides_apart(baseline: str, candidate: str, args: tuple[dict[str, Any], dict[str, Any]],
                                              expected: tuple[str, str]) -> None:
    labels = side_labels(baseline, candidate, *args)
    assert labels == expected
    assert labels[0] != labels[1]


def outcome(**changes: Any) -> BenchFindings:
    shape = ShapeOutcome(shape="64x512", decision="regression", change=3.0, low=2.9, high=3.1, blocks=40)
    values: dict[str, Any] = dict(baseline="make_norm", candidate="make_norm", threshold=0.05, budget_s=2.0,
                                  shapes=(shape,), geomean=3.0, geomean_low=2.9, geomean_high=3.1, focus="64x512")
    values.update(changes)
    return BenchFindings(**values)


def test_bench_whys_name_the_sides_by_their_labels() -> None:
    labelled = diagnose(BENCH_RULES, outcome(labels=side_labels("stack_v1/kernels.py:make_norm",
                                                                "stack_v2/kernels.py:make_norm")))
    assert labelled.diagnosis.why.startswith(
        "stack_v2/kernels.py:make_norm is slower than stack_v1/kernels.py:make_norm on 1 of 1 shape")
    # findings built without labels (a user's rules, older callers): never "make_norm ... make_norm"
    bare = diagnose(BENCH_RULES, outcome())
    assert bare.diagnosis.why.startswith("the candidate is slower than the baseline"), bare.diagnosis.why
    distinct = diagnose(BENCH_RULES, outcome(baseline="fused", candidate="tiled"))
    assert distinct.diagnosis.why.startswith("tiled is slower than fused")
    undecided = outcome(shapes=(ShapeOutcome(shape="64x512", decision="undecided", change=0.05, low=-0.01, high=0.11,
                                             blocks=40, needed_blocks=400.0, blocks_per_s=20.0),),
                        labels=side_labels("k.py:make_norm", "k.py:make_norm", {}, {"passes": 4}))
    text = diagnose(BENCH_RULES, undecided).diagnosis.why
    assert "make_norm(passes=4) vs make_norm(passes unset)" in text, text


# ---- module trees, summarized ----------------------------------------------------------------

QKV_B = tuple(f"layers.{i}.self_attn.{n}" for i in range(4) for n in ("q_proj", "k_proj", "v_proj"))
QKV_C = tuple(f"layers.{i}.self_attn.qkv_proj" for i in range(4))


@pytest.mark.parametrize(("names", "expected"), [
    (QKV_B, "q_proj, k_proj, v_proj in 4 layers"),
    (QKV_C, "qkv_proj in 4 layers"),
    (("up", "down"), "up, down"),
    (("body.attn[1]",), "body.attn[1]"),
    (("layers.2.mlp.up",), "layers.2.mlp.up"),
    (tuple(f"transformer.h.{i}.attn.c_attn" for i in range(3)), "c_attn in 3 of transformer.h"),
    (tuple(f"layers.{i}.{a}.q_proj" for i in range(2) for a in ("self_attn", "cross_attn")),
     "self_attn.q_proj, cross_attn.q_proj in 2 layers"),
    (tuple(f"layers.{i}.experts.{j}.w1" for i in range(2) for j in range(4)), "w1 in 8 places (layers.*.experts.*)"),
    (("a", "b", "c", "d", "e", "f"), "a, b, c, d and 2 more"),
    ((*QKV_B, "layers.0.self_attn.rotary"), "q_proj, k_proj, v_proj in 4 layers, layers.0.self_attn.rotary"),
])
def test_group_names_says_a_repeated_difference_once(names: tuple[str, ...], expected: str) -> None:
    assert group_names(names) == expected


def test_tap_module() -> None:
    assert tap_module("layers.0.attn#1[0][k]") == "layers.0.attn"
    assert tap_module("body.attn[1]") == "body.attn"


def tree_why(tree: TreeDifferences, **changes: Any) -> str:
    values: dict[str, Any] = dict(failed=False, requests=2, failing_requests=0, output_rel_l2=0.0, tree=tree)
    values.update(changes)
    return diagnose(DIFF_RULES, DiffFindings(**values)).diagnosis.why


def test_a_fused_qkv_is_one_clause_and_the_evidence_keeps_the_lists() -> None:
    tree = TreeDifferences(baseline_only=QKV_B, candidate_only=QKV_C, baseline_only_modules=QKV_B,
                           candidate_only_modules=QKV_C, shared=30, baseline_taps=54, candidate_taps=38)
    text = tree_why(tree)
    assert ("The two paths' module trees differ: glmfb compared the 30 taps both sides share; 12 modules are in the "
            "baseline only (q_proj, k_proj, v_proj in 4 layers) and 4 in the candidate only (qkv_proj in 4 layers), "
            "not compared (the full lists are in the evidence).") in text, text
    assert "layers.1" not in text and "layers.0.self_attn" not in text
    # a tap of a module both sides run (attention weights returned on one side only) stays a tap
    weights = TreeDifferences(baseline_only=("m.layers.0.self_attn[1]",), shared=177, baseline_taps=178,
                              candidate_taps=177)
    assert "1 tap is in the baseline only (m.layers.0.self_attn[1]) and none in the candidate only" in tree_why(weights)
    only_c = TreeDifferences(candidate_only=("m.extra", "m.extra[1]"), candidate_only_modules=("m.extra",), shared=9)
    assert "1 module is in the candidate only (m.extra) and none in the baseline only" in tree_why(only_c)
    mixed = TreeDifferences(baseline_only=QKV_B, candidate_only=("layers.0.self_attn[1]",), baseline_only_modules=QKV_B,
                            shared=30)
    assert "and 1 tap in the candidate only (layers.0.self_attn[1])" in tree_why(mixed)


def test_the_tree_rule_groups_the_submodules_it_names() -> None:
    tree = TreeDifferences(baseline_only=QKV_B, candidate_only=QKV_C, baseline_only_modules=QKV_B,
                           candidate_only_modules=QKV_C, shared=30)
    outcome = diagnose(DIFF_RULES, DiffFindings(failed=True, requests=1, failing_requests=1, request="r", module="layers",
                                                local=True, first_divergent="layers.0.self_attn", tree=tree))
    assert outcome.rule.name == "module-tree-differs"
    assert ("q_proj, k_proj, v_proj in 4 layers run as modules in the baseline only; qkv_proj in 4 layers in the "
            "candidate only") in outcome.diagnosis.why, outcome.diagnosis.why


# ---- end to end --------------------------------------------------------------------------------

KERNELS = '''
"""A third-party RMS norm kernel factory."""
import torch


def make_norm(shape, seed=0, passes={passes}):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    w = torch.randn(shape[-1], generator=g)

    def kernel():
        out = x
        for _ in range(passes):
            out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        return out
    return kernel


def make_rms(shape, seed=0):
    return make_norm(shape, seed)
'''


def bench(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, ["bench", *args, "--shape", "64x512", "--budget", "1", "--threshold", "20%",
                                 "--no-profile", "--json"])
    assert result.exit_code in (0, 1, 4), result.stdout[-2000:] + result.stderr
    verdict: dict[str, Any] = json.loads(result.stdout)
    return verdict


@pytest.mark.slow
def test_bench_of_two_versions_of_one_kernel_names_them_apart(tmp_path: Path) -> None:
    for version, passes in (("stack_v1", 1), ("stack_v2", 4)):
        (tmp_path / version).mkdir()
        (tmp_path / version / "kernels.py").write_text(KERNELS.replace("{passes}", str(passes)))
    out = ("--out", str(tmp_path / "reports"))
    v1, v2 = tmp_path / "stack_v1" / "kernels.py", tmp_path / "stack_v2" / "kernels.py"
    verdict = bench(f"{v1}:make_norm", f"{v2}:make_norm", *out)
    why = verdict["why"]
    assert "stack_v2/kernels.py:make_norm" in why and "stack_v1/kernels.py:make_norm" in why, why
    assert why.startswith("stack_v2/kernels.py:make_norm is slower than stack_v1/kernels.py:make_norm"), why
    assert verdict["where"]["kernel"] == "make_norm"  # where keeps the attribute (expectations and history match it)
    # one file, an argument that differs
    verdict = bench(f"{v1}:make_norm", f"{v1}:make_norm", "--candidate-arg", "passes=4", *out)
    assert verdict["why"].startswith("make_norm(passes=4) is slower than make_norm(passes unset)"), verdict["why"]
    # the clean twin: two attribute names, named as they are
    twin = bench(f"{v1}:make_rms", f"{v2}:make_norm", *out)
    assert twin["why"].startswith("make_norm is slower than make_rms"), twin["why"]
    assert "kernels.py" not in twin["why"] and "unset" not in twin["why"]


ATTENTION = textwrap.dedent('''
    """A third-party 4-layer attention stack; fused=True fuses q/k/v into one qkv_proj (the same weights)."""
    import torch
    from torch import nn


    class Attention(nn.Module):
        def __init__(self, width, fused):
            super().__init__()
            self.fused = fused
            q, k, v = (nn.Linear(width, width, bias=False) for _ in range(3))
            self.o_proj = nn.Linear(width, width, bias=False)
            if fused:
                self.qkv_proj = nn.Linear(width, 3 * width, bias=False)
                with torch.no_grad():
                    self.qkv_proj.weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
            else:
                self.q_proj, self.k_proj, self.v_proj = q, k, v

        def forward(self, x):
            if self.fused:
                q, k, v = self.qkv_proj(x).chunk(3, dim=-1)
            else:
                q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
            mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()
            return self.o_proj(torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v)


    class Layer(nn.Module):
        def __init__(self, width, fused, seed):
            super().__init__()
            torch.manual_seed(100 + seed)
            self.self_attn = Attention(width, fused)

        def forward(self, x):
            return x + self.self_attn(x)


    class Model(nn.Module):
        def __init__(self, fused):
            super().__init__()
            torch.manual_seed(0)
            self.embed = nn.Embedding(64, 16)
            self.head = nn.Linear(16, 64, bias=False)
            self.layers = nn.ModuleList([Layer(16, fused, i) for i in range(4)])

        def forward(self, input_ids):
            h = self.embed(input_ids)
            for layer in self.layers:
                h = layer(h)
            return self.head(h)


    def make(fused=False):
        return Model(fused)
''')


@pytest.mark.slow
def test_a_fused_qkv_refactor_reads_as_one_clause(tmp_path: Path) -> None:
    target = tmp_path / "attention_stack.py"
    target.write_text(ATTENTION)
    requests = tmp_path / "requests.jsonl"
    requests.write_text('{"id": "a12", "length": 12, "seed": 1, "vocab": 64}\n'
                        '{"id": "a24", "length": 24, "seed": 2, "vocab": 64}\n')

    def diff(*args: str) -> dict[str, Any]:
        result = runner.invoke(app, ["diff", f"{target}:make", f"{target}:make", "--requests", str(requests),
                                     "--out", str(tmp_path / "reports"), "--json", *args])
        assert result.exit_code in (0, 1), result.stdout[-2000:] + result.stderr
        verdict: dict[str, Any] = json.loads(result.stdout)
        return verdict

    fused = diff("--candidate-arg", "fused=true")
    assert fused["status"] == "pass", fused["why"]
    assert ("12 modules are in the baseline only (q_proj, k_proj, v_proj in 4 layers) and 4 in the candidate only "
            "(qkv_proj in 4 layers), not compared (the full lists are in the evidence)") in fused["why"], fused["why"]
    assert "layers.0" not in fused["why"]
    tree = {e["kind"]: e for e in fused["evidence"]}["tree_differences"]
    assert len(tree["baseline_only_modules"]) == 12 and len(tree["candidate_only_modules"]) == 4
    # the clean twin: the same tree on both sides
    clean = diff()
    assert clean["status"] == "pass" and "match exactly" in clean["why"], clean["why"]
    assert "module trees differ" not in clean["why"] and "in 4 layers" not in clean["why"]
