"""One invocation: a run from its id to its last artifact, the same for every surface.

Each probe command, ``glmfb run``, ``glmfb bisect`` and their agent-server tools do the same
three things around their own work: :func:`begin` (the run id, the run folder, the gate's
pointer, before anything can fail), the work (probes, a suite, a bisection), then
:meth:`Invocation.finish`, which writes, in this order:

1. ``run.json``, with the run's environment, and ``LATEST`` pointed at it again (code the run
   ran may have rewritten it; :mod:`glmfb.core.runs`);
2. ``junit.xml`` (the default gate policy);
3. the verdicts into the history store, bounded in time by the store; a store that cannot be
   written is a warning naming it, never a failed run. A shard of a suite records nothing
   (the gate that takes the shards as one run does), and keeps each verdict's origin in its
   run instead; a bisection records nothing (its verdict is about a range of commits, not
   one measurement of one commit);
4. ``report.html``, with the history of the run's verdicts.

A signal (a second Ctrl-C, SIGTERM) while steps 2-4 are under way stops them: ``run.json`` is
whole, and :class:`Finished` says what was written and what was not. Nothing here prints; the
surface renders :class:`Finished` (its warnings, its notes) and exits with the run's code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.contract.clock import new_run_id, utc_now
from glmfb.contract.verdict import Run, Shard, Verdict
from glmfb.core.runs import JUNIT_FILE, REPORT_FILE, RUN_FILE, end_run, start_run, writing

if TYPE_CHECKING:
    from glmfb.workflows.history.record import Origin

Origins = Callable[[], Mapping[str, "Origin"]]


@dataclass(frozen=True)
class Finished:
    """What :meth:`Invocation.finish` left: the run, the files written (names in the run
    folder, in order), those not written because a signal stopped the writing, and warnings
    (one line each: a history store that failed)."""

    run: Run
    run_file: Path
    written: tuple[str, ...]
    not_written: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    stopped_by: str | None = None  # the signal that stopped the writing (SIGINT, SIGTERM)

    def summary(self) -> str:
        """One line for the person: where the run went, and what was not written."""
        folder = self.run_file.parent
        text = f"run written to {self.run_file}"
        others = [name for name in self.written if name != RUN_FILE]
        if others:
            text += f" ({', '.join(others)} beside it)"
        if self.not_written:
            text += (f"; interrupted ({self.stopped_by}) while writing, so {', '.join(self.not_written)} "
                     f"{'was' if len(self.not_written) == 1 else 'were'} not written")
            if REPORT_FILE in self.not_written:
                text += f" (glmfb report {folder / RUN_FILE} draws the report)"
        return text


@dataclass(frozen=True)
class Invocation:
    """A run under way: its id, its folder, when it started."""

    out: Path
    run_id: str
    report_dir: Path
    started: str

    @property
    def run_file(self) -> Path:
        return self.report_dir / RUN_FILE

    def finish(self, verdicts: Sequence[Verdict], *, interrupted: bool = False, history: str | None = None,
               origins: Origins | None = None, shard: Shard | None = None,
               env: Mapping[str, Any] | None = None) -> Finished:
        """Write the run's artifacts (see the module docstring) and say what was written.
        ``history`` is the store's URL (None: record nothing); ``origins`` gives each verdict's
        history origin by name (None: the run records nothing in the history, as a bisection);
        ``env`` the run's environment (default: this machine's fingerprint)."""
        from glmfb.core.env import fingerprint
        from glmfb.core.io import write_json_atomic

        if shard is not None and shard.count > 1 and origins is not None:
            shard = dataclasses.replace(shard, origins={name: o.to_dict() for name, o in origins().items()})
            origins = None  # the gate records the shards as one run
        run = Run(id=self.run_id, started=self.started, finished=utc_now(), verdicts=tuple(verdicts),
                  env=dict(env) if env is not None else fingerprint(), interrupted=interrupted, shard=shard)
        with writing(self.run_file, "write"):
            write_json_atomic(self.run_file, run.to_dict())
        end_run(self.out, self.run_id)
        written: list[str] = [RUN_FILE]
        warnings: list[str] = []
        steps: list[tuple[str | None, Callable[[], None]]] = [
            (JUNIT_FILE, lambda: self._junit(run)),
            (None, lambda: self._record(history, run, origins, warnings)),
            (REPORT_FILE, lambda: self._report(run, history if origins is not None else None, warnings)),
        ]
        for index, (name, step) in enumerate(steps):
            try:
                step()
            except KeyboardInterrupt as exc:  # a second Ctrl-C, a SIGTERM: stop writing, keep run.json
                left = tuple(n for n, _ in steps[index:] if n is not None)
                return Finished(run, self.run_file, tuple(written), left, tuple(warnings),
                                getattr(exc, "signal_name", "SIGINT"))
            if name is not None:
                written.append(name)
        return Finished(run, self.run_file, tuple(written), (), tuple(warnings))

    def _junit(self, run: Run) -> None:
        from glmfb.core.io import write_text_atomic
        from glmfb.workflows.gate import evaluate
        from glmfb.workflows.report.junit import render_junit

        write_text_atomic(self.report_dir / JUNIT_FILE, render_junit(evaluate(run)))

    def _record(self, history: str | None, run: Run, origins: Origins | None, warnings: list[str]) -> None:
        if history is None or origins is None:
            return
        from glmfb.workflows.history.record import record_or_warn

        warning = record_or_warn(history, run, origins, self.report_dir)
        if warning is not None:
            warnings.append(warning)

    def _report(self, run: Run, history: str | None, warnings: list[str]) -> None:
        """report.html, with the series of ``history`` (None: none) for the run's verdicts."""
        from glmfb.workflows.report.html import write_html

        series: list[dict[str, Any]] = []
        if history is not None:
            from glmfb.workflows.history.store import describe

            try:
                from glmfb.workflows.history.series import history_of_run

                series = history_of_run(history, run.id)
            except Exception as exc:  # the report is written whatever the store does
                warnings.append(f"the report shows no history from {describe(history)}: {exc}")
        write_html(run, self.report_dir, history=series)


def begin(out: Path, *, run_id: str | None = None) -> Invocation:
    """Start an invocation in ``out``: the gate's pointer moves before anything can fail, bad
    input included (:func:`glmfb.core.runs.start_run`)."""
    run_id = run_id or new_run_id()
    report_dir = start_run(out, run_id)
    return Invocation(out=out, run_id=run_id, report_dir=report_dir, started=utc_now())
