"""The numerics probe: capture module outputs, compare them, localize and explain the error.

Modules, in the order data flows through them:

- ``requests``: the JSONL request set (docs/design.md, Requests) and its tensors.
- ``store``: capture directories (one safetensors file per tap call, ``manifest.json``).
- ``capture``: running a target over the requests with forward hooks.
- ``metrics``: fused, chunked tensor metrics; per-position and token-level metrics.
- ``compare``: two captures side by side: the taps they share, tensor pair by tensor pair, and
  what they do not share.
- ``localize``: live mode, local versus inherited error of a module, and the parent whose own
  forward makes an error no module adds.
- ``shape``: error against position and length, growth fits, onsets, the precision signature.
- ``rounding``: the rounding test (does rounding the baseline reproduce the error?) and the
  bias test.
- ``counterfactual``: the candidate rerun with other values of a knob.
- ``minimize``: the shortest failing form of a request.
- ``rules``: the rules that turn the findings into ``why`` and ``next``.
- ``engine``: the whole probe, config in, verdict out; ``probe``: suite entry point.

Torch is imported only inside these modules, which load when the probe runs.
"""

from __future__ import annotations

# What `glmfb --help` lists about this probe, read without importing it (glmfb.core.registry).
SUMMARY = "Compare two sides per request and tap; localize the error to a module, a position and a cause."
COMMANDS: dict[str, str] = {  # the commands it brings besides its own: name -> one line of help
    "capture": ("Run a target over a request set; store every tapped module output (safetensors) and a "
                "manifest, for a later diff (give the capture directory as a diff side)."),
}
