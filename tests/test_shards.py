"""One suite over several machines: ``glmfb run --shard K/N`` splits the definitions by name
(a partition, stable when a definition is added, the same in every process), run.json records
the shard, and ``glmfb gate`` and ``glmfb report`` take the shards' runs as one run, refusing
with one line any set that is not one whole suite.

The real runs use the toy probe of tests/toy (installed through its entry point, in fresh
``glmfb`` processes): a suite of five definitions, run as three shards into three folders and
once whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import TOY

from glmfb.contract.verdict import Layer, Run, SchemaError, Shard, Status, Verdict, load_document
from glmfb.core.shards import Source, combine, parse_shard, shard_of, shard_record, suite_identity
from glmfb.workflows import suite
from glmfb.workflows.report.html import render_html

REPO = Path(__file__).resolve().parents[1]
NAMES = [f"definition-{i}" for i in range(40)] + ["gated-norm-tiled-vs-fused", "gil-dispatch-target-holds-gil",
                                                  "llama-down-proj-bf16", "kda-chunk-tf32-scan"]

SUITE = """\
[[probe]]
name = "alpha"
probe = "toy"

[[probe]]
name = "beta"
probe = "toy"
options = { outcome = "fail" }
expect = { status = "fail" }

[[probe]]
name = "gamma"
probe = "toy"
options = { outcome = "inconclusive" }

[[probe]]
name = "delta"
probe = "toy"
options = { threshold = "10%" }

[[probe]]
name = "epsilon"
probe = "toy"
options = { outcome = "fail", kernel = "k" }
"""
SUITE_NAMES = ["alpha", "beta", "gamma", "delta", "epsilon"]


def hashes(names: list[str]) -> dict[str, str]:
    return {name: f"hash-of-{name}" for name in names}


# --------------------------------------------------------------------------------------------
# The split: by name, a partition, stable, the same everywhere
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
def test_the_shards_are_a_partition_of_the_suite(count: int) -> None:
    shards = [shard_record(hashes(NAMES), index, count) for index in range(1, count + 1)]
    held = [name for shard in shards for name in shard.names]
    assert sorted(held) == sorted(NAMES)  # every definition in exactly one shard
    assert len({shard.suite for shard in shards}) == 1 and {shard.total for shard in shards} == {len(NAMES)}
    for shard in shards:  # each shard keeps the suite's order
        assert list(shard.names) == [name for name in NAMES if name in shard.names]


def test_adding_a_definition_moves_no_other() -> None:
    for count in range(1, 6):
        before = {name: shard_of(name, count) for name in NAMES}
        for added in ("a-new-first-definition", "definition-20b", "zz-last"):
            for grown in ([added, *NAMES], [*NAMES[:20], added, *NAMES[20:]], [*NAMES, added]):
                after = {index: shard_record(hashes(grown), index, count).names for index in range(1, count + 1)}
                assert {name: k for k, names in after.items() for name in names if name != added} == before
    # and the suite is another one: shards from before and after never combine
    assert suite_identity(hashes(NAMES)) != suite_identity(hashes([*NAMES, "zz-last"]))
    assert suite_identity(hashes(NAMES)) != suite_identity({**hashes(NAMES), "definition-3": "changed"})
    assert suite_identity(hashes(NAMES)) == suite_identity(dict(reversed(hashes(NAMES).items())))


def test_the_split_is_the_same_in_every_process() -> None:
    """sha256 of the name, not Python's hash(): fresh interpreters with different hash seeds
    split alike, and the split is pinned (a glmfb that split otherwise would not combine with
    shards run by this one)."""
    code = ("import json, sys\nfrom glmfb.core.shards import shard_of\n"
            "print(json.dumps({n: shard_of(n, k) for n in json.loads(sys.argv[1]) for k in [3]}))")
    here = {name: shard_of(name, 3) for name in NAMES}
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        out = subprocess.run([sys.executable, "-c", code, json.dumps(NAMES)], capture_output=True, text=True,
                             env=env, timeout=60, check=True)
        assert json.loads(out.stdout) == here
    assert [shard_of(name, 3) for name in SUITE_NAMES] == [3, 1, 1, 2, 3]


@pytest.mark.parametrize(("text", "message"), [
    ("2", "is not K/N"), ("a/b", "is not K/N"), ("0/3", "K must be between 1 and N"),
    ("4/3", "K must be between 1 and N"), ("1/0", "K must be between 1 and N"), ("-1/3", "is not K/N"),
])
def test_a_bad_shard_is_a_usage_error(text: str, message: str) -> None:
    from glmfb.contract.errors import UsageError

    with pytest.raises(UsageError, match=message):
        parse_shard(text)
    assert parse_shard(" 2 / 3 ") == (2, 3)


def test_a_definitions_hash_is_what_it_runs_and_expects(tmp_path: Path, toy: Path) -> None:
    def hash_of(table: str, name: str = "d.toml") -> str:
        path = tmp_path / name
        path.write_text("[[probe]]\nname = 'a'\nprobe = 'toy'\n" + table)
        [definition] = suite.load_definitions([path])
        return suite.definition_hash(definition)

    plain = hash_of("options = { threshold = '5%' }\n")
    assert hash_of("options = { threshold = 0.05 }\n") == plain  # the option's canonical form
    assert hash_of("options = { threshold = '5%' }\ndescription = 'says why'\n") == plain
    assert hash_of("options = { threshold = '6%' }\n") != plain
    assert hash_of("options = { threshold = '5%' }\nexpect = { status = 'pass' }\n") != plain
    assert hash_of("options = { threshold = '5%' }\ntimeout = '30s'\n") != plain
    (tmp_path / "elsewhere").mkdir()
    assert hash_of("options = { threshold = '5%' }\n", "elsewhere/d.toml") == plain  # relative paths stay relative


# --------------------------------------------------------------------------------------------
# The record in run.json
# --------------------------------------------------------------------------------------------


def test_a_shard_round_trips_in_run_json_and_old_files_still_read() -> None:
    shard = Shard(index=2, count=3, suite="6092e39c2becb713", names=("delta",), total=5)
    verdict = Verdict(probe="toy", name="delta", status=Status.PASS, layer=Layer.KERNEL, why="w")
    run = Run(id="r", started="s", verdicts=(verdict,), shard=shard)
    data = json.loads(json.dumps(run.to_dict()))
    assert data["shard"] == {"index": 2, "count": 3, "suite": "6092e39c2becb713", "names": ["delta"], "total": 5}
    assert load_document(data) == run
    del data["shard"]
    assert load_document(data).shard is None
    with pytest.raises(SchemaError, match=r"shard\.index"):
        load_document({**data, "shard": {**shard.to_dict(), "index": 4}})
    with pytest.raises(SchemaError, match=r"shard\.names: required field is missing"):
        load_document({**data, "shard": {k: v for k, v in shard.to_dict().items() if k != "names"}})


def test_the_report_of_several_shards_links_each_verdicts_files_in_its_own_run_folder(tmp_path: Path) -> None:
    sources = []
    for index, name in enumerate(("beta", "delta", "alpha"), start=1):  # shards 1, 2, 3 of three
        folder = tmp_path / f"reports-{index}" / f"run-{index}"
        (folder / name).mkdir(parents=True)
        (folder / name / "trace.txt").write_text("t")
        verdict = Verdict(probe="toy", name=name, status=Status.PASS, layer=Layer.KERNEL, why="w",
                          artifacts={"trace": f"reports/run-{index}/{name}/trace.txt"})
        shard = shard_record(hashes(["alpha", "beta", "delta"]), index, 3)
        assert shard.names == (name,)
        sources.append(Source(str(folder / "run.json"), Run(id=f"run-{index}", started="s", verdicts=(verdict,),
                                                            shard=shard)))
    from glmfb.core.shards import verdict_folders

    page = render_html(combine(sources), None, tmp_path / "report.html", verdict_folders(sources))
    for index, name in enumerate(("beta", "delta", "alpha"), start=1):
        assert f'href="reports-{index}/run-{index}/{name}/trace.txt"' in page
    assert "not found" not in page


# --------------------------------------------------------------------------------------------
# Real runs: three shards into three folders, against one whole run
# --------------------------------------------------------------------------------------------


def glmfb_started(*args: str, cwd: Path) -> subprocess.Popen[str]:
    """The glmfb command line started in a fresh process that finds the toy by its entry point."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TOY), str(REPO)])}
    env.pop("GITHUB_STEP_SUMMARY", None)
    env.pop("GLMFB_HISTORY", None)  # each run keeps its history in its own out folder
    return subprocess.Popen([sys.executable, "-m", "glmfb", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd, env=env)


def finished(process: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    """What a started glmfb process printed and its exit code, once it ends (killed past 300 s)."""
    try:
        stdout, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"{process.args} ran past 300 s\n{stdout[-2000:]}\n{stderr[-2000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def glmfb(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The glmfb command line in a fresh process that finds the toy by its entry point."""
    return finished(glmfb_started(*args, cwd=cwd))


@dataclass(frozen=True)
class Runs:
    root: Path
    codes: dict[str, int]  # each glmfb run's exit code, by its out folder
    summaries: dict[str, str]  # the last line each printed

    def run_file(self, out: str) -> Path:
        [found] = (self.root / out).glob("*/run.json")
        return found


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The suite run whole into reports-all, as shards 1/3..3/3 into reports-1..3, shard 3/3
    of a suite where one definition changed into reports-other, and an empty shard of 7."""
    root = tmp_path_factory.mktemp("shards")
    (root / "suite.toml").write_text(SUITE)
    (root / "changed").mkdir()
    (root / "changed" / "suite.toml").write_text(SUITE.replace('threshold = "10%"', 'threshold = "20%"'))
    empty = next(k for k in range(1, 8) if all(shard_of(name, 7) != k for name in SUITE_NAMES))
    commands = {"reports-all": ["suite.toml"], **{f"reports-{k}": ["suite.toml", "--shard", f"{k}/3"] for k in (1, 2, 3)},
                "reports-other": ["changed/suite.toml", "--shard", "3/3"],
                "reports-empty": ["suite.toml", "--shard", f"{empty}/7"]}
    codes, summaries = {}, {}
    # the six runs at once: each writes its own out folder (its history there too) and the toy
    # measures nothing, so they need not wait for each other
    started = {out: glmfb_started("run", *args, "--out", out, cwd=root) for out, args in commands.items()}
    for out, process in started.items():
        ran = finished(process)
        assert "Traceback" not in ran.stderr, ran.stderr
        codes[out], summaries[out] = ran.returncode, ran.stdout.strip().splitlines()[-1]
    return Runs(root, codes, summaries)


def junit_cases(path: Path) -> set[tuple[str, str, str]]:
    """(name, status, what the gate made of it) of each testcase of a JUnit file."""
    cases = set()
    for case in ET.parse(path).getroot().iter("testcase"):
        status = next(p.get("value") for p in case.iter("property") if p.get("name") == "status")
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        cases.add((str(case.get("name")), str(status), outcome))
    return cases


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glmfb: error: "), result.stderr
    return lines[0].removeprefix("glmfb: error: ")


@pytest.mark.slow
def test_the_shards_record_what_they_ran(runs: Runs) -> None:
    documents = {out: json.loads(runs.run_file(out).read_text()) for out in ("reports-1", "reports-2", "reports-3")}
    shards = {out: document["shard"] for out, document in documents.items()}
    assert [shards[f"reports-{k}"]["index"] for k in (1, 2, 3)] == [1, 2, 3]
    assert {s["count"] for s in shards.values()} == {3} and {s["total"] for s in shards.values()} == {5}
    assert len({s["suite"] for s in shards.values()}) == 1
    assert sorted(n for s in shards.values() for n in s["names"]) == sorted(SUITE_NAMES)
    for out, document in documents.items():
        assert [v["name"] for v in document["verdicts"]] == shards[out]["names"]
    assert "shard" not in json.loads(runs.run_file("reports-all").read_text())
    other = json.loads(runs.run_file("reports-other").read_text())["shard"]
    assert other["suite"] != shards["reports-1"]["suite"] and other["names"] == shards["reports-3"]["names"]
    empty = json.loads(runs.run_file("reports-empty").read_text())
    assert empty["verdicts"] == [] and empty["shard"]["names"] == [] and runs.codes["reports-empty"] == 0
    assert runs.summaries["reports-empty"].startswith("no verdicts in shard ")
    assert " (0 of the suite's 5 definitions); run folder " in runs.summaries["reports-empty"]
    assert runs.summaries["reports-2"].startswith("1 pass in shard 2/3 (1 of the suite's 5 definitions); ")


@pytest.mark.slow
def test_gate_over_the_three_shards_is_gate_over_the_whole_run(runs: Runs) -> None:
    whole = glmfb("gate", "reports-all", "--junit", "whole.xml", cwd=runs.root)
    sharded = glmfb("gate", "reports-1", "reports-2", "reports-3", "--junit", "sharded.xml", cwd=runs.root)
    assert whole.returncode == sharded.returncode == runs.codes["reports-all"] == 1  # epsilon fails
    cases = junit_cases(runs.root / "whole.xml")
    assert {name for name, _, _ in cases} == set(SUITE_NAMES)
    assert junit_cases(runs.root / "sharded.xml") == cases
    assert "glmfb gate: read 3 shards of suite " in sharded.stderr
    assert sharded.stdout.splitlines()[0] == whole.stdout.splitlines()[0] == (
        "glmfb gate failed (exit 1): 3 ok, 1 failed, 1 inconclusive")


@pytest.mark.slow
def test_report_over_the_three_shards_is_one_page_with_every_verdict(runs: Runs) -> None:
    made = glmfb("report", "reports-1", "reports-2", "reports-3", "--out", "all.html", cwd=runs.root)
    assert made.returncode == 0, made.stderr
    page = (runs.root / "all.html").read_text()
    whole_page = next((runs.root / "reports-all").glob("*/report.html")).read_text()

    def verdicts(html: str) -> set[tuple[str, str]]:
        import re

        return set(re.findall(r'<section class="verdict [a-z]+" id="[^"]+" data-probe="toy" '
                              r'data-verdict="([^"]+)" data-status="([a-z]+)"', html))

    assert verdicts(page) == verdicts(whole_page) and {n for n, _ in verdicts(page)} == set(SUITE_NAMES)
    assert "exit code 1" in page
    with_default = glmfb("report", "reports-1", "reports-2", "reports-3", cwd=runs.root)
    assert with_default.returncode == 0 and (runs.root / "report.html").is_file()  # several: in the current folder


@pytest.mark.slow
def test_a_set_that_is_not_one_whole_suite_is_refused_with_one_line(runs: Runs) -> None:
    files = {out: str(runs.run_file(out).relative_to(runs.root)) for out in runs.codes}
    suite_id = json.loads(runs.run_file("reports-1").read_text())["shard"]["suite"]
    cases = {
        ("reports-1", "reports-3"): f"shard 2/3 of suite {suite_id} is missing (given: 1/3, 3/3); "
                                    "a partial set is never gated: give every shard's run",
        ("reports-2",): f"{files['reports-2']} is shard 2/3 of a suite: shards 1/3, 3/3 are missing; "
                        "give all 3 shards' runs; one shard is never gated alone",
        ("reports-empty",): None,  # an empty shard alone is never green
        ("reports-1", "reports-2", "reports-other"): f"{files['reports-1']} and {files['reports-other']} are shards "
                                                     "of different suites",
        ("reports-1", "reports-2", "reports-3", "reports-1"): f"{files['reports-1']} was given twice (run ",
        ("reports-1", "reports-2", "reports-empty"): f"{files['reports-1']} is shard 1/3 but {files['reports-empty']} "
                                                     "is shard ",
        ("reports-1", "reports-2", "reports-3", "reports-all"): f"{files['reports-all']} is not a shard (run without "
                                                                "--shard), and 4 runs were given",
    }
    # the 14 refusals at once: each writes nothing
    started = {(command, given): glmfb_started(command, *given, cwd=runs.root)
               for given in cases for command in ("gate", "report")}
    for (command, given), process in started.items():
        message = cases[given]
        result = finished(process)
        assert result.returncode == 2, (command, given, result.stderr)
        line = one_error_line(result)
        assert line.startswith(message if message is not None else f"{files['reports-empty']} is shard "), line
    copied = runs.root / "copy.json"
    copied.write_text(runs.run_file("reports-1").read_text())
    result = glmfb("gate", "reports-1", "reports-2", "reports-3", "copy.json", cwd=runs.root)
    assert result.returncode == 2 and one_error_line(result).startswith(f"{files['reports-1']} and copy.json are "
                                                                         "the same run")


@pytest.mark.slow
def test_the_history_records_the_shards_as_one_run_once(runs: Runs) -> None:
    import sqlite3

    def rows(path: Path) -> list[tuple[str, str, str, str | None]]:
        with sqlite3.connect(path) as db:
            return sorted(db.execute("SELECT run_id, recorded, definition, definition_hash FROM verdicts").fetchall())

    whole = rows(runs.root / "reports-all" / "history.sqlite")
    assert sorted(r[2] for r in whole) == sorted(SUITE_NAMES)
    ids = [json.loads(runs.run_file(f"reports-{k}").read_text())["id"] for k in (1, 2, 3)]
    for k in (1, 2, 3):  # a shard records nothing itself (its run.json keeps each verdict's origin)
        folder = runs.root / f"reports-{k}"
        if (folder / "history.sqlite").exists():  # only a gate over the shards (another test's) wrote there
            assert {r[0] for r in rows(folder / "history.sqlite")} <= {"+".join(ids)}
        origins = json.loads(runs.run_file(f"reports-{k}").read_text())["shard"]["origins"]
        assert set(origins) == set(json.loads(runs.run_file(f"reports-{k}").read_text())["shard"]["names"])
    store = runs.root / "shards-history.sqlite"
    first = glmfb("gate", "reports-1", "reports-2", "reports-3", "--history", f"sqlite:///{store}", cwd=runs.root)
    assert first.returncode == 1 and "the 3 shards' 5 verdicts recorded as one run in the history" in first.stderr
    recorded = rows(store)
    assert {r[0] for r in recorded} == {"+".join(ids)} and len({r[1] for r in recorded}) == 1  # one run, one time
    assert sorted(r[2] for r in recorded) == sorted(SUITE_NAMES)
    # the same definitions as the unsharded run: the same series (definition hashes)
    assert {(r[2], r[3]) for r in recorded} == {(r[2], r[3]) for r in whole}
    again = glmfb("gate", "reports-3", "reports-1", "reports-2", "--history", f"sqlite:///{store}", cwd=runs.root)
    assert again.returncode == 1 and "already recorded in the history" in again.stderr
    assert rows(store) == recorded
    listed = glmfb("history", "--history", f"sqlite:///{store}", "--json", cwd=runs.root)
    assert listed.returncode == 0, listed.stderr
    series = json.loads(listed.stdout)["series"]
    assert series and all(s["runs"] == 1 and s["points"][0]["run_id"] == "+".join(ids) for s in series)


def test_run_refuses_a_bad_shard_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "suite.toml").write_text(SUITE)
    result = glmfb("run", "suite.toml", "--shard", "4/3", cwd=tmp_path)
    assert result.returncode == 2
    assert one_error_line(result) == "--shard 4/3: K must be between 1 and N; write --shard K/3 with K from 1 to 3"
