"""CLI commands, one module per probe; each exposes ``register(app)``. Thin by rule: build a
config, call one engine function, then render or dump JSON and exit with the verdict's code."""
