"""Next steps as data against the real CLI: every argument a command's :class:`Signature`
writes is a parameter of that click command (no drift), the steps engines build parse back
through the CLI to the values they carry (the CLI parses; nothing here does), old run files
with string steps still read, and an agent can take a failing verdict's steps as tool calls."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import typer

import glmfb.cli
from glmfb.bench.config import BenchConfig
from glmfb.bench.engine import next_steps as bench_steps
from glmfb.cli.commands.probes import spec_from_command_line
from glmfb.contract.options import options_of, parse_table
from glmfb.contract.step import Step
from glmfb.contract.verdict import Run, Status, Verdict, load_document
from glmfb.core.commandline import (
    Signature,
    argv,
    command_line,
    rerun_step,
    run_step,
    shell_line,
    signature,
)
from glmfb.core.probe import Probe, get_probe
from glmfb.core.registry import known_kinds
from glmfb.core.targets import Target
from glmfb.diff.config import DiffConfig
from glmfb.diff.engine import reproducer_step
from glmfb.gap.config import GapConfig
from glmfb.gap.engine import next_steps as gap_steps
from glmfb.gil.config import GilConfig
from glmfb.gil.engine import trace_step

REPO = Path(__file__).resolve().parents[1]
KERNELS = "scenarios/decode_norm/kernels.py"
FUSED = f"{KERNELS}:gated_norm_fused"
TILED = f"{KERNELS}:gated_norm_tiled"
# how to show or keep, not what to run (--no-history: whether to keep; --history URL, where, is
# in the signatures, so a step may say which store its rerun records into)
OUTPUT_ONLY = {"as_json", "out", "csv", "verbose", "junit", "summary", "no_history"}


def cli_command(name: str) -> Any:
    """The CLI's own command (typer's click: the parameters ``glmfb NAME`` really parses)."""
    group: Any = typer.main.get_command(glmfb.cli.app)
    command = group.get_command(typer.Context(group), name)
    assert command is not None, f"the CLI has no command {name!r}"
    return command


def signatures() -> list[Signature]:
    names = ["run", "gate", "bisect", *known_kinds(), "capture"]
    return [sig for sig in map(signature, names) if sig is not None]  # capture: once a probe brings it


# --------------------------------------------------------------------------------------------
# No drift: the signatures are the CLI's own parameters
# --------------------------------------------------------------------------------------------


def _check_signature(sig: Signature) -> None:
    command = cli_command(sig.command)
    options = {opt: p for p in command.params if p.param_type_name == "option" for opt in (*p.opts, *p.secondary_opts)}
    arguments = [p.name for p in command.params if p.param_type_name == "argument"]
    assert arguments == [*sig.positional, *([sig.rest] if sig.rest else [])], sig.command
    repeatable = {spec.key for kind in known_kinds() for spec in options_of(get_probe(kind).config_type)
                  if spec.type.repeatable}
    for name, flag in sig.flags.items():
        assert flag in options and not options[flag].is_flag, (sig.command, name, flag)
        if name in repeatable or name == "select":
            assert options[flag].multiple, (sig.command, name, flag)
    for name, flag in sig.kwargs.items():
        assert flag in options and options[flag].multiple, (sig.command, name, flag)
    for name, flag in sig.switches.items():
        assert flag in options and options[flag].is_flag, (sig.command, name, flag)
        assert "--no-" + flag.removeprefix("--") in options[flag].secondary_opts, (sig.command, name)
    # and back: every parameter of the CLI that says what to run is in the signature
    written = {*sig.flags.values(), *sig.kwargs.values(), *sig.switches.values()}
    for param in command.params:
        if param.param_type_name == "option" and param.name not in OUTPUT_ONLY:
            assert set(param.opts) & written, (sig.command, param.opts)


def test_every_signature_argument_is_a_parameter_of_the_real_cli_command() -> None:
    checked = signatures()
    assert {"run", "gate", "bisect", "diff", "bench", "gil", "gap"} <= {sig.command for sig in checked}
    for sig in checked:
        _check_signature(sig)


def test_an_installed_probes_signature_matches_its_generated_command(toy: Path) -> None:
    sig = signature("toy")
    assert sig is not None and sig.flags["threshold"] == "--threshold" and sig.flags["target"] == "--target"
    _check_signature(sig)


# --------------------------------------------------------------------------------------------
# Round trip: a step's command line, parsed by the CLI, gives back the step's values
# --------------------------------------------------------------------------------------------


def _parsed(step: Step) -> dict[str, Any]:
    words = argv(step)
    assert words[:2] == ["glmfb", step.command]
    assert step.command is not None
    return cli_command(step.command).make_context(step.command, words[2:]).params


def _cli_spec(probe: Probe, step: Step) -> Any:
    """What the CLI makes of the step's command line: the probe's spec, as ``glmfb <kind>``
    builds it from its parsed parameters."""
    return spec_from_command_line(probe, _parsed(step))


def assert_round_trip(step: Step, config: Any | None = None) -> None:
    """The CLI reads the step's line as the agent tool reads its arguments; and, given the
    config the step reruns unchanged, builds that config again."""
    assert step.command is not None
    probe = get_probe(step.command)
    spec = _cli_spec(probe, step)
    arguments = dict(step.arguments)
    keys = {s.key for s in options_of(probe.config_type)}
    assert spec.options == parse_table(probe.config_type, {k: v for k, v in arguments.items() if k in keys}, "step")
    for which in ("baseline", "candidate", "target"):
        assert getattr(spec, which) == arguments.get(which), which
    for which in ("args", "baseline_args", "candidate_args"):
        assert dict(getattr(spec, which)) == arguments.get(which, {}), which
    assert list(spec.command) == arguments.get("command", [])
    assert set(arguments) - keys <= {"baseline", "candidate", "target", "command", "args", "baseline_args",
                                     "candidate_args"}
    if config is not None:
        rebuilt = probe.build(dataclasses.replace(spec, name=config.name))
        assert rebuilt == config


BENCH = BenchConfig("b", Target(str(REPO / FUSED), {"eps": 1e-5}), Target(str(REPO / TILED), {"eps": 1e-5}),
                    shapes=((8, 4096), (32, 2048)), threshold=0.07, budget_s=12.0, profile=False, sample_ms=0.5,
                    seed=5, save=Path("saved.json"))


def test_bench_steps_round_trip_through_the_cli() -> None:
    steps = bench_steps(BENCH, "8x4096", 13.5)
    reproduce, more = steps["reproduce"], steps["more_evidence"]
    assert reproduce is not None and more is not None
    assert reproduce.arguments == {"baseline": str(REPO / FUSED), "candidate": str(REPO / TILED), "args": {"eps": 1e-5},
                                   "shapes": ["8x4096"], "threshold": "7%", "budget": "12s", "sample_ms": "0.5ms",
                                   "profile": False, "seed": 5}
    assert more.arguments["budget"] == "13.5s" and more.arguments["shapes"] == ["8x4096", "32x2048"]
    assert "save" not in more.arguments  # a rerun never overwrites the saved file
    for step in (reproduce, more):
        assert_round_trip(step)
    assert_round_trip(rerun_step("bench", BENCH, "the same"), BENCH)
    split = dataclasses.replace(BENCH, candidate=Target(str(REPO / TILED), {"eps": 1e-6, "block": 64}))
    step = rerun_step("bench", split, "sides with their own arguments")
    assert step.arguments["baseline_args"] == {"eps": 1e-5} and step.arguments["candidate_args"]["block"] == 64
    assert_round_trip(step, split)


def test_gil_steps_round_trip_through_the_cli() -> None:
    target = GilConfig(name="gil", target=Target(str(REPO / FUSED), {"shape": [8, 64]}), duration_s=2.5,
                       rate_hz=250, starvation_p99_ms=20.0, native=False)
    step = trace_step(target)
    assert step is not None and step.arguments == {
        "target": str(REPO / FUSED), "args": {"shape": [8, 64]}, "duration": "2.5s", "rate": 250,
        "starvation_p99": "20ms", "native": False, "trace": True}
    assert_round_trip(step)
    assert_round_trip(rerun_step("gil", target, "the same"), target)
    program = GilConfig(name="gil", command=("python", "-c", "import time; time.sleep(9)"), duration_s=3.0)
    step = rerun_step("gil", program, "the same")
    assert command_line(step) == "glmfb gil --duration 3s -- python -c 'import time; time.sleep(9)'"
    assert_round_trip(step, program)


def test_diff_steps_round_trip_through_the_cli(tmp_path: Path) -> None:
    requests = tmp_path / "minimal.jsonl"
    requests.write_text('{"id": "r1", "length": 4}\n')
    config = DiffConfig("diff", str(REPO / FUSED), str(REPO / TILED), baseline_args={"eps": 1e-5},
                        candidate_args={"eps": 1e-5, "precision": "ieee"}, requests=tmp_path / "all.jsonl",
                        rtol=1e-3, per_tap=(("layers.*", 1e-3, None), ("norm", None, 1e-6)), taps=("layers.*",),
                        counterfactuals=(("precision", ("ieee", "tf32x3")), ("fast", (True,))), minimize=True,
                        localize=False, candidate_nproc=2, rank_timeout_s=90.0)
    step = reproducer_step(config, requests)
    assert step.arguments["requests"] == str(requests) and "counterfactuals" not in step.arguments
    assert step.arguments["tolerances"] == ["layers.*=0.001,", "norm=,1e-06"]
    assert step.arguments["rank_timeout"] == "90s" and step.arguments["candidate_nproc"] == 2
    assert_round_trip(step)
    assert_round_trip(rerun_step("diff", config, "the same"))  # the counterfactuals too
    assert rerun_step("diff", config, "x").arguments["counterfactuals"] == ["precision=ieee,tf32x3", "fast=true"]


def test_gap_steps_round_trip_through_the_cli() -> None:
    config = GapConfig("gap", Target(str(REPO / FUSED)), Target(str(REPO / TILED), {"layers": 4}), threshold=0.1,
                       repeats=30, budget_s=20.0, gil_rate_hz=150.0)
    steps = gap_steps(config, attributed=True)
    assert steps["more_evidence"] is not None and steps["more_evidence"].arguments["repeats"] == 60
    assert steps["more_evidence"].arguments["budget"] == "40s"
    gil = steps["gil_rerun"]
    assert gil is not None and gil.command == "gil"
    assert gil.arguments == {"target": str(REPO / TILED), "args": {"layers": 4}, "duration": "15s", "rate": 150}
    for step in steps.values():
        assert step is not None
        assert_round_trip(step)
    assert_round_trip(rerun_step("gap", config, "the same"), config)


def test_an_installed_probes_step_round_trips(toy: Path) -> None:
    config = get_probe("toy").config_type(name="toy", target=Target(str(REPO / FUSED)), outcome="fail",
                                          threshold=0.125)
    step = rerun_step("toy", config, "again", kernel="k")
    assert step.arguments == {"target": str(REPO / FUSED), "outcome": "fail", "threshold": "12.5%", "kernel": "k"}
    assert_round_trip(step)
    assert_round_trip(rerun_step("toy", config, "the same"), config)


def test_run_and_gate_steps_round_trip_through_the_cli() -> None:
    step = run_step(["tiled-vs-fused", "gil-*"])
    assert shell_line(step) == "glmfb run -k tiled-vs-fused -k 'gil-*'  # run it again"
    assert list(_parsed(step)["select"]) == ["tiled-vs-fused", "gil-*"]
    gate = Step("gate the run", command="gate", arguments={"source": "reports/x/run.json", "policy": "ci.toml"})
    params = _parsed(gate)
    assert (list(params["source"]), params["policy"]) == (["reports/x/run.json"], "ci.toml")
    shards = Step("gate the shards", command="gate", arguments={"source": ["reports-1", "reports-2", "reports-3"]})
    assert shell_line(shards) == "glmfb gate reports-1 reports-2 reports-3  # gate the shards"
    assert list(_parsed(shards)["source"]) == ["reports-1", "reports-2", "reports-3"]
    sharded = Step("run one shard", command="run", arguments={"paths": ["probes"], "shard": "2/3"})
    assert shell_line(sharded) == "glmfb run probes --shard 2/3  # run one shard"
    assert _parsed(sharded)["shard"] == "2/3"


def test_overrides_take_any_form_the_option_parses_and_none_leaves_one_out() -> None:
    typed = rerun_step("bench", BENCH, "x", shapes=((8, 4096),), budget=12.0, threshold=0.05)
    written = rerun_step("bench", BENCH, "x", shapes=["8x4096"], budget="12s", threshold="5%")
    assert typed == written and "threshold" in written.arguments  # an override is kept, even at the default
    assert "save" not in rerun_step("bench", BENCH, "x", save=None).arguments
    with pytest.raises(Exception, match="ambiguous"):
        rerun_step("bench", BENCH, "x", threshold=5)


# --------------------------------------------------------------------------------------------
# Old files, and agents
# --------------------------------------------------------------------------------------------


def test_an_old_run_file_with_string_steps_reads_as_plain_steps_and_writes_as_v2() -> None:
    old = {"schema": "glmfb.run/1", "id": "r1", "started": "2026-01-01T00:00:00+00:00", "finished": None,
           "verdicts": [{"schema": "glmfb.verdict/1", "probe": "bench", "name": "b", "status": "fail",
                         "layer": "kernel", "where": {}, "why": "slower", "metric": None, "evidence": [],
                         "next": ["glmfb bench a.py:f b.py:g --shape 8x4096  # reproduce", "fuse the kernels"],
                         "artifacts": {}, "env": {}, "duration_s": 1.0}]}
    run = load_document(json.loads(json.dumps(old)))
    (verdict,) = run.verdicts
    assert verdict.next == (Step("glmfb bench a.py:f b.py:g --shape 8x4096  # reproduce"), Step("fuse the kernels"))
    assert not any(step.is_call for step in verdict.next)  # never parsed back into a command
    written = run.to_dict()
    assert written["schema"] == "glmfb.run/2" and written["verdicts"][0]["schema"] == "glmfb.verdict/2"
    assert written["verdicts"][0]["next"][1] == {"why": "fuse the kernels"}
    assert load_document(json.loads(json.dumps(written))) == run


@pytest.fixture
def root(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / KERNELS).parent.mkdir(parents=True)
    shutil.copy(REPO / KERNELS, project / KERNELS)
    return project


def test_a_failing_verdicts_steps_are_tool_calls_the_toolbox_accepts(root: Path) -> None:
    pytest.importorskip("mcp")
    from glmfb.bench.rules import RULES as BENCH_RULES
    from glmfb.bench.rules import BenchFindings, ShapeOutcome
    from glmfb.core.rules import diagnose
    from glmfb.gil.heartbeat import Heartbeat
    from glmfb.gil.pyspy import parse_raw, profile_holders
    from glmfb.gil.verdict import Observations, decide
    from glmfb.workflows.mcp.boundary import Boundary
    from glmfb.workflows.mcp.tools import Toolbox

    box = Toolbox(Boundary(root))
    # bench: a regression on 8x4096 that one shape leaves undecided, the engine's steps
    config = BenchConfig("b", Target(FUSED), Target(TILED), shapes=((8, 4096), (32, 2048)), budget_s=2.0)
    shapes = (ShapeOutcome("8x4096", "regression", 0.4, 0.35, 0.45, blocks=40),
              ShapeOutcome("32x2048", "equivalent", 0.0, -0.01, 0.01, blocks=40))
    findings = BenchFindings(baseline="gated_norm_fused", candidate="gated_norm_tiled", threshold=0.05, budget_s=2.0,
                             shapes=shapes, focus="8x4096", **bench_steps(config, "8x4096", 8.0))
    bench = diagnose(BENCH_RULES, findings).diagnosis
    assert bench.status is Status.FAIL
    # gil: a thread starved by a busy holder, on a target (so the trace rerun is a step)
    gil_config = GilConfig(name="gil", target=Target(FUSED, {"shape": [8, 64]}), duration_s=2.0)
    raw = ("thread (10): log-scanner;Thread.run (/usr/lib/python3.11/threading.py:982);scan_logs (/src/p.py:11);"
           "_sre_SRE_Pattern_match (libpython3.11.so.1.0) 90\nthread (11): ticker;tick (/src/p.py:17) 2\n")
    lateness = [0.2] * 50 + [200.0] * 50
    wake = [100.0 + 0.001 * (i + 1) + sum(lateness[: i + 1]) / 1e3 for i in range(len(lateness))]
    observations = Observations(
        config=gil_config, heartbeat=Heartbeat(1, 7, 0.001, {7: "glmfb-heartbeat"}, tuple(wake),
                                               tuple(x / 1e3 for x in lateness)),
        holders=profile_holders(parse_raw(raw), native=True, names={}, exclude_tids=set()),
        waiting=[{"thread": "kv-transfer", "tid": 4739, "waiting_share": 0.7}], reproduce_trace=trace_step(gil_config))
    gil: Verdict = decide(observations)
    assert gil.status is Status.FAIL
    for steps, tools in ((bench.next, {"bench"}), (gil.next, {"gil"})):
        calls = box.next_calls(steps)
        assert calls and {call["tool"] for call in calls} == tools
        for call in calls:
            assert "error" not in call, call
            step = steps[call["index"]]
            assert call["arguments"] == dict(step.arguments) and call["text"] == shell_line(step)
            box.prepare(call["tool"], call["arguments"])  # accepted as it is
    assert [s for s in gil.next if not s.is_call]  # the advice stays text
    assert any(call["arguments"].get("trace") is True for call in box.next_calls(gil.next))
    json.dumps(Run(id="r", started="now", verdicts=(gil,)).to_dict())  # steps are plain JSON


def test_a_non_finite_argument_stays_json_and_reads_back_a_number_on_the_cli() -> None:
    import math

    config = DiffConfig("diff", str(REPO / FUSED), str(REPO / TILED), candidate_args={"scale": math.nan})
    step = reproducer_step(config, Path("minimal.jsonl"))
    assert step.arguments["candidate_args"] == {"scale": "NaN"}
    json.dumps(step.to_dict(), allow_nan=False)  # a verdict stays strict JSON
    assert "scale=NaN" in argv(step)
    spec = _cli_spec(get_probe("diff"), step)
    assert math.isnan(spec.candidate_args["scale"])
