"""The child process of a supervised probe run (see :mod:`glmfb.core.supervise`).

``python -m glmfb.core.child`` reads its job (JSON) on stdin (a warm worker's job process gets it
from :mod:`glmfb.core.zygote` and calls :func:`serve` on it), runs the probe through the host
boundary, and writes progress and the verdict as JSON lines to the pipe named by
``$GLMFB_RESULT_FD``; then it leaves with ``os._exit``, so a thread the target left running
cannot keep it alive. SIGTERM (glmfb stopping it) raises inside the probe, so the probe's own
clean-up (a traced program, a receiver process) runs before the parent's SIGKILL.

That handler is this process's alone: a process the target forks (a worker, a pool) gets
SIGTERM's default back, so glmfb stopping the tree ends it quietly, as it would end outside
glmfb, instead of unwinding the copy of the probe it was forked from into this module's code.
And when glmfb has stopped listening (a timeout, a cancellation: it closed its end of the pipe
before stopping the tree), there is no one to answer: the child leaves without a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from typing import Any


class Stopped(BaseException):
    """SIGTERM from the supervising glmfb: unwind, run the clean-up, answer if possible."""


def _on_sigterm(number: int, frame: Any) -> None:
    raise Stopped()


def _default_sigterm_after_fork() -> None:
    """In a process the target forks, give SIGTERM its default back. The fork copies glmfb's
    handler, so without this, glmfb stopping the tree made each such process raise
    :class:`Stopped` in its copy of the probe, unwind into :func:`main` and try to answer on the
    pipe glmfb had closed: a ``BrokenPipeError`` traceback per process in probe-stderr.txt that
    read as a crash of glmfb (or, with glmfb still listening, a second answer). A handler the
    target installed itself before forking is the target's business and is kept."""
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _leave_stopped() -> None:
    """glmfb closed its end of the pipe: it gave up on this process (a timeout, a cancellation)
    and is stopping the tree, so no answer can reach it. Flush what the target printed and end
    the way SIGTERM's default would, so glmfb reads "killed by signal 15 (SIGTERM)", the truth,
    instead of a ``BrokenPipeError`` traceback."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a stream the target closed or broke
            stream.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    os._exit(128 + signal.SIGTERM)  # only if the signal is blocked in this thread


def main() -> None:
    """``python -m glmfb.core.child``: the job on stdin."""
    serve(json.loads(sys.stdin.read()))


def serve(job: dict[str, Any]) -> None:
    """Run ``job`` and answer on the pipe named by ``$GLMFB_RESULT_FD``; never returns. The cold
    child's :func:`main` and a warm worker's job process (:mod:`glmfb.core.zygote`) both end here."""
    fd = int(os.environ["GLMFB_RESULT_FD"])
    os.set_inheritable(fd, False)  # a program the target execs (a daemon it forks) must not hold the pipe
    channel = os.fdopen(fd, "w", buffering=1, encoding="utf-8")
    os.environ.pop("GLMFB_RESULT_FD", None)  # the target's own children must not inherit it

    def send(message: dict[str, Any]) -> None:
        try:
            channel.write(json.dumps(message, allow_nan=False) + "\n")
            channel.flush()
        except BrokenPipeError:  # glmfb stopped listening, and its SIGTERM is on the way
            if "progress" in message:
                raise Stopped() from None  # unwind as on SIGTERM: the probe's own clean-up runs
            _leave_stopped()

    sys.path[:] = [p for p in job["sys_path"] if p]  # the parent's import path (installed probes)
    signal.signal(signal.SIGTERM, _on_sigterm)
    os.register_at_fork(after_in_child=_default_sigterm_after_fork)

    from pathlib import Path

    from glmfb.contract.errors import UsageError
    from glmfb.contract.verdict import Verdict
    from glmfb.core.host import run_probe
    from glmfb.core.probe import ProbeContext, get_probe
    from glmfb.core.supervise import decode
    from glmfb.core.targets import ImportFence

    if "call" in job:  # not a probe: a function of glmfb's (glmfb capture), run the same way
        _call(job, send)
    kind = job["kind"]
    name = kind
    try:
        probe = get_probe(kind)
        config = decode(job["config"])
        name = str(getattr(config, "name", kind))
        ctx = ProbeContext(
            run_id=job["run_id"], artifact_dir=Path(job["artifact_dir"]),
            progress=lambda message: send({"progress": message}),
            rules_files=tuple(Path(p) for p in job["rules_files"]),
            fence=ImportFence.from_dict(job["fence"]) if job.get("fence") else None,
        )
        verdict = run_probe(probe, config, ctx, usage_errors=job["usage_errors"])
    except UsageError as exc:
        send({"usage_error": str(exc)})
        os._exit(0)
    except Stopped:
        verdict = Verdict.harness_error(kind, name, f"glmfb {kind}: stopped by glmfb (SIGTERM) before it finished")
    except SystemExit as exc:  # sys.exit() in code the engine did not guard (an import, a thread)
        verdict = Verdict.harness_error(
            kind, name, f"glmfb {kind}: the target called sys.exit({exc.code!r}) while glmfb ran it",
            next=("a target must return, not exit; remove the sys.exit call from the code glmfb calls",),
        )
    send({"verdict": verdict.to_dict()})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _call(job: dict[str, Any], send: Any) -> None:
    """Run ``job["call"]`` (``module:function``) on the decoded config; answer its JSON result,
    or the GlmfbError it raised (message and exit code)."""
    from glmfb.contract.errors import GlmfbError
    from glmfb.core.supervise import _load_class, decode

    try:
        function = _load_class(job["call"])
        result = function(decode(job["config"]), lambda message: send({"progress": message}))
        send({"result": result})
    except GlmfbError as exc:
        send({"glmfb_error": str(exc), "exit_code": int(exc.exit_code)})
    except Stopped:
        send({"glmfb_error": "stopped by glmfb (SIGTERM) before it finished", "exit_code": 3})
    except (Exception, SystemExit) as exc:
        send({"glmfb_error": f"{job['call']} raised {type(exc).__name__}: {exc}", "exit_code": 3})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
