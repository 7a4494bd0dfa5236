"""The data flow of docs/design.md, checked against the imports (every import, also the ones
inside functions): target -> probe engine -> Verdict -> (render | JSON | gate | report)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GLMFB = Path(__file__).resolve().parents[1] / "glmfb"
ENGINES = ("diff", "bench", "gil", "gap")
# Layers above the engines: nothing below may import them.
CLI_LAYER = ("glmfb.cli", "glmfb.commands", "typer", "click")
SUITE_LAYER = ("glmfb.suite",)
REPORT_LAYER = ("glmfb.report", "glmfb.gate")


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    package = ".".join(path.relative_to(GLMFB.parent).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module]) if module else ".".join(base)
            names.add(module)
    return names


def modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (GLMFB / folder).rglob("*.py"))


def offending(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in paths:
        for name in imports_of(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(GLMFB.parent)} imports {name}")
    return found


@pytest.mark.parametrize("engine", ENGINES)
def test_engines_import_nothing_from_the_suite_the_cli_or_the_reports(engine: str) -> None:
    assert offending(modules(engine), CLI_LAYER + SUITE_LAYER + REPORT_LAYER) == []


def test_the_probe_api_and_the_host_do_not_import_the_layers_above() -> None:
    core = [GLMFB / name for name in ("probe.py", "host.py", "rules.py", "evidence.py", "options.py", "verdict.py",
                                      "targets.py", "units.py", "clock.py", "errors.py", "env.py", "io.py",
                                      "tables.py", "stats.py")]
    assert offending(core, CLI_LAYER + SUITE_LAYER + REPORT_LAYER) == []


def test_the_suite_and_the_gate_do_not_import_the_cli() -> None:
    assert offending([GLMFB / "suite.py", GLMFB / "gate.py", *modules("report")], CLI_LAYER) == []


def test_engines_do_not_print_or_exit() -> None:
    calls = []
    for path in modules(*ENGINES):
        if "_site" in path.parts or (path.name == "runner.py" and path.parent.name == "gil"):
            continue  # code that runs inside the traced child process, not in glmfb
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else (func.attr if isinstance(func, ast.Attribute) else "")
                owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
                if name == "print" or (owner == "sys" and name == "exit"):
                    calls.append(f"{path.relative_to(GLMFB.parent)}:{node.lineno} {owner + '.' if owner else ''}{name}")
    assert calls == []


def test_one_exception_type_for_failed_targets() -> None:
    raised = set()
    for path in GLMFB.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id in ("Exception", "BaseException") for b in node.bases
            ):
                raised.add(node.name)
    # the exceptions glmfb defines from Exception or BaseException directly: the user-error
    # family, TargetFailed, and two that never leave their module (a plot with no data, the
    # child process's SIGTERM)
    assert raised == {"GlmfbError", "TargetFailed", "NoData", "Stopped", "_Invalid"}, raised
