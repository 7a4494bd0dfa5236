"""A probe that lives outside glmfb, installed through the ``glmfb.probes`` entry point.

The tests put this folder on the path (it holds a ``*.dist-info`` with the entry point) and
check that ``glmfb run`` runs a toy definition, ``glmfb gate`` gates it, ``glmfb schema``
lists it and ``glmfb toy --help`` exists, with no file of glmfb edited; and that every surface
takes what it needs from the probe: report.html its section (its order, its question, its plot,
:mod:`toy_plots`), ``glmfb mcp`` its tool, its hint in the instructions and its next steps as
calls. Its reading is scripted by its options, so it also serves as a stand-in probe for
suite tests: ``sleep`` makes a run take that long, and its reading says when it started and
finished (wall-clock seconds), so a test sees which runs overlapped. ``TOY_NUMERICS`` is the
same probe as a numerics probe (``timing`` false, occupying its ``cores`` option), for the
suite's scheduling tests, which install it under a kind of their own. Its ``deeper`` option
scripts a chain for ``--follow``: ``"fail,pass"`` makes a failing toy's deeper step another toy
told to fail (whose deeper step is a toy told to pass); ``command`` there is a deeper step that
runs a command line (gil on ``python -c pass``), which the boundary refuses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

from glmfb.errors import TargetFailed
from glmfb.evidence import Evidence, evidence_kind
from glmfb.options import FRACTION, NONNEGATIVE_INT, SECONDS_OR_ZERO, STR, choice, option
from glmfb.probe import BaseProbe, ProbeContext, ProbeForm, ReportSection
from glmfb.rules import Diagnosis, Rule, diagnose
from glmfb.step import Intent, Step
from glmfb.targets import Target
from glmfb.verdict import Layer, Metric, Status, Verdict


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ToyReading(Evidence):
    """What the toy probe read."""

    kind: ClassVar[str] = "toy_reading"
    value: float
    outcome: str
    started: float | None = None  # time.time() when the run began and ended
    finished: float | None = None


@dataclass(frozen=True)
class ToyConfig:
    name: str
    target: Target | None = None
    outcome: str = option("pass", choice("pass", "fail", "inconclusive", "raise", "interrupt", "target-raises"),
                          "The verdict to script.")
    kernel: str = option("", STR, "The where.kernel to report.")
    threshold: float = option(0.05, FRACTION, "A fraction option, to check units.")
    sleep_s: float = option(0.0, SECONDS_OR_ZERO, "How long the run takes (it sleeps).", key="sleep")
    cores: int = option(1, NONNEGATIVE_INT, "The cores a run occupies (the numerics toy's placement).")
    deeper: str = option("", STR, "The outcomes of the deeper steps, comma-separated (a chain for --follow).")


@dataclass(frozen=True)
class ToyFindings:
    outcome: str
    value: float
    kernel: str = ""
    deeper: str = ""
    name: str = "toy"

    def saw(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "value": self.value}


def _scripted(f: ToyFindings) -> Diagnosis | None:
    why = f"the toy read {f.value:g} and was told to say {f.outcome}"
    if f.outcome != "fail":
        return Diagnosis(Status(f.outcome), why)
    again = Step("run the toy again, told to pass", command="toy",
                 arguments={"outcome": "pass", "name": "toy-again", **({"kernel": f.kernel} if f.kernel else {})})
    return Diagnosis(Status.FAIL, why, (again, *_deeper_steps(f)))


def _deeper_steps(f: ToyFindings) -> tuple[Step, ...]:
    if not f.deeper:
        return ()
    first, _, rest = f.deeper.partition(",")
    if first == "command":
        return (Step("look one layer down, in a program", command="gil",
                     arguments={"command": ["python", "-c", "pass"]}, intent=Intent.DEEPER),)
    arguments = {"outcome": first, "name": f"{f.name}-deeper", "kernel": f"{f.kernel or 'k'}.inner",
                 **({"deeper": rest} if rest else {})}
    return (Step(f"look one layer down (told to {first})", command="toy", arguments=arguments, intent=Intent.DEEPER),)


class ToyProbe(BaseProbe):
    kind: ClassVar[str] = "toy"
    layer: ClassVar[Layer] = Layer.KERNEL
    summary: ClassVar[str] = "A toy probe from outside glmfb."
    form: ClassVar[ProbeForm] = ProbeForm.SINGLE
    config_type: ClassVar[type] = ToyConfig
    evidence_types = (ToyReading,)
    builtin_rules = (Rule("scripted", "toy", _scripted, "says what it was told"),)
    report: ClassVar[ReportSection] = ReportSection(
        order=5, question="toy: what did the toy read, against its threshold?", plots="toy_plots:PLOTS")
    agent_hint: ClassVar[str] = "a stand-in probe for glmfb's own tests: it says what its outcome option tells it"

    def run(self, config: ToyConfig, ctx: ProbeContext) -> Verdict:
        started = time.time()
        if config.sleep_s:
            ctx.progress(f"sleeping {config.sleep_s:g} s")
            time.sleep(config.sleep_s)
        if config.outcome == "raise":
            raise RuntimeError("engine exploded")
        if config.outcome == "interrupt":
            raise KeyboardInterrupt
        if config.outcome == "target-raises":
            raise TargetFailed("target", "on its first call", ValueError("bad input tensor"))
        findings = ToyFindings(config.outcome, 0.5, config.kernel, config.deeper, config.name)
        outcome = diagnose(ctx.rules(self.kind, self.rules()), findings)
        where = {"kernel": config.kernel} if config.kernel else {}
        return Verdict(
            probe=self.kind, name=config.name, status=outcome.diagnosis.status, layer=self.layer,
            why=outcome.diagnosis.why, where=where, next=outcome.diagnosis.next, metric=Metric("value", 0.5, "fraction", config.threshold),
            evidence=(ToyReading(value=0.5, outcome=config.outcome, started=started, finished=time.time()),
                      outcome.record),
        )


class ToyNumericsProbe(ToyProbe):
    """The toy as a numerics probe: it may run beside others, on its ``cores`` option."""

    kind: ClassVar[str] = "toy-numerics"
    layer: ClassVar[Layer] = Layer.NUMERICS
    timing: ClassVar[bool] = False

    def cores(self, config: ToyConfig) -> int:
        return config.cores


PROBE = ToyProbe()
TOY_NUMERICS = ToyNumericsProbe()


def _known_kernel(f: ToyFindings) -> Diagnosis | None:
    """An installed rule: it applies only to a kernel a team already knows."""
    if f.outcome != "fail" or f.kernel != "known-slow-kernel":
        return None
    return Diagnosis(Status.FAIL, "a kernel the team already knows is slow (an installed rule said so)")


INSTALLED_RULES = [Rule("team-known-kernel", "toy", _known_kernel)]
