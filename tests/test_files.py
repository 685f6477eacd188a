"""lospmm.files: a file we write is whole or absent, and readable as any file its writer makes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from lospmm.files import atomic_write, manifest_problem, write_manifest


def test_a_written_file_has_the_mode_a_plain_open_gives(tmp_path):
    # mkstemp's 0600 would leave a kernel package unreadable to the account that serves it
    plain = tmp_path / "plain"
    plain.write_text("x")
    atomic_write(tmp_path / "written", lambda tmp: Path(tmp).write_text("x"))
    mode = stat.S_IMODE(os.stat(tmp_path / "written").st_mode)
    # under the usual umask (022: CI's) 0644, where mkstemp's would be 0600; under 077 both are 0600
    assert mode == stat.S_IMODE(os.stat(plain).st_mode)
    # the umask when the file is written, not when lospmm was imported (the kernel applies it)
    before = os.umask(0o027)
    try:
        atomic_write(tmp_path / "later", lambda tmp: Path(tmp).write_text("x"))
    finally:
        os.umask(before)
    assert stat.S_IMODE(os.stat(tmp_path / "later").st_mode) == 0o640


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "f"
    path.write_text("old")

    def half_written(tmp):
        Path(tmp).write_text("ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, half_written)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_a_directory_is_trusted_only_while_its_manifest_matches(tmp_path):
    (tmp_path / "a").write_text("a")
    expected = write_manifest(tmp_path, ["a"])
    assert manifest_problem(tmp_path, expected, required=("a",)) is None
    assert "does not list b" in manifest_problem(tmp_path, expected, required=("b",))
    (tmp_path / "a").write_text("changed")
    assert manifest_problem(tmp_path, expected) is not None
