"""Precision counterfactuals: rerun the candidate with each alternative value of a knob and
measure which one closes the gap.

A *knob* is an argument of the candidate's factory with alternative values (declared in a
probe definition, ``counterfactuals = { merge_precision = ["ieee", "tf32x3"] }``, or on the
command line, ``--counterfactual merge_precision=ieee,tf32x3``), or one of torch's own precision
switches, which need no declaration in the target:

- ``torch.float32_matmul_precision`` (``highest``, ``high``, ``medium``:
  ``torch.set_float32_matmul_precision``),
- ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32``
  (``true`` / ``false``).

torch's switches only change what CUDA kernels do; on a CPU-only candidate they change nothing,
so they are *not tried* there (and the verdict says so), rather than reported as not helping.
On a failing diff each value is run through the whole comparison against the baseline (every
request, every shared tap): the evidence holds each value's output error per request and
whether the diff still fails, and the value that passes with the smallest error *closes the
gap*, by the factor its error is below the candidate's.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from glmfb.contract.units import OptionValueError

if TYPE_CHECKING:
    from glmfb.diff.compare import RequestResult

Knobs = tuple[tuple[str, tuple[Any, ...]], ...]

BUILTIN_KNOBS: dict[str, tuple[Any, ...]] = {
    "torch.float32_matmul_precision": ("highest", "high", "medium"),
    "torch.backends.cuda.matmul.allow_tf32": (False, True),
    "torch.backends.cudnn.allow_tf32": (False, True),
}


def is_builtin(knob: str) -> bool:
    return knob in BUILTIN_KNOBS


def _value(raw: Any, knob: str) -> Any:
    import json

    if isinstance(raw, str):
        text = raw.strip()
        try:
            value: Any = json.loads(text)
        except json.JSONDecodeError:
            value = text
    else:
        value = raw
    if not isinstance(value, (str, int, float, bool)) or value == "":
        raise OptionValueError(f"counterfactual {knob}: value {raw!r} is not a string, number or boolean",
                               "write --counterfactual KNOB=V1,V2 (TOML: counterfactuals = { KNOB = [V1, V2] })")
    if is_builtin(knob):
        allowed = BUILTIN_KNOBS[knob]
        if isinstance(allowed[0], bool):
            if isinstance(value, str) and value.lower() in ("true", "false"):
                value = value.lower() == "true"
            if not isinstance(value, bool):
                raise OptionValueError(f"counterfactual {knob}: {raw!r} is not true or false")
        elif value not in allowed:
            raise OptionValueError(f"counterfactual {knob}: {raw!r} is not one of {', '.join(map(str, allowed))}")
    return value


def parse_counterfactuals(raw: Any) -> Knobs:
    """Knobs from a TOML table ``{knob = [values]}`` (a single value allowed), the CLI's
    repeated ``KNOB=V1,V2`` strings, or the parsed form itself. Values parse as JSON where they
    parse (``true``, ``3``), else as strings."""
    parsed: dict[str, tuple[Any, ...]] = {}
    if isinstance(raw, Mapping):
        items: list[tuple[str, Any]] = [(str(k), v) for k, v in raw.items()]
    else:
        items = []
        for item in raw if isinstance(raw, (list, tuple)) else [raw]:
            if isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str):
                items.append((item[0], list(item[1]) if isinstance(item[1], (list, tuple)) else [item[1]]))
                continue
            knob, sep, values = str(item).partition("=")
            if not sep or not knob.strip() or not values.strip():
                raise OptionValueError(f"counterfactual {item!r} does not parse",
                                       "write it as KNOB=V1,V2, e.g. merge_precision=ieee,tf32x3")
            items.append((knob.strip(), values.split(",")))
    for knob, values in items:
        if not knob or knob.startswith("-"):
            raise OptionValueError(f"counterfactual knob {knob!r} is not an argument name")
        if knob.startswith("torch.") and not is_builtin(knob):
            raise OptionValueError(f"counterfactual {knob}: not one of torch's precision switches",
                                   f"use one of {', '.join(BUILTIN_KNOBS)}, or an argument of the candidate's factory")
        listed = values if isinstance(values, (list, tuple)) else [values]
        if not listed:
            raise OptionValueError(f"counterfactual {knob}: no values")
        parsed[knob] = tuple(dict.fromkeys(_value(v, knob) for v in listed))
    return tuple(parsed.items())


# --------------------------------------------------------------------------------------------
# torch's switches
# --------------------------------------------------------------------------------------------


def builtin_value(knob: str) -> Any:
    """The switch's current value."""
    import torch

    if knob == "torch.float32_matmul_precision":
        return torch.get_float32_matmul_precision()
    if knob == "torch.backends.cuda.matmul.allow_tf32":
        return bool(torch.backends.cuda.matmul.allow_tf32)
    if knob == "torch.backends.cudnn.allow_tf32":
        return bool(torch.backends.cudnn.allow_tf32)
    raise KeyError(knob)


@contextmanager
def switched(knob: str, value: Any) -> Iterator[None]:
    """torch's switch ``knob`` set to ``value`` within the block, restored after it."""
    import torch

    before = builtin_value(knob)

    def put(setting: Any) -> None:
        if knob == "torch.float32_matmul_precision":
            torch.set_float32_matmul_precision(setting)
        elif knob == "torch.backends.cuda.matmul.allow_tf32":
            torch.backends.cuda.matmul.allow_tf32 = bool(setting)
        else:
            torch.backends.cudnn.allow_tf32 = bool(setting)

    put(value)
    try:
        yield
    finally:
        put(before)


def not_honoured(knob: str, device: str) -> str | None:
    """Why torch's switch ``knob`` would change nothing for a candidate on ``device`` (None: it
    takes effect there)."""
    import torch

    if not is_builtin(knob):
        return None
    if not torch.cuda.is_available():
        return "no CUDA device here, and the switch only changes what CUDA kernels compute"
    if not device.startswith("cuda"):
        return f"the candidate runs on {device}, where the switch changes nothing"
    return None


def factory_default(factory: Callable[..., Any], knob: str) -> Any:
    """The default of ``knob`` in the factory's signature (None when it has none)."""
    try:
        parameter = inspect.signature(factory).parameters.get(knob)
    except (TypeError, ValueError):
        return None
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return None
    return parameter.default


# --------------------------------------------------------------------------------------------
# Running the alternatives
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnobRun:
    """The candidate with one value of the knob, compared with the baseline."""

    value: Any
    rel_l2: float | None = None  # the worst request's output error
    failed: bool | None = None
    lengths: tuple[int, ...] = ()
    errors: tuple[float, ...] = ()  # per request, in request order
    tried: bool = True
    note: str = ""


@dataclass(frozen=True)
class KnobResult:
    """Every value of one knob, and the one that closes the gap."""

    knob: str
    candidate_value: Any
    candidate_rel_l2: float
    runs: tuple[KnobRun, ...]
    closes: Any = None
    improvement: float | None = None  # candidate_rel_l2 over the closing (or best) value's error
    note: str = ""

    @property
    def closing_run(self) -> KnobRun | None:
        return next((run for run in self.runs if run.tried and run.value == self.closes and self.closes is not None), None)

    @property
    def tried(self) -> bool:
        return any(run.tried for run in self.runs)

    def describe(self) -> str:
        """One clause for a why: what the alternatives did, measured."""
        show = _show
        if not self.tried:
            reasons = {run.note for run in self.runs if run.note}
            return f"{self.knob} was not tried ({'; '.join(sorted(reasons)) or self.note or 'not run'})"
        closing = self.closing_run
        others = [run for run in self.runs if run.tried and run is not closing and run.rel_l2 is not None]
        if closing is not None and closing.rel_l2 is not None:
            text = (f"rerun with {self.knob}={show(closing.value)} the diff passes: output error "
                    f"{self.candidate_rel_l2:.2g} with {self.knob}={show(self.candidate_value)}, {closing.rel_l2:.2g} "
                    f"with {show(closing.value)} ({_factor(self.improvement)})")
            passing = [run for run in others if run.failed is False]
            if passing:
                text += "; " + ", ".join(f"{show(run.value)} also passes ({run.rel_l2:.2g})" for run in passing)
            return text
        measured = [run for run in self.runs if run.tried and run.rel_l2 is not None]
        if not measured:
            return f"no value of {self.knob} could be run ({'; '.join(run.note for run in self.runs if run.note)})"
        listing = ", ".join(f"{show(run.value)}: {run.rel_l2:.2g}" for run in measured)
        return (f"no value of {self.knob} closes the gap (output error {self.candidate_rel_l2:.2g} with "
                f"{show(self.candidate_value)}; {listing})")


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _factor(improvement: float | None) -> str:
    if improvement is None:
        return "no change"
    if math.isinf(improvement):
        return "to zero"
    if improvement >= 1:
        return f"{improvement:.3g}x smaller"
    return f"{1 / improvement:.3g}x larger"


def try_knob(knob: str, values: Sequence[Any], candidate_value: Any, candidate_rel_l2: float,
             rerun: Callable[[Any], Sequence[RequestResult]], not_tried: str | None = None) -> KnobResult:
    """Run each value through ``rerun(value)`` (the candidate rebuilt with it, compared with
    the baseline) and pick the value that closes the gap. ``not_tried``: why none can be run
    (torch's switch on a CPU candidate)."""
    from glmfb.contract.errors import GlmfbError, TargetFailed

    runs: list[KnobRun] = []
    for value in values:
        if not_tried is not None:
            runs.append(KnobRun(value, tried=False, note=not_tried))
            continue
        if value == candidate_value and type(value) is type(candidate_value):
            runs.append(KnobRun(value, tried=False, note="the candidate's own value"))
            continue
        try:
            results = rerun(value)
        except (TargetFailed, GlmfbError) as exc:
            runs.append(KnobRun(value, tried=False, note=f"the rerun failed: {str(exc)[:200]}"))
            continue
        errors = tuple(r.output_error for r in results)
        runs.append(KnobRun(value, max(errors, default=0.0), any(r.failed for r in results),
                            tuple(r.length or 0 for r in results), errors))
    measured = [run for run in runs if run.tried and run.rel_l2 is not None]
    passing = [run for run in measured if run.failed is False]
    chosen = min(passing, key=lambda run: run.rel_l2 or 0.0) if passing else None
    reference = chosen or (min(measured, key=lambda run: run.rel_l2 or 0.0) if measured else None)
    improvement = None
    if reference is not None and reference.rel_l2 is not None:
        improvement = candidate_rel_l2 / reference.rel_l2 if reference.rel_l2 > 0 else math.inf
    return KnobResult(knob, candidate_value, candidate_rel_l2, tuple(runs),
                      chosen.value if chosen is not None else None, improvement, not_tried or "")
