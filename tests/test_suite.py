from __future__ import annotations

from pathlib import Path

import pytest

from glmfb import suite
from glmfb.errors import InputError
from glmfb.suite import ProbeDefinition, RunContext
from glmfb.verdict import Layer, Run, Status, Verdict

DEFINITIONS = """
[[probe]]
name = "planted"
probe = "bench"
baseline = "../scen/k.py:fused"
candidate = "../scen/k.py:tiled"
options = { outcome = "fail", kernel = "gated_norm_tiled" }
expect = { status = "fail", layer = "kernel", where = { kernel = "gated_norm*" } }

[[probe]]
name = "clean"
probe = "bench"
options = { outcome = "pass" }
expect = { status = "pass" }

[[probe]]
name = "wrong-diagnosis"
probe = "bench"
options = { outcome = "fail", kernel = "softmax" }
expect = { status = "fail", where = { kernel = "gated_norm*" } }

[[probe]]
name = "no-expectation"
probe = "bench"
options = { outcome = "inconclusive" }
"""


def fake_engine(definition: ProbeDefinition, context: RunContext) -> Verdict:
    """A stand-in probe engine whose verdict the definition's options dictate."""
    outcome = definition.options["outcome"]
    if outcome == "raise":
        raise RuntimeError("engine exploded")
    if outcome == "interrupt":
        raise KeyboardInterrupt
    where = {"kernel": definition.options["kernel"]} if "kernel" in definition.options else {}
    return Verdict(
        probe=definition.probe,
        name=definition.name,
        status=Status(outcome),
        layer=Layer.KERNEL,
        why="fake",
        where=where,
    )


@pytest.fixture
def probes_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "probes"
    folder.mkdir()
    (folder / "bench.toml").write_text(DEFINITIONS)
    monkeypatch.setattr(suite, "load_engine", lambda kind: fake_engine)
    return folder


def run(definitions: list[ProbeDefinition], tmp_path: Path) -> Run:
    return suite.run_suite(definitions, RunContext("test-run", tmp_path / "reports"))


def test_discover_and_load(probes_dir: Path) -> None:
    definitions = suite.load_definitions(suite.discover([probes_dir]))
    assert [d.name for d in definitions] == [
        "planted",
        "clean",
        "wrong-diagnosis",
        "no-expectation",
    ]
    planted = definitions[0]
    assert planted.resolve_path("../scen/k.py") == probes_dir.parent / "scen" / "k.py"
    assert planted.expect is not None and planted.expect.layer is Layer.KERNEL


def test_expectations_are_judged_like_strict_xfail(probes_dir: Path, tmp_path: Path) -> None:
    result = run(suite.load_definitions(suite.discover([probes_dir])), tmp_path)
    by_name = {v.name: v for v in result.verdicts}
    assert by_name["planted"].expect_met is True and by_name["planted"].outcome is Status.PASS
    assert by_name["clean"].expect_met is True
    assert by_name["wrong-diagnosis"].expect_met is False
    assert by_name["wrong-diagnosis"].outcome is Status.FAIL
    assert by_name["no-expectation"].expect_met is None
    assert result.summary["expect_met"] == 2 and result.summary["expect_unmet"] == 1
    assert int(result.exit_code) == 1


def test_engine_exception_becomes_error_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(suite, "load_engine", lambda kind: fake_engine)
    definition = ProbeDefinition(
        name="boom",
        probe=suite.ProbeKind.GIL,
        source=tmp_path / "x.toml",
        options={"outcome": "raise"},
    )
    verdict = suite.run_definition(definition, RunContext("r", tmp_path))
    assert verdict.status is Status.ERROR and verdict.layer is Layer.HARNESS
    assert "engine exploded" in verdict.why
    assert verdict.evidence[0]["kind"] == "traceback"


def test_missing_engine_module_is_an_error_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(suite.ENGINES, suite.ProbeKind.GIL, "glmfb.no_such_engine:run_definition")
    definition = ProbeDefinition(name="x", probe=suite.ProbeKind.GIL, source=tmp_path / "x.toml")
    verdict = suite.run_definition(definition, RunContext("r", tmp_path))
    assert verdict.status is Status.ERROR


def test_ctrl_c_keeps_finished_and_marks_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(suite, "load_engine", lambda kind: fake_engine)
    source = tmp_path / "p.toml"
    definitions = [
        ProbeDefinition(
            name="done", probe=suite.ProbeKind.BENCH, source=source, options={"outcome": "pass"}
        ),
        ProbeDefinition(
            name="stopped",
            probe=suite.ProbeKind.BENCH,
            source=source,
            options={"outcome": "interrupt"},
            expect=suite.Expectation(status=Status.ERROR),
        ),
        ProbeDefinition(
            name="never", probe=suite.ProbeKind.BENCH, source=source, options={"outcome": "pass"}
        ),
    ]
    result = run(definitions, tmp_path)
    assert result.interrupted
    assert [v.status for v in result.verdicts] == [Status.PASS, Status.ERROR, Status.ERROR]
    assert result.verdicts[1].expect_met is False
    assert "not run" in result.verdicts[2].why
    assert int(result.exit_code) == 3  # a run cut short is a harness error, not a regression
    assert Run.from_dict(result.to_dict()) == result


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[probe]]\nname='a'\nprobe='bench'\ncolour='red'\n", "unknown key 'colour'"),
        ("[[probe]]\nname='a'\nprobe='fuzz'\n", "'probe' is 'fuzz'"),
        ("[[probe]]\nprobe='bench'\n", "missing 'name'"),
        ("[[probe]]\nname='a'\nprobe='bench'\nexpect={status='great'}\n", "bad expectation"),
        (
            "[[probe]]\nname='a'\nprobe='bench'\n[[probe]]\nname='a'\nprobe='gil'\n",
            "already defined",
        ),
        ("[probe\n", "invalid TOML"),
        ("title='x'\n", "unknown top-level key"),
    ],
)
def test_bad_definitions_are_usage_errors(tmp_path: Path, text: str, message: str) -> None:
    file = tmp_path / "bad.toml"
    file.write_text(text)
    with pytest.raises(InputError, match=message):
        suite.load_definitions([file])


def test_select_and_discover_errors(probes_dir: Path) -> None:
    definitions = suite.load_definitions(suite.discover([probes_dir]))
    assert [d.name for d in suite.select(definitions, ["plan*"])] == ["planted"]
    assert [d.name for d in suite.select(definitions, ["diag"])] == ["wrong-diagnosis"]
    with pytest.raises(InputError):
        suite.discover([probes_dir / "missing"])


def test_option_helpers_name_the_definition(tmp_path: Path) -> None:
    definition = ProbeDefinition(
        name="x",
        probe=suite.ProbeKind.BENCH,
        source=tmp_path / "p.toml",
        options={"budget": "ten", "threads": 2, "budgte": 1},
    )
    assert definition.number_option("threads", 1) == 2.0
    assert definition.number_option("seed", 0) == 0.0
    with pytest.raises(
        InputError, match=r"p\.toml: probe 'x': option 'budget' must be a number, got 'ten'"
    ):
        definition.number_option("budget", 10)
    with pytest.raises(InputError, match="unknown bench option 'budgte'"):
        definition.check_options({"budget", "threads"})
