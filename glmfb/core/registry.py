"""Which probe kinds this installation knows, and the one-line help of each, read without
importing any probe.

Built-in probes are listed once, in :data:`BUILTIN_PROBES`; other packages add probes through
the entry-point group ``glmfb.probes`` (entry name = the kind, value = ``module:attr`` naming a
probe object or class). A built-in probe's package declares what the command list shows
about it as data, so that ``glmfb --help`` imports no probe: ``SUMMARY`` (its one line of
help, also the probe's ``summary``) and ``COMMANDS`` (the commands it brings besides its own,
name -> one line of help, also each :class:`~glmfb.core.probe.ProbeCommand`'s ``summary``).

This module imports nothing but the standard library: ``glmfb --help`` reads it. The entry
points are read from the ``*.dist-info`` and ``*.egg-info`` folders on the import path
directly (``importlib.metadata`` costs about 30 ms to import here, more than the rest of
the command list): the first distribution of a name on the path wins, as there.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

ENTRY_POINT_GROUP = "glmfb.probes"

# The built-in probes: (kind, "module:attr"). Imported only when used.
BUILTIN_PROBES: tuple[tuple[str, str], ...] = (
    ("diff", "glmfb.diff.probe:PROBE"),
    ("bench", "glmfb.bench.probe:PROBE"),
    ("gil", "glmfb.gil.probe:PROBE"),
    ("gap", "glmfb.gap.probe:PROBE"),
)


@dataclass(frozen=True)
class ProbeEntry:
    """A probe kind this installation knows, before it is imported."""

    kind: str
    ref: str  # "module:attr"
    source: str  # "builtin" or "entry point from <distribution>"

    @property
    def builtin(self) -> bool:
        return self.source == "builtin"

    @property
    def package(self) -> str:
        """The package of a built-in probe's module (``glmfb.diff``), which declares its help."""
        return self.ref.partition(":")[0].rpartition(".")[0]


@lru_cache(maxsize=1)
def probe_entries() -> tuple[ProbeEntry, ...]:
    """Built-in probes, then installed ones (entry points, by name), without importing either."""
    entries = [ProbeEntry(kind, ref, "builtin") for kind, ref in BUILTIN_PROBES]
    seen = {entry.kind for entry in entries}
    for name, value, dist in sorted(entry_points(ENTRY_POINT_GROUP)):
        if name in seen:
            warnings.warn(f"glmfb: the probe entry point {name!r} ({value}) is ignored: "
                          "that kind is already defined", stacklevel=2)
            continue
        seen.add(name)
        entries.append(ProbeEntry(name, value, f"entry point from {dist}"))
    return tuple(entries)


def known_kinds() -> tuple[str, ...]:
    """Every probe kind this installation can run."""
    return tuple(entry.kind for entry in probe_entries())


def unknown_kinds(kinds: Iterable[str]) -> list[str]:
    """The kinds among ``kinds`` this installation does not know, sorted; the entry points
    are read only for a kind that is not built in (the gate of built-in verdicts reads none)."""
    builtin = {kind for kind, _ in BUILTIN_PROBES}
    rest = set(kinds) - builtin
    return sorted(rest - set(known_kinds())) if rest else []


def command_list() -> list[tuple[str, str]]:
    """Every probe's command and the commands probes bring, with their one line of help, in
    registry order: a built-in probe's from its package's ``SUMMARY`` and ``COMMANDS``, an
    installed one's from the probe object itself (imported; one that does not load is left
    out, said where it is used). A name taken already is skipped, as :func:`glmfb.core.probe.probe_commands`
    skips it."""
    kinds = known_kinds()
    listed: list[tuple[str, str]] = []
    brought: dict[str, str] = {}  # the first probe to bring a name keeps it
    for entry in probe_entries():
        if entry.builtin:
            package = importlib.import_module(entry.package)
            summary, commands = package.SUMMARY, dict(package.COMMANDS)
        else:
            try:
                probe = import_ref(entry.ref)
                probe = probe() if isinstance(probe, type) else probe
                summary = str(probe.summary)
                commands = {str(command.name): str(command.summary) for command in getattr(probe, "commands", ())}
            except Exception:  # said where the probe is used (glmfb.core.probe.get_probe)
                continue
        listed.append((entry.kind, summary))
        for name, line in commands.items():
            if name not in kinds:
                brought.setdefault(name, line)
    return listed + list(brought.items())


def import_ref(ref: str) -> Any:
    """The object a ``"module:attr"`` reference names (``attr`` may be dotted), imported now."""
    module_name, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


_DIST_FOLDER = re.compile(r"^(?P<name>[^-]+)(-[^-]*)?\.(dist|egg)-info$")


def entry_points(group: str) -> list[tuple[str, str, str]]:
    """``(name, value, distribution)`` of every entry point of ``group`` installed on the import
    path (:data:`sys.path`), read from ``entry_points.txt`` of each ``*.dist-info`` and
    ``*.egg-info`` folder; a distribution found twice counts where it is first on the path."""
    found: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    header = f"[{group}]"
    for folder in sys.path:
        try:
            names = os.listdir(folder or ".")
        except OSError:
            continue
        for name in names:
            match = _DIST_FOLDER.match(name)
            if match is None:
                continue
            dist = re.sub(r"[-_.]+", "-", match["name"]).lower()
            if dist in seen:
                continue
            seen.add(dist)
            try:
                with open(os.path.join(folder or ".", name, "entry_points.txt"), encoding="utf-8") as handle:
                    text = handle.read()
            except OSError:
                continue
            if header in text:
                found += [(key, value, match["name"]) for key, value in _section(text, header)]
    return found


def _section(text: str, header: str) -> list[tuple[str, str]]:
    """The ``key = value`` lines of one section of an ``entry_points.txt`` (INI: comments,
    blank lines and other sections skipped)."""
    items: list[tuple[str, str]] = []
    inside = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            inside = line == header
            continue
        if inside and "=" in line:
            key, _, value = line.partition("=")
            items.append((key.strip(), value.strip()))
    return items
