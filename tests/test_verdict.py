from __future__ import annotations

import json
import math

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import verdicts

from glmfb.contract.verdict import (
    ExitCode,
    Expectation,
    Layer,
    Metric,
    Run,
    SchemaError,
    Status,
    Verdict,
    load_document,
)
from glmfb.core.documents import json_schema

SCHEMA = json_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def make(status: Status = Status.PASS, **kwargs: object) -> Verdict:
    fields: dict[str, object] = {
        "probe": "bench",
        "name": "k",
        "status": status,
        "layer": Layer.KERNEL,
        "why": "because",
    }
    fields.update(kwargs)
    return Verdict(**fields)  # type: ignore[arg-type]


def test_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@settings(max_examples=300, deadline=None)
@given(verdicts())
def test_round_trip_and_schema(verdict: Verdict) -> None:
    data = json.loads(json.dumps(verdict.to_dict(), allow_nan=False))
    VALIDATOR.validate(data)
    assert Verdict.from_dict(data) == verdict


@settings(max_examples=300, deadline=None)
@given(verdicts(), st.booleans())
def test_reading_validated_json_builds_what_the_constructor_builds(verdict: Verdict, typed: bool) -> None:
    """A read sets the fields of validated JSON as read, without ``__post_init__``
    (``_as_read``): the same verdict, field types included, as the constructor's normalizing
    gives from the same data."""
    from glmfb.contract.record import RawEvidence, parse_evidence
    from glmfb.contract.step import Step

    data = json.loads(json.dumps(verdict.to_dict(), allow_nan=False))
    read = Verdict.from_dict(data, typed=typed)
    evidence = [parse_evidence(item) if typed else RawEvidence(raw_kind=item["kind"], data={
        k: v for k, v in item.items() if k != "kind"}) for item in data.get("evidence", [])]
    built = Verdict(probe=data["probe"], name=data["name"], status=data["status"], layer=data["layer"], why=data["why"],
                    where=data.get("where") or {}, metric=Metric.from_dict(data["metric"]) if data.get("metric") is not None else None,
                    evidence=evidence, next=[Step.from_json(step) for step in data.get("next") or ()],
                    artifacts=data.get("artifacts") or {}, env=data.get("env") or {},
                    duration_s=data.get("duration_s", 0.0),
                    expect=Expectation.from_dict(data["expect"]) if data.get("expect") is not None else None,
                    expect_met=data.get("expect_met"))
    assert read == built
    assert json.dumps(read.to_dict()) == json.dumps(built.to_dict())
    assert {f: type(getattr(read, f)) for f in vars(built)} == {f: type(getattr(built, f)) for f in vars(built)}


@settings(max_examples=50, deadline=None)
@given(verdicts(), verdicts())
def test_run_round_trip_and_schema(first: Verdict, second: Verdict) -> None:
    run = Run(id="r1", started="2026-11-29T00:00:00+00:00", verdicts=(first, second))
    data = json.loads(json.dumps(run.to_dict(), allow_nan=False))
    VALIDATOR.validate(data)
    again = Run.from_dict(data)
    assert again == run
    assert again.summary == run.summary


def test_every_status_and_layer_validates() -> None:
    for status in Status:
        for layer in Layer:
            VALIDATOR.validate(make(status, layer=layer).to_dict())


def test_non_finite_values_are_made_json_safe() -> None:
    verdict = make(
        metric=Metric("gap", math.nan, "ratio", ci=(0.1, math.inf)),
        evidence=[{"kind": "x", "max_abs": math.inf, "rmse": math.nan}],
    )
    data = verdict.to_dict()
    json.dumps(data, allow_nan=False)
    assert data["metric"]["value"] is None and data["metric"]["ci"] is None
    assert data["evidence"][0]["max_abs"] == "inf"
    assert data["evidence"][0]["rmse"] == "nan"


def test_numpy_and_tuples_are_normalized() -> None:
    import numpy as np

    verdict = make(
        where={"position": np.int64(7)},
        evidence=[{"kind": "t", "shape": (2, 3), "v": np.float32(0.5)}],
    )
    assert verdict.where["position"] == 7 and type(verdict.where["position"]) is int
    assert verdict.evidence[0].to_dict()["shape"] == [2, 3]
    assert Verdict.from_dict(verdict.to_dict()) == verdict


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda d: d.pop("status"), "status"),
        (lambda d: d.update(status="great"), "status"),
        (lambda d: d.update(metric={"name": "x", "value": "fast"}), "metric.value"),
        (lambda d: d.update(where={"position": "six"}), "where.position"),
        (lambda d: d.update(evidence=[{"kind": "a"}, {"no": 1}]), "evidence[1].kind"),
        (lambda d: d.update(surprise=1), "surprise"),
        (lambda d: d.update(schema="glmfb.verdict/9"), "schema"),
    ],
)
def test_validation_names_the_first_offending_field(mutate, path: str) -> None:  # type: ignore[no-untyped-def]
    data = make().to_dict()
    mutate(data)
    with pytest.raises(SchemaError) as info:
        Verdict.from_dict(data)
    assert info.value.path == path


def test_run_validation_path_includes_verdict_index() -> None:
    run = Run(id="r", started="s", verdicts=(make(), make()))
    data = run.to_dict()
    data["verdicts"][1]["layer"] = "gpu"
    with pytest.raises(SchemaError, match=r"verdicts\[1\]\.layer"):
        Run.from_dict(data)


def test_load_document_accepts_a_single_verdict() -> None:
    run = load_document(make(Status.FAIL).to_dict())
    assert len(run.verdicts) == 1 and run.exit_code is ExitCode.REGRESSION


def test_load_document_rejects_other_json() -> None:
    with pytest.raises(SchemaError):
        load_document([1, 2])
    with pytest.raises(SchemaError, match="schema"):
        load_document({"hello": 1})


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        ([Status.PASS, Status.WARN], ExitCode.OK),
        ([Status.PASS, Status.FAIL, Status.INCONCLUSIVE], ExitCode.REGRESSION),
        ([Status.FAIL, Status.ERROR], ExitCode.HARNESS_ERROR),
        ([Status.INCONCLUSIVE, Status.INCONCLUSIVE], ExitCode.INCONCLUSIVE),
        ([Status.PASS, Status.INCONCLUSIVE], ExitCode.INCONCLUSIVE),
        ([], ExitCode.OK),
    ],
)
def test_run_exit_code_precedence(statuses: list[Status], code: ExitCode) -> None:
    run = Run(id="r", started="s", verdicts=tuple(make(s) for s in statuses))
    assert run.exit_code is code


def test_expectation_turns_expected_failure_into_a_pass() -> None:
    expect = Expectation(status=Status.FAIL, layer=Layer.KERNEL, where={"kernel": "gated_norm*"})
    met = make(Status.FAIL, where={"kernel": "gated_norm_tiled"}).with_expectation(expect)
    assert met.expect_met is True and met.outcome is Status.PASS and met.exit_code is ExitCode.OK
    unmet = make(Status.FAIL, where={"kernel": "softmax"}).with_expectation(expect)
    assert unmet.expect_met is False and unmet.outcome is Status.FAIL
    assert expect.mismatches(unmet) == ["where.kernel: expected 'gated_norm*', got 'softmax'"]
    passed_instead = make(Status.PASS).with_expectation(expect)
    assert passed_instead.outcome is Status.FAIL
    broken = make(Status.ERROR, layer=Layer.HARNESS).with_expectation(expect)
    assert broken.expect_met is False and broken.outcome is Status.ERROR
    assert broken.exit_code is ExitCode.HARNESS_ERROR
    # an error verdict never meets an expectation, not even an empty one or one that asks for it
    for expectation in (Expectation(status=Status.ERROR), Expectation(), Expectation(where={})):
        judged = make(Status.ERROR, layer=Layer.HARNESS).with_expectation(expectation)
        assert judged.expect_met is False and judged.outcome is Status.ERROR
    run = Run(id="r", started="s", verdicts=(met, unmet))
    assert run.summary["expect_met"] == 1 and run.summary["expect_unmet"] == 1
    assert run.exit_code is ExitCode.REGRESSION


def test_verdict_is_checked_when_built() -> None:
    with pytest.raises(ValueError):
        make(status="great")
    with pytest.raises(ValueError):
        make(name="")
    with pytest.raises(ValueError, match="kind"):
        make(evidence=[{"value": 1}])
    with pytest.raises(TypeError):
        make(evidence=[{"kind": "x", "obj": object()}])
