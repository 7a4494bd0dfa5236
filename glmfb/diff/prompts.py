"""Requests as text: a ``prompt`` request becomes the token request a tokenizer makes of it.

The tokenizer is, in this order: a Hugging Face tokenizer folder given as ``--tokenizer DIR``
(a served model's folder has one; loaded from local files only), else the baseline target's
own: a ``tokenizer`` attribute of what its factory returned (a Hugging Face tokenizer, or any
object with ``encode(text)``), else a ``tokenize(text)`` function in the target's module. The
ids are encoded as the tokenizer encodes by default (a Hugging Face tokenizer adds its special
tokens, as a server does for a completion's prompt). Each request keeps its prompt and gains the
ids used (:meth:`~glmfb.diff.requests.Request.tokenized`), so a reproducer reads back without
the tokenizer, and the verdict's evidence (kind ``prompts``) lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.contract.errors import InputError

if TYPE_CHECKING:
    from glmfb.diff.capture import LoadedSide
    from glmfb.diff.requests import Request

Encode = Callable[[str], Sequence[int]]


@dataclass(frozen=True)
class Tokenizer:
    """How text becomes token ids, and where that came from (said in the evidence)."""

    encode: Encode
    source: str


def needs_tokenizer(requests: Sequence[Request]) -> bool:
    return any(r.prompt is not None for r in requests)


def folder_tokenizer(folder: Path) -> Tokenizer:
    """The Hugging Face tokenizer saved in ``folder`` (local files only)."""
    if not folder.is_dir():
        raise InputError(f"--tokenizer {folder}: no such folder", "give a Hugging Face tokenizer folder (a model's)")
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise InputError("--tokenizer needs transformers", "pip install transformers") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # a folder without a tokenizer, a broken file: one line
        raise InputError(f"--tokenizer {folder}: cannot load a tokenizer from it: {exc}".splitlines()[0],
                         "give a folder with tokenizer.json or tokenizer_config.json") from None
    return Tokenizer(_encoder(tokenizer), f"the tokenizer in {folder}")


def side_tokenizer(side: LoadedSide) -> Tokenizer | None:
    """The target's own tokenizer: its factory's object's ``tokenizer`` attribute, else a
    ``tokenize`` function in its module; None when it has neither."""
    own = getattr(side.obj, "tokenizer", None)
    if own is not None:
        return Tokenizer(_encoder(own), f"the tokenizer attribute of what {side.target.ref} returned")
    import sys

    module = sys.modules.get(getattr(side.target.load(), "__module__", None) or "")
    function = getattr(module, "tokenize", None) if module is not None else None
    if callable(function):
        return Tokenizer(function, f"tokenize() in {side.target.ref.rpartition(':')[0]}")
    return None


def _encoder(tokenizer: Any) -> Encode:
    encode = getattr(tokenizer, "encode", None)
    if callable(encode):
        return encode
    if callable(tokenizer):
        return lambda text: tokenizer(text)["input_ids"]
    raise InputError(f"the tokenizer {type(tokenizer).__name__} has no encode(text)",
                     "give an object with encode(text) -> ids, or --tokenizer DIR")


def tokenize_requests(requests: Sequence[Request], tokenizer: Tokenizer | None) -> list[Request]:
    """Every ``prompt`` request as the token request ``tokenizer`` makes of it (the others as
    they are). Without a tokenizer, or when one gives no ids, an :class:`InputError` that says
    where a tokenizer comes from."""
    if not needs_tokenizer(requests):
        return list(requests)
    if tokenizer is None:
        raise InputError("the requests give text (prompt) and no tokenizer was found",
                         "give --tokenizer DIR (a Hugging Face tokenizer folder), or give the target a tokenizer "
                         "attribute or a tokenize(text) function in its module")
    out = []
    for request in requests:
        if request.prompt is None:
            out.append(request)
            continue
        try:
            ids = [int(i) for i in tokenizer.encode(request.prompt)]
        except Exception as exc:  # someone else's tokenizer
            raise InputError(f"request {request.id!r}: {tokenizer.source} failed on its prompt: "
                             f"{type(exc).__name__}: {exc}".splitlines()[0]) from None
        if not ids or any(i < 0 for i in ids):
            raise InputError(f"request {request.id!r}: {tokenizer.source} gave {ids[:8]!r} for its prompt",
                             "a prompt must encode to at least one non-negative token id")
        out.append(request.tokenized(ids))
    return out
