"""Paths and small helpers of the analyzer-core tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / ".." / "shared" / "corpus"
FIXTURES = REPO / "fixtures" / "core"


def corpus(rel: str) -> Path:
    """A corpus path; skips the test when the shared corpus is absent."""
    p = CORPUS / rel
    if not p.exists():
        pytest.skip(f"corpus file {rel} not present at {CORPUS}")
    return p


def link_folder(dst: Path, files: list[Path]) -> Path:
    """A folder holding copies of ``files`` (to load a subset of a corpus folder). Copies, not
    symlinks: folder walks never follow a symlink out of the folder given (issue 5)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, dst / f.name)
    return dst


def copy_folder(dst: Path, files: list[Path]) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, dst / f.name)
    return dst
