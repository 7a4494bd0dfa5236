"""The between-process floor: pooling, the cache (per machine), and a real measurement."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from glmfb.core.measure.floor import (
    ProcessFloor,
    floor_path,
    load_floor,
    machine_key,
    measure_floor,
    pooled_floor,
    save_floor,
)


def test_pooled_floor() -> None:
    sd, df = pooled_floor({"a": [1.0, math.e], "b": [2.0, 2.0, 2.0]})
    assert df == 3.0
    assert sd == pytest.approx(math.sqrt(0.5 / 3))
    with pytest.raises(ValueError):
        pooled_floor({"a": [1.0]})


def test_cache_round_trip_and_another_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLMFB_CACHE_DIR", str(tmp_path))
    assert load_floor() is None
    floor = ProcessFloor(0.03, 7.0, 8, 1.0, "2026-12-01T00:00:00+00:00", 1.2, "ref", machine_key(),
                         {"softmax": [1e-4] * 8})
    assert save_floor(floor) == tmp_path / "process-floor.json"
    assert load_floor() == floor
    evidence = floor.evidence("cache")
    assert evidence["kind"] == "process_floor" and evidence["sd"] == 0.03 and evidence["processes"] == 8
    data = json.loads(floor_path().read_text())
    data["machine"]["cpu"] = "another cpu"
    floor_path().write_text(json.dumps(data))
    assert load_floor() is None  # a floor measured elsewhere does not apply here
    floor_path().write_text("{broken")
    assert load_floor() is None


@pytest.mark.slow
def test_measure_floor_in_fresh_processes() -> None:
    floor = measure_floor(processes=2, seconds=0.2)
    assert floor.processes == 2 and floor.df == 2.0  # two kernels, one df each
    assert set(floor.medians_s) == {"softmax", "rmsnorm"}
    assert all(len(v) == 2 and all(x > 0 for x in v) for v in floor.medians_s.values())
    assert 0.0 <= floor.sd < 1.0
