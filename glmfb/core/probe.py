"""The probe API: what a probe is, how one is found, and what it gets to run.

A probe kind (``diff``, ``bench``, ``gil``, ``gap``, or one installed by another package) is an
object that satisfies :class:`Probe`:

- ``kind``, ``layer``, ``summary``: its name, the layer of the stack it speaks about, a line
  of help;
- ``form``: what it runs against, two sides (``BASELINE CANDIDATE``) or one (``--target`` or
  a command line after ``--``);
- ``config_type``: a frozen dataclass whose option fields are declared once with
  :func:`glmfb.contract.options.option`; the CLI flags and the TOML keys are generated from them;
- ``build(spec) -> config``: a config from a :class:`ProbeSpec`, the same for a command line
  and a probe definition;
- ``run(config, ctx) -> Verdict``: the engine. It never prints, never exits, and raises
  :class:`~glmfb.contract.errors.TargetFailed` when the target breaks; the host boundary
  (:mod:`glmfb.core.host`) turns that and anything unexpected into an error verdict;
- ``evidence_types`` and ``rules()``: its typed evidence kinds and its ordered rules;
- ``timing`` and ``cores(config)``: how a run of it shares the machine in a suite. A timing
  probe (its verdict rests on wall times: bench, gil, gap) runs with the machine to itself; a
  numerics probe (diff: its verdict is the same however loaded the host is) may run beside
  other numerics probes, occupying ``cores(config)`` of the machine's cores.

Which kinds exist (built-in, :data:`glmfb.core.registry.BUILTIN_PROBES`, and installed through the
entry-point group ``glmfb.probes``) is :mod:`glmfb.core.registry`, read without importing a probe;
:func:`get_probe` imports one. The schema's probe enum, ``glmfb run``, ``glmfb gate`` and the
CLI are all derived from this registry.

Subclass :class:`BaseProbe` to get ``build`` and ``rules`` for free.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from glmfb.contract.clock import SYSTEM_CLOCK, Clock
from glmfb.contract.errors import InputError, UsageError
from glmfb.contract.options import SECONDS, OptionSpec, ValueType
from glmfb.contract.units import OptionValueError
from glmfb.contract.verdict import Layer, Metric, Verdict
from glmfb.core.registry import import_ref, known_kinds, probe_entries

if TYPE_CHECKING:
    from glmfb.contract.evidence import Evidence
    from glmfb.core.rules import Rule
    from glmfb.core.targets import ImportFence, Target

def _show_duration(seconds: float) -> str:
    return f"{seconds / 60:g}min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s"


TIMEOUT = OptionSpec(
    attr="timeout_s", key="timeout", flag="--timeout", default=15 * 60.0,
    type=ValueType("seconds", "DURATION", SECONDS.parse, _show_duration, SECONDS.schema),
    help="Stop the probe, and every process it started, after this long.", cli=True, toml=True,
)
"""The one timeout of a probe run: ``--timeout`` on every command that runs probes,
``timeout`` in a definition and in an agent's tool call; 15 minutes when none is given."""


def parse_timeout(raw: Any, label: str) -> float:
    """A timeout as a user wrote it (``30s``, ``10min``; a bare number is seconds) in seconds;
    anything else, zero included, is an :class:`InputError` that starts with ``label``."""
    try:
        return float(TIMEOUT.parse(raw))
    except OptionValueError as exc:
        raise InputError(f"{label}: {exc.problem}", exc.hint or "write it as 30s or 10min") from None


class _Imported:
    """A class attribute imported from ``module:attr`` on first use, then kept on the class."""

    def __init__(self, ref: str) -> None:
        self.ref = ref
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: object, owner: type) -> Any:
        module_name, _, attr = self.ref.partition(":")
        value = getattr(importlib.import_module(module_name), attr)
        setattr(owner, self.name, value)
        return value


def imported(ref: str) -> Any:
    """``config_type = imported("my_probe.config:MyConfig")``: a probe attribute imported on
    first use, so that listing the probes (``glmfb --help``) imports none of their configs,
    evidence or rules."""
    return _Imported(ref)


class ProbeForm(str, Enum):
    """What a probe runs against."""

    PAIR = "pair"  # BASELINE CANDIDATE (each a target, or a saved result the probe reads)
    SINGLE = "single"  # --target TARGET, or a command line after -- (accepts_command)


def _ignore(message: str) -> None:
    pass


@dataclass(frozen=True)
class ProbeContext:
    """What a probe gets besides its config: where its artifacts go, a progress callback,
    the clock, and the user's rules files. ``workdir`` and ``fence`` are for a supervised run
    of a checkout that is not the user's (``glmfb bisect``): the child's working folder, and
    where its imports may not come from (an import past the fence makes the verdict an error)."""

    run_id: str
    artifact_dir: Path
    progress: Callable[[str], None] = field(default=_ignore, compare=False)
    clock: Clock = SYSTEM_CLOCK
    rules_files: tuple[Path, ...] = ()
    workdir: Path | None = None
    fence: ImportFence | None = None

    def artifact(self, name: str) -> Path:
        """A path for one artifact of this probe (its folder is created on first use)."""
        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        return self.artifact_dir / name

    def rules(self, kind: str, builtin: Sequence[Rule[Any]]) -> list[Rule[Any]]:
        """The ordered rule list for this run: the user's rules, then the built-in ones."""
        from glmfb.core.rules import rules_for

        return rules_for(kind, builtin, self.rules_files)

    def child(self, name: str) -> ProbeContext:
        """A context for a probe run inside this one (gap runs gil): artifacts in a subfolder."""
        return dataclasses.replace(self, artifact_dir=self.artifact_dir / safe_component(name))


def safe_component(name: str) -> str:
    """``name`` as one path component: no separators, no ``..``, nothing hidden."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".")
    return cleaned or "_"


@dataclass(frozen=True)
class ProbeSpec:
    """A probe to run as the command line or a probe definition gives it: its name, what it
    runs against, and its options already parsed (by attribute name)."""

    kind: str
    name: str
    label: str  # how errors name it: "probes/bench.toml: probe 'x'" or "glmfb bench"
    baseline: str | None = None
    candidate: str | None = None
    target: str | None = None
    command: tuple[str, ...] = ()
    args: Mapping[str, Any] = field(default_factory=dict)
    baseline_args: Mapping[str, Any] = field(default_factory=dict)
    candidate_args: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    base_dir: Path | None = None  # a definition's folder: relative paths resolve there first

    def side_args(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Keyword arguments of the baseline and of the candidate."""
        return {**self.args, **self.baseline_args}, {**self.args, **self.candidate_args}

    def side(self, which: str) -> Target:
        """The baseline, candidate or target as a :class:`~glmfb.core.targets.Target`."""
        from glmfb.contract.errors import TargetError
        from glmfb.core.targets import Target

        ref = getattr(self, which)
        if not ref:
            raise InputError(f"{self.label}: no {which} given")
        if which == "target":
            target = Target(ref, dict(self.args), self.base_dir)
        else:
            baseline_args, candidate_args = self.side_args()
            target = Target(ref, baseline_args if which == "baseline" else candidate_args, self.base_dir)
        try:
            target.check()
        except TargetError as exc:
            raise TargetError(f"{self.label}: {which}: {exc.message}", exc.hint) from None
        return target

    def anchored(self, ref: str) -> str:
        """``ref``, a side or a target option as the definition writes it, made absolute against
        the definition's folder (:func:`anchored`)."""
        return anchored(ref, self.base_dir, self.kind)

    def code_folder(self) -> Path | None:
        """The folder of the first file a side names (candidate, then target, then baseline),
        found beside the definition or else in the working folder: whose commit a run ran.
        None when no side names a file that exists (module names, serving endpoints)."""
        from glmfb.core.targets import is_file_ref

        for ref in (self.candidate, self.target, self.baseline):
            if not ref or _outside(ref, self.kind):
                continue
            path_part = self.anchored(ref).partition("#")[0]
            location, colon, attr = path_part.rpartition(":")
            path = Path(location if colon and location and attr and is_file_ref(location) else path_part)
            if path.exists():
                return (path if path.is_dir() else path.parent).resolve()
        return None

    def resolve_path(self, value: str | Path) -> Path:
        """A file path from the spec: absolute, beside the definition, or in the working dir."""
        path = Path(value)
        if path.is_absolute() or self.base_dir is None:
            return path
        beside = Path(os.path.normpath(self.base_dir / path))
        return path if not beside.exists() and path.exists() else beside


@dataclass(frozen=True)
class MetricSpec:
    """A metric a probe's verdicts carry, declared by the probe, as the history reads it:
    which way it regresses (``worse``: ``"higher"`` or ``"lower"``), whether it is already a
    change against a baseline (``relative``: two segments of its series are compared by the
    difference of their levels, not by ratio), its unit and what it is. A recorded name may
    carry a qualifier in brackets (bench's ``candidate_time[8x4096]``, one series per shape):
    it is read as the declared metric before the bracket."""

    name: str
    worse: str = "higher"
    relative: bool = False
    unit: str = ""
    about: str = ""


def evidence_data(verdict: Verdict) -> list[dict[str, Any]]:
    """A verdict's evidence items as data (typed items as their JSON, raw ones as they are)."""
    return [item if isinstance(item, dict) else item.to_dict() for item in verdict.evidence]


def measured_on_busy_host(verdict: Verdict) -> bool:
    """Whether the probe read a busy host while it measured (evidence ``host_load``, ``busy``)."""
    return any(item.get("kind") == "host_load" and item.get("busy") for item in evidence_data(verdict))


def side_times(verdict: Verdict, kind: str, samples: str, name: str) -> tuple[Metric, ...]:
    """Each side's own time as a metric (``name`` with ``{side}``): the batch-means statistic
    with its 95% interval (:func:`glmfb.core.measure.intervals.time_interval`) of the samples an
    evidence item of ``kind`` keeps per side in time order (the key ``samples``, with
    ``{side}``). None from a run on a busy host: an interleaved comparison cancels others' load
    out of the change, not out of either side's own time."""
    from glmfb.core.measure.intervals import time_interval

    if measured_on_busy_host(verdict):
        return ()
    found: list[Metric] = []
    for item in evidence_data(verdict):
        if item.get("kind") != kind:
            continue
        for side in ("baseline", "candidate"):
            interval = time_interval(item.get(samples.format(side=side)) or ())
            if interval is not None:
                found.append(Metric(name.format(side=side), interval[0], "s", ci=(interval[1], interval[2])))
    return tuple(found)


def metric_spec(probe: Any, name: str) -> MetricSpec | None:
    """What ``probe`` declares of metric ``name`` (its ``metrics``; a qualifier in brackets left
    out), or None: a probe that declares nothing, or a name it does not declare."""
    declared = {spec.name: spec for spec in getattr(probe, "metrics", ())}
    return declared.get(name) or declared.get(name.partition("[")[0])


@dataclass(frozen=True)
class ReportSection:
    """How report.html shows a probe's verdicts: where its section goes (lower first), the
    question it answers (under the section's title), and its plots: ``"module:attr"`` naming
    a sequence of :class:`glmfb.core.plotting.PlotSpec`, imported only when a page is drawn."""

    order: int = 100
    question: str = ""
    plots: str = ""


@dataclass(frozen=True)
class ProbeCommand:
    """A command a probe brings besides its own (diff brings ``capture``): ``glmfb <name>`` and
    an agent tool of that name are generated from this declaration, as a probe's are from the
    probe. It runs ``job`` (``"module:function"``, called as ``job(config, progress) -> dict``
    in a supervised child) and answers with that result, not a verdict.

    Its options are declared on its config type, given as ``config`` (the class, or a
    ``"module:attr"`` reference imported on first use, so that listing the commands imports
    no config) and read as ``config_type`` (:func:`glmfb.contract.options.option`); its fixed
    arguments are the config fields named in ``positional`` (written without a flag, in
    order), ``flags`` (argument -> flag) and ``kwargs`` (an object argument written
    ``KEY=VALUE``, argument -> flag). About them: ``help`` (argument -> its help line),
    ``targets`` (those that are a target, ``file.py:factory``), ``paths`` (those that are a
    file or folder), ``inputs`` (fixed arguments or option keys naming a file that must exist)
    and ``required`` (flags and option keys that must be given; positional ones always are).
    ``result`` is the JSON Schema of each field of the job's result, and ``done`` the line said
    when it finished (``str.format`` over the result and the fixed arguments)."""

    name: str
    summary: str
    config: type | str
    job: str
    positional: tuple[str, ...] = ()
    flags: Mapping[str, str] = field(default_factory=dict)
    kwargs: Mapping[str, str] = field(default_factory=dict)
    help: Mapping[str, str] = field(default_factory=dict)
    targets: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    result: Mapping[str, Any] = field(default_factory=dict)
    done: str = ""

    @property
    def config_type(self) -> type:
        """The config class (imported now when ``config`` names it)."""
        if isinstance(self.config, str):
            resolved: type = import_ref(self.config)
            return resolved
        return self.config

    @property
    def fixed(self) -> tuple[str, ...]:
        """Every fixed argument (not an option), in the order the command line writes them."""
        return (*self.positional, *self.flags, *self.kwargs)


@runtime_checkable
class Probe(Protocol):
    """A probe kind (see the module docstring)."""

    kind: str
    layer: Layer
    summary: str
    form: ProbeForm
    config_type: type
    evidence_types: tuple[type[Evidence], ...]
    accepts_command: bool
    candidate_optional: bool
    report: ReportSection
    agent_hint: str  # one line for agents: when to reach for this probe (the MCP server's instructions)
    commands: tuple[ProbeCommand, ...]
    timing: bool  # its verdict rests on wall times: in a suite it runs with the machine to itself
    metrics: tuple[MetricSpec, ...]  # its metrics' direction and units (the history reads them)

    def default_name(self, spec: ProbeSpec) -> str: ...

    def series(self, verdict: Verdict) -> tuple[Metric, ...]: ...

    def cores(self, config: Any) -> int: ...

    def rules(self) -> Sequence[Rule[Any]]: ...

    def build(self, spec: ProbeSpec) -> Any: ...

    def run(self, config: Any, ctx: ProbeContext) -> Verdict: ...


@dataclass(frozen=True)
class Placement:
    """How one probe run shares the machine in a suite (:func:`placement`): ``exclusive``, it
    has the machine to itself; else it occupies ``cores`` of it, beside other such runs."""

    exclusive: bool
    cores: int


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def placement(probe: Any, config: Any, capacity: int) -> Placement:
    """How a run of ``probe`` on ``config`` shares a machine of ``capacity`` cores: a timing
    probe (``timing`` true, or not said: a probe from another package that predates it) has
    the machine to itself, and so has a run that occupies every core or whose ``cores``
    breaks; any other occupies ``cores(config)`` of them."""
    if getattr(probe, "timing", True) is not False:
        return Placement(True, capacity)
    try:
        cores = max(1, int(probe.cores(config)))
    except Exception:  # a probe's broken cores() must not stop the suite: it runs alone
        return Placement(True, capacity)
    return Placement(cores >= capacity, min(cores, capacity))


class BaseProbe:
    """Defaults for :class:`Probe`: a ``build`` that fills the config's ``name``,
    ``baseline``/``candidate``/``target``/``command`` fields from the spec plus the parsed
    options, and ``rules()`` from ``builtin_rules``."""

    kind: ClassVar[str] = ""
    layer: ClassVar[Layer] = Layer.HARNESS
    summary: ClassVar[str] = ""
    form: ClassVar[ProbeForm] = ProbeForm.PAIR
    config_type: ClassVar[type] = object
    evidence_types: ClassVar[tuple[type[Evidence], ...]] = ()
    accepts_command: ClassVar[bool] = False
    candidate_optional: ClassVar[bool] = False
    builtin_rules: ClassVar[tuple[Rule[Any], ...]] = ()
    report: ClassVar[ReportSection] = ReportSection()
    agent_hint: ClassVar[str] = ""
    commands: ClassVar[tuple[ProbeCommand, ...]] = ()
    timing: ClassVar[bool] = True  # the safe default: a probe that does not say runs alone
    metrics: ClassVar[tuple[MetricSpec, ...]] = ()

    def outside_side(self, text: str) -> bool:
        """Whether a side written as ``text`` names something outside the file system that this
        probe addresses (diff: a serving endpoint, ``openai:URL``), which no root holds; raises
        :class:`~glmfb.contract.errors.UsageError` when it is such a side, malformed. None by default."""
        return False

    def series(self, verdict: Verdict) -> tuple[Metric, ...]:
        """The secondary series of a verdict, recorded in the history beside its headline
        metric (bench: each side's own time per call, per shape): none, unless the probe says."""
        return ()

    def default_name(self, spec: ProbeSpec) -> str:
        """The verdict's name when none is given: the kind."""
        return self.kind

    def cores(self, config: Any) -> int:
        """How many cores a run on ``config`` occupies (read only when ``timing`` is False):
        one, unless the probe says more."""
        return 1

    def rules(self) -> Sequence[Rule[Any]]:
        return self.builtin_rules

    def build(self, spec: ProbeSpec) -> Any:
        names = {f.name for f in dataclasses.fields(self.config_type)}
        values: dict[str, Any] = dict(spec.options)
        if "name" in names:
            values["name"] = spec.name
        for which in ("baseline", "candidate", "target"):
            if which in names:
                values[which] = spec.side(which) if getattr(spec, which) else None
        if "command" in names:
            values["command"] = tuple(spec.command)
        try:
            return self.config_type(**values)
        except TypeError as exc:
            raise InputError(f"{spec.label}: {exc}") from None

    def run(self, config: Any, ctx: ProbeContext) -> Verdict:  # pragma: no cover - abstract
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------


_LOADED: dict[str, Probe] = {}


def get_probe(kind: str) -> Probe:
    """The probe of a kind, imported on first use; an unknown kind is an :class:`InputError`."""
    probe = _LOADED.get(kind)
    if probe is not None:
        return probe
    entry = next((e for e in probe_entries() if e.kind == kind), None)
    if entry is None:
        raise InputError(f"unknown probe kind {kind!r}", f"use one of {', '.join(known_kinds())}")
    try:
        obj = import_ref(entry.ref)
    except Exception as exc:
        raise InputError(f"probe {kind!r} ({entry.ref}, {entry.source}) does not load: "
                         f"{type(exc).__name__}: {exc}", "fix or uninstall the package that provides it") from exc
    if isinstance(obj, type):
        obj = obj()
    missing = [name for name in ("kind", "layer", "form", "config_type", "build", "run") if not _declares(obj, name)]
    if missing:
        raise InputError(f"probe {kind!r} ({entry.ref}) is not a glmfb probe: it lacks {', '.join(missing)}",
                         "subclass glmfb.core.probe.BaseProbe")
    if obj.kind != kind:
        raise InputError(f"probe entry {kind!r} ({entry.ref}) says its kind is {obj.kind!r}")
    _LOADED[kind] = obj
    return obj


def all_probes() -> list[Probe]:
    return [get_probe(kind) for kind in known_kinds()]


def outside_side(text: str, kind: str | None = None) -> bool:
    """Whether ``text``, written as a side, names something outside the file system (asks probe
    ``kind``, or every loadable probe when None: a command a probe brings). Raises
    :class:`~glmfb.contract.errors.UsageError` when a probe claims it and it is malformed."""
    kinds = [kind] if kind is not None else known_kinds()
    for name in kinds:
        try:
            probe = get_probe(name)
        except InputError:
            continue
        claims = getattr(probe, "outside_side", None)
        if claims is not None and claims(text):
            return True
    return False


def anchored(ref: str, base_dir: Path | None, kind: str | None = None) -> str:
    """A side (or a target option) ``ref`` as a definition in ``base_dir`` writes it, made
    absolute there, so it names the same file from any working folder and in any worktree:
    ``path/to/file.py:attr`` and a path (``DIR``, ``FILE#selector``) that is a file reference or
    exists beside the definition. Left as written: what probe ``kind`` addresses outside the
    file system (diff's ``openai:URL``), a module name (``package.module:attr``, found on the
    import path) and an absolute path."""
    from glmfb.core.targets import is_file_ref

    if base_dir is None or _outside(ref, kind):
        return ref
    path_part, sep, selector = ref.partition("#")
    location, colon, attr = path_part.rpartition(":")
    if colon and location and attr:
        if is_file_ref(location) and not Path(location).is_absolute():
            return f"{os.path.normpath(base_dir / location)}:{attr}{sep}{selector}"
        return ref
    if path_part and not Path(path_part).is_absolute() and (is_file_ref(path_part) or (base_dir / path_part).exists()):
        return f"{os.path.normpath(base_dir / path_part)}{sep}{selector}"
    return ref


def _outside(ref: str, kind: str | None) -> bool:
    """:func:`outside_side`, with a malformed claim read as outside too (it is never a path;
    the probe says what is wrong with it where the side is used)."""
    try:
        return outside_side(ref, kind)
    except UsageError:
        return True


def probe_commands() -> dict[str, ProbeCommand]:
    """The commands the probes bring (diff's ``capture``), by name: every loadable probe's, in
    registry order; a name taken already (by another probe's command or a probe kind) is
    skipped with a warning."""
    found: dict[str, ProbeCommand] = {}
    for kind in known_kinds():
        try:
            probe = get_probe(kind)
        except InputError:
            continue  # said where the probe itself is used
        for command in probe.commands:
            if command.name in found or command.name in known_kinds():
                warnings.warn(f"glmfb: the command {command.name!r} of probe {kind!r} is ignored: that name is "
                              "taken", stacklevel=2)
                continue
            found[command.name] = command
    return found


def _declares(obj: Any, name: str) -> bool:
    """Whether ``obj`` has the attribute, without reading it (a lazy attribute stays unimported)."""
    return name in getattr(obj, "__dict__", {}) or any(name in vars(k) for k in type(obj).__mro__)


def report_section(kind: str) -> ReportSection | None:
    """How report.html shows a kind's verdicts; None for a kind this installation does not
    know or cannot load (its verdicts still get a section, after the known ones)."""
    if kind not in known_kinds():
        return None
    try:
        return get_probe(kind).report
    except InputError:
        return None


def report_order(kinds: Iterable[str]) -> list[str]:
    """Probe kinds in the order of their report sections: the known ones by their section's
    ``order`` (then as registered), then the others by name."""
    registered = known_kinds()

    def key(kind: str) -> tuple[int, int, int, str]:
        section = report_section(kind)
        if section is None:
            return (1, 0, 0, kind)
        return (0, section.order, registered.index(kind), kind)

    return sorted(set(kinds), key=key)


_EVIDENCE_LOADED = False


def load_evidence_types() -> None:
    """Register the evidence kinds of every probe with the contract (:mod:`glmfb.contract.evidence`),
    so that documents are read with them: imported only when a document is read typed."""
    global _EVIDENCE_LOADED
    if _EVIDENCE_LOADED:
        return
    _EVIDENCE_LOADED = True
    from glmfb.contract.evidence import evidence_kind

    for kind in known_kinds():
        try:
            evidence_types = tuple(get_probe(kind).evidence_types)
        except InputError as exc:  # a broken third-party probe must not stop reading verdicts
            warnings.warn(f"glmfb: {exc}", stacklevel=2)
            continue
        for evidence_type in evidence_types:
            evidence_kind(evidence_type)


def reset_registry() -> None:
    """Forget what was found (tests that install a probe at run time)."""
    global _EVIDENCE_LOADED
    probe_entries.cache_clear()
    _LOADED.clear()
    _EVIDENCE_LOADED = False
