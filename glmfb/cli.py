"""The ``glmfb`` command line: thin commands and one error boundary.

Every :class:`~glmfb.errors.GlmfbError` becomes one line on stderr and its exit code; click's
usage errors become one line and exit 2; anything unexpected becomes one line and exit 3
(``GLMFB_DEBUG=1`` shows the traceback). Commands never compute: they call an engine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from glmfb.commands.bisect import bisect_command
from glmfb.commands.common import (
    Command,
    console,
    dump_json,
    emit_run,
    folder_size,
    history_url,
    interactive,
    parse_timeout,
    record_shards,
    run_history,
    show_finished,
)
from glmfb.errors import GlmfbError, UsageError
from glmfb.probe import TIMEOUT
from glmfb.report.text import status_label
from glmfb.verdict import ExitCode


def _fail(message: str, code: int) -> typer.Exit:
    sys.stderr.write(f"glmfb: error: {message}\n")
    sys.stderr.flush()
    return typer.Exit(code)


def _usage_error_types() -> tuple[type[BaseException], ...]:
    """click's UsageError, from the click that typer uses (recent typer vendors its own)."""
    for module_name in ("typer._click.exceptions", "click.exceptions"):
        try:
            module = __import__(module_name, fromlist=["UsageError"])
        except ImportError:
            continue
        return (module.UsageError,)
    return ()


_USAGE_ERRORS = _usage_error_types()


class _BoundaryGroup(TyperGroup):
    """The one place errors turn into exit codes; also where probe commands come from: one
    per registered probe kind, built when first asked for (so ``glmfb gate`` never imports a
    probe, and a probe installed by another package gets its command)."""

    def list_commands(self, ctx: Any) -> list[str]:
        from glmfb.probe import known_kinds, probe_commands

        names = [*super().list_commands(ctx), "mcp"]
        names += [kind for kind in known_kinds() if kind not in names]
        return names + [name for name in probe_commands() if name not in names]

    def get_command(self, ctx: Any, name: str) -> Any:
        command = super().get_command(ctx, name)
        if command is not None:
            return command
        if name == "mcp":  # glmfb.commands.mcp
            from glmfb.commands.mcp import register

            return _built(register, name)
        from glmfb.probe import known_kinds, probe_commands

        if name in known_kinds():
            return _probe_command(name)
        extra = probe_commands().get(name)  # a command a probe brings (diff's capture)
        if extra is None:
            return None
        from glmfb.commands.extra import register_command

        return _built(lambda holder: register_command(holder, extra), name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """The list of commands in ``glmfb --help``: a probe's line is its summary, read
        without building its command (which imports its config, and so the whole probe)."""
        from typer.core import TyperCommand

        from glmfb.probe import get_probe, known_kinds, probe_commands

        kinds = set(known_kinds())
        extras = probe_commands()
        listed = []
        for name in self.list_commands(ctx):
            command = super().get_command(ctx, name)  # the commands declared in this module
            if command is None and name in kinds:
                command = TyperCommand(name, help=get_probe(name).summary)
            elif command is None and name in extras:
                command = TyperCommand(name, help=extras[name].summary)
            elif command is None:
                command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                listed.append((name, command))
        if listed:
            limit = formatter.width - 6 - max(len(name) for name, _ in listed)
            with formatter.section("Commands"):
                formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in listed])

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except GlmfbError as exc:
            raise _fail(str(exc), int(exc.exit_code)) from None
        except _USAGE_ERRORS as exc:
            sub = getattr(ctx, "invoked_subcommand", None)
            command = f"glmfb {sub} --help" if sub else "glmfb --help"
            raise _fail(f"{exc.format_message()} (see {command})", int(ExitCode.USAGE)) from None  # type: ignore[attr-defined]
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt as exc:
            signal_name = getattr(exc, "signal_name", "SIGINT")
            raise _fail(f"interrupted ({signal_name}) before anything could be written",
                        143 if signal_name == "SIGTERM" else 130) from None
        except Exception as exc:
            if os.environ.get("GLMFB_DEBUG"):
                raise
            raise _fail(
                f"internal error: {type(exc).__name__}: {exc} (rerun with GLMFB_DEBUG=1 for the traceback)",
                int(ExitCode.HARNESS_ERROR),
            ) from None


JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="Print exactly one JSON document on stdout; human text goes to stderr."),
]
HistoryOpt = Annotated[
    str | None,
    typer.Option("--history", metavar="URL", help="The history store: sqlite:///PATH or "
                 "postgresql://USER@HOST:PORT/DB [default: $GLMFB_HISTORY, else sqlite:///<out>/history.sqlite]"),
]
NoHistoryOpt = Annotated[
    bool, typer.Option("--no-history", help="Do not record the verdicts in the history store."),
]

app = typer.Typer(
    cls=_BoundaryGroup,
    name="glmfb",
    help="Dense-feedback benchmarking and diagnostics: which layer regressed, where, and why.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: rich help formatting costs ~100 ms of start-up
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from glmfb import __version__

        sys.stdout.write(f"glmfb {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Dense-feedback benchmarking and diagnostics: which layer regressed, where, and why."""


@app.command("run", cls=Command)
def run_command(
    paths: Annotated[
        list[str] | None,
        typer.Argument(help="Probe definition files or folders (default: probes/)."),
    ] = None,
    as_json: JsonOpt = False,
    out: Annotated[Path, typer.Option("--out", help="Folder for reports/<run-id>/.")] = Path(
        "reports"
    ),
    select: Annotated[
        list[str] | None,
        typer.Option(
            "-k", "--select", help="Run only probes whose name matches (glob or substring)."
        ),
    ] = None,
    timeout: Annotated[
        str | None,
        typer.Option(TIMEOUT.flag, metavar=TIMEOUT.metavar,
                     help=f"{TIMEOUT.help} [default: a definition's timeout, else {TIMEOUT.show_default()}]"),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("-v", "--verbose", help="A panel for every verdict, not only those that need a look."),
    ] = False,
    shard: Annotated[
        str | None,
        typer.Option("--shard", metavar="K/N", help="Run only shard K of N (definitions split by name); "
                                                    "glmfb gate takes the N runs as one."),
    ] = None,
    history: HistoryOpt = None,
    no_history: NoHistoryOpt = False,
) -> None:
    """Run the probe definitions of a suite and write reports/<run-id>/run.json."""
    from glmfb import suite
    from glmfb.invocation import begin

    invocation = begin(out)  # the gate's pointer, before anything can fail (bad input included)
    run_id, report_dir = invocation.run_id, invocation.report_dir
    timeout_s = parse_timeout(timeout)
    store = history_url(history, out, no_history)
    search = paths or ["probes"]
    definitions = suite.selected(suite.load_definitions(suite.discover(search)), select or [], search)
    notes = console(stderr=True)
    part = None
    if shard is not None:
        from glmfb.shards import parse_shard

        total = len(definitions)
        definitions, part = suite.take_shard(definitions, *parse_shard(shard))
        notes.print(f"shard {part.label} of suite {part.suite}: {len(definitions)} of its {total} definitions")
    show_progress = interactive()

    if show_progress:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=notes,
            transient=True,
        )
        task = bar.add_task("probes", total=len(definitions))
        context = suite.SuiteContext(
            run_id, report_dir, on_progress=lambda m: bar.update(task, description=m), timeout_s=timeout_s,
        )
        with bar:
            run = suite.run_suite(
                definitions,
                context,
                on_start=lambda d: bar.update(task, description=f"{d.probe} {d.name}"),
                on_done=lambda d, v: bar.advance(task),
                shard=part,
            )
    else:
        context = suite.SuiteContext(run_id, report_dir, timeout_s=timeout_s)
        run = suite.run_suite(
            definitions,
            context,
            on_done=lambda d, v: notes.print(f"{status_label(v):>24}  {d.probe:<5} {d.name}"),
            shard=part,
        )
    from glmfb.history.record import suite_origins

    finished = invocation.finish(run.verdicts, interrupted=run.interrupted, shard=run.shard, env=run.env,
                                 history=store, origins=lambda: suite_origins(definitions))
    if part is not None and part.count > 1 and store is not None:
        notes.print(f"shard {part.label}: its verdicts go into the history when glmfb gate takes the "
                    f"{part.count} shards as one run")
    show_finished(finished)
    emit_run(finished.run, as_json, verbose=verbose, folder_size=folder_size(report_dir))


@app.command("gate", cls=Command)
def gate_command(
    source: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[RUN_JSON | RUN_DIR | -]...",
            help="A run or verdict JSON file, a run folder, or - for stdin (default: the latest run into --out); "
                 "several: the shards of one suite (glmfb run --shard K/N), gated as one run.",
        ),
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="The reports folder whose latest run to gate.")] = Path(
        "reports"
    ),
    policy: Annotated[Path | None, typer.Option("--policy", help="TOML policy file.")] = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML here.")] = None,
    summary: Annotated[
        Path | None,
        typer.Option(
            "--summary",
            help="Write a Markdown summary here (default: $GITHUB_STEP_SUMMARY when set, appended).",
        ),
    ] = None,
    history: Annotated[
        str | None,
        typer.Option("--history", metavar="URL", help="Where the shards of a suite are recorded as one run "
                     "[default: $GLMFB_HISTORY, else history.sqlite beside the first shard's run folder]"),
    ] = None,
    no_history: Annotated[bool, typer.Option("--no-history", help="Record nothing in the history.")] = False,
) -> None:
    """Turn a run (or one verdict, or every shard of a suite) into a CI exit code, a JUnit file and a summary."""
    from glmfb.gate import evaluate, load_policy
    from glmfb.io import write_text_atomic
    from glmfb.report.terminal import render_gate
    from glmfb.runs import latest_run
    from glmfb.shards import combine, describe, read_sources

    sources = read_sources(source or [str(latest_run(out))], typed=False)
    run = combine(sources)
    sys.stderr.write(f"glmfb gate: read {describe(sources)}\n")
    if len(sources) > 1:  # shards, which recorded nothing themselves: one run in the history
        record_shards(history_url(history, _shards_home(sources), no_history), run, sources)
    result = evaluate(run, load_policy(policy) if policy is not None else None)
    for warning in result.warnings:
        sys.stderr.write(f"glmfb: warning: {warning}\n")
    if junit is not None:
        from glmfb.report.junit import render_junit

        write_text_atomic(junit, render_junit(result))
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary is not None or step_summary:
        from glmfb.report.markdown import render_markdown

        text = render_markdown(result)
        if summary is not None:
            write_text_atomic(summary, text)
        elif step_summary:
            with open(step_summary, "a", encoding="utf-8") as handle:
                handle.write(text)
    console().print(render_gate(result))
    raise typer.Exit(int(result.exit_code))


@app.command("report", cls=Command)
def report_command(
    source: Annotated[
        list[str],
        typer.Argument(metavar="RUN_JSON...", help="A saved run.json (or a verdict, or a run folder); several: the "
                                                   "shards of one suite (glmfb run --shard K/N), as one page."),
    ],
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the page here (default: report.html beside RUN_JSON; "
                                                "for several shards, in the current folder).")
    ] = None,
    history: Annotated[
        str | None,
        typer.Option("--history", metavar="URL", help="The history store whose series the page draws [default: "
                     "$GLMFB_HISTORY, else history.sqlite beside the run folder, when there is one]"),
    ] = None,
    no_history: Annotated[bool, typer.Option("--no-history", help="Draw no history.")] = False,
) -> None:
    """Re-render report.html from a saved run (or from every shard of a suite)."""
    from glmfb.report.html import REPORT_NAME, write_html
    from glmfb.shards import combine, read_sources, verdict_folders

    sources = read_sources(source)
    run = combine(sources)
    whole = len(sources) == 1 and sources[0].folder is not None
    folder = sources[0].folder if whole else None
    target = out if out is not None else (folder or Path.cwd()) / REPORT_NAME
    series = run_history(history_url(history, _shards_home(sources), no_history), run.id) if len(sources) > 1 else [
        found for given in sources if given.folder is not None
        for found in run_history(history_url(history, given.folder.parent, no_history), given.run.id)]
    try:
        written = write_html(run, folder, target, folders=None if whole else verdict_folders(sources),
                             history=series)
    except OSError as exc:
        raise UsageError(f"cannot write {target}: {exc.strerror or exc}", "pass --out FILE in a writable folder") from None
    console(stderr=True).print(f"report written to {written}")


def _shards_home(sources: Any) -> Path:
    """Where the history of several shards is kept by default: the reports folder of the first
    shard's run folder (the current folder for runs read from files or stdin)."""
    folder = sources[0].folder
    return folder.parent if folder is not None else Path.cwd()


app.command("bisect", cls=Command)(bisect_command)


@app.command("history", cls=Command)
def history_command(
    patterns: Annotated[
        list[str] | None,
        typer.Argument(metavar="[PATTERN...]", help="Definition names to show (glob or substring, as glmfb run -k); "
                       "all when none."),
    ] = None,
    history: HistoryOpt = None,
    out: Annotated[Path, typer.Option("--out", help="The reports folder whose history.sqlite is the default store.")] = Path(
        "reports"
    ),
    all_machines: Annotated[
        bool, typer.Option("--all-machines", help="One series per definition and metric over every machine "
                           "(default: one per machine; machines are never mixed unless asked)."),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the glmfb.history/1 document on stdout (glmfb schema history)."),
    ] = False,
    csv: Annotated[
        Path | None, typer.Option("--csv", metavar="FILE", help="Also write every run of every series to FILE as CSV."),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 when a series' newest segment is worse than the segment before "
                           "it by more than --threshold, else 0."),
    ] = False,
    threshold: Annotated[
        str, typer.Option("--threshold", metavar="FRACTION", help="For --check: how much worse counts, 5% or 0.05 "
                          "(points of the baseline for a relative metric such as time_change, else a fraction of "
                          "the level before)."),
    ] = "5%",
) -> None:
    """The history of recorded verdicts: a series per definition, metric and machine, with its change points."""
    from glmfb.history.series import build_series, history_document
    from glmfb.history.store import chosen_url, describe, open_store
    from glmfb.units import OptionValueError, parse_fraction

    try:
        limit = parse_fraction(threshold)
    except OptionValueError as exc:
        raise UsageError(f"--threshold {threshold}: {exc}") from None
    url = chosen_url(history, out, os.environ)
    with open_store(url, create=False) as store:
        records = store.records()
    if not records:
        raise UsageError(f"the history {describe(url)} holds no verdicts", "glmfb run records every verdict it writes")
    chosen = patterns or []
    series = build_series(records, chosen, all_machines=all_machines)
    if not series:
        names = sorted({r.definition for r in records if r.value is not None})
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        raise UsageError(f"no series in the history {describe(url)} matches {' '.join(repr(p) for p in chosen)}"
                         if chosen else f"the history {describe(url)} holds no verdict with a metric value",
                         f"definitions with values: {shown}" if shown else "glmfb run records every verdict")
    document = history_document(series, store=describe(url), patterns=chosen, all_machines=all_machines,
                                threshold=limit if check else None)
    if csv is not None:
        from glmfb.history.render import write_history_csv

        rows = write_history_csv(document, csv)
        console(stderr=True).print(f"{rows} runs written to {csv}")
    if as_json:
        dump_json(document)
    else:
        from glmfb.history.render import render_history

        console().print(render_history(document))
    if check:
        regressed = document["regressed"]
        sys.stderr.write(f"glmfb history --check: {regressed} of {len(series)} series regressed by more than "
                         f"{limit:.1%} in their newest segment\n")
        raise typer.Exit(int(ExitCode.REGRESSION) if regressed else int(ExitCode.OK))


@app.command("schema", cls=Command)
def schema_command(
    document: Annotated[
        str, typer.Argument(metavar="[DOCUMENT]", help="verdict (verdict and run documents) or history "
                            "(glmfb history --json)."),
    ] = "verdict",
) -> None:
    """Print the JSON Schema (draft 2020-12) of verdict and run documents, or of the history document."""
    if document == "history":
        from glmfb.history.series import HISTORY_JSON_SCHEMA

        dump_json(HISTORY_JSON_SCHEMA)
        return
    if document != "verdict":
        raise UsageError(f"no schema for {document!r}", "give verdict or history")
    from glmfb.documents import json_schema

    dump_json(json_schema())


def _built(register: Any, name: str) -> Any:
    """The click command ``register(typer_app)`` adds, built on its own."""
    holder = typer.Typer(cls=TyperGroup, rich_markup_mode=None, add_completion=False,
                         context_settings={"help_option_names": ["-h", "--help"]})
    register(holder)
    holder.callback()(lambda: None)  # a group, so the command can be taken out of it
    group = typer.main.get_command(holder)
    return group.commands[name]  # type: ignore[attr-defined]


def _probe_command(kind: str) -> Any:
    """The click command of one probe kind, generated from its declarations."""
    from glmfb.commands.probes import register_probe
    from glmfb.probe import get_probe

    return _built(lambda holder: register_probe(holder, get_probe(kind)), kind)


def _on_sigterm(number: int, frame: Any) -> None:
    from glmfb.supervise import Interrupted

    raise Interrupted("SIGTERM")


def main() -> None:
    """Console-script entry point. SIGTERM (a cancelled CI job) is handled like Ctrl-C: every
    child process is stopped and what finished is kept."""
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)
    app(prog_name="glmfb")


if __name__ == "__main__":
    main()
