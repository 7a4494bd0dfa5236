"""glmfb as an MCP server (``glmfb mcp``): every probe, every command a probe brings
(``capture``), ``run``, ``gate``, ``list_probes`` and ``explain`` as tools whose results are
typed verdicts, the runs as resources.

- :mod:`glmfb.workflows.mcp.boundary`: what a call may touch (paths and targets under the root,
  command lines only with ``--allow-commands``, a time budget with a cap);
- :mod:`glmfb.workflows.mcp.tools`: the tools (one module per family), their input schemas (from the
  probes' and their commands' declarations), their output schemas (the verdict contract) and
  the blocking work each does;
- a verdict's ``next`` steps that are commands become tool calls (``Toolbox.next_calls``);
- :mod:`glmfb.workflows.mcp.resources`: the runs under ``<root>/reports`` as resources;
- :mod:`glmfb.workflows.mcp.server`: the MCP SDK wiring (stdio, streamable HTTP), progress and
  cancellation.

A layer of its own: it may import glmfb's engine-level modules, the suite, the gate and the
reports; nothing imports it but the command that starts it (:mod:`glmfb.cli.commands.mcp`)
and ``--follow`` (:mod:`glmfb.workflows.follow`, which takes a verdict's deeper steps as this
server takes their tool calls: :mod:`glmfb.workflows.mcp.follow`).
The SDK (the ``mcp`` package) is imported only here.
"""
