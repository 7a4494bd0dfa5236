"""Typed evidence's machinery: the base classes, their JSON codec and the registry of kinds (the
kinds every probe may use are in :mod:`glmfb.contract.evidence`, which re-exports this module).

Every item of a verdict's ``evidence`` is an :class:`Evidence`: a frozen dataclass whose
class attribute ``kind`` names it in JSON (``{"kind": "shape", ...}``). Each kind knows its
JSON form (:meth:`Evidence.to_dict` / :meth:`Evidence.from_dict`, derived from the field
types), its JSON Schema fragment (:meth:`Evidence.json_schema`, which ``glmfb schema``
publishes) and how it renders in a terminal (``__rich__``). A kind this installation does not
know is kept as :class:`RawEvidence`, so nothing is lost when a newer probe's verdict is read.

Cross-probe use goes through these types: ``verdict.find(GilHolder)``, never a key lookup in
a dict.

Field types the codec understands: ``str``, ``int``, ``float``, ``bool``, ``X | None``,
``tuple[X, ...]``, ``Mapping[str, X]``, ``Any`` (plain JSON data), and nested
:class:`Record` dataclasses. Every field is written, None as null, so every item of a kind
has the same keys; a reader fills keys an older writer left out with their defaults.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, TypeVar

from glmfb.contract.text import utf8_text

R = TypeVar("R", bound="Record")
E = TypeVar("E", bound="Evidence")


class EvidenceError(ValueError):
    """Evidence data that does not fit its kind; ``path`` names the field."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


# --------------------------------------------------------------------------------------------
# The codec, derived once per class from its field types
# --------------------------------------------------------------------------------------------

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _float_out(value: float) -> Any:
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def to_json_value(value: Any) -> Any:
    """Turn a value into plain JSON data: tuples to lists, enums and numpy scalars to Python,
    non-finite floats to the strings "nan", "inf", "-inf" (JSON has no NaN)."""
    kind = type(value)
    if kind is str:
        return value if value.isascii() else utf8_text(value)
    if kind is int or kind is bool or value is None:  # the common cases, fast
        return value
    if kind is dict:
        return {utf8_text(str(k)): to_json_value(v) for k, v in value.items()}
    if isinstance(value, Enum):
        return to_json_value(value.value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return utf8_text(str(value))
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _float_out(value)
    if isinstance(value, Mapping):
        return {utf8_text(str(k)): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return to_json_value(item())
        except (TypeError, ValueError):
            pass
    if hasattr(value, "tolist"):
        return to_json_value(value.tolist())
    if hasattr(value, "__fspath__"):
        return utf8_text(str(value))
    raise TypeError(f"cannot store a {type(value).__name__} in a verdict: {value!r}")


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class _Codec:
    decode: Callable[[Any, str], Any]
    encode: Callable[[Any], Any]
    schema: dict[str, Any]
    normalize: Callable[[Any], Any] = _same  # applied when an instance is built


def _codec(hint: Any) -> _Codec:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return _Codec(lambda v, p: v, to_json_value, {}, to_json_value)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        codec = _codec(inner[0]) if len(inner) == 1 else _codec(Any)

        def decode_optional(value: Any, path: str) -> Any:
            return None if value is None else codec.decode(value, path)

        schema = dict(codec.schema)
        if "type" in schema:
            kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            schema["type"] = [*kinds, "null"]
        elif schema:
            schema = {"anyOf": [schema, {"type": "null"}]}
        return _Codec(decode_optional, lambda v: None if v is None else codec.encode(v), schema,
                      lambda v: None if v is None else codec.normalize(v))
    if hint is bool:
        def decode_bool(value: Any, path: str) -> bool:
            if not isinstance(value, bool):
                raise EvidenceError(path, f"expected a boolean, got {value!r:.40}")
            return value
        return _Codec(decode_bool, bool, {"type": "boolean"})
    if hint is int:
        def decode_int(value: Any, path: str) -> int:
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    return int(value)
                raise EvidenceError(path, f"expected an integer, got {value!r:.40}")
            return value
        return _Codec(decode_int, int, {"type": "integer"})
    if hint is float:
        def decode_float(value: Any, path: str) -> float:
            if isinstance(value, str) and value in _NONFINITE:
                return _NONFINITE[value]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise EvidenceError(path, f"expected a number, got {value!r:.40}")
            return float(value)
        return _Codec(decode_float, lambda v: _float_out(float(v)),
                      {"type": ["number", "string"], "description": "non-finite as 'nan', 'inf', '-inf'"})
    if hint is str:
        def decode_str(value: Any, path: str) -> str:
            if not isinstance(value, str):
                raise EvidenceError(path, f"expected a string, got {value!r:.40}")
            return value
        return _Codec(decode_str, str, {"type": "string"}, lambda v: utf8_text(str(v)))
    if origin is tuple:
        item = _codec(args[0] if args else Any)

        def decode_tuple(value: Any, path: str) -> tuple[Any, ...]:
            if not isinstance(value, (list, tuple)):
                raise EvidenceError(path, f"expected a list, got {value!r:.40}")
            return tuple(item.decode(v, f"{path}[{i}]") for i, v in enumerate(value))
        return _Codec(decode_tuple, lambda v: [item.encode(x) for x in v],
                      {"type": "array", "items": item.schema} if item.schema else {"type": "array"},
                      lambda v: tuple(item.normalize(x) for x in v))
    if origin in (Mapping, dict, typing.Mapping) or hint is dict:
        value_codec = _codec(args[1] if len(args) == 2 else Any)

        def decode_mapping(value: Any, path: str) -> Mapping[str, Any]:
            if not isinstance(value, Mapping):
                raise EvidenceError(path, f"expected an object, got {value!r:.40}")
            return {str(k): value_codec.decode(v, f"{path}.{k}") for k, v in value.items()}
        mapping_schema: dict[str, Any] = {"type": "object"}
        if value_codec.schema:
            mapping_schema["additionalProperties"] = value_codec.schema
        return _Codec(decode_mapping, lambda v: {str(k): value_codec.encode(x) for k, x in v.items()},
                      mapping_schema, lambda v: {str(k): value_codec.normalize(x) for k, x in dict(v).items()})
    if isinstance(hint, type) and issubclass(hint, Record):
        record = hint

        def decode_record(value: Any, path: str) -> Record:
            return record._decode(value, path)
        return _Codec(decode_record, lambda v: v.to_dict(), {"$ref": f"#/$defs/record.{record.__name__}"})
    raise TypeError(f"evidence fields cannot have type {hint!r}")


@dataclass(frozen=True)
class _Field:
    name: str
    codec: _Codec
    required: bool
    omit_none: bool


class Record:
    """A frozen dataclass with a JSON form derived from its field types (a row of a table
    inside evidence, or the base of :class:`Evidence`)."""

    _fields_cache: ClassVar[dict[type, tuple[_Field, ...]]] = {}

    @classmethod
    def _codec_fields(cls) -> tuple[_Field, ...]:
        cached = Record._fields_cache.get(cls)
        if cached is not None:
            return cached
        hints = typing.get_type_hints(cls)
        result = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name == "extra":
                continue
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            omit_none = False  # every field is written (null when None): readers see a fixed set of keys
            result.append(_Field(f.name, _codec(hints[f.name]), required, omit_none))
        fields = tuple(result)
        Record._fields_cache[cls] = fields
        return fields

    def __post_init__(self) -> None:
        for f in self._codec_fields():
            value = getattr(self, f.name)
            normalized = f.codec.normalize(value)
            if normalized is not value:
                object.__setattr__(self, f.name, normalized)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for f in self._codec_fields():
            value = getattr(self, f.name)
            if value is None and f.omit_none:
                continue
            data[f.name] = f.codec.encode(value)
        extra = getattr(self, "extra", None)
        if extra:
            data.update({k: v for k, v in extra.items() if k not in data})
        return data

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """Build from JSON data; raises :class:`EvidenceError` naming the offending field."""
        return cls._decode(data, cls.__name__)

    @classmethod
    def _decode(cls: type[R], data: Any, path: str) -> R:
        if not isinstance(data, Mapping):
            raise EvidenceError(path, f"expected an object, got {data!r:.40}")
        values: dict[str, Any] = {}
        known = {"kind"}
        for f in cls._codec_fields():
            known.add(f.name)
            if f.name in data:
                values[f.name] = f.codec.decode(data[f.name], f"{path}.{f.name}")
            elif f.required:
                raise EvidenceError(f"{path}.{f.name}", "required field is missing")
        extra = {k: v for k, v in data.items() if k not in known and k not in cls._legacy_keys()}
        if extra and any(f.name == "extra" for f in dataclasses.fields(cls)):  # type: ignore[arg-type]
            values["extra"] = extra
        return cls(**values)

    @classmethod
    def _legacy_keys(cls) -> frozenset[str]:
        return frozenset()

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        fields = cls._codec_fields()
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {f.name: f.codec.schema for f in fields},
        }
        required = [f.name for f in fields if f.required]
        if required:
            schema["required"] = required
        doc = (cls.__doc__ or "").strip().split("\n\n")[0]
        if doc:
            schema["description"] = " ".join(doc.split())
        return schema

    @classmethod
    def nested_records(cls) -> set[type[Record]]:
        """Record types used in this type's fields, transitively (for ``$defs``)."""
        found: set[type[Record]] = set()
        hints = typing.get_type_hints(cls)
        pending = list(hints.values())
        while pending:
            hint = pending.pop()
            if isinstance(hint, type) and issubclass(hint, Record) and hint not in found:
                found.add(hint)
                pending.extend(typing.get_type_hints(hint).values())
            pending.extend(typing.get_args(hint))
        return found


@dataclass(frozen=True, kw_only=True)
class Evidence(Record):
    """Base class of every evidence kind. Subclasses are frozen, keyword-only dataclasses
    with a class attribute ``kind`` (and ``aliases``: older kinds read as this one). Keys a
    reader does not know (from a newer glmfb) are kept in ``extra`` and written back."""

    extra: Mapping[str, Any] = field(default_factory=dict, repr=False)
    kind: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    title: ClassVar[str] = ""  # how a report names it; default: the kind
    show_in_terminal: ClassVar[bool] = False  # rendered above the verdict panel in the terminal

    @classmethod
    def of(cls: type[E], source: Any) -> E:
        """This kind from an engine's object that holds each of its fields under the same name
        (gap's bandwidth check, its gil finding): typed evidence, no dict written by hand."""
        return cls(**{f.name: getattr(source, f.name) for f in dataclasses.fields(cls) if f.name != "extra"})

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **super().to_dict()}

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        schema = super().json_schema()
        schema["properties"] = {"kind": {"const": cls.kind}, **schema["properties"]}
        schema["required"] = ["kind", *schema.get("required", [])]
        return schema

    def summary_rows(self) -> list[tuple[str, str]]:
        """(field, value) pairs for a compact rendering; lists are counted, not printed."""
        rows: list[tuple[str, str]] = []
        for key, value in self.to_dict().items():
            if key == "kind":
                continue
            if isinstance(value, list):
                text = f"{len(value)} items"
            elif isinstance(value, dict):
                text = f"{len(value)} entries"
            elif isinstance(value, float):
                text = f"{value:.4g}"
            else:
                text = str(value)
            rows.append((key, text))
        return rows

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(title=self.title or self.kind, title_justify="left", show_header=False,
                      box=None, padding=(0, 1))
        table.add_column(style="evidence.key")
        table.add_column()
        for key, value in self.summary_rows():
            table.add_row(key, value)
        return table


@dataclass(frozen=True, kw_only=True)
class RawEvidence(Evidence):
    """Evidence of a kind this installation does not know: kept as it was read."""

    raw_kind: str
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.raw_kind

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.raw_kind, **to_json_value(dict(self.data))}

    def summary_rows(self) -> list[tuple[str, str]]:
        return [(k, f"{len(v)} items" if isinstance(v, list) else str(v)[:80]) for k, v in self.data.items()]


# --------------------------------------------------------------------------------------------
# The registry of kinds
# --------------------------------------------------------------------------------------------

_KINDS: dict[str, type[Evidence]] = {}


def evidence_kind(cls: type[E]) -> type[E]:
    """Class decorator: register an evidence kind (and its aliases) for reading."""
    if not cls.kind:
        raise TypeError(f"{cls.__name__} needs a class attribute 'kind'")
    for name in (cls.kind, *cls.aliases):
        existing = _KINDS.get(name)
        if existing is not None and existing is not cls and existing.__qualname__ != cls.__qualname__:
            raise TypeError(f"evidence kind {name!r} is already registered by {existing.__qualname__}")
        _KINDS[name] = cls
    return cls


def registered_kinds() -> dict[str, type[Evidence]]:
    """The evidence kinds registered so far: the contract's own, and those given to
    :func:`evidence_kind` (a probe's kinds are registered by the probe API,
    :func:`glmfb.core.probe.load_evidence_types`, before a document is read with them)."""
    return dict(_KINDS)


def parse_evidence(data: Mapping[str, Any], path: str = "evidence") -> Evidence:
    """Typed evidence from its JSON form; a kind not registered becomes :class:`RawEvidence`."""
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise EvidenceError(f"{path}.kind", "needs a string 'kind'")
    cls = _KINDS.get(kind)
    if cls is None or cls is RawEvidence:
        return RawEvidence(raw_kind=kind, data={k: v for k, v in data.items() if k != "kind"})
    return cls._decode(data, path)


def as_evidence(item: Evidence | Mapping[str, Any], path: str = "evidence") -> Evidence:
    """An evidence item as given to a verdict: typed already, or JSON data to parse."""
    if isinstance(item, Evidence):
        return item
    return parse_evidence(item, path)


def first(items: Iterable[Evidence], kind: type[E]) -> E | None:
    """The first item of a type in a list of evidence."""
    return next((item for item in items if isinstance(item, kind)), None)


def evidence_schema_defs(kinds: Mapping[str, type[Evidence]] | None = None) -> dict[str, Any]:
    """``$defs`` entries for the given kinds (default: those registered) and the records they use."""
    defs: dict[str, Any] = {}
    records: set[type[Record]] = set()
    for kind, cls in sorted((registered_kinds() if kinds is None else kinds).items()):
        if kind != cls.kind or cls is RawEvidence:
            continue
        defs[f"evidence.{kind}"] = cls.json_schema()
        records |= cls.nested_records()
    for record in sorted(records, key=lambda r: r.__name__):
        defs[f"record.{record.__name__}"] = record.json_schema()
    return defs
