"""``glmfb diff``: per-request output diffs between a baseline and a candidate (before and after
a patch, or two execution paths), down to the first module and token position that diverge,
with the error's shape and a minimal reproducer.

Each side is a capture directory (``glmfb capture``) or a target: a factory returning a
``torch.nn.Module`` (every named submodule is a tap) or a callable on the request.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from glmfb.contract.errors import UsageError
from glmfb.contract.verdict import Layer, Metric, Verdict
from glmfb.core.probe import (
    BaseProbe,
    MetricSpec,
    ProbeCommand,
    ProbeContext,
    ProbeForm,
    ProbeSpec,
    ReportSection,
    imported,
    machine_cores,
    side_times,
)
from glmfb.diff import COMMANDS, SUMMARY

if TYPE_CHECKING:
    from glmfb.diff.config import DiffConfig


def _is_capture_dir(ref: str, spec: ProbeSpec) -> bool:
    """A capture directory (existing, or named without ``:attr``, so that reading it says what
    is missing) rather than a target reference."""
    return spec.resolve_path(ref).is_dir() or ":" not in ref or ref.endswith("manifest.json")


def _serving_config(spec: ProbeSpec, baseline_args: Any, candidate_args: Any, options: dict[str, Any]) -> Any:
    """A diff of two serving endpoints: both sides servers, requests checked now."""
    from glmfb.diff.config import DiffConfig
    from glmfb.diff.endpoint import is_endpoint, parse_endpoint, read_serving_requests

    assert spec.baseline and spec.candidate
    refs = []
    for ref in (spec.baseline, spec.candidate):
        if _is_serving_capture(ref, spec):
            refs.append(str(spec.resolve_path(ref)))
            continue
        if not is_endpoint(ref):
            raise UsageError(f"{spec.label}: {ref!r} is not a serving endpoint, and the other side is",
                             "compare a server with a server (openai:http://HOST:PORT/v1) or with its saved answers "
                             "(glmfb capture openai:... --out DIR)")
        parse_endpoint(ref)
        refs.append(ref)
    _check_servers(spec, options)
    _check_models(spec, options)
    _check_batches(spec, options)
    if options.get("requests") is None:
        raise UsageError(f"{spec.label}: a serving endpoint side needs requests (--requests FILE, TOML options.requests)",
                         'one JSON object per line: {"id": "r1", "prompt": "text", "max_tokens": 16}')
    read_serving_requests(options["requests"], options.get("max_tokens", 16))  # checked now
    return DiffConfig(name=spec.name, baseline=refs[0], candidate=refs[1], baseline_args=baseline_args,
                      candidate_args=candidate_args, base_dir=spec.base_dir, **options)


def _check_servers(spec: ProbeSpec, options: dict[str, Any]) -> None:
    """A server command goes with a server side whose URL it serves: ``{port}`` in the one is
    ``{port}`` in the other."""
    from glmfb.diff.endpoint import is_endpoint
    from glmfb.diff.servers import PORT

    for side, ref in (("baseline", spec.baseline), ("candidate", spec.candidate)):
        assert ref is not None
        command = options.get(f"{side}_server") or ()
        flag = f"--{side}-server ({side}_server)"
        if command and not is_endpoint(ref):
            raise UsageError(f"{spec.label}: {flag} starts a server, but the {side} {ref!r} is not a serving endpoint",
                             f"give the {side} as openai:http://127.0.0.1:{PORT}/v1")
        if not command and PORT in ref:
            raise UsageError(f"{spec.label}: the {side} {ref!r} has {PORT}, which only a server glmfb starts fills in",
                             f"give {flag}, or the server's real port")
        if command and any(PORT in word for word in command) and PORT not in ref:
            raise UsageError(f"{spec.label}: {flag} takes {PORT}, but the {side}'s URL {ref!r} does not, so it "
                             "would not reach that server", f"write the URL as openai:http://127.0.0.1:{PORT}/v1")


def _check_batches(spec: ProbeSpec, options: dict[str, Any]) -> None:
    """A batch option asks a live server (not saved answers), and replaces ``--concurrency``
    (with one, each side asks one request at a time: alone, or among its companions)."""
    given = [side for side in ("baseline", "candidate") if options.get(f"{side}_batch") is not None]
    for side in given:
        ref = spec.baseline if side == "baseline" else spec.candidate
        assert ref is not None
        if _is_serving_capture(ref, spec):
            raise UsageError(f"{spec.label}: --{side}-batch ({side}_batch) asks the {side}'s server among companion "
                             f"requests, but the {side} {ref!r} is saved answers, not a live server",
                             f"give the {side} as its server (openai:http://HOST:PORT/v1), or leave --{side}-batch out")
    if given and options.get("concurrency") is not None:
        raise UsageError(f"{spec.label}: --concurrency and --{given[0]}-batch ({given[0]}_batch) both say what is in "
                         "flight: with a batch option each side asks one request at a time, among its companions or "
                         "alone", "leave --concurrency out (or the batch options, to compare at that concurrency)")


def _check_models(spec: ProbeSpec, options: dict[str, Any]) -> None:
    """``baseline_model`` and ``candidate_model`` come together, each a target that exists."""
    from glmfb.contract.errors import TargetError
    from glmfb.core.targets import Target

    given = [side for side in ("baseline", "candidate") if options.get(f"{side}_model")]
    if len(given) == 1:
        other = "candidate" if given[0] == "baseline" else "baseline"
        raise UsageError(f"{spec.label}: {given[0]}_model is given but not {other}_model; the module-level diff "
                         "needs both", f"give {other}_model (the factory the {other}'s server serves), or neither")
    for side in given:
        try:
            Target(options[f"{side}_model"], {}, spec.base_dir).check()
        except TargetError as exc:
            raise TargetError(f"{spec.label}: {side}_model: {exc.message}", exc.hint) from None


def _is_serving_capture(ref: str, spec: ProbeSpec) -> bool:
    """A folder of a server's saved answers (``glmfb capture openai:...``)."""
    return (spec.resolve_path(ref) / "serving-capture.json").is_file()


CAPTURE = ProbeCommand(
    "capture",
    COMMANDS["capture"],
    "glmfb.diff.config:CaptureConfig",
    "glmfb.diff.engine:capture_job",
    positional=("target",),
    flags={"out": "--out"},
    kwargs={"args": "--arg"},
    help={"target": "Diff target: package.module:attr or path/file.py:attr (a torch.nn.Module factory or a "
                    "callable on the request), or a serving endpoint openai:http://HOST:PORT/v1 (its answers saved).",
          "out": "Capture directory to write.",
          "args": "Keyword arguments for the target factory."},
    targets=("target",),
    paths=("out",),
    inputs=("requests",),
    required=("out", "requests"),
    result={"requests": {"type": "integer", "description": "requests captured"},
            "tensors": {"type": "integer", "description": "tensors stored"}},
    done="captured {requests} requests, {tensors} tensors into {out}; give it as a side of glmfb diff",
)


class DiffProbe(BaseProbe):
    kind: ClassVar[str] = "diff"
    metrics: ClassVar[tuple[MetricSpec, ...]] = (
        MetricSpec("output_rel_l2", about="||candidate - baseline|| / ||baseline|| of the worst request's output"),
        MetricSpec("logprob_diff_max", unit="nats", about="two serving endpoints: the largest logprob difference"),
        MetricSpec("baseline_token_time", unit="s", about="a serving endpoint's own latency: seconds per token"),
        MetricSpec("candidate_token_time", unit="s", about="a serving endpoint's own latency: seconds per token"),
    )

    layer: ClassVar[Layer] = Layer.NUMERICS
    summary: ClassVar[str] = SUMMARY
    form: ClassVar[ProbeForm] = ProbeForm.PAIR
    config_type: ClassVar[type] = imported("glmfb.diff.config:DiffConfig")  # imported on first use
    evidence_types = imported("glmfb.diff.evidence:EVIDENCE_TYPES")
    builtin_rules = imported("glmfb.diff.rules:RULES")
    report: ClassVar[ReportSection] = ReportSection(
        order=10, question="numerics: where does the error start, and how does it grow?",
        plots="glmfb.diff.plots:PLOTS",
    )
    agent_hint: ClassVar[str] = (
        "outputs differ between two versions (a patch, a dtype, a kernel, a parallel layout): finds the first"
        " module and token position where the error starts, and its cause"
    )
    commands: ClassVar[tuple[ProbeCommand, ...]] = (CAPTURE,)
    timing: ClassVar[bool] = False  # tensors compared, never timed: a loaded host changes no verdict

    def cores(self, config: DiffConfig) -> int:
        """The cores a diff occupies: its ranks (the sides run one after the other, each on
        ``*_nproc`` ranks in lockstep, which slow down 2-3x beside another process), and the
        whole machine for serving endpoints (the servers it asks may share this host, and its
        calls have wall-clock timeouts)."""
        from glmfb.diff.endpoint import is_endpoint

        sides = (config.baseline, config.candidate)
        if any(is_endpoint(ref) or (Path(ref) / "serving-capture.json").is_file() for ref in sides):
            return machine_cores()
        return max(1, config.baseline_nproc, config.candidate_nproc)

    def build(self, spec: ProbeSpec) -> Any:
        if not spec.baseline or not spec.candidate:
            raise UsageError(f"{spec.label}: a diff needs a baseline and a candidate (capture directories or targets)")
        baseline_args, candidate_args = spec.side_args()
        options = dict(spec.options)
        requests = options.get("requests")
        if requests is not None:
            options["requests"] = spec.resolve_path(requests)
        sides = [spec.baseline, spec.candidate]
        from glmfb.diff.endpoint import is_endpoint

        if any(is_endpoint(ref) or _is_serving_capture(ref, spec) for ref in sides):
            return _serving_config(spec, baseline_args, candidate_args, options)
        serving_only = [key for key in ("baseline_server", "candidate_server", "baseline_model", "candidate_model",
                                        "baseline_batch", "candidate_batch") if options.get(key)]
        if serving_only:
            raise UsageError(f"{spec.label}: {serving_only[0]} is for serving endpoint sides, and neither side is one",
                             "give a side as openai:http://127.0.0.1:{port}/v1, or leave the option out")
        refs = [str(spec.resolve_path(ref)) if _is_capture_dir(ref, spec) else ref for ref in sides]
        targets = [ref for ref in sides if not _is_capture_dir(ref, spec)]
        if targets and options.get("requests") is None:
            raise UsageError(f"{spec.label}: a target side needs requests (--requests FILE, TOML options.requests)",
                             "or give two capture directories")
        if options.get("requests") is not None:
            from glmfb.diff.requests import DEFAULT_MAX_ELEMENTS, read_requests

            read_requests(options["requests"], options.get("max_elements", DEFAULT_MAX_ELEMENTS))  # checked now
        for ref in targets:
            from glmfb.core.targets import Target

            Target(ref, {}, spec.base_dir).check()
        from glmfb.diff.config import DiffConfig

        return DiffConfig(name=spec.name, baseline=refs[0], candidate=refs[1], baseline_args=baseline_args,
                          candidate_args=candidate_args, base_dir=spec.base_dir, **options)

    def run(self, config: DiffConfig, ctx: ProbeContext) -> Verdict:
        from glmfb.diff.endpoint import is_endpoint

        sides = (config.baseline, config.candidate)
        if any(is_endpoint(ref) or (Path(ref) / "serving-capture.json").is_file() for ref in sides):
            from glmfb.diff.serving import run_serving_diff

            return run_serving_diff(config, ctx)
        from glmfb.diff.engine import run_diff

        return run_diff(config, ctx)


    def outside_side(self, text: str) -> bool:
        """A serving endpoint (``openai:URL``) is a side outside the file system; a malformed
        one raises :class:`~glmfb.contract.errors.UsageError`."""
        from glmfb.diff.endpoint import is_endpoint, parse_endpoint

        if not is_endpoint(text):
            return False
        parse_endpoint(text)
        return True

    def series(self, verdict: Verdict) -> tuple[Metric, ...]:
        """Two serving endpoints: each side's own latency (seconds per generated token, with the
        interval of its calls in the order made), beside the diff's numerics."""
        return side_times(verdict, "serving_throughput", "{side}_token_s", "{side}_token_time")

PROBE = DiffProbe()
