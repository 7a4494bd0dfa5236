"""Hugging Face transformers models built from configs (random weights, no download): the diff
targets of the acceptance corpus.

The code under test is transformers' own (modeling_llama, modeling_qwen2, ...). This file only
builds a model from a small config and, for the planted bugs, changes what a user's change
would change: a config field (``rms_norm_eps``, ``sliding_window``, ``rope_theta``), the dtype
one module runs in, a buffer stored in a lower precision, a forward replaced by one that calls
``F.linear`` on the module's weights. Every factory takes the same ``seed``, so baseline and
candidate share their weights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# Each architecture: (config class, model class, config fields beyond the common small ones).
ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}),
}


def causal_lm(
    arch: str = "llama", seed: int = 0, attn: str = "sdpa", layers: int = 4, **config: Any
) -> nn.Module:
    """A 4-layer model of ``arch`` (hidden 64, 4 heads, 2 KV heads, vocab 512) in eval mode;
    ``config`` overrides fields of its config (``rms_norm_eps=1e-5``, ``sliding_window=16``,
    ``rope_theta=1e6``)."""
    import transformers

    if arch not in ARCHITECTURES:
        raise ValueError(f"arch {arch!r}: use one of {', '.join(ARCHITECTURES)}")
    config_name, model_name, extra = ARCHITECTURES[arch]
    fields: dict[str, Any] = {
        "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "use_cache": False, **extra,
    }
    rope_theta = config.pop("rope_theta", None)
    fields.update(config)
    built = getattr(transformers, config_name)(**fields)
    if rope_theta is not None:
        built.rope_parameters = {**(built.rope_parameters or {}), "rope_theta": float(rope_theta)}
    built._attn_implementation = attn
    torch.manual_seed(seed)
    model: nn.Module = getattr(transformers, model_name)(built)
    return model.eval()


def module_in_dtype(
    arch: str = "qwen3", module: str = "model.layers.1.mlp.down_proj", dtype: str = "float16",
    seed: int = 0, attn: str = "sdpa", **config: Any,
) -> nn.Module:
    """The model with one module really run in ``dtype`` (its weights cast, its floating-point
    inputs cast on the way in, its outputs cast back to float32): a module left in half
    precision by a mixed-precision patch. ``dtype="float32"`` is the clean twin."""
    model = causal_lm(arch, seed, attn, **config)
    target = getattr(torch, dtype)
    if target == torch.float32:
        return model
    sub = model.get_submodule(module)
    sub.to(target)

    def cast_in(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
        def cast(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                return value.to(target)
            return value

        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}

    def cast_out(_: nn.Module, __: Any, output: Any) -> Any:
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return output.to(torch.float32)
        if isinstance(output, tuple):
            return tuple(o.to(torch.float32) if isinstance(o, torch.Tensor) and o.is_floating_point()
                         else o for o in output)
        return output

    sub.register_forward_pre_hook(cast_in, with_kwargs=True)
    sub.register_forward_hook(cast_out)
    return model


def scaled_module(
    arch: str = "llama", module: str = "model.layers.1.mlp.down_proj", scale: float = 1e8,
    dtype: str = "float32", seed: int = 0, attn: str = "sdpa",
) -> nn.Module:
    """The model with ``module``'s weights multiplied by ``scale`` (outputs of about 1e5, as a
    trained layer with outlier features can give), run in ``dtype`` as :func:`module_in_dtype`
    does: in float16 those outputs overflow its range (65504) to infinity."""
    model = module_in_dtype(arch, module, dtype, seed, attn)
    with torch.no_grad():
        for parameter in model.get_submodule(module).parameters():
            parameter.mul_(scale)
    return model


def attention_scaling(arch: str = "llama", layer: int = 0, factor: float = 1.0, seed: int = 0) -> nn.Module:
    """The model with layer ``layer``'s attention ``scaling`` multiplied by ``factor`` (a patch
    that scales the scores by 1/d instead of 1/sqrt(d), say); ``factor=1`` is the clean twin.
    Position 0 attends to itself only, so its output cannot change: the error starts at 1."""
    model = causal_lm(arch, seed, "eager")
    attention = model.get_submodule(f"model.layers.{layer}.self_attn")
    attention.scaling = attention.scaling * factor
    return model


def mlp_functional(
    arch: str = "llama", layer: int = 1, activation: str = "same", seed: int = 0, attn: str = "sdpa"
) -> nn.Module:
    """The model with layer ``layer``'s MLP forward replaced by one that calls ``F.linear`` on the
    projections' weights, so gate_proj, up_proj and down_proj never run as modules (the way a
    fused or ported forward does). ``activation="same"`` keeps the model's activation (the
    same result, bit for bit); ``"gelu"`` is a port that picked the wrong one."""
    model = causal_lm(arch, seed, attn)
    mlp: Any = model.get_submodule(f"model.layers.{layer}.mlp")
    act: Callable[[torch.Tensor], torch.Tensor]
    if activation == "same":
        act = mlp.act_fn
    elif activation == "gelu":
        act = F.gelu
    else:
        raise ValueError(f"activation {activation!r}: use 'same' or 'gelu'")
    gate, up, down = mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight

    def forward(x: torch.Tensor) -> torch.Tensor:
        return F.linear(act(F.linear(x, gate)) * F.linear(x, up), down)

    mlp.forward = forward
    return model


def mlp_down_linear(
    arch: str = "llama", layer: int = 1, dtype: str = "float16", seed: int = 0, attn: str = "sdpa"
) -> nn.Module:
    """The model with layer ``layer``'s MLP calling ``F.linear`` on ``down_proj``'s weight in
    ``dtype`` (input and weight cast, the result cast back to float32) instead of running its
    ``down_proj`` module; ``gate_proj`` and ``up_proj`` still run as modules. ``dtype="float32"``
    is the clean twin (the same product, bit for bit)."""
    model = causal_lm(arch, seed, attn)
    mlp: Any = model.get_submodule(f"model.layers.{layer}.mlp")
    target = getattr(torch, dtype)
    down = mlp.down_proj.weight

    def forward(x: torch.Tensor) -> torch.Tensor:
        hidden = mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)
        return F.linear(hidden.to(target), down.to(target)).to(x.dtype)

    mlp.forward = forward
    return model


def rope_buffer_bf16(arch: str = "qwen3", seed: int = 0, attn: str = "sdpa", bf16: bool = True) -> nn.Module:
    """The model with its rotary embedding's ``inv_freq`` buffer stored in bfloat16 precision
    (rounded, then used in float32 as transformers does): the angle error grows with the
    position, so the error grows with context length. ``bf16=False`` is the clean twin."""
    model = causal_lm(arch, seed, attn)
    if bf16:
        rotary: Any = model.get_submodule("model.rotary_emb")
        rotary.inv_freq.copy_(rotary.inv_freq.to(torch.bfloat16).to(torch.float32))
    return model


class PositionIdsLM:
    """A GPT-2 behind a callable that reads the request's ``length`` to build its position ids,
    as a serving wrapper does: ``g(request) -> logits``. ``corrupt_from`` re-draws the learned
    position table from that row on (a checkpoint conversion that lost the rows past it)."""

    def __init__(self, seed: int = 0, corrupt_from: int | None = None) -> None:
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                            bos_token_id=0, eos_token_id=0)
        config._attn_implementation = "sdpa"
        torch.manual_seed(seed)
        self.model: Any = GPT2LMHeadModel(config).eval()
        if corrupt_from is not None:
            table = self.model.transformer.wpe.weight
            generator = torch.Generator().manual_seed(seed + 1)
            with torch.no_grad():
                rows = table.shape[0] - corrupt_from
                table[corrupt_from:] = 0.02 * torch.randn(rows, table.shape[1], generator=generator)

    def __call__(self, request: dict[str, Any]) -> torch.Tensor:
        length = int(request["length"])
        ids = request["input_ids"]
        if ids.shape[-1] != length:
            raise ValueError(f"request {request.get('id')!r}: {ids.shape[-1]} input ids, length {length}")
        positions = torch.arange(length).unsqueeze(0)
        with torch.no_grad():
            logits: torch.Tensor = self.model(input_ids=ids, position_ids=positions).logits
        return logits


def gpt2_by_length(seed: int = 0, corrupt_from: int | None = None) -> PositionIdsLM:
    """Factory of :class:`PositionIdsLM` (a callable diff target)."""
    return PositionIdsLM(seed, corrupt_from)
