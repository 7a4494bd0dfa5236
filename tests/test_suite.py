"""glmfb run's suite: discovery, loading checks, expectations, the host boundary, Ctrl-C.

The probe here is the toy probe of tests/toy, installed through the entry-point mechanism, so
these tests need no timing and no torch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from glmfb.contract.errors import InputError
from glmfb.contract.evidence import TargetError, Traceback
from glmfb.contract.verdict import Layer, Run, Status
from glmfb.workflows import suite
from glmfb.workflows.suite import SuiteContext

DEFINITIONS = """
[[probe]]
name = "planted"
probe = "toy"
options = { outcome = "fail", kernel = "gated_norm_tiled" }
expect = { status = "fail", layer = "kernel", where = { kernel = "gated_norm*" } }

[[probe]]
name = "clean"
probe = "toy"
options = { outcome = "pass" }
expect = { status = "pass" }

[[probe]]
name = "wrong-diagnosis"
probe = "toy"
options = { outcome = "fail", kernel = "softmax" }
expect = { status = "fail", where = { kernel = "gated_norm*" } }

[[probe]]
name = "no-expectation"
probe = "toy"
options = { outcome = "inconclusive" }
"""


@pytest.fixture
def probes_dir(tmp_path: Path, toy: Path) -> Path:
    folder = tmp_path / "probes"
    folder.mkdir()
    (folder / "toy.toml").write_text(DEFINITIONS)
    return folder


def write(tmp_path: Path, text: str) -> Path:
    file = tmp_path / "p.toml"
    file.write_text(text)
    return file


def run(definitions: list[suite.ProbeDefinition], tmp_path: Path, isolate: bool = True) -> Run:
    return suite.run_suite(definitions, SuiteContext("test-run", tmp_path / "reports", isolate=isolate))


def test_discover_and_load(probes_dir: Path) -> None:
    definitions = suite.load_definitions(suite.discover([probes_dir]))
    assert [d.name for d in definitions] == ["planted", "clean", "wrong-diagnosis", "no-expectation"]
    planted = definitions[0]
    assert planted.spec.resolve_path("../scen/k.py") == probes_dir.parent / "scen" / "k.py"
    assert planted.config.outcome == "fail" and planted.config.threshold == 0.05


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
    assert Run.from_dict(result.to_dict()) == result


def test_engine_exception_becomes_error_verdict(tmp_path: Path, toy: Path) -> None:
    [definition] = suite.load_definitions([write(tmp_path, "[[probe]]\nname='boom'\nprobe='toy'\n"
                                                            "options={outcome='raise'}\n")])
    verdict = suite.run_definition(definition, SuiteContext("r", tmp_path))
    assert verdict.status is Status.ERROR and verdict.layer is Layer.HARNESS
    assert "glmfb toy broke: RuntimeError: engine exploded" in verdict.why
    assert verdict.find(Traceback) is not None and "engine exploded" in verdict.find(Traceback).text  # type: ignore[union-attr]


def test_target_failure_names_side_and_stage_with_traceback(tmp_path: Path, toy: Path) -> None:
    [definition] = suite.load_definitions([write(tmp_path, "[[probe]]\nname='t'\nprobe='toy'\n"
                                                            "options={outcome='target-raises'}\n")])
    verdict = suite.run_definition(definition, SuiteContext("r", tmp_path))
    assert verdict.status is Status.ERROR
    assert verdict.why == "the target raised ValueError: bad input tensor on its first call"
    error = verdict.find(TargetError)
    assert error is not None and (error.side, error.stage) == ("target", "on its first call")
    assert verdict.find(Traceback) is not None


def test_ctrl_c_keeps_finished_and_marks_rest(tmp_path: Path, toy: Path) -> None:
    file = write(tmp_path, """
[[probe]]
name = "done"
probe = "toy"
[[probe]]
name = "stopped"
probe = "toy"
options = { outcome = "interrupt" }
expect = { status = "pass" }
[[probe]]
name = "never"
probe = "toy"
""")
    # in-process, so the probe's KeyboardInterrupt reaches the suite as a Ctrl-C would
    result = run(suite.load_definitions([file]), tmp_path, isolate=False)
    assert result.interrupted
    assert [v.status for v in result.verdicts] == [Status.PASS, Status.ERROR, Status.ERROR]
    assert result.verdicts[1].expect_met is False
    assert "not run" in result.verdicts[2].why
    assert int(result.exit_code) == 3  # a run cut short is a harness error, not a regression
    assert Run.from_dict(result.to_dict()) == result


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[probe]]\nname='a'\nprobe='toy'\ncolour='red'\n", "unknown key 'colour'"),
        ("[[probe]]\nname='a'\nprobe='fuzz'\n", "'probe' is 'fuzz'"),
        ("[[probe]]\nprobe='toy'\n", "missing 'name'"),
        ("[[probe]]\nname='a'\nprobe='toy'\nexpect={status='great'}\n", "bad expectation"),
        ("[[probe]]\nname='a'\nprobe='toy'\nexpect={}\n", "expectation is empty"),
        ("[[probe]]\nname='a'\nprobe='toy'\nexpect={where={}}\n", "expectation is empty"),
        ("[[probe]]\nname='a'\nprobe='toy'\nexpect={status='error'}\n", "never meets an expectation"),
        ("[[probe]]\nname='a'\nprobe='toy'\ntimeout='soon'\n", "timeout: 'soon' is not a duration"),
        ("[[probe]]\nname='a'\nprobe='toy'\n[[probe]]\nname='a'\nprobe='toy'\n", "already defined"),
        ("[probe\n", "invalid TOML"),
        ("title='x'\n", "unknown top-level key"),
        ("[[probe]]\nname='a'\nprobe='toy'\noptions={colour=1}\n", "unknown option 'colour'"),
        ("[[probe]]\nname='a'\nprobe='toy'\noptions={outcome='great'}\n", "option 'outcome'"),
        ("[[probe]]\nname='a'\nprobe='toy'\noptions={threshold=5}\n", "write 5% or 0.05"),
        ("[[probe]]\nname='a'\nprobe='toy'\nrules='missing.py'\n", "rules file .* not found"),
    ],
)
def test_bad_definitions_are_usage_errors(tmp_path: Path, toy: Path, text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        suite.load_definitions([write(tmp_path, text)])


def test_builtin_probe_checks_run_at_load(tmp_path: Path) -> None:
    """A bench definition without shapes is refused when the file loads, before anything runs."""
    (tmp_path / "k.py").write_text("def a(shape): ...\ndef b(shape): ...\n")
    text = "[[probe]]\nname='a'\nprobe='bench'\nbaseline='k.py:a'\ncandidate='k.py:b'\n"
    with pytest.raises(InputError, match="no shape given"):
        suite.load_definitions([write(tmp_path, text)])
    with pytest.raises(InputError, match=r"option 'threshold'.*write 5% or 0.05"):
        suite.load_definitions([write(tmp_path, text + "options={shapes=['8x8'], threshold=5}\n")])


def test_select_and_discover_errors(probes_dir: Path) -> None:
    definitions = suite.load_definitions(suite.discover([probes_dir]))
    assert [d.name for d in suite.select(definitions, ["plan*"])] == ["planted"]
    assert [d.name for d in suite.select(definitions, ["diag"])] == ["wrong-diagnosis"]
    with pytest.raises(InputError):
        suite.discover([probes_dir / "missing"])


def test_a_probe_name_becomes_one_path_component(tmp_path: Path, toy: Path) -> None:
    [definition] = suite.load_definitions([write(tmp_path, "[[probe]]\nname='../../x'\nprobe='toy'\n")])
    context = SuiteContext("r", tmp_path / "reports")
    folder = context.probe_context(definition).artifact_dir
    assert folder.parent == tmp_path / "reports" and folder.name not in (".", "..") and "/" not in folder.name
