"""``glmfb bisect`` on real git repositories built here: a tiny project of 30 commits with a
pure-Python bench kernel that one commit makes 3x slower, a torch model whose output another
commit shifts by 1e-2, and a commit that does not import (a syntax error in both) between
them; probe definitions name the same target on both sides. Each culprit is named within
ceil(log2(commits)) + 3 evaluations; a range without a regression answers no culprit, 10 times
out of 10; a commit that does not import next to the culprit never yields a wrong culprit."""

from __future__ import annotations

import json
import math
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from glmfb.cli import app
from glmfb.contract.step import Step
from glmfb.core.commandline import argv, shell_line
from glmfb.workflows.bisect.search import Outcome, Search

runner = CliRunner()

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

KERNELS = '''"""A bench factory: the sum of squares of a list, done PASSES times over."""

PASSES = {passes}


def make(shape):
    data = list(range(shape[0]))

    def run():
        total = 0
        for _ in range(PASSES):
            for x in data:
                total += x * x
        return total

    return run
'''

MODEL = '''"""A diff factory: an embedding and a projection; OFFSET is added to the output."""

import torch
from torch import nn

OFFSET = {offset}


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(64, 16)
        self.proj = nn.Linear(16, 16)

    def forward(self, input_ids):
        return self.proj(self.embed(input_ids)) + OFFSET


def make():
    return Head().eval()
'''

BROKEN = "def make(shape:\n    pass\n"  # a half-done refactor: does not import

DEFINITIONS = '''[[probe]]
name = "kernel-speed"
probe = "bench"
baseline = "../kernels.py:make"
candidate = "../kernels.py:make"
options = { shapes = ["2000"], threshold = "25%", budget = "1s", profile = false, input_sets = 2 }

[[probe]]
name = "model-numerics"
probe = "diff"
baseline = "../model.py:make"
candidate = "../model.py:make"
options = { requests = "../requests.jsonl", minimize = false }
'''


@dataclass(frozen=True)
class Repo:
    path: Path
    shas: list[str]  # shas[0] is the first commit (GOOD), oldest first

    @property
    def definition(self) -> Path:
        return self.path / "probes" / "bisect.toml"


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV})
    return done.stdout.strip()


def build_repo(root: Path, commits: int, changes: dict[int, tuple[str, dict[str, str]]]) -> Repo:
    """A repository of ``commits`` commits; commit ``i`` (1-based) writes the files ``changes``
    gives it, with its subject, and the others touch a changelog (commit 1 writes the project,
    with its changes on top)."""
    root.mkdir(parents=True)
    _git(root, "init", "-q", "-b", "main")
    files = {"kernels.py": KERNELS.format(passes=1), "model.py": MODEL.format(offset=0.0),
             "requests.jsonl": '{"id": "r8", "length": 8, "seed": 1, "vocab": 64}\n',
             "probes/bisect.toml": DEFINITIONS}
    shas = []
    for number in range(1, commits + 1):
        subject, written = changes.get(number, (f"changelog: entry {number}", {}))
        if number == 1:  # the project, and what the changes put in it from the start
            subject, written = "a tiny project with a kernel and a model", {**files, **written}
        for name, text in written.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        with open(root / "CHANGES.md", "a") as changelog:
            changelog.write(f"- {subject}\n")
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "-m", subject)
        shas.append(_git(root, "rev-parse", "HEAD"))
    return Repo(root, shas)


SLOWDOWN = 8  # commit numbers (1-based) of the planted changes in the 30-commit repository
BROKEN_AT = 15
NUMERICS = 22


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return build_repo(tmp_path_factory.mktemp("bisect") / "project", 30, {
        SLOWDOWN: ("kernels: accumulate in three passes", {"kernels.py": KERNELS.format(passes=3)}),
        BROKEN_AT: ("wip: split the kernel and the model into helpers", {"kernels.py": BROKEN, "model.py": BROKEN}),
        BROKEN_AT + 1: ("finish the split", {"kernels.py": KERNELS.format(passes=3), "model.py": MODEL.format(offset=0.0)}),
        NUMERICS: ("model: add a bias after the projection", {"model.py": MODEL.format(offset=0.01)}),
    })


def bisect(repo: Repo, good: str, bad: str, name: str, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["bisect", good, bad, str(repo.definition), "-k", name, "--out", str(out),
                                 "--json", *extra])
    assert result.stdout.strip().startswith("{"), (result.exit_code, result.stdout, result.stderr)
    return result.exit_code, json.loads(result.stdout)


def bisection(verdict: dict[str, Any]) -> dict[str, Any]:
    return next(e for e in verdict["evidence"] if e["kind"] == "bisection")


def held(verdict: dict[str, Any], role: str) -> dict[str, Any]:
    return next(e for e in verdict["evidence"] if e["kind"] == "bisect_verdict" and e["role"] == role)


def bound(commits: int) -> int:
    return math.ceil(math.log2(commits)) + 3


def report(case: str, verdict: dict[str, Any]) -> int:
    """Print the evaluation count of a case (pytest -s shows it) and return it."""
    found = bisection(verdict)
    count = len(found["evaluations"])
    print(f"\n{case}: {count} evaluations over {found['commits']} commits (bound {bound(found['commits'])}): "
          + ", ".join(f"{e['commit'][:7]} {e['outcome']}" for e in found["evaluations"]))
    return count


def assert_named(verdict: dict[str, Any], repo: Repo, number: int, subject: str) -> None:
    culprit = repo.shas[number - 1]
    assert verdict["status"] == "fail", verdict["why"]
    assert verdict["where"]["commit"] == culprit
    assert subject in verdict["why"]
    first_bad, last_good = held(verdict, "first bad"), held(verdict, "last good")
    assert first_bad["commit"] == culprit and first_bad["verdict"]["status"] == "fail"
    assert last_good["commit"] == repo.shas[number - 2] and last_good["verdict"]["status"] == "pass"
    rows = bisection(verdict)["evaluations"]
    assert {"commit", "outcome", "status", "value", "ci"} <= set(rows[0])
    assert any(r["commit"] == culprit and r["outcome"] == "bad" for r in rows)


def assert_clean(repo: Repo) -> None:
    """Every worktree the bisection made is gone, and git forgot them."""
    listed = _git(repo.path, "worktree", "list", "--porcelain").splitlines()
    assert [line for line in listed if line.startswith("worktree ")] == [f"worktree {repo.path}"], listed


# --------------------------------------------------------------------------------------------
# The search alone (no git, no probe)
# --------------------------------------------------------------------------------------------


def simulate(count: int, first_bad: int, skipped: frozenset[int] = frozenset()) -> tuple[Search, int]:
    search = Search(count)
    evaluations = 1  # the confirming one
    while (index := search.next_index()) is not None:
        evaluations += 1
        search.record(index, Outcome.SKIPPED if index in skipped else (Outcome.BAD if index >= first_bad else Outcome.GOOD))
    return search, evaluations


def test_the_search_names_every_first_bad_commit_within_the_bound() -> None:
    for count in (1, 2, 3, 7, 29, 30, 64):
        for first_bad in range(count):
            search, evaluations = simulate(count, first_bad)
            assert search.culprit == first_bad
            assert evaluations <= 1 + math.ceil(math.log2(count))


def test_the_search_goes_around_a_skipped_commit_and_never_names_a_wrong_one() -> None:
    for first_bad in range(1, 29):
        for skip in (first_bad - 1, first_bad + 1, 14):
            if not 0 <= skip < 29 or skip == 28:
                continue
            search, evaluations = simulate(29, first_bad, frozenset({skip}))
            if search.culprit is not None:
                assert search.culprit == first_bad
            else:  # only a skipped commit at the change (or right before it) leaves a range: it and the next
                assert skip in (first_bad - 1, first_bad) and search.unsplit() == (skip, skip + 1)
            assert evaluations <= bound(29)


def test_the_next_commit_is_a_neighbour_of_a_skipped_one() -> None:
    search = Search(29)
    middle = search.next_index()
    assert middle == 13
    search.record(13, Outcome.SKIPPED)
    assert search.next_index() in (12, 14)


# --------------------------------------------------------------------------------------------
# Real bisections
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_bench_names_the_commit_that_planted_the_slowdown(repo: Repo, tmp_path: Path) -> None:
    code, verdict = bisect(repo, repo.shas[0], repo.shas[-1], "kernel-speed", tmp_path)
    count = report("bench slowdown", verdict)
    assert code == 1, verdict["why"]
    assert_named(verdict, repo, SLOWDOWN, "kernels: accumulate in three passes")
    assert verdict["probe"] == "bench" and verdict["layer"] == "kernel" and verdict["where"]["kernel"] == "make"
    # each side named by its commit (once named by the temporary worktree's folder)
    assert (f"../kernels.py:make at {repo.shas[SLOWDOWN - 1][:10]} is slower than ../kernels.py:make at "
            f"{repo.shas[0][:10]} (GOOD)") in verdict["why"], verdict["why"]
    assert count <= bound(29)
    assert bisection(verdict)["skipped"] == [repo.shas[BROKEN_AT - 1]]  # the first middle: it does not import
    # the run folder, as glmfb run writes it
    run_id = (tmp_path / "LATEST").read_text().strip()
    run = json.loads((tmp_path / run_id / "run.json").read_text())
    assert run["schema"] == "glmfb.run/2" and run["verdicts"][0]["where"]["commit"] == repo.shas[SLOWDOWN - 1]
    assert (tmp_path / run_id / "report.html").is_file()
    assert_clean(repo)


@pytest.mark.slow
def test_diff_names_the_commit_that_changed_the_numerics(repo: Repo, tmp_path: Path) -> None:
    code, verdict = bisect(repo, repo.shas[0], repo.shas[-1], "model-numerics", tmp_path)
    count = report("diff numerics", verdict)
    assert code == 1, verdict["why"]
    assert_named(verdict, repo, NUMERICS, "model: add a bias after the projection")
    assert verdict["probe"] == "diff" and verdict["layer"] == "numerics"
    assert count <= bound(29)
    assert bisection(verdict)["skipped"] == [repo.shas[BROKEN_AT - 1]]  # went around the commit that does not import
    assert_clean(repo)


@pytest.mark.slow
def test_a_range_without_a_regression_answers_no_culprit_ten_times_out_of_ten(repo: Repo, tmp_path: Path) -> None:
    """Ten ranges of the bench definition with no change of speed in them (before the slowdown,
    after it, across the commit that does not import but not at either end): each one is a
    pass from its one confirming evaluation."""
    ranges = [(1, 7), (2, 7), (1, 5), (3, 6), (8, 14), (9, 14), (8, 12), (16, 30), (17, 30), (20, 29)]
    for good, bad in ranges:
        code, verdict = bisect(repo, repo.shas[good - 1], repo.shas[bad - 1], "kernel-speed", tmp_path)
        assert (code, verdict["status"]) == (0, "pass"), (good, bad, verdict["why"])
        assert verdict["why"].startswith("no regression between GOOD")
        assert "commit" not in verdict["where"] and len(bisection(verdict)["evaluations"]) == 1
    assert_clean(repo)


@pytest.mark.slow
def test_a_commit_that_does_not_import_next_to_the_culprit_never_yields_a_wrong_culprit(tmp_path: Path) -> None:
    """Twelve commits: the one before the slowdown does not import, so the slowdown's parent
    cannot be judged: the answer is the two-commit range (inconclusive, exit 4), not the
    slowdown and not the commit that does not import. (A commit that does not import after the
    culprit, or away from it, is gone around: the 30-commit cases above meet one.)"""
    before = build_repo(tmp_path / "before", 12, {
        6: ("wip: split the kernel", {"kernels.py": BROKEN}),
        7: ("kernels: finish the split in three passes", {"kernels.py": KERNELS.format(passes=3)}),
    })
    code, verdict = bisect(before, before.shas[0], before.shas[-1], "kernel-speed", tmp_path / "reports")
    count = report("skipped before the culprit", verdict)
    assert (code, verdict["status"]) == (4, "inconclusive"), verdict["why"]
    found = bisection(verdict)
    assert found["culprit"] is None and found["unsplit"] == [before.shas[5], before.shas[6]]
    assert found["skipped"] == [before.shas[5]] and "commit" not in verdict["where"]
    assert f"{before.shas[5][:10]}..{before.shas[6][:10]}" in verdict["why"]
    assert count <= bound(11)
    assert_clean(before)


# --------------------------------------------------------------------------------------------
# Bad input: one line and exit 2, or an error verdict; never a traceback
# --------------------------------------------------------------------------------------------


def _small(tmp_path: Path) -> Repo:
    return build_repo(tmp_path / "small", 3, {})


def test_k_must_select_exactly_one_definition(tmp_path: Path) -> None:
    repo = _small(tmp_path)
    for selection in ([], ["-k", "nothing-like-it"]):
        result = runner.invoke(app, ["bisect", "HEAD~2", "HEAD", str(repo.definition), *selection,
                                     "--out", str(tmp_path / "r")])
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    # refused before any probe ran; nothing but the gate's pointer moved, so a gate cannot read an older run
    assert not list((tmp_path / "r").glob("*/run.json"))
    from glmfb.contract.errors import HarnessError
    from glmfb.core.runs import latest_run

    with pytest.raises(HarnessError, match=r"has no run\.json: it is still running, or it stopped"):
        latest_run(tmp_path / "r")


@pytest.mark.parametrize(("good", "bad", "problem"), [
    ("no-such-rev", "HEAD", "'no-such-rev' is not a commit"),
    ("HEAD", "HEAD~2", "is not an ancestor of BAD"),
    ("HEAD", "HEAD", "are the same commit"),
])
def test_git_problems_are_error_verdicts(tmp_path: Path, good: str, bad: str, problem: str) -> None:
    repo = _small(tmp_path)
    code, verdict = bisect(repo, good, bad, "kernel-speed", tmp_path / "r")
    assert (code, verdict["status"], verdict["layer"]) == (3, "error", "harness")
    assert problem in verdict["why"], verdict["why"]
    assert_clean(repo)


def test_a_definition_outside_a_git_repository_is_an_error_verdict(tmp_path: Path) -> None:
    folder = tmp_path / "plain" / "probes"
    folder.mkdir(parents=True)
    (folder / "bisect.toml").write_text(DEFINITIONS)
    (tmp_path / "plain" / "kernels.py").write_text(KERNELS.format(passes=1))
    (tmp_path / "plain" / "model.py").write_text(MODEL.format(offset=0.0))
    (tmp_path / "plain" / "requests.jsonl").write_text('{"id": "r", "length": 4}\n')
    result = runner.invoke(app, ["bisect", "HEAD~1", "HEAD", str(folder / "bisect.toml"), "-k", "kernel-speed",
                                 "--out", str(tmp_path / "r"), "--json"])
    verdict = json.loads(result.stdout)
    assert (result.exit_code, verdict["status"]) == (3, "error")
    assert "is not in a git repository" in verdict["why"]


def test_a_failing_setup_skips_the_commit_and_a_dirty_checkout_is_fine(tmp_path: Path) -> None:
    """--setup runs in each worktree; where it fails (here: at BAD, whose marker file says so)
    the commit is skipped, and BAD skipped is an error verdict. The user's checkout has
    uncommitted changes, which the worktrees never see."""
    repo = build_repo(tmp_path / "setup", 3, {3: ("mark BAD", {"FAIL_SETUP": "yes\n"})})
    (repo.path / "kernels.py").write_text(BROKEN)  # dirty: not committed
    code, verdict = bisect(repo, repo.shas[0], repo.shas[-1], "kernel-speed", tmp_path / "r",
                           "--setup", "test ! -f FAIL_SETUP || { echo setup refuses this commit; exit 7; }")
    assert (code, verdict["status"]) == (3, "error"), verdict["why"]
    assert "set-up failed" in verdict["why"] and "exited with status 7: setup refuses this commit" in verdict["why"]
    (row,) = bisection(verdict)["evaluations"]
    assert (row["outcome"], row["status"]) == ("skipped", None)
    assert_clean(repo)


def test_a_rerun_step_renders_as_a_bisect_command_line() -> None:
    step = Step("bisect the range that is left", command="bisect",
                arguments={"good": "abc", "bad": "def", "definition": "probes/b.toml", "select": ["kernel-speed"],
                           "max_evaluations": 20, "setup": "pip install -e ."})
    assert argv(step) == ["glmfb", "bisect", "abc", "def", "probes/b.toml", "-k", "kernel-speed",
                          "--max-evaluations", "20", "--setup", "pip install -e ."]
    assert shell_line(step).startswith("glmfb bisect abc def probes/b.toml -k kernel-speed")



def test_an_undecided_commit_is_unknown_and_the_range_around_it_is_named(toy: Path, tmp_path: Path) -> None:
    """The toy probe (a single-target probe that says what its definition tells it) passes up to
    commit 3, cannot decide at commit 4 and fails from commit 5: commit 4 is unknown (the toy
    has no budget to raise, so it is not rerun), and the answer is the range 4..5, inconclusive."""
    toml = '[[probe]]\nname = "toy-says"\nprobe = "toy"\noptions = {{ outcome = "{outcome}" }}\n'
    outcomes = {1: "pass", 2: "pass", 3: "pass", 4: "inconclusive", 5: "fail"}
    repo = build_repo(tmp_path / "toy", 8, {
        number: (f"toy: {outcome}", {"probes/bisect.toml": toml.format(outcome=outcome)})
        for number, outcome in outcomes.items()
    })
    code, verdict = bisect(repo, repo.shas[0], repo.shas[-1], "toy-says", tmp_path / "r")
    report("an undecided commit", verdict)
    assert (code, verdict["status"]) == (4, "inconclusive"), verdict["why"]
    found = bisection(verdict)
    assert found["unknown"] == [repo.shas[3]] and found["unsplit"] == [repo.shas[3], repo.shas[4]]
    assert found["culprit"] is None and "commit" not in verdict["where"]
    assert_clean(repo)


def test_two_versions_of_one_package_in_one_process_are_refused_not_compared(tmp_path: Path) -> None:
    """A target inside a package imports under the same name from GOOD's worktree and from the
    commit's, and one process holds one of them: the bisection says so instead of passing."""
    packaged = DEFINITIONS.replace("../kernels.py:make", "../pkg/kernels.py:make")
    repo = build_repo(tmp_path / "pkg", 3, {1: ("", {"pkg/__init__.py": "", "pkg/kernels.py": KERNELS.format(passes=1),
                                                      "probes/bisect.toml": packaged})})
    code, verdict = bisect(repo, repo.shas[0], repo.shas[-1], "kernel-speed", tmp_path / "r")
    assert (code, verdict["status"]) == (3, "error"), verdict["why"]
    assert "sits in the package pkg, so both versions would import as pkg.kernels" in verdict["why"]
    assert bisection(verdict)["evaluations"][0]["status"] is None  # refused before any probe ran
    assert_clean(repo)
