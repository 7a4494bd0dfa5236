"""The diff probe, end to end: a frozen config in, a :class:`Verdict` out. Never prints.

Each side is a capture directory or a target. Targets are first captured (live mode) into the
report folder, so the comparison itself is always capture against capture, streaming. Live
mode then measures local error (``localize``) and bisects the shortest failing prefix
(``minimize``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from glmfb.contract.errors import UsageError
from glmfb.contract.evidence import EnvDifferences, Evidence
from glmfb.contract.step import Intent, Step
from glmfb.contract.verdict import Layer, Metric, Verdict
from glmfb.core.commandline import command_line, rerun_step
from glmfb.core.env import differences, fingerprint, git_revision
from glmfb.core.probe import ProbeContext
from glmfb.core.rules import Diagnosis, diagnose
from glmfb.core.targets import Target
from glmfb.diff.axes import TokenAxes, TokenAxis
from glmfb.diff.capture import OUTPUT, LoadedSide, load_side, run_requests
from glmfb.diff.claims import POSITION
from glmfb.diff.compare import RequestResult, TapResult, compare_and_match
from glmfb.diff.compare import TreeDifferences as TreeDifferencesFound
from glmfb.diff.config import CaptureConfig, DiffConfig
from glmfb.diff.counterfactual import (
    KnobResult,
    builtin_value,
    factory_default,
    is_builtin,
    not_honoured,
    switched,
    try_knob,
)
from glmfb.diff.evidence import (
    Bias,
    Counterfactual,
    CounterfactualRun,
    DtypeDifference,
    DtypeTrace,
    EntryStepRow,
    ErrorByPosition,
    ErrorEntry,
    ErrorShape,
    Fit,
    FormatRange,
    InputDifferenceRow,
    LocalErrors,
    LocalRow,
    MinimalReproducer,
    MinimizerNote,
    ModuleRow,
    Modules,
    OnsetRow,
    PositionProfile,
    PrecisionSignatureEvidence,
    RankErrors,
    RankSliceRow,
    RequestRow,
    Requests,
    RoundingTrial,
    ShapeDifference,
    SideRun,
    TapTolerance,
    TokenAxisRead,
    Tokens,
    TolerancesUsed,
    TracedOpRow,
    TreeDifferences,
    Tried,
    ZeroRunRow,
)
from glmfb.diff.evidence import RoundingSize as RoundingSizeEvidence
from glmfb.diff.evidence import RoundingTest as RoundingTestEvidence
from glmfb.diff.localize import ErrorEntry as ErrorEntryFound
from glmfb.diff.localize import LocalError, Localization, error_entry, local_errors
from glmfb.diff.metrics import (
    PairComparer,
    PositionErrors,
    Tolerance,
    is_logits,
    position_errors,
    token_metrics,
    typical_relative_error,
)
from glmfb.diff.minimize import Minimized, shortest_failing_prefix
from glmfb.diff.optrace import OperationTrace, TracedOp, float16_seen
from glmfb.diff.requests import Request, read_requests, write_requests
from glmfb.diff.rounding import (
    FLOAT16_MAX,
    LEFT_OUT,
    BiasTest,
    Float16Range,
    RoundingSize,
    bias_test,
    float16_range,
    passing_atol,
    rounding_size,
    rounding_test,
)
from glmfb.diff.rounding import RoundingTest as RoundingFound
from glmfb.diff.rules import RULES, DiffFindings
from glmfb.diff.shape import (
    ZERO_RUN_FLOOR,
    GrowthFit,
    PositionShape,
    PrecisionSignature,
    ZeroRegion,
    ZeroRun,
    classify,
    growth_fit,
    is_spike,
    position_bins,
    position_curve,
    position_profile,
    precision_signature,
    quiet_run,
)
from glmfb.diff.shape import ErrorShape as ErrorShapeFound
from glmfb.diff.store import MANIFEST, CaptureReader, CaptureWriter, Manifest, write_manifest

Progress = Callable[[str], None]
EVIDENCE_ROWS = 200  # the per-module table in the verdict is cut here (the CSV has every row)
TOKENIZED_REQUESTS = "requests-tokenized.jsonl"  # text requests as the token requests a tokenizer made of them


# --------------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------------


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def capture(side: LoadedSide, requests: Sequence[Request], out: Path, taps: Sequence[str],
            progress: Progress | None = None, label: str = "", force: bool = False) -> Manifest:
    """Run the requests through a loaded target and write a capture directory (written aside
    and renamed into place when complete; removed when the target fails half-way)."""
    writer = CaptureWriter(
        out, target=side.target.ref, args=side.target.args, kind=side.kind, tap_globs=taps,
        env=fingerprint(), git=git_revision(), created=_utc_now(), force=force,
    )
    try:
        run_requests(side, requests, taps, writer, progress, label)
    except BaseException:
        writer.abandon()
        raise
    return writer.finish()


def run_capture(config: CaptureConfig, progress: Progress | None = None) -> Manifest:
    """``glmfb capture``: a target over a request set into ``config.out``. A target that
    raises is a :class:`~glmfb.contract.errors.HarnessError` naming the exception."""
    from glmfb.contract.errors import HarnessError, TargetFailed

    if config.requests is None:
        raise UsageError("glmfb capture needs --requests FILE")
    from glmfb.diff.prompts import (
        folder_tokenizer,
        needs_tokenizer,
        side_tokenizer,
        tokenize_requests,
    )

    if config.nproc > 0:
        return capture_on_ranks(config.target, dict(config.args), config.base_dir, config.requests, config.out,
                                config.taps, config.nproc, config.rank_timeout_s, progress, force=config.force)
    requests = read_requests(config.requests, config.max_elements)
    target = Target(config.target, dict(config.args), config.base_dir)
    try:
        side = load_side(target)
        if needs_tokenizer(requests):  # text requests: --tokenizer, else the target's own
            requests = tokenize_requests(requests, folder_tokenizer(config.tokenizer) if config.tokenizer is not None
                                         else side_tokenizer(side))
        return capture(side, requests, config.out, config.taps, progress, force=config.force)
    except TargetFailed as exc:
        raise HarnessError(str(exc), "fix the target, or run it alone with GLMFB_DEBUG=1") from exc


def capture_on_ranks(target: str, args: Mapping[str, Any], base_dir: Path | None, requests: Path, out: Path,
                     taps: Sequence[str], nproc: int, rank_timeout_s: float, progress: Progress | None,
                     force: bool = False) -> Manifest:
    """A target on ``nproc`` torch.distributed ranks (torch.distributed.run), unsharded into a
    capture at ``out``: written aside and renamed into place when complete, like any capture. A
    rank that raises, dies, hangs past ``rank_timeout_s`` or disagrees on taps raises
    :class:`~glmfb.diff.distributed.RankFailure` naming the rank."""
    import os
    import shutil

    from glmfb.contract.errors import InputError
    from glmfb.diff.distributed import DistributedCaptureConfig, run_distributed_capture

    if (out.exists() or out.is_symlink()) and not force:
        raise InputError(f"{out} already exists", "give a new --out folder, or --force to replace it whole")
    if out.exists() and not (out / MANIFEST).is_file() and any(out.iterdir()):
        raise InputError(f"{out} exists and is not a capture directory; glmfb will not replace it", "give a new --out")
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    try:
        manifest = run_distributed_capture(DistributedCaptureConfig(
            target=target, requests=requests, out=partial, nproc=nproc, args=dict(args), taps=tuple(taps),
            base_dir=base_dir, timeout_s=rank_timeout_s,
        ), progress)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    os.replace(partial, out)
    return manifest


def capture_job(config: CaptureConfig, progress: Progress) -> dict[str, Any]:
    """``glmfb capture`` as the supervised child runs it: a summary as JSON data. A serving
    endpoint's answers are saved by :func:`glmfb.diff.serving.capture_endpoint`."""
    if config.target.startswith("openai:"):
        from glmfb.diff.serving import capture_endpoint

        return capture_endpoint(config, progress)
    manifest = run_capture(config, progress)
    return {"requests": len(manifest.requests), "tensors": sum(len(r.taps) for r in manifest.requests)}


# --------------------------------------------------------------------------------------------
# Diff
# --------------------------------------------------------------------------------------------


def _capture_dir(ref: str, base_dir: Path | None) -> Path | None:
    """The capture directory a side names, or None when it is a target reference."""
    candidates = [Path(ref)]
    if base_dir is not None and not Path(ref).is_absolute():
        candidates.append(base_dir / ref)
    for path in candidates:
        if path.is_dir():
            return path
    if (":" not in ref or ref.endswith(MANIFEST)) and not ref.endswith(".py"):
        return Path(ref)  # not a target either: let the reader say what is missing
    return None


def run_diff(config: DiffConfig, ctx: ProbeContext) -> Verdict:
    """Compare the two sides; a target that raises raises :class:`~glmfb.contract.errors.TargetFailed`
    (the host makes it an error verdict)."""
    import torch  # noqa: F401  (imported first so that the fingerprint records torch's threads)

    return _run_diff(config, fingerprint(), ctx)


@dataclass
class _Live:
    baseline: LoadedSide
    candidate: LoadedSide
    requests: dict[str, Request]


@dataclass
class _Run:
    """What one diff has at hand: the config, the context, the requests (live), the sides it
    built and the capture folders it made (pruned at the end unless --keep-captures)."""

    config: DiffConfig
    ctx: ProbeContext
    requests: list[Request]
    made: list[Path]
    candidate_side: LoadedSide | None = None
    prompts: str | None = None  # where the text requests' ids came from (a tokenizer), when there were any


def capture_target(config: DiffConfig, ref: str, args: Mapping[str, Any], label: str, requests: Sequence[Request],
                   out: Path, progress: Progress | None, side: LoadedSide | None = None) -> LoadedSide | None:
    """Build a target side and capture it over the requests into ``out`` (replaced whole).
    Every capture of a target a diff makes goes through here (the two sides and the
    counterfactual reruns). A side on torch.distributed ranks (``*_nproc``) is captured there
    and unsharded; it has no side in this process (None): it is compared capture against
    capture."""
    nproc = config.baseline_nproc if label == "baseline" else config.candidate_nproc
    if nproc > 0:
        assert config.requests is not None
        capture_on_ranks(ref, dict(args), config.base_dir, config.requests, out, config.taps, nproc,
                         config.rank_timeout_s, progress, force=True)
        return None
    side = side or load_side(Target(ref, dict(args), config.base_dir), label)
    capture(side, requests, out, config.taps, progress, f"{label} ", force=True)
    return side


def _tokenized(run: _Run, ref: str, args: Mapping[str, Any], label: str) -> LoadedSide | None:
    """Turn the run's text requests into token requests (:mod:`glmfb.diff.prompts`) before the
    first target side captures: with ``--tokenizer``, else with this side's own tokenizer (the
    side is built here, and returned to be captured). The token requests are written to the
    artifact folder, which ranks read, and the run's config names that file."""
    from glmfb.diff.prompts import (
        folder_tokenizer,
        needs_tokenizer,
        side_tokenizer,
        tokenize_requests,
    )

    config = run.config
    if not needs_tokenizer(run.requests):
        return None
    side = None
    if config.tokenizer is not None:
        tokenizer = folder_tokenizer(config.tokenizer)
    elif (config.baseline_nproc if label == "baseline" else config.candidate_nproc) > 0:
        tokenizer = None  # a side on ranks is not built here: tokenize_requests says to give --tokenizer
    else:
        side = load_side(Target(ref, dict(args), config.base_dir), label)
        tokenizer = side_tokenizer(side)
    run.requests = tokenize_requests(run.requests, tokenizer)
    assert tokenizer is not None
    path = run.ctx.artifact_dir / TOKENIZED_REQUESTS
    write_requests(path, run.requests)
    run.config = replace(config, requests=path)
    run.prompts = tokenizer.source
    return side


def _run_diff(config: DiffConfig, env: Mapping[str, Any], ctx: ProbeContext) -> Verdict:
    import torch

    progress = ctx.progress
    report_dir = ctx.artifact_dir
    report_dir.mkdir(parents=True, exist_ok=True)
    dirs = [_capture_dir(ref, config.base_dir) for ref in (config.baseline, config.candidate)]
    live: _Live | None = None
    run = _Run(config, ctx, [], [])
    if None in dirs:
        if config.requests is None:
            raise UsageError("a target side needs --requests FILE", "or give two capture directories")
        run.requests = read_requests(config.requests, config.max_elements)
        sides: list[LoadedSide] = []
        for index, (ref, args, label) in enumerate(
            ((config.baseline, config.baseline_args, "baseline"), (config.candidate, config.candidate_args, "candidate"))
        ):
            if dirs[index] is not None:
                continue
            out = report_dir / "captures" / label
            built = _tokenized(run, ref, args, label)
            config = run.config
            side = capture_target(config, ref, args, label, run.requests, out, progress, built)
            run.made.append(out)
            dirs[index] = out
            if side is None:  # captured on ranks: compared capture against capture
                continue
            sides.append(side)
            if label == "candidate":
                run.candidate_side = side
        if len(sides) == 2:
            live = _Live(sides[0], sides[1], {r.id: r for r in run.requests})
    readers = [CaptureReader(d) for d in dirs if d is not None]
    for reader in readers:  # --tap narrows captures made with more taps
        reader.select(config.taps, keep=OUTPUT)
    baseline, candidate = readers
    with PairComparer(config.chunk_elements) as comparer, torch.no_grad():
        results, tree = compare_and_match(baseline, candidate, config.tolerances, comparer, progress)
        verdict = _analyse(run, env, baseline, candidate, results, tree, live, comparer)
    if not config.keep_captures:
        failing = {r.id for r in results if r.failed}
        for folder in run.made:
            prune_capture(folder, failing)
    if run.prompts is not None:
        verdict = _with_prompts(verdict, run)
    return verdict


def _with_prompts(verdict: Verdict, run: _Run) -> Verdict:
    """The verdict with the text requests' tokenizer and ids (evidence ``prompts``) and the
    token requests as an artifact."""
    from glmfb.diff.evidence import PromptRow, Prompts

    rows = tuple(PromptRow(request=r.id, prompt=str(r.raw.get("prompt", ""))[:200],
                           input_ids=tuple((r.input_ids or ())[:512]), tokens=len(r.input_ids or ()))
                 for r in run.requests if "prompt" in r.raw)
    evidence = Prompts(tokenizer=run.prompts or "", requests=len(rows), rows=rows[:50])
    artifacts = {**verdict.artifacts, "requests_tokenized": str(run.ctx.artifact_dir / TOKENIZED_REQUESTS)}
    return replace(verdict, evidence=(*verdict.evidence, evidence), artifacts=artifacts)


def prune_capture(directory: Path, keep: set[str]) -> None:
    """Keep only the requests ``keep`` of a capture this diff made (none: the folder goes)."""
    import shutil


    if not keep:
        shutil.rmtree(directory, ignore_errors=True)
        return
    manifest = CaptureReader(directory).manifest
    dropped = [r for r in manifest.requests if r.id not in keep]
    if not dropped:
        return
    kept = replace(manifest, requests=tuple(r for r in manifest.requests if r.id in keep))
    write_manifest(directory / MANIFEST, kept)
    for request in dropped:
        for folder in {Path(t.file).parts[0] for t in request.taps if len(Path(t.file).parts) > 1}:
            shutil.rmtree(directory / folder, ignore_errors=True)


def _worst(results: Sequence[RequestResult]) -> RequestResult:
    failing = [r for r in results if r.failed]
    pool = failing or list(results)

    def score(result: RequestResult) -> tuple[float, float]:
        first = result.first_divergent
        return (result.output_error, first.metrics.rel_l2 if first else 0.0)

    return max(pool, key=score)


def _module_label(tap: TapResult, request: RequestResult) -> str:
    return f"{tap.tap.module}#{tap.tap.call}" if _calls(request, tap.tap.module) > 1 else tap.tap.module


def _analyse(run: _Run, env: Mapping[str, Any], baseline: CaptureReader, candidate: CaptureReader,
             results: Sequence[RequestResult], tree: TreeDifferencesFound, live: _Live | None,
             comparer: PairComparer) -> Verdict:
    """The verdict of a compared pair: each measurement in turn, its evidence added in that
    order, then the findings, the first rule that applies, and where the verdict points."""
    config, ctx = run.config, run.ctx
    failed = any(r.failed for r in results)
    worst = _worst(results)
    first = worst.first_divergent
    axes = _token_axes(results, run.requests)
    evidence, artifacts = _tables(ctx, results, worst, tree)
    location = _locate(config, live, worst, failed, comparer, ctx.progress, axes)
    evidence += location.evidence
    traced = _traced(location)
    if traced is not None:
        evidence.append(_trace_evidence(*traced))
    along = _along_positions(baseline, candidate, results, worst, location.localized, axes)
    evidence += along.evidence
    shape = _error_shape(results, along)
    evidence.append(shape.evidence)
    precision = (_precision(location, baseline, candidate, results, worst, tree, shape.nonfinite, ctx.progress, axes)
                 if failed else _Precision())
    evidence += precision.evidence
    tokens = _tokens(baseline, candidate, worst, axes)
    if tokens is not None:
        evidence.append(tokens)
    knobs = _counterfactuals(run, baseline, results, comparer) if failed and config.counterfactuals else []
    evidence.extend(_counterfactual_evidence(knob) for knob in knobs)
    reproducer = (_minimal_reproducer(config, ctx, live, worst, comparer, alone=len(results) == 1)
                  if failed and live is not None and config.minimize else _Reproducer())
    evidence += reproducer.evidence
    artifacts.update(reproducer.artifacts)
    rank_record = _rank_errors(baseline, candidate, worst, first) if failed and first is not None else None
    if rank_record is not None:
        evidence.append(rank_record)
    evidence += _comparison_conditions(config, baseline, candidate)
    sides = _side_runs(baseline, candidate)
    evidence += sides
    distributed = {s.side: {"world_size": s.world_size, "backend": s.backend} for s in sides if s.world_size > 1}
    if distributed:  # a pass on ranks must not look like a single-process pass
        env = {**env, "distributed": distributed}

    findings = replace(_findings(results, worst, tree, location, along, shape, precision, tokens, knobs, reproducer),
                       distributed=tuple((s.side, s.world_size, s.backend) for s in sides if s.world_size > 1),
                       on_cuda=str(candidate.manifest.env.get("device", "cpu")).startswith("cuda"))
    outcome = diagnose(ctx.rules("diff", RULES), findings)
    evidence.append(outcome.record)
    position = along.first_failing if findings.allows(POSITION) else None
    where = _where(outcome.diagnosis, failed, worst, location.module, position, rank_record, along.sequence)
    if failed and outcome.diagnosis.where is None and findings.narrowing is not None:
        where.update(_site_where(findings.narrowing))
    return Verdict(
        probe="diff", name=config.name, status=outcome.diagnosis.status,
        layer=Layer.NUMERICS, why=outcome.diagnosis.why, where=where,
        metric=Metric("output_rel_l2", worst.output_error),  # ||c - b|| / ||b||, not a change
        evidence=tuple(evidence), next=outcome.diagnosis.next, artifacts=artifacts, env=env,
    )


def _tables(ctx: ProbeContext, results: Sequence[RequestResult], worst: RequestResult,
            tree: TreeDifferencesFound) -> tuple[list[Evidence], dict[str, str]]:
    """The tables every diff shows: its requests, the worst request's taps (all of them in a
    CSV artifact), and what the two module trees do not share."""
    csv_path = ctx.artifact("diff-modules.csv")
    _write_module_csv(csv_path, worst)
    evidence: list[Evidence] = [_requests_table(results), _modules_table(worst, csv_path)]
    if tree.any:
        evidence.append(_tree_evidence(tree))
    return evidence, {"modules_csv": str(csv_path)}


@dataclass
class _Location:
    """Where the error starts in the worst request: the first module whose own error fails
    (live modules, ``localize``), else the parent whose own forward makes it, else the first
    divergent tap's module."""

    localization: Localization | None
    localized: LocalError | None
    entry: ErrorEntryFound | None
    module: str | None
    evidence: list[Evidence]

    @property
    def local(self) -> bool | None:
        return _local_flag(self.localization.errors if self.localization is not None else (), self.localized)


def _locate(config: DiffConfig, live: _Live | None, worst: RequestResult, failed: bool, comparer: PairComparer,
            progress: Progress | None, axes: TokenAxes) -> _Location:
    first = worst.first_divergent
    evidence: list[Evidence] = []
    localization: Localization | None = None
    localized: LocalError | None = None
    modules_live = live is not None and live.baseline.kind == "module" and live.candidate.kind == "module"
    if failed and live is not None and config.localize and modules_live:
        localization = _localize(config, live, worst, comparer, progress, axes)
        localized = next((entry for entry in localization.errors if entry.failed), None)
        evidence.append(LocalErrors(
            request=worst.id, note="each module run on the baseline's inputs; local = the error it adds by itself, "
                                   "inherited = the error at its inputs",
            rows=tuple(_local_row(entry, worst) for entry in localization.errors),
        ))
    entry: ErrorEntryFound | None = None
    if (live is not None and localization is not None and localized is None and first is not None
            and not first.is_output):
        if progress is not None:
            progress(f"looking for the parent whose forward makes the difference at {first.tap.module}")
        entry = error_entry(live.baseline, live.candidate, live.requests[worst.id], first.tap.module, first.tap.call,
                            config.tolerances, _upstream_error(worst))
        evidence.append(_entry_evidence(worst.id, first.tap.module, entry))
    return _Location(localization, localized, entry, _start_module(worst, localized, entry), evidence)


def _upstream_error(worst: RequestResult) -> tuple[str, float] | None:
    """The first tap (execution order) with any error, when it comes before the first tap
    outside tolerance: the difference exists there already, within tolerance."""
    first = worst.first_divergent
    for tap in worst.taps:
        if tap is first:
            return None
        if tap.metrics.max_abs > 0 and not tap.is_output:
            return tap.tap.name, tap.metrics.rel_l2
    return None


def _start_module(worst: RequestResult, localized: LocalError | None, entry: ErrorEntryFound | None) -> str | None:
    """The module the verdict names (``module#call`` when the request calls it more than once)."""
    first = worst.first_divergent
    if localized is not None:
        return localized.module if _calls(worst, localized.module) == 1 else f"{localized.module}#{localized.call}"
    if entry is not None and entry.module:  # the top level has no path: the first module that shows it then
        return entry.module
    if first is not None and not first.is_output:
        return _module_label(first, worst)
    return None


@dataclass
class _AlongPositions:
    """The error along the worst request's positions where it starts (the localized module's
    own error, else the first divergent tap's), its profile and, when it steps, the onset in
    each failing request."""

    errors: PositionErrors | None = None
    tap: str | None = None
    profile: PositionShape | None = None
    onsets: tuple[tuple[str, int, int], ...] = ()
    evidence: list[Evidence] = field(default_factory=list)
    zeros: ZeroRegion | None = None  # the exactly-zero region it starts with, against chance and across requests
    axis: TokenAxis | None = None  # the token axis read there (None: no tap to read)

    @property
    def first_failing(self) -> int | None:
        return self.errors.first_failing if self.errors is not None else None

    @property
    def sequence(self) -> int | None:
        """The packed sequence the positions are of (None: not a packed request)."""
        segment = self.errors.segment if self.errors is not None else None
        return segment.index if segment is not None else None


def _token_axes(results: Sequence[RequestResult], requests: Sequence[Request]) -> TokenAxes:
    """Each tap's ``(shape, request length)`` in every request: what its token axis is found from;
    and the axis along which the requests' inputs hold their tokens (live: token ids ``[1, L]``,
    or the one sequence axis their tensors declare), which only breaks a tie of sizes."""
    observed: dict[str, list[tuple[Sequence[int], int | None]]] = {}
    for result in results:
        for tap in result.taps:
            observed.setdefault(tap.tap.name, []).append((tap.tap.shape, result.length))
    inputs = {1 if request.input_ids is not None else
              (next(iter(set(request.sequence_axes.values()))) if len(set(request.sequence_axes.values())) == 1 else None)
              for request in requests}
    return TokenAxes(observed, inputs.pop() if len(inputs) == 1 else None)


def _along_positions(baseline: CaptureReader, candidate: CaptureReader, results: Sequence[RequestResult],
                     worst: RequestResult, localized: LocalError | None, axes: TokenAxes) -> _AlongPositions:
    first = worst.first_divergent
    errors = localized.positions if localized is not None else None
    tap = localized.tap if localized is not None else None
    axis = localized.axis if localized is not None else None
    if errors is None and first is not None:
        axis = axes.of(first.tap.name, first.tap.shape, worst.length)
        errors = _tap_positions(baseline, candidate, first, worst, axes)
        tap = first.tap.name
    evidence: list[Evidence] = [_axis_evidence(worst.id, axis)] if axis is not None else []
    if errors is None:
        return _AlongPositions(tap=tap, evidence=evidence, axis=axis)
    profile = position_profile(list(errors.rel_l2), list(errors.outside))
    evidence.append(_positions_evidence(worst, tap, localized is not None, errors, axis))
    onsets: tuple[tuple[str, int, int], ...] = ()
    zeros: ZeroRegion | None = None
    if profile is not None:
        onsets = _onsets(baseline, candidate, results, worst, first, profile.onset, axes) if profile.step else ()
        if profile.zeros is not None:
            others = _zero_runs(baseline, candidate, results, worst, tap, axes) if profile.zeros.beyond_chance else ()
            zeros = ZeroRegion(profile.zeros, others)
        evidence.append(_profile_evidence(worst.id, tap, profile, onsets, zeros))
    return _AlongPositions(errors, tap, profile, onsets, evidence, zeros, axis)


def _axis_evidence(request: str, axis: TokenAxis) -> TokenAxisRead:
    return TokenAxisRead(request=request, tap=axis.tap, axis=axis.axis, basis=axis.basis, shape=axis.shape,
                         lengths=axis.lengths, candidates=axis.candidates, requests=axis.requests,
                         note=axis.describe())


def _zero_runs(baseline: CaptureReader, candidate: CaptureReader, results: Sequence[RequestResult],
               worst: RequestResult, tap_name: str | None, axes: TokenAxes) -> tuple[ZeroRun, ...]:
    """The exactly-zero region at the start of every other request whose error at ``tap_name``
    is not zero everywhere: whether the worst request's region recurs where they show it. It is
    the total error there (the worst request's may be a module's own error): an error inherited
    from upstream only shortens a region, so it never makes a boundary agree."""
    found: list[ZeroRun] = []
    for result in results:
        if result.id == worst.id or result.length is None:
            continue
        tap = next((t for t in result.taps if t.tap.name == tap_name), None)
        if tap is None or not tap.metrics.max_abs > 0:
            continue
        errors = _tap_positions(baseline, candidate, tap, result, axes)
        if errors is not None:
            run = quiet_run(list(errors.rel_l2), floor=ZERO_RUN_FLOOR)
            found.append(ZeroRun(result.id, run.positions, run.length))
    return tuple(found)


@dataclass
class _Shape:
    """How the error grows: with the request length (``length_fit``), else along positions
    (``fit``); its class; the first tap non-finite on one side only."""

    shape: ErrorShapeFound
    fit: GrowthFit | None
    length_fit: GrowthFit | None
    nonfinite: TapResult | None
    evidence: ErrorShape


def _error_shape(results: Sequence[RequestResult], along: _AlongPositions) -> _Shape:
    positions, profile = along.errors, along.profile
    nonfinite = next((t for r in results for t in r.taps if t.metrics.nonfinite_mismatch), None)
    length_fit = growth_fit([r.length or 0 for r in results], [r.output_error for r in results], "requests")
    fit = length_fit
    if fit is None and positions is not None:
        fit = growth_fit(*position_curve(list(positions.rel_l2)), "positions")
    spike = positions is not None and is_spike(list(positions.rel_l2), int((positions.outside > 0).sum()))
    any_error = any(t.metrics.max_abs > 0 for r in results for t in r.taps)
    shape = classify(fit, nonfinite=nonfinite is not None, spike=spike, any_error=any_error,
                     step=profile is not None and profile.step)
    record = ErrorShape(shape=shape.value, fit=_fit(fit), position_fit=_fit(profile.fit if profile else None),
                        measure="relative L2 error of the final outputs per request")
    return _Shape(shape, fit, length_fit, nonfinite, record)


@dataclass
class _Precision:
    """The precision tests of a failing diff, where its error starts: its signature (the typical
    relative error), and, unless a side is non-finite, the rounding and bias tests."""

    signature: PrecisionSignature | None = None
    rounding: RoundingFound | None = None
    bias: BiasTest | None = None
    size: RoundingSize | None = None
    evidence: list[Evidence] = field(default_factory=list)
    range: Float16Range | None = None  # a non-finite candidate: float16 there, against its range


def _float16_range(location: _Location, nonfinite: TapResult, baseline: CaptureReader) -> Float16Range | None:
    """What shows float16 where the candidate first gives NaN or Inf, and the baseline's values
    there against float16's range. Where the module where the error starts was traced and an
    operation of it gave NaN or Inf on finite operands, that operation is where: its dtypes,
    the module's, and the baseline's run of the same operation (matched by order). Otherwise
    the first tap non-finite on the candidate's side only: its dtype in the candidate's capture,
    and the module that makes it when that is the traced module."""
    if not nonfinite.tap.dtype.startswith(("float", "bfloat")):
        return None
    traced = _traced(location)
    culprit = location.localization.culprit if location.localization is not None else None
    if traced is not None and traced[1].first_nonfinite is not None:
        module, trace, baseline_trace, _ = traced
        op = trace.first_nonfinite
        assert op is not None
        dtypes = culprit.candidate_dtypes if culprit is not None and culprit.module == module.partition("#")[0] else ()
        seen = ([f"{op.operation}, the first operation to give NaN or Inf, computes in float16"]
                if "float16" in (*op.inputs, op.output) else [])
        seen += float16_seen(trace, dtypes)
        watched = baseline_trace.watched if baseline_trace is not None else None
        looked = "its parameters, inputs and outputs, and the operands of its operations run on the baseline's inputs"
        if watched is not None:
            nth = _ordinal(watched.call)
            return Float16Range(nonfinite.tap.name, module, watched.max_abs, watched.beyond, watched.elements,
                                tuple(dict.fromkeys(seen)), looked, op, True,
                                f"at the baseline's {nth} {watched.operation} in {module} (the same run of it as the "
                                f"candidate's, counted in order)")
        found = float16_range(baseline.load(nonfinite.tap), nonfinite.tap.name, module, tuple(dict.fromkeys(seen)),
                              looked, op, True)
        return replace(found, values_at=f"at {nonfinite.tap.name} (the baseline's run of {op.operation} could not be "
                                        "matched)")
    tap_module = nonfinite.tap.module if nonfinite.tap.module != OUTPUT else None
    seen_tap: list[str] = []
    if nonfinite.other.dtype == "float16":
        seen_tap.append("its output is float16 in the candidate's capture")
    if culprit is not None and culprit.module == nonfinite.tap.module:
        seen_tap += float16_seen(culprit.trace, culprit.candidate_dtypes)
        looked = ("its parameters, inputs and outputs, and the operands of its operations run on the baseline's "
                  "inputs" + ("" if culprit.trace is not None else "; its operations could not be traced"))
        first = culprit.trace.first_nonfinite if culprit.trace is not None else None
        was_traced = culprit.trace is not None
    else:
        looked, first, was_traced = "the dtype of its output in the candidate's capture", None, False
    return float16_range(baseline.load(nonfinite.tap), nonfinite.tap.name, tap_module,
                         tuple(dict.fromkeys(seen_tap)), looked, first, was_traced)


def _ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _range_evidence(found: Float16Range) -> FormatRange:
    return FormatRange(tap=found.tap, module=found.module, baseline_max_abs=found.baseline_max_abs,
                       float16_max=FLOAT16_MAX, beyond=found.beyond, elements=found.elements,
                       float16_seen=found.seen, looked_at=found.looked_at, traced=found.traced,
                       values_at=found.values_at,
                       first_nonfinite=(f"{found.first_nonfinite.operation} in {found.first_nonfinite.output} on "
                                        f"{', '.join(found.first_nonfinite.inputs) or 'no floating'} operands"
                                        if found.first_nonfinite is not None else None))


def _traced(location: _Location) -> tuple[str, OperationTrace, OperationTrace | None, TracedOp | None] | None:
    """The module where the error starts (the culprit, else the parent whose forward makes it),
    its candidate's and baseline's traces and the first narrowing the baseline does not run."""
    culprit = location.localization.culprit if location.localization is not None else None
    if location.localized is not None and culprit is not None and culprit.trace is not None:
        return location.module or culprit.module, culprit.trace, culprit.baseline_trace, culprit.narrowing
    entry = location.entry
    if entry is not None and entry.module is not None and entry.trace is not None:
        return entry.module or "the top-level module", entry.trace, entry.baseline_trace, entry.narrowing
    return None


TRACE_ROWS = 40  # narrowed operations the dtype_trace evidence lists


def _op_row(op: TracedOp, in_baseline: frozenset[Any] | None = None) -> TracedOpRow:
    """A traced operation as evidence; ``in_baseline``: the keys of the baseline's narrowed
    operations (None: the baseline was not traced)."""
    site = op.site
    return TracedOpRow(
        operation=op.operation, inputs=op.inputs, output=op.output, cast=op.cast, calls=op.calls,
        file=site.file if site else None, line=site.line if site else None,
        function=site.function if site else None, code=site.code if site else None,
        in_baseline=(op.key in in_baseline) if in_baseline is not None else None,
    )


def _trace_evidence(module: str, trace: OperationTrace, baseline: OperationTrace | None,
                    narrowing: TracedOp | None) -> DtypeTrace:
    in_baseline = frozenset(o.key for o in baseline.narrowed) if baseline is not None else None
    rows = tuple(_op_row(op, in_baseline) for op in trace.narrowed)
    return DtypeTrace(
        module=module, reference=trace.reference, narrowed=rows[:TRACE_ROWS],
        named=narrowing.describe(trace.reference or "") if narrowing is not None else None,
        first_nonfinite=_op_row(trace.first_nonfinite) if trace.first_nonfinite is not None else None,
        truncated=f"{len(rows) - TRACE_ROWS} more operations" if len(rows) > TRACE_ROWS else None,
    )


def _site_where(op: TracedOp) -> dict[str, Any]:
    """``file``, ``line`` and ``function`` of the user's line that narrows, for the verdict's where."""
    if op.site is None:
        return {}
    return {"file": op.site.shown_file, "line": op.site.line, "function": op.site.function}


def _precision(location: _Location, baseline: CaptureReader, candidate: CaptureReader, results: Sequence[RequestResult],
               worst: RequestResult, tree: TreeDifferencesFound, nonfinite: TapResult | None,
               progress: Progress | None, axes: TokenAxes) -> _Precision:
    first = worst.first_divergent
    signature = _signature(location.localized, first, baseline, candidate, worst.length, axes)
    if nonfinite is not None:
        found = _float16_range(location, nonfinite, baseline)
        evidence = _signature_evidence(signature)
        if found is not None:
            evidence.append(_range_evidence(found))
        return _Precision(signature, evidence=evidence, range=found)
    if progress is not None:
        progress("testing whether rounding the baseline reproduces the error")
    rounding, bias = _precision_tests(location.localization, first, baseline, candidate, worst, axes, tree)
    if signature is not None and rounding is not None:
        signature = signature.tested({t.format for t in rounding.trials}, rounding.format)
    evidence = _signature_evidence(signature)
    if rounding is not None:
        evidence.append(_rounding_evidence(rounding))
    if bias is not None:
        evidence.append(_bias_evidence(bias))
    size = _rounding_size(location.localization, first, baseline, candidate, results)
    if size is not None:
        evidence.append(RoundingSizeEvidence(**size.to_dict()))
    return _Precision(signature, rounding, bias, size, evidence)


def _signature_evidence(signature: PrecisionSignature | None) -> list[Evidence]:
    return [PrecisionSignatureEvidence(**signature.to_dict())] if signature is not None else []


def _rounding_size(localization: Localization | None, first: TapResult | None, baseline: CaptureReader,
                   candidate: CaptureReader, results: Sequence[RequestResult]) -> RoundingSize | None:
    """The error where it starts (the culprit's own error, else the first divergent tap's)
    against its dtype's unit roundoff; when it is of that size, the absolute tolerance at which
    every failing tap of every request passes."""
    culprit = localization.culprit if localization is not None else None
    output_error = max((r.output_error for r in results), default=0.0)
    if culprit is not None:
        base, cand = culprit.baseline, culprit.candidate
        subject = f"own error of {culprit.tap} (the candidate's module on the baseline's inputs)"
        tap = next((t for r in results for t in r.taps if t.tap.name == culprit.tap), first)
    elif first is not None:
        base, cand = baseline.load(first.tap), candidate.load(first.other)
        subject, tap = f"error of tap {first.tap.name}", first
    else:
        return None
    if tap is None:
        return None
    dtype = str(base.dtype).removeprefix("torch.")
    size = rounding_size(base, cand, dtype, subject, output_error, tap.metrics.rtol, tap.metrics.atol)
    if size is None or not size.applies:
        return size
    pairs = [(baseline.load(t.tap), candidate.load(t.other), t.metrics.rtol)
             for r in results if r.failed for t in r.failing_taps]
    return replace(size, passing_atol=passing_atol(pairs)) if pairs else size


@dataclass
class _Reproducer:
    """What the minimizer left: the shortest failing prefix as a requests file and the command
    that reruns it, or the note saying why there is none."""

    rerun: Step | None = None
    note: str | None = None
    artifacts: dict[str, str] = field(default_factory=dict)
    evidence: list[Evidence] = field(default_factory=list)


def _minimal_reproducer(config: DiffConfig, ctx: ProbeContext, live: _Live, worst: RequestResult,
                        comparer: PairComparer, alone: bool) -> _Reproducer:
    """The shortest failing prefix of the worst request. Its rerun is a next step only when it
    can change what is known: a shorter request, or one request out of several; a request
    that is already minimal and was the only one would rerun this very diff."""
    minimized = _minimize(config, live, worst, comparer, ctx.progress)
    minimal = minimized.prefix
    if minimal is not None:
        path = ctx.artifact(f"minimal-{_safe(worst.id)}.jsonl")
        write_requests(path, [minimal.request])
        rerun = reproducer_step(config, path)
        narrower = minimal.length < minimal.original_length or not alone
        return _Reproducer(rerun=rerun if narrower else None, artifacts={"minimal_requests": str(path)},
                           evidence=[MinimalReproducer(
            request=worst.id, length=minimal.length, original_length=minimal.original_length, file=str(path),
            tried=tuple(Tried(length=n, failed=f) for n, f in minimal.tried), command=command_line(rerun),
        )])
    if minimized.note is not None:
        return _Reproducer(note=minimized.note, evidence=[MinimizerNote(
            request=worst.id, note=minimized.note, tried=tuple(Tried(length=n, failed=f) for n, f in minimized.tried),
        )])
    return _Reproducer()


def _comparison_conditions(config: DiffConfig, baseline: CaptureReader, candidate: CaptureReader) -> list[Evidence]:
    """How the two captures were made and compared: their environments' differences (if
    any) and the tolerances used."""
    evidence: list[Evidence] = []
    env_diff = differences(baseline.manifest.env, candidate.manifest.env)
    if env_diff:
        evidence.append(EnvDifferences(note="the captures were made in different environments",
                                       differences={k: list(v) for k, v in env_diff.items()}))
    tolerances = config.tolerances
    evidence.append(TolerancesUsed(
        rtol=tolerances.rtol, atol=tolerances.atol,
        per_tap=tuple(TapTolerance(glob=g, rtol=r, atol=a) for g, r, a in tolerances.per_tap),
    ))
    return evidence


def _side_runs(baseline: CaptureReader, candidate: CaptureReader) -> list[SideRun]:
    """Each side as it ran: one process, or torch.distributed ranks (from its manifest)."""
    runs = []
    for side, reader in (("baseline", baseline), ("candidate", candidate)):
        distributed = reader.manifest.distributed or {}
        layouts = {str(glob): layout for glob, layout in distributed.get("layouts") or ()}
        runs.append(SideRun(side=side, target=reader.manifest.target,
                            world_size=int(distributed.get("world_size") or 1), backend=distributed.get("backend"),
                            layouts=layouts or None, live=reader.manifest.live))
    return runs


def _findings(results: Sequence[RequestResult], worst: RequestResult, tree: TreeDifferencesFound,
              location: _Location, along: _AlongPositions, shape: _Shape, precision: _Precision,
              tokens: Tokens | None, knobs: Sequence[KnobResult],
              reproducer: _Reproducer) -> DiffFindings:
    """What the measurements established, in the terms the rules speak."""
    failed = any(r.failed for r in results)
    first, localized, length_fit = worst.first_divergent, location.localized, shape.length_fit
    narrowing = _traced(location)
    return DiffFindings(
        failed=failed, requests=len(results), failing_requests=sum(r.failed for r in results),
        request=worst.id if failed else None, module=location.module, step=_step(worst, location.module),
        tap=(localized.tap if localized else (first.tap.name if first else None)), position=along.first_failing,
        token_axis=along.axis.axis if along.axis is not None else None,
        token_axis_basis=along.axis.basis if along.axis is not None else None,
        token_axis_note=along.axis.describe() if along.axis is not None else None,
        sequence=along.errors.segment if along.errors is not None else None,
        local=location.local, first_divergent=first.tap.name if first else None, shape=shape.shape, fit=shape.fit,
        signature=precision.signature, dtype=first.tap.dtype if first else None,
        tokens=tokens, nonfinite_tap=shape.nonfinite.tap.name if shape.nonfinite else None,
        output_rel_l2=max(r.output_error for r in results), rerun=reproducer.rerun,
        length_fit=length_fit if length_fit is not None and _spans(length_fit) else None,
        profile=along.profile, profile_tap=along.tap, onsets=tuple((n, o) for _, n, o in along.onsets),
        zeros=along.zeros,
        rounding=precision.rounding, bias=precision.bias, tree=tree, entry=location.entry,
        size=precision.size,
        counterfactuals=tuple(knobs), minimize_note=reproducer.note,
        narrowing=narrowing[3] if narrowing is not None else None,
        narrowing_module=narrowing[0] if narrowing is not None else None,
        reference=narrowing[1].reference if narrowing is not None else None,
        first_carries=_carries(location, first), range=precision.range,
    )


def _carries(location: _Location, first: TapResult | None) -> bool | None:
    """Whether the first tap outside tolerance belongs to a module whose own error, measured on
    the baseline's inputs, is within tolerance (it only carries an error made before it); None
    when it was not measured."""
    if first is None or location.localization is None:
        return None
    own = next((e for e in location.localization.errors
                if e.module == first.tap.module and e.call == first.tap.call), None)
    if own is None or own.metrics is None:
        return None
    return not own.failed


def _where(diagnosis: Diagnosis, failed: bool, worst: RequestResult, module: str | None, position: int | None,
           rank_record: RankErrors | None, sequence: int | None = None) -> dict[str, Any]:
    """Where the verdict points: the rule's own place when it names one, else the worst failing
    request, its module, position, the first divergent tap's shape and the first failing rank."""
    if diagnosis.where is not None:
        return dict(diagnosis.where)
    where: dict[str, Any] = {}
    if failed:
        first = worst.first_divergent
        where["request"] = worst.id
        if module:
            where["module"] = module
        if position is not None:
            where["position"] = position
            if sequence is not None:  # a packed request: the position is within this sequence
                where["sequence"] = sequence
        # every field about one thing: the shape of the blamed module's output (its first
        # call), or of the first divergent tap when no module is blamed
        described = next((t for t in worst.taps if t.tap.module == module), None) if module else first
        if described is not None:
            where["shape"] = "x".join(str(d) for d in described.tap.shape)
        if rank_record is not None and rank_record.first_failing_rank is not None:
            where["rank"] = rank_record.first_failing_rank
    return where


def _rank_errors(baseline: CaptureReader, candidate: CaptureReader, request: RequestResult,
                 tap: TapResult) -> RankErrors | None:
    """Which rank's piece of the first divergent tap fails first (a side captured on ranks)."""
    if baseline.manifest.distributed is None and candidate.manifest.distributed is None:
        return None
    from glmfb.diff.distributed import tap_rank_errors

    base_tap, cand_tap = tap.tap, tap.other
    slices = tap_rank_errors(baseline, candidate, base_tap, cand_tap,
                             Tolerance(tap.metrics.rtol, tap.metrics.atol))
    if not slices:
        return None
    layout = cand_tap.layout or base_tap.layout or {}
    first_rank = next((sl.rank for sl in slices if sl.failed), None)
    return RankErrors(
        request=request.id, tap=tap.tap.name, world_size=len(layout.get("sizes", [])) or 1,
        order=str(layout.get("order", "contiguous")),
        slices=tuple(RankSliceRow(**sl.to_dict()) for sl in slices), first_failing_rank=first_rank,
    )


def _spans(fit: GrowthFit) -> bool:
    """A growth across requests needs lengths that span at least 4x (a fit over 16, 32 and 64
    tokens may; over 60, 62 and 64 it says nothing)."""
    return min(fit.lengths) > 0 and max(fit.lengths) / min(fit.lengths) >= 4.0


def _fit(fit: GrowthFit | None) -> Fit | None:
    if fit is None:
        return None
    data = fit.to_dict()
    return Fit(**data)


def _local_flag(local: Sequence[LocalError], localized: LocalError | None) -> bool | None:
    """True: a module's own error exceeds tolerance; False: every suspect was measured and
    none does (the error is only inherited); None: not measured (captures) or not all could be."""
    if localized is not None:
        return True
    if local and all(entry.metrics is not None for entry in local):
        return False
    return None


def _step(request: RequestResult, label: str | None) -> int | None:
    """The generation step a live capture recorded for the module call ``label`` names
    (``module`` or ``module#call``); None for a capture that recorded none."""
    if not label:
        return None
    module, _, call = label.partition("#")
    number = int(call) if call.isdigit() else 0
    return next((t.tap.step for t in request.taps if t.tap.module == module and t.tap.call == number), None)


def _calls(request: RequestResult, module: str) -> int:
    return max((t.tap.call + 1 for t in request.taps if t.tap.module == module), default=1)


def _localize(config: DiffConfig, live: _Live, worst: RequestResult, comparer: PairComparer,
              progress: Progress | None, axes: TokenAxes) -> Localization:
    suspects: list[tuple[str, int, int]] = []
    for tap in worst.failing_taps:
        key = (tap.tap.module, tap.tap.call, _calls(worst, tap.tap.module))
        if not tap.is_output and key not in suspects:
            suspects.append(key)
    suspects = suspects[: config.max_suspects]
    if progress is not None:
        progress(f"measuring local error of {len(suspects)} modules on {worst.id}")
    return local_errors(live.baseline, live.candidate, live.requests[worst.id], suspects, config.tolerances, comparer,
                        axes)


def _minimize(config: DiffConfig, live: _Live, worst: RequestResult, comparer: PairComparer,
              progress: Progress | None) -> Minimized:
    modules = sorted({t.tap.module for t in worst.failing_taps if not t.is_output})
    return shortest_failing_prefix(live.baseline, live.candidate, live.requests[worst.id], modules,
                                   config.tolerances, comparer, progress)


def _tap_positions(baseline: CaptureReader, candidate: CaptureReader, tap: TapResult, request: RequestResult,
                   axes: TokenAxes) -> PositionErrors | None:
    """The error along a tap's token axis in one request (for a packed request, along the
    sequence that holds its first failing position); None where no token axis is found."""
    dim = axes.of(tap.tap.name, tap.tap.shape, request.length).axis
    if dim is None:
        return None
    tolerance = Tolerance(tap.metrics.rtol, tap.metrics.atol)
    errors = position_errors(baseline.load(tap.tap), candidate.load(tap.other), dim, tolerance)
    return errors.in_sequence(request.offsets)


def _positions_evidence(worst: RequestResult, tap: str | None, local: bool, positions: PositionErrors,
                        axis: TokenAxis | None) -> ErrorByPosition:
    count = len(positions.rel_l2)
    bins = position_bins(count)
    xs, ys = position_curve(list(positions.rel_l2))
    outside = [float(positions.outside[start:end].sum()) / max(1, (end - start) * positions.width) for start, end in bins]
    return ErrorByPosition(
        request=worst.id, tap=tap, local=local, first_failing_position=positions.first_failing,
        failing_positions=int((positions.outside > 0).sum()), positions=tuple(int(x) for x in xs),
        rel_l2=tuple(float(y) for y in ys), bin_edges=tuple([start for start, _ in bins] + ([count] if bins else [])),
        outside_fraction=tuple(outside), length=worst.length if positions.segment is None else count,
        token_axis=axis.axis if axis is not None else positions.dim,
        sequence=positions.segment.index if positions.segment is not None else None,
        sequence_start=positions.segment.start if positions.segment is not None else None,
    )


def _profile_evidence(request: str, tap: str | None, profile: PositionShape,
                      onsets: tuple[tuple[str, int, int], ...], zeros: ZeroRegion | None = None) -> PositionProfile:
    quiet, run = profile.quiet, zeros.run if zeros is not None else None
    return PositionProfile(
        onset_chance=quiet.chance if quiet is not None else None,
        onset_chance_needed=quiet.needed if quiet is not None else None,
        zero_run=run.length if run is not None else None,
        zero_rate=run.rate if run is not None else None,
        zero_run_chance=run.chance if run is not None else None,
        zero_run_needed=run.needed if run is not None else None,
        zero_runs=tuple(ZeroRunRow(request=o.request, length=o.positions, zero_run=o.length,
                                   agrees=zeros.agrees(o)) for o in zeros.others) if zeros is not None else (),
        boundary=zeros.backed if zeros is not None else None,
        request=request, tap=tap, onset=profile.onset, positions=profile.positions,
        failing_after=profile.failing_after, before_max_rel_l2=profile.before_max,
        after_median_rel_l2=profile.after_median, step=profile.step, growing=profile.growing,
        predicted_before=profile.predicted_before, rise=profile.rise,
        rank_correlation=profile.rank_correlation, growth_from=profile.start,
        onsets=tuple(OnsetRow(request=r, length=n, onset=o) for r, n, o in onsets),
    )


def _onsets(baseline: CaptureReader, candidate: CaptureReader, results: Sequence[RequestResult],
            worst: RequestResult, first: TapResult | None, worst_onset: int,
            axes: TokenAxes) -> tuple[tuple[str, int, int], ...]:
    """``(request, length, first failing position)`` of each failing request at the tap the error
    is first seen in (the worst request's from its profile): whether the onset sits at a fixed
    position or moves with the length. For a packed request, the length and onset of the
    sequence that fails first."""
    if first is None:
        return ()
    found: list[tuple[str, int, int]] = []
    for result in results:
        if not result.failed or result.length is None:
            continue
        tap = next((t for t in result.taps if t.tap.name == first.tap.name), None)
        if result.id == worst.id and result.offsets is None:
            found.append((result.id, result.length, worst_onset))
            continue
        if tap is None or not tap.failed:
            continue
        errors = _tap_positions(baseline, candidate, tap, result, axes)
        if errors is not None and errors.first_failing is not None:
            found.append((result.id, len(errors.rel_l2), errors.first_failing))
    return tuple(found)


def _signature(localized: LocalError | None, first: TapResult | None, baseline: CaptureReader,
               candidate: CaptureReader, length: int | None, axes: TokenAxes) -> PrecisionSignature | None:
    """The typical relative error where the error starts (the localized module's own error in
    live mode, else the first divergent tap), before it has had positions to accumulate over."""
    if localized is not None and localized.typical_relative is not None:
        return precision_signature(localized.typical_relative,
                                   f"local error of {localized.tap}: median element-wise relative error, first positions")
    if first is None:
        return None
    base, cand = baseline.load(first.tap), candidate.load(first.other)
    typical = typical_relative_error(base, cand, axes.of(first.tap.name, first.tap.shape, length).axis)
    if typical is None:
        return None
    return precision_signature(typical, f"error of {first.tap.name}: median element-wise relative error, first positions")


def _precision_tests(localization: Localization | None, first: TapResult | None, baseline: CaptureReader,
                     candidate: CaptureReader, worst: RequestResult, axes: TokenAxes,
                     tree: TreeDifferencesFound | None = None) -> tuple[RoundingFound | None, BiasTest | None]:
    """The rounding and bias tests on the error where it starts: the culprit module's own error
    (rerunning it under each format, and inside each of its submodules the candidate does not
    run: the deepest module both sides share is the culprit, the part it replaced is those),
    else the first divergent tap's error (its output only)."""
    culprit = localization.culprit if localization is not None else None
    if culprit is not None:
        subject = f"own error of {culprit.tap} (the candidate's module on the baseline's inputs)"
        scopes: list[str] = []
        if tree is not None and tree.any:
            only_baseline, _ = tree.modules_below(culprit.module)
            scopes = [m[len(culprit.module) + 1:] for m in only_baseline if m.startswith(culprit.module + ".")]
        rounding = rounding_test(culprit.baseline, culprit.candidate, subject, culprit.rerun, culprit.candidate_dtypes,
                                 scopes=scopes[:4], candidate_ops=culprit.candidate_ops)
        return rounding, bias_test(culprit.baseline, culprit.candidate, culprit.dim, subject)
    if first is None or not first.tap.dtype.startswith(("float", "bfloat")):
        return None, None
    base, cand = baseline.load(first.tap), candidate.load(first.other)
    subject = f"error of tap {first.tap.name} (captures: its output only can be rounded)"
    dtypes = [first.other.dtype]
    dim = axes.of(first.tap.name, first.tap.shape, worst.length).axis
    return rounding_test(base, cand, subject, None, dtypes), bias_test(base, cand, dim, subject)


def _tokens(baseline: CaptureReader, candidate: CaptureReader, request: RequestResult,
            axes: TokenAxes) -> Tokens | None:
    for tap in request.outputs:
        if not is_logits(tap.tap.name, tap.tap.shape, request.length) or not tap.tap.dtype.startswith(("float", "bfloat")):
            continue
        dim = axes.of(tap.tap.name, tap.tap.shape, request.length).axis
        if dim is None or dim == len(tap.tap.shape) - 1:
            continue
        return token_metrics(baseline.load(tap.tap), candidate.load(tap.other), dim, request=request.id,
                             tap=tap.tap.name)
    return None


# --------------------------------------------------------------------------------------------
# Counterfactuals
# --------------------------------------------------------------------------------------------


def _candidate_device(side: LoadedSide | None) -> str:
    import torch

    if side is not None and side.kind == "module":
        tensor = next(iter([*side.module.parameters(), *side.module.buffers()]), None)
        if tensor is not None:
            return str(tensor.device)
    return "cuda" if torch.cuda.is_available() and side is not None and side.kind != "module" else "cpu"


def _counterfactuals(run: _Run, baseline: CaptureReader, results: Sequence[RequestResult],
                     comparer: PairComparer) -> list[KnobResult]:
    """Each declared knob's values, the candidate rebuilt and recaptured with each and compared
    with the baseline's capture."""
    import shutil

    config = run.config
    current_error = max(r.output_error for r in results)
    knobs: list[KnobResult] = []
    on_ranks = run.candidate_side is None and config.candidate_nproc > 0 and ":" in config.candidate
    if run.candidate_side is None and not on_ranks:
        note = "the candidate is a capture directory, so it cannot be rerun with another value"
        for knob, values in config.counterfactuals:
            knobs.append(try_knob(knob, values, None, current_error, lambda value: [], note))
        return knobs
    if run.candidate_side is not None:
        factory = run.candidate_side.target.load()
        device = _candidate_device(run.candidate_side)
    else:  # a candidate on torch.distributed ranks: rerun there, one launch per value
        factory = Target(config.candidate, dict(config.candidate_args), config.base_dir).load()
        device = "ranks"
    for number, (knob, values) in enumerate(config.counterfactuals):
        builtin = is_builtin(knob)
        current = (builtin_value(knob) if builtin else
                   config.candidate_args.get(knob, factory_default(factory, knob)))
        not_tried = not_honoured(knob, device) if builtin else None
        if builtin and on_ranks:
            not_tried = "the candidate runs on torch.distributed ranks, in processes this switch does not reach"

        def rerun(value: Any, knob: str = knob, builtin: bool = builtin, number: int = number) -> list[RequestResult]:
            out = run.ctx.artifact_dir / "captures" / f"counterfactual-{number}-{_safe(str(value))}"
            args = dict(config.candidate_args) if builtin else {**config.candidate_args, knob: value}
            if run.ctx.progress is not None:
                run.ctx.progress(f"counterfactual: the candidate with {knob}={value}")
            try:
                with switched(knob, value) if builtin else nullcontext():
                    capture_target(config, config.candidate, args, "candidate", run.requests, out, run.ctx.progress)
                reader = CaptureReader(out)
                reader.select(config.taps, keep=OUTPUT)
                return compare_and_match(baseline, reader, config.tolerances, comparer)[0]
            finally:
                if not config.keep_captures:
                    shutil.rmtree(out, ignore_errors=True)

        knobs.append(try_knob(knob, values, current, current_error, rerun, not_tried))
    return knobs


def _counterfactual_evidence(knob: KnobResult) -> Counterfactual:
    return Counterfactual(
        knob=knob.knob, candidate_value=knob.candidate_value, candidate_rel_l2=knob.candidate_rel_l2,
        closes=knob.closes, improvement=knob.improvement, note=knob.note or None,
        results=tuple(CounterfactualRun(value=r.value, rel_l2=r.rel_l2, failed=r.failed, lengths=r.lengths,
                                        errors=r.errors, tried=r.tried, note=r.note or None) for r in knob.runs),
    )


# --------------------------------------------------------------------------------------------
# Evidence of the tests
# --------------------------------------------------------------------------------------------


def _rounding_evidence(test: RoundingFound) -> RoundingTestEvidence:
    return RoundingTestEvidence(
        subject=test.subject, observed_rel_l2=test.observed_rel_l2, elements=test.elements,
        trials=tuple(RoundingTrial(**trial.to_dict()) for trial in test.trials),
        reproduced_by=test.format, best_variant=test.best.what if test.best is not None else None,
        equally=test.equally, dtype_evidence=test.dtype_evidence, live=test.live, computes_in=test.computes_in,
        candidate_operands=tuple(f"{op}: {dtype}" for op, dtype in test.operands),
        same_rounding=test.same_rounding, named=test.name or None,
        left_out=tuple(f"{t.format} {t.what}: {t.note.removeprefix(LEFT_OUT)}" for t in test.left_out),
    )


def _bias_evidence(bias: BiasTest) -> Bias:
    return Bias(subject=bias.subject, explained=bias.explained, mean_scale=bias.mean_scale,
                mean_shift=bias.mean_shift, rows=bias.rows, row_width=bias.row_width, systematic=bias.systematic)


def _tree_evidence(tree: TreeDifferencesFound) -> TreeDifferences:
    return TreeDifferences(
        shared_taps=tree.shared, baseline_taps=tree.baseline_taps, candidate_taps=tree.candidate_taps,
        baseline_only=tree.baseline_only, candidate_only=tree.candidate_only,
        baseline_only_modules=tree.baseline_only_modules, candidate_only_modules=tree.candidate_only_modules,
        dtypes=tuple(DtypeDifference(tap=t, baseline=b, candidate=c) for t, b, c in tree.dtypes),
        shapes=tuple(ShapeDifference(tap=t, baseline=b, candidate=c) for t, b, c in tree.shapes),
        order_differs=tree.order_differs,
    )


def _entry_evidence(request: str, start: str, entry: ErrorEntryFound) -> ErrorEntry:
    return ErrorEntry(
        request=request, start=start, module=entry.module, root_class=entry.root_class or None,
        steps=tuple(EntryStepRow(module=step.module, compared=step.compared, note=step.note or None,
                                 differing=tuple(InputDifferenceRow(name=d.name, detail=d.detail) for d in step.differing))
                    for step in entry.steps),
        upstream=entry.upstream[0] if entry.upstream else None,
        upstream_rel_l2=entry.upstream[1] if entry.upstream else None,
    )


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def _requests_table(results: Sequence[RequestResult]) -> Requests:
    rows = []
    for result in results:
        first = result.first_divergent
        rows.append(RequestRow(
            request=result.id, length=result.length, status="fail" if result.failed else "pass",
            first_divergent=first.tap.name if first else None,
            failing_taps=len(result.failing_taps), taps=len(result.taps),
            output_rel_l2=result.output_error,
            output_max_abs=max((t.metrics.max_abs for t in result.outputs), default=0.0),
        ))
    return Requests(rows=tuple(rows))


MODULE_COLUMNS = ("order", "tap", "module", "call", "shape", "dtype", "status", "max_abs", "max_rel", "rmse",
                  "cosine", "rel_l2", "outside_fraction", "nan_baseline", "nan_candidate", "inf_baseline",
                  "inf_candidate", "worst_index", "rtol", "atol")


def _module_rows(request: RequestResult) -> list[dict[str, Any]]:
    rows = []
    for order, tap in enumerate(request.taps):
        m = tap.metrics
        rows.append({
            "order": order, "tap": tap.tap.name, "module": tap.tap.module, "call": tap.tap.call,
            "shape": "x".join(str(d) for d in tap.tap.shape), "dtype": tap.tap.dtype,
            "status": "fail" if tap.failed else "pass", "max_abs": m.max_abs, "max_rel": m.max_rel,
            "rmse": m.rmse, "cosine": m.cosine, "rel_l2": m.rel_l2, "outside_fraction": m.outside_fraction,
            "nan_baseline": m.nan_baseline, "nan_candidate": m.nan_candidate, "inf_baseline": m.inf_baseline,
            "inf_candidate": m.inf_candidate, "worst_index": list(m.worst_index), "rtol": m.rtol, "atol": m.atol,
        })
    return rows


def _modules_table(request: RequestResult, csv_path: Path) -> Modules:
    rows = _module_rows(request)
    return Modules(
        request=request.id, csv=str(csv_path), rows=tuple(ModuleRow(**row) for row in rows[:EVIDENCE_ROWS]),
        truncated=f"{len(rows) - EVIDENCE_ROWS} more rows in the CSV" if len(rows) > EVIDENCE_ROWS else None,
    )


def _write_module_csv(path: Path, request: RequestResult) -> None:
    """Every tap of the request (the evidence keeps the first rows), as a pandas table."""
    import pandas as pd

    from glmfb.core.io import atomic_writer

    rows = _module_rows(request)
    for row in rows:
        row["worst_index"] = "x".join(str(i) for i in row["worst_index"])
    with atomic_writer(path) as handle:
        pd.DataFrame(rows, columns=list(MODULE_COLUMNS)).to_csv(handle, index=False)


def _local_row(entry: LocalError, request: RequestResult) -> LocalRow:
    inherited = next((t.metrics for t in request.taps if t.tap.name == entry.tap), None)
    row: dict[str, Any] = {"module": entry.module, "call": entry.call, "tap": entry.tap,
                           "local_exceeds_tolerance": entry.failed, "inherited_rel_l2": entry.inherited_rel_l2}
    if entry.metrics is not None:
        row.update(local_rel_l2=entry.metrics.rel_l2, local_max_abs=entry.metrics.max_abs,
                   local_outside_fraction=entry.metrics.outside_fraction)
    if inherited is not None:
        row.update(total_rel_l2=inherited.rel_l2, total_max_abs=inherited.max_abs)
    if entry.note:
        row["note"] = entry.note
    return LocalRow(**row)


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def reproducer_step(config: DiffConfig, requests: Path) -> Step:
    """The step that reruns this diff on the minimal reproducer (``requests``), with the
    same options but the counterfactuals (already read)."""
    return rerun_step("diff", config, "rerun the minimal reproducer", requests=str(requests), counterfactuals=None,
                      intent=Intent.REPRODUCE)


__all__ = ["OUTPUT", "CaptureConfig", "DiffConfig", "GrowthFit", "reproducer_step", "run_capture", "run_diff"]
