"""Verdict and run documents as this installation reads them: the contract's reader and
schema (:mod:`glmfb.contract.verdict`) given every registered probe's kind and evidence kinds.

The contract knows no probe; this module, in the probe API, gives it what the registry
holds. Reading a document untyped (the gate) needs neither and imports no probe.
"""

from __future__ import annotations

from typing import Any

from glmfb.contract.verdict import Run


def load_document(data: Any, *, typed: bool = True) -> Run:
    """A run from parsed JSON that holds a run or one verdict, its evidence typed into the
    kinds of every probe of this installation (``typed=False``: all of it as read)."""
    from glmfb.contract import verdict

    if typed:
        from glmfb.core.probe import load_evidence_types

        load_evidence_types()
    return verdict.load_document(data, typed=typed)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of ``glmfb schema``: ``probe`` is one of this installation's kinds and
    each of their evidence kinds has its schema under ``$defs``."""
    from glmfb.contract import verdict
    from glmfb.contract.evidence import registered_kinds
    from glmfb.core.probe import load_evidence_types
    from glmfb.core.registry import known_kinds

    load_evidence_types()
    return verdict.json_schema(probes=known_kinds(), evidence=registered_kinds())
