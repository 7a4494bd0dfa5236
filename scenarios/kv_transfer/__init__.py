"""Prefill + KV transfer with a GIL-holding MoE dispatch (bug 2 of docs/background.md) and its fix."""
