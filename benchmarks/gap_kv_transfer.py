"""Calibration figures of the kv_transfer scenario (bug 2 of docs/background.md), per transfer path.

For each transport (Mooncake when importable, and the plain socket), builds the three variants
in one process (prefill only; + transfer with the GIL-holding dispatch; + transfer with the
releasing dispatch), runs them interleaved for ``--rounds`` rounds after a warm-up, and prints
the median iteration time of each, the ratios against prefill only (the gap glmfb gap checks,
without its statistics), the median phases, and the path's ceiling (one big write alone) and
page rate (the same bytes page by page from Python, alone). All ratios are measured in the
same run; on a shared host read them with its load (printed). The scenario runs with the
arguments the bundled definitions give it (``probes/gap.toml``: one layer), so the figures are
those of what ``glmfb run`` checks.

    python benchmarks/gap_kv_transfer.py [--rounds 15] [--transports mooncake,socket] [--smoke]

``--smoke`` runs every transport and variant for one round on a smaller scenario (512 tokens,
10 ms dispatches): it checks the script runs, its figures are not the benchmark's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SMOKE_NOTE = ("smoke run (--smoke): every transport and variant, 1 round, 512 tokens, 10 ms dispatches; "
              "the figures are measured but are not the benchmark's")
SMOKE_SCENARIO = {"tokens": 512, "dispatch_ms": 10.0}


def run(transport: str, rounds: int, sizes: dict[str, Any]) -> None:
    """The three variants over one transport, interleaved; ``sizes``: scenario arguments (the
    bundled definitions' for the calibration figures; a transport among them gives way to
    ``transport``)."""
    from glmfb.core.targets import Target

    scenario = str(ROOT / "scenarios" / "kv_transfer" / "scenario.py")
    variants = {
        "prefill_only": Target(f"{scenario}:prefill_only").load()(**sizes),
        "holding": Target(f"{scenario}:prefill_transfer_holding").load()(**{**sizes, "transport": transport}),
        "releasing": Target(f"{scenario}:prefill_transfer_releasing").load()(**{**sizes, "transport": transport}),
    }
    try:
        for function in variants.values():
            function()
            function()
        times: dict[str, list[float]] = {name: [] for name in variants}
        phases: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        names = list(variants)
        for index in range(rounds):
            for name in names if index % 2 == 0 else reversed(names):
                started = time.perf_counter()
                phases[name].append(variants[name]())
                times[name].append(time.perf_counter() - started)
        base = statistics.median(times["prefill_only"])
        print(f"\n== transport {transport} ({rounds} interleaved rounds, load {os.getloadavg()[0]:.1f}) ==")
        for name in names:
            median = statistics.median(times[name])
            keys = phases[name][0].keys()
            summary = ", ".join(
                f"{key} {statistics.median(p[key] for p in phases[name]) * (1 if key.endswith('_bytes') else 1e3):.0f}"
                + ("" if key.endswith("_bytes") else " ms")
                for key in keys
            )
            print(f"{name:>13}: median {median * 1e3:6.1f} ms  ratio {median / base:5.3f}  ({summary})")
        sender: Any = variants["releasing"]
        print(f"ceiling (one {sender.total_bytes / 2**20:.0f} MiB write alone): {sender.measure_ceiling() / 1e6:.0f} MB/s; "
              f"page rate ({sender.page_bytes} B pages alone): {sender.measure_page_rate() / 1e6:.1f} MB/s")
    finally:
        for function in variants.values():
            function.close()


def bundled_arguments() -> dict[str, Any]:
    """The scenario arguments of ``probes/gap.toml``'s definitions (both sides, every
    definition: they must agree, or the calibration would measure only some of them)."""
    from glmfb.workflows.suite import load_definitions

    found = {json.dumps(dict(side.args), sort_keys=True)
             for definition in load_definitions([ROOT / "probes" / "gap.toml"])
             for side in (definition.config.baseline, definition.config.candidate)}
    if len(found) != 1:
        raise SystemExit(f"probes/gap.toml's definitions give the scenario different arguments ({sorted(found)}): "
                         "calibrate each with the same ones")
    arguments: dict[str, Any] = json.loads(found.pop())
    return arguments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--transports", default="mooncake,socket")
    parser.add_argument("--smoke", action="store_true", help="one round on a smaller scenario (CI checks the script runs)")
    options = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    sizes = bundled_arguments()
    if options.smoke:
        options.rounds, sizes = 1, {**sizes, **SMOKE_SCENARIO}
        print(SMOKE_NOTE, flush=True)
    print(f"scenario arguments: {sizes or 'the defaults'}", flush=True)
    for transport in options.transports.split(","):
        run(transport.strip(), options.rounds, sizes)


if __name__ == "__main__":
    main()
