"""The evidence kinds of ``glmfb diff``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from glmfb.evidence import Evidence, Record, evidence_kind


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
    """Relative error per position of one tap (binned for long sequences)."""

    kind: ClassVar[str] = "error_by_position"
    request: str
    local: bool
    failing_positions: int
    positions: tuple[int, ...]
    rel_l2: tuple[float, ...]
    tap: str | None = None
    first_failing_position: int | None = None

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


@evidence_kind
@dataclass(frozen=True, kw_only=True)
class ErrorShape(Evidence):
    """How the error behaves: none, constant, growing (with its fit), a spike, non-finite."""

    kind: ClassVar[str] = "error_shape"
    shape: str
    measure: str
    fit: Fit | None = None


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
    consistent: bool
    unit_roundoff: dict[str, float]


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


EVIDENCE_TYPES: tuple[type[Evidence], ...] = (
    RankErrors,
    Requests, Modules, LocalErrors, ErrorByPosition, ErrorShape, PrecisionSignatureEvidence, Tokens,
    MinimalReproducer, TolerancesUsed,
)
