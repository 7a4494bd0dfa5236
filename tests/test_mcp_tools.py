"""glmfb mcp in-process: tools derived from the registry, arguments checked at the boundary
(named in every error), next steps read as tool calls, resources confined to their run folder,
and the layer's imports. No probe runs here except the toy one (tests/test_mcp_server.py
drives ``glmfb mcp`` as a subprocess)."""

from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from glmfb.contract.errors import InputError
from glmfb.contract.options import options_of
from glmfb.core.probe import ProbeForm, all_probes
from glmfb.workflows.mcp.boundary import Boundary
from glmfb.workflows.mcp.tools import Toolbox

REPO = Path(__file__).resolve().parents[1]
KERNELS = "scenarios/decode_norm/kernels.py"
FUSED = f"{KERNELS}:gated_norm_fused"
TILED = f"{KERNELS}:gated_norm_tiled"
BENCH_TOML = f"""[[probe]]
name = "tiled-vs-fused"
probe = "bench"
baseline = "../{FUSED}"
candidate = "../{TILED}"
options = {{ shapes = ["8x4096"], threshold = "5%", budget = 2 }}
expect = {{ status = "fail", layer = "kernel", where = {{ kernel = "gated_norm_tiled" }} }}
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A project: the decode-norm kernels and one bench definition."""
    project = tmp_path / "project"
    (project / "scenarios" / "decode_norm").mkdir(parents=True)
    shutil.copy(REPO / KERNELS, project / KERNELS)
    (project / "probes").mkdir()
    (project / "probes" / "bench.toml").write_text(BENCH_TOML)
    return project


def toolbox(root: Path, **kwargs: Any) -> Toolbox:
    return Toolbox(Boundary(root, **kwargs))


def refused(box: Toolbox, tool: str, arguments: dict[str, Any]) -> str:
    with pytest.raises(InputError) as caught:
        box.prepare(tool, arguments)
    return str(caught.value)


# --------------------------------------------------------------------------------------------
# Tools from the registry
# --------------------------------------------------------------------------------------------


def test_every_probe_of_the_registry_has_a_tool_whose_schema_is_its_declared_options(root: Path) -> None:
    box = toolbox(root)
    for probe in all_probes():
        tool = box.tools[probe.kind]
        schema = tool.input_schema
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        for option in options_of(probe.config_type):
            if option.toml:
                assert schema["properties"][option.key] == option.json_schema(), (probe.kind, option.key)
        if probe.form is ProbeForm.PAIR:
            assert "baseline" in schema["required"]
            assert ("candidate" in schema["required"]) is not probe.candidate_optional
        else:
            assert "target" in schema["properties"]
        assert tool.output_schema is not None
        assert tool.output_schema["properties"]["verdict"] == {"$ref": "#/$defs/verdict"}
    assert {"capture", "run", "gate", "list_probes", "explain", "cancel"} <= set(box.tools)


def test_an_installed_probe_gets_a_tool_too(root: Path, toy: Path) -> None:
    tool = toolbox(root).tools["toy"]
    assert tool.input_schema["properties"]["outcome"]["enum"][:2] == ["pass", "fail"]
    assert "threshold" in tool.input_schema["properties"]


def test_the_output_schema_of_a_probe_tool_accepts_what_glmfb_schema_accepts(root: Path) -> None:
    import jsonschema

    from glmfb.contract.verdict import Verdict
    from glmfb.core.documents import json_schema

    verdict = Verdict.harness_error("bench", "x", "why").to_dict()
    jsonschema.validate(verdict, json_schema())
    output = toolbox(root).tools["bench"].output_schema
    assert output is not None
    jsonschema.validate({"verdict": verdict, "run": {"id": "r", "uri": "glmfb://runs/r"}, "next_calls": []}, output)


# --------------------------------------------------------------------------------------------
# The boundary: every refusal names its argument
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("arguments", "named"), [
    ({"candidate": TILED, "shapes": ["8x4096"]}, "argument 'baseline' is required"),
    ({"baseline": FUSED, "candidate": TILED, "shape": ["8x4096"]}, "unknown argument 'shape'"),
    ({"baseline": FUSED, "candidate": TILED, "shapes": ["8x4096"], "threshold": 5}, "option 'threshold'"),
    ({"baseline": FUSED, "candidate": TILED, "shapes": ["8y4096"]}, "option 'shapes'"),
    ({"baseline": FUSED, "candidate": TILED, "shapes": ["8x4096"], "budget": "soon"}, "option 'budget'"),
    ({"baseline": FUSED, "candidate": TILED, "shapes": ["8x4096"], "timeout": "-3s"}, "argument 'timeout'"),
    ({"baseline": FUSED, "candidate": TILED, "shapes": ["8x4096"], "args": [1]}, "argument 'args'"),
    ({"baseline": FUSED, "candidate": "scenarios/missing.py:f", "shapes": ["8x4096"]}, "argument 'candidate'"),
    ({"baseline": FUSED, "candidate": TILED}, "no shape given"),
    ({"baseline": 3, "candidate": TILED, "shapes": ["8x4096"]}, "argument 'baseline'"),
])
def test_a_bad_argument_is_an_error_that_names_it(root: Path, arguments: dict[str, Any], named: str) -> None:
    message = refused(toolbox(root), "bench", arguments)
    assert message.startswith("glmfb bench: ") and named in message, message


def test_glmfbs_own_model_factory_loads_only_a_folder_under_the_root(root: Path, tmp_path: Path) -> None:
    """``glmfb.diff.hf:causal_lm`` (the step a serving diff offers from a served model folder) is
    glmfb's own target, named wherever the root is; its ``path`` must lie under the root."""
    from glmfb.diff.hf import FACTORY

    outside = tmp_path / "model"
    outside.mkdir()
    (root / "model").mkdir()
    box = toolbox(root)
    message = refused(box, "diff", {"baseline": FACTORY, "candidate": FACTORY, "requests": "r.jsonl",
                                    "baseline_args": {"path": str(outside)}, "candidate_args": {"path": "model"}})
    assert "argument 'baseline_args.path'" in message and "outside the root" in message, message
    message = refused(box, "diff", {"baseline": "glmfb.core.io:write_text_atomic", "candidate": FACTORY})
    assert "module glmfb.core.io is not under the root" in message, message


def test_paths_outside_the_root_are_refused_symlinks_included(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text("def f(shape):\n    return lambda: None\n")
    (root / "escape.py").symlink_to(outside)
    box = toolbox(root)
    for ref, argument in ((f"{outside}:f", "baseline"), ("../outside.py:f", "baseline"), ("escape.py:f", "baseline")):
        message = refused(box, "bench", {argument: ref, "candidate": TILED, "shapes": ["8x4096"]})
        assert f"argument '{argument}'" in message and "outside the root" in message, message
    message = refused(box, "bench", {"baseline": FUSED, "candidate": TILED, "shapes": ["8x4096"],
                                     "save": "../samples.json"})
    assert "argument 'save'" in message and "outside the root" in message
    assert "argument 'rules'" in refused(box, "bench", {"baseline": FUSED, "candidate": TILED, "shapes": ["8x4096"],
                                                       "rules": [str(outside)]})
    assert "argument 'source'" in refused(box, "gate", {"source": "/etc/hostname"})
    assert "argument 'paths'" in refused(box, "run", {"paths": ["../"]})


def test_modules_from_outside_the_root_and_command_lines_need_allow_commands(root: Path) -> None:
    box = toolbox(root)
    message = refused(box, "bench", {"baseline": "os:getcwd", "candidate": TILED, "shapes": ["8x4096"]})
    assert "argument 'baseline'" in message and "--allow-commands" in message
    # a module under the root is imported as usual
    box.prepare("bench", {"baseline": "scenarios.decode_norm.kernels:gated_norm_fused", "candidate": TILED,
                          "shapes": ["8x4096"]})
    message = refused(box, "gil", {"command": ["python", "-c", "pass"]})
    assert "argument 'command'" in message and "--allow-commands" in message
    allowed = toolbox(root, allow_commands=True)
    assert allowed.prepare("gil", {"command": ["python", "-c", "pass"], "duration": "1s"}).runs_probes
    allowed.prepare("bench", {"baseline": "os:getcwd", "candidate": TILED, "shapes": ["8x4096"]})


def test_every_call_has_a_time_budget_capped_by_the_server(root: Path) -> None:
    box = toolbox(root, max_call_s=30)
    arguments = {"baseline": FUSED, "candidate": TILED, "shapes": ["8x4096"]}
    assert box.prepare("bench", arguments).timeout_s == 30
    assert box.prepare("bench", {**arguments, "timeout": "10s"}).timeout_s == 10
    capped = box.prepare("bench", {**arguments, "timeout": "10min"})
    assert capped.timeout_s == 30 and "capped" in capped.notes[0]
    assert "cancel" in box.tools and "30 s" in box.tools["bench"].input_schema["properties"]["timeout"]["description"]


# --------------------------------------------------------------------------------------------
# Next steps as tool calls
# --------------------------------------------------------------------------------------------


def test_next_steps_that_are_glmfb_commands_become_tool_calls_that_are_accepted(root: Path) -> None:
    from glmfb.bench.config import BenchConfig
    from glmfb.contract.step import Step
    from glmfb.core.commandline import rerun_step, run_step, shell_line
    from glmfb.core.targets import Target
    from glmfb.gap.config import GapConfig
    from glmfb.gil.config import GilConfig

    box = toolbox(root)
    bench = BenchConfig("b", Target(FUSED), Target(TILED), shapes=((8, 4096), (32, 2048)), profile=False)
    gap = GapConfig("gap", Target(FUSED), Target(TILED), repeats=40)
    steps = [
        Step("compute each reduction once per row and reuse the result"),
        rerun_step("bench", bench, "reproduce on the worst shape", shapes=["8x4096"]),
        rerun_step("bench", bench, "more evidence", budget="12s"),
        rerun_step("gap", gap, "more evidence", repeats=80, budget="80s"),
        rerun_step("gil", GilConfig(target=Target(FUSED, {"shape": [8, 64]}), duration_s=15.0), "longer"),
        run_step(["tiled-vs-fused"]),
        Step("gate it", command="gate", arguments={"source": "reports", "policy": "ci.toml"}),
        Step("compare with another saved run", command="bench", arguments={"baseline": "OLD.json",
                                                                            "candidate": "saved.json"}),
        rerun_step("gil", GilConfig(command=("python", "prog.py"), duration_s=3.0), "the program"),
        Step("show it", command="report", arguments={"source": "reports/x/run.json"}),
    ]
    calls = {call["index"]: call for call in box.next_calls(steps)}
    assert 0 not in calls  # prose stays text only
    assert calls[1]["tool"] == "bench" and calls[1]["arguments"] == {
        "baseline": FUSED, "candidate": TILED, "shapes": ["8x4096"], "profile": False}
    assert calls[1]["text"] == (f"glmfb bench {FUSED} {TILED} --shape 8x4096 --no-profile  "
                                "# reproduce on the worst shape")
    assert calls[2]["arguments"]["shapes"] == ["8x4096", "32x2048"] and calls[2]["arguments"]["profile"] is False
    assert calls[2]["arguments"]["budget"] == "12s"
    assert calls[3]["tool"] == "gap" and calls[3]["arguments"] == {
        "baseline": FUSED, "candidate": TILED, "repeats": 80, "budget": "80s"}
    assert calls[4]["arguments"] == {"target": FUSED, "args": {"shape": [8, 64]}, "duration": "15s"}
    assert calls[5] == {"index": 5, "text": shell_line(steps[5]), "why": "run it again", "intent": "confirm",
                        "tool": "run", "arguments": {"select": ["tiled-vs-fused"]}}
    assert "argument 'policy'" in calls[6]["error"] and "arguments" not in calls[6]  # ci.toml does not exist
    assert "OLD.json" in calls[7]["error"] and "arguments" not in calls[7]
    assert "--allow-commands" in calls[8]["error"]
    assert "unknown tool" in calls[9]["error"]
    for call in calls.values():
        if "arguments" in call:
            box.prepare(call["tool"], call["arguments"])  # passed straight back, accepted
    json.dumps(list(calls.values()))  # plain JSON


# --------------------------------------------------------------------------------------------
# Resources
# --------------------------------------------------------------------------------------------


def test_resources_serve_runs_and_stay_inside_their_run_folder(root: Path, tmp_path: Path) -> None:
    from glmfb.contract.verdict import Run, Verdict
    from glmfb.core.runs import start_run
    from glmfb.workflows.mcp import resources

    boundary = Boundary(root)
    run_dir = start_run(boundary.reports, "20260101-000000-abcd")
    run = Run(id="20260101-000000-abcd", started="now", verdicts=(Verdict.harness_error("bench", "x", "why"),))
    (run_dir / "run.json").write_text(json.dumps(run.to_dict()))
    (run_dir / "x").mkdir()
    (run_dir / "x" / "samples.json").write_text("{}")
    secret = tmp_path / "secret.txt"
    secret.write_text("no")
    (run_dir / "x" / "link.txt").symlink_to(secret)
    latest = resources.read(boundary, "glmfb://runs/latest")
    assert json.loads(latest.text or "")["id"] == run.id
    assert resources.read(boundary, f"glmfb://runs/{run.id}").text == latest.text
    assert resources.read(boundary, f"glmfb://runs/{run.id}/artifacts/x/samples.json").text == "{}"
    for uri in (f"glmfb://runs/{run.id}/artifacts/../../probes/bench.toml",
                f"glmfb://runs/{run.id}/artifacts/x/link.txt",
                f"glmfb://runs/{run.id}/artifacts/%2E%2E/%2E%2E/probes/bench.toml",
                "glmfb://runs/../probes", "file:///etc/passwd"):
        with pytest.raises(resources.ResourceError):
            resources.read(boundary, uri)
    with pytest.raises(resources.ResourceError, match="no such file"):
        resources.read(boundary, f"glmfb://runs/{run.id}/artifacts/x/missing.json")
    assert [item.uri for item in resources.list_runs(boundary)][1:] == ["glmfb://runs/latest",
                                                                        f"glmfb://runs/{run.id}"]


# --------------------------------------------------------------------------------------------
# The layer: nothing imports the server but its command; the server imports no CLI
# --------------------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_the_mcp_command_imports_the_server_and_the_server_imports_no_cli() -> None:
    glmfb = REPO / "glmfb"
    importers = sorted(str(path.relative_to(REPO)) for path in glmfb.rglob("*.py")
                       if path.relative_to(glmfb).parts[:2] != ("workflows", "mcp")
                       and any(name == "glmfb.workflows.mcp" or name.startswith("glmfb.workflows.mcp.") or name == "mcp"
                               or name.startswith("mcp.") for name in _imports(path)))
    # and --follow, which takes a step as the server takes its tool call (the tools, never the SDK)
    assert importers == ["glmfb/cli/commands/mcp.py", "glmfb/workflows/follow.py"]
    forbidden = ("typer", "click", "glmfb.cli", "glmfb.cli.commands")
    for path in (glmfb / "workflows" / "mcp").rglob("*.py"):
        bad = [name for name in _imports(path) if any(name == f or name.startswith(f + ".") for f in forbidden)]
        assert bad == [], (path, bad)


# --------------------------------------------------------------------------------------------
# In memory, through the SDK's client: errors are tool results, the toy probe runs
# --------------------------------------------------------------------------------------------


def test_in_memory_the_server_answers_bad_calls_with_tool_errors_and_runs_an_installed_probe(
        root: Path, toy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import anyio
    import jsonschema
    from mcp import Client

    from glmfb.core.documents import json_schema
    from glmfb.workflows.mcp.server import GlmfbServer

    monkeypatch.chdir(root)
    server = GlmfbServer(Boundary(root))

    async def session() -> None:
        async with Client(server.server) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert {"diff", "bench", "gil", "gap", "toy", "capture", "run", "gate", "list_probes",
                    "explain"} <= set(listed)
            bad = await client.call_tool("bench", {"baseline": "/etc/hostname", "candidate": TILED})
            assert bad.is_error and "argument 'baseline'" in bad.content[0].text  # type: ignore[union-attr]
            unknown = await client.call_tool("nope", {})
            assert unknown.is_error and "unknown tool" in unknown.content[0].text  # type: ignore[union-attr]
            result = await client.call_tool("toy", {"outcome": "fail", "kernel": "k", "name": "t"})
            assert not result.is_error
            data = result.structured_content
            assert isinstance(data, dict)
            jsonschema.validate(data["verdict"], json_schema())
            assert data["verdict"]["status"] == "fail" and data["verdict"]["where"] == {"kernel": "k"}
            assert (root / data["run"]["folder"] / "run.json").is_file()
            again = await client.read_resource(data["run"]["uri"])
            assert json.loads(again.contents[0].text)["verdicts"][0]["name"] == "t"  # type: ignore[union-attr]

    anyio.run(session)
    assert os.getcwd() == str(root)


def test_run_refuses_command_line_definitions_without_allow_commands_and_stops_when_cancelled(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    from glmfb.workflows.mcp.tools import CallContext

    (root / "probes" / "gil.toml").write_text(
        '[[probe]]\nname = "gil-cmd"\nprobe = "gil"\ncommand = ["python", "-c", "pass"]\n'
        'options = { duration = 1 }\nexpect = { status = "pass" }\n')
    monkeypatch.chdir(root)
    box = toolbox(root)
    cancel = threading.Event()

    def context(run_id: str) -> CallContext:
        return CallContext(run_id=run_id, progress=lambda message: None, cancel=cancel,
                           deadline=time.monotonic() + 60, slot=threading.Lock())

    answer = box.prepare("run", {"select": ["gil-cmd"]}).work(context("r1"))
    [verdict] = answer.structured["run"]["verdicts"]
    assert verdict["status"] == "error" and "--allow-commands" in verdict["why"] and verdict["expect_met"] is False
    cancel.set()  # cancelled before it starts: nothing runs, each definition says why
    answer = box.prepare("run", {}).work(context("r2"))
    run = answer.structured["run"]
    assert run["interrupted"] is True
    assert {v["why"] for v in run["verdicts"]} == {"not run: the call was cancelled"}
    assert (root / "reports" / "r2" / "run.json").is_file() and (root / "reports" / "r2" / "report.html").is_file()


def test_a_probe_waits_for_the_slot_within_its_budget_and_its_cancellation(root: Path) -> None:
    import threading
    import time

    from glmfb.workflows.mcp.tools import CallContext

    slot = threading.Lock()
    said: list[str] = []
    waiting = CallContext(run_id="r", progress=said.append, cancel=threading.Event(), deadline=time.monotonic() + 60,
                          slot=slot)
    assert waiting.take_slot() is None and slot.locked()  # free: taken at once
    waiting.cancel.set()
    assert "cancelled" in (waiting.take_slot() or "")  # held by another probe, and cancelled
    late = CallContext(run_id="r", progress=said.append, cancel=threading.Event(), deadline=time.monotonic() - 1,
                       slot=slot)
    assert "time budget ran out" in (late.take_slot() or "")
    slot.release()
