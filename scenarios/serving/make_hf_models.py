"""Tiny Hugging Face model folders for the vLLM serving tests: a random tiny Llama written with
transformers (no download), in folders that vLLM's ``--model DIR`` and transformers'
``from_pretrained(DIR)`` both load:

- ``llama/``: the reference, float32 weights;
- ``llama-scaled/``: the same weights with one layer's (``SCALED_LAYER``) MLP down projection
  scaled by 1.01, a change that moves that layer's output and everything after it.

A server started with ``--dtype bfloat16`` on ``llama/`` is the reference in another format.
The shapes are the smallest vLLM's CPU attention takes: head_dim 64 (two heads of a hidden size
of 128, one key/value head); head_dim 16 is refused at the first request. The tokenizer is a
word-level vocabulary made here (``w0`` .. ``w255`` and three control tokens, split on
whitespace), so every token decodes to a distinct string (a server's top logprobs are keyed by
text) and a prompt is any words of that vocabulary (``w12 w7 w200``).

    python scenarios/serving/make_hf_models.py OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

HIDDEN = 128
HEADS = 2  # head_dim 64
KV_HEADS = 1
LAYERS = 2
INTERMEDIATE = 256
WORDS = 256
SEED = 7
SCALED_LAYER = 1
SCALE = 1.01
CONTEXT = 512


def vocabulary() -> dict[str, int]:
    """Three control tokens, then ``w0`` .. ``w{WORDS-1}``."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i + 3 for i in range(WORDS)})
    return vocab


def _tokenizer() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   model_max_length=CONTEXT)


def make_models(out: Path) -> dict[str, Path]:
    """Write the folders into ``out``; returns them by name (``llama``, ``llama-scaled``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(vocab_size=WORDS + 3, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         max_position_embeddings=CONTEXT, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                         torch_dtype="float32")
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random weights of a trained model's scale: outputs that are not all near-ties
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.08)
    tokenizer = _tokenizer()
    folders = {"llama": out / "llama", "llama-scaled": out / "llama-scaled"}
    model.save_pretrained(folders["llama"])
    tokenizer.save_pretrained(folders["llama"])  # type: ignore[attr-defined]
    with torch.no_grad():
        model.model.layers[SCALED_LAYER].mlp.down_proj.weight.mul_(SCALE)
    model.save_pretrained(folders["llama-scaled"])
    tokenizer.save_pretrained(folders["llama-scaled"])  # type: ignore[attr-defined]
    return folders


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scenarios/serving/make_hf_models.py OUT")
    for name, folder in make_models(Path(sys.argv[1])).items():
        print(f"{name}: {folder}")
