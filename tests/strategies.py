"""Hypothesis strategies for verdicts of every status, layer and probe."""

from __future__ import annotations

from hypothesis import strategies as st

from glmfb.contract.evidence import registered_kinds
from glmfb.contract.verdict import Expectation, Layer, Metric, Status, Verdict

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
text = st.text(min_size=1, max_size=20)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), finite, st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)

wheres = st.fixed_dictionaries(
    {},
    optional={
        "request": text,
        "module": text,
        "position": st.integers(0, 1 << 20),
        "kernel": text,
        "shape": text,
        "thread": text,
        "function": text,
        "file": text,
        "line": st.integers(1, 100000),
    },
)

metrics = st.builds(
    Metric,
    name=text,
    value=st.one_of(st.none(), finite),
    unit=st.sampled_from(["", "ratio", "s", "GB/s"]),
    threshold=st.one_of(st.none(), finite),
    ci=st.one_of(st.none(), st.tuples(finite, finite)),
)

# Kinds this installation does not know: they must survive a round trip as they are.
unknown_kinds = text.filter(lambda kind: kind not in registered_kinds())
evidence_items = st.dictionaries(
    st.text(min_size=1, max_size=8).filter(lambda k: k != "kind"), json_values, max_size=4
).flatmap(lambda d: st.builds(lambda kind: {"kind": kind, **d}, unknown_kinds))

expectations = st.builds(
    Expectation,
    status=st.one_of(st.none(), st.sampled_from(Status)),
    layer=st.one_of(st.none(), st.sampled_from(Layer)),
    where=wheres,
)


@st.composite
def verdicts(draw: st.DrawFn) -> Verdict:
    verdict = Verdict(
        probe=draw(st.sampled_from(["diff", "bench", "gil", "gap"])),
        name=draw(text),
        status=draw(st.sampled_from(Status)),
        layer=draw(st.sampled_from(Layer)),
        why=draw(st.text(max_size=80)),
        where=draw(wheres),
        metric=draw(st.one_of(st.none(), metrics)),
        evidence=tuple(draw(st.lists(evidence_items, max_size=3))),
        next=tuple(draw(st.lists(st.text(max_size=30), max_size=3))),
        artifacts=draw(st.dictionaries(text, text, max_size=2)),
        env=draw(st.dictionaries(st.text(min_size=1, max_size=8), scalars, max_size=4)),
        duration_s=draw(st.floats(0, 1e5)),
    )
    if draw(st.booleans()):
        verdict = verdict.with_expectation(draw(expectations))
    return verdict
