"""One fresh process's measurement of a target alone, for ``glmfb bench`` with ``processes``.

``python -m glmfb.bench.worker`` reads its job (JSON) on stdin: the target (reference, keyword
arguments, the definition's folder), the shape, and how to sample; it measures the target alone
as :func:`glmfb.bench.allocations.measure_single` does, on the CPU, and prints one JSON line: the
per-call seconds of its samples in the order taken, the calls per sample, the footprint of its
first allocation's input sets (``[total bytes, largest set's bytes, source]``, or null) and, with
``reference`` in the job, the reference's seconds per call of the sample taken right after each
of the kernel's (:mod:`glmfb.bench.reference`); or ``{"error": ...}`` (exit 1) when the target could
not be loaded or raised.

A process's memory layout (where the interpreter, the heap and the buffers land) moves a
kernel's time by more than its samples scatter inside the process: on the 2-core development
VM, one pure-Python kernel read a median of 114 µs in some fresh processes and 135 µs in
others, each within 1% of itself. So a run that follows a kernel's own time across commits
spreads its budget over several fresh processes (as pyperf does), and its interval is their
spread, not one process's.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> None:
    job = json.loads(sys.stdin.read())
    sys.path[:] = [p for p in job["sys_path"] if p]
    from pathlib import Path

    import torch

    from glmfb.bench.allocations import measure_single
    from glmfb.bench.footprint import input_footprint
    from glmfb.bench.reference import Reference
    from glmfb.bench.timers import CpuTimer
    from glmfb.contract.errors import GlmfbError, TargetFailed
    from glmfb.core.targets import Target

    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    target = Target(job["target"], job.get("args") or {}, Path(job["base_dir"]) if job.get("base_dir") else None)
    answer: dict[str, Any]
    try:
        reference = Reference(float(job["sample_s"])) if job.get("reference") else None
        single = measure_single(CpuTimer(), target, tuple(job["shape"]), input_sets=int(job["input_sets"]),
                                sample_s=float(job["sample_s"]), budget_s=float(job["budget_s"]), reference=reference)
        footprint = input_footprint(single.side.kernels, single.bytes_per_allocation)
        answer = {"values": single.values, "calls_per_sample": single.calls_per_sample,
                  "footprint": [footprint.total_bytes, footprint.set_bytes, footprint.source] if footprint else None,
                  "reference": single.reference}
    except TargetFailed as exc:
        answer = {"error": str(exc)}
    except GlmfbError as exc:
        answer = {"error": str(exc)}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
    raise SystemExit(1 if "error" in answer else 0)


if __name__ == "__main__":
    main()
