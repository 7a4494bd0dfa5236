"""``glmfb bisect`` from where users stand: the repository's root, a subfolder of it, and a
folder outside it, on a definition at the root whose paths are written relative to it
(``model.py:make``, ``requests.jsonl``). Every path resolves in the worktree under evaluation,
whatever the working folder; the child runs in the worktree's counterpart of it. A target that
imports code of the user's checkout (its folder on the import path, as an editable install
puts it), or one module for both sides whose two versions differ, is refused with an error
naming the module: never a comparison of code that is not the commit's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_bisect import MODEL, Repo, assert_clean, bisection, build_repo, held
from typer.testing import CliRunner

from glmfb.cli import app

pytestmark = pytest.mark.slow

runner = CliRunner()

CHECKS = '''[[probe]]
name = "model-numerics"
probe = "diff"
baseline = "model.py:make"
candidate = "model.py:make"
options = { requests = "requests.jsonl", minimize = false }
'''

NUMERICS_AT = 4  # of 6 commits: the commit that adds a bias


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    """Six commits; the definition at the root; commit 4 shifts the model's output by 1e-2, and
    the working copy is the tip's (the changed model), as it is when a user bisects."""
    root = tmp_path_factory.mktemp("users") / "project"
    repo = build_repo(root, 6, {
        1: ("", {"checks.toml": CHECKS, "sub/notes.md": "a subfolder\n"}),
        NUMERICS_AT: ("model: add a bias after the projection", {"model.py": MODEL.format(offset=0.01)}),
    })
    return repo


def run_bisect(cwd: Path, good: str, bad: str, definition: str, out: Path,
               monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict[str, Any]]:
    monkeypatch.chdir(cwd)
    result = runner.invoke(app, ["bisect", good, bad, definition, "-k", "model-numerics", "--out", str(out),
                                 "--json"])
    assert result.stdout.strip().startswith("{"), (result.exit_code, result.stdout, result.stderr)
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("where", ["root", "subfolder", "outside"])
def test_the_culprit_is_named_from_the_root_a_subfolder_and_outside(
        where: str, project: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the fix, from the root the candidate resolved ``model.py`` in the working folder
    (the tip's model): every commit read bad, GOOD against itself too, and the answer was
    inconclusive. From outside the same definition answered right."""
    cwd, definition = {"root": (project.path, "checks.toml"),
                       "subfolder": (project.path / "sub", "../checks.toml"),
                       "outside": (tmp_path, str(project.path / "checks.toml"))}[where]
    code, verdict = run_bisect(cwd, project.shas[0], project.shas[-1], definition, tmp_path / "r", monkeypatch)
    assert verdict["status"] == "fail", verdict["why"]
    assert verdict["where"]["commit"] == project.shas[NUMERICS_AT - 1], verdict["why"]
    assert "add a bias" in verdict["why"]
    assert held(verdict, "last good")["verdict"]["status"] == "pass"
    assert code == 1
    assert_clean(project)


def test_a_range_without_a_change_passes_from_the_root(project: Repo, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """GOOD..C3 holds no change of the model; from the root the old code compared every commit
    with the working copy's model and never answered a pass."""
    code, verdict = run_bisect(project.path, project.shas[0], project.shas[NUMERICS_AT - 2], "checks.toml",
                               tmp_path / "r", monkeypatch)
    assert (code, verdict["status"]) == (0, "pass"), verdict["why"]
    assert "no regression between GOOD" in verdict["why"]
    assert len(bisection(verdict)["evaluations"]) == 1


LIBRARY_MODEL = '''"""A diff factory whose offset lives in a package of the repository (mylib)."""

import torch
from torch import nn

{prelude}
import mylib


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(16, 16)
        self.embed = nn.Embedding(64, 16)

    def forward(self, input_ids):
        return self.proj(self.embed(input_ids)) + mylib.OFFSET


def make():
    return Head().eval()
'''

LIBRARY_CHECKS = CHECKS.replace('"model.py:make"', '"bench/model.py:make"')


def library_project(root: Path, prelude: str) -> Repo:
    """Four commits: the target ``bench/model.py`` imports ``mylib`` (a package at the root),
    whose offset commit 3 changes."""
    files = {"checks.toml": LIBRARY_CHECKS, "bench/model.py": LIBRARY_MODEL.format(prelude=prelude),
             "mylib/__init__.py": "OFFSET = 0.0\n"}
    return build_repo(root, 4, {1: ("", files), 3: ("mylib: a bias", {"mylib/__init__.py": "OFFSET = 0.01\n"})})


def test_a_target_importing_the_users_checkout_is_refused_by_name(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's checkout on the import path (an editable install of it): the target's
    ``import mylib`` finds the checkout's package, not the commit's. Refused at BAD, naming it."""
    repo = library_project(tmp_path / "project", prelude="")
    monkeypatch.syspath_prepend(str(repo.path))  # as `pip install -e .` of the checkout would
    code, verdict = run_bisect(repo.path, repo.shas[0], repo.shas[-1], "checks.toml", tmp_path / "r", monkeypatch)
    assert (code, verdict["status"]) == (3, "error"), verdict["why"]
    assert "module 'mylib' was imported from your checkout" in verdict["why"]
    assert str(repo.path / "mylib" / "__init__.py") in verdict["why"]
    assert bisection(verdict)["evaluations"][0]["outcome"] == "skipped"
    assert_clean(repo)


def test_one_module_for_both_sides_that_differs_between_them_is_refused(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The target puts its own repository's root on the import path and imports ``mylib``: in
    one process the baseline (GOOD's worktree) imports it first and the candidate gets GOOD's
    version. Where mylib changed, that is refused; the old code passed BAD against GOOD."""
    prelude = "import sys\nfrom pathlib import Path\n\nsys.path.insert(0, str(Path(__file__).resolve().parents[1]))"
    repo = library_project(tmp_path / "project", prelude=prelude)
    code, verdict = run_bisect(repo.path, repo.shas[0], repo.shas[-1], "checks.toml", tmp_path / "r", monkeypatch)
    assert (code, verdict["status"]) == (3, "error"), verdict["why"]
    assert "module 'mylib' (mylib/__init__.py) was imported once, from GOOD's worktree" in verdict["why"]
    # before the change, the same module is the same file on both sides: nothing to refuse
    code, verdict = run_bisect(repo.path, repo.shas[0], repo.shas[1], "checks.toml", tmp_path / "r2", monkeypatch)
    assert (code, verdict["status"]) == (0, "pass"), verdict["why"]
    assert_clean(repo)
