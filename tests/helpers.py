"""Shared test helpers: a probe context in a temporary folder, a probe run through the host."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from glmfb.contract.verdict import Run, Verdict
from glmfb.core.host import run_probe
from glmfb.core.probe import ProbeContext, get_probe
from glmfb.workflows.suite import load_definitions

BUNDLED = Path(__file__).resolve().parents[1] / "probes"


def context(folder: Path, name: str = "t") -> ProbeContext:
    """A probe context whose artifacts go to ``folder/name``."""
    return ProbeContext(run_id="test", artifact_dir=Path(folder) / name)


def run(kind: str, config: Any, folder: Path) -> Verdict:
    """Run a config of probe ``kind`` through the host boundary (as the CLI and suite do)."""
    return run_probe(get_probe(kind), config, context(folder, getattr(config, "name", kind).replace("/", "_")))


@dataclass(frozen=True)
class BundledRun:
    """One ``glmfb run`` of the bundled definitions (probes/), shared by every test that reads
    a bundled definition's verdict: each of those definitions runs once a session, not once per
    test that checks it."""

    folder: Path  # the run folder (run.json, report.html, the artifacts)
    document: dict[str, Any]  # run.json
    returncode: int
    stderr: str

    def verdicts(self, file: str) -> dict[str, dict[str, Any]]:
        """The verdicts of the definitions in ``probes/FILE`` (JSON, as run.json holds them), by
        name, in the file's order; every one of them must be in the run."""
        names = [d.name for d in load_definitions([BUNDLED / file])]
        by_name = {v["name"]: v for v in self.document["verdicts"]}
        missing = [name for name in names if name not in by_name]
        assert not missing, f"the bundled run has no verdict for {missing} (exit {self.returncode}): {self.stderr[-2000:]}"
        return {name: by_name[name] for name in names}

    def part(self, file: str) -> Run:
        """The run as ``glmfb run probes/FILE`` would have written it: the same
        :class:`glmfb.contract.verdict.Run` holding only that file's verdicts, so its ``summary`` and
        ``exit_code`` are what that command reports for them."""
        run = Run.from_dict(self.document)
        names = set(self.verdicts(file))
        return replace(run, verdicts=tuple(v for v in run.verdicts if v.name in names))
