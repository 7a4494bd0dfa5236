"""What a tool call may touch.

- Every path (a target file, a saved result, a capture folder, a requests file, a rules file,
  a policy, a run) resolves under the root, symbolic links followed; one outside is refused
  with a message that names the argument.
- A target given as ``package.module:attr`` must be a module under the root (a file
  ``a/b.py`` or a package ``a/b/__init__.py`` there), unless the server allows commands.
- A command line (``gil``'s ``command``) runs only when the server was started with
  ``--allow-commands``.
- Every call has a time budget: its ``timeout`` argument, capped by the server's
  ``--max-call-s``.

Errors are :class:`~glmfb.contract.errors.InputError` (a tool error for the agent, never a crash).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glmfb.contract.errors import InputError, UsageError
from glmfb.core.probe import TIMEOUT, parse_timeout
from glmfb.core.targets import is_file_ref

# glmfb's own target factories a call may name wherever the root is, each with the arguments
# that are paths (checked under the root): a served model folder loaded with transformers
BUILTIN_TARGETS: dict[str, tuple[str, ...]] = {"glmfb.diff.hf:causal_lm": ("path",)}
DEFAULT_MAX_CALL_S: float = TIMEOUT.default  # the default probe timeout (15 min)
ROOT_HINT = "give a path under the server's root (glmfb mcp --root DIR sets it)"


@dataclass(frozen=True)
class Boundary:
    """The root every path resolves under, and what else a call may do."""

    root: Path
    allow_commands: bool = False
    max_call_s: float = DEFAULT_MAX_CALL_S
    who: str = "this server"  # what applies it, in a refusal ("glmfb --follow" for the CLI's follow-ups)
    out: Path | None = None  # where runs go (glmfb mcp --out); None: <root>/reports
    # folders outside the root whose files a call may name: the run glmfb itself is writing
    # (--follow's steps name files their probe wrote there, such as a module diff's requests)
    readable: tuple[Path, ...] = ()
    # how to allow command lines, in a refusal (the agent server's flag; --follow-commands for --follow)
    commands_hint: str = ("start glmfb mcp with --allow-commands, or give a Python target under the root "
                          "with 'target'")

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).resolve())
        if self.out is not None:
            object.__setattr__(self, "out", Path(self.out).resolve())
        object.__setattr__(self, "readable", tuple(Path(p).resolve() for p in self.readable))

    @property
    def reports(self) -> Path:
        """Where runs go: ``--out``, else ``<root>/reports``, as with the CLI run in the root."""
        return self.out if self.out is not None else self.root / "reports"

    @property
    def history(self) -> str:
        """The history store the tools record into: ``$GLMFB_HISTORY``, else
        ``<root>/reports/history.sqlite``, as with the CLI run in the root."""
        from glmfb.workflows.history.store import chosen_url

        return chosen_url(None, self.reports, os.environ)

    def relative(self, path: Path) -> str:
        """``path`` as written relative to the root; absolute where it lies in a
        :attr:`readable` folder or :attr:`out` outside it."""
        if not (path == self.root or path.is_relative_to(self.root)):
            return str(path)
        rel = path.relative_to(self.root)
        return str(rel) if str(rel) != "." else "."

    def inside(self, value: str | Path) -> Path | None:
        """The resolved path if it lies under the root, a :attr:`readable` folder or where runs
        go (:attr:`out`, glmfb's own files), else None."""
        raw = Path(value)
        resolved = (raw if raw.is_absolute() else self.root / raw).resolve()
        tops = (self.root, *self.readable, *((self.out,) if self.out is not None else ()))
        if any(resolved == top or resolved.is_relative_to(top) for top in tops):
            return resolved
        return None

    def path(self, value: Any, argument: str, *, must_exist: bool = False, what: str = "file") -> Path:
        """A path argument, resolved under the root (absolute), or an :class:`InputError`."""
        text = _string(value, argument, "a path")
        resolved = self.inside(text)
        if resolved is None:
            others = [*self.readable, *((self.out,) if self.out is not None else ())]
            beside = f" and outside glmfb's own {', '.join(map(str, others))}" if others else ""
            raise InputError(f"argument {argument!r}: {text} is outside the root {self.root}{beside}", ROOT_HINT)
        if must_exist and not resolved.exists():
            raise InputError(f"argument {argument!r}: no such {what} under the root: {text}",
                             f"paths are relative to {self.root}")
        return resolved

    def paths(self, value: Any, argument: str, *, must_exist: bool = False, what: str = "file") -> list[Path]:
        """A path or a list of them."""
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items:
            raise InputError(f"argument {argument!r}: expected a path or a list of paths, got {value!r:.80}")
        return [self.path(item, f"{argument}[{index}]" if len(items) > 1 else argument, must_exist=must_exist,
                          what=what) for index, item in enumerate(items)]

    def side(self, value: Any, argument: str, kind: str | None = None) -> str:
        """A side of probe ``kind`` (None: of a command a probe brings): a target reference
        (``file.py:attr`` or ``package.module:attr``), a file or folder under the root (a saved
        result, a capture directory; ``#side`` suffix kept), or what the probe addresses outside
        the file system (diff's serving endpoints: the probe says,
        :func:`glmfb.core.probe.outside_side`). Returned as written relative to the root where it is
        a path."""
        from glmfb.core.probe import outside_side

        text = _string(value, argument, "a target (file.py:factory) or a path")
        try:
            if outside_side(text, kind):
                return text
        except UsageError as exc:
            raise InputError(f"argument {argument!r}: {exc.message}", exc.hint) from None
        if text in BUILTIN_TARGETS:
            return text
        path_part, sep, suffix = text.partition("#")
        as_path = Path(path_part)
        if path_part and (as_path if as_path.is_absolute() else self.root / as_path).exists():
            resolved = self.path(path_part, argument)
            return self.relative(resolved) + (f"#{suffix}" if sep else "")
        location, colon, attr = text.rpartition(":")
        if colon and location and attr:
            if is_file_ref(location):
                resolved = self.path(location, argument, must_exist=True, what="target file")
                return f"{self.relative(resolved)}:{attr}"
            self.module(location, argument)
            return text
        if path_part.endswith((".json", ".toml")) or is_file_ref(path_part):
            self.path(path_part, argument, must_exist=True, what="file or folder")
        raise InputError(f"argument {argument!r}: {text!r} is neither a target nor a file or folder under the root",
                         "write a target as path/to/file.py:factory or package.module:factory")

    def definition(self, definition: Any) -> None:
        """Every path a probe definition (:class:`glmfb.workflows.suite.ProbeDefinition`) names lies under
        the root, as a probe tool's arguments must: its targets, its rules files, and its path
        and target options, each resolved beside the definition file, symbolic links followed.
        A definition that names one outside is refused, naming it and the key; nothing of it is
        imported. (A command line it runs is the run tool's to refuse: see :meth:`commands_of`.)"""
        from glmfb.contract.options import options_of
        from glmfb.core.probe import get_probe

        spec = definition.spec
        label = f"definition {definition.name!r}"
        for which in ("baseline", "candidate", "target"):
            ref = getattr(spec, which)
            if ref:
                self.side(spec.anchored(ref), f"{label}: {which}", spec.kind)
        for file in definition.rules_files:
            self.path(str(file), f"{label}: rules")
        for option in options_of(get_probe(spec.kind).config_type):
            value = spec.options.get(option.attr)
            if value is None or value == ():
                continue
            if option.type.name == "path":
                self.path(str(spec.resolve_path(value)), f"{label}: options.{option.key}")
            elif option.type.name == "target":
                self.side(spec.anchored(str(value)), f"{label}: options.{option.key}", spec.kind)

    @staticmethod
    def commands_of(definition: Any) -> list[str]:
        """The keys under which a probe definition runs a command line (``command``, and options
        such as a serving diff's ``baseline_server``)."""
        from glmfb.contract.options import options_of
        from glmfb.core.probe import get_probe

        spec = definition.spec
        keys = ["command"] if spec.command else []
        return keys + [f"options.{option.key}" for option in options_of(get_probe(spec.kind).config_type)
                       if option.type.name == "command" and spec.options.get(option.attr) not in (None, ())]

    def builtin_args(self, ref: str, args: Any, argument: str) -> None:
        """The path arguments of glmfb's own factory ``ref`` (:data:`BUILTIN_TARGETS`) lie
        under the root, as any path a call names must."""
        for key in BUILTIN_TARGETS.get(ref, ()):
            value = args.get(key) if isinstance(args, dict) else None
            if value is not None:
                self.path(str(value), f"{argument}.{key}", must_exist=True, what="folder")

    def module(self, location: str, argument: str) -> None:
        """A dotted module name must name a module under the root (unless commands are allowed)."""
        parts = location.split(".")
        if not all(part.isidentifier() for part in parts):
            raise InputError(f"argument {argument!r}: {location!r} is not a module name",
                             "write a target as path/to/file.py:factory or package.module:factory")
        if self.allow_commands:
            return
        base = self.root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            resolved = self.inside(candidate)
            if resolved is not None and resolved.is_file():
                return
        raise InputError(
            f"argument {argument!r}: module {location} is not under the root {self.root}, so {self.who} will not "
            "import it",
            "give the target as a file under the root (path/to/file.py:factory), or start glmfb mcp with "
            "--allow-commands to run code from outside the root",
        )

    def command(self, value: Any, argument: str = "command") -> tuple[str, ...]:
        """A command line to run: only when the server allows commands."""
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise InputError(f"argument {argument!r}: expected a command line as a list of strings, "
                             'e.g. ["python", "serve.py"]')
        if not self.allow_commands:
            raise InputError(f"argument {argument!r}: {self.who} does not run command lines", self.commands_hint)
        return tuple(value)

    def timeout(self, value: Any, argument: str = "timeout") -> tuple[float, str | None]:
        """The call's time budget in seconds, and a note when the cap shortened it."""
        if value is None:
            return self.max_call_s, None
        seconds = parse_timeout(value, f"argument {argument!r}")
        if seconds > self.max_call_s:
            return self.max_call_s, (f"timeout {seconds:g} s capped at the server's limit of {self.max_call_s:g} s "
                                     "(glmfb mcp --max-call-s)")
        return seconds, None


def _string(value: Any, argument: str, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"argument {argument!r}: expected {what} as a non-empty string, got {value!r:.80}")
    return value.strip()


def strings(value: Any, argument: str) -> list[str]:
    """A string or a list of strings, as a list."""
    items: Sequence[Any] = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise InputError(f"argument {argument!r}: expected a string or a list of strings, got {value!r:.80}")
    return list(items)
