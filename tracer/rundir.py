"""Run-directory files: clearing stale files, the file list with sha256.

Every file is written with ``analyzer.contract.atomic`` (a temp name in the same folder, then
``os.replace``), so a reader never sees half a file; ``manifest.json`` is written last
(see ``manifest.py``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from analyzer.contract.schemas import MANIFEST_NAME, MEMORY_DIR, FileEntry, sha256_file

PARTS_DIR = ".parts"
"""Per-rank partial tables, merged by rank 0 and removed before the manifest is written."""


def clear_run_dir(run_dir: Path) -> None:
    """Make ``run_dir`` empty of a previous record, manifest first of all.

    Removing the manifest first means an interrupted clear leaves an incomplete (manifest-less)
    directory, never a manifest describing files that are gone. Removes only what a record
    writes (traces, Parquet, baseline, memory/, partial and temp files); creates the folder.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    manifest = run_dir / MANIFEST_NAME
    manifest.unlink(missing_ok=True)
    for pattern in ("rank*.trace.json.gz", "*.parquet", "baseline.safetensors",
                    ".baseline.activations.safetensors", ".tmp-*"):
        for f in run_dir.glob(pattern):
            f.unlink(missing_ok=True)
    for d in (MEMORY_DIR, PARTS_DIR):
        shutil.rmtree(run_dir / d, ignore_errors=True)


def file_entries(run_dir: Path) -> list[FileEntry]:
    """One entry for every file under ``run_dir`` except the manifest and
    hidden (partial / temp) files; paths relative, '/'-separated, sorted."""
    entries = []
    for f in sorted(run_dir.rglob("*")):
        rel = f.relative_to(run_dir)
        if not f.is_file() or rel.as_posix() == MANIFEST_NAME or any(p.startswith(".") for p in rel.parts):
            continue
        entries.append(FileEntry(path=rel.as_posix(), size_bytes=f.stat().st_size, sha256=sha256_file(f)))
    return entries
