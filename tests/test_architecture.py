"""The data flow of docs/design.md, checked against the imports (every import, also the ones
inside functions; an import under ``if TYPE_CHECKING:`` is for the type checker only and does
not count): target -> probe engine -> Verdict -> (render | JSON | gate | report).

The checker is a function of a folder holding a ``glmfb`` tree, so a test can plant a wrong
import in a scratch copy and see it fail."""

from __future__ import annotations

import ast
import functools
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from glmfb.core.registry import BUILTIN_PROBES

GLMFB = Path(__file__).resolve().parents[1] / "glmfb"

# The engines are the packages of the registered built-in probes: a new probe's layering is
# checked as soon as it is registered.
ENGINES = tuple(sorted({ref.partition(":")[0].rpartition(".")[0] for _, ref in BUILTIN_PROBES}))
# the engines' public faces for code outside glmfb (an engine recording its own capture)
FACES = ("glmfb.capture",)

# The layer table of docs/design.md, bottom first, read from the folders: a layer is a folder
# of glmfb (the engines are the probe packages), and a module may import its own layer and
# the layers below it. A name covers the module and, for a package, everything in it.
LAYER_FOLDERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("contract", ("glmfb.contract",)),
    ("probe API", ("glmfb.core",)),
    ("engines", (*ENGINES, *FACES)),
    ("suite, reports, gate, agent server", ("glmfb.workflows",)),
    ("CLI", ("glmfb.cli",)),
)
# glmfb's own top level: the version, ``python -m glmfb``, and the public paths a probe or a
# rule in another package imports (each re-exports one module of a layer folder)
TOP_LEVEL = ("glmfb", "glmfb.__main__")


def public_paths(root: Path) -> dict[str, str]:
    """Each module at glmfb's top level that re-exports a module of a layer folder -> that
    module (``glmfb.contract.verdict`` -> ``glmfb.contract.verdict``)."""
    found = {}
    for path in sorted((root / "glmfb").glob("*.py")):
        name = module_name(path, root)
        if name in TOP_LEVEL:
            continue
        imports = [node for node in ast.parse(path.read_text(encoding="utf-8")).body
                   if isinstance(node, ast.ImportFrom)]
        if len(imports) == 1 and imports[0].module and [a.name for a in imports[0].names] == ["*"]:
            found[name] = imports[0].module
    return found


@functools.cache
def layers(root: Path) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """:data:`LAYER_FOLDERS` with the top level placed: the version in the contract, the public
    paths in the layer of what they re-export, ``__main__`` in the CLI's."""
    table = [(label, list(names)) for label, names in LAYER_FOLDERS]
    table[0][1].append("glmfb")
    table[-1][1].append("glmfb.__main__")
    for public, module in public_paths(root).items():
        index = next(i for i, (_, names) in enumerate(LAYER_FOLDERS)
                     if any(module == n or module.startswith(n + ".") for n in names))
        table[index][1].append(public)
    return tuple((label, tuple(names)) for label, names in table)


CLI_ONLY = ("typer", "click")  # imported by the CLI layer only


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_files(root: Path) -> dict[str, Path]:
    """Every module of the ``glmfb`` tree under ``root`` (not the code that runs inside a
    traced program, ``gil/_site``)."""
    return {module_name(p, root): p for p in sorted((root / "glmfb").rglob("*.py")) if "_site" not in p.parts}


def _nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node``, at module level and inside functions, except the bodies of
    ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for other in child.orelse:
                yield other
                yield from _nodes(other)
            continue
        yield child
        yield from _nodes(child)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The modules a module imports: ``from pkg import sub`` is an import of ``pkg.sub`` when
    ``sub`` is a module (a dependency on that code, not on the package's ``__init__``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in _nodes(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module]) if module else ".".join(base)
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module)
    return found - {name}


@functools.cache
def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the glmfb modules it imports (read once per tree)."""
    files = module_files(root)
    known = set(files)
    return {name: imports_of(path, name, known) for name, path in files.items()}


LAYERS = layers(GLMFB.parent)


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of the longest name that covers ``module``."""
    matches = [(len(name), index) for index, (_, names) in enumerate(LAYERS) for name in names
               if module == name or (name != "glmfb" and module.startswith(name + "."))]
    return max(matches)[1] if matches else None


def layer_violations(root: Path) -> list[str]:
    """Each import that goes up the layer table (or into typer from below the CLI), and each
    module the table does not place."""
    found = []
    for module, imported in sorted(import_graph(root).items()):
        here = layer_of(module)
        if here is None:
            found.append(f"{module} is in no layer of the table")
            continue
        for name in sorted(imported):
            if name.split(".")[0] in CLI_ONLY and here < len(LAYERS) - 1:
                found.append(f"{module} ({LAYERS[here][0]}) imports {name} (CLI only)")
            there = layer_of(name) if name.split(".")[0] == "glmfb" else None
            if there is not None and there > here:
                found.append(f"{module} ({LAYERS[here][0]}) imports {name} ({LAYERS[there][0]})")
    return found


def import_cycles(root: Path) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in graph:
                continue
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                other = stack.pop()
                group.append(other)
                if other == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


def engine_of(module: str) -> str | None:
    return next((engine for engine in ENGINES if module == engine or module.startswith(engine + ".")), None)


def engine_crossings(root: Path) -> list[str]:
    """Each import from one engine into another that is neither that engine's package (the API
    its ``__init__`` declares) nor its evidence module (read through the types)."""
    found = []
    for module, imported in sorted(import_graph(root).items()):
        here = engine_of(module)
        for name in sorted(imported):
            there = engine_of(name)
            if here is not None and there is not None and there != here and name not in (there, f"{there}.evidence"):
                found.append(f"{module} imports {name}, not {there}'s API")
    return found


def test_an_engine_uses_another_only_through_its_api_and_its_evidence(tmp_path: Path) -> None:
    """gap runs gil: it imports ``glmfb.gil`` (GilConfig, trace_gil, describe_threads,
    SOURCE_LINE, timeline_plot) and ``glmfb.gil.evidence``, never gil's internals."""
    assert engine_crossings(GLMFB.parent) == []
    shutil.copytree(GLMFB, tmp_path / "glmfb", ignore=shutil.ignore_patterns("__pycache__", "_site"))
    plots = tmp_path / "glmfb" / "gap" / "plots.py"
    plots.write_text(plots.read_text() + "\n\ndef _planted():\n    from glmfb.gil.groups import describe\n")
    assert engine_crossings(tmp_path) == ["glmfb.gap.plots imports glmfb.gil.groups, not glmfb.gil's API"]


def test_the_engines_come_from_the_registry() -> None:
    assert len(ENGINES) == len(BUILTIN_PROBES)
    assert all((GLMFB.parent / engine.replace(".", "/") / "__init__.py").is_file() for engine in ENGINES)


def misplaced(root: Path) -> list[str]:
    """Each module or package at glmfb's top level that is neither a layer folder, an engine,
    the version, ``__main__`` nor a public path."""
    placed = {name for _, names in LAYER_FOLDERS for name in names} | set(TOP_LEVEL) | set(public_paths(root))
    return sorted(f"glmfb.{path.stem}" for path in (root / "glmfb").iterdir()
                  if (path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").is_file()))
                  and module_name(path / "__init__.py" if path.is_dir() else path, root) not in placed)


def test_the_top_level_holds_the_layer_folders_the_engines_and_the_public_paths(tmp_path: Path) -> None:
    assert misplaced(GLMFB.parent) == []
    shutil.copytree(GLMFB, tmp_path / "glmfb", ignore=shutil.ignore_patterns("__pycache__", "_site"))
    (tmp_path / "glmfb" / "helpers.py").write_text("from glmfb.contract.units import parse_shape\n")
    assert misplaced(tmp_path) == ["glmfb.helpers"]


def test_a_public_path_is_the_module_it_names() -> None:
    """``glmfb.contract.verdict``, ``glmfb.core.probe``, ``glmfb.core.rules`` ... give a probe outside glmfb the
    same objects as the layer folder's module, every public name of it; and every glmfb module
    the toy probe (a probe of another package, tests/toy) imports is one of them."""
    import importlib

    paths = public_paths(GLMFB.parent)
    toy = Path(__file__).parent / "toy"
    used = {name for path in toy.glob("*.py") for name in imports_of(path, path.stem, set()) if name.startswith("glmfb.")}
    assert used and used <= set(paths), used - set(paths)
    for public, module in paths.items():
        inner, outer = importlib.import_module(module), importlib.import_module(public)
        names = [n for n in vars(inner) if not n.startswith("_")]
        assert names and all(getattr(outer, n) is getattr(inner, n) for n in names), public


def test_every_module_imports_only_its_layer_and_the_layers_below() -> None:
    assert layer_violations(GLMFB.parent) == []


def test_no_import_cycle() -> None:
    assert import_cycles(GLMFB.parent) == []


def test_the_checker_fails_on_planted_wrong_imports(tmp_path: Path) -> None:
    shutil.copytree(GLMFB, tmp_path / "glmfb", ignore=shutil.ignore_patterns("__pycache__", "_site"))
    engine = tmp_path / "glmfb" / "diff" / "engine.py"
    engine.write_text(engine.read_text() + "\n\ndef _planted():\n    from glmfb.workflows.report.html import write_html\n")
    verdict = tmp_path / "glmfb" / "contract" / "verdict.py"
    verdict.write_text(verdict.read_text() + "\n\ndef _planted():\n    from glmfb.core.probe import known_kinds\n")
    assert layer_violations(tmp_path) == [
        "glmfb.contract.verdict (contract) imports glmfb.core.probe (probe API)",
        "glmfb.diff.engine (engines) imports glmfb.workflows.report.html (suite, reports, gate, agent server)",
    ]
    assert any({"glmfb.core.probe", "glmfb.contract.verdict"} <= set(group) for group in import_cycles(tmp_path))


def test_an_import_for_the_type_checker_only_does_not_count(tmp_path: Path) -> None:
    shutil.copytree(GLMFB, tmp_path / "glmfb", ignore=shutil.ignore_patterns("__pycache__", "_site"))
    errors = tmp_path / "glmfb" / "contract" / "errors.py"
    errors.write_text(errors.read_text() + "\nif TYPE_CHECKING:\n    from glmfb.core.probe import Probe\n")
    assert layer_violations(tmp_path) == []


def test_reading_a_document_imports_only_the_contract() -> None:
    """Importing the contract loads nothing above it; an untyped read (the gate) loads no probe."""
    code = ("import sys, glmfb.contract.verdict as v; v.load_document({'schema': 'glmfb.run/2', 'id': 'r', 'started': '', "
            "'verdicts': []}, typed=False); print(sorted(m for m in sys.modules if m.startswith('glmfb')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = eval(result.stdout)
    assert {layer_of(name) for name in loaded} == {0}, loaded


def test_typer_and_the_mcp_sdk_stay_in_their_layers() -> None:
    graph = import_graph(GLMFB.parent)
    mcp_sdk = sorted(m for m, names in graph.items() if any(n.split(".")[0] == "mcp" for n in names))
    assert all(m.startswith("glmfb.workflows.mcp.") for m in mcp_sdk), mcp_sdk
    into_mcp = sorted(m for m, names in graph.items()
                      if not m.startswith("glmfb.workflows.mcp") and any(n.startswith("glmfb.workflows.mcp") for n in names))
    # besides the command that starts the server, only --follow (it takes a step as the server takes its tool call)
    assert into_mcp == ["glmfb.cli.commands.mcp", "glmfb.workflows.follow"]


def test_engines_do_not_print_or_exit() -> None:
    calls = []
    for path in sorted(p for engine in ENGINES for p in (GLMFB.parent / engine.replace(".", "/")).rglob("*.py")):
        if "_site" in path.parts or (path.name == "target_loop.py" and path.parent.name == "gil"):
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
