"""A Hugging Face model folder as a diff target: ``glmfb.diff.hf:causal_lm`` with the args
``path`` (the folder a server serves: vLLM's ``--model DIR``) and ``dtype`` (the format the
server ran it in), loaded in-process with transformers, so the module-level diff can name the
module where two servers' outputs start to part.

    glmfb diff glmfb.diff.hf:causal_lm glmfb.diff.hf:causal_lm \\
        --baseline-arg path=DIR --baseline-arg dtype=float32 \\
        --candidate-arg path=DIR --candidate-arg dtype=bfloat16 --requests REQUESTS

transformers is imported when the factory runs, never before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")
FACTORY = "glmfb.diff.hf:causal_lm"


def is_model_folder(path: str | Path) -> bool:
    """A local folder transformers can load a model from (it holds ``config.json``)."""
    return Path(path, "config.json").is_file()


def causal_lm(path: str, dtype: str = "float32") -> Any:
    """The folder's causal language model in ``dtype``, in eval mode on the CPU."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if not is_model_folder(path):
        raise FileNotFoundError(f"{path} holds no config.json: not a Hugging Face model folder")
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    return model.eval()
