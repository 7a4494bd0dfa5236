"""Prefill of a small transformer with per-layer KV transfer to a decode process (bug 2 of docs/background.md).

One iteration: the prefill runs layer by layer on a fixed prompt; each layer stores its K and
V into a KV pool (pages of ``page_tokens`` tokens) and hands the layer to the transfer thread
``kv-transfer``, which sends the pages one by one from Python (as a serving engine submits
KV pages); then the layer's MoE dispatch waits in a native call (``intranode_dispatch``),
then the experts run. The iteration ends when the prefill is done and every page arrived.

Factories (``glmfb gap`` targets, docs/design.md): :func:`prefill_only` (no transfer),
:func:`prefill_transfer_holding` (the dispatch holds the GIL: the bug) and
:func:`prefill_transfer_releasing` (the fix). The dispatch runs in every variant, so
prefill-only against releasing is a fair comparison. Each returns a :class:`PrefillIteration`:
call it for one iteration (it returns its phase timings in seconds, plus ``kv_bytes``), and
``close()`` it when done (a finalizer closes it otherwise).
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
import weakref
from typing import Any

import torch
import torch.nn.functional as F

from .dispatch import NativeDispatch
from .transport import (
    TRANSPORTS,
    MooncakeSender,
    ReceiverProcess,
    Sender,
    SocketSender,
    TransferError,
    mooncake_unavailable_reason,
)

TRANSFER_THREAD_NAME = "kv-transfer"
# Tokens per KV page, per path: a socket write of a page costs about a quarter of a Mooncake
# transfer_sync_write here, so its pages are smaller to keep the same per-layer share of Python
# submissions (calibrated with benchmarks/gap_kv_transfer.py).
DEFAULT_PAGE_TOKENS = {"mooncake": 8, "socket": 4}
# how long a failed write waits for the receiver to be reaped before blaming the write alone
RECEIVER_EXIT_WAIT_S = 2.0


class TinyPrefillModel:
    """A pre-norm transformer (attention + MLP "experts"), random weights from a fixed seed."""

    def __init__(self, layers: int, hidden: int, heads: int, seed: int) -> None:
        if hidden % heads:
            raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
        generator = torch.Generator().manual_seed(seed)
        scale = hidden**-0.5

        def weight(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=generator) * scale

        self.layers = layers
        self.hidden = hidden
        self.heads = heads
        self.qkv = [weight(hidden, 3 * hidden) for _ in range(layers)]
        self.out = [weight(hidden, hidden) for _ in range(layers)]
        self.up = [weight(hidden, 2 * hidden) for _ in range(layers)]
        self.down = [weight(2 * hidden, hidden) for _ in range(layers)]

    def attention(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One attention block: the new residual stream, and this layer's K and V [tokens, hidden]."""
        tokens = x.shape[0]
        q, k, v = (F.rms_norm(x, (self.hidden,)) @ self.qkv[layer]).split(self.hidden, dim=-1)
        head_dim = self.hidden // self.heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            # 4-D [batch, heads, tokens, head_dim]: 3-D inputs take a slow math path on CPU
            return t.view(1, tokens, self.heads, head_dim).transpose(1, 2)

        attended = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + attended.transpose(1, 2).reshape(tokens, self.hidden) @ self.out[layer]
        return x, k, v

    def experts(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(F.rms_norm(x, (self.hidden,)) @ self.up[layer]) @ self.down[layer]


class PrefillIteration:
    """One scenario instance: model, KV pool, receiver process, sender, transfer thread."""

    def __init__(
        self,
        *,
        transfer: bool,
        dispatch: str,
        layers: int = 4,
        tokens: int = 2048,
        hidden: int = 64,
        heads: int = 2,
        page_tokens: int | None = None,
        dispatch_ms: float = 120.0,
        threads: int = 1,
        transport: str = "auto",
        timeout_s: float = 10.0,
        kill_receiver_at: int | None = None,
        seed: int = 0,
    ) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport {transport!r}: use one of {', '.join(TRANSPORTS)}")
        torch.set_num_threads(threads)  # deliberate: one core for prefill, the rest for transfer
        self.model = TinyPrefillModel(layers, hidden, heads, seed)
        self.prompt = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed + 1))
        self.dispatch = NativeDispatch(dispatch)
        self.dispatch_us = int(dispatch_ms * 1000)
        self.timeout_s = timeout_s
        self.kill_receiver_at = kill_receiver_at
        self.iterations = 0
        self.transfer = transfer
        self.transfer_path: str | None = None
        self.fallback_reason: str | None = None
        # KV pool [layer, k|v, tokens, hidden]: pages of page_tokens rows, K and V apart.
        self.pool = torch.zeros(layers, 2, tokens, hidden, dtype=torch.float32)
        self.layer_bytes = 2 * tokens * hidden * 4
        self.total_bytes = layers * self.layer_bytes
        self._receiver: ReceiverProcess | None = None
        self._sender: Sender | None = None
        self._thread: _TransferThread | None = None
        self._broken: str | None = None
        resolved = self._resolve_transport(transport) if transfer else None
        if page_tokens is None:
            page_tokens = DEFAULT_PAGE_TOKENS[resolved or "mooncake"]
        if page_tokens <= 0 or tokens % page_tokens:
            raise ValueError(f"tokens {tokens} is not a multiple of page_tokens {page_tokens}")
        self.page_bytes = page_tokens * hidden * 4
        if resolved is not None:
            self._open_transfer(resolved)
        self._finalizer = weakref.finalize(self, _close_resources, self._thread, self._sender, self._receiver)

    # ---- setup ------------------------------------------------------------------------------

    def _resolve_transport(self, transport: str) -> str:
        """``auto`` -> ``mooncake`` when the engine loads, else ``socket`` (and why)."""
        if transport == "socket":
            return transport
        reason = mooncake_unavailable_reason()
        if reason is None:
            return "mooncake"
        if transport == "mooncake":
            raise TransferError(reason)
        self.fallback_reason = reason
        return "socket"

    def _open_transfer(self, transport: str) -> None:
        receiver = ReceiverProcess(transport, self.total_bytes)
        try:
            sender: Sender
            if transport == "mooncake":
                sender = MooncakeSender(self.pool.data_ptr(), self.total_bytes, receiver)
            else:
                view = memoryview(self.pool.numpy()).cast("B")
                sender = SocketSender(view, receiver, timeout_s=self.timeout_s)
        except BaseException:
            receiver.close()
            raise
        self._receiver = receiver
        self._sender = sender
        self.transfer_path = sender.path
        self._thread = _TransferThread(sender, self.page_bytes)
        self._thread.start()

    # ---- one iteration -----------------------------------------------------------------------

    def __call__(self) -> dict[str, float]:
        if self._broken is not None:
            raise TransferError(f"this scenario instance is broken: {self._broken}")
        self.iterations += 1
        thread = self._thread
        if thread is not None:
            thread.begin(self.model.layers)
        dispatch_s = 0.0
        started = time.perf_counter()
        x = self.prompt
        with torch.inference_mode():
            for layer in range(self.model.layers):
                x, k, v = self.model.attention(layer, x)
                self.pool[layer, 0].copy_(k)
                self.pool[layer, 1].copy_(v)
                if thread is not None:
                    thread.submit(layer * self.layer_bytes, self.layer_bytes)
                    if self.kill_receiver_at == self.iterations and self._receiver is not None:
                        self._receiver.kill()  # fault injection: the decode side dies mid-run
                dispatch_started = time.perf_counter()
                self.dispatch.intranode_dispatch(self.dispatch_us)
                dispatch_s += time.perf_counter() - dispatch_started
                x = self.model.experts(layer, x)
        prefill_done = time.perf_counter()
        phases = {"prefill_s": prefill_done - started, "dispatch_s": dispatch_s}
        if thread is not None:
            try:
                self._wait_for_delivery(thread)
            except TransferError as exc:
                self._broken = str(exc)
                raise
            phases["kv_wait_s"] = time.perf_counter() - prefill_done
            phases["transfer_busy_s"] = thread.busy_s
            phases["kv_bytes"] = float(thread.delivered_bytes)
        return phases

    def _wait_for_delivery(self, thread: _TransferThread) -> None:
        assert self._receiver is not None
        deadline = time.monotonic() + self.timeout_s
        while not thread.done.wait(0.02):
            reason = self._receiver.exit_reason()
            if reason is not None:
                raise TransferError(
                    f"{reason} during the KV transfer: {thread.delivered_bytes} of "
                    f"{self.total_bytes} bytes delivered"
                )
            if time.monotonic() > deadline:
                raise TransferError(
                    f"the KV transfer did not finish within {self.timeout_s:g} s: "
                    f"{thread.delivered_bytes} of {self.total_bytes} bytes delivered"
                )
        if thread.error is not None:
            # a failed write most often means the receiver died: name that when it did
            reason = self._receiver.exit_reason(wait_s=RECEIVER_EXIT_WAIT_S)
            raise TransferError(f"{thread.error}" + (f" ({reason})" if reason else ""))

    # ---- checks ------------------------------------------------------------------------------

    def measure_ceiling(self, repeats: int = 3) -> float:
        """The transfer path's own bandwidth on this host (bytes/s): the whole pool in one
        write, nothing else running; the best of ``repeats``."""
        if self._sender is None:
            raise TransferError("this variant does not transfer")
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            self._sender.write(0, self.total_bytes)
            best = min(best, time.perf_counter() - started)
        return self.total_bytes / best

    def measure_page_rate(self, repeats: int = 3) -> float:
        """The same bytes page by page from Python, nothing else running (bytes/s): what the
        transfer thread could reach if it were never held back; the best of ``repeats``."""
        if self._sender is None:
            raise TransferError("this variant does not transfer")
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            for page in range(0, self.total_bytes, self.page_bytes):
                self._sender.write(page, min(self.page_bytes, self.total_bytes - page))
            best = min(best, time.perf_counter() - started)
        return self.total_bytes / best

    def check_delivery(self) -> dict[str, Any]:
        """Run one iteration with the destination poisoned and compare what arrived.

        The destination is first filled with the bitwise complement of the KV pool (the prompt
        is fixed, so the pool holds what the next iteration will send); afterwards every byte
        that equals the source arrived during this iteration.
        """
        if self._receiver is None or self._thread is None:
            raise TransferError("this variant does not transfer")
        import numpy as np

        before = self.pool.numpy().view(np.uint8).reshape(-1).copy()
        destination = np.frombuffer(self._receiver.buffer, dtype=np.uint8, count=self.total_bytes)
        destination[:] = ~before
        phases = self()
        source = self.pool.numpy().view(np.uint8).reshape(-1)
        received = int(np.count_nonzero(destination == source))
        return {
            "transfer_path": self.transfer_path,
            "bytes_sent": self._thread.delivered_bytes,
            "bytes_expected": self.total_bytes,
            "bytes_received": received,
            "source_sha256": hashlib.sha256(source.tobytes()).hexdigest(),
            "received_sha256": hashlib.sha256(destination.tobytes()).hexdigest(),
            "source_unchanged": bool(np.array_equal(before, source)),
            "phases": phases,
        }

    def describe(self) -> dict[str, Any]:
        return {
            "transfer": self.transfer,
            "transfer_path": self.transfer_path,
            "fallback_reason": self.fallback_reason,
            "dispatch": self.dispatch.mode,
            "dispatch_ms": self.dispatch_us / 1000,
            "layers": self.model.layers,
            "kv_bytes_per_iteration": self.total_bytes if self.transfer else 0,
            "page_bytes": self.page_bytes,
        }

    def close(self) -> None:
        self._finalizer()


class _TransferThread:
    """The ``kv-transfer`` thread: sends each submitted layer page by page, from Python."""

    def __init__(self, sender: Sender, page_bytes: int) -> None:
        self.sender = sender
        self.page_bytes = page_bytes
        self.jobs: queue.Queue[tuple[int, int] | None] = queue.Queue()
        self.done = threading.Event()
        self.error: str | None = None
        self.delivered_bytes = 0
        self.busy_s = 0.0
        self._layers_left = 0
        self.thread = threading.Thread(target=self._run, name=TRANSFER_THREAD_NAME, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def begin(self, layers: int) -> None:
        self.done.clear()
        self.delivered_bytes = 0
        self.busy_s = 0.0
        self._layers_left = layers

    def submit(self, offset: int, count: int) -> None:
        self.jobs.put((offset, count))

    def stop(self) -> None:
        self.jobs.put(None)

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if self.error is not None:
                continue
            offset, count = job
            started = time.perf_counter()
            try:
                for page in range(offset, offset + count, self.page_bytes):
                    self.sender.write(page, min(self.page_bytes, offset + count - page))
                    self.delivered_bytes += min(self.page_bytes, offset + count - page)
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"
                self.done.set()
                continue
            self.busy_s += time.perf_counter() - started
            self._layers_left -= 1
            if self._layers_left == 0:
                self.done.set()


def _close_resources(
    thread: _TransferThread | None, sender: Sender | None, receiver: ReceiverProcess | None
) -> None:
    if thread is not None:
        thread.stop()
        thread.thread.join(timeout=5.0)
        if thread.thread.is_alive():
            # Stuck inside a native write to a dead peer: leave the daemon thread and the
            # engine alone rather than free memory under it.
            if receiver is not None:
                receiver.kill()
                receiver.close()
            return
    if sender is not None:
        sender.close()
    if receiver is not None:
        receiver.close()


def prefill_only(**kwargs: Any) -> PrefillIteration:
    """Prefill with the releasing dispatch and no KV transfer: the baseline."""
    kwargs.setdefault("dispatch", "releasing")
    return PrefillIteration(transfer=False, **kwargs)


def prefill_transfer_holding(**kwargs: Any) -> PrefillIteration:
    """Prefill + KV transfer; the dispatch holds the GIL (bug 2 of docs/background.md)."""
    return PrefillIteration(transfer=True, dispatch="holding", **kwargs)


def prefill_transfer_releasing(**kwargs: Any) -> PrefillIteration:
    """Prefill + KV transfer; the dispatch releases the GIL (the fix)."""
    return PrefillIteration(transfer=True, dispatch="releasing", **kwargs)
