"""Paths and small helpers of the analyzer-core tests."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.corpus import CORPUS, corpus  # noqa: F401 - used by the test modules

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "core"


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


def dask_ranks_ran(c) -> int:
    """Per-rank tasks (analyzer/ingest/cluster.py ``dask_map``) the Dask cluster ``c``'s
    scheduler has run to completion so far."""
    p = c.scheduler.task_prefixes.get("paritytrace-rank")
    return 0 if p is None else p.state_counts["memory"]
