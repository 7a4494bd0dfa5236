"""flash-linear-attention's plain-PyTorch references (``fla-core``) as diff targets.

Importing anything under ``fla.ops`` imports triton (not installed here, and not needed for
the references), so the reference files are loaded by path from the installed package, without
running the package's ``__init__``. The code under test is fla's
(``fla/ops/simple_gla/naive.py``); this file turns a request's named tensors into the
reference's inputs the way fla's GLA layer does (log-sigmoid gates divided by
``gate_logit_normalizer``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F


@cache
def reference(op: str) -> ModuleType:
    """``fla/ops/<op>/naive.py`` of the installed fla-core, loaded on its own."""
    spec = importlib.machinery.PathFinder.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("fla-core is not installed (pip install fla-core)")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / op / "naive.py"
    loaded = importlib.util.spec_from_file_location(f"fla_naive_{op}", path)
    if loaded is None or loaded.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


class SimpleGLA:
    """``g(request) -> o``: simple gated linear attention over the request's ``q``, ``k``, ``v``
    ``[1, T, H, D]`` and gate logits ``gate`` ``[1, T, H]``, by fla's recurrent or chunked
    reference."""

    def __init__(self, form: str = "recurrent", gate_logit_normalizer: float = 16.0,
                 chunk_size: int = 64) -> None:
        naive = reference("simple_gla")
        forms: dict[str, Callable[..., Any]] = {
            "recurrent": naive.naive_recurrent_simple_gla,
            "chunk": lambda q, k, v, g: naive.naive_chunk_simple_gla(q, k, v, g, chunk_size=chunk_size),
        }
        if form not in forms:
            raise ValueError(f"form {form!r}: use one of {', '.join(forms)}")
        self.run = forms[form]
        self.normalizer = float(gate_logit_normalizer)

    def __call__(self, request: dict[str, Any]) -> torch.Tensor:
        q, k, v = request["q"], F.normalize(request["k"], dim=-1), request["v"]
        g = F.logsigmoid(request["gate"] + 4.0) / self.normalizer  # weak decay: long memory
        with torch.no_grad():
            o, _ = self.run(q, k, v, g)
        out: torch.Tensor = o
        return out


def simple_gla(form: str = "recurrent", gate_logit_normalizer: float = 16.0) -> SimpleGLA:
    """Factory of :class:`SimpleGLA` (a callable diff target)."""
    return SimpleGLA(form, gate_logit_normalizer)
