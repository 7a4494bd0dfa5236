"""Tiny GGUF models for the serving scenario: a random tiny Llama, written with the ``gguf`` package
(no download), in four files that llama.cpp's server loads:

- ``f32.gguf``: the reference, every tensor in float32;
- ``q8_0.gguf``: the same weights, the matrices quantized to q8_0;
- ``perturbed.gguf``: the same weights with one layer's attention output projection perturbed;
- ``tie.gguf``: the same weights with one of two tied output rows nudged by a part in 10^5, so
  the two servers part only where those two tokens lead, at a near tie.

The reference holds two tokens whose output rows are equal (an exact tie whenever they lead);
the tie model breaks it by far less than any noise a server shows.

    python scenarios/serving/make_models.py OUT

The tokenizer is a small SentencePiece-style vocabulary made here: three control tokens, the ASCII
byte tokens but the space (a space is the piece "▁"), and a few common English pieces, so that
every token decodes to a distinct string (a server's top-logprobs are keyed by text) and ASCII
text never falls back to a byte the vocabulary lacks.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

N_EMBD = 64
N_HEAD = 4
N_LAYER = 4
N_FF = 128  # a multiple of 32: q8_0 blocks along every row
CONTEXT = 512
SEED = 20
PERTURBED_LAYER = 2
PIECES = ("\u2581", "\u2581the", "\u2581and", "\u2581a", "\u2581to", "\u2581of", "\u2581in", "\u2581it", "\u2581is",
          "th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of",
          "ed", "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le",
          "the", "and", "ing", "ion", "tio", "ent", "her", "for", "tha", "nth")
# The two tokens whose output rows are tied (two of the pieces above).
TIED = ("\u2581the", "\u2581and")


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types (SentencePiece token types: 1 normal, 3 control, 6 byte)."""
    tokens = ["<unk>", "<s>", "</s>"]
    scores = [0.0, 0.0, 0.0]
    types = [2, 3, 3]
    for byte in range(128):
        if chr(byte) == " ":  # a space is the piece "▁" (SentencePiece), so no byte token decodes to it too
            continue
        tokens.append(f"<0x{byte:02X}>")
        scores.append(0.0)
        types.append(6)
    for rank, piece in enumerate(PIECES):
        tokens.append(piece)
        scores.append(-float(rank))  # a higher score merges first
        types.append(1)
    return tokens, scores, types


def weights(n_vocab: int) -> dict[str, Any]:
    """Random float32 weights in llama.cpp's tensor names (numpy shapes are (out, in)). Scaled so
    that the logits spread (greedy decoding is not a coin toss) yet stay finite."""
    import numpy as np

    rng = np.random.default_rng(SEED)

    def matrix(rows: int, cols: int, scale: float = 1.0) -> Any:
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    tensors: dict[str, Any] = {
        "token_embd.weight": rng.standard_normal((n_vocab, N_EMBD)).astype(np.float32),
        "output_norm.weight": np.ones(N_EMBD, dtype=np.float32),
        "output.weight": matrix(n_vocab, N_EMBD, 4.0),
    }
    for layer in range(N_LAYER):
        prefix = f"blk.{layer}"
        tensors[f"{prefix}.attn_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
        tensors[f"{prefix}.ffn_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors[f"{prefix}.{name}.weight"] = matrix(N_EMBD, N_EMBD)
        tensors[f"{prefix}.ffn_gate.weight"] = matrix(N_FF, N_EMBD)
        tensors[f"{prefix}.ffn_up.weight"] = matrix(N_FF, N_EMBD)
        tensors[f"{prefix}.ffn_down.weight"] = matrix(N_EMBD, N_FF)
    return tensors


def write(path: Path, tensors: dict[str, Any], vocab: tuple[list[str], list[float], list[int]],
          quantize: bool = False) -> None:
    """One GGUF file: llama metadata, the tokenizer, the tensors (matrices in q8_0 when asked)."""
    import gguf

    tokens, scores, types = vocab
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"glmfb-tiny-llama-{path.stem}")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    file_type = gguf.LlamaFileType.MOSTLY_Q8_0 if quantize else gguf.LlamaFileType.ALL_F32
    writer.add_file_type(int(file_type))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    for name, data in tensors.items():
        if quantize and data.ndim == 2:
            qtype = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def make_models(out: Path) -> dict[str, Path]:
    """Write the four models into ``out``; returns name -> path."""
    vocab = vocabulary()
    tokens = vocab[0]
    base = weights(len(tokens))
    tied = [tokens.index(piece) for piece in TIED]
    base["output.weight"][tied[1]] = base["output.weight"][tied[0]] = base["output.weight"][tied[0]] * 2.0
    perturbed = dict(base)
    name = f"blk.{PERTURBED_LAYER}.attn_output.weight"
    perturbed[name] = base[name] * 1.05
    tie = dict(base)
    tie["output.weight"] = base["output.weight"].copy()
    tie["output.weight"][tied[1]] *= 1.0 + 1e-5
    out.mkdir(parents=True, exist_ok=True)
    paths = {kind: out / f"{kind}.gguf" for kind in ("f32", "q8_0", "perturbed", "tie")}
    write(paths["f32"], base, vocab)
    write(paths["q8_0"], base, vocab, quantize=True)
    write(paths["perturbed"], perturbed, vocab)
    write(paths["tie"], tie, vocab)
    return paths


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: make_models.py OUT", file=sys.stderr)
        return 2
    for path in make_models(Path(argv[0])).values():
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
