"""A tiny Hugging Face Llama built from a config (random weights, no download), and the same
model with one inner module's output rounded to bfloat16: a patch that lowered precision.

    baseline:  scenarios/numerics/llama.py:clean
    candidate: scenarios/numerics/llama.py:bf16_output   --candidate-arg module=model.layers.1.mlp.down_proj

``glmfb diff`` in live mode must name the patched module, not the layers after it; the clean
model against itself must pass with zero error.

``init_std`` is the standard deviation the weights are drawn with (Hugging Face's
``initializer_range``, 0.02 by default). At 0.02 the tiny model's next-token distribution is
near uniform (top logprob about -5.7 over 512 tokens), so what the patch changes in a logprob
(about 1e-4 nats) is far below what a serving diff resolves; at 1.0 the distribution is peaked
(top logprobs -0.05 to -0.8) and the patch moves logprobs by 0.005 to 0.06 nats, enough to flip
the greedy choice where two tokens are close (scenarios/serving, probes/serving.toml).
"""

from __future__ import annotations

import torch
from torch import nn

DEFAULT_PATCHED = "model.layers.1.mlp.down_proj"


def clean(seed: int = 0, layers: int = 4, vocab: int = 512, init_std: float = 0.02) -> nn.Module:
    """The reference model: a 4-layer Llama (hidden 64) with weights drawn from ``seed`` at
    standard deviation ``init_std``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, use_cache=False, initializer_range=init_std,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


class BF16OutputLinear(nn.Linear):
    """A linear layer whose output is rounded to bfloat16 and back (the planted patch)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out.to(torch.bfloat16).to(out.dtype)


def bf16_output(seed: int = 0, layers: int = 4, vocab: int = 512, module: str = DEFAULT_PATCHED,
                init_std: float = 0.02) -> nn.Module:
    """The same model (same weights) with ``module``'s output rounded to bfloat16."""
    model = clean(seed=seed, layers=layers, vocab=vocab, init_std=init_std)
    original = model.get_submodule(module)
    if not isinstance(original, nn.Linear):
        raise TypeError(f"{module} is a {type(original).__name__}, not a Linear")
    patched = BF16OutputLinear(original.in_features, original.out_features, bias=original.bias is not None)
    patched.load_state_dict(original.state_dict())
    parent_name, _, child = module.rpartition(".")
    setattr(model.get_submodule(parent_name), child, patched)
    return model.eval()
