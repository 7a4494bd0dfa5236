"""The frozen configuration of one ``glmfb gil`` probe."""

from __future__ import annotations

from dataclasses import dataclass, field

from glmfb.errors import UsageError
from glmfb.options import BOOL, HERTZ, MILLISECONDS, POSITIVE_INT, SECONDS, check_declared, option
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
    pid: int | None = option(None, POSITIVE_INT, "Attach to a running process instead (no heartbeat then).",
                             toml=False)
    duration_s: float = option(DEFAULT_DURATION_S, SECONDS, "Time to sample; a program still running then is stopped.",
                               key="duration")
    rate_hz: float = option(DEFAULT_RATE_HZ, HERTZ, "GIL-holder samples per second (py-spy --nonblocking).",
                            key="rate")
    starvation_p99_ms: float = option(DEFAULT_STARVATION_P99_MS, MILLISECONDS,
                                      "Fail when a thread's p99 wake-up lateness exceeds this.", key="starvation_p99")
    native: bool = option(True, BOOL, "A second py-spy with --native: native frames and the active/idle split.")
    native_rate_hz: float = option(DEFAULT_NATIVE_RATE_HZ, HERTZ,
                                   "Samples per second of the --native py-spy (it pauses the program per sample).",
                                   key="native_rate")
    trace: bool = option(False, BOOL, "Also record a viztracer trace and rank what overlaps starved slices.")
    use_pyspy: bool = option(True, BOOL, "Sample the GIL holder with py-spy.", key="pyspy")
    heartbeat: bool = True
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = field(default=())
    min_holder_share: float = 0.05  # a holder must hold the GIL in this share of sample instants
    setup_timeout_s: float = option(60.0, SECONDS, "Target form: longest wait for imports, the factory, a warm-up call.",
                                    key="setup_timeout")

    def __post_init__(self) -> None:
        check_declared(self)
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
            raise UsageError(f"--rate must be between 1 and 10000 Hz, got {self.rate_hz:g}")
        if not 1 <= self.native_rate_hz <= 10_000:
            raise UsageError(f"--native-rate must be between 1 and 10000 Hz, got {self.native_rate_hz:g}")
        if not self.starvation_p99_ms > 0:
            raise UsageError(f"the starvation threshold must be positive, got {self.starvation_p99_ms} ms")
        if not self.setup_timeout_s > 0:
            raise UsageError(f"the setup timeout must be positive, got {self.setup_timeout_s} s")
        if self.pid is not None and self.pid <= 0:
            raise UsageError(f"--pid must be a positive process id, got {self.pid}")
