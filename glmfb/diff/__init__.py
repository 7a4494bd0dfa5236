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
