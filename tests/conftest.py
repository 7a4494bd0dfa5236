from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

TOY = Path(__file__).parent / "toy"


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy probe of tests/toy, installed through the glmfb.probes entry point (its folder
    holds a dist-info); yields that folder, for subprocesses' PYTHONPATH."""
    from glmfb.core.probe import reset_registry

    monkeypatch.syspath_prepend(str(TOY))
    reset_registry()
    yield TOY
    monkeypatch.undo()
    reset_registry()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked gpu when no CUDA device is present (torch imported only if needed)."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _process_floor_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own glmfb cache holding a between-process floor (2% sd, as
    measured on the development host), so no saved comparison in a test starts the fresh
    worker processes that measuring the floor takes. Tests of the floor itself override it."""
    from glmfb.core.measure.floor import ProcessFloor, machine_key, save_floor

    monkeypatch.setenv("GLMFB_CACHE_DIR", str(tmp_path_factory.mktemp("glmfb-cache")))
    save_floor(ProcessFloor(0.02, 14.0, 8, 1.0, "2026-12-01T00:00:00+00:00", 0.5, "test floor",
                            machine_key(), {"softmax": [1e-4] * 8}))
