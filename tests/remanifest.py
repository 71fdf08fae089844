"""Test helper: re-write a run directory's manifest.json entries for files a test edited on
purpose, so the run still passes the analyzer's size+sha256 check (analyzer/ingest/rundirs.py) and the
test keeps testing what it meant to (a NaN in numerics, a truncated trace ...), not that check."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def refresh_manifest(run_dir: Path | str) -> None:
    """Recompute ``size_bytes`` and ``sha256`` of every file listed in ``run_dir/manifest.json``
    that still exists (hashlib here, independent of the analyzer's own hashing)."""
    run_dir = Path(run_dir)
    path = run_dir / "manifest.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    for f in data.get("files") or []:
        p = run_dir / f["path"]
        if p.is_file():
            raw = p.read_bytes()
            f["size_bytes"] = len(raw)
            f["sha256"] = hashlib.sha256(raw).hexdigest()
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
