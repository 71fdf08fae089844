"""Whole-report cache: a second ``analyzer report`` on unchanged inputs skips the analysis.

The report dict (report.json's content) is a function of the files under DIR, the options and
the code. Its key is ``analyzer.cachekey.cache_key`` (the one key rule of the analyzer's
caches: content, code, library versions) of: the resolved DIR and output folder, the options,
and the stat signature (relative path, size, mtime_ns, ctime_ns, inode, device) of every file
under DIR (recursively, symlinks followed at most as deep as the walk goes, leaving out the
output folder and the per-rank tables cache), computed by the source of every ``analyzer``
and ``reports`` module. Any change to any of them is a miss. The ctime is in the key because
the mtime can be set back (``cp -p``, ``touch -d``, ``os.utime``): a file rewritten in place
with the same size and its old mtime would otherwise be served the stale report, skipping the
manifest's sha256 check (analyzer/rundirs.py) that a miss runs; the kernel sets the ctime on
every write or utime and no user call can set it back.

The cache is ``$XDG_CACHE_HOME/paritytrace/reports/<hash of DIR and output folder>.json``
(``~/.cache`` when unset; the report dict as report.json writes it plus the key and the notes
the analysis said on stderr, which a hit says again), written atomically after the report; the
output folder holds only the report files. A hit renders from the cached dict: no pandas
import, no trace read. Both paths render from the dict after a JSON round trip, so their
outputs are identical. A cache that cannot be read or written is skipped (log line), never an
error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from analyzer.cachekey import cache_dir, cache_key

log = logging.getLogger(__name__)

_SKIP_SUFFIXES = (".tables.msgpack",)
_HERE = Path(__file__).resolve().parent
_MODULES = tuple(sorted((*(_HERE.parent / "analyzer").glob("*.py"), *_HERE.glob("*.py"))))


def _files(root: Path, out: Path) -> list[list[Any]]:
    """[relative path, size, mtime_ns, ctime_ns, inode, device] of every file under ``root``."""
    rows: list[list[Any]] = []
    if root.is_file():
        st = root.stat()
        return [[root.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]]
    out_real = os.path.realpath(out)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames
                             if os.path.realpath(os.path.join(dirpath, d)) != out_real)
        for name in sorted(filenames):
            if name.endswith(_SKIP_SUFFIXES) or name.startswith(".tmp-"):
                continue
            p = os.path.join(dirpath, name)
            try:
                st = os.stat(p)
                row = [os.path.relpath(p, root), st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                       st.st_ino, st.st_dev]
            except OSError:
                row = [os.path.relpath(p, root), -1, -1, -1, -1, -1]
            rows.append(row)
        # a symlink to a folder is not walked (followlinks=False): record the link itself
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if os.path.islink(p):
                rows.append([os.path.relpath(p, root), "link", os.readlink(p)])
    return rows


def key(root: Path, out: Path, options: dict[str, Any]) -> str:
    """The cache key of a report of ``root`` written to ``out`` with ``options``."""
    return cache_key(json.dumps({"root": os.path.realpath(root), "out": os.path.realpath(out),
                                 "options": options, "files": _files(root, out)},
                                sort_keys=True), _MODULES)


def _path(root: Path, out: Path) -> Path:
    name = hashlib.blake2b(f"{os.path.realpath(root)}\0{os.path.realpath(out)}".encode(),
                           digest_size=16).hexdigest()
    return cache_dir() / "reports" / f"{name}.json"


def load(root: Path, out: Path, k: str) -> dict[str, Any] | None:
    """The cached report dict of ``root`` -> ``out`` for key ``k``, None when absent, stale or
    unreadable."""
    hit = load_entry(root, out, k)
    return None if hit is None else hit[0]


def load_entry(root: Path, out: Path, k: str) -> tuple[dict[str, Any], list[str]] | None:
    """(report dict, notes) cached for ``root`` -> ``out`` and key ``k``; None when absent,
    stale or unreadable. ``notes``: the lines the analysis that made the report said on stderr
    (``store``), so a hit can say them again."""
    path = _path(root, out)
    try:
        blob = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.info("ignoring unreadable report cache %s (%s)", path, exc)
        return None
    if not isinstance(blob, dict) or blob.get("key") != k or not isinstance(blob.get("report"), dict):
        return None
    notes = blob.get("notes")
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        return None  # a cache written before notes were kept: a miss re-creates it
    return blob["report"], notes


def store(root: Path, out: Path, k: str, report_json: str, notes: list[str] = ()) -> None:
    """Write the cache atomically: ``report_json`` (report.json's text) and ``notes`` (the
    lines the analysis said on stderr, one per note)."""
    from reports.jsonout import write_atomic

    path = _path(root, out)
    try:
        write_atomic(path, f'{{"key": "{k}", "notes": {json.dumps(list(notes))}, '
                           f'"report": {report_json}}}')
    except OSError as exc:
        log.info("could not write report cache %s (%s)", path, exc)
