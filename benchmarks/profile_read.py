"""What bench's operator diff costs to read its profile: the profiler's own records against
torch's ``FunctionEvent`` tree, both sides of one run, alternating.

    python benchmarks/profile_read.py [--rounds 5] [--shape 8x4096]
    python benchmarks/profile_read.py --smoke   # 2 rounds on 8x512: the path, not the figure

Each round profiles the bundled decode-norm pair (``scenarios/decode_norm``: the fused kernel
and the tiled one, which runs about 68 operators a call) as ``glmfb bench`` does
(``glmfb.bench.opdiff.profile_pair``: 5 alternating rounds a side, 100 kernel calls in all)
and reads each profile one way, then the other way; it prints each way's wall time per round and
their medians. Two profiles differ by chance (an operator torch runs only now and then), so
whether both ways read the same is checked on one profile read both ways.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def same_both_ways(opdiff: Any, kernel: Any) -> str:
    """One profile of ``kernel`` (20 calls) read both ways: the same operator calls (names,
    inputs, parents) and own times?"""
    from collections import Counter

    with opdiff.profiler_session("cpu") as prof:
        for _ in range(20):
            kernel()
    readings = (opdiff._cpu_events(prof.kineto_results), opdiff._function_events(prof, "cpu"))
    keys = [Counter((e.name, repr(e.shapes), repr(e.strides), repr(e.concrete), e.parent) for e in events)
            for events in readings]
    own = [sum(e.self_us for e in events) for events in readings]
    return (f"{len(readings[0])} and {len(readings[1])} operator calls, the same: {keys[0] == keys[1]}; "
            f"own time {own[0]:.1f} and {own[1]:.1f} µs in all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shape", default="8x4096")
    parser.add_argument("--smoke", action="store_true", help="2 rounds on 8x512")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.shape = 2, "8x512"
    from glmfb.bench import opdiff
    from scenarios.decode_norm.kernels import gated_norm_fused, gated_norm_tiled

    shape = tuple(int(n) for n in args.shape.split("x"))
    fused, tiled = gated_norm_fused(shape), gated_norm_tiled(shape)
    for _ in range(20):
        fused(), tiled()
    profile_once = opdiff._profile_once
    times: dict[str, list[float]] = {"records": [], "function_events": []}
    try:
        for _ in range(args.rounds):
            for read in times:
                opdiff._profile_once = functools.partial(profile_once, read=read)  # type: ignore[assignment]
                began = time.perf_counter()
                opdiff.profile_pair([fused], [tiled], 100, "cpu")
                times[read].append(time.perf_counter() - began)
    finally:
        opdiff._profile_once = profile_once
    same = same_both_ways(opdiff, tiled)
    print(f"{'smoke run: ' if args.smoke else ''}profile_pair(fused, tiled) on {args.shape}, 100 kernel calls "
          f"in 5 rounds a side, {args.rounds} rounds of each reading, alternating")
    for read, values in times.items():
        print(f"  {read:>15}: median {statistics.median(values):.2f} s ({' '.join(f'{v:.2f}' for v in values)})")
    print(f"  one profile of the tiled kernel read both ways: {same}")


if __name__ == "__main__":
    main()
