from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

TOY = Path(__file__).parent / "toy"


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy probe of tests/toy, installed through the glmfb.probes entry point (its folder
    holds a dist-info); yields that folder, for subprocesses' PYTHONPATH."""
    from glmfb.probe import reset_registry

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
