"""The child process of the target form: build the target's callable, call it in a loop.

``python -m glmfb.gil.target_loop --target REF --args JSON --duration S [--base-dir DIR]``.
Bad targets print one line on stderr and exit 3 (glmfb turns that into an error verdict).

Once the callable is built and has run once (imports, allocation and lazy set-up are done),
the runner writes its ``time.monotonic()`` to the file named by ``$GLMFB_GIL_READY_FILE``:
glmfb samples from then on, so the verdict describes the steady state, not the start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

READY_ENV = "GLMFB_GIL_READY_FILE"
RUN_MARGIN_S = 2.0


def signal_ready(path: str | None) -> None:
    """Write the monotonic time to ``path`` in one rename (the reader never sees half)."""
    if not path:
        return
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(repr(time.monotonic()))
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="glmfb.gil.target_loop")
    parser.add_argument("--target", required=True)
    parser.add_argument("--args", default="{}")
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--base-dir", default=None)
    options = parser.parse_args(argv)

    from glmfb.contract.errors import GlmfbError
    from glmfb.core.targets import Target

    try:
        target = Target(
            options.target,
            json.loads(options.args),
            Path(options.base_dir) if options.base_dir else None,
        )
        factory = target.load()
        work = factory(**target.args)
    except GlmfbError as exc:
        sys.stderr.write(f"glmfb-runner: error: {exc}\n")
        return 3
    except (Exception, SystemExit) as exc:
        sys.stderr.write(
            f"glmfb-runner: error: the factory {options.target} raised {type(exc).__name__}: {exc}\n"
        )
        return 3
    if not callable(work):
        sys.stderr.write(
            f"glmfb-runner: error: {options.target} returned a {type(work).__name__}, "
            "not a zero-argument callable\n"
        )
        return 3
    try:
        work()  # warm-up: the first call often builds caches, threads and connections
    except (Exception, SystemExit) as exc:
        sys.stderr.write(
            f"glmfb-runner: error: the first call raised {type(exc).__name__}: {exc}\n"
        )
        return 3
    signal_ready(os.environ.get(READY_ENV))
    # glmfb samples for --duration from the ready signal and stops this process then; the
    # margin keeps the loop running through the whole window (no exit inside it).
    deadline = time.perf_counter() + options.duration + RUN_MARGIN_S
    calls = 0
    while time.perf_counter() < deadline:
        work()
        calls += 1
    sys.stderr.write(f"glmfb-runner: {calls} calls in {options.duration:g} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
