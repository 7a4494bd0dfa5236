"""What a serving endpoint serves, asked of the server and, on this host, read from its process:
the model it lists (``GET /models``: vLLM lists the folder it was started with as the model's id
and ``root``), the engine's version (``GET /version``: vLLM answers ``{"version": ...}``), and,
for a server listening on a loopback address, the process that holds the port (its pid and
command line, read with psutil), whose ``--dtype`` says the format the weights run in.

A local Hugging Face folder (it holds ``config.json``) is what makes the endpoint-to-module step
possible: the failing request's tokens run through that folder in-process on each side, in the
format each server ran (:mod:`glmfb.diff.hf`). Where the command line does not say the format
(``--dtype auto`` or no flag), the folder's ``config.json`` dtype is taken and the step says it
was assumed. Nothing here is required: a server that answers none of it (llama.cpp's GGUF has
no folder) gives a description with those fields None, and the step is offered in words.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from glmfb.diff.evidence import ServedBy
from glmfb.diff.hf import is_model_folder

LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def describe(side: str, base_url: str, models: Any, version: Any) -> ServedBy:
    """The ``served_by`` evidence of ``side`` from its server's ``/models`` and ``/version``
    answers (None: not answered) and, on a loopback address, the process listening on its port."""
    listed = models.get("data") if isinstance(models, dict) else None
    first = listed[0] if isinstance(listed, list) and listed and isinstance(listed[0], dict) else {}
    model = str(first["id"]) if "id" in first else None
    roots = [str(first[key]) for key in ("root", "id") if isinstance(first.get(key), str)]
    folder = next((root for root in roots if is_model_folder(root)), None)
    engine = str(version["version"]) if isinstance(version, dict) and "version" in version else None
    pid, command = listening_process(base_url)
    dtype, source = _dtype(command, pid, folder)
    return ServedBy(side=side, server=base_url, model=model, folder=folder, dtype=dtype, dtype_source=source,
                    engine_version=engine, pid=pid, command=command)


def listening_process(base_url: str) -> tuple[int | None, tuple[str, ...] | None]:
    """The pid and command line of the process listening on a loopback URL's port (None, None:
    another host, or not visible here)."""
    parts = urlsplit(base_url)
    if parts.hostname not in LOOPBACK:
        return None, None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        import psutil

        for connection in psutil.net_connections(kind="tcp"):
            if connection.status == psutil.CONN_LISTEN and connection.laddr and connection.laddr.port == port:
                if connection.pid is None:
                    return None, None
                return connection.pid, tuple(psutil.Process(connection.pid).cmdline())
    except Exception:  # no psutil; psutil.AccessDenied or NoSuchProcess: not ours to read, or gone
        return None, None
    return None, None


def flag(command: Sequence[str], name: str) -> str | None:
    """The value of ``--name X`` or ``--name=X`` in a command line (the last one given)."""
    value = None
    for i, word in enumerate(command):
        if word == name and i + 1 < len(command):
            value = command[i + 1]
        elif word.startswith(name + "="):
            value = word.split("=", 1)[1]
    return value


DTYPE_NAMES = {"float32": "float32", "float": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "half": "float16", "fp16": "float16"}


def _dtype(command: tuple[str, ...] | None, pid: int | None, folder: str | None) -> tuple[str | None, str | None]:
    given = flag(command, "--dtype") if command is not None else None
    if given is not None and given in DTYPE_NAMES:
        return DTYPE_NAMES[given], f"--dtype {given} on the command line of pid {pid}"
    if folder is not None:
        try:
            config = json.loads(Path(folder, "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None, None
        stored = config.get("dtype") or config.get("torch_dtype")
        if isinstance(stored, str) and stored in DTYPE_NAMES:
            seen = f"--dtype {given}" if given is not None else "no --dtype" if command is not None else "no command line"
            return DTYPE_NAMES[stored], f"assumed from {folder}/config.json ({seen} seen)"
    return None, None
