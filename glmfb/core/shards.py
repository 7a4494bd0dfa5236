"""One suite over several machines: which definitions a shard runs, and its runs made one.

``glmfb run --shard K/N`` runs the definitions whose name hashes to shard K (sha256 of the
name, mod N): by name, never by position, so adding a definition elsewhere in the suite moves
no other, and every process and machine computes the same split (no Python hash
randomization). Its run.json records a :class:`~glmfb.contract.verdict.Shard`: K and N, the suite's
identity (a hash over every selected definition's name and definition hash) and the names
it ran.

``glmfb gate`` and ``glmfb report`` given the N runs make them one run with
:func:`combine`, which refuses, with one line, any set that is not exactly one whole suite:
a shard missing or given twice, shards of different suites or of different N, a run given
twice, a run that is not a shard among shards. A partial set is never gated green.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glmfb.contract.errors import InputError, UsageError
from glmfb.contract.verdict import Run, Shard

_SHARD_TEXT = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")


def canonical_hash(data: Any) -> str:
    """A short, stable hash of JSON-like data (keys sorted, no whitespace): 16 hex digits."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/3"`` -> ``(2, 3)``; anything else, or K outside 1..N, is a usage error."""
    match = _SHARD_TEXT.fullmatch(text)
    if match is None:
        raise UsageError(f"--shard {text!r} is not K/N", "write --shard 2/3: the second of three shards")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or not 1 <= index <= count:
        raise UsageError(f"--shard {text}: K must be between 1 and N", f"write --shard K/{max(count, 1)} with "
                                                                        f"K from 1 to {max(count, 1)}")
    return index, count


def shard_of(name: str, count: int) -> int:
    """The shard (from 1) that the definition ``name`` belongs to among ``count``."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big") % count + 1


def suite_identity(hashes: Mapping[str, str]) -> str:
    """The identity of a suite: a hash over each definition's name and definition hash
    (``{name: hash}``), in no particular order."""
    return canonical_hash(sorted(hashes.items()))


def shard_record(hashes: Mapping[str, str], index: int, count: int) -> Shard:
    """The :class:`Shard` that runs shard ``index`` of ``count`` of the suite ``hashes``
    (``{name: definition hash}`` in the suite's order): its names keep that order."""
    names = tuple(name for name in hashes if shard_of(name, count) == index)
    return Shard(index=index, count=count, suite=suite_identity(hashes), names=names, total=len(hashes))


# --------------------------------------------------------------------------------------------
# Several runs made one
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """A run as given to the gate or the report: how to name it, and the run read from it."""

    label: str  # the path given (``standard input`` for -)
    run: Run

    @property
    def folder(self) -> Path | None:
        """The run's folder (where its artifacts are), None for standard input."""
        return None if self.label == "standard input" else Path(self.label).parent


def read_sources(given: Sequence[str], *, typed: bool = True) -> list[Source]:
    """The runs given to the gate or the report (each a run or verdict JSON file, a run
    folder, or ``-``), read (``typed=False``: evidence as read, no probe imported)."""
    from glmfb.contract.verdict import SchemaError
    from glmfb.core.documents import load_document
    from glmfb.core.io import read_json
    from glmfb.core.runs import run_file_of

    sources: list[Source] = []
    for raw in given:
        path = run_file_of(raw)
        label = "standard input" if path == "-" else path
        try:
            run = load_document(read_json(path), typed=typed)
        except SchemaError as exc:
            raise UsageError(f"{label} is not a glmfb run or verdict: {exc}") from None
        sources.append(Source(label, run))
    return sources


def combine(sources: Sequence[Source]) -> Run:
    """The one run that ``sources`` make: one run that is whole (not a shard, or shard 1/1)
    as it is, or the shards 1..N of one suite, each once, as one run (their verdicts in shard
    order). Any other set is refused (:class:`InputError`, exit code 2)."""
    if not sources:
        raise InputError("no run given", "give a run.json or a run folder")
    if len(sources) == 1:
        source = sources[0]
        shard = source.run.shard
        if shard is not None and shard.count > 1:
            others = ", ".join(f"{k}/{shard.count}" for k in range(1, shard.count + 1) if k != shard.index)
            raise InputError(f"{source.label} is shard {shard.label} of a suite: shards {others} are missing",
                             f"give all {shard.count} shards' runs; one shard is never gated alone")
        return source.run
    _refuse_repeats(sources)
    shards = _shards_of(sources)
    return _merged(sorted(shards, key=lambda pair: pair[1].index))


def _refuse_repeats(sources: Sequence[Source]) -> None:
    seen: dict[str, str] = {}
    for source in sources:
        first = seen.get(source.run.id)
        if first is not None:
            same = "was given twice" if first == source.label else f"and {source.label} are the same run"
            raise InputError(f"{first} {same} (run {source.run.id})", "give each shard's run once")
        seen[source.run.id] = source.label


def _shards_of(sources: Sequence[Source]) -> list[tuple[Source, Shard]]:
    """Each source with its shard, once they are checked to be the shards of one suite."""
    whole = next((s for s in sources if s.run.shard is None), None)
    if whole is not None:
        raise InputError(f"{whole.label} is not a shard (run without --shard), and {len(sources)} runs were given",
                         "gate or report a whole run on its own, or give only the shards of one suite")
    pairs = [(s, s.run.shard) for s in sources if s.run.shard is not None]
    first, first_shard = pairs[0]
    for source, shard in pairs[1:]:
        if shard.count != first_shard.count:
            raise InputError(f"{first.label} is shard {first_shard.label} but {source.label} is shard {shard.label}: "
                             "the shards of one suite agree on N", "give the runs of one glmfb run --shard K/N matrix")
        if shard.suite != first_shard.suite:
            raise InputError(f"{first.label} and {source.label} are shards of different suites (suite "
                             f"{first_shard.suite} of {first_shard.total} definitions, suite {shard.suite} of "
                             f"{shard.total}): their definitions differ",
                             "run every shard from one commit, with the same paths and -k")
    by_index: dict[int, Source] = {}
    for source, shard in pairs:
        if shard.index in by_index:
            raise InputError(f"shard {shard.label} was given twice: {by_index[shard.index].label} and {source.label}",
                             "give each shard's run once")
        by_index[shard.index] = source
    missing = [k for k in range(1, first_shard.count + 1) if k not in by_index]
    if missing:
        given = ", ".join(f"{k}/{first_shard.count}" for k in sorted(by_index))
        absent = ", ".join(f"{k}/{first_shard.count}" for k in missing)
        raise InputError(f"shard{'s' if len(missing) > 1 else ''} {absent} of suite {first_shard.suite} "
                         f"{'are' if len(missing) > 1 else 'is'} missing (given: {given})",
                         "a partial set is never gated: give every shard's run")
    for source, shard in pairs:
        ran = [v.name for v in source.run.verdicts]
        if sorted(ran) != sorted(shard.names):
            raise InputError(f"{source.label}: its verdicts are not the definitions its shard {shard.label} names",
                             "give run.json files as glmfb run wrote them")
    names = [name for _, shard in pairs for name in shard.names]
    if len(set(names)) != len(names) or len(names) != first_shard.total:
        raise InputError(f"the shards of suite {first_shard.suite} hold {len(set(names))} of its {first_shard.total} "
                         "definitions, some more than once: they were split by different versions of glmfb",
                         "run every shard with one glmfb version")
    return pairs


def _merged(pairs: Sequence[tuple[Source, Shard]]) -> Run:
    runs = [source.run for source, _ in pairs]
    finished = [run.finished for run in runs]
    return Run(
        id="+".join(run.id for run in runs),
        started=min(run.started for run in runs),
        finished=None if None in finished else max(f for f in finished if f is not None),
        verdicts=tuple(verdict for run in runs for verdict in run.verdicts),
        env=runs[0].env,
        interrupted=any(run.interrupted for run in runs),
    )


def describe(sources: Sequence[Source]) -> str:
    """What was read, for the gate's note on stderr: one run, or the shards of one suite."""
    if len(sources) == 1:
        source = sources[0]
        part = f", shard {source.run.shard.label}" if source.run.shard is not None else ""
        return f"{source.label} (run {source.run.id}{part})"
    shard = sources[0].run.shard
    suite = f" of suite {shard.suite}" if shard is not None else ""
    parts = ", ".join(f"{s.label} ({s.run.shard.label if s.run.shard else s.run.id})" for s in sources)
    return f"{len(sources)} shards{suite}: {parts}"


def verdict_folders(sources: Sequence[Source]) -> dict[str, tuple[Path, str]]:
    """For each verdict of ``sources``, by name, the folder and id of the run that holds it
    (where the report finds its artifacts)."""
    return {verdict.name: (source.folder, source.run.id) for source in sources if source.folder is not None
            for verdict in source.run.verdicts}
