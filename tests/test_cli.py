from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from glmfb.cli import app
from glmfb.contract.step import Step
from glmfb.contract.verdict import Layer, Run, Status, Verdict

runner = CliRunner()


def verdict(name: str, status: Status) -> Verdict:
    return Verdict(probe="gap", name=name, status=status, layer=Layer.TRANSFER, why="w")


def run_json(*statuses: Status) -> str:
    run = Run(
        id="r", started="s", verdicts=tuple(verdict(f"v{i}", s) for i, s in enumerate(statuses))
    )
    return json.dumps(run.to_dict())


def glmfb(
    *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run(
        [sys.executable, "-m", "glmfb", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
    )


def test_gate_bad_json_on_stdin_is_one_line_exit_2() -> None:
    result = glmfb("gate", "-", stdin="{bad")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glmfb: error:")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        ([Status.PASS, Status.WARN], 0),
        ([Status.PASS, Status.FAIL], 1),
        ([Status.ERROR, Status.FAIL], 3),
        ([Status.INCONCLUSIVE], 4),
    ],
)
def test_gate_exit_codes(statuses: list[Status], code: int) -> None:
    result = runner.invoke(app, ["gate", "-"], input=run_json(*statuses))
    assert result.exit_code == code, result.output


def test_gate_writes_junit_and_summary(tmp_path: Path) -> None:
    run_file = tmp_path / "run.json"
    run_file.write_text(run_json(Status.PASS, Status.FAIL, Status.FAIL))
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.md"
    result = runner.invoke(
        app, ["gate", str(run_file), "--junit", str(junit), "--summary", str(summary)]
    )
    assert result.exit_code == 1
    import xml.etree.ElementTree as ET

    assert ET.parse(junit).getroot().get("failures") == "2"
    assert "glmfb gate failed" in summary.read_text()


def test_gate_rejects_unknown_policy_key(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text("fail_onn = ['warn']\n")
    result = runner.invoke(app, ["gate", "-", "--policy", str(policy)], input=run_json(Status.PASS))
    assert result.exit_code == 2
    assert "unknown key 'fail_onn'" in result.output


def test_gate_names_bad_field_and_reads_single_verdict() -> None:
    data = json.loads(run_json(Status.PASS))
    data["verdicts"][0]["status"] = "great"
    result = runner.invoke(app, ["gate", "-"], input=json.dumps(data))
    assert result.exit_code == 2 and "verdicts[0].status" in result.output
    single = json.dumps(verdict("one", Status.FAIL).to_dict())
    assert runner.invoke(app, ["gate", "-"], input=single).exit_code == 1


def test_schema_command_prints_json() -> None:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert {"verdict", "run", "evidence.op_diff", "evidence.gil_holder", "evidence.diagnosis"} <= set(schema["$defs"])
    assert schema["$defs"]["verdict"]["properties"]["probe"]["enum"] == ["diff", "bench", "gil", "gap"]


def test_run_without_definitions_exits_2(tmp_path: Path) -> None:
    (tmp_path / "probes").mkdir()
    result = glmfb("run", cwd=tmp_path)
    assert result.returncode == 2
    assert "no probe definitions found" in result.stderr
    assert "Traceback" not in result.stderr


def test_run_whose_selection_matches_nothing_names_what_it_could_match(tmp_path: Path) -> None:
    (tmp_path / "k.py").write_text("def a(shape, seed=0): ...\ndef b(shape, seed=0): ...\n")
    (tmp_path / "p.toml").write_text('[[probe]]\nname = "rmsnorm-speed"\nprobe = "bench"\n'
                                     'baseline = "k.py:a"\ncandidate = "k.py:b"\noptions = { shapes = ["8"] }\n')
    result = glmfb("run", "p.toml", "-k", "nothing-like-it$", "--out", "reports", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [(
        "glmfb: error: no probe in p.toml matches -k 'nothing-like-it$'; "
        "-k takes a glob or a substring of a name: rmsnorm-speed")]
    assert "Traceback" not in result.stderr
    assert not list((tmp_path / "reports").glob("*/run.json"))  # and `glmfb gate` would refuse the stale pointer


def test_run_writes_run_json_and_json_stdout(tmp_path: Path, toy: Path) -> None:
    from test_suite import DEFINITIONS

    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "p.toml").write_text(DEFINITIONS)
    out = tmp_path / "reports"
    result = runner.invoke(app, ["run", str(probes), "--json", "--out", str(out)])
    assert result.exit_code == 1  # one unmet expectation
    document = json.loads(result.stdout)
    assert document["schema"] == "glmfb.run/2"
    files = list(out.glob("*/run.json"))
    assert len(files) == 1
    assert json.loads(files[0].read_text()) == document
    assert not list(out.glob("*/.*.tmp"))  # no temporary file left behind
    html = (files[0].parent / "report.html").read_text()
    assert "wrong-diagnosis" in html and "expectation not met" in html
    import xml.etree.ElementTree as ET

    # the unmet expectation and the inconclusive verdict both fail the default gate
    assert ET.parse(files[0].parent / "junit.xml").getroot().get("failures") == "2"


def test_usage_error_is_one_line() -> None:
    result = glmfb("gate", "--policy")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1


def test_help_and_gate_import_neither_torch_nor_pandas(tmp_path: Path) -> None:
    run_file = tmp_path / "run.json"
    run_file.write_text(run_json(Status.PASS))
    for args in (["--help"], ["gate", str(run_file)]):
        code = (
            "import sys\nfrom glmfb.cli import app\n"
            f"try:\n    app({args!r}, prog_name='glmfb')\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'pandas', 'numpy') if m in sys.modules))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


# --------------------------------------------------------------------------------------------
# The probe API from outside: a probe installed by another package, units, user rules
# --------------------------------------------------------------------------------------------


def toy_env(toy: Path) -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy), root])}


def test_an_installed_probe_runs_gates_and_is_listed(tmp_path: Path, toy: Path) -> None:
    """The toy probe comes only through the glmfb.probes entry point (tests/toy holds its
    dist-info): glmfb run runs it, gate gates it, schema lists it, glmfb toy --help exists."""
    env = toy_env(toy)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "glmfb", *args], capture_output=True, text=True,
                              cwd=tmp_path, env=env, timeout=120)

    helped = cli("toy", "--help")
    assert helped.returncode == 0 and "--outcome" in helped.stdout and "--threshold" in helped.stdout
    assert "toy" in cli("--help").stdout
    schema = json.loads(cli("schema").stdout)
    assert "toy" in schema["$defs"]["verdict"]["properties"]["probe"]["enum"]
    assert "evidence.toy_reading" in schema["$defs"]
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "toy.toml").write_text(
        '[[probe]]\nname = "t"\nprobe = "toy"\noptions = { outcome = "fail", kernel = "k" }\n'
        'expect = { status = "fail", where = { kernel = "k" } }\n'
    )
    ran = cli("run", "--json")
    assert ran.returncode == 0, ran.stderr
    document = json.loads(ran.stdout)
    assert document["verdicts"][0]["probe"] == "toy" and document["verdicts"][0]["expect_met"] is True
    gated = subprocess.run([sys.executable, "-m", "glmfb", "gate", "-"], input=ran.stdout, capture_output=True,
                           text=True, cwd=tmp_path, env=env, timeout=60)
    assert gated.returncode == 0, gated.stderr
    direct = cli("toy", "--outcome", "fail", "--json")
    assert direct.returncode == 1 and json.loads(direct.stdout)["status"] == "fail"


def test_gate_reads_a_probe_kind_it_does_not_know_with_a_warning() -> None:
    data = json.loads(run_json(Status.FAIL))
    data["verdicts"][0]["probe"] = "from-the-future"
    data["verdicts"][0]["evidence"] = [{"kind": "quantum_reading", "qubits": 3}]
    result = glmfb("gate", "-", stdin=json.dumps(data))
    assert result.returncode == 1  # gated on its status
    assert "probe kind 'from-the-future' is not installed here" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "a.py:x", "b.py:y", "--shape", "8x4096", "--threshold", "5"],
        ["gap", "a.py:x", "b.py:y", "--threshold", "20"],
        ["gil", "--starvation-p99", "ten", "--", "python", "x.py"],
        ["bench", "a.py:x", "b.py:y", "--shape", "8x4096", "--budget", "10parsecs"],
    ],
)
def test_an_option_without_its_unit_is_one_line_exit_2(args: list[str], tmp_path: Path) -> None:
    result = glmfb(*args, cwd=tmp_path)  # its run folder (made before the option is read) lands there
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    if "--threshold" in args:
        assert "write" in result.stderr and "% or 0." in result.stderr


def test_a_user_rule_file_changes_the_why(tmp_path: Path, toy: Path) -> None:
    rules = tmp_path / "my_rules.py"
    rules.write_text(
        "from glmfb.rules import Diagnosis, Rule\n"
        "from glmfb.verdict import Status\n\n"
        "def _ours(findings):\n"
        "    if findings.outcome != 'fail':\n"
        "        return None\n"
        "    return Diagnosis(Status.FAIL, f'our team knows this one: value {findings.value}', ('ask #kernels',))\n\n"
        "RULES = [Rule('team-known-bug', 'toy', _ours), Rule('other-probe', 'bench', _ours)]\n"
    )
    (tmp_path / "p.toml").write_text(
        '[[probe]]\nname = "t"\nprobe = "toy"\nrules = "my_rules.py"\noptions = { outcome = "fail" }\n'
    )
    from glmfb.contract.evidence import RuleFired
    from glmfb.workflows.suite import SuiteContext, load_definitions, run_definition

    [definition] = load_definitions([tmp_path / "p.toml"])
    verdict = run_definition(definition, SuiteContext("r", tmp_path / "reports"))
    assert verdict.why == "our team knows this one: value 0.5" and verdict.next == (Step("ask #kernels"),)
    fired = verdict.find(RuleFired)
    assert fired is not None and fired.rule == "team-known-bug" and fired.source == f"file {rules.resolve()}"
    assert fired.saw == {"outcome": "fail", "value": 0.5}
    # without the file, the built-in rule explains it
    (tmp_path / "q.toml").write_text('[[probe]]\nname = "t"\nprobe = "toy"\noptions = { outcome = "fail" }\n')
    [plain] = load_definitions([tmp_path / "q.toml"])
    baseline = run_definition(plain, SuiteContext("r", tmp_path / "reports"))
    assert baseline.find(RuleFired).rule == "scripted"  # type: ignore[union-attr]


# ---- the gate gates the latest run, never a stale one --------------------------------------


def test_the_stale_run_recipe_exits_non_zero(tmp_path: Path, toy: Path) -> None:
    """glmfb run bad.toml --out reports/ ; glmfb gate: the run stops on bad input, and the gate
    must not gate the previous (green) run instead."""
    env = toy_env(toy)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "glmfb", *args], capture_output=True, text=True, cwd=tmp_path,
                              env=env, timeout=120)

    (tmp_path / "good.toml").write_text('[[probe]]\nname = "g"\nprobe = "toy"\n')
    (tmp_path / "bad.toml").write_text('[[probe]]\nname = "b"\nprobe = "toy"\noptions = { threshold = 5 }\n')
    assert cli("run", "good.toml", "--out", "reports").returncode == 0
    gated = cli("gate")
    assert gated.returncode == 0 and "glmfb gate: read reports/" in gated.stderr
    ran = cli("run", "bad.toml", "--out", "reports")
    assert ran.returncode == 2
    stale = cli("gate")
    assert stale.returncode == 3, stale.stderr
    assert "has no run.json" in stale.stderr and "never gates an older run" in stale.stderr
    # a run folder is accepted as the gate's source
    folder = next(p.parent for p in (tmp_path / "reports").glob("*/run.json"))
    assert cli("gate", str(folder)).returncode == 0
    assert cli("gate", str(tmp_path / "reports")).returncode == 3  # the folder's latest run is the bad one


def test_a_rule_installed_through_the_entry_point_group_comes_first(tmp_path: Path, toy: Path) -> None:
    from glmfb.contract.evidence import RuleFired
    from glmfb.workflows.suite import SuiteContext, load_definitions, run_definition

    (tmp_path / "p.toml").write_text('[[probe]]\nname = "t"\nprobe = "toy"\n'
                                     'options = { outcome = "fail", kernel = "known-slow-kernel" }\n')
    [definition] = load_definitions([tmp_path / "p.toml"])
    verdict = run_definition(definition, SuiteContext("r", tmp_path / "reports"))
    assert verdict.why.startswith("a kernel the team already knows is slow")
    fired = verdict.find(RuleFired)
    assert fired is not None and fired.rule == "team-known-kernel"
    assert fired.source.startswith("entry point toy-known-kernel")
