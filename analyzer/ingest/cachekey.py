"""The one key rule of the analyzer's two caches: the per-rank tables (analyzer/ingest/pipeline.py) and
the whole report (reports/cache.py).

A cached result is valid when the key stored with it equals ``cache_key(content, modules)``: a
BLAKE2b hash of ``content`` (what the result was computed from: a trace's SHA-256, or the
report's options and the stat signatures of its input files), of the source of every module in
``modules`` (the code that computes the result) and of the installed versions of the libraries
the analysis runs on (``LIBS``). Any change to any of them is a miss. Light on purpose: a
cached report renders without importing pandas, pyarrow or numpy.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from importlib import metadata
from pathlib import Path

LIBS = ("pandas", "numpy", "pyarrow", "msgspec")


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/paritytrace`` (``XDG_CACHE_HOME`` defaults to ``~/.cache``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "paritytrace"


def cache_key(content: str, modules: tuple[Path, ...]) -> str:
    """The key (32 hex digits) of a result computed from ``content`` by ``modules`` (module
    docstring). Raises ``OSError`` when a module's source cannot be read."""
    h = hashlib.blake2b(content.encode(), digest_size=16)
    h.update(_code(tuple(modules)))
    return h.hexdigest()


@lru_cache(maxsize=4)
def _code(modules: tuple[Path, ...]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in modules:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    for lib in LIBS:
        h.update(f"{lib}={_version(lib)}".encode())
    return h.digest()


def _version(lib: str) -> str:
    """Installed version of ``lib`` ("none" when absent), read without importing it."""
    try:
        return metadata.version(lib)
    except metadata.PackageNotFoundError:
        return "none"
