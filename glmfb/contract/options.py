"""Probe options, declared once, on the probe's config dataclass.

::

    @dataclass(frozen=True)
    class GapConfig:
        name: str
        baseline: Target
        candidate: Target
        threshold: float = option(0.05, FRACTION, "Largest acceptable gap.")
        budget_s: float = option(40.0, SECONDS, "Time for the interleaved measurement.",
                                 key="budget")

One declaration gives the TOML key (``threshold``), the CLI flag (``--threshold``), the
default, the help text, the unit and the parser, so the command line and a probe definition
can never disagree: a value is parsed by the same function from both (a CLI string, or a
TOML string, number, boolean or list).

Units are explicit. A fraction is written ``5%`` or ``0.05``; a bare number of 1 or more
(``5``) is refused with "write 5% or 0.05", never read as 500%. A duration is written with a
unit (``500ms``, ``2s``, ``1.5min``); a bare number is read in the unit the option declares,
which its metavar names (``SECONDS``, ``MS``). Rates are in Hz.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glmfb.contract.errors import InputError
from glmfb.contract.units import (
    OptionValueError,
    format_shape,
    parse_bool,
    parse_fraction,
    parse_hertz,
    parse_int,
    parse_milliseconds,
    parse_number,
    parse_seconds,
    parse_shape,
    parse_str,
)

OPTION_METADATA = "glmfb.option"


@dataclass(frozen=True)
class ValueType:
    """How one kind of option value is written, parsed, shown and described in JSON Schema.

    ``parse`` takes what a user wrote (a CLI string, or a TOML value) and returns the value
    the config holds, or raises :class:`OptionValueError`.
    """

    name: str
    metavar: str
    parse: Callable[[Any], Any]
    show: Callable[[Any], str] = str
    schema: Mapping[str, Any] = field(default_factory=dict)
    repeatable: bool = False  # CLI: the flag repeats; TOML: a list
    is_flag: bool = False  # CLI: --x / --no-x
    parse_all: Callable[[Any], Any] | None = None  # a repeatable option parsed as a whole
    check: Callable[[Any], Any] | None = None  # for a value already typed (Python API); default: parse
    write: Callable[[Any], Any] | None = None  # the value as a user writes it (TOML, a next step); default: as JSON

    def parse_many(self, raw: Any) -> Any:
        """A repeatable option's value: from a TOML value or the CLI's repeated strings."""
        if self.parse_all is not None:
            return self.parse_all(raw)
        items = raw if isinstance(raw, (list, tuple)) else [raw]
        return tuple(self.parse(item) for item in items)



# --------------------------------------------------------------------------------------------
# Value types
# --------------------------------------------------------------------------------------------


def _number(value: float) -> str:
    """A number as short as it reads back exactly: ``12``, ``0.5``, ``1.2345678e-07``."""
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


def _number_value(value: Any) -> Any:
    """A number for JSON: an int where it is whole (``100`` Hz, not ``100.0``)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _show_seconds(value: Any) -> str:
    return "none" if value is None else f"{value:g}s"


def _show_ms(value: Any) -> str:
    return "none" if value is None else f"{value:g}ms"


def _show_fraction(value: Any) -> str:
    return "none" if value is None else f"{value * 100:g}%"


def _at_least(parse: Callable[[Any], Any], minimum: float, strict: bool = False) -> Callable[[Any], Any]:
    def checked(raw: Any) -> Any:
        value = parse(raw)
        if value < minimum or (strict and value == minimum):
            relation = "above" if strict else "at least"
            raise OptionValueError(f"{raw!r} must be {relation} {minimum:g}")
        return value

    return checked


def _check_fraction(value: Any) -> float:
    """A fraction given as a number in code is not ambiguous (5.0 is 500%); it must be finite
    and not negative."""
    number = parse_number(value, "a fraction", "write 5% or 0.05")
    if number < 0:
        raise OptionValueError(f"{value!r} is negative", "write 5% or 0.05")
    return number


FRACTION = ValueType("fraction", "FRACTION", parse_fraction, _show_fraction,
                     {"type": ["string", "number"], "description": "5% or 0.05"}, check=_check_fraction,
                     write=lambda v: f"{_number(round(v * 100, 12))}%")
SECONDS = ValueType("seconds", "SECONDS", _at_least(parse_seconds, 0.0, strict=True), _show_seconds,
                    {"type": ["string", "number"], "description": "a duration: 2s, 500ms (a bare number is seconds)"},
                    write=lambda v: f"{_number(v)}s")
SECONDS_OR_ZERO = ValueType("seconds", "SECONDS", parse_seconds, _show_seconds,
                            {"type": ["string", "number"], "description": "a duration: 2s, 500ms (a bare number is seconds)"},
                            write=lambda v: f"{_number(v)}s")
MILLISECONDS = ValueType("milliseconds", "MS", _at_least(parse_milliseconds, 0.0, strict=True), _show_ms,
                         {"type": ["string", "number"], "description": "a duration: 10ms, 0.01s (a bare number is milliseconds)"},
                         write=lambda v: f"{_number(v)}ms")
HERTZ = ValueType("hertz", "HZ", _at_least(parse_hertz, 0.0, strict=True), lambda v: f"{v:g}",
                  {"type": ["string", "number"], "description": "a rate in Hz"}, write=_number_value)
BOOL = ValueType("bool", "BOOL", parse_bool, lambda v: "true" if v else "false",
                 {"type": "boolean"}, is_flag=True)
INT = ValueType("int", "N", parse_int, str, {"type": "integer"})
POSITIVE_INT = ValueType("int", "N", _at_least(parse_int, 1), lambda v: "none" if v is None else str(v),
                         {"type": "integer", "minimum": 1})
NONNEGATIVE_INT = ValueType("int", "N", _at_least(parse_int, 0), str, {"type": "integer", "minimum": 0})
STR = ValueType("str", "TEXT", parse_str, str, {"type": "string"})
SHAPES = ValueType("shape", "SHAPE", parse_shape, lambda v: " ".join(format_shape(s) for s in v) or "none",
                   {"type": "array", "items": {"type": ["string", "array"]}, "description": "shapes such as 8x4096"},
                   repeatable=True, write=lambda v: [format_shape(s) for s in v])
GLOBS = ValueType("glob", "GLOB", parse_str, lambda v: " ".join(v) or "none",
                  {"type": "array", "items": {"type": "string"}}, repeatable=True)


def nonnegative_float(name: str = "number") -> ValueType:
    return ValueType(name, "X", _at_least(parse_number, 0.0),
                     lambda v: "none" if v is None else f"{v:g}", {"type": "number", "minimum": 0},
                     write=_number_value)


def choice(*choices: str) -> ValueType:
    def parse(raw: Any) -> str:
        value = parse_str(raw)
        if value not in choices:
            raise OptionValueError(f"{raw!r} is not one of {', '.join(choices)}", f"use one of {', '.join(choices)}")
        return value

    return ValueType("choice", "|".join(choices).upper(), parse, str, {"enum": list(choices)})


def path_type(metavar: str = "FILE") -> ValueType:
    def parse(raw: Any) -> Path:
        return Path(parse_str(raw))

    return ValueType("path", metavar, parse, lambda v: "none" if v is None else str(v), {"type": "string"})


def parse_command(raw: Any, example: str = '["{python}", "prog.py"]') -> tuple[str, ...]:
    """A command line from what a user wrote: a string (split as a shell would; no shell runs
    it) or a list of strings (TOML, the agent server). Raises :class:`OptionValueError`."""
    import shlex

    if isinstance(raw, str):
        try:
            words = shlex.split(raw)
        except ValueError as exc:
            raise OptionValueError(f"{raw!r} does not split into words: {exc}",
                                   "quote it as a shell would, or give a list of strings") from None
    elif isinstance(raw, (list, tuple)) and all(isinstance(word, str) for word in raw):
        words = list(raw)
    else:
        raise OptionValueError(f"{raw!r} is not a command line", f"write a string, or a list such as {example}")
    if not words or not all(words):
        raise OptionValueError(f"{raw!r} is an empty command line", "give the program to run and its arguments")
    return tuple(words)


def command_type(description: str, example: str) -> ValueType:
    """A command line glmfb runs (a string or a list of strings; none: ``()``). Its type's name,
    ``command``, is what the agent server refuses unless it runs with ``--allow-commands``
    (glmfb/workflows/mcp/tools/probes.py)."""
    import shlex

    def parse(raw: Any) -> tuple[str, ...]:
        return parse_command(raw, example)

    return ValueType("command", "COMMAND", parse, lambda v: shlex.join(v) if v else "none",
                     {"type": ["string", "array"], "items": {"type": "string"}, "description": description},
                     check=lambda v: () if v == () else parse(v), write=lambda v: list(v) if v else None)


# --------------------------------------------------------------------------------------------
# Declarations
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptionDecl:
    """What ``option(...)`` stores in a dataclass field's metadata."""

    type: ValueType
    help: str
    key: str | None = None  # TOML key; default: the attribute name
    flag: str | None = None  # CLI flag; default: --key with dashes
    cli: bool = True  # offered on the command line
    toml: bool = True  # accepted in a probe definition


def option(default: Any, type: ValueType, help: str, *, key: str | None = None, flag: str | None = None,
           cli: bool = True, toml: bool = True) -> Any:
    """A dataclass field that is a probe option (see the module docstring)."""
    decl = OptionDecl(type, help, key, flag, cli, toml)
    return field(default=default, metadata={OPTION_METADATA: decl})


@dataclass(frozen=True)
class OptionSpec:
    """One declared option of a config type, resolved."""

    attr: str
    key: str
    flag: str
    default: Any
    type: ValueType
    help: str
    cli: bool
    toml: bool

    @property
    def metavar(self) -> str:
        return self.type.metavar

    def parse(self, raw: Any) -> Any:
        """The value from what a user wrote (raises :class:`OptionValueError`)."""
        return self.type.parse_many(raw) if self.type.repeatable else self.type.parse(raw)

    def write(self, value: Any) -> Any:
        """``value`` (as the config holds it) written as a user writes it in a probe definition
        and as a next step's arguments carry it: ``"5%"``, ``"2s"``, ``["8x4096"]``, ``true``."""
        if value is None or self.type.write is None:
            return value
        return self.type.write(value)

    def show_default(self) -> str:
        return self.type.show(self.default)

    def json_schema(self) -> dict[str, Any]:
        schema = dict(self.type.schema)
        schema["description"] = self.help + (f" ({schema['description']})" if "description" in schema else "")
        schema["default"] = _json_default(self.default)
        return schema


def _json_default(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_json_default(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def options_of(config_type: type) -> tuple[OptionSpec, ...]:
    """The declared options of a config dataclass, in declaration order."""
    cached = _SPEC_CACHE.get(config_type)
    if cached is not None:
        return cached
    specs: list[OptionSpec] = []
    for f in dataclasses.fields(config_type):
        decl = f.metadata.get(OPTION_METADATA)
        if decl is None:
            continue
        key = decl.key or f.name
        default = f.default if f.default is not dataclasses.MISSING else None
        specs.append(OptionSpec(
            attr=f.name, key=key, flag=decl.flag or "--" + key.replace("_", "-"), default=default,
            type=decl.type, help=decl.help, cli=decl.cli, toml=decl.toml,
        ))
    result = tuple(specs)
    _SPEC_CACHE[config_type] = result
    return result


_SPEC_CACHE: dict[type, tuple[OptionSpec, ...]] = {}


def defaults_of(config_type: type) -> dict[str, Any]:
    """``{attribute: default}`` of every declared option."""
    return {spec.attr: spec.default for spec in options_of(config_type)}


def parse_table(config_type: type, table: Mapping[str, Any], label: str, *,
                extra: Iterable[OptionSpec] = ()) -> dict[str, Any]:
    """A definition's ``options = {...}`` table -> ``{attribute: value}`` for the keys given.

    An unknown key or a value that does not parse raises :class:`InputError` naming
    ``label``, the key, the problem and what to write."""
    specs = {spec.key: spec for spec in (*options_of(config_type), *extra) if spec.toml}
    values: dict[str, Any] = {}
    for key, raw in table.items():
        spec = specs.get(key)
        if spec is None:
            raise InputError(f"{label}: unknown option {key!r}", f"known: {', '.join(sorted(specs))}")
        values[spec.attr] = _parse(spec, raw, f"{label}: option {key!r}")
    return values


def parse_given(specs: Iterable[OptionSpec], given: Mapping[str, Any]) -> dict[str, Any]:
    """Command-line values (``{attribute: raw}``, None where not given) -> parsed values."""
    values: dict[str, Any] = {}
    for spec in specs:
        raw = given.get(spec.attr)
        if raw is None or (spec.type.repeatable and not raw):
            continue
        values[spec.attr] = _parse(spec, raw, spec.flag)
    return values


def _parse(spec: OptionSpec, raw: Any, label: str) -> Any:
    try:
        return spec.parse(raw)
    except OptionValueError as exc:
        raise InputError(f"{label}: {exc.problem}", exc.hint or None) from None


def options_schema(config_type: type) -> dict[str, Any]:
    """JSON Schema of a config type's options (for agents and docs)."""
    return {
        "type": "object",
        "properties": {spec.key: spec.json_schema() for spec in options_of(config_type) if spec.toml},
        "additionalProperties": False,
    }


FILE = path_type("FILE")
DIR = path_type("DIR")


def check_declared(config: Any) -> None:
    """Check a config built directly (the Python API) against its declared options: each
    value must parse as its type would parse it from a user (a budget of 0 s, a threshold of
    5, a device 'tpu' are refused). Raises :class:`InputError` naming the option."""
    for spec in options_of(type(config)):
        value = getattr(config, spec.attr)
        if value is None or spec.type.name == "path":
            continue
        if spec.type.check is not None:
            try:
                spec.type.check(value)
            except OptionValueError as exc:
                raise InputError(f"option {spec.key!r}: {exc.problem}", exc.hint or None) from None
            continue
        _parse(spec, value, f"option {spec.key!r}")
