"""The one key rule of the analyzer's two caches: the per-rank tables (analyzer/ingest/tablecache.py) and
the whole report (reports/cache.py).

A cached result is valid when the key stored with it equals ``cache_key(content, modules)``: a
BLAKE2b hash of ``content`` (what the result was computed from: the SHA-256 of a trace's bytes
as stored, its gzip bytes for a .json.gz, matched first on its stat and the hash of its ends
as analyzer/ingest/tablecache.py ``stat_sig`` says; or the
report's options and the stat signatures of its input files, ``input_signature``, a walk
that follows links where the ingest does), of the source of every module in
``modules`` (the code that computes the result) and of the installed versions of the libraries
the analysis runs on (``LIBS``). Any change to any of them is a miss. Light on purpose: a
cached report renders without importing pandas, pyarrow or numpy.

A cache file is also input the user did not write: one planted in the cache folder, or copied
into it from elsewhere, must not replace the analysis. ``sign`` / ``verify`` authenticate a cache
file's bytes with HMAC-SHA256 under a per-user secret key (``user_key``: 32 random bytes in
``cache_dir()/KEY_NAME``, mode 0600, made on first use): a cache written by this user's
analyzer verifies; one written by anybody else, or edited, does not and is recomputed, and
``read_signed`` holds none of its bytes before it verifies. Each
cache folder is kept within a size (``trim``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import re
import stat
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from analyzer.contract import settings

LIBS = ("pandas", "numpy", "pyarrow", "msgspec")
KEY_NAME = "cache.key"
"""The per-user secret key file in ``cache_dir()`` (``user_key``)."""
MAC_BYTES = 32
"""Length of a cache file's HMAC-SHA256 (``sign``)."""
_KEY_BYTES = 32
log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/paritytrace`` (``XDG_CACHE_HOME`` defaults to ``~/.cache``)."""
    return settings.cache_home() / "paritytrace"


def read_regular(path: Path, limit_bytes: int | None = None) -> bytes:
    """The bytes of the cache file ``path``, read only when it is a regular file of at most
    ``limit_bytes`` (default ``settings.cache_max_bytes()``): a symlink (``/dev/zero``), a FIFO
    or a device left in the cache folder is refused before anything is read, so it can neither
    hang the command nor fill its memory. Raises ``FileNotFoundError`` when absent, ``OSError``
    otherwise."""
    with _open_regular(path, limit_bytes) as fh:
        return fh.read()


def read_signed(path: Path, magic: bytes, limit_bytes: int | None = None) -> bytes | None:
    """The payload of the signed cache file ``path`` (``magic``, then ``sign(payload)``, then
    the payload), held in memory only once it verifies: the file checked as ``read_regular``
    does, then its first bytes against ``magic``, then its HMAC computed over the file in
    chunks of ``_CHUNK_BYTES`` -- a planted file (a sparse one of any size within the cap, a
    copied or edited cache) costs one chunk of memory, never its size. The payload is verified
    again as read (a file changed in between is refused too). None when it does not verify or
    this user has no cache key; raises ``FileNotFoundError`` when absent, ``OSError`` when not
    a regular file within the cap."""
    with _open_regular(path, limit_bytes) as fh:
        # the key only once a cache file is there: reading an absent entry makes no key file
        # (an input refused before anything is cached leaves the cache folder as it was)
        key = user_key()
        head = fh.read(len(magic) + MAC_BYTES)
        if key is None or len(head) != len(magic) + MAC_BYTES or not head.startswith(magic):
            return None
        mac = head[len(magic):]
        h = hmac.new(key, digestmod=hashlib.sha256)
        while chunk := fh.read(_CHUNK_BYTES):
            h.update(chunk)
        if not hmac.compare_digest(h.digest(), mac):
            return None
        fh.seek(len(head))
        payload = fh.read()
    return payload if verify(payload, mac) else None


_CHUNK_BYTES = 1 << 20


def _open_regular(path: Path, limit_bytes: int | None):
    """``path`` opened for reading when it is a regular file of at most ``limit_bytes``
    (``read_regular``), without following a symlink or blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    fh = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    limit = settings.cache_max_bytes() if limit_bytes is None else limit_bytes
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        fh.close()
        raise OSError(f"not a regular file of at most {limit} bytes: {path}")
    if _sparse(st):
        fh.close()
        raise OSError(f"a sparse file ({st.st_size:,} bytes, {st.st_blocks * 512:,} on disk), "
                      f"which the analyzer never writes: {path}")
    return fh


_SPARSE_MIN_BYTES = 1 << 20


def _sparse(st: os.stat_result) -> bool:
    """True when a file of ``st`` holds a MiB or more and under an eighth of it is on disk: a
    sparse file, which a cache written front to back never is (a filesystem that compresses
    stores no less than an eighth of Arrow's and msgpack's bytes); rundirs.py has the same
    rule for run files."""
    blocks = getattr(st, "st_blocks", None)
    return blocks is not None and st.st_size >= _SPARSE_MIN_BYTES and blocks * 512 * 8 < st.st_size


def input_signature(root: Path, out: Path, skip_suffixes: tuple[str, ...] = ()) -> list[list[Any]]:
    """[relative path, size, mtime_ns, ctime_ns, inode, device] of every file under ``root``
    that the analysis may read, leaving out ``out``, names ending in ``skip_suffixes`` and ``.tmp-*`` files
    being written. The report cache's key (reports/cache.py). Symlinks
    are followed by the ingest's rule (analyzer/ingest/fswalk.py ``link_skipped``): only to a
    target inside the folder being walked, never into a loop; a link it does not follow is
    recorded as the link alone (a link to ``/`` or ``/sys`` costs one row, not a walk of the
    machine). The one way out is the ingest's too (rundirs.py ``linked_run``): a link in
    ``root`` to a run directory (the documented "folder of symlinks to run dirs") is recorded
    as the link and its target's files are walked under the link's path, confined to that run
    directory: a linked run re-recorded changes the key. A folder reached twice (two links to
    one run) is walked once per link path but never inside itself."""
    from analyzer.ingest.fswalk import link_skipped, linked_folder

    rows: list[list[Any]] = []
    if root.is_file():
        st = root.stat()
        return [[root.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]]
    out_real = os.path.realpath(out)

    def linked_run(link: Path) -> Path | None:
        if linked_folder(link, root) is None:  # not a folder outside: no run dir to ask about
            return None
        from analyzer.ingest.rundirs import linked_run  # pyarrow: only for a folder of links

        return linked_run(link, root)

    def walk(folder: str, rel: str, base: Path, above: frozenset) -> None:
        try:
            st = os.stat(folder)
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            rows.append([rel or ".", -1, -1, -1, -1, -1])
            return
        here = above | {(st.st_dev, st.st_ino)}
        for e in entries:
            p, r = e.path, os.path.join(rel, e.name) if rel else e.name
            inner = base
            if e.is_symlink():
                if os.path.realpath(p) == out_real:
                    continue
                rows.append([r, "link", os.readlink(p)])
                if link_skipped(Path(p), base) is not None:
                    target = linked_run(Path(p)) if not rel else None
                    if target is None:
                        continue  # not followed by the ingest: the link alone is in the key
                    inner = target  # a linked run: walked inside itself only
            try:
                is_dir = e.is_dir(follow_symlinks=True)
            except OSError:
                is_dir = False
            if is_dir:
                if os.path.realpath(p) == out_real:
                    continue
                try:
                    target_st = os.stat(p)
                except OSError:
                    continue
                if (target_st.st_dev, target_st.st_ino) not in here:  # a cycle: not entered
                    walk(p, r, inner, here)
                continue
            if e.name.endswith(skip_suffixes) or e.name.startswith(".tmp-"):
                continue
            try:
                fst = os.stat(p)  # a symlinked file: its target's signature
                rows.append([r, fst.st_size, fst.st_mtime_ns, fst.st_ctime_ns, fst.st_ino,
                             fst.st_dev])
            except OSError:
                rows.append([r, -1, -1, -1, -1, -1])

    walk(os.fspath(root), "", Path(os.path.realpath(root)), frozenset())
    return rows


TRIM_UNSEEN_SHARE = 16
"""A process scans a cache folder again once it has written a ``1 / TRIM_UNSEEN_SHARE`` share
of the files it counted there (``trim``)."""
_SEEN: dict[tuple[str, str], list[int]] = {}
"""(folder, names) -> [bytes counted at this process's last scan plus those it wrote since,
files counted then, files written since]."""


def trim(folder: Path, names: str, added_bytes: int) -> None:
    """Keep the cache folder ``folder`` within ``settings.cache_max_bytes()`` bytes, after a
    file of ``added_bytes`` was written in it: while the files whose whole name matches the
    regular expression ``names`` (the tool's own cache files) total more, delete the least
    recently used (oldest mtime first; a hit touches its file). Other files (``KEY_NAME``,
    ``.tmp-*`` being written, any other name, symlinks) are neither counted nor deleted; a file
    that vanishes or cannot be deleted is skipped, never raised.

    The folder is scanned on this process's first write to it, then whenever what it counted
    plus what it wrote since passes the cap, or it has written a ``1 / TRIM_UNSEEN_SHARE`` share
    of the files it counted: a scan per write made a job of N ranks cost N^2 / 2 directory
    entries (8.4 million at 4,096 ranks). Other processes' writes are unseen in between, so
    while several write at once the folder can pass its cap by up to that share of its files
    per process, until the next scan."""
    seen = _SEEN.get(key := (str(folder), names))
    cap_bytes = settings.cache_max_bytes()
    if seen is not None:
        seen[0] += added_bytes
        seen[2] += 1
        if seen[0] <= cap_bytes and seen[2] * TRIM_UNSEEN_SHARE < seen[1]:
            return
    files = []
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for e in entries:
            with contextlib.suppress(OSError):
                if re.fullmatch(names, e.name) and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    files.append((st.st_mtime_ns, st.st_size, e.path))
    total_bytes, kept = sum(f[1] for f in files), len(files)
    for _, size_bytes, path in sorted(files):
        if total_bytes <= cap_bytes:
            break
        try:
            os.unlink(path)
            total_bytes -= size_bytes
            kept -= 1
        except FileNotFoundError:
            total_bytes -= size_bytes  # trimmed by another process
            kept -= 1
        except OSError as exc:
            log.info("could not trim cache file %s (%s)", path, exc)
    _SEEN[key] = [total_bytes, kept, 0]


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


def user_key() -> bytes | None:
    """This user's secret cache key (``cache_dir()/KEY_NAME``), made with 32 random bytes and
    mode 0600 when absent (atomically: of two processes making it at once, both read the one
    that was linked first). None when it cannot be read or made (a read-only home), or when the
    file is not this user's own, private key: then no cache is trusted or written."""
    return _key_at(str(cache_dir() / KEY_NAME))


@lru_cache(maxsize=4)
def _key_at(path: str) -> bytes | None:
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.info("no cache key (%s): caches are not used", exc)
        return None
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(os.urandom(_KEY_BYTES))
            try:
                os.link(tmp, path)  # fails if another process linked its key first
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
        return _read_key(path)
    except OSError as exc:
        log.info("no cache key (%s): caches are not used", exc)
        return None


def key_exists() -> bool:
    """True when this user's cache key file is there (``user_key`` makes it on first use)."""
    return os.path.lexists(cache_dir() / KEY_NAME)


def forget_new_key() -> None:
    """Remove the cache key a refused command made (the caller saw no key before it began,
    ``key_exists``) when no file but the key is under ``cache_dir()``: nothing it signed is
    kept, so a refused input leaves no cache file (issue 42). Left when anything else is
    there (another command's caches signed with it)."""
    folder = cache_dir()
    try:
        others = [p for p in folder.rglob("*") if not p.is_dir() and p.name != KEY_NAME]
        if not others:
            (folder / KEY_NAME).unlink()
            _key_at.cache_clear()
    except OSError as exc:
        log.info("could not remove the cache key (%s)", exc)


def _read_key(path: str) -> bytes | None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        key = fh.read(_KEY_BYTES + 1)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077 \
            or len(key) != _KEY_BYTES:
        log.info("ignoring cache key %s: not this user's private %d-byte file", path, _KEY_BYTES)
        return None
    return key


def sign(payload: bytes) -> bytes | None:
    """HMAC-SHA256 of ``payload`` under ``user_key()`` (``MAC_BYTES``), None without a key."""
    key = user_key()
    return None if key is None else hmac.new(key, payload, hashlib.sha256).digest()


def verify(payload: bytes, mac: bytes) -> bool:
    """True when ``mac`` is ``sign(payload)`` (compared in constant time)."""
    want = sign(payload)
    return want is not None and hmac.compare_digest(want, bytes(mac))
