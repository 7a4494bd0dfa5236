"""Tensor metrics: one fused, chunked pass per tensor pair; per-position and token metrics.

The fused pass reads both tensors in chunks (a few hundred thousand elements, so that a chunk
stays in cache while every metric is computed from it) into preallocated buffers and keeps
running sums in Python floats (float64). Per chunk: three dot products (for cosine and the
norms), the difference and its square sum, the largest absolute difference and its index,
and, only when some difference exceeds ``atol``, the count outside ``atol + rtol * |b|`` and
the largest relative error. Dot products of finite values are finite, so the NaN / Inf
counts cost nothing unless a norm comes out non-finite, in which case the chunk is redone on
a slow path that counts and masks them.

"Baseline" is ``b`` in ``atol + rtol * |b|`` and in relative errors, as in
``torch.testing.assert_close(candidate, baseline)``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
import os
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from glmfb.diff.evidence import Tokens

if TYPE_CHECKING:
    import numpy as np
    import torch

    from glmfb.diff.axes import Segment
    from glmfb.diff.store import TensorLocation

DEFAULT_CHUNK_ELEMENTS = 1 << 20  # 1 Mi elements: 4 MiB of float32 per side
READ_AHEAD_CHUNKS = 4  # chunks in flight per pair: being computed on, read, or waiting

# Default tolerances by dtype (those of torch.testing.assert_close), as (rtol, atol).
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float16": (1e-3, 1e-5),
}
EXACT = (0.0, 0.0)  # integers and bools compare exactly


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


@dataclass(frozen=True)
class Tolerances:
    """Dtype defaults, a global override, and per-tap-glob overrides (the first match wins)."""

    rtol: float | None = None
    atol: float | None = None
    per_tap: tuple[tuple[str, float | None, float | None], ...] = ()

    def for_tap(self, name: str, dtype: str) -> Tolerance:
        rtol, atol = DEFAULT_TOLERANCES.get(dtype, EXACT)
        if self.rtol is not None:
            rtol = self.rtol
        if self.atol is not None:
            atol = self.atol
        for glob, tap_rtol, tap_atol in self.per_tap:
            if fnmatch.fnmatchcase(name, glob):
                rtol = tap_rtol if tap_rtol is not None else rtol
                atol = tap_atol if tap_atol is not None else atol
                break
        return Tolerance(rtol, atol)

    def describe(self) -> dict[str, Any]:
        return {"rtol": self.rtol, "atol": self.atol,
                "per_tap": [{"glob": g, "rtol": r, "atol": a} for g, r, a in self.per_tap]}


@dataclass(frozen=True)
class TensorMetrics:
    """How far a candidate tensor is from its baseline."""

    numel: int
    max_abs: float
    max_rel: float
    rmse: float
    cosine: float
    rel_l2: float
    outside: int  # elements with |c - b| > atol + rtol * |b| (NaN mismatches included)
    nan_baseline: int
    nan_candidate: int
    inf_baseline: int
    inf_candidate: int
    worst_index: tuple[int, ...]
    worst_baseline: float
    worst_candidate: float
    rtol: float
    atol: float

    @property
    def outside_fraction(self) -> float:
        return self.outside / self.numel if self.numel else 0.0

    @property
    def nonfinite_mismatch(self) -> bool:
        return (self.nan_baseline, self.inf_baseline) != (self.nan_candidate, self.inf_candidate)

    @property
    def failed(self) -> bool:
        return self.outside > 0

    def to_row(self) -> dict[str, Any]:
        return {
            "max_abs": self.max_abs, "max_rel": self.max_rel, "rmse": self.rmse,
            "cosine": self.cosine, "rel_l2": self.rel_l2, "outside_fraction": self.outside_fraction,
            "outside": self.outside, "numel": self.numel,
            "nan": [self.nan_baseline, self.nan_candidate], "inf": [self.inf_baseline, self.inf_candidate],
            "worst_index": list(self.worst_index), "worst_baseline": self.worst_baseline,
            "worst_candidate": self.worst_candidate, "rtol": self.rtol, "atol": self.atol,
        }


def _unravel(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    index: list[int] = []
    for dim in reversed(shape):
        index.append(flat % dim if dim else 0)
        flat = flat // dim if dim else 0
    return tuple(reversed(index))


class _Accumulator:
    """Running sums of one tensor pair, in float64."""

    def __init__(self) -> None:
        self.ab = self.aa = self.bb = self.dd = 0.0
        self.max_abs = -1.0
        self.worst = 0
        self.worst_values = (0.0, 0.0)
        self.max_rel = 0.0
        self.outside = 0
        self.nan_a = self.nan_b = self.inf_a = self.inf_b = 0


class PairComparer:
    """Compares tensor pairs chunk by chunk with buffers allocated once and reused."""

    def __init__(self, chunk_elements: int = DEFAULT_CHUNK_ELEMENTS, read_ahead: int = READ_AHEAD_CHUNKS) -> None:
        import torch

        self.chunk = chunk_elements
        # ``read_ahead`` slots of (baseline, candidate) raw buffers: one being computed on, the
        # others being read or read (so that a stall of the disk or of the reader thread, whose
        # core other processes share, does not stall the computation at once)
        self.slots = max(2, read_ahead)
        self._raw = [torch.empty(chunk_elements * 8, dtype=torch.uint8) for _ in range(2 * self.slots)]
        # one reader thread per side: each reads its file front to back, and the disk has a read
        # of each side in flight (two concurrent streams read faster than one alternating
        # between the files: 1.07-1.12 against 0.82-1.01 GB/s cold on this machine's disk)
        self._readers = tuple(ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"glmfb-diff-read-{side}")
                              for side in ("baseline", "candidate"))
        self._work: dict[torch.dtype, dict[str, torch.Tensor]] = {}
        self._numpy: dict[torch.dtype, tuple[np.ndarray, np.ndarray]] = {}  # views of each "tmp" and "mask"

    def close(self) -> None:
        for reader in self._readers:
            reader.shutdown(wait=True)

    def __enter__(self) -> PairComparer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _buffers(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        import torch

        if dtype not in self._work:
            n = self.chunk
            self._work[dtype] = {
                "a": torch.empty(n, dtype=dtype), "b": torch.empty(n, dtype=dtype),
                "tmp": torch.empty(n, dtype=dtype), "mask": torch.empty(n, dtype=torch.bool),
            }
            work = self._work[dtype]
            self._numpy[dtype] = (work["tmp"].numpy(), work["mask"].numpy())
        return self._work[dtype]

    # ---- entry points -----------------------------------------------------------------------

    def compare_files(self, baseline: TensorLocation, candidate: TensorLocation, tolerance: Tolerance) -> TensorMetrics:
        """Stream two stored tensors (same shape; their dtypes may differ, then both are read
        into the wider compute dtype) through the fused pass.

        Two reader threads, one per side, fill the next pairs of raw buffers (up to
        ``read_ahead - 1`` chunks ahead) while this thread computes on the current pair (file
        reads and torch ops both release the GIL)."""
        import torch

        from glmfb.diff.store import read_exact

        stored_b, stored_c = getattr(torch, baseline.dtype), getattr(torch, candidate.dtype)
        compute = common_compute_dtype(stored_b, stored_c)
        work = self._buffers(compute)
        acc = _Accumulator()
        size_b, size_c = baseline.itemsize, candidate.itemsize
        total = baseline.nbytes // size_b if size_b else 0
        spans = [(start, min(self.chunk, total - start)) for start in range(0, total, self.chunk)]
        reader_b, reader_c = self._readers
        with open(baseline.path, "rb", buffering=0) as file_b, open(candidate.path, "rb", buffering=0) as file_c:
            file_b.seek(baseline.offset)
            file_c.seek(candidate.offset)
            # both files are read front to back: a larger kernel read-ahead window for each
            # (measured on a cold page cache: faster in 5 of 6 paired runs)
            advise_sequential(file_b.fileno(), baseline.offset, baseline.nbytes)
            advise_sequential(file_c.fileno(), candidate.offset, candidate.nbytes)

            def submit(slot: int, count: int) -> tuple[Future[None], Future[None]]:
                # each side's single reader runs its reads in order, so each file is read sequentially
                return (reader_b.submit(read_exact, file_b, self._raw[2 * slot], count * size_b),
                        reader_c.submit(read_exact, file_c, self._raw[2 * slot + 1], count * size_c))

            pending = deque(submit(number % self.slots, count) for number, (_, count) in enumerate(spans[:self.slots - 1]))
            try:
                for number, (start, count) in enumerate(spans):
                    for future in pending.popleft():
                        future.result()
                    slot = number % self.slots
                    ahead = number + self.slots - 1  # into the slot the previous chunk was computed in
                    if ahead < len(spans):
                        pending.append(submit(ahead % self.slots, spans[ahead][1]))
                    raw_b = self._raw[2 * slot][:count * size_b].view(stored_b)
                    raw_c = self._raw[2 * slot + 1][:count * size_c].view(stored_c)
                    b = raw_b if stored_b == compute else work["a"][:count].copy_(raw_b)
                    c = raw_c if stored_c == compute else work["b"][:count].copy_(raw_c)
                    self._chunk(acc, b, c, work, count, start, tolerance)
            finally:  # a failed read or chunk: let the reads in flight end before the files close
                for futures in pending:
                    for future in futures:
                        future.cancel() or future.exception()
        return _finish(acc, total, baseline.shape, tolerance)

    def compare_tensors(self, baseline: torch.Tensor, candidate: torch.Tensor, tolerance: Tolerance) -> TensorMetrics:
        """The same pass over two in-memory tensors (live mode, minimizer); their dtypes may
        differ (both are compared in the wider compute dtype)."""
        if baseline.shape != candidate.shape:
            raise ValueError(f"shapes differ: {tuple(baseline.shape)} vs {tuple(candidate.shape)}")
        compute = common_compute_dtype(baseline.dtype, candidate.dtype)
        work = self._buffers(compute)
        flat_b = baseline.detach().reshape(-1)
        flat_c = candidate.detach().reshape(-1)
        acc = _Accumulator()
        total = flat_b.numel()
        for start in range(0, total, self.chunk):
            count = min(self.chunk, total - start)
            b, c = work["a"][:count], work["b"][:count]
            b.copy_(flat_b[start:start + count])
            c.copy_(flat_c[start:start + count])
            self._chunk(acc, b, c, work, count, start, tolerance)
        return _finish(acc, total, tuple(baseline.shape), tolerance)

    # ---- the fused pass over one chunk ------------------------------------------------------

    def _chunk(self, acc: _Accumulator, b: torch.Tensor, c: torch.Tensor, work: Mapping[str, torch.Tensor],
               count: int, start: int, tolerance: Tolerance) -> None:
        import numpy as np
        import torch

        bc = float(torch.dot(b, c))
        bb = float(torch.dot(b, b))
        cc = float(torch.dot(c, c))
        if not (math.isfinite(bb) and math.isfinite(cc)):
            self._chunk_nonfinite(acc, b, c, work, count, start, tolerance)
            return
        acc.ab += bc
        acc.aa += bb
        acc.bb += cc
        # b and c are scratch buffers (raw read slots or converted copies): work in place.
        d = c.sub_(b)
        acc.dd += float(torch.dot(d, d))
        # amin and amax, not aminmax or max: torch's full reductions to one value ran slower
        low, high = float(torch.amin(d)), float(torch.amax(d))
        largest = max(-low, high) + 0.0  # + 0.0: no error reads 0.0, never -0.0
        if largest > acc.max_abs:
            index = int(torch.argmin(d)) if -low > high else int(torch.argmax(d))  # when the maximum moves
            acc.max_abs, acc.worst = largest, start + index
            acc.worst_values = (float(b[index]), float(b[index] + d[index]))
        if largest == 0.0:
            return
        d.abs_()
        absb = b.abs_()
        tmp = work["tmp"][:count]
        if largest > tolerance.atol:
            torch.add(d, absb, alpha=-tolerance.rtol, out=tmp)  # |c - b| - rtol |b|
            # counted by numpy on views of the same buffers (torch's gt into a bool tensor and
            # its count_nonzero took longer than the rest of the chunk); atol is cast to the
            # compute dtype, as torch.gt casts it, so the count is the same
            tmp_np, mask_np = (array[:count] for array in self._numpy[b.dtype])
            acc.outside += int(np.count_nonzero(np.greater(tmp_np, tmp_np.dtype.type(tolerance.atol), out=mask_np)))
        absb.clamp_min_(torch.finfo(b.dtype).tiny)
        torch.div(d, absb, out=tmp)
        acc.max_rel = max(acc.max_rel, float(torch.amax(tmp)))

    def _chunk_nonfinite(self, acc: _Accumulator, b: torch.Tensor, c: torch.Tensor,
                         work: Mapping[str, torch.Tensor], count: int, start: int, tolerance: Tolerance) -> None:
        import torch

        acc.nan_a += int(torch.isnan(b).sum())
        acc.nan_b += int(torch.isnan(c).sum())
        acc.inf_a += int(torch.isinf(b).sum())
        acc.inf_b += int(torch.isinf(c).sum())
        finite = torch.isfinite(b) & torch.isfinite(c)
        bf = torch.where(finite, b, 0).to(torch.float64)
        cf = torch.where(finite, c, 0).to(torch.float64)
        acc.ab += float(torch.dot(bf, cf))
        acc.aa += float(torch.dot(bf, bf))
        acc.bb += float(torch.dot(cf, cf))
        d = (cf - bf).abs()
        acc.dd += float(torch.dot(d, d))
        mismatch_nonfinite = ~finite & (b != c)  # equal infinities match; NaN never does
        outside = (d > tolerance.atol + tolerance.rtol * bf.abs()) | mismatch_nonfinite
        acc.outside += int(outside.sum())
        score = torch.where(mismatch_nonfinite, math.inf, d)
        index = int(torch.argmax(score))
        largest = float(score[index])
        if largest > acc.max_abs:
            acc.max_abs, acc.worst = largest, start + index
            acc.worst_values = (float(b[index]), float(c[index]))
        rel = score / (bf.abs() + torch.finfo(torch.float64).tiny)
        acc.max_rel = max(acc.max_rel, float(rel.max()))


def advise_sequential(descriptor: int, offset: int, length: int) -> None:
    """Tell the kernel a file range will be read sequentially (where it can be told)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        with contextlib.suppress(OSError):  # a file system that does not take it reads as it did
            advise(descriptor, offset, length, os.POSIX_FADV_SEQUENTIAL)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    import torch

    if dtype == torch.float64 or not (dtype.is_floating_point or dtype.is_complex):
        return torch.float64
    return torch.float32


def common_compute_dtype(first: torch.dtype, second: torch.dtype) -> torch.dtype:
    """The dtype two tensors are compared in: float32, or float64 when either needs it
    (float64 itself, integers, bools)."""
    import torch

    one, two = _compute_dtype(first), _compute_dtype(second)
    return torch.float64 if torch.float64 in (one, two) else torch.float32


def _finish(acc: _Accumulator, numel: int, shape: Sequence[int], tolerance: Tolerance) -> TensorMetrics:
    if acc.aa > 0 and acc.bb > 0:
        cosine = acc.ab / math.sqrt(acc.aa * acc.bb)
    else:
        cosine = 1.0 if acc.aa == acc.bb else 0.0
    rel_l2 = math.sqrt(acc.dd / acc.aa) if acc.aa > 0 else 0.0 if acc.dd == 0 else math.inf
    return TensorMetrics(
        numel=numel,
        max_abs=max(acc.max_abs, 0.0) + 0.0,
        max_rel=acc.max_rel,
        rmse=math.sqrt(acc.dd / numel) if numel else 0.0,
        cosine=cosine,
        rel_l2=rel_l2,
        outside=acc.outside,
        nan_baseline=acc.nan_a, nan_candidate=acc.nan_b, inf_baseline=acc.inf_a, inf_candidate=acc.inf_b,
        worst_index=_unravel(acc.worst, shape) if numel else (),
        worst_baseline=acc.worst_values[0], worst_candidate=acc.worst_values[1],
        rtol=tolerance.rtol, atol=tolerance.atol,
    )


# --------------------------------------------------------------------------------------------
# Error by position
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PositionErrors:
    """Per token position: relative L2 error, largest absolute error, elements outside. The
    positions are those along ``dim`` (the token axis: :mod:`glmfb.diff.axes`); for a packed
    request, those of one of its sequences (``segment``), counted from its start."""

    dim: int
    rel_l2: np.ndarray
    max_abs: np.ndarray
    outside: np.ndarray
    width: int = 1  # elements per position
    segment: Segment | None = None  # the packed sequence these positions are of (None: the whole axis)

    @property
    def first_failing(self) -> int | None:
        import numpy as np

        failing = np.flatnonzero(self.outside > 0)
        return int(failing[0]) if failing.size else None

    def in_sequence(self, offsets: Sequence[int] | None) -> PositionErrors:
        """For a packed request (``offsets``, its ``cu_seqlens``, splitting these positions), the
        positions of the sequence that holds the first failing one (else the longest), counted
        from its start; otherwise these positions."""
        import numpy as np

        from glmfb.diff.axes import segment_of

        if offsets is None or offsets[-1] != len(self.rel_l2):
            return self
        segment = segment_of(offsets, [int(p) for p in np.flatnonzero(self.outside > 0)[:1]])
        part = slice(segment.start, segment.end)
        return PositionErrors(self.dim, self.rel_l2[part], self.max_abs[part], self.outside[part], self.width, segment)


def position_errors(baseline: torch.Tensor, candidate: torch.Tensor, dim: int, tolerance: Tolerance,
                    block_elements: int = 1 << 22) -> PositionErrors:
    """Errors per position along ``dim``, in float64, a block of positions at a time."""
    import numpy as np
    import torch

    b_rows = baseline.detach().movedim(dim, 0).reshape(baseline.shape[dim], -1)
    c_rows = candidate.detach().movedim(dim, 0).reshape(candidate.shape[dim], -1)
    positions, width = b_rows.shape
    step = max(1, block_elements // max(width, 1))
    rel = np.zeros(positions)
    max_abs = np.zeros(positions)
    outside = np.zeros(positions, dtype=np.int64)
    for start in range(0, positions, step):
        b = b_rows[start:start + step].to(torch.float64)
        c = c_rows[start:start + step].to(torch.float64)
        d = (c - b).abs()
        finite = torch.isfinite(d)
        d_finite = torch.where(finite, d, 0.0)
        norm_b = b.norm(dim=1)
        norm_d = d_finite.norm(dim=1)
        block_rel = torch.where(norm_b > 0, norm_d / norm_b.clamp_min(1e-300), torch.where(norm_d > 0, math.inf, 0.0))
        block_rel = torch.where(finite.all(dim=1), block_rel, math.inf)
        end = start + b.shape[0]
        rel[start:end] = block_rel.numpy()
        max_abs[start:end] = torch.where(finite, d, math.inf).amax(dim=1).numpy() if width else 0.0
        bad = (d > tolerance.atol + tolerance.rtol * b.abs()) | (~finite & (b != c))
        outside[start:end] = bad.sum(dim=1).numpy()
    return PositionErrors(dim, rel, max_abs, outside, max(width, 1))


def typical_relative_error(baseline: torch.Tensor, candidate: torch.Tensor, dim: int | None,
                           max_elements: int = 1 << 20) -> float | None:
    """The median element-wise relative error where the error has had the least chance to
    accumulate (the first positions, at most 8, along ``dim``; the first elements without one),
    over elements whose magnitude is at least their row's RMS, so that values near zero
    (where cancellation inflates relative error) do not dominate. None when nothing differs."""
    import torch

    if dim is not None:
        positions = baseline.shape[dim]
        count = max(1, min(8, positions // 8))
        b = baseline.detach().narrow(dim, 0, count).movedim(dim, 0).reshape(count, -1).to(torch.float64)
        c = candidate.detach().narrow(dim, 0, count).movedim(dim, 0).reshape(count, -1).to(torch.float64)
    else:
        b = baseline.detach().reshape(1, -1)[:, :max_elements].to(torch.float64)
        c = candidate.detach().reshape(1, -1)[:, :max_elements].to(torch.float64)
    rms = b.pow(2).mean(dim=1, keepdim=True).sqrt()
    keep = (b.abs() >= rms) & (b != 0) & torch.isfinite(b) & torch.isfinite(c)
    relative = ((c - b).abs() / b.abs())[keep]
    if relative.numel() == 0 or float(relative.max()) == 0.0:
        return None
    return float(relative.median())


# --------------------------------------------------------------------------------------------
# Token level (logits)
# --------------------------------------------------------------------------------------------


def token_metrics(baseline: torch.Tensor, candidate: torch.Tensor, dim: int, topk: int = 5,
                  block_positions: int = 256, *, request: str = "", tap: str = "") -> Tokens:
    """Token-level comparison of logits whose positions lie along ``dim`` and vocabulary last,
    as the evidence that carries it (``request`` and ``tap``: whose logits they are)."""
    import torch

    b_rows = baseline.detach().movedim(dim, 0).reshape(baseline.shape[dim], -1)
    c_rows = candidate.detach().movedim(dim, 0).reshape(candidate.shape[dim], -1)
    positions, vocab = b_rows.shape
    k = max(1, min(topk, vocab))
    first_diff: int | None = None
    agree = 0
    overlaps: list[float] = []
    kl_all: list[torch.Tensor] = []
    best_change, best_pos, best_tok = -1.0, 0, 0
    for start in range(0, positions, block_positions):
        lb = torch.log_softmax(b_rows[start:start + block_positions].to(torch.float64), dim=-1)
        lc = torch.log_softmax(c_rows[start:start + block_positions].to(torch.float64), dim=-1)
        arg_b, arg_c = lb.argmax(dim=-1), lc.argmax(dim=-1)
        same = arg_b == arg_c
        agree += int(same.sum())
        if first_diff is None and not bool(same.all()):
            first_diff = start + int((~same).nonzero()[0, 0])
        top_b = lb.topk(k, dim=-1).indices
        top_c = lc.topk(k, dim=-1).indices
        common = (top_b.unsqueeze(-1) == top_c.unsqueeze(-2)).any(dim=-1).sum(dim=-1)
        overlaps.extend((common.to(torch.float64) / k).tolist())
        kl = (lb.exp() * (lb - lc)).sum(dim=-1).clamp_min(0.0)
        kl_all.append(kl)
        change = (lb - lc).abs()
        flat = int(torch.argmax(torch.nan_to_num(change, nan=math.inf)))
        value = float(change.reshape(-1)[flat])
        if value > best_change or math.isnan(value):
            best_change, best_pos, best_tok = value, start + flat // vocab, flat % vocab
    kl_cat = torch.cat(kl_all) if kl_all else torch.zeros(1, dtype=torch.float64)
    return Tokens(
        request=request, tap=tap, positions=positions,
        first_argmax_diff=first_diff,
        argmax_agreement=agree / positions if positions else 1.0,
        topk=k,
        topk_overlap_mean=sum(overlaps) / len(overlaps) if overlaps else 1.0,
        topk_overlap_min=min(overlaps) if overlaps else 1.0,
        kl_max=float(kl_cat.max()),
        kl_mean=float(kl_cat.mean()),
        kl_max_position=int(kl_cat.argmax()),
        logprob_change_max=max(best_change, 0.0),
        logprob_change_position=best_pos,
        logprob_change_token=best_tok,
    )


def is_logits(name: str, shape: Sequence[int], length: int | None) -> bool:
    """Final outputs that hold next-token logits: named so, or shaped [.., L, V] for tokens."""
    if "logits" in name.lower():
        return len(shape) >= 2
    return (name == "output" and length is not None and len(shape) >= 2
            and shape[-2] == length and shape[-1] > 1)
