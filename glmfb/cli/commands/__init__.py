"""CLI commands: one module per command of the table in :mod:`glmfb.cli` (``run``, ``gate``,
``report``, ``bisect``, ``history``, ``schema``, ``mcp``), imported only when that command runs;
:mod:`.probes` and :mod:`.extra` generate each probe's command and the commands probes bring.
Thin by rule: parse, call one engine function (a run through :mod:`glmfb.workflows.invocation`), then
render or dump JSON and exit with the verdict's code."""
