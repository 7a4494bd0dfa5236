"""Atomic writes: never a half-written file, never a device node replaced, the user's umask."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from glmfb.contract.errors import InputError
from glmfb.core.io import atomic_writer, read_json, write_text_atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_writer(path) as handle:
        handle.write("half")
        raise RuntimeError("interrupted")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_files_get_the_users_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644


def test_a_character_device_is_written_through_not_replaced() -> None:
    write_text_atomic("/dev/null", "discarded")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    with pytest.raises(InputError, match="cannot write /dev/full"):
        write_text_atomic("/dev/full", "x" * 100_000)
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # still the device


def test_a_folder_or_fifo_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a folder"):
        write_text_atomic(tmp_path, "x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        write_text_atomic(fifo, "x")


def test_a_symlink_is_followed_and_kept(tmp_path: Path) -> None:
    real = tmp_path / "real.xml"
    real.write_text("old")
    link = tmp_path / "link.xml"
    link.symlink_to(real)
    write_text_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_deeply_nested_json_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"a":' * 100_000)
    with pytest.raises(InputError, match="nested too deeply"):
        read_json(path)
