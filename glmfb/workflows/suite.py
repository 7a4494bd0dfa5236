"""Probe definitions: discover them (TOML files), check them, run them, judge expectations.

A definition file holds one or more ``[[probe]]`` tables::

    [[probe]]
    name = "gated-norm-tiled-vs-fused"       # unique in the suite
    probe = "bench"                          # any probe kind this installation knows
    baseline = "../scenarios/decode_norm/kernels.py:gated_norm_fused"
    candidate = "../scenarios/decode_norm/kernels.py:gated_norm_tiled"
    description = "the tiled kernel recomputes the norm per tile"
    args = { heads = 8 }                     # to both sides (``--arg``)
    baseline_args = {}                       # to one side
    candidate_args = {}
    options = { shapes = ["8x4096"], threshold = "5%" }   # the probe's declared options
    rules = "my_rules.py"                    # optional: user rules tried first
    expect = { status = "fail", layer = "kernel", where = { kernel = "*tiled*" } }

Relative paths are relative to the definition file. Everything is checked when the file is
loaded (unknown keys, option values, the probe's own checks), so a bad definition is a usage
error before anything runs. Running goes through the host boundary (:mod:`glmfb.core.host`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import queue
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.contract.clock import SYSTEM_CLOCK, Clock, utc_now
from glmfb.contract.errors import InputError, UsageError
from glmfb.contract.options import parse_table
from glmfb.contract.verdict import Expectation, Layer, Run, Shard, Status, Verdict
from glmfb.core.commandline import FollowOptions, run_step
from glmfb.core.io import read_toml
from glmfb.core.probe import (
    TIMEOUT,
    Placement,
    ProbeContext,
    ProbeSpec,
    get_probe,
    known_kinds,
    machine_cores,
    parse_timeout,
    placement,
    safe_component,
)
from glmfb.core.shards import shard_record

Follower = Callable[[Verdict, FollowOptions, Path], Verdict]  # a verdict, how far, its artifact folder -> with its chain

if TYPE_CHECKING:
    from glmfb.core.targets import ImportFence

DEFINITION_KEYS = frozenset(
    {"name", "probe", "description", "baseline", "candidate", "target", "command", "args",
     "baseline_args", "candidate_args", "options", "expect", "rules", "follow", TIMEOUT.key}
)
EXPECT_KEYS = frozenset({"status", "layer", "where"})


@dataclass(frozen=True)
class ProbeDefinition:
    """One probe of a suite, as read (and checked) from a definition file."""

    spec: ProbeSpec
    config: Any  # built by the probe when the file was loaded
    source: Path
    description: str = ""
    expect: Expectation | None = None
    rules_files: tuple[Path, ...] = ()
    timeout_s: float | None = None  # the definition's own timeout (None: the run's)
    follow: FollowOptions | None = None  # follow = true (or {depth, budget}): its deeper steps after a failure

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def probe(self) -> str:
        return self.spec.kind

    @property
    def label(self) -> str:
        return self.spec.label


# --------------------------------------------------------------------------------------------
# Discovery and loading
# --------------------------------------------------------------------------------------------


def discover(paths: Sequence[str | Path]) -> list[Path]:
    """Definition files (``*.toml``) under the given files or directories, sorted."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            if path.suffix != ".toml":
                raise InputError(f"{path}: not a probe definition (.toml)")
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(p for p in path.rglob("*.toml") if p.is_file()))
        else:
            raise InputError(f"{path}: no such file or directory", "give a probes/ folder or .toml files")
    return found


def load_definitions(files: Iterable[Path]) -> list[ProbeDefinition]:
    """Parse and check definition files; a bad file is a usage error naming file and key."""
    definitions: list[ProbeDefinition] = []
    seen: dict[str, Path] = {}
    for path in files:
        document = read_toml(path)
        unknown_top = set(document) - {"probe"}
        if unknown_top:
            raise InputError(f"{path}: unknown top-level key {sorted(unknown_top)[0]!r}",
                             "definitions go in [[probe]] tables")
        tables = document.get("probe", [])
        if not isinstance(tables, list):
            raise InputError(f"{path}: 'probe' must be an array of tables", "write [[probe]]")
        for index, table in enumerate(tables):
            definition = load_table(path, index, table)
            if definition.name in seen:
                raise InputError(
                    f"{path}: probe name {definition.name!r} already defined in {seen[definition.name]}",
                    "names must be unique in a suite",
                )
            seen[definition.name] = path
            definitions.append(definition)
    return definitions


def _string(table: Mapping[str, Any], key: str, label: str) -> str | None:
    value = table.get(key)
    if value is not None and not isinstance(value, str):
        raise InputError(f"{label}: {key!r} must be a string")
    return value


def _table(table: Mapping[str, Any], key: str, label: str) -> dict[str, Any]:
    value = table.get(key, {})
    if not isinstance(value, dict):
        raise InputError(f"{label}: {key!r} must be a table")
    return dict(value)


def load_table(path: Path, index: int, table: Mapping[str, Any]) -> ProbeDefinition:
    """One ``[[probe]]`` table, checked: keys, probe kind, options, expectation, the config."""
    label = f"{path}: probe #{index + 1}"
    if not isinstance(table, Mapping):
        raise InputError(f"{label}: must be a table")
    unknown = set(table) - DEFINITION_KEYS
    if unknown:
        raise InputError(f"{label}: unknown key {sorted(unknown)[0]!r}",
                         f"known keys: {', '.join(sorted(DEFINITION_KEYS))}")
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(f"{label}: missing 'name'")
    label = f"{path}: probe {name!r}"
    kind = table.get("probe")
    if not isinstance(kind, str) or kind not in known_kinds():
        raise InputError(f"{label}: 'probe' is {kind!r}", f"use one of {', '.join(known_kinds())}")
    probe = get_probe(kind)
    command = table.get("command", [])
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        raise InputError(f"{label}: 'command' must be a list of strings")
    base_dir = path.resolve().parent
    options = parse_table(probe.config_type, _table(table, "options", label), label)
    spec = ProbeSpec(
        kind=kind, name=name, label=label,
        baseline=_string(table, "baseline", label), candidate=_string(table, "candidate", label),
        target=_string(table, "target", label), command=tuple(command),
        args=_table(table, "args", label), baseline_args=_table(table, "baseline_args", label),
        candidate_args=_table(table, "candidate_args", label), options=options, base_dir=base_dir,
    )
    rules_files: tuple[Path, ...] = ()
    rules = table.get("rules")
    if rules is not None:
        names = [rules] if isinstance(rules, str) else rules
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise InputError(f"{label}: 'rules' must be a file name or a list of them")
        rules_files = tuple(spec.resolve_path(n) for n in names)
        for file in rules_files:
            if not file.is_file():
                raise InputError(f"{label}: rules file {file} not found")
    try:
        config = probe.build(spec)
    except UsageError as exc:
        if str(exc).startswith(label):
            raise
        raise InputError(f"{label}: {exc}") from None
    return ProbeDefinition(
        spec=spec, config=config, source=path.resolve(),
        description=_string(table, "description", label) or "",
        expect=_expectation(table, label), rules_files=rules_files, timeout_s=_timeout(table, label),
        follow=_follow(table, label),
    )


def _follow(table: Mapping[str, Any], label: str) -> FollowOptions | None:
    """``follow = true``, or ``follow = { depth = 2, budget = "5m" }``: follow the verdict's deeper
    steps after a failure (:mod:`glmfb.workflows.follow`); false or absent: not."""
    value = table.get("follow", False)
    if value is False:
        return None
    if value is True:
        return FollowOptions()
    if not isinstance(value, dict) or set(value) - {"depth", "budget"}:
        raise InputError(f"{label}: 'follow' must be true, false or a table {{ depth, budget }}")
    return FollowOptions.parse(value.get("depth"), value.get("budget"), f"{label}: follow")


def _timeout(table: Mapping[str, Any], label: str) -> float | None:
    if TIMEOUT.key not in table:
        return None
    return parse_timeout(table[TIMEOUT.key], f"{label}: {TIMEOUT.key}")


def _expectation(table: Mapping[str, Any], label: str) -> Expectation | None:
    if "expect" not in table:
        return None
    raw = _table(table, "expect", label)
    unknown = set(raw) - EXPECT_KEYS
    if unknown:
        raise InputError(f"{label}: unknown key expect.{sorted(unknown)[0]}", "use status, layer, where")
    if "where" in raw and not isinstance(raw["where"], dict):
        raise InputError(f"{label}: expect.where must be a table")
    if raw.get("status") == "error":
        raise InputError(f"{label}: expect.status is 'error', but an error verdict never meets an expectation",
                         "a probe that could not run has shown nothing; expect pass, warn, fail or inconclusive")
    if "status" not in raw and "layer" not in raw and not raw.get("where"):
        raise InputError(f"{label}: the expectation is empty, so any verdict would meet it",
                         "give expect.status (and layer, where), or remove expect")
    try:
        return Expectation(
            status=Status(raw["status"]) if "status" in raw else None,
            layer=Layer(raw["layer"]) if "layer" in raw else None,
            where=dict(raw.get("where", {})),
        )
    except ValueError as exc:
        raise InputError(f"{label}: bad expectation: {exc}") from exc


def select(definitions: Sequence[ProbeDefinition], patterns: Sequence[str]) -> list[ProbeDefinition]:
    """Definitions whose name matches any glob or substring (all when no patterns)."""
    if not patterns:
        return list(definitions)
    return [d for d in definitions if any(fnmatch.fnmatchcase(d.name, p) or p in d.name for p in patterns)]


def selected(loaded: Sequence[ProbeDefinition], patterns: Sequence[str],
             paths: Sequence[str | Path]) -> list[ProbeDefinition]:
    """The ``loaded`` definitions (from ``paths``) that match ``patterns``; an empty selection is
    refused: no definition in ``paths`` at all, or none matching (then name what could have)."""
    definitions = select(loaded, patterns)
    if definitions:
        return definitions
    where = ", ".join(str(p) for p in paths)
    if loaded and patterns:
        names = [d.name for d in loaded]
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        raise UsageError(f"no probe in {where} matches -k {' '.join(repr(p) for p in patterns)}",
                         f"-k takes a glob or a substring of a name: {shown}")
    raise UsageError(f"no probe definitions found in {where}",
                     "add [[probe]] tables in a .toml file there (README: Writing a probe definition)")


# --------------------------------------------------------------------------------------------
# What a definition is, as a hash; a shard of a suite
# --------------------------------------------------------------------------------------------


def definition_hash(definition: ProbeDefinition) -> str:
    """The hash of a definition: what it runs and expects, as its file writes it (the probe,
    its targets and arguments as given, each option in its canonical form, the expectation,
    the timeout and the rules files; not its name, nor its description). The history keys a
    definition's series by the same hash (:func:`glmfb.workflows.history.record.definition_digest`)."""
    from glmfb.workflows.history.record import definition_digest

    return definition_digest(definition)


def take_shard(definitions: Sequence[ProbeDefinition], index: int, count: int) -> tuple[list[ProbeDefinition], Shard]:
    """Shard ``index`` of ``count`` of the selected ``definitions`` (chosen by name, in the
    suite's order), and its record for run.json."""
    shard = shard_record({d.name: definition_hash(d) for d in definitions}, index, count)
    names = set(shard.names)
    return [d for d in definitions if d.name in names], shard


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SuiteContext:
    """Where a suite run writes, how it reports progress, and its clock."""

    run_id: str
    report_dir: Path
    on_progress: Callable[[str], None] | None = field(default=None, compare=False)
    clock: Clock = SYSTEM_CLOCK
    timeout_s: float | None = None  # per probe, unless a definition says otherwise
    isolate: bool = True  # each probe in a supervised child process
    cancel: threading.Event | None = field(default=None, compare=False)  # set: stop the running probe
    workdir: Path | None = None  # the probe's child runs here (bisect: the worktree's folder)
    fence: ImportFence | None = None  # where its imports may not come from (bisect: the user's checkout)
    follow: FollowOptions | None = None  # glmfb run --follow: every failing verdict's deeper steps (a definition's own
    # follow options win)
    follower: Follower | None = field(default=None, compare=False)  # the engine (glmfb.workflows.follow.follower)

    def probe_context(self, definition: ProbeDefinition) -> ProbeContext:
        return ProbeContext(
            run_id=self.run_id,
            artifact_dir=self.report_dir / safe_component(definition.name),
            progress=self.on_progress or (lambda message: None),
            clock=self.clock,
            rules_files=definition.rules_files,
            workdir=self.workdir,
            fence=self.fence,
        )


def run_definition(definition: ProbeDefinition, context: SuiteContext) -> Verdict:
    """Run one definition through the host boundary and judge its expectation."""
    from glmfb.core.host import run_probe

    probe = get_probe(definition.probe)
    verdict = run_probe(
        probe, definition.config, context.probe_context(definition), usage_errors=False, isolate=context.isolate,
        timeout_s=definition.timeout_s if definition.timeout_s is not None else context.timeout_s,
        cancel=context.cancel,
    )
    if definition.expect is not None:
        verdict = verdict.with_expectation(definition.expect)
    return verdict


def run_suite(
    definitions: Sequence[ProbeDefinition],
    context: SuiteContext,
    *,
    on_start: Callable[[ProbeDefinition], None] | None = None,
    on_done: Callable[[ProbeDefinition, Verdict], None] | None = None,
    shard: Shard | None = None,
    capacity: int | None = None,
) -> Run:
    """Run every definition (``shard``: they are that shard of a suite, recorded on the run).

    Each probe runs in a supervised child. A timing probe has the machine to itself; numerics
    probes run side by side, as many as fit in ``capacity`` cores (default: this machine's),
    each occupying what :func:`glmfb.core.probe.placement` says (:func:`next_startable` picks which
    starts next). The verdicts stay in definition order, and ``on_done`` is called in that
    order too (``on_start`` as each starts); every callback runs in the calling thread. In
    process (``context.isolate`` false) the probes run one after another. Ctrl-C or SIGTERM
    stops every running probe and its processes, keeps what finished and marks the rest as
    error."""
    from glmfb.core.env import fingerprint

    started = utc_now()
    if context.isolate:
        verdicts, interrupted = _run_scheduled(definitions, context, on_start, on_done, capacity)
    else:
        verdicts, interrupted = _run_in_order(definitions, context, on_start, on_done)
    if not interrupted:
        followed: list[Verdict] = []
        try:
            for definition, verdict in zip(definitions, verdicts, strict=True):
                followed.append(follow_definition(definition, verdict, context))
        except KeyboardInterrupt:  # Ctrl-C while following: the verdicts stay, those not followed without a chain
            interrupted = True
            followed += verdicts[len(followed):]
        verdicts = followed
    return Run(id=context.run_id, started=started, finished=utc_now(), verdicts=tuple(verdicts),
               env=fingerprint(), interrupted=interrupted, shard=shard)


def follow_definition(definition: ProbeDefinition, verdict: Verdict, context: SuiteContext) -> Verdict:
    """``verdict`` with its chain when the definition or the run follows (after the suite, one
    chain at a time, so a timing probe's follow-up has the machine to itself); else as it is."""
    options = definition.follow or context.follow
    if options is not None and context.follow is not None and context.follow.allow_commands:
        options = replace(options, allow_commands=True)  # --follow-commands is the run's
    if options is None or context.follower is None or verdict.status is not Status.FAIL:
        return verdict
    if context.cancel is not None and context.cancel.is_set():
        return verdict
    return context.follower(verdict, options, context.report_dir / safe_component(definition.name))


POLL_S = 0.2  # how often the scheduler looks at the cancellation event while it waits
RUNNING_WHY = "interrupted ({signal}) while running; its processes were stopped"
NOT_RUN_WHY = "not run: the run was interrupted"


def _run_in_order(definitions: Sequence[ProbeDefinition], context: SuiteContext,
                  on_start: Callable[[ProbeDefinition], None] | None,
                  on_done: Callable[[ProbeDefinition, Verdict], None] | None) -> tuple[list[Verdict], bool]:
    """Every definition in order, in this thread (in process: a Ctrl-C reaches the probe)."""
    verdicts: list[Verdict] = []
    interrupted = False
    for definition in definitions:
        if interrupted:
            verdict = _interrupted_verdict(definition, NOT_RUN_WHY)
        else:
            if on_start is not None:
                on_start(definition)
            try:
                verdict = run_definition(definition, context)
            except KeyboardInterrupt as exc:
                interrupted = True
                verdict = _interrupted_verdict(
                    definition, RUNNING_WHY.format(signal=getattr(exc, "signal_name", "SIGINT")))
        verdicts.append(verdict)
        if on_done is not None:
            on_done(definition, verdict)
    return verdicts, interrupted


def definition_placement(definition: ProbeDefinition, capacity: int) -> Placement:
    """How a definition's run shares a machine of ``capacity`` cores (:func:`glmfb.core.probe.placement`)."""
    return placement(get_probe(definition.probe), definition.config, capacity)


def next_startable(places: Sequence[Placement], pending: Sequence[int], running: Iterable[Placement],
                   capacity: int) -> int | None:
    """Which of the ``pending`` definitions (indexes into ``places``, in definition order) may
    start beside the ``running`` ones, or None: nothing starts beside an exclusive run (a
    timing probe); an exclusive one starts only when nothing runs; any other when its cores
    fit in what the running ones leave of ``capacity``. The first that may start is taken,
    so a numerics probe may start before an earlier one that waits for the whole machine
    (the verdicts stay in definition order all the same)."""
    running = list(running)
    if any(place.exclusive for place in running):
        return None
    busy = sum(place.cores for place in running)
    for index in pending:
        place = places[index]
        if (not running) if place.exclusive else busy + place.cores <= capacity:
            return index
    return None


def _run_scheduled(definitions: Sequence[ProbeDefinition], context: SuiteContext,
                   on_start: Callable[[ProbeDefinition], None] | None,
                   on_done: Callable[[ProbeDefinition, Verdict], None] | None,
                   capacity: int | None) -> tuple[list[Verdict], bool]:
    """The scheduler of :func:`run_suite`: each started probe's supervision in a thread of
    its own, this thread starting, collecting and reporting."""
    capacity = max(1, capacity or machine_cores())
    places = [definition_placement(d, capacity) for d in definitions]
    shared = sum(1 for place in places if not place.exclusive) > 1
    stop = threading.Event()  # set: every running probe is stopped (Ctrl-C, or context.cancel)
    finished: queue.Queue[tuple[int, Verdict | BaseException]] = queue.Queue()
    pending = list(range(len(definitions)))
    running: dict[int, Placement] = {}  # started, its verdict not yet collected
    threads: list[threading.Thread] = []
    results: dict[int, Verdict] = {}
    failure: BaseException | None = None
    interrupted = False
    signal_name = "SIGINT"
    reported = 0  # on_done has been called for definitions[:reported]

    def work(index: int, run_context: SuiteContext) -> None:
        try:
            finished.put((index, run_definition(definitions[index], run_context)))
        except BaseException as exc:  # handed to the scheduler's thread
            finished.put((index, exc))

    def start(index: int) -> None:
        definition = definitions[index]
        run_context = replace(context, cancel=stop)
        if shared and not places[index].exclusive and context.on_progress is not None:
            report = context.on_progress  # beside another probe: say whose progress it is
            run_context = replace(run_context, on_progress=lambda message: report(f"{definition.name}: {message}"))
        if on_start is not None:
            on_start(definition)
        pending.remove(index)
        running[index] = places[index]
        thread = threading.Thread(target=work, args=(index, run_context), name=f"glmfb-run-{index}", daemon=True)
        threads.append(thread)
        thread.start()

    def collect(index: int, outcome: Verdict | BaseException) -> None:
        nonlocal failure, interrupted, signal_name, reported
        running.pop(index, None)
        if isinstance(outcome, BaseException):
            if isinstance(outcome, KeyboardInterrupt):  # raised in a probe's thread: the run is interrupted
                interrupted, signal_name = True, getattr(outcome, "signal_name", "SIGINT")
            elif failure is None:  # glmfb's own failure (not a verdict): raised once the others stopped
                failure = outcome
            stop.set()
            outcome = _interrupted_verdict(definitions[index], RUNNING_WHY.format(signal=signal_name))
        elif interrupted:  # it came back after the interruption: it was stopped, not finished
            outcome = _interrupted_verdict(definitions[index], RUNNING_WHY.format(signal=signal_name))
        results[index] = outcome
        while reported in results:
            if on_done is not None:
                on_done(definitions[reported], results[reported])
            reported += 1

    while running or (pending and not (interrupted or failure)):
        try:
            while pending and not (interrupted or failure):
                index = next_startable(places, pending, running.values(), capacity)
                if index is None:
                    break
                start(index)
            try:
                collect(*finished.get(timeout=POLL_S))
            except queue.Empty:
                if context.cancel is not None and context.cancel.is_set():
                    stop.set()
                if not any(thread.is_alive() for thread in threads) and finished.empty():
                    running.clear()  # interrupted between being marked running and its thread's start
                    # (every thread puts its outcome before it ends, so none is lost here)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: stop what runs, start nothing more
            if not interrupted:
                interrupted, signal_name = True, getattr(exc, "signal_name", "SIGINT")
            stop.set()
    if failure is not None:
        raise failure
    for index in range(len(definitions)):
        results.setdefault(index, _interrupted_verdict(definitions[index], NOT_RUN_WHY))
    for index in range(reported, len(definitions)):
        if on_done is not None:
            on_done(definitions[index], results[index])
    return [results[index] for index in range(len(definitions))], interrupted


def _interrupted_verdict(definition: ProbeDefinition, why: str) -> Verdict:
    """The error verdict of a definition the interruption stopped or never started."""
    verdict = Verdict.harness_error(definition.probe, definition.name, why,
                                    next=[run_step([definition.name])])
    if definition.expect is not None:  # an interrupted probe never meets its expectation
        verdict = replace(verdict, expect=definition.expect, expect_met=False)
    return verdict


def definition_fields(definition: ProbeDefinition) -> dict[str, Any]:
    """The definition as a plain dict (for listings and agents)."""
    spec = definition.spec
    data = {k: v for k, v in dataclasses.asdict(spec).items() if v not in (None, (), {})}
    data["source"] = str(definition.source)
    if definition.description:
        data["description"] = definition.description
    if definition.expect is not None:
        data["expect"] = definition.expect.to_dict()
    return data
