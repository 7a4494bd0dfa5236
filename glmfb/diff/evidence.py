"""The evidence kinds of ``glmfb diff``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from glmfb.contract.evidence import Evidence, Record, evidence_kind


@dataclass(frozen=True, kw_only=True)
class RequestRow(Record):
    request: str
    status: str
    taps: int
    failing_taps: int
    output_rel_l2: float
    output_max_abs: float
    length: int | None = None
    first_divergent: str | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Requests(Evidence):
    """Per request: pass or fail, the first tap outside tolerance, the output's error."""

    kind: ClassVar[str] = "requests"
    show_in_terminal: ClassVar[bool] = True
    rows: tuple[RequestRow, ...]

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(title="requests", title_justify="left")
        for column in ("request", "length", "status", "first divergent tap", "failing taps", "output rel. L2"):
            table.add_column(column)
        for row in self.rows:
            table.add_row(row.request, "" if row.length is None else str(row.length), row.status,
                          row.first_divergent or "", f"{row.failing_taps}/{row.taps}", f"{row.output_rel_l2:.3g}")
        return table

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"requests": [row.to_dict() for row in self.rows]}


@dataclass(frozen=True, kw_only=True)
class ModuleRow(Record):
    order: int
    tap: str
    module: str
    call: int
    shape: str
    dtype: str
    status: str
    max_abs: float
    max_rel: float
    rmse: float
    cosine: float
    rel_l2: float
    outside_fraction: float
    nan_baseline: int
    nan_candidate: int
    inf_baseline: int
    inf_candidate: int
    worst_index: tuple[int, ...]
    rtol: float
    atol: float


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Modules(Evidence):
    """Every tap of the worst request, in execution order, with its error metrics."""

    kind: ClassVar[str] = "modules"
    request: str
    rows: tuple[ModuleRow, ...]
    csv: str | None = None
    truncated: str | None = None

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"modules": [{"request": self.request, **row.to_dict()} for row in self.rows]}


@dataclass(frozen=True, kw_only=True)
class LocalRow(Record):
    module: str
    call: int
    tap: str
    local_exceeds_tolerance: bool
    local_rel_l2: float | None = None
    local_max_abs: float | None = None
    local_outside_fraction: float | None = None
    total_rel_l2: float | None = None
    total_max_abs: float | None = None
    inherited_rel_l2: float | None = None  # the error at the module's inputs, candidate run against baseline
    note: str | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class LocalErrors(Evidence):
    """Each suspect module run on the baseline's inputs: the error it adds by itself (local)
    against the error it shows in the candidate run (own plus inherited)."""

    kind: ClassVar[str] = "local_error"
    request: str
    note: str
    rows: tuple[LocalRow, ...]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"local_error": [{"request": self.request, **row.to_dict()} for row in self.rows]}


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ErrorByPosition(Evidence):
    """Relative error per position of one tap (binned for long sequences). ``positions`` are
    1-based bin centres (kept for older readers); ``bin_edges`` are 0-based: bin ``i`` holds
    positions ``bin_edges[i]`` to ``bin_edges[i + 1] - 1``, with ``outside_fraction[i]`` of its
    elements outside tolerance."""

    kind: ClassVar[str] = "error_by_position"
    request: str
    local: bool
    failing_positions: int
    positions: tuple[int, ...]
    rel_l2: tuple[float, ...]
    tap: str | None = None
    first_failing_position: int | None = None
    bin_edges: tuple[int, ...] = ()
    outside_fraction: tuple[float, ...] = ()
    length: int | None = None  # positions read (a packed request: its sequence's tokens)
    token_axis: int | None = None  # the tap's axis read as tokens (see token_axis)
    sequence: int | None = None  # a packed request: the sequence these positions are of
    sequence_start: int | None = None  # and its first token's packed position

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"error_by_position": [{"request": self.request, "tap": self.tap, "position": p, "rel_l2": e}
                                      for p, e in zip(self.positions, self.rel_l2, strict=False)]}


@dataclass(frozen=True, kw_only=True)
class Fit(Record):
    """A growth fit of error against length (or position): linear and log-log."""

    basis: str
    points: int
    slope: float
    r2: float
    loglog_exponent: float
    loglog_r2: float
    lengths: tuple[float, ...]
    errors: tuple[float, ...]
    intercept: float | None = None  # error = intercept + slope * length
    loglog_intercept: float | None = None  # log(error) = loglog_intercept + loglog_exponent * log(length)


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ErrorShape(Evidence):
    """How the error behaves: none, a step along positions, constant, growing (with its fit), a
    spike, non-finite."""

    kind: ClassVar[str] = "error_shape"
    shape: str
    measure: str
    fit: Fit | None = None
    position_fit: Fit | None = None  # error against position within the worst request, from the onset on


@dataclass(frozen=True, kw_only=True)
class OnsetRow(Record):
    request: str
    length: int
    onset: int


@dataclass(frozen=True, kw_only=True)
class ZeroRunRow(Record):
    """Another request's leading positions of exactly zero error at the same tap, and whether its
    region ends where the worst request's does (the same position or the same fraction)."""

    request: str
    length: int
    zero_run: int
    agrees: bool


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class PositionProfile(Evidence):
    """Error along the positions of one request: where it starts (the onset), whether it is
    zero before and a step there, or grows along the sequence."""

    kind: ClassVar[str] = "position_profile"
    request: str
    tap: str | None
    onset: int  # the first position outside tolerance (0-based)
    positions: int
    failing_after: float  # share of the positions from the onset on that fail
    before_max_rel_l2: float  # the largest error before the onset
    after_median_rel_l2: float
    step: bool  # zero (far below what follows) up to the onset, large from there on
    growing: bool  # the error grows along the sequence from the onset on
    predicted_before: float | None = None  # the fitted growth's error at onset - 1
    rise: float | None = None  # median error of the later half of the positions over the first bin's
    rank_correlation: float | None = None  # Spearman's rank correlation of error and position
    onsets: tuple[OnsetRow, ...] = ()  # the onset in each failing request (at the first divergent tap)
    growth_from: int | None = None  # the first position the growth along the sequence is fitted from
    # the quiet positions before the onset against chance: rate ** onset, where rate is the share of the
    # positions from the onset on that are as quiet; a step needs it below 1% (onset_chance_needed positions)
    onset_chance: float | None = None
    onset_chance_needed: int | None = None
    # the leading positions of exactly zero error (a block of a reordered sum computed alike), the share
    # of the positions after them that are exactly zero too, the chance of such a run (zero_rate **
    # zero_run), the run chance makes unlikely (below 1%, at least 4 positions), the same region in the
    # other requests, and whether it backs a boundary (beyond chance, and recurring where others show error)
    zero_run: int | None = None
    zero_rate: float | None = None
    zero_run_chance: float | None = None
    zero_run_needed: int | None = None
    zero_runs: tuple[ZeroRunRow, ...] = ()
    boundary: bool | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class PrecisionSignatureEvidence(Evidence):
    """The typical relative error where the error starts, against each format's unit roundoff."""

    kind: ClassVar[str] = "precision_signature"
    observed_rel_error: float
    source: str
    ratio_to_unit_roundoff: dict[str, float]
    nearest: str
    factor_from_nearest: float
    consistent: bool  # the size matches and the rounding test, where it tried that format, did not refute it
    unit_roundoff: dict[str, float]
    size_consistent: bool | None = None  # the size alone is within 4x of the nearest format's rounding
    rounding_test: str | None = None  # rounding to the nearest format: "reproduced", "not reproduced", None (not tried)


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class TokenAxisRead(Evidence):
    """Which axis of the tap where the error starts was read as tokens, found from the requests'
    lengths: the axis whose size follows every request's length (``basis`` "follows the length"),
    the only axis of their one length ("size only"), or none ("ambiguous": several axes do;
    "none"). Positions are named only where one was found."""

    kind: ClassVar[str] = "token_axis"
    request: str
    tap: str
    axis: int | None
    basis: str
    shape: tuple[int, ...]
    lengths: tuple[int, ...]  # the distinct request lengths read against
    candidates: tuple[int, ...]  # axes whose size is the length in every request
    requests: int
    note: str


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Tokens(Evidence):
    """Token-level agreement of logits: argmax, top-k overlap, KL, log-prob changes."""

    kind: ClassVar[str] = "tokens"
    request: str
    tap: str
    positions: int
    argmax_agreement: float
    topk: int
    topk_overlap_mean: float
    topk_overlap_min: float
    kl_max: float
    kl_mean: float
    first_argmax_diff: int | None = None
    kl_max_position: int | None = None
    logprob_change_max: float | None = None
    logprob_change_position: int | None = None
    logprob_change_token: int | None = None


@dataclass(frozen=True, kw_only=True)
class RoundingTrial(Record):
    format: str
    variant: str
    rel_l2: float
    size_ratio: float
    correlation: float
    sign_agreement: float
    reproduces: bool
    note: str | None = None
    scope: str | None = None  # the submodule the format was imposed inside (none: the whole module)


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class RoundingTest(Evidence):
    """The baseline rounded to each format in several ways, against the observed error: the
    size of each simulated error relative to the observed one, the correlation of the two error
    patterns, their sign agreement, and whether it reproduces the error (size within 2x,
    correlation >= 0.5)."""

    kind: ClassVar[str] = "rounding_test"
    subject: str
    observed_rel_l2: float
    elements: int
    trials: tuple[RoundingTrial, ...]
    reproduced_by: str | None = None  # bf16, fp16, tf32, or None
    best_variant: str | None = None
    equally: tuple[str, ...] = ()
    dtype_evidence: str | None = None
    live: bool = True
    computes_in: tuple[str, ...] = ()  # floating dtypes of the candidate module's operands, when recorded
    candidate_operands: tuple[str, ...] = ()  # "operation: dtype" of them
    same_rounding: bool = False  # fp16 and TF32 gave the same errors in every way tried
    named: str | None = None  # the format the why names ("a 10-bit-mantissa format (float16 or TF32)" on a tie)
    criteria: str = "reproduces: size ratio within [0.5, 2] and correlation >= 0.5"
    left_out: tuple[str, ...] = ()  # "format variant: why" of each trial left out as invalid (never read as evidence)


@dataclass(frozen=True, kw_only=True)
class TracedOpRow(Record):
    operation: str
    inputs: tuple[str, ...]  # the floating dtypes of its operands
    output: str
    cast: bool  # a wider floating operand went in
    calls: int
    file: str | None = None  # the line of the user's code that ran it (none: torch's own code)
    line: int | None = None
    function: str | None = None
    code: str | None = None
    in_baseline: bool | None = None  # the baseline's module runs it too, on the same inputs


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class DtypeTrace(Evidence):
    """The candidate module's operations where the error starts, traced at the aten level on the
    baseline's inputs: those that computed in a narrower format than its inputs (``reference``),
    each with the line of the user's code that ran it and whether the baseline's module runs it
    too; ``named``, the first the baseline does not; and the first operation whose output is NaN
    or Inf on finite operands."""

    kind: ClassVar[str] = "dtype_trace"
    module: str
    reference: str | None
    narrowed: tuple[TracedOpRow, ...]
    named: str | None = None  # the first narrowing the baseline does not run, in words
    first_nonfinite: TracedOpRow | None = None
    truncated: str | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class FormatRange(Evidence):
    """Where the candidate first gives NaN or Inf: whether it computes there in float16, and the
    baseline's largest magnitude there against float16's largest finite value."""

    kind: ClassVar[str] = "format_range"
    tap: str
    module: str | None
    baseline_max_abs: float
    float16_max: float
    beyond: int  # baseline elements past it
    elements: int
    float16_seen: tuple[str, ...]  # what shows float16 there (empty: none seen)
    looked_at: str  # where glmfb looked for float16
    traced: bool = False  # the operations of the module that makes it were traced
    values_at: str = "there"  # where the baseline's values were read (the tap, or its run of the operation)
    first_nonfinite: str | None = None  # the candidate's first operation giving NaN or Inf on finite operands


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class RoundingSize(Evidence):
    """The error where it starts and at the final outputs, in units of the unit roundoff of the
    dtype it is computed in (float32: 2^-24); within ``limit_units`` of it, the error is the size
    the same operations in another order give. The elements outside tolerance there, the largest
    value among them, and the absolute tolerance at which every failing tap passes (rtol kept)."""

    kind: ClassVar[str] = "rounding_size"
    subject: str
    dtype: str
    unit_roundoff: float
    rel_l2: float
    units: float
    output_rel_l2: float
    output_units: float
    max_abs: float
    largest: float
    max_units: float
    failing: int
    elements: int
    failing_largest: float
    rtol: float
    atol: float
    limit_units: float
    rounding_size: bool
    passing_atol: float | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Bias(Evidence):
    """How much of the error a per-position scale and shift of the baseline output explains
    (a changed constant: nearly all; rounding: about 2 / row width)."""

    kind: ClassVar[str] = "bias"
    subject: str
    explained: float
    mean_scale: float
    mean_shift: float
    rows: int
    row_width: int
    systematic: bool


@dataclass(frozen=True, kw_only=True)
class DtypeDifference(Record):
    tap: str
    baseline: str
    candidate: str


@dataclass(frozen=True, kw_only=True)
class ShapeDifference(Record):
    tap: str
    baseline: tuple[int, ...]
    candidate: tuple[int, ...]


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class TreeDifferences(Evidence):
    """What the two sides do not share: taps one side only has (not compared), modules that
    ran on one side only, shared taps of another shape (not compared) or dtype (compared in a
    common dtype)."""

    kind: ClassVar[str] = "tree_differences"
    shared_taps: int
    baseline_taps: int
    candidate_taps: int
    baseline_only: tuple[str, ...] = ()
    candidate_only: tuple[str, ...] = ()
    baseline_only_modules: tuple[str, ...] = ()
    candidate_only_modules: tuple[str, ...] = ()
    dtypes: tuple[DtypeDifference, ...] = ()
    shapes: tuple[ShapeDifference, ...] = ()
    order_differs: bool = False


@dataclass(frozen=True, kw_only=True)
class InputDifferenceRow(Record):
    name: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class EntryStepRow(Record):
    module: str
    compared: int
    differing: tuple[InputDifferenceRow, ...] = ()
    note: str | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ErrorEntry(Evidence):
    """No module's own error exceeds tolerance: from the first module that diverged up through
    its parents, the inputs each got differently; the first whose inputs agree makes the
    difference in its own forward."""

    kind: ClassVar[str] = "error_entry"
    request: str
    start: str
    steps: tuple[EntryStepRow, ...]
    module: str | None = None
    root_class: str | None = None
    upstream: str | None = None  # the first tap with any error (within tolerance), where the climb stopped
    upstream_rel_l2: float | None = None


@dataclass(frozen=True, kw_only=True)
class CounterfactualRun(Record):
    value: Any
    rel_l2: float | None = None  # the worst request's output error with this value
    failed: bool | None = None  # the diff still fails with it
    lengths: tuple[int, ...] = ()
    errors: tuple[float, ...] = ()
    tried: bool = True
    note: str | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Counterfactual(Evidence):
    """The candidate rerun with each alternative value of one knob (a target argument or one of
    torch's precision switches): the error each leaves, and the value that closes the gap."""

    kind: ClassVar[str] = "counterfactual"
    knob: str
    candidate_value: Any
    candidate_rel_l2: float
    results: tuple[CounterfactualRun, ...]
    closes: Any = None
    improvement: float | None = None  # candidate_rel_l2 / the closing (or best) value's rel_l2
    note: str | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class MinimizerNote(Evidence):
    """The minimizer could not shrink the failing request (the verdict stands); why, and the
    lengths it tried before it stopped."""

    kind: ClassVar[str] = "minimizer"
    request: str
    note: str
    tried: tuple[Tried, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Tried(Record):
    length: int
    failed: bool


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class MinimalReproducer(Evidence):
    """The shortest prefix of the worst request that still fails, and the command to rerun it."""

    kind: ClassVar[str] = "minimal_reproducer"
    request: str
    length: int
    original_length: int
    file: str
    tried: tuple[Tried, ...]
    command: str


@dataclass(frozen=True, kw_only=True)
class TapTolerance(Record):
    glob: str
    rtol: float | None = None
    atol: float | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class TolerancesUsed(Evidence):
    """The tolerances the comparison used (None: the dtype's default)."""

    kind: ClassVar[str] = "tolerances"
    per_tap: tuple[TapTolerance, ...] = ()
    rtol: float | None = None
    atol: float | None = None


@dataclass(frozen=True, kw_only=True)
class RankSliceRow(Record):
    rank: int
    segment: int
    start: int
    end: int
    rel_l2: float
    max_abs: float
    outside: int
    failed: bool


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class RankErrors(Evidence):
    """A tap captured on torch.distributed ranks, unsharded: each rank's piece's error, in
    sequence order; the first failing piece's rank is the verdict's ``where.rank``."""

    kind: ClassVar[str] = "rank_errors"
    request: str
    tap: str
    world_size: int
    order: str
    slices: tuple[RankSliceRow, ...]
    first_failing_rank: int | None = None

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"rank_errors": [{"request": self.request, "tap": self.tap, **row.to_dict()} for row in self.slices]}


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class SideRun(Evidence):
    """How one side made its taps: in one process (``world_size`` 1), or on torch.distributed
    ranks, with the backend and the layouts its taps were unsharded with (tap glob -> layout).
    A serving side: the batch it was asked with (``--baseline-batch``/``--candidate-batch``: each
    request among ``batch - 1`` companion requests to the same server; 1: alone; None: no batch
    option, ``--concurrency`` requests at once), the companion requests sent (never compared),
    and how many of those ended before the request they accompanied (that request then ran
    part of the time in a smaller batch). A capture recorded inside a running process
    (:mod:`glmfb.diff.live`): its manifest's ``live`` record (pid, command line, versions of
    torch and an engine, tensor bytes written, and why recording stopped, if it did)."""

    kind: ClassVar[str] = "side"
    side: str  # baseline | candidate
    target: str
    world_size: int = 1
    backend: str | None = None
    layouts: Mapping[str, Any] | None = None
    batch: int | None = None
    companions: int = 0
    companions_ended_early: int = 0
    live: Mapping[str, Any] | None = None  # a capture recorded inside a running process: pid, cmdline, versions, stopped


@dataclass(frozen=True, kw_only=True)
class ServingRequestRow(Record):
    request: str
    status: str  # same | tie | diverged | drift
    baseline_tokens: int
    candidate_tokens: int
    compared: int  # positions before the first divergent token
    first_divergent: int | None
    baseline_token: str | None
    candidate_token: str | None
    logprob_diff_max: float
    kl_max: float
    mass_outside_max: float
    top1_agreement: float


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ServingRequests(Evidence):
    """Two serving endpoints, per request: where the greedy outputs first part, and how far the
    top-k distributions drifted before it."""

    kind: ClassVar[str] = "serving_requests"
    show_in_terminal: ClassVar[bool] = True
    rows: tuple[ServingRequestRow, ...]

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(title="requests (serving)", title_justify="left")
        for column in ("request", "status", "parts at", "baseline", "candidate", "max |Δ logprob|", "max KL"):
            table.add_column(column)
        for row in self.rows:
            table.add_row(row.request, row.status, "" if row.first_divergent is None else str(row.first_divergent),
                          "" if row.baseline_token is None else repr(row.baseline_token),
                          "" if row.candidate_token is None else repr(row.candidate_token),
                          f"{row.logprob_diff_max:.3g}", f"{row.kl_max:.3g}")
        return table

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"serving_requests": [row.to_dict() for row in self.rows]}


@dataclass(frozen=True, kw_only=True)
class ServingDriftRow(Record):
    position: int
    token: str
    logprob_diff: float  # candidate minus baseline, the chosen token
    kl_shared: float  # KL of the top-k renormalized on the shared support
    mass_outside: float  # the larger side's probability outside the shared support
    top1_agree: bool


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ServingDrift(Evidence):
    """One request's positions before its first divergent token (the failing one, else the first
    that parts): the chosen token's logprob difference and the KL on the shared top-k."""

    kind: ClassVar[str] = "serving_drift"
    request: str
    positions: int
    rows: tuple[ServingDriftRow, ...]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"serving_drift": [{"request": self.request, **row.to_dict()} for row in self.rows]}


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ServingDivergence(Evidence):
    """Where two servers' greedy outputs first part: each side's token (None: it stopped), its
    logprob, its rank in the other side's top-k, and each side's logprob gap between the two
    tokens; ``tie_flip`` when a gap is within that side's noise, ``tied`` the sides it is within,
    ``preference_moved`` the two gaps' sum: how far the preference between the two tokens moved
    from the baseline to the candidate (nats; a lower bound where a token is outside a top-k)."""

    kind: ClassVar[str] = "serving_divergence"
    request: str
    position: int
    baseline_token: str | None
    candidate_token: str | None
    baseline_logprob: float | None = None
    candidate_logprob: float | None = None
    baseline_token_rank_in_candidate: int | None = None
    candidate_token_rank_in_baseline: int | None = None
    baseline_gap: float | None = None
    candidate_gap: float | None = None
    tie_flip: bool = False
    tied: tuple[str, ...] = ()
    preference_moved: float | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ServingNoise(Evidence):
    """A server's noise: the largest logprob difference between two answers to the same requests
    (``repeated``), and the noise used for the tie-flip rule (at least ``floor``)."""

    kind: ClassVar[str] = "serving_noise"
    side: str
    server: str
    repeated: tuple[str, ...]
    jitter: float
    floor: float
    noise: float
    self_divergent_request: str | None = None  # a repeat whose greedy output parted from the first answer
    self_divergent_position: int | None = None


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ServingThroughput(Evidence):
    """How fast the two servers were asked: calls (both sides, repeats included) per second of
    wall time, and the CPU time glmfb's own process spent (HTTP client, JSON, comparison) as a
    share of the wall time. ``companion_calls``: the companion requests a batch option sent
    beside them (answers discarded), counted apart: never in ``calls`` nor ``tokens``."""

    kind: ClassVar[str] = "serving_throughput"
    requests: int
    calls: int
    tokens: int
    wall_s: float
    requests_per_s: float
    glmfb_cpu_s: float
    glmfb_share: float
    baseline_call_s: float
    candidate_call_s: float
    # Each side's seconds per generated token, call by call in the order made (repeats after
    # the answers): a serving endpoint's own latency, which the history follows per side.
    baseline_token_s: tuple[float, ...] = ()
    candidate_token_s: tuple[float, ...] = ()
    companion_calls: int = 0


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ServedBy(Evidence):
    """What a live side's server serves, as it said (``/models``, ``/version``) and as its
    process on this host shows (pid, command line): the model, a local model folder, the
    weights' format and where that was read (``dtype_source``), the engine's version."""

    kind: ClassVar[str] = "served_by"
    side: str
    server: str
    model: str | None = None
    folder: str | None = None
    dtype: str | None = None
    dtype_source: str | None = None
    engine_version: str | None = None
    pid: int | None = None
    command: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class PromptRow(Record):
    request: str
    prompt: str  # its first 200 characters
    input_ids: tuple[int, ...]  # its first 512 ids
    tokens: int  # how many ids it has


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class Prompts(Evidence):
    """Requests given as text: the tokenizer that made their ids, and the ids used (the first
    50 requests; all of them in the artifact ``requests_tokenized``)."""

    kind: ClassVar[str] = "prompts"
    tokenizer: str
    requests: int
    rows: tuple[PromptRow, ...]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"prompts": [row.to_dict() for row in self.rows]}


EVIDENCE_TYPES: tuple[type[Evidence], ...] = (
    Prompts,
    RankErrors,
    Requests, Modules, LocalErrors, ErrorByPosition, ErrorShape, PositionProfile, PrecisionSignatureEvidence,
    RoundingTest, Bias, TreeDifferences, ErrorEntry, DtypeTrace, FormatRange, Counterfactual, Tokens, MinimalReproducer, MinimizerNote,
    TolerancesUsed, SideRun,
    ServingRequests, ServingDrift, ServingDivergence, ServingNoise, ServingThroughput, ServedBy,
)
