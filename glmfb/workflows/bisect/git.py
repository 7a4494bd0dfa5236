"""The git side of a bisection: the repository that holds a definition, its revisions, the
first-parent chain between two of them, and one detached worktree per commit under test.

Every git call goes through :func:`git`, which turns a failing command into a
:class:`GitError` that says what went wrong in one line (a bisection answers it with an
error verdict, never a traceback). Worktrees are made from commits, so a dirty checkout is
fine: nothing in the user's own working tree is read or changed.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from glmfb.contract.errors import HarnessError


class GitError(HarnessError):
    """A git command failed, or the revisions cannot be bisected (an error verdict)."""


@dataclass(frozen=True)
class Commit:
    """One commit: its full sha and its subject line."""

    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:10]

    def describe(self) -> str:
        """``1a2b3c4d5e "subject"``: how a why names a commit."""
        return f'{self.short} "{self.subject}"'


def git(repo: Path, *args: str, timeout_s: float = 120.0) -> str:
    """Run ``git -C repo ARGS`` and return its stdout (stripped); a failure is a :class:`GitError`
    whose message is git's last line of stderr."""
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise GitError("git is not installed", "install git; glmfb bisect runs it") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"git {args[0]} did not finish in {timeout_s:g} s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise GitError(f"git {' '.join(args[:2])}: {lines[-1] if lines else f'exit status {done.returncode}'}")
    return done.stdout.strip()


def repository_of(path: Path) -> Path:
    """The top folder of the git repository that holds ``path``."""
    folder = path.resolve().parent if not path.is_dir() else path.resolve()
    try:
        top = git(folder, "rev-parse", "--show-toplevel")
    except GitError:
        raise GitError(f"{path} is not in a git repository",
                       "glmfb bisect walks the history of the repository that holds the definition") from None
    return Path(top).resolve()


def resolve(repo: Path, rev: str) -> Commit:
    """The commit a revision names (a sha, a branch, a tag, ``HEAD~3``)."""
    try:
        sha = git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except GitError:
        sha = ""
    if not sha:
        raise GitError(f"{rev!r} is not a commit of {repo}", "give a sha, a branch, a tag or HEAD~N")
    return Commit(sha, subject(repo, sha))


def subject(repo: Path, sha: str) -> str:
    return git(repo, "log", "-1", "--format=%s", sha)


def first_parent_chain(repo: Path, good: Commit, bad: Commit) -> list[Commit]:
    """The commits under test, oldest first: BAD's first-parent chain back to (not including)
    GOOD, which must be an ancestor of BAD."""
    if good.sha == bad.sha:
        raise GitError(f"GOOD and BAD are the same commit ({good.short})", "give an older GOOD or a newer BAD")
    done = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", good.sha, bad.sha],
                          capture_output=True, text=True, check=False)
    if done.returncode == 1:
        raise GitError(f"GOOD {good.short} is not an ancestor of BAD {bad.short}",
                       "GOOD must come before BAD in BAD's history (swap them?)")
    if done.returncode != 0:
        raise GitError(f"git merge-base: {done.stderr.strip() or f'exit status {done.returncode}'}")
    lines = git(repo, "log", "--first-parent", "--reverse", "--format=%H %s", f"{good.sha}..{bad.sha}")
    chain = [Commit(*line.split(" ", 1)) if " " in line else Commit(line, "") for line in lines.splitlines()]
    if not chain or chain[-1].sha != bad.sha:
        raise GitError(f"BAD {bad.short} has no first-parent path back to GOOD {good.short}")
    return chain


class Worktrees:
    """Detached worktrees of one repository in a temporary folder, each removed when done
    with, and all of them (and git's record of them) on :meth:`close`, also on an error or an
    interrupt (use it as a context manager)."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.root = Path(tempfile.mkdtemp(prefix="glmfb-bisect-"))
        self.live: dict[Path, str] = {}

    def add(self, commit: Commit) -> Path:
        path = self.root / commit.sha[:12]
        git(self.repo, "worktree", "add", "--detach", "--quiet", str(path), commit.sha, timeout_s=600.0)
        self.live[path] = commit.sha
        return path

    def remove(self, path: Path) -> None:
        self.live.pop(path, None)
        with suppress(GitError):
            git(self.repo, "worktree", "remove", "--force", str(path))
        shutil.rmtree(path, ignore_errors=True)

    @contextmanager
    def checkout(self, commit: Commit) -> Iterator[Path]:
        """A worktree of ``commit`` for the duration of the block."""
        path = self.add(commit)
        try:
            yield path
        finally:
            self.remove(path)

    def close(self) -> None:
        for path in list(self.live):
            self.remove(path)
        shutil.rmtree(self.root, ignore_errors=True)
        with suppress(GitError):
            git(self.repo, "worktree", "prune")

    def __enter__(self) -> Worktrees:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
