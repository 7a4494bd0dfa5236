"""Target references: ``package.module:attr`` or ``path/to/file.py:attr``, plus ``--arg k=v``.

What the attribute must be depends on the probe (docs/design.md, Targets); this module only finds
it, checks that it is callable, and turns ``k=v`` strings into keyword arguments.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from glmfb.contract.errors import InputError, TargetError, UsageError


def parse_arg(text: str) -> tuple[str, Any]:
    """``"k=v"`` -> ``("k", v)`` with ``v`` parsed as JSON where it parses, else the string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"--arg {text!r} is not key=value", "write it as --arg name=value")
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    except RecursionError:
        raise UsageError(f"--arg {key}: its JSON value is nested too deeply to read",
                         "give glmfb flatter data: no argument needs that depth") from None
    from glmfb.core.io import check_depth

    try:
        check_depth(value, f"--arg {key}")
    except InputError as exc:
        raise UsageError(str(exc), exc.hint) from None
    return key, value


def parse_args(items: Iterable[str]) -> dict[str, Any]:
    """Several ``k=v`` strings as a dict; a later key overrides an earlier one."""
    return dict(parse_arg(item) for item in items)


def side_args(
    common: Iterable[str], baseline: Iterable[str], candidate: Iterable[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments of each side of a comparison: ``--arg`` goes to both, the others to one."""
    shared = parse_args(common)
    return {**shared, **parse_args(baseline)}, {**shared, **parse_args(candidate)}


@dataclass(frozen=True)
class Target:
    """A resolvable reference and the keyword arguments its factory is called with."""

    ref: str
    args: Mapping[str, Any] = field(default_factory=dict)
    base_dir: Path | None = None  # relative file paths are tried here too (probe definitions)
    label: str | None = None  # how a why names this side where its caller knows better than its path (bisect: the commit)

    def load(self) -> Callable[..., Any]:
        return resolve(self.ref, base_dir=self.base_dir)

    def check(self) -> None:
        """What can be checked without importing the target: the reference's form, and that a
        file reference names a file that exists. Raises :class:`TargetError`."""
        location, _ = split_ref(self.ref)
        if is_file_ref(location):
            _find_file(location, self.base_dir)

    @property
    def portable_ref(self) -> str:
        """The reference as one would type it in the current directory (probe definitions
        write file paths relative to themselves), so that next steps are commands to paste."""
        return portable_ref(self.ref, self.base_dir)

    def describe(self) -> str:
        if not self.args:
            return self.portable_ref
        rendered = " ".join(f"--arg {k}={json.dumps(v)}" for k, v in self.args.items())
        return f"{self.portable_ref} {rendered}"


def portable_ref(ref: str, base_dir: Path | None) -> str:
    """``ref`` rewritten relative to the working directory when it names a file that only
    resolves against ``base_dir`` (see :meth:`Target.portable_ref`)."""
    location, sep, attr = ref.rpartition(":")
    if not sep or base_dir is None or not is_file_ref(location) or Path(location).is_absolute():
        return ref
    beside = base_dir / location
    if not beside.is_file():
        return ref
    if (Path.cwd() / location).resolve() == beside.resolve():
        return ref
    return f"{os.path.relpath(beside.resolve())}:{attr}"


def split_ref(ref: str) -> tuple[str, str]:
    """``"a/b.py:f"`` -> ``("a/b.py", "f")``; the attribute may be dotted (``Class.make``)."""
    location, sep, attr = ref.rpartition(":")
    if not sep or not location or not attr:
        raise TargetError(
            f"target {ref!r} has no ':attr'",
            "write it as package.module:attr or path/to/file.py:attr",
        )
    return location, attr


def is_file_ref(location: str) -> bool:
    return location.endswith(".py") or "/" in location or "\\" in location


def names_a_target(word: str) -> bool:
    """Whether a program's name given to glmfb is a target reference instead (``file.py:make``,
    ``pkg.mod:make``): a module and an attribute, and no program of that name on PATH."""
    import shutil

    location, sep, attr = word.rpartition(":")
    if not sep or not location or not all(part.isidentifier() for part in attr.split(".")):
        return False
    if not (location.endswith(".py") or all(part.isidentifier() for part in location.split("."))):
        return False
    return shutil.which(word) is None


def resolve(ref: str, *, base_dir: Path | None = None) -> Callable[..., Any]:
    """The callable a target reference names. Raises :class:`TargetError` with one clear line."""
    location, attr = split_ref(ref)
    if is_file_ref(location):
        module = _import_file(_find_file(location, base_dir), ref)
    else:
        module = _import_module(location, ref)
    obj: Any = module
    walked: list[str] = []
    for part in attr.split("."):
        walked.append(part)
        if not hasattr(obj, part):
            available = sorted(n for n in dir(obj) if not n.startswith("_"))[:8]
            raise TargetError(
                f"{location} has no attribute {'.'.join(walked)!r}",
                f"available: {', '.join(available)}" if available else "check the name",
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise TargetError(
            f"target {ref!r} is a {type(obj).__name__}, not callable",
            "point it at a factory function or class",
        )
    return obj


def _find_file(location: str, base_dir: Path | None) -> Path:
    path = Path(location)
    candidates = [path] if path.is_absolute() else [Path.cwd() / path]
    if base_dir is not None and not path.is_absolute():  # a definition's paths are relative to it first
        candidates.insert(0, base_dir / path)
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise TargetError(
        f"target file {location} not found",
        f"looked in {', '.join(str(c.parent) for c in candidates)}",
    )


def _append_path(folder: str) -> None:
    """A target's folder goes at the *end* of ``sys.path``: a sibling package of the target
    (a ``safetensors/`` or ``torch/`` folder beside it) cannot shadow what glmfb imports."""
    if folder not in sys.path:
        sys.path.append(folder)


def _import_error_line(exc: BaseException) -> str:
    text = "".join(str(exc).strip().splitlines()[-1:]) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def _import_module(name: str, ref: str) -> ModuleType:
    cwd = str(Path.cwd())
    _append_path(cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise TargetError(
                f"cannot import {name!r} for target {ref!r}: no module named {exc.name!r}",
                "check the module path, or run from the directory that holds the package",
            ) from exc
        raise TargetError(f"importing {name!r} failed: {_import_error_line(exc)}") from exc
    except (Exception, SystemExit) as exc:  # an error (or an exit) inside the user's module
        raise TargetError(f"importing {name!r} failed: {_import_error_line(exc)}") from exc


def _package_root(path: Path) -> tuple[Path, str]:
    """The directory to put on sys.path and the dotted name of the module at ``path``."""
    parts = [path.stem]
    directory = path.parent
    while (directory / "__init__.py").is_file():
        parts.insert(0, directory.name)
        directory = directory.parent
    return directory, ".".join(parts)


def import_file(path: Path, label: str) -> ModuleType:
    """Import a Python file (as a package module when it sits in one); ``label`` names it in
    errors. Raises :class:`TargetError` with one line."""
    return _import_file(path.resolve(), label)


def _import_file(path: Path, ref: str) -> ModuleType:
    root, dotted = _package_root(path)
    if "." in dotted:  # inside a package: import it as such, so relative imports work
        _append_path(str(root))
        return _import_module(dotted, ref)
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"{TARGET_MODULE_PREFIX}{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    _append_path(str(path.parent))
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[module_name]
        raise TargetError(f"importing {path} failed: {_import_error_line(exc)}") from exc
    return module


@dataclass(frozen=True)
class ImportFence:
    """Where the code a probe imports may come from, when it evaluates a checkout that is not
    the user's (``glmfb bisect`` runs each commit in a worktree of its own).

    Nothing may come from ``checkout`` (the user's working copy: an editable install of it, a
    folder of it on the import path). And when the two sides of a pair live in two worktrees
    (``sides``: label and folder), a module other than a target file is imported once for both:
    if its file differs between the two worktrees, one side ran the other's version. Target
    files are loaded by path under a name of their own, so each side gets its own."""

    checkout: str
    sides: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"checkout": self.checkout, "sides": [list(side) for side in self.sides]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ImportFence:
        return cls(str(data["checkout"]), tuple((str(label), str(folder)) for label, folder in data.get("sides", ())))

    def breach(self, modules: Mapping[str, Any] | None = None) -> str | None:
        """Why the modules imported so far (``sys.modules``) break the fence, in one sentence
        naming the module and its file, or None."""
        checkout = Path(self.checkout).resolve()
        sides = [(label, Path(folder).resolve()) for label, folder in self.sides]
        for name, module in sorted((modules if modules is not None else sys.modules).items()):
            filename = getattr(module, "__file__", None)
            if not isinstance(filename, str) or not os.path.isabs(filename):
                continue  # a name without a place (torch.classes says "_classes.py")
            path = Path(filename).resolve()
            if any(path.is_relative_to(folder) for _, folder in sides):
                problem = self._other_version(name, path, sides)
                if problem is not None:
                    return problem
            elif path.is_relative_to(checkout):
                return (f"{_module_label(name)} was imported from your checkout ({path}), not from the commit's "
                        "worktree, so the commit's code was not what ran; make the target load its code by a path "
                        "relative to itself, or install the package from the worktree with --setup")
        return None

    @staticmethod
    def _other_version(name: str, path: Path, sides: Sequence[tuple[str, Path]]) -> str | None:
        if name.startswith(TARGET_MODULE_PREFIX):
            return None  # a target file, loaded once per side
        here = next((label, folder) for label, folder in sides if path.is_relative_to(folder))
        relative = path.relative_to(here[1])
        for label, folder in sides:
            if folder == here[1]:
                continue
            other = folder / relative
            if not other.is_file() or other.read_bytes() != path.read_bytes():
                return (f"{_module_label(name)} ({relative}) was imported once, from {here[0]}'s worktree, for both "
                        f"sides, and {label}'s version differs: both sides ran {here[0]}'s; keep the code under test "
                        "in the target files, which are loaded once per side")
        return None


TARGET_MODULE_PREFIX = "glmfb_target_"


def _module_label(name: str) -> str:
    return "a target file" if name.startswith(TARGET_MODULE_PREFIX) else f"module {name!r}"


# --------------------------------------------------------------------------------------------
# How a verdict names the two sides of a comparison
# --------------------------------------------------------------------------------------------


def _location_parts(location: str, attr: str | None) -> tuple[list[str], str]:
    """A reference's location as path components and the separator that joins them: a file's
    folders and name (``/``), a module's dotted parts (``.``); a reference without an attribute
    (a folder, a saved file) is a path."""
    if attr is None or is_file_ref(location) or not location:
        normal = os.path.normpath(location) if location else location
        return [part for part in normal.replace("\\", "/").split("/") if part], "/"
    return location.split("."), "."


def _split_side(ref: str) -> tuple[str, str | None]:
    """``a/b.py:f`` -> ``("a/b.py", "f")``; a reference without an attribute (a capture folder, a
    saved result file) -> ``(ref, None)``."""
    location, sep, attr = ref.rpartition(":")
    if sep and location and attr and "/" not in attr and "\\" not in attr:
        return location, attr
    return ref, None


def _show_value(value: Any) -> str:
    if isinstance(value, str) and value and not any(c.isspace() or c in ",()=" for c in value):
        return value
    return json.dumps(value)


_UNSET = object()


def target_labels(baseline: Target, candidate: Target) -> tuple[str, str]:
    """How a why names two targets: their labels where both have one, else :func:`side_labels`
    of their references as typed here and their arguments."""
    if baseline.label and candidate.label:
        return baseline.label, candidate.label
    return side_labels(baseline.portable_ref, candidate.portable_ref, baseline.args, candidate.args)


def side_labels(baseline: str, candidate: str, baseline_args: Mapping[str, Any] | None = None,
                candidate_args: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """How a verdict's why names the two sides of a comparison, so that a reader tells them
    apart: the attribute names when they differ (``gated_norm_fused``, ``gated_norm_tiled``);
    else the shortest path suffix that tells the two locations apart, with the attribute
    (``stack_v1/kernels.py:make_norm``, ``stack_v2/kernels.py:make_norm``); else (the same
    reference) the arguments that differ (``make_norm(passes=4)``, ``make_norm(passes unset)``);
    else ``the baseline`` and ``the candidate``. A reference without an attribute (a capture
    folder, a saved file) is named by its last path component, or the shortest suffix that
    differs."""
    b_location, b_attr = _split_side(baseline)
    c_location, c_attr = _split_side(candidate)
    b_parts, b_sep = _location_parts(b_location, b_attr)
    c_parts, c_sep = _location_parts(c_location, c_attr)

    def named(parts: list[str], sep: str, attr: str | None, depth: int) -> str:
        suffix = sep.join(parts[-depth:]) if depth else ""
        return f"{suffix}:{attr}" if attr is not None and suffix else (attr if attr is not None else suffix)

    b_name = b_attr if b_attr is not None else (b_parts[-1] if b_parts else baseline)
    c_name = c_attr if c_attr is not None else (c_parts[-1] if c_parts else candidate)
    if b_name != c_name:
        return b_name, c_name
    if (b_parts, b_sep) != (c_parts, c_sep):
        for depth in range(1, max(len(b_parts), len(c_parts)) + 1):
            b_text, c_text = named(b_parts, b_sep, b_attr, depth), named(c_parts, c_sep, c_attr, depth)
            if b_text != c_text:
                return b_text, c_text
    b_args, c_args = dict(baseline_args or {}), dict(candidate_args or {})
    differing = [k for k in dict.fromkeys([*b_args, *c_args]) if b_args.get(k, _UNSET) != c_args.get(k, _UNSET)]
    if differing:
        def called(args: Mapping[str, Any]) -> str:
            shown = [f"{k}={_show_value(args[k])}" if k in args else f"{k} unset" for k in differing]
            return f"{b_name}({', '.join(shown)})"

        return called(b_args), called(c_args)
    return "the baseline", "the candidate"
