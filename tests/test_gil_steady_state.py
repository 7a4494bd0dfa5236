"""The target form samples the steady state: a set-up that hogs the GIL is not blamed."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run

from glmfb.contract.verdict import Status
from glmfb.core.targets import Target
from glmfb.gil import GilConfig

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


# A program whose start-up import computes for seconds between waits that release the GIL (as
# `import torch` loads its libraries through ctypes on a cold disk): sys.modules stands still
# while the import goes on. After it, a thread hogs the GIL: the planted bug.
SLOW_IMPORT = '''
import time

end = time.monotonic() + {import_s}
while time.monotonic() < end:
    sum(range(200_000))  # the import's own work, the GIL held
    time.sleep(0.02)  # a load that releases the GIL
'''

PROGRAM = '''
import ctypes
import threading
import time

import slow_start  # noqa: F401

libc = ctypes.PyDLL(None)
threading.Thread(target=lambda: [libc.usleep(50_000) for _ in iter(int, 1)], daemon=True, name="hog").start()
time.sleep(30)
'''


@pytest.mark.parametrize("import_s", [12.0, 0.5], ids=["still-importing", "imported"])
def test_a_window_that_ends_inside_the_start_up_imports_is_not_a_pass(tmp_path: Path, import_s: float) -> None:
    (tmp_path / "slow_start.py").write_text(SLOW_IMPORT.format(import_s=import_s))
    (tmp_path / "prog.py").write_text(PROGRAM)
    config = GilConfig(name="slow-start", command=("python", str(tmp_path / "prog.py")), duration_s=4.0)
    verdict = run("gil", config, tmp_path / "out")
    starvation = next(e for e in (x.to_dict() for x in verdict.evidence) if e["kind"] == "starvation")
    if import_s > config.duration_s:
        # Before the module-lock check the heartbeat took the import's quiet sys.modules for
        # settled imports, and the window passed without ever seeing the hog.
        assert verdict.status is Status.INCONCLUSIVE, verdict.why
        assert starvation["startup_settled"] is False
        assert verdict.why.startswith("No steady state was sampled: the program was still importing"), verdict.why
        assert "slow_start" in verdict.why or "prog.py" in verdict.why, verdict.why
        assert any(step.arguments.get("duration") == "30s" for step in verdict.next), verdict.next
    else:  # the twin: imports done in half a second, the hog is found
        assert starvation["startup_settled"] is True
        assert verdict.status is Status.FAIL, verdict.why
        assert verdict.where["thread"] == "hog", verdict.where
