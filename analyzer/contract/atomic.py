"""Write a file so that readers see either the old file or the whole new one, never a part.

Part of the contract (analyzer/contract/errors.py says why it is a module of its own): the tracer writes
every run-directory file through it (the manifest last, so its presence means the run is
complete) and the analyzer its outputs. The new file is written as ``<name>`` inside a temp
folder ``.tmp-<random>-<name>`` in the same folder: hidden, so no reader takes it for an input
(folder walks skip hidden folders), and keeping the name's suffixes. The temp folder's first
entry is an owner file (analyzer/contract/owner.py): a writer killed beyond any clean-up
(SIGKILL, a power cut) leaves a folder that the next atomic write into that folder, by any
process of either program, removes once ``owner.owner_dead`` proves its writer gone; a folder
holding anything but the owner file and that one file, or not provably orphaned, stays.
Temp files of the older form (a bare ``.tmp-<random>-<name>`` file) carry no owner and stay.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from analyzer.contract import owner

TEMP_PREFIX = ".tmp-"
_TEMP_RE = re.compile(r"\.tmp-[a-z0-9_]{8}-(.+)")
"""A temp folder of ``atomic_path``: mkdtemp's 8 random characters, then the file's name."""
_swept: set[str] = set()
"""Folders this process has swept (``sweep_leftovers``): once each, not once per write."""


def sweep_leftovers(folder: Path | str) -> list[Path]:
    """Remove the temp folders of ``atomic_path`` in ``folder`` whose writer is provably dead
    (``owner.sweep``: this user's, no symlink, nothing in them but the owner file and the one
    file being written). Returns those removed; never raises ``OSError``."""
    removed: list[Path] = []
    try:
        names = [p.name for p in Path(folder).iterdir() if _TEMP_RE.fullmatch(p.name)]
    except OSError:
        return removed
    for name in names:
        inner = _TEMP_RE.fullmatch(name).group(1)
        removed += owner.sweep(Path(folder), lambda n, name=name: n == name,
                               lambda rel, inner=inner: rel == inner)
    return removed


def _sweep_once(folder: Path) -> None:
    key = os.path.abspath(folder)
    if key not in _swept:
        _swept.add(key)
        sweep_leftovers(folder)


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temp path for ``path`` (its folder created when missing) for a writer that takes
    a file name (``pq.write_table``, ``save_file``): ``path``'s name inside a fresh owned temp
    folder beside it (module doc). When the block ends normally the temp file gets the usual
    mode (0666 less the umask), is flushed to disk and replaces ``path`` (``os.replace``); the
    temp folder is removed either way. Raises ``OSError`` (e.g. ``IsADirectoryError`` when
    ``path`` is a folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_once(path.parent)
    folder = Path(tempfile.mkdtemp(dir=path.parent, prefix=TEMP_PREFIX, suffix=f"-{path.name}"))
    tmp = folder / path.name
    try:
        owner.write_owner(folder)  # first: a SIGKILL from here leaves a folder a sweep removes
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # ours: made by mkdtemp above


def write_atomic(path: Path | str, data: str | bytes) -> None:
    """Write ``data`` (str as UTF-8) to ``path`` through ``atomic_path``. Raises ``OSError``."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
