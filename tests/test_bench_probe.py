"""probes/bench.toml through the suite: the planted regression is diagnosed, the fix passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import BundledRun

from glmfb.contract.errors import InputError, UsageError
from glmfb.contract.verdict import Status, Verdict
from glmfb.workflows import suite

ROOT = Path(__file__).resolve().parents[1]


def definitions() -> dict[str, suite.ProbeDefinition]:
    return {d.name: d for d in suite.load_definitions([ROOT / "probes" / "bench.toml"])}


@pytest.mark.slow
@pytest.mark.bundled("bench.toml")
@pytest.mark.parametrize("name", ["gated-norm-tiled-vs-fused", "gated-norm-fused-vs-tiled"])
def test_bench_definitions_meet_their_expectations(name: str, bundled_run: BundledRun) -> None:
    """Each definition's verdict in the session's one run of the bundled suite (conftest.py)."""
    definition = definitions()[name]
    verdict = Verdict.from_dict(bundled_run.verdicts("bench.toml")[name])
    assert verdict.expect_met, (verdict.status, verdict.why, verdict.where)
    assert Path(verdict.artifacts["samples"]).is_file()
    if definition.expect is not None and definition.expect.status is Status.FAIL:
        assert "redundant recomputation" in verdict.why and "aten::mean" in verdict.why
        # the next step is a command that works from the working directory
        assert any(step.command == "bench" and step.arguments["baseline"].startswith("scenarios/decode_norm/kernels.py")
                   for step in verdict.next)
    else:
        assert "speed-up" in verdict.why


def test_unknown_option_and_missing_shapes_are_refused_at_load(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f(shape): ...\ndef g(shape): ...\n")
    path = tmp_path / "p.toml"
    path.write_text(
        '[[probe]]\nname = "x"\nprobe = "bench"\nbaseline = "a.py:f"\ncandidate = "a.py:g"\n'
        'options = { shapes = ["8"], budgte = 3 }\n'
    )
    with pytest.raises(InputError, match="unknown option 'budgte'"):
        suite.load_definitions([path])
    path.write_text('[[probe]]\nname = "x"\nprobe = "bench"\nbaseline = "a.py:f"\ncandidate = "a.py:g"\n')
    with pytest.raises(InputError, match="no shape given"):
        suite.load_definitions([path])


def test_a_missing_target_file_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[[probe]]\nname = "x"\nprobe = "bench"\nbaseline = "nowhere.py:f"\ncandidate = "nowhere.py:g"\n'
                    'options = { shapes = ["8"] }\n')
    with pytest.raises(UsageError, match=r"baseline: target file nowhere\.py not found"):
        suite.load_definitions([path])
