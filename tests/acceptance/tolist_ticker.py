"""A program run as ``glmfb gil -- python ./tolist_ticker.py``: it imports torch (seconds of
imports and extension loading: dlopen of torch's libraries, with the GIL held, under
``import torch``), then a worker thread turns a large tensor into Python lists with
``Tensor.tolist`` (one long C++ call that keeps the GIL) beside a thread that wants to wake every
millisecond. ``--chunk N`` converts the tensor ``N`` elements at a time instead, with a pause of
``--pause-ms`` after each chunk (the clean twin: each call is short, and the worker leaves the
GIL between them).

    python tolist_ticker.py [--size 2000000] [--chunk 0] [--pause-ms 1] [--duration 30]
"""

from __future__ import annotations

import argparse
import threading
import time

import torch


def tolist_loop(tensor: torch.Tensor, chunk: int, pause_s: float, stop: threading.Event) -> None:
    while not stop.is_set():
        if chunk <= 0:
            tensor.tolist()
        else:
            for start in range(0, tensor.numel(), chunk):
                tensor[start:start + chunk].tolist()
                time.sleep(pause_s)
        time.sleep(0.01)


def ticker(stop: threading.Event) -> None:
    late: list[float] = []
    while not stop.is_set():
        due = time.monotonic() + 0.001
        time.sleep(0.001)
        late.append(time.monotonic() - due)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=2_000_000)
    parser.add_argument("--chunk", type=int, default=0)
    parser.add_argument("--pause-ms", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=30.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tensor = torch.randn(args.size)
    stop = threading.Event()
    threads = [threading.Thread(target=tolist_loop, args=(tensor, args.chunk, args.pause_ms / 1e3, stop), name="tolist-worker"),
               threading.Thread(target=ticker, args=(stop,), name="ticker")]
    for thread in threads:
        thread.start()
    time.sleep(args.duration)
    stop.set()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
