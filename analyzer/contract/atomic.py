"""Write a file so that readers see either the old file or the whole new one, never a part.

Part of the contract (analyzer/contract/errors.py says why it is a module of its own): the tracer writes
every run-directory file through it (the manifest last, so its presence means the run is
complete) and the analyzer its outputs. The temp file is ``.tmp-<random>-<name>`` in the same
folder: hidden, so no reader takes it for an input, and keeping the name's suffixes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temp path in ``path``'s folder (created when missing) for a writer that takes a
    file name (``pq.write_table``, ``save_file``). When the block ends normally the temp file
    gets the usual mode (0666 less the umask; mkstemp creates 0600), is flushed to disk and
    replaces ``path`` (``os.replace``); on any exception it is removed. Raises ``OSError``
    (e.g. ``IsADirectoryError`` when ``path`` is a folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=f"-{path.name}")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path | str, data: str | bytes) -> None:
    """Write ``data`` (str as UTF-8) to ``path`` through ``atomic_path``. Raises ``OSError``."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
