"""The numerics probe: capture module outputs, compare them, localize and explain the error.

Modules, in the order data flows through them:

- ``requests``: the JSONL request set (docs/design.md, Requests) and its tensors.
- ``store``: capture directories (one safetensors file per tap call, ``manifest.json``).
- ``capture``: running a target over the requests with forward hooks.
- ``metrics``: fused, chunked tensor metrics; per-position and token-level metrics.
- ``compare``: two captures side by side, tensor pair by tensor pair.
- ``localize``: live mode, local versus inherited error of a module.
- ``shape``: error against position and length, growth fits, the precision signature.
- ``minimize``: the shortest failing prefix of a request.
- ``diagnosis``: the rules that turn the evidence into ``why`` and ``next``.
- ``engine``: the whole probe, config in, verdict out; ``probe``: suite entry point.

Torch is imported only inside these modules, which load when the probe runs.
"""
