"""Prefill of a Hugging Face Llama (built from a config) with its KV sent by a real Mooncake
transfer engine: the gap targets of the acceptance corpus.

One iteration prefills a prompt on the thread ``prefill``; forward hooks on each layer's
``k_proj`` and ``v_proj`` copy that layer's K and V into a registered KV pool and hand the
layer to the sender thread ``kv-sender``, which prepares it and writes it with Mooncake's
``transfer_sync_write`` (TCP on loopback, two engines in this process) while the prefill goes
on. The iteration ends when the prefill is done and every layer arrived. How the sender
prepares a layer is the case:

- ``sender="none"``: no transfer (the baseline: prefill alone);
- ``"plain"``: the layer as it is (the fix of the two below);
- ``"pickle"``: ``pickle.dumps`` of the layer's page table, a few ms per call, several calls
  per layer: short GIL holds that add up while the prefill thread needs the GIL between ops;
- ``"tolist"``: ``pickle.dumps(layer.tolist())``, the layer's K and V turned into one Python list
  of floats (``Tensor.tolist``: one C++ call of a few ms that keeps the GIL) and pickled;
- ``"clone"``: ``layer.clone()``, a copy that releases the GIL (the clean twin of ``"tolist"``);
- ``"zlib"``: ``zlib.compress`` of the layer's bytes, which releases the GIL; with ``cpus=1``
  (the prefill, the sender and Mooncake's threads pinned to one core, as a container's
  cpuset does) it competes with the prefill for the core, not for the GIL;
- ``"bulk"``: after the prefill, one write of ``bulk_mib`` MiB with nothing overlapping it:
  the transfer runs as fast as the engine moves bytes on this host (bandwidth bound);
- ``"sync"``: the same write as ``"bulk"``, reported as a synchronous phase of its own
  (``{"prefill_s", "send_s", "send_bytes"}``, no busy time): prefill, then send the KV and
  wait for the acknowledgement, on the critical path;
- ``"staged"``: no sender thread: each layer, once its V is in, is staged on the prefill thread
  itself into a registered staging buffer laid out by a page table (token ``t`` to slot
  ``slots[t]``) and written with ``transfer_sync_write`` before the prefill goes on; with
  ``stage="token"`` (the default) the staging copies one token's K and one token's V at a time in a
  Python loop (the synchronous staging copy per layer), with ``stage="layer"`` one
  ``index_copy_`` per layer (its clean twin). The iteration reports ``prefill_s`` (net of the
  staging and the writes), ``stage_s`` and ``send_s``;
- ``"sleep"``: a wait per layer before the write (an acknowledgement round trip) twice as long as
  that layer took to compute, so the gap it plants is the same share of the prefill on a quiet
  host and on a loaded one (a fixed 60 ms wait read +37% [+20, +57] at load 4 and +23.5% at load
  5-9 against a 50% threshold: the slower prefill hid more of it): the prefill waits for its KV, and
  neither the GIL nor a CPU is the cause.

By default the prefill runs on a thread of its own, ``prefill``, which pins itself and then
starts the sender (and Mooncake's threads), so they inherit its CPU mask and the calling process
is left as it was. ``on_caller=True`` runs the prefill on the calling thread instead (pinned
while the target lives), as a serving engine's main loop does: under ``glmfb gil`` that is the
thread of glmfb's own runner. ``thread_per`` says how long a sender thread lives: the target's
life (``"target"``, the default: one ``kv-sender``), one iteration (``"iteration"``: started
afresh for each and joined at its end), one layer (``"layer"``: one thread per layer, all
joined at the iteration's end), as code that ships each step's or layer's KV from a thread of
its own does, or the target's life in a pool (``"pool"``: two reused ``ThreadPoolExecutor``
threads, ``kv-serializer_0`` and ``kv-serializer_1``, each layer submitted to them). The
per-iteration and per-layer threads are started unnamed, so Python calls them ``Thread-N
(_send_loop)`` or ``Thread-N (_send_layer)``. Each iteration returns phase timings
(``prefill_s``, ``kv_wait_s``), ``kv_bytes`` and ``transfer_busy_s``; the target offers
``measure_ceiling()`` / ``measure_page_rate()`` (docs/gap.md), ``describe()`` and ``close()``.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

ACK_PER_LAYER = 2.0  # the "sleep" sender waits this many times the layer's compute time before it writes
SENDERS = ("none", "plain", "pickle", "tolist", "clone", "zlib", "bulk", "sync", "sleep", "staged")
STAGES = ("token", "layer")  # the "staged" sender: a Python loop over tokens, or one index_copy_ per layer
ONE_WRITE = ("bulk", "sync")  # senders that write one buffer after the prefill
PER_LAYER = ("plain", "pickle", "tolist", "clone", "zlib", "sleep")  # senders that ship each layer from a thread
THREAD_PER = ("target", "iteration", "layer", "pool")  # how long a sender thread lives
POOL_WORKERS = 2
PREFILL_THREAD = "prefill"
SENDER_THREAD = "kv-sender"
SERIALIZER_PREFIX = "kv-serializer"  # the pool's threads: kv-serializer_0, kv-serializer_1
CALL_TIMEOUT_S = 60.0


class MooncakeLink:
    """Two Mooncake transfer engines in this process (TCP, P2P handshake): ``write`` copies a
    range of the registered source to the same offset of the registered destination."""

    def __init__(self, source: torch.Tensor) -> None:
        from mooncake.engine import TransferEngine

        self.sender, self.receiver = TransferEngine(), TransferEngine()
        for engine in (self.sender, self.receiver):
            if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
                raise RuntimeError("Mooncake TransferEngine.initialize failed")
        self.nbytes = source.numel() * source.element_size()
        self.source = source
        self.destination = torch.empty_like(source)
        self.source_ptr = source.data_ptr()
        self.destination_ptr = self.destination.data_ptr()
        for engine, pointer in ((self.sender, self.source_ptr), (self.receiver, self.destination_ptr)):
            if engine.register_memory(pointer, self.nbytes) != 0:
                raise RuntimeError("Mooncake register_memory failed")
        self.peer = f"127.0.0.1:{self.receiver.get_rpc_port()}"

    def write(self, offset: int, count: int) -> None:
        status = self.sender.transfer_sync_write(
            self.peer, self.source_ptr + offset, self.destination_ptr + offset, count
        )
        if status != 0:
            raise RuntimeError(f"Mooncake transfer_sync_write returned {status} at offset {offset}")

    def close(self) -> None:
        """Unregister both buffers and drop both engines, each woken first so that the drop
        does not wait up to a second for its handshake listener (:mod:`glmfb.gap.mooncake`)."""
        from glmfb.gap.mooncake import unblock_teardown

        for engine, pointer in ((self.sender, self.source_ptr), (self.receiver, self.destination_ptr)):
            with contextlib.suppress(Exception):  # closing must not hide what iterations reported
                engine.unregister_memory(pointer)
            unblock_teardown(engine)
        self.sender = self.receiver = None


_pin_lock = threading.Lock()
_pins: dict[int, tuple[set[int], int]] = {}  # native thread id -> (mask before, pin count)


def pin_this_thread(cpus: int) -> None:
    """Pin the calling thread to the first ``cpus`` CPUs of its mask; nested pins count, the
    last :func:`unpin_this_thread` puts back the mask from before the first."""
    tid = threading.get_native_id()
    with _pin_lock:
        before, count = _pins.get(tid, (os.sched_getaffinity(0), 0))
        os.sched_setaffinity(0, set(sorted(before)[:cpus]))
        _pins[tid] = (before, count + 1)


def unpin_this_thread() -> None:
    tid = threading.get_native_id()
    with _pin_lock:
        if tid not in _pins:
            return
        before, count = _pins[tid]
        if count > 1:
            _pins[tid] = (before, count - 1)
            return
        del _pins[tid]
        os.sched_setaffinity(0, before)


def _pickle_tolist(layer: torch.Tensor) -> int:
    """``pickle.dumps`` of the layer's K and V as one flat Python list of floats (one list: no
    container the garbage collector tracks, so no collection runs inside the call); its size."""
    return len(pickle.dumps(layer.view(-1).tolist(), pickle.HIGHEST_PROTOCOL))


class PrefillKV:
    """One gap target: the ``prefill`` thread owns the model, the KV pool, the Mooncake link and
    the sender thread; calling the target runs one iteration there and waits for it."""

    def __init__(
        self, sender: str = "none", threads: int = 1, cpus: int = 0, tokens: int = 1024,
        layers: int = 4, hidden: int = 128, kv_heads: int = 2, page_table: int = 6000, pickles_per_layer: int = 6,
        zlib_level: int = 6, bulk_mib: int = 64, on_caller: bool = False, thread_per: str = "target",
        seed: int = 0, stage: str = "token",
    ) -> None:
        if sender not in SENDERS:
            raise ValueError(f"sender {sender!r}: use one of {', '.join(SENDERS)}")
        if stage not in STAGES:
            raise ValueError(f"stage {stage!r}: use one of {', '.join(STAGES)}")
        self.stage = stage
        self.staging = torch.empty(0)  # the "staged" sender's registered buffer, laid out by slots
        self.slots = torch.empty(0, dtype=torch.long)
        self.stage_s = self.send_s = 0.0  # the "staged" sender's time in this iteration
        self.sender = sender
        self.settings: dict[str, int] = {"threads": threads, "cpus": cpus, "tokens": tokens, "layers": layers,
                         "hidden": hidden, "kv_heads": kv_heads, "seed": seed, "bulk_mib": bulk_mib}
        self.page_table = [{"layer": 0, "page": i, "offset": i * 4096, "tokens": list(range(8)),
                            "id": f"page-{i}"} for i in range(page_table)]
        self.pickles_per_layer = pickles_per_layer
        self.zlib_level = zlib_level
        self.link: MooncakeLink | None = None
        self.transfer_path: str | None = "mooncake" if sender != "none" else None
        self.calls: queue.Queue[Callable[[], Any] | None] = queue.Queue()
        self.results: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self.jobs: queue.Queue[int | None] = queue.Queue()
        self.done: queue.Queue[float | BaseException] = queue.Queue()
        self.sender_thread: threading.Thread | None = None
        # Set by the prefill thread in _set_up (transformers' modules are untyped: Any).
        self.model: Any = None
        self.prompt = torch.empty(0)
        self.pool = torch.empty(0)
        self.layer_bytes = 0
        self.bulk: torch.Tensor | None = None
        self.on_caller = on_caller
        if thread_per not in THREAD_PER:
            raise ValueError(f"thread_per {thread_per!r}: use one of {', '.join(THREAD_PER)}")
        self.thread_per = thread_per
        self.serializers: ThreadPoolExecutor | None = None  # thread_per="pool"
        self.layer_senders: list[threading.Thread] = []
        self.layer_s = [0.0] * layers  # each layer's compute time in this iteration (the "sleep" sender's wait)
        self.layer_done = 0.0
        self.pinned = False
        self.thread: threading.Thread | None = None
        if on_caller:
            self._set_up()
        else:
            self.thread = threading.Thread(target=self._serve, name=PREFILL_THREAD, daemon=True)
            self.thread.start()
            self._wait()  # the set-up, or its error

    # ---- the prefill thread -------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            self._set_up()
        except BaseException as exc:
            self.results.put((False, exc))
            return
        self.results.put((True, None))
        while True:
            call = self.calls.get()
            if call is None:
                return
            try:
                self.results.put((True, call()))
            except BaseException as exc:  # handed to the caller, which raises it
                self.results.put((False, exc))

    def _set_up(self) -> None:
        from hf_models import causal_lm

        cpus, hidden, tokens = (int(self.settings[k]) for k in ("cpus", "hidden", "tokens"))
        if cpus > 0:  # this thread only; the threads it starts below inherit the mask
            pin_this_thread(cpus)
            self.pinned = True
        torch.set_num_threads(self.settings["threads"])
        seed = self.settings["seed"]
        self.model = causal_lm("llama", seed, layers=self.settings["layers"], hidden_size=hidden,
                               intermediate_size=2 * hidden, num_key_value_heads=self.settings["kv_heads"])
        generator = torch.Generator().manual_seed(seed + 1)
        self.prompt = torch.randint(0, 512, (1, tokens), generator=generator)
        config = self.model.config
        kv_width = int(config.num_key_value_heads) * (hidden // int(config.num_attention_heads))
        self.pool = torch.zeros(self.settings["layers"], 2, tokens, kv_width)
        self.layer_bytes = 2 * tokens * kv_width * 4
        self.bulk = torch.zeros(self.settings["bulk_mib"] * 1024 * 1024 // 4) if self.sender in ONE_WRITE else None
        if self.sender == "staged":  # the page table: token t goes to slot slots[t]
            self.slots = torch.randperm(tokens, generator=generator)
            self.staging = torch.zeros(self.settings["layers"], tokens, 2, kv_width)
        if self.sender != "none":
            self.link = MooncakeLink(self.bulk if self.bulk is not None else
                                     self.staging if self.sender == "staged" else self.pool)
        if self.sender in (*PER_LAYER, "staged"):
            for index, layer in enumerate(self.model.model.layers):
                layer.self_attn.k_proj.register_forward_hook(self._hook(index, 0))
                layer.self_attn.v_proj.register_forward_hook(self._hook(index, 1))
            if self.thread_per == "target":
                self.sender_thread = threading.Thread(target=self._send_loop, name=SENDER_THREAD, daemon=True)
                self.sender_thread.start()
            elif self.thread_per == "pool":  # started here, so its threads inherit this thread's CPU mask
                self.serializers = ThreadPoolExecutor(POOL_WORKERS, thread_name_prefix=SERIALIZER_PREFIX)
                for started in [self.serializers.submit(time.sleep, 0.01) for _ in range(POOL_WORKERS)]:
                    started.result(timeout=CALL_TIMEOUT_S)

    def _hook(self, index: int, part: int) -> Any:
        """Keep K (``part`` 0) or V (1) of layer ``index``; once V is in, send the layer."""

        def hook(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
            self.pool[index, part].copy_(output[0])
            if part == 1:  # the layer's compute time: since the previous layer's V (or the iteration's start)
                now = time.perf_counter()
                self.layer_s[index], self.layer_done = now - self.layer_done, now
            if part == 1 and self.sender == "staged":
                self._stage_layer(index)
            elif part == 1 and self.serializers is not None:
                self.serializers.submit(self._send_layer, index)
            elif part == 1 and self.thread_per == "layer":
                sender = threading.Thread(target=self._send_layer, args=(index,), daemon=True)
                sender.start()  # unnamed: "Thread-N (_send_layer)", joined at the iteration's end
                self.layer_senders.append(sender)
            elif part == 1:
                self.jobs.put(index)

        return hook

    def _iteration(self) -> dict[str, float]:
        started = time.perf_counter()
        self.layer_done = started
        sender: threading.Thread | None = None
        if self.thread_per == "iteration" and self.sender in PER_LAYER:
            # A sender for this iteration only, started unnamed (Python calls it
            # "Thread-N (_send_loop)") and joined once its layers are out.
            sender = threading.Thread(target=self._send_loop, daemon=True)
            sender.start()
        with torch.no_grad():
            self.model(self.prompt)
        prefill_done = time.perf_counter()
        phases = {"prefill_s": prefill_done - started}
        if self.link is None:
            return phases
        if self.sender == "staged":
            phases["prefill_s"] -= self.stage_s + self.send_s
            phases.update(stage_s=self.stage_s, send_s=self.send_s)
            self.stage_s = self.send_s = 0.0
            return phases
        if self.sender == "sync":
            self.link.write(0, self.link.nbytes)  # transfer_sync_write returns once the bytes arrived
            phases["send_s"] = time.perf_counter() - prefill_done
            phases["send_bytes"] = float(self.link.nbytes)
            return phases
        busy_s = 0.0
        if self.bulk is not None:
            self.link.write(0, self.link.nbytes)
            busy_s = time.perf_counter() - prefill_done
            moved = self.link.nbytes
        else:
            for _ in range(len(self.model.model.layers)):
                result = self.done.get(timeout=CALL_TIMEOUT_S)
                if isinstance(result, BaseException):
                    raise RuntimeError(f"the KV sender failed: {result}") from result
                busy_s += result
            moved = self.pool.numel() * 4
        if sender is not None:
            self.jobs.put(None)
            sender.join(timeout=CALL_TIMEOUT_S)
        for layer_sender in self.layer_senders:
            layer_sender.join(timeout=CALL_TIMEOUT_S)
        self.layer_senders.clear()
        phases["kv_wait_s"] = time.perf_counter() - prefill_done
        phases["transfer_busy_s"] = busy_s
        phases["kv_bytes"] = float(moved)
        return phases

    def _stage_layer(self, index: int) -> None:
        """Stage layer ``index`` into its slots of the registered buffer and write it, on the
        prefill thread, before the prefill goes on."""
        assert self.link is not None
        started = time.perf_counter()
        layer, staging = self.pool[index], self.staging[index]
        if self.stage == "token":
            for token, slot in enumerate(self.slots.tolist()):
                staging[slot, 0].copy_(layer[0, token])
                staging[slot, 1].copy_(layer[1, token])
        else:
            staging.index_copy_(0, self.slots, layer.transpose(0, 1))
        staged = time.perf_counter()
        self.link.write(index * self.layer_bytes, self.layer_bytes)
        self.stage_s += staged - started
        self.send_s += time.perf_counter() - staged

    # ---- the sender thread --------------------------------------------------------------------

    def _send_loop(self) -> None:
        while True:
            index = self.jobs.get()
            if index is None:
                return
            self._send_layer(index)

    def _send_layer(self, index: int) -> None:
        assert self.link is not None
        try:
            started = time.perf_counter()
            if self.sender == "pickle":
                for _ in range(self.pickles_per_layer):
                    pickle.dumps(self.page_table, pickle.HIGHEST_PROTOCOL)
            elif self.sender == "sleep":
                time.sleep(ACK_PER_LAYER * self.layer_s[index])  # an acknowledgement round trip per layer
            elif self.sender == "tolist":
                _pickle_tolist(self.pool[index])
            elif self.sender == "clone":
                self.pool[index].clone()
            elif self.sender == "zlib":
                zlib.compress(self.pool[index].numpy().tobytes(), self.zlib_level)
            self.link.write(index * self.layer_bytes, self.layer_bytes)
            self.done.put(time.perf_counter() - started)
        except BaseException as exc:  # reported to the iteration, which raises it
            self.done.put(exc)

    # ---- the caller's side --------------------------------------------------------------------

    def _wait(self) -> Any:
        try:
            ok, value = self.results.get(timeout=CALL_TIMEOUT_S)
        except queue.Empty:
            raise TimeoutError(f"the prefill thread did not answer within {CALL_TIMEOUT_S:g} s") from None
        if not ok:
            raise RuntimeError(f"the prefill thread failed: {type(value).__name__}: {value}") from value
        return value

    def _on_prefill_thread(self, call: Callable[[], Any]) -> Any:
        if self.thread is None:
            return call()
        if not self.thread.is_alive():
            raise RuntimeError("the prefill thread is gone (set-up failed or closed)")
        self.calls.put(call)
        return self._wait()

    def __call__(self) -> dict[str, float]:
        result: dict[str, float] = self._on_prefill_thread(self._iteration)
        return result

    def measure_ceiling(self) -> float:
        """Bytes per second of one write of the whole registered buffer, nothing else running."""
        if self.link is None:
            return 0.0
        link = self.link

        def measure() -> float:
            link.write(0, link.nbytes)
            started = time.perf_counter()
            link.write(0, link.nbytes)
            return link.nbytes / (time.perf_counter() - started)

        rate: float = self._on_prefill_thread(measure)
        return rate

    def measure_page_rate(self) -> float:
        """Bytes per second of the iteration's writes (one per layer, or the bulk write), alone."""
        if self.link is None:
            return 0.0
        if self.bulk is not None:
            return self.measure_ceiling()
        link = self.link

        def measure() -> float:
            started = time.perf_counter()
            for index in range(self.pool.shape[0]):
                link.write(index * self.layer_bytes, self.layer_bytes)
            return self.pool.numel() * 4 / (time.perf_counter() - started)

        rate: float = self._on_prefill_thread(measure)
        return rate

    def describe(self) -> dict[str, Any]:
        return {"transfer_path": self.transfer_path, "sender": self.sender, "thread_per": self.thread_per,
                **self.settings}

    def close(self) -> None:
        if self.sender_thread is not None:
            self.jobs.put(None)
            self.sender_thread.join(timeout=5)
        if self.serializers is not None:
            self.serializers.shutdown(wait=True)
            self.serializers = None
        if self.thread is not None and self.thread.is_alive():
            self.calls.put(None)
            self.thread.join(timeout=5)
        if self.link is not None:
            self.link.close()
            self.link = None
        if self.on_caller and self.pinned:
            unpin_this_thread()
            self.pinned = False


def prefill(**args: Any) -> PrefillKV:
    """gap target factory: ``PrefillKV(**args)`` (``sender``, ``threads``, ``cpus``, sizes)."""
    return PrefillKV(**args)
