"""Write a file so that readers see either the old file or the whole new one, never a part.

The analyzer's outputs (report files, the summary JSON, a merged trace and its offsets) go
through ``write_atomic``: a temp file in the same folder, then ``os.replace``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` (str as UTF-8) to ``path`` via a temp file in the same folder and
    ``os.replace``, creating missing parent folders; the file gets the usual mode (0666 less
    the umask; mkstemp creates 0600). The temp file is removed on any failure. Raises
    ``OSError`` (e.g. ``IsADirectoryError`` when ``path`` is a folder)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
