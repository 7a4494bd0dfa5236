"""The diff rules as a table: findings in, the rule that fires, its status and the phrases its
why must (and must not) hold. No model runs here: the findings are built from the same
dataclasses the engine fills."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

import pytest

from glmfb.contract.step import Step
from glmfb.contract.verdict import Status
from glmfb.core.commandline import shell_line
from glmfb.core.rules import diagnose
from glmfb.diff.compare import TreeDifferences
from glmfb.diff.counterfactual import KnobResult, KnobRun
from glmfb.diff.localize import EntryStep, ErrorEntry, InputDifference
from glmfb.diff.rounding import BiasTest, RoundingSize, RoundingTest, Trial
from glmfb.diff.rules import RULES, DiffFindings
from glmfb.diff.shape import (
    ErrorShape,
    ZeroRegion,
    growth_fit,
    position_profile,
    precision_signature,
)

FORMATS = r"bf16|bfloat16|fp16|(?<!b)float16|tf32"


def trial(fmt: str, variant: str = "matmul operands and output", size: float = 1.0, corr: float = 0.99) -> Trial:
    reproduces = 0.5 <= size <= 2.0 and corr >= 0.5
    return Trial(fmt, variant, 1e-3 * size, size, corr, 0.9 if reproduces else 0.5, reproduces)


def rounding(fmt: str | None, *, equally: tuple[str, ...] = (), dtype_evidence: str | None = None,
             best: Trial | None = None) -> RoundingTest:
    trials = tuple(trial(f, size=1.0 if f == fmt else 8.0, corr=0.99 if f == fmt else 0.02) for f in ("bf16", "fp16", "tf32"))
    chosen = best or (next(t for t in trials if t.format == fmt) if fmt else trial("bf16", size=0.26, corr=0.38))
    return RoundingTest("own error of m", 1e-3, 4096, trials, fmt, chosen, equally, dtype_evidence)


SYSTEMATIC = BiasTest("own error of m", explained=0.999, mean_scale=0.988, mean_shift=0.0, rows=64, row_width=64)
RANDOM = BiasTest("own error of m", explained=0.03, mean_scale=1.0, mean_shift=0.0, rows=64, row_width=64)
FLAT = position_profile([1e-3] * 64, [64] * 64)
WINDOW = position_profile([0.0] * 16 + [0.05 * (1 + i) for i in range(48)], [0] * 16 + [64] * 48)
ROTARY = position_profile([0.0] + [1e-3 * i for i in range(1, 64)], [0] + [64] * 63)
TABLE = position_profile([0.0] * 24 + [0.9] * 16, [0] * 24 + [64] * 16)
GROWING = growth_fit([32, 64, 128, 256, 512], [1e-4, 1.6e-4, 2.6e-4, 4.2e-4, 6.8e-4], "requests")
CONSTANT = growth_fit([16, 32, 64], [1e-3, 1.1e-3, 1.05e-3], "requests")
TREE_MLP = TreeDifferences(
    baseline_only=("m.mlp.gate_proj", "m.mlp.up_proj", "m.mlp.down_proj"),
    baseline_only_modules=("m.mlp.gate_proj", "m.mlp.up_proj", "m.mlp.down_proj"), shared=165,
    baseline_taps=168, candidate_taps=165)
TREE_ATTN = TreeDifferences(baseline_only=("m.layers.0.self_attn[1]",), shared=177, baseline_taps=178,
                            candidate_taps=177)
ENTRY = ErrorEntry("model", (
    EntryStep("model.layers.0.self_attn.o_proj", (InputDifference("input", "relative L2 error 0.65"),), 1),
    EntryStep("model.layers.0.self_attn", (InputDifference("attention_mask", "None in the baseline, a bool tensor"),), 4),
    EntryStep("model.layers.0", (InputDifference("attention_mask", "None in the baseline, a bool tensor"),), 4),
    EntryStep("model", (), 2),
))


# a reordered float32 sum: 1.4 units of roundoff where it is first seen and at the outputs
REORDERED = RoundingSize("error of tap out", "float32", 2.0 ** -24, 8.4e-8, 8.4e-8, 5.0e-5, 287.0, 20, 8192, 12.6,
                         1.3e-6, 1e-5, passing_atol=3.5e-5)
OFF_BY_ONE = replace(REORDERED, rel_l2=0.08, output_rel_l2=0.08, max_abs=9.0)
SCAN_ENTRY = ErrorEntry("", (EntryStep("out", (), 1, "its inputs differ below tolerance (relative L2 7e-08)"),
                             EntryStep("", (), 1)), "CPScan")
SCAN_STEP = position_profile([0.0] * 128 + [8e-8] * 384, [0] * 128 + [0, 1, 0, 0] * 96)
assert SCAN_STEP is not None and SCAN_STEP.zeros is not None
SCAN_ZEROS = ZeroRegion(SCAN_STEP.zeros)
SCOPED = Trial("fp16", "matmul operands and output", 3.4e-4, 1.0, 1.0, 1.0, True, scope="down_proj")


def failing(**changes: Any) -> DiffFindings:
    # a profile along positions is read along a token axis: axis 1, as of [1, L, hidden]
    base = DiffFindings(failed=True, requests=3, failing_requests=3, request="r64", module="m", local=True,
                        first_divergent="m", tap="m", position=0, shape=ErrorShape.CONSTANT, fit=CONSTANT,
                        dtype="float32", profile=FLAT, bias=RANDOM, token_axis=1, token_axis_basis="follows the length")
    return replace(base, **changes)


CASES: list[tuple[str, DiffFindings, str, Status, list[str], str | None]] = [
    # (label, findings, rule, status, phrases the why has, a pattern neither why nor next may match)
    ("exact pass", DiffFindings(failed=False, requests=3, failing_requests=0), "pass", Status.PASS,
     ["match exactly"], None),
    ("pass with trees that differ", DiffFindings(failed=False, requests=3, failing_requests=0, output_rel_l2=2.7e-7,
                                                 tree=TREE_ATTN),
     "pass", Status.PASS, ["every tap both sides share", "module trees differ", "1 tap is in the baseline only"], None),
    ("non-finite", failing(shape=ErrorShape.NON_FINITE, nonfinite_tap="m.down_proj"), "non-finite", Status.FAIL,
     ["NaN or Inf", "m.down_proj"], None),
    ("a mask built in the parent's forward", failing(module="model", local=False, entry=ENTRY, profile=WINDOW,
                                                     position=16, bias=None),
     "position-onset", Status.FAIL, ["up to position 15", "from position 16", "model's own forward", "attention_mask"],
     FORMATS + "|precision"),
    ("a window at the same position in every request", failing(module="model", local=False, entry=ENTRY, profile=WINDOW,
                                                               onsets=((32, 16), (64, 16)), bias=None),
     "position-onset", Status.FAIL, ["same position in every failing request (16 of 32, 16 of 64"], FORMATS),
    ("a boundary that moves with the length", failing(module=None, local=None, tap="output", profile=WINDOW,
                                                      onsets=((256, 128), (512, 256), (1024, 512)), bias=None),
     "position-onset", Status.FAIL, ["same fraction of every failing request", "0.5 of the length",
                                     "the final outputs (output;"], None),
    ("a table re-drawn from row 24", failing(module=None, local=None, tap="output", profile=TABLE, bias=None),
     "position-onset", Status.FAIL, ["position 24"], FORMATS),
    ("growth with length, TF32 reproduced", failing(module="layers.0.scan", fit=GROWING, length_fit=GROWING,
                                                    shape=ErrorShape.GROWING, rounding=rounding("tf32", equally=("fp16",)),
                                                    profile=ROTARY),
     "growing-with-length", Status.FAIL, ["context length", "TF32", "layers.0.scan", "correlation 0.99"], None),
    ("growth with length, no rounding reproduces it", failing(module="model.rotary_emb", fit=GROWING, length_fit=GROWING,
                                                               shape=ErrorShape.GROWING, rounding=rounding(None),
                                                               profile=ROTARY),
     "growing-with-length", Status.FAIL, ["context length", "model.rotary_emb"], r"tf32|fp16|(?<!b)float16"),
    ("growth along the sequence", failing(module="model.rotary_emb", profile=ROTARY, position=1, request="s64",
                                          rounding=rounding(None)),
     "growing-along-sequence", Status.FAIL, ["along the sequence", "position 1", "model.rotary_emb"], FORMATS),
    ("growth along one request, TF32 reproduced", failing(module="layers.0.scan", profile=ROTARY, request="s256",
                                                          rounding=rounding("tf32", equally=("fp16",))),
     "growing-along-sequence", Status.FAIL, ["along the sequence", "(float16 or TF32) operands", "accumulates"],
     r"take TF32|take float16"),
    ("bf16 reproduced", failing(module="m.o_proj", rounding=rounding("bf16")), "precision-rounding", Status.FAIL,
     ["bfloat16", "reproduces", "m.o_proj"], r"fp16|(?<!b)float16|tf32"),
    ("fp16 and TF32 tie, the module holds float16", failing(
        module="m.down_proj", rounding=rounding("fp16", equally=("tf32",),
                                                dtype_evidence="the candidate's module holds or sees float16 tensors")),
     "precision-rounding", Status.FAIL, ["float16", "m.down_proj"], r"bf16|bfloat16"),
    ("a forward that no longer runs its submodules", failing(module="m.mlp", tree=TREE_MLP), "module-tree-differs",
     Status.FAIL, ["m.mlp", "gate_proj", "up_proj", "down_proj", "baseline only"], None),
    ("a reordered float32 sum entering between modules", failing(
        module="out", local=False, entry=SCAN_ENTRY, first_divergent="out", size=REORDERED, profile=SCAN_STEP,
        zeros=SCAN_ZEROS, rounding=rounding(None, best=trial("fp16", "output", size=2510.0, corr=0.02)), fit=CONSTANT),
     "rounding-size", Status.FAIL,
     ["size of float32's own rounding", "1.4 units of float32 roundoff", "exactly zero before position 128",
      "enters between modules, in the top-level module (CPScan)'s own forward", "out is only the first module",
      "tighter than float32 allows", "20 of 8192 elements", "atol of 3.5e-05", "2510x"],
     FORMATS + "|out's own forward"),
    ("a reordered sum between captures", failing(module="out", local=None, first_divergent="out", size=REORDERED,
                                                 rounding=rounding(None)),
     "rounding-size", Status.FAIL, ["first seen at out", "is not tested"], FORMATS),
    ("an off-by-one at the block boundary is no rounding", failing(
        module="out", local=False, entry=SCAN_ENTRY, size=OFF_BY_ONE, profile=WINDOW, rounding=rounding(None)),
     "position-onset", Status.FAIL, ["a step at position 16"], r"roundoff|own rounding"),
    ("rounding-size but a scale explains it", failing(module="m.norm", size=REORDERED, bias=SYSTEMATIC,
                                                      rounding=rounding(None)),
     "systematic-bias", Status.FAIL, ["systematic"], r"roundoff"),
    ("fp16 and TF32 tie with nothing to tell them apart", failing(
        module="attn.scores", rounding=rounding("tf32", equally=("fp16",))),
     "precision-rounding", Status.FAIL, ["a 10-bit-mantissa format (float16 or TF32)", "float16 or TF32"],
     r"take TF32|TF32 operands|take float16|float16 operands|bf16|bfloat16"),
    ("float16 inside the shared module, in place of a submodule", failing(
        module="m.mlp", tree=TREE_MLP, rounding=rounding("fp16", equally=("tf32",), best=SCOPED,
                                                         dtype_evidence="the candidate's module computes with float16 "
                                                                        "operands (aten.mm)")),
     "precision-rounding", Status.FAIL, ["matmul operands and output of its down_proj", "in place of its down_proj",
                                         "float16 operands (aten.mm)"], r"tf32|bf16|bfloat16|cannot look inside"),
    ("a changed epsilon", failing(module="m.input_layernorm", bias=SYSTEMATIC, rounding=rounding(None)),
     "systematic-bias", Status.FAIL, ["systematic, not rounding", "99.9%", "0.988"], FORMATS),
    ("an error at a bf16-like size that no rounding reproduces", failing(
        signature=precision_signature(1.5e-3, "test"), rounding=rounding(None)), "generic", Status.FAIL,
     ["No rounding of the baseline"], FORMATS),
    ("a difference below tolerance upstream", failing(
        module="m.layers.2.norm", local=False, first_divergent="m.layers.2.norm",
        entry=ErrorEntry(None, (EntryStep("m.layers.2.norm", (), 1, "its inputs differ below tolerance"),),
                         upstream=("m.layers.1.mlp", 4e-5))),
     "parent-forward", Status.FAIL, ["already there at m.layers.1.mlp", "below tolerance"], r"own forward"),
    ("no module adds it", failing(module="model.layers.0", local=False, entry=replace(ENTRY, module="model.layers.0",
                                                                                      steps=ENTRY.steps[:3])),
     "parent-forward", Status.FAIL, ["model.layers.0's own forward"], None),
    ("a spike", failing(shape=ErrorShape.SPIKE, position=117, bias=None, profile=None), "spike", Status.FAIL,
     ["position 117"], None),
]


@pytest.mark.parametrize(("label", "findings", "rule", "status", "phrases", "never"), CASES,
                         ids=[case[0] for case in CASES])
def test_rule_table(label: str, findings: DiffFindings, rule: str, status: Status, phrases: list[str],
                    never: str | None) -> None:
    outcome = diagnose(RULES, findings)
    assert outcome.rule.name == rule, outcome.diagnosis.why
    assert outcome.diagnosis.status is status
    for phrase in phrases:
        assert phrase in outcome.diagnosis.why, (phrase, outcome.diagnosis.why)
    if never is not None:
        for text in (outcome.diagnosis.why, *map(shell_line, outcome.diagnosis.next)):
            assert not re.search(never, text, re.IGNORECASE), text
    assert outcome.record.rule == rule
    assert outcome.record.checked == tuple(r.name for r in RULES[: [r.name for r in RULES].index(rule)])


def test_a_tf32_growth_points_at_tf32x3() -> None:
    outcome = diagnose(RULES, failing(module="layers.0.scan", profile=ROTARY, rounding=rounding("tf32")))
    assert any("tf32x3" in step.why for step in outcome.diagnosis.next)
    plain = diagnose(RULES, failing(module="model.rotary_emb", profile=ROTARY, rounding=rounding(None)))
    assert not any("tf32" in shell_line(step).lower() for step in plain.diagnosis.next)


def test_torchs_cuda_switch_is_advised_only_where_the_candidate_ran_on_cuda() -> None:
    """torch.backends.cuda.matmul.allow_tf32 changes nothing on a CPU: a verdict of a CPU run
    never sends the user to it."""
    for on_cuda in (False, True):
        outcome = diagnose(RULES, replace(failing(module="layers.0.scan", profile=ROTARY, rounding=rounding("tf32")),
                                          on_cuda=on_cuda))
        advised = " ".join(step.why for step in outcome.diagnosis.next)
        assert ("torch.backends.cuda" in advised) is on_cuda, advised
        assert "tf32x3" in advised


def test_a_precision_claim_needs_the_rounding_test_not_one_ratio() -> None:
    # the old signature alone (a relative error at the bf16 unit) no longer names bf16
    findings = failing(signature=precision_signature(1.5e-3, "test"))
    assert findings.signature is not None and findings.signature.consistent and findings.signature.nearest == "bf16"
    outcome = diagnose(RULES, findings)
    assert outcome.rule.name == "generic" and "bf16" not in outcome.diagnosis.why.lower()


def test_onset_before_growth_and_growth_before_precision() -> None:
    # a window whose error also grows along the sequence, with lengths: the step wins
    assert diagnose(RULES, failing(profile=WINDOW, length_fit=GROWING)).rule.name == "position-onset"
    # a bf16-rounded table that grows with length: the growth is what the user sees
    assert diagnose(RULES, failing(length_fit=GROWING, rounding=rounding("bf16"))).rule.name == "growing-with-length"
    # rounding that reproduces the error wins over a tree difference below the module
    assert diagnose(RULES, failing(module="m.mlp", tree=TREE_MLP, rounding=rounding("bf16"))).rule.name == \
        "precision-rounding"


def test_counterfactuals_are_in_the_why_and_the_next_steps() -> None:
    closes = KnobResult("merge_precision", "tf32", 1.4e-4, (
        KnobRun("ieee", 2.1e-7, False, (512, 1024), (2.0e-7, 2.1e-7)),
        KnobRun("tf32x3", 2.2e-7, False, (512, 1024), (2.0e-7, 2.2e-7)),
    ), closes="ieee", improvement=1.4e-4 / 2.1e-7)
    outcome = diagnose(RULES, failing(length_fit=GROWING, rounding=rounding("tf32"), counterfactuals=(closes,)))
    why = outcome.diagnosis.why
    assert "rerun with merge_precision=ieee the diff passes" in why and "667x smaller" in why
    assert "tf32x3 also passes" in why
    assert outcome.diagnosis.next[0] == Step("set merge_precision=ieee in the candidate: the diff passes with it")
    assert outcome.record.saw["counterfactual_closes"] == {"merge_precision": "ieee"}


def test_a_switch_that_the_backend_ignores_is_not_tried_rather_than_useless() -> None:
    note = "no CUDA device here, and the switch only changes what CUDA kernels compute"
    knob = KnobResult("torch.backends.cuda.matmul.allow_tf32", True, 1e-3,
                      (KnobRun(False, tried=False, note=note),), note=note)
    why = diagnose(RULES, failing(rounding=rounding("tf32"), counterfactuals=(knob,))).diagnosis.why
    assert "torch.backends.cuda.matmul.allow_tf32 was not tried (no CUDA device here" in why
    assert "closes" not in why
    none = KnobResult("merge_precision", "tf32", 1e-3, (KnobRun("ieee", 9e-4, True, (64,), (9e-4,)),), None,
                      1e-3 / 9e-4)
    assert "no value of merge_precision closes the gap" in diagnose(
        RULES, failing(counterfactuals=(none,))).diagnosis.why


def test_every_rule_is_documented_and_the_table_ends_with_a_catch_all() -> None:
    names = [rule.name for rule in RULES]
    assert names[0] == "pass" and names[-1] == "generic" and len(set(names)) == len(names)
    assert all(rule.doc for rule in RULES)
    assert diagnose(RULES, DiffFindings(failed=True, requests=1, failing_requests=1)).rule.name == "generic"
    assert not math.isnan(diagnose(RULES, failing()).record.saw["output_rel_l2"])


def test_a_knob_that_closes_a_growing_error_of_rounding_size_makes_the_precision_claim() -> None:
    """Between captures the rounding test cannot rerun the module; the error's size and a
    counterfactual that closes it are the evidence then, and the why says both, not more."""
    from glmfb.diff.shape import precision_signature

    closes = KnobResult("merge_precision", "tf32", 3.8e-4, (KnobRun("tf32x3", 3.2e-7, False, (512,), (3.2e-7,)),),
                        closes="tf32x3", improvement=3.8e-4 / 3.2e-7)
    signature = precision_signature(1.8e-4, "captures")
    outcome = diagnose(RULES, failing(length_fit=GROWING, rounding=None, signature=signature, counterfactuals=(closes,)))
    why = outcome.diagnosis.why
    assert outcome.rule.name == "growing-with-length"
    assert "TF32/fp16 (10-bit mantissa, 2^-11) rounding" in why and "merge_precision=tf32x3 closes the gap" in why
    without = diagnose(RULES, failing(length_fit=GROWING, rounding=None, signature=signature)).diagnosis.why
    assert "TF32" not in without and "accumulates over the context" in without  # the ratio alone claims nothing


# ---- issue 37: the cast and its line, the module before what it flows into, float16's range ------


def _cast_at(line: int) -> Any:
    from glmfb.diff.optrace import SourceSite, TracedOp

    site = SourceSite("/src/attention.py", line, "flash_attention", "l = (l * alpha + p.sum(-1)).type_as(bias)")
    return TracedOp("aten._to_copy", ("float32",), "bfloat16", site, calls=6)


def test_the_cast_inside_the_module_is_named_with_its_line_before_the_submodule_it_flows_into() -> None:
    findings = failing(module="layers.0.attn", first_divergent="layers.0.attn.o_proj", profile=WINDOW, position=16,
                       bias=None, narrowing=_cast_at(83), narrowing_module="layers.0.attn", reference="float32",
                       first_carries=True)
    outcome = diagnose(RULES, findings)
    why = outcome.diagnosis.why
    assert outcome.rule.name == "position-onset"
    assert ("it starts in module layers.0.attn (its own error, measured on the baseline's inputs); there a float32 "
            "value is cast to bfloat16 in flash_attention, line 83 of /src/attention.py") in why
    assert why.index("a float32 value is cast to bfloat16") < why.index("layers.0.attn.o_proj")
    assert "layers.0.attn.o_proj, is a submodule it calls after the computation in layers.0.attn's own forward" in why
    assert "only carries it" in why and why.count("cast to bfloat16") == 1
    assert any("read line 83 of /src/attention.py" in step.why for step in outcome.diagnosis.next)


def test_a_cast_is_said_in_the_rules_that_do_not_read_the_location() -> None:
    findings = failing(module="m.o_proj", rounding=rounding("bf16"), narrowing=_cast_at(12), narrowing_module="m.o_proj",
                       reference="float32")
    outcome = diagnose(RULES, findings)
    assert outcome.rule.name == "precision-rounding"
    assert "In m.o_proj, a float32 value is cast to bfloat16 in flash_attention, line 12" in outcome.diagnosis.why


def test_without_a_narrowing_the_why_names_no_cast() -> None:
    outcome = diagnose(RULES, failing(module="layers.0.attn", first_divergent="layers.0.attn.o_proj", profile=WINDOW,
                                      bias=None, first_carries=True))
    assert not re.search(r"cast|" + FORMATS, outcome.diagnosis.why, re.IGNORECASE), outcome.diagnosis.why


def test_a_non_finite_candidate_says_float16_and_its_range_or_that_none_was_seen() -> None:
    from glmfb.diff.optrace import TracedOp
    from glmfb.diff.rounding import Float16Range

    over = Float16Range("mlp.up", "mlp.up", 1.92e5, 527, 2048, ("aten.addmm takes float16 operands",), "its operations",
                        TracedOp("aten.addmm", ("float16",) * 3, "float16", None), traced=True)
    why = diagnose(RULES, failing(shape=ErrorShape.NON_FINITE, nonfinite_tap="mlp.up", module="mlp.up",
                                  range=over)).diagnosis.why
    assert why.startswith("The candidate produces NaN or Inf where the baseline is finite, first at mlp.up: the "
                          "candidate computes mlp.up in float16 (aten.addmm takes float16 operands), and the baseline's "
                          "values there reach 1.92e+05 in magnitude, past float16's largest finite value, 65504 "
                          "(527 of 2048 elements beyond it)"), why
    none = replace(over, seen=(), first_nonfinite=None)
    why = diagnose(RULES, failing(shape=ErrorShape.NON_FINITE, nonfinite_tap="mlp.up", range=none)).diagnosis.why
    assert "glmfb saw no float16 in mlp.up (its operations), so it is not float16's range" in why
    # the first operation that gave Inf computes in float16: float16 is never denied, even when
    # nothing else shows it
    made = replace(none, first_nonfinite=TracedOp("aten.bmm", ("float16", "float16"), "float16", None))
    why = diagnose(RULES, failing(shape=ErrorShape.NON_FINITE, nonfinite_tap="mlp.up", range=made)).diagnosis.why
    assert "not float16's range" not in why and "aten.bmm in float16" in why, why
    # only a capture's output dtype was looked at: nothing could have refuted float16, so it is not denied
    untraced = replace(none, traced=False, looked_at="the dtype of its output in the candidate's capture")
    why = diagnose(RULES, failing(shape=ErrorShape.NON_FINITE, nonfinite_tap="mlp.up", range=untraced)).diagnosis.why
    assert "not float16's range" not in why and "is not tested" in why, why


def test_trials_left_out_as_invalid_are_said_in_the_why() -> None:
    broken = Trial("bf16", "every operation", 7e31, 3.8e33, -0.008, 0.47, False,
                   "left out: its error is 7e+31 of the output's own size (3.8e+33x the observed error): larger than "
                   "the output, no rounding; the trial itself broke")
    test = rounding(None)
    test = replace(test, trials=(*test.trials, broken))
    why = diagnose(RULES, failing(module="attn", fit=GROWING, length_fit=GROWING, shape=ErrorShape.GROWING,
                                  rounding=test)).diagnosis.why
    assert ("1 of the 4 rounding trials was left out as invalid, not read as evidence: its own result had an error "
            "larger than the output itself") in why
