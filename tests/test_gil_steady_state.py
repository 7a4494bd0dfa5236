"""The target form samples the steady state: a set-up that hogs the GIL is not blamed."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run

from glmfb.gil import GilConfig
from glmfb.targets import Target
from glmfb.verdict import Status

pytestmark = pytest.mark.slow  # a real trace of a child process

TARGET = '''
import ctypes
import threading
import time

def make(setup_ms=1500):
    libc = ctypes.PyDLL(None)  # keeps the GIL during the call
    ticker = threading.Thread(target=lambda: [time.sleep(0.001) for _ in iter(int, 1)], daemon=True, name="ticker")
    ticker.start()
    libc.usleep(int(setup_ms * 1000))  # set-up that starves every other thread
    return lambda: time.sleep(0.01)  # the steady state releases the GIL
'''


def test_gil_hogging_setup_is_left_out_of_the_verdict(tmp_path: Path) -> None:
    file = tmp_path / "setup_hog.py"
    file.write_text(TARGET)
    verdict = run("gil",
        GilConfig(name="setup-hog", target=Target(f"{file}:make"), duration_s=2.0),
        tmp_path / "out",
    )
    assert verdict.status is Status.PASS, verdict.why
    starvation = next(e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "starvation")
    assert starvation["max_ms"] < 1000  # the 1.5 s set-up stall is not in the samples
    assert (tmp_path / "out" / "setup-hog" / "target-ready").is_file()
