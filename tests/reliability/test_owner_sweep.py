"""The one sweep of temporary folders that killed runs left (analyzer/contract/owner.py
``sweep``): a folder goes only when its name is the caller's, its owner is provably dead and it
holds nothing but what the caller writes, no symlink at any depth. A dead owner here is this
process with another start time (a reused pid, what ``owner.dead`` proves gone); oracle: the
folders on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from analyzer.contract import owner

LIVE = owner.identity()
pytestmark = pytest.mark.skipif(LIVE is None, reason="no /proc: no owner is provably dead")


def _dead() -> str:
    pid, ticks, boot, host = LIVE.split()
    return f"{pid} {int(ticks) + 1} {boot} {host}"


def _left(folder: Path, ident: str | None, files=("1.part",)) -> Path:
    folder.mkdir()
    if ident is not None:
        (folder / owner.OWNER_NAME).write_text(ident + "\n")
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("x")
    return folder


def _sweep(parent: Path) -> list[Path]:
    return owner.sweep(parent, lambda name: name.startswith("tmp-"),
                       lambda rel: rel in ("part/", "1.part", "part/2.part"))


def test_a_dead_owners_folder_holding_only_its_files_is_swept(tmp_path):
    dead = _left(tmp_path / "tmp-dead", _dead(), ("1.part", "part/2.part"))
    assert _sweep(tmp_path) == [dead]
    assert not dead.exists()


def test_a_live_owners_and_an_unowned_folder_stay(tmp_path):
    live = _left(tmp_path / "tmp-live", LIVE)
    unowned = _left(tmp_path / "tmp-unowned", None)
    malformed = _left(tmp_path / "tmp-malformed", "12 x")
    assert _sweep(tmp_path) == []
    assert live.exists() and unowned.exists() and malformed.exists()


def test_a_folder_with_a_file_the_caller_does_not_write_or_another_name_stays(tmp_path):
    foreign = _left(tmp_path / "tmp-foreign", _dead(), ("1.part", "notes.txt"))
    deep = _left(tmp_path / "tmp-deep", _dead(), ("part/other/2.part",))
    other_name = _left(tmp_path / "mine-dead", _dead())
    assert _sweep(tmp_path) == []
    assert (foreign / "notes.txt").read_text() == "x"
    assert deep.exists() and other_name.exists()


def test_symlinks_are_never_followed_nor_swept(tmp_path):
    """A dead owner's folder that is a symlink, or holds one (named as the caller's files, to a
    file or to a folder), stays, and so does what the links point at."""
    target = _left(tmp_path / "elsewhere", _dead())
    (tmp_path / "tmp-link").symlink_to(target)
    to_file = _left(tmp_path / "tmp-to-file", _dead(), ())
    (to_file / "1.part").symlink_to(target / "1.part")
    to_dir = _left(tmp_path / "tmp-to-dir", _dead(), ())
    (to_dir / "part").symlink_to(target)
    assert _sweep(tmp_path) == []
    assert (target / "1.part").exists()
    assert all(os.path.lexists(tmp_path / n) for n in ("tmp-link", "tmp-to-file", "tmp-to-dir"))
