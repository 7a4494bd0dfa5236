"""A TF32 state merge in context-parallel KDA linear attention, on real torch.distributed ranks.

- ``precision``: products at ``ieee``, ``tf32`` (operands rounded to TF32) and ``tf32x3``.
- ``kda``: the gated delta rule with per-channel decay: recurrent reference, chunked WY form,
  chunk transitions and the affine chain.
- ``model``: the layer on one device (``single``) and per rank (``cp``), glmfb diff targets.
- ``check``: CP against one device on torchrun ranks (used by the benchmark and the tests).
"""
