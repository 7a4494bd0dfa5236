"""Recording a capture from inside a running process: ``glmfb.capture.recording`` (see
:mod:`glmfb.diff.live`)."""

from glmfb.diff.live import Recording, provenance, recording

__all__ = ["Recording", "provenance", "recording"]
