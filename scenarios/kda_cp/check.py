"""Context-parallel KDA against one device, on real ranks: run under torchrun.

    python -m torch.distributed.run --standalone --nproc-per-node 4 scenarios/kda_cp/check.py \\
        --lengths 512,8192 --precisions ieee,tf32,tf32x3 --layout zigzag --out result.json

Every rank runs the CP model once per (length, precision) on the same token ids a request
``{"length": N, "seed": S}`` draws; rank 0 puts the outputs and merge states back in sequence
order and compares them with the single-device model in float32 and float64 (relative L2
error, ``||cp - ref|| / ||ref||``; states from the second segment on, the first is zero on
both sides). Rank 0 writes one JSON document. Used by benchmarks/kda_cp_errors.py and the
tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

SCENARIOS = str(Path(__file__).resolve().parents[1])
if SCENARIOS not in sys.path:  # run as a script by torchrun: import the package as glmfb does
    sys.path.insert(0, SCENARIOS)

import torch  # noqa: E402

from kda_cp import kda  # noqa: E402
from kda_cp import model as kda_model  # noqa: E402


def token_ids(length: int, seed: int, vocab: int) -> torch.Tensor:
    """The ids a glmfb request ``{"length": length, "seed": seed, "vocab": vocab}`` draws."""
    from glmfb.diff.requests import draw_ids

    return torch.tensor([draw_ids(length, seed, vocab)], dtype=torch.long)


def reassemble(parts: list[tuple[torch.Tensor, torch.Tensor]], layout: str, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank outputs ``[B, local T, D]`` and merge states ``[own, ...]`` in sequence order."""
    world_size = len(parts)
    segments = world_size if layout == "contiguous" else 2 * world_size
    bounds = kda.segment_bounds(length, segments)
    outputs: dict[int, torch.Tensor] = {}
    states: dict[int, torch.Tensor] = {}
    for rank, (output, state) in enumerate(parts):
        offset = 0
        for position, segment in enumerate(kda_model.own_segments(layout, rank, world_size)):
            size = bounds[segment][1] - bounds[segment][0]
            outputs[segment] = output[:, offset:offset + size]
            states[segment] = state[position]
            offset += size
    return (torch.cat([outputs[j] for j in range(segments)], dim=1),
            torch.stack([states[j] for j in range(segments)]))


def relative_error(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    difference = (candidate.double() - reference.double()).norm()
    return float(difference / reference.double().norm())


def max_abs_error(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    return float((candidate.double() - reference.double()).abs().max())


class _Catch:
    def __init__(self, module: torch.nn.Module) -> None:
        self.value: torch.Tensor | None = None
        module.register_forward_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        self.value = output.detach()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192")
    parser.add_argument("--precisions", default="ieee,tf32,tf32x3")
    parser.add_argument("--layout", default="contiguous", choices=kda_model.LAYOUTS)
    parser.add_argument("--seed", type=int, default=0, help="token ids' seed (the request's)")
    parser.add_argument("--model-seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    options = parser.parse_args(argv)
    lengths = [int(x) for x in options.lengths.split(",")]
    precisions = options.precisions.split(",")

    import torch.distributed as dist

    models = {p: kda_model.cp(p, options.layout, seed=options.model_seed) for p in precisions}
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = next(iter(models.values())).embed.weight.device
    catches = {p: _Catch(m.attention.merge) for p, m in models.items()}
    references: dict[str, kda_model.SingleDeviceKDA] = {}
    if rank == 0:
        for dtype in ("float32", "float64"):
            references[dtype] = kda_model.single(world_size, options.layout, seed=options.model_seed,
                                                 dtype=dtype, device=str(device))
    reference_catches = {d: _Catch(m.attention.merge) for d, m in references.items()}
    rows: list[dict[str, Any]] = []
    for length in lengths:
        ids = token_ids(length, options.seed, models[precisions[0]].embed.num_embeddings)
        reference_values: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        reference_s: dict[str, float] = {}
        if rank == 0:
            for dtype, reference in references.items():
                started = time.perf_counter()
                with torch.no_grad():
                    output = reference(ids).cpu()
                reference_s[dtype] = time.perf_counter() - started
                state = reference_catches[dtype].value
                assert state is not None
                reference_values[dtype] = (output, state.cpu())
        for precision in precisions:
            dist.barrier()
            started = time.perf_counter()
            with torch.no_grad():
                output = models[precision](ids)
            if device.type == "cuda":
                torch.cuda.synchronize()
            elapsed_s = time.perf_counter() - started
            state = catches[precision].value
            assert state is not None
            gathered: list[Any] = [None] * world_size if rank == 0 else []
            dist.gather_object((output.cpu(), state.cpu(), elapsed_s), gathered if rank == 0 else None, dst=0)
            if rank != 0:
                continue
            full, states = reassemble([(o, s) for o, s, _ in gathered], options.layout, length)
            row: dict[str, Any] = {"length": length, "precision": precision, "world_size": world_size,
                                   "layout": options.layout, "cp_forward_s": max(t for _, _, t in gathered),
                                   "single_forward_s": reference_s}
            for dtype, (reference_output, reference_states) in reference_values.items():
                row[f"output_vs_{dtype}"] = relative_error(full, reference_output)
                row[f"state_vs_{dtype}"] = relative_error(states[1:], reference_states[1:])
                row[f"output_max_abs_vs_{dtype}"] = max_abs_error(full, reference_output)
                row[f"state_max_abs_vs_{dtype}"] = max_abs_error(states, reference_states)
            rows.append(row)
    if rank == 0:
        path = Path(options.out)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(json.dumps({"device": str(device), "backend": dist.get_backend(),
                                         "threads": torch.get_num_threads(), "rows": rows}, indent=1))
        os.replace(temporary, path)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
