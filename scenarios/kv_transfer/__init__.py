"""Prefill + KV transfer with a GIL-holding MoE dispatch (CONTEXT.md bug 2) and its fix."""
