"""The frozen configuration of one ``glmfb gil`` probe."""

from __future__ import annotations

from dataclasses import dataclass, field

from glmfb.errors import UsageError
from glmfb.targets import Target

DEFAULT_RATE_HZ = 100
DEFAULT_NATIVE_RATE_HZ = 10
DEFAULT_DURATION_S = 5.0
# Twice CPython's default switch interval (5 ms): a thread that wants the GIL beside a busy
# pure-Python thread already waits up to one interval, so only more than that is starvation.
DEFAULT_STARVATION_P99_MS = 10.0
HEARTBEAT_THREAD = "glmfb-heartbeat"


@dataclass(frozen=True)
class GilConfig:
    """What to trace and how.

    Give exactly one of ``command`` (a command line that starts a Python program), ``target``
    (a :class:`~glmfb.targets.Target` whose factory returns a zero-argument callable, called
    in a loop in a child process for ``duration_s``) or ``pid`` (attach to a running process;
    no heartbeat then, since injecting one needs the process to start under glmfb).
    """

    name: str = "gil"
    command: tuple[str, ...] = ()
    target: Target | None = None
    pid: int | None = None
    duration_s: float = DEFAULT_DURATION_S
    rate_hz: int = DEFAULT_RATE_HZ
    starvation_p99_ms: float = DEFAULT_STARVATION_P99_MS
    native: bool = True  # a second py-spy with --native: the holder's native frame, the idle split
    native_rate_hz: int = (
        DEFAULT_NATIVE_RATE_HZ  # --native pauses the program per sample: keep it low
    )
    trace: bool = False  # also record a viztracer trace and rank overlapping functions
    use_pyspy: bool = True  # False: heartbeat (and trace) only, as when py-spy is missing
    heartbeat: bool = True
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = field(default=())
    min_holder_share: float = 0.05  # a holder must hold the GIL in this share of sample instants
    setup_timeout_s: float = (
        60.0  # target form: longest wait for imports, the factory, a warm-up call
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(str(part) for part in self.command))
        given = [self.command != (), self.target is not None, self.pid is not None]
        if sum(given) != 1:
            raise UsageError(
                "glmfb gil needs exactly one of a command, a target or --pid",
                "glmfb gil -- python prog.py   |   glmfb gil --target file.py:make   |   glmfb gil --pid 1234",
            )
        if not self.duration_s > 0:
            raise UsageError(f"--duration must be positive, got {self.duration_s}")
        if not 1 <= self.rate_hz <= 10_000:
            raise UsageError(f"--rate must be between 1 and 10000 Hz, got {self.rate_hz}")
        if not 1 <= self.native_rate_hz <= 10_000:
            raise UsageError(
                f"--native-rate must be between 1 and 10000 Hz, got {self.native_rate_hz}"
            )
        if not self.starvation_p99_ms > 0:
            raise UsageError(
                f"the starvation threshold must be positive, got {self.starvation_p99_ms} ms"
            )
        if not self.setup_timeout_s > 0:
            raise UsageError(f"the setup timeout must be positive, got {self.setup_timeout_s} s")
        if self.pid is not None and self.pid <= 0:
            raise UsageError(f"--pid must be a positive process id, got {self.pid}")


def parse_milliseconds(text: str) -> float:
    """``"10"``, ``"10ms"``, ``"0.01s"`` -> 10.0 (milliseconds)."""
    raw = text.strip().lower()
    scale = 1.0
    if raw.endswith("ms"):
        raw = raw[:-2]
    elif raw.endswith("s"):
        raw, scale = raw[:-1], 1e3
    try:
        value = float(raw) * scale
    except ValueError:
        raise UsageError(
            f"{text!r} is not a duration", "write it as 10ms, 10 (ms) or 0.01s"
        ) from None
    if not value > 0:
        raise UsageError(f"the starvation threshold must be positive, got {text!r}")
    return value
