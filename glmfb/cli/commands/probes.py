"""Probe commands, generated: one ``glmfb <kind>`` per registered probe.

The command's arguments come from the probe's ``form`` (``BASELINE CANDIDATE``, or
``--target`` / ``-- COMMAND``) and its options from the declarations on its config type
(:mod:`glmfb.contract.options`), so a probe installed by another package gets a full command with no
code here. Every probe command also takes ``--arg``, ``--name``, ``--out``, ``--json``,
``--csv`` and ``--rules``. The body is thin: parse, build the config, run it through the host
boundary, show or dump the verdict, exit with its code.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from glmfb.cli.commands.common import (
    Command,
    FollowBudgetOpt,
    FollowCommandsOpt,
    FollowDepthOpt,
    FollowOpt,
    emit_verdict,
    follow_options,
    history_url,
    parse_timeout,
    progress_messages,
    show_finished,
)
from glmfb.contract.errors import UsageError
from glmfb.contract.options import OptionSpec, options_of, parse_given
from glmfb.core.probe import TIMEOUT, Probe, ProbeContext, ProbeForm, ProbeSpec, safe_component


def _option_parameter(spec: OptionSpec) -> inspect.Parameter:
    help_text = f"{spec.help} [default: {spec.show_default()}]"
    if spec.type.is_flag:
        key = spec.flag.removeprefix("--")
        annotation: Any = Annotated[bool | None, typer.Option(f"{spec.flag}/--no-{key}", help=help_text,
                                                              show_default=False)]
    elif spec.type.repeatable:
        annotation = Annotated[list[str] | None, typer.Option(spec.flag, metavar=spec.metavar, help=help_text,
                                                              show_default=False)]
    else:
        annotation = Annotated[str | None, typer.Option(spec.flag, metavar=spec.metavar, help=help_text,
                                                        show_default=False)]
    return inspect.Parameter(f"opt_{spec.attr}", inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=annotation)


def option_parameters(config_type: type) -> list[inspect.Parameter]:
    """typer parameters for the declared options of a config type (flags from the declaration)."""
    return [_option_parameter(spec) for spec in options_of(config_type) if spec.cli]


def given_options(config_type: type, values: dict[str, Any]) -> dict[str, Any]:
    """The parsed values of the options given on the command line (others keep defaults)."""
    specs = [spec for spec in options_of(config_type) if spec.cli]
    return parse_given(specs, {spec.attr: values.get(f"opt_{spec.attr}") for spec in specs})


def _param(name: str, annotation: Any, default: Any = None, kind: Any = inspect.Parameter.KEYWORD_ONLY) -> inspect.Parameter:
    return inspect.Parameter(name, kind, default=default, annotation=annotation)


def _common_parameters(probe: Probe) -> list[inspect.Parameter]:
    pos = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params: list[inspect.Parameter] = []
    if probe.form is ProbeForm.PAIR:
        params.append(_param("baseline", Annotated[str, typer.Argument(
            metavar="BASELINE", help="Baseline: a target (pkg.mod:attr or file.py:attr) or a saved result.")],
            inspect.Parameter.empty, pos))
        candidate_help = "Candidate: a target or a saved result."
        if probe.candidate_optional:
            params.append(_param("candidate", Annotated[str | None, typer.Argument(
                metavar="[CANDIDATE]", help=candidate_help + " May be omitted (see the probe's docs).")], None, pos))
        else:
            params.append(_param("candidate", Annotated[str, typer.Argument(
                metavar="CANDIDATE", help=candidate_help)], inspect.Parameter.empty, pos))
    else:
        if probe.accepts_command:
            params.append(_param("command", Annotated[list[str] | None, typer.Argument(
                metavar="[-- COMMAND [ARGS...]]", help="The program to run, after --.")], None, pos))
        params.append(_param("target", Annotated[str | None, typer.Option(
            "--target", metavar="TARGET", help="A Python target (file.py:factory or pkg.mod:factory).")]))
    params.append(_param("arg", Annotated[list[str] | None, typer.Option(
        "--arg", metavar="KEY=VALUE", help="Keyword argument for the target factory (JSON where it parses). Repeatable.")]))
    if probe.form is ProbeForm.PAIR:
        params.append(_param("baseline_arg", Annotated[list[str] | None, typer.Option(
            "--baseline-arg", metavar="KEY=VALUE", help="For the baseline only. Repeatable.")]))
        params.append(_param("candidate_arg", Annotated[list[str] | None, typer.Option(
            "--candidate-arg", metavar="KEY=VALUE", help="For the candidate only. Repeatable.")]))
    params.append(_param("name", Annotated[str | None, typer.Option(
        "--name", metavar="NAME", help="Name of the verdict (also its artifact folder).")]))
    params.append(_param("out", Annotated[Path | None, typer.Option(
        "--out", metavar="DIR", help="Report folder: run.json, report.html and the artifacts go to "
        "DIR/<run-id>/ (the artifacts in <name>/). [default: reports]")], None))
    params.append(_param("csv", Annotated[Path | None, typer.Option(
        "--csv", metavar="DIR", help="Also write the verdict's tables as CSV files into DIR.")]))
    params.append(_param("rules", Annotated[list[Path] | None, typer.Option(
        "--rules", metavar="FILE", help="A Python file defining RULES, tried before the built-in rules. Repeatable.")]))
    params.append(_param("timeout", Annotated[str | None, typer.Option(
        TIMEOUT.flag, metavar=TIMEOUT.metavar, help=f"{TIMEOUT.help} [default: {TIMEOUT.show_default()}]")]))
    params.append(_param("history", Annotated[str | None, typer.Option(
        "--history", metavar="URL", help="The history store: sqlite:///PATH or postgresql://USER@HOST:PORT/DB "
        "[default: $GLMFB_HISTORY, else sqlite:///<out>/history.sqlite]")]))
    params.append(_param("no_history", Annotated[bool, typer.Option(
        "--no-history", help="Do not record the verdict in the history store.")], False))
    params.append(_param("follow", FollowOpt, False))
    params.append(_param("follow_depth", FollowDepthOpt))
    params.append(_param("follow_budget", FollowBudgetOpt))
    params.append(_param("follow_commands", FollowCommandsOpt, False))
    params.append(_param("as_json", Annotated[bool, typer.Option(
        "--json", help="Print exactly one JSON document on stdout; human text goes to stderr.")], False))
    return params


def spec_from_command_line(probe: Probe, values: dict[str, Any]) -> ProbeSpec:
    """The :class:`ProbeSpec` of a probe command's parsed arguments."""
    from glmfb.core.targets import parse_args

    command = tuple(values.get("command") or ())
    target = values.get("target")
    if probe.form is ProbeForm.SINGLE and probe.accepts_command and command and target:
        raise UsageError(f"glmfb {probe.kind}: give a command after -- or --target, not both")
    args = parse_args(values.get("arg") or [])
    if command and args:
        raise UsageError("--arg goes with --target", "pass arguments to a command after --")
    spec = ProbeSpec(
        kind=probe.kind, name="", label=f"glmfb {probe.kind}",
        baseline=values.get("baseline"), candidate=values.get("candidate"), target=target, command=command,
        args=args, baseline_args=parse_args(values.get("baseline_arg") or []),
        candidate_args=parse_args(values.get("candidate_arg") or []),
        options=given_options(probe.config_type, values),
    )
    name = values.get("name") or probe.default_name(spec)
    return ProbeSpec(**{**spec.__dict__, "name": name})


def _history_origins(spec: ProbeSpec, probe: Probe) -> Any:
    """The verdict's origin for the history: the hash of what the command ran, the working
    folder's repository."""
    from glmfb.workflows.history.record import command_origin

    return {spec.name: command_origin(spec, probe.config_type)}


def register_probe(app: typer.Typer, probe: Probe) -> None:
    """Add ``glmfb <kind>`` for one probe."""

    def command(**values: Any) -> None:
        import os
        from contextlib import nullcontext

        from glmfb.contract.verdict import Verdict
        from glmfb.core import workers
        from glmfb.core.env import fingerprint
        from glmfb.core.host import run_probe
        from glmfb.workflows.invocation import begin

        out = Path(values["out"]) if values.get("out") is not None else Path("reports")
        invocation = begin(out)  # the gate's pointer, before anything can fail (bad input included)
        timeout_s = parse_timeout(values.get("timeout"))
        store = history_url(values.get("history"), out, bool(values.get("no_history")))
        rules = tuple(Path(p) for p in values.get("rules") or ())
        for file in rules:
            if not file.is_file():
                raise UsageError(f"--rules {file}: no such file", "give a .py file that defines RULES")
        spec = spec_from_command_line(probe, values)
        config = probe.build(spec)
        following = follow_options(bool(values.get("follow")), values.get("follow_depth"), values.get("follow_budget"),
                                   bool(values.get("follow_commands")))
        interrupted = False
        isolate = os.environ.get("GLMFB_ISOLATE", "1") != "0"
        # cold unless GLMFB_WORKERS=on: a zygote would cost the same imports as the one child
        with progress_messages() as progress, workers.pool("probe") if isolate else nullcontext() as warm:
            ctx = ProbeContext(run_id=invocation.run_id, artifact_dir=invocation.report_dir / safe_component(spec.name),
                               progress=progress, rules_files=rules)
            try:
                verdict = run_probe(probe, config, ctx, isolate=isolate, timeout_s=timeout_s)
            except KeyboardInterrupt as exc:
                interrupted = True
                verdict = Verdict.harness_error(
                    probe.kind, spec.name,
                    f"interrupted ({getattr(exc, 'signal_name', 'SIGINT')}) while running; its processes were stopped")
            if following is not None and not interrupted:
                from glmfb.workflows.follow import follow_verdict

                try:
                    verdict = follow_verdict(verdict, following, root=Path.cwd(), artifact_dir=ctx.artifact_dir,
                                             run_id=invocation.run_id, progress=progress)
                except KeyboardInterrupt:  # Ctrl-C while following: the verdict stays, without its chain
                    interrupted = True
        finished = invocation.finish([verdict], interrupted=interrupted, history=store,
                                     origins=lambda: _history_origins(spec, probe),
                                     env=workers.recorded(fingerprint(), warm) if warm is not None else None)
        show_finished(finished)
        if values.get("csv") is not None:
            from glmfb.core.tables import write_csv

            write_csv(verdict, Path(values["csv"]))
        emit_verdict(finished.run.verdicts[0], bool(values.get("as_json")))

    params = _common_parameters(probe) + option_parameters(probe.config_type)
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = probe.summary
    command.__name__ = f"{probe.kind}_command"
    settings = {"allow_interspersed_args": False} if probe.accepts_command else {}
    app.command(probe.kind, context_settings=settings, help=probe.summary, cls=Command)(command)
