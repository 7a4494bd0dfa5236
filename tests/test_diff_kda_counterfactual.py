"""The precision counterfactual on the KDA context-parallel merge, single process: the CP path's
stand-in (``emulate_cp``) with a TF32 merge against the single-device model, rerun with
``merge_precision`` at ``ieee`` and ``tf32x3`` (targets referenced as
tests/test_diff_kda_counterfactual.py:NAME)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from glmfb.diff.config import DiffConfig

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()
if str(ROOT / "scenarios") not in sys.path:
    sys.path.insert(0, str(ROOT / "scenarios"))


def single() -> Any:
    """The single-device model's output (a callable, so both sides tap the same outputs)."""
    from kda_cp import model as kda_model

    model = kda_model.single(world_size=2, layout="zigzag")
    return lambda request: model(request["input_ids"])


def emulated_cp(merge_precision: str = "tf32") -> Any:
    """The context-parallel computation in one process, zig-zag over 2 ranks (4 segments)."""
    from kda_cp import model as kda_model

    model = kda_model.single(world_size=2, layout="zigzag")
    return lambda request: kda_model.emulate_cp(model, request["input_ids"], 4, merge_precision)[0]


@pytest.mark.slow
def test_the_counterfactual_closes_a_tf32_merge_with_tf32x3(tmp_path: Path) -> None:
    from helpers import run

    path = tmp_path / "requests.jsonl"
    path.write_text('{"id": "kda-256", "length": 256, "seed": 0}\n{"id": "kda-512", "length": 512, "seed": 1}\n')
    config = DiffConfig("kda-cp", f"{HERE}:single", f"{HERE}:emulated_cp", requests=path, minimize=False,
                        counterfactuals=(("merge_precision", ("ieee", "tf32x3")),))
    verdict = run("diff", config, tmp_path)
    assert verdict.status.value == "fail"
    knob = next(e for e in verdict.to_dict()["evidence"] if e["kind"] == "counterfactual")
    assert knob["candidate_value"] == "tf32" and knob["candidate_rel_l2"] > 2e-5
    results = {r["value"]: r for r in knob["results"]}
    assert set(results) == {"ieee", "tf32x3"} and not results["ieee"]["failed"] and not results["tf32x3"]["failed"]
    assert max(results["tf32x3"]["errors"]) < 2e-6 and results["tf32x3"]["lengths"] == [256, 512]
    assert knob["closes"] in ("ieee", "tf32x3") and knob["improvement"] > 10
    assert f"rerun with merge_precision={knob['closes']} the diff passes" in verdict.why
