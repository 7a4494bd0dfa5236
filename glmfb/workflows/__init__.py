"""What a user runs over probes, the layer above the engines: the suite (``glmfb run``), one
invocation from its id to its last artifact (every surface's), bisect, the reports, the gate,
the history and the agent server (``glmfb mcp``). It imports the engines, the probe API and the
contract; only the CLI is above it."""
