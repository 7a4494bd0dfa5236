"""The registry (glmfb.core.registry) and the command table (glmfb.cli.COMMANDS): which probe kinds
exist and what `glmfb --help` lists, read without importing a probe or a command's module."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from glmfb.core.probe import get_probe
from glmfb.core.registry import BUILTIN_PROBES, command_list, entry_points, known_kinds

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("group", ["console_scripts", "pytest11", "glmfb.probes", "glmfb.rules", "vllm.general_plugins"])
def test_entry_points_read_from_the_dist_folders_are_importlib_metadatas(group: str, toy: Path) -> None:
    """The fast reader finds what importlib.metadata finds, in this environment and with the
    toy's dist-info on the path (the first distribution of a name on the path wins there too)."""
    ours = sorted((name, value) for name, value, _ in entry_points(group))
    theirs = sorted((entry.name, entry.value) for entry in importlib.metadata.entry_points(group=group))
    assert ours == theirs
    if group == "glmfb.probes":
        assert ("toy", "toy_probe:PROBE") in ours


def test_the_command_list_is_what_each_probe_declares(toy: Path) -> None:
    """A built-in probe's line comes from its package (no probe imported), and is the probe's
    own summary; an installed probe's from the probe; each command a probe brings is listed."""
    listed = dict(command_list())
    for kind in known_kinds():
        probe = get_probe(kind)
        assert listed[kind] == probe.summary
        for command in probe.commands:
            assert listed[command.name] == command.summary
    assert {"capture", "toy"} <= set(listed)
    assert [kind for kind, _ in BUILTIN_PROBES] == [name for name, _ in command_list()][:len(BUILTIN_PROBES)]


def _modules_loaded(*argv: str) -> list[str]:
    code = ("import sys, json\nsys.argv = ['glmfb', *json.loads(sys.argv[1])]\nfrom glmfb.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write(json.dumps(sorted(m for m in sys.modules if m.startswith(('glmfb', 'rich', 'torch')))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(list(argv))], capture_output=True, text=True,
                          check=False, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return list(json.loads(done.stderr.strip().splitlines()[-1]))


def test_help_imports_no_command_no_probe_and_not_the_contract() -> None:
    """`glmfb --help` lists every command from the tables: the commands' modules, the probes,
    the verdict contract and rich stay unimported (the start-up figure is benchmarks/startup.py's)."""
    loaded = _modules_loaded("--help")
    assert not [name for name in loaded if name.startswith(("glmfb.cli.commands.", "glmfb.contract.verdict", "glmfb.core.probe",
                                                              "glmfb.diff.", "glmfb.bench.", "rich", "torch"))], loaded


def test_a_command_imports_its_own_module_only() -> None:
    loaded = _modules_loaded("schema", "history")
    assert "glmfb.cli.commands.schema" in loaded
    assert not [name for name in loaded if name in ("glmfb.cli.commands.run", "glmfb.cli.commands.gate",
                                                      "glmfb.cli.commands.bisect", "glmfb.cli.commands.mcp")], loaded


def test_the_gate_in_a_log_loads_neither_rich_nor_the_evidence_kinds(tmp_path: Path) -> None:
    """`glmfb gate` with its output going to a log reads the run untyped and writes the summary's
    lines plain: rich and the contract's evidence kinds stay unimported; with FORCE_COLOR (or a
    terminal) rich draws the same lines."""
    from glmfb.contract.verdict import Layer, Run, Status, Verdict

    run = Run(id="r", started="2026-12-06T00:00:00+00:00", verdicts=(
        Verdict(probe="bench", name="k", status=Status.FAIL, layer=Layer.KERNEL, why="slower by 20%",
                evidence=[{"kind": "process_exit", "returncode": 1}]),
    ))
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run.to_dict()))
    loaded = _modules_loaded("gate", str(path))
    assert "glmfb.cli.commands.gate" in loaded
    assert not [name for name in loaded if name.startswith(("rich", "glmfb.contract.evidence"))], loaded
    plain = subprocess.run([sys.executable, "-m", "glmfb", "gate", str(path)], capture_output=True, text=True,
                           cwd=ROOT, check=False)
    coloured = subprocess.run([sys.executable, "-m", "glmfb", "gate", str(path)], capture_output=True, text=True,
                              cwd=ROOT, check=False, env={**os.environ, "FORCE_COLOR": "1", "COLUMNS": "200"})
    assert plain.returncode == coloured.returncode == 1
    assert plain.stdout == "glmfb gate failed (exit 1): 1 failed\n  failed: k: slower by 20%\n"
    assert "\x1b[" in coloured.stdout
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured.stdout) == plain.stdout
