"""Recording: the verdicts of a run become rows of the history store.

What identifies each row's series is computed here: the definition's hash (its resolved
content, canonically), the git state of the repository the definition lives in, and the
machine fingerprint (a stable hash of the verdict's environment fields that identify the
machine). Nothing here prints: a store that cannot be written raises, and the command that
recorded turns it into a warning (recording never fails a run).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glmfb.contract.verdict import Metric, Run, Verdict
from glmfb.core.env import COMPARABLE_KEYS, git_revision
from glmfb.core.probe import ProbeSpec
from glmfb.workflows.history.metrics import metric_kind
from glmfb.workflows.history.store import Record, open_store

# The environment fields that identify a machine: those that make two measurements
# incomparable (glmfb.core.env.COMPARABLE_KEYS: Python, torch, architecture, CPU model and count,
# device, threads) and the CUDA version. Not the host name: a CI job's container or runner
# gets a new one each time, and its history would never grow past one run. $GLMFB_MACHINE
# names a machine where the hardware alone does not tell two apart.
MACHINE_KEYS: tuple[str, ...] = (*COMPARABLE_KEYS, "cuda")
MACHINE_VAR = "GLMFB_MACHINE"


@dataclass(frozen=True)
class Origin:
    """Where a verdict came from: its definition's hash and the folder whose git repository
    holds the definition (the working folder, for a probe command). A shard's verdict read back
    by the gate has no folder here: its git state was taken where it ran (``commit``, ``dirty``)."""

    digest: str | None
    folder: Path | None
    commit: str | None = None
    dirty: bool | None = None

    def git(self) -> tuple[str | None, bool | None]:
        """The commit and dirty flag: of the folder's repository now, or as recorded."""
        return git_state(self.folder) if self.folder is not None else (self.commit, self.dirty)

    def to_dict(self) -> dict[str, Any]:
        """As a shard's ``origins`` entry in run.json: the hash and the git state, taken now."""
        commit, dirty = self.git()
        return {"definition_hash": self.digest, "commit": commit, "dirty": dirty}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Origin:
        return cls(data.get("definition_hash"), None, data.get("commit"), data.get("dirty"))


def canonical_hash(data: Any) -> str:
    """A short, stable hash of JSON-like data (keys sorted, no whitespace)."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def spec_content(spec: ProbeSpec, config_type: type) -> dict[str, Any]:
    """What a spec runs, as a definition writes it: the probe, the targets and their
    arguments as given (relative paths stay relative to the definition, so two checkouts of
    one repository hash alike), and each option written in its canonical form (``"5%"``
    whether the file says ``5%`` or ``0.05``)."""
    from glmfb.contract.options import options_of

    writers = {opt.attr: opt for opt in options_of(config_type)}
    options = {writers[attr].key: writers[attr].write(value) for attr, value in spec.options.items() if attr in writers}
    content: dict[str, Any] = {"probe": spec.kind, "options": options}
    for key in ("baseline", "candidate", "target", "command", "args", "baseline_args", "candidate_args"):
        value = getattr(spec, key)
        if value not in (None, (), {}):
            content[key] = list(value) if isinstance(value, tuple) else value
    return content


def definition_digest(definition: Any) -> str:
    """The hash of a probe definition (a :class:`glmfb.workflows.suite.ProbeDefinition`): its spec's
    content, its expectation, timeout and rules files; not its description, which changes
    nothing it measures."""
    from glmfb.core.probe import get_probe

    content = spec_content(definition.spec, get_probe(definition.probe).config_type)
    if definition.expect is not None:
        content["expect"] = definition.expect.to_dict()
    if definition.timeout_s is not None:
        content["timeout_s"] = definition.timeout_s
    if definition.rules_files:
        content["rules"] = [os.path.relpath(p, definition.source.parent) for p in definition.rules_files]
    return canonical_hash(content)


def git_state(folder: Path) -> tuple[str | None, bool | None]:
    """The commit checked out in the repository that holds ``folder`` and whether tracked
    files differ from it (None, None outside git)."""
    revision = git_revision(str(folder))
    if revision is None:
        return None, None
    return revision.removesuffix("+dirty"), revision.endswith("+dirty")


def machine_of(env: Mapping[str, Any]) -> tuple[str, str]:
    """A verdict's machine: the fingerprint (a hash of :data:`MACHINE_KEYS` and
    ``$GLMFB_MACHINE``) and a label for people (which also names the host)."""
    named = os.environ.get(MACHINE_VAR)
    identity = {key: env.get(key) for key in MACHINE_KEYS if env.get(key) is not None}
    if named:
        identity["name"] = named
    parts = [f"{env.get('cpu', '?')} x{env.get('cpu_count', '?')}", str(env.get("device", "?"))]
    if env.get("torch"):
        parts.append(f"torch {env['torch']}")
    if env.get("python"):
        parts.append(f"python {env['python']}")
    host = named or platform.node()
    label = (f"{host}: " if host else "") + ", ".join(parts)
    return canonical_hash(identity), label


def record_of(run: Run, verdict: Verdict, origin: Origin | None, metric: Metric | None = None,
              git: tuple[str | None, bool | None] | None = None) -> Record:
    """One verdict's row: of its headline metric, or of ``metric`` (a secondary series);
    ``git`` the origin's git state when it was already taken."""
    from glmfb import __version__

    metric = metric if metric is not None else verdict.metric
    kind = metric_kind(verdict.probe, metric.name if metric is not None else None)
    commit, dirty = git if git is not None else origin.git() if origin is not None else (None, None)
    machine, label = machine_of(verdict.env or run.env)
    return Record(
        time=run.started, run_id=run.id, definition=verdict.name,
        definition_hash=origin.digest if origin is not None else None,
        probe=verdict.probe, status=verdict.status.value, layer=verdict.layer.value,
        metric=metric.name if metric is not None else None,
        value=metric.value if metric is not None else None,
        low=metric.ci[0] if metric is not None and metric.ci is not None else None,
        high=metric.ci[1] if metric is not None and metric.ci is not None else None,
        unit=metric.unit if metric is not None else None,
        threshold=metric.threshold if metric is not None else None,
        worse=kind.worse.value, relative=kind.relative, where=dict(verdict.where),
        commit=commit, dirty=dirty, machine=machine, machine_label=label, glmfb_version=__version__,
    )


def records_of(run: Run, origins: Mapping[str, Origin]) -> list[Record]:
    """A row per verdict of ``run`` (its headline metric), and one per secondary series its
    probe names (:meth:`glmfb.core.probe.BaseProbe.series`: bench's each side's own time per shape);
    ``origins`` by verdict name."""
    from glmfb.core.probe import get_probe
    from glmfb.core.registry import known_kinds

    rows: list[Record] = []
    for verdict in run.verdicts:
        origin = origins.get(verdict.name)
        git = origin.git() if origin is not None else (None, None)
        rows.append(record_of(run, verdict, origin, git=git))
        if verdict.probe in known_kinds():
            series = getattr(get_probe(verdict.probe), "series", lambda verdict: ())(verdict)
            rows.extend(record_of(run, verdict, origin, metric, git=git) for metric in series)
    return rows


def record_run(url: str, run: Run, origins: Mapping[str, Origin], *, once: bool = False) -> int:
    """Append ``run``'s verdicts to the store at ``url``; returns how many rows. ``once``: not
    when the store already holds run ``run.id`` (the shards of one suite gated twice are one run,
    recorded once)."""
    rows = records_of(run, origins)
    with open_store(url) as store:
        return store.record(rows, once=once)


def record_or_warn(url: str | None, run: Run, origins: Callable[[], Mapping[str, Origin]],
                   run_dir: Path | None = None) -> str | None:
    """Append ``run``'s verdicts to the store at ``url`` (None: recording is off); what went wrong,
    as one warning line, or None. Recording never fails a run, so nothing here raises.

    With ``run_dir`` (the run's folder), rows are never lost to a store that cannot take them
    now (a lock held past the bound, a server down): they are kept in ``run_dir``'s
    :data:`PENDING_FILE`, and each later recording into the same store from a run beside it
    (the same ``--out``) first records the rows kept there, oldest run first, each once."""
    if url is None:
        return None
    from glmfb.workflows.history.store import describe, open_store

    try:
        rows = records_of(run, origins())
    except Exception as exc:  # a definition's git state that cannot be read, ...: a warning only
        return f"the verdicts were not recorded in the history {describe(url)}: {exc}"
    try:
        with open_store(url) as store:
            if run_dir is not None:
                for pending in kept_rows(run_dir.parent, url):
                    store.record(pending.rows, once=True)
                    pending.path.unlink(missing_ok=True)
            store.record(rows)
    except Exception as exc:  # a store that refuses, a full disk, a missing driver: a warning only
        warning = f"the verdicts were not recorded in the history {describe(url)}: {exc}"
        if run_dir is None or not rows:
            return warning
        try:
            from glmfb.core.io import write_json_atomic

            write_json_atomic(run_dir / PENDING_FILE, {"store": url, "run_id": run.id,
                                                       "rows": [row.to_dict() for row in rows]})
        except Exception as kept:  # the warning says it
            return f"{warning}; nor could they be kept in {run_dir / PENDING_FILE}: {kept}"
        return (f"{warning}; they are kept in {run_dir / PENDING_FILE}, and the next run into "
                f"{run_dir.parent} that records into this history records them first")
    return None


PENDING_FILE = "history-pending.json"  # in a run folder: its rows, for a store that could not take them


@dataclass(frozen=True)
class KeptRows:
    """A run's rows kept for a store that could not take them (:func:`record_or_warn`)."""

    path: Path
    run_id: str
    rows: tuple[Record, ...]


def kept_rows(out: Path, url: str) -> list[KeptRows]:
    """The rows kept in the run folders of ``out`` for the store ``url``, oldest run first; a
    file that cannot be read, or that was kept for another store, is left where it is."""
    kept: list[KeptRows] = []
    for path in sorted(out.glob(f"*/{PENDING_FILE}")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("store") != url:
                continue
            rows = tuple(Record(**row) for row in data["rows"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
        kept.append(KeptRows(path, str(data.get("run_id")), rows))
    return kept


def suite_origins(definitions: Sequence[Any]) -> dict[str, Origin]:
    """The origin of each definition of a suite run, by name."""
    return {d.name: Origin(definition_digest(d), d.source.parent) for d in definitions}


def shard_origins(runs: Sequence[Run]) -> dict[str, Origin]:
    """The origin of each verdict of the shards ``runs``, by name, as each shard recorded it."""
    return {name: Origin.from_dict(data) for run in runs if run.shard is not None
            for name, data in run.shard.origins.items()}


def command_origin(spec: ProbeSpec, config_type: type, folder: Path | None = None) -> Origin:
    """The origin of a probe command's verdict: its spec's hash, and the folder whose git
    commit it ran: the folder of the file its candidate (else its target, else its baseline)
    names, so a command run from outside the repository records that repository's commit;
    else ``folder`` (default: the working folder)."""
    return Origin(canonical_hash(spec_content(spec, config_type)), spec.code_folder() or folder or Path.cwd())


