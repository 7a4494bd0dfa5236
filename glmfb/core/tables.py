"""The tables a verdict's evidence holds, as pandas DataFrames (and CSV files).

Evidence kinds with rows (per-module and per-position error, bench shapes and the op diff,
per-thread GIL time, gap samples and phases) say so with a ``tables()`` method returning
``{table name: [row dicts]}``. :func:`verdict_tables` gathers them per table name across a
verdict's evidence; ``--csv DIR`` on a probe command writes one CSV per table. pandas is
imported only here, only when a table is asked for.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmfb.contract.verdict import Verdict

if TYPE_CHECKING:
    import pandas as pd


def table_rows(verdicts: Iterable[Verdict]) -> dict[str, list[dict[str, Any]]]:
    """Rows per table name over the evidence of ``verdicts`` (each row tagged with its verdict)."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for verdict in verdicts:
        for item in verdict.evidence:
            method = getattr(item, "tables", None)
            if not callable(method):
                continue
            for name, rows in method().items():
                tables.setdefault(name, []).extend({"verdict": verdict.name, **row} for row in rows)
    return tables


def verdict_tables(verdict: Verdict) -> dict[str, pd.DataFrame]:
    """The verdict's tables as DataFrames, one per table name."""
    import pandas as pd

    return {name: pd.DataFrame(rows) for name, rows in table_rows([verdict]).items()}


def write_csv(verdict: Verdict, folder: Path) -> list[Path]:
    """One ``<table>.csv`` per table of the verdict in ``folder`` (written atomically)."""
    from glmfb.core.io import atomic_writer

    written: list[Path] = []
    folder.mkdir(parents=True, exist_ok=True)
    for name, frame in verdict_tables(verdict).items():
        path = folder / f"{name}.csv"
        with atomic_writer(path) as handle:
            frame.to_csv(handle, index=False)
        written.append(path)
    return written
