"""Typed evidence: every kind round-trips through JSON, validates against glmfb schema, renders;
readers keep what they do not know and accept the old spellings."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import json_values

from glmfb.contract.evidence import Evidence, RawEvidence, Record, parse_evidence, registered_kinds
from glmfb.contract.verdict import Layer, Status, Verdict
from glmfb.core.documents import json_schema
from glmfb.core.probe import load_evidence_types

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
load_evidence_types()  # every probe's kinds, registered by the probe API as a reader does
KINDS = {kind: cls for kind, cls in sorted(registered_kinds().items()) if kind == cls.kind and cls is not RawEvidence}


def strategy_for(hint: Any) -> st.SearchStrategy[Any]:
    """Values of a field type, the way the codec sees the types."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return json_values
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(strategy_for(a) for a in args if a is not type(None)), st.none())
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers(-(2**31), 2**31)
    if hint is float:
        return finite
    if hint is str:
        return st.text(max_size=12)
    if origin is tuple:
        return st.lists(strategy_for(args[0]), max_size=3).map(tuple)
    if origin in (Mapping, dict) or hint is dict:
        value = strategy_for(args[1]) if len(args) == 2 else json_values
        return st.dictionaries(st.text(min_size=1, max_size=6), value, max_size=3)
    if isinstance(hint, type) and issubclass(hint, Record):
        return instances(hint)
    raise AssertionError(f"no strategy for {hint!r}")


def instances(cls: type[Record]) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(cls)  # type: ignore[arg-type]
              if f.init and f.name != "extra"}
    return st.fixed_dictionaries(fields).map(lambda values: cls(**values))


VALIDATOR = jsonschema.Draft202012Validator(json_schema())


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_round_trips_and_validates(kind: str) -> None:
    cls = KINDS[kind]

    @settings(max_examples=25, deadline=None)
    @given(instances(cls))
    def check(item: Evidence) -> None:
        data = json.loads(json.dumps(item.to_dict(), allow_nan=False))
        assert data["kind"] == kind
        assert parse_evidence(data) == item
        verdict = Verdict(probe="bench", name="v", status=Status.PASS, layer=Layer.KERNEL, why="w", evidence=(item,))
        VALIDATOR.validate(verdict.to_dict())
        assert item.summary_rows() is not None and item.__rich__() is not None

    check()


def test_every_builtin_kind_is_in_the_schema() -> None:
    defs = json_schema()["$defs"]
    assert {f"evidence.{kind}" for kind in KINDS} <= set(defs)


def test_unknown_keys_are_kept_and_written_back() -> None:
    data = {"kind": "diagnosis", "rule": "r", "from_a_newer_glmfb": [1, 2]}
    item = parse_evidence(data)
    assert item.to_dict()["from_a_newer_glmfb"] == [1, 2]


def test_old_spellings_are_read() -> None:
    assert parse_evidence({"kind": "env_mismatch", "differences": {"torch": ["2.12", "2.13"]}}).kind == "env_differences"
    assert parse_evidence({"kind": "diagnosis_rule", "rule": "growing"}).kind == "diagnosis"
    holder = parse_evidence({"kind": "gil_holder", "thread": "t", "tid": 1, "function": "f", "qualname": "f",
                             "file": "x.py", "line": 3, "samples": 9, "share_of_time": 0.4, "share_of_samples": 0.4})
    assert "share_of_samples" not in holder.to_dict()


def test_an_unknown_kind_survives_as_raw_evidence() -> None:
    item = parse_evidence({"kind": "quantum_reading", "qubits": 3})
    assert isinstance(item, RawEvidence) and item.kind == "quantum_reading"
    assert item.to_dict() == {"kind": "quantum_reading", "qubits": 3}
