"""The parse cache: one rank's tables, in the user's cache, never beside its trace (docs/caches.md).

A cache file is ``cache_dir()/tables/<BLAKE2b of the trace's resolved path>.tables.msgpack``:
``CACHE_MAGIC``, an HMAC under this user's secret key (analyzer/ingest/cachekey.py), then msgpack
of the rank's metadata (``RankMeta``) and one Arrow IPC stream per table (never pickle). It is
used only when the HMAC verifies (a planted, copied or edited cache is recomputed), its key
equals ``cache_key(<the trace's content>, CODE_MODULES)`` (``_content``: the SHA-256 of a gzip
trace's bytes as stored, the stat signature of a plain JSON one; any edit of the trace, of the
code that makes the tables or of its libraries is a miss) and its tables are on their schemas
and invariants (``table_invariant``). As git's index does, a cache whose recorded stat signature
of the trace (``stat_sig``: size, mtime, ctime, inode, device and a hash of its first and last
64 KiB) equals the file's is trusted without hashing the whole file again; a gzip trace whose
signature changed is hashed (its gzip bytes: ~1.5 ms), a plain JSON one parsed again. Writes are atomic and
trim the folder to its cap (``cachekey.trim``; a hit touches its file); a cache that cannot be
read or written is skipped with a log line, never an error. A ``<trace>.tables.msgpack`` beside
a trace (an older version's) is never read nor removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from analyzer.contract import schemas, settings
from analyzer.ingest.cachekey import cache_dir, cache_key, trim

log = logging.getLogger(__name__)

_ANALYZER = Path(__file__).parents[1]
CODE_MODULES = tuple(_ANALYZER / m for m in (
    "ingest/decode.py", "ingest/classify.py", "ingest/commid.py", "ingest/steps.py",
    "ingest/ranktables.py", "ingest/tablecache.py", "analyses/breakdown.py",
    "analyses/memory.py", "analyses/collectives.py", "analyses/prefetch.py",
    "analyses/intervals.py", "analyses/straggler.py", "analyses/matchkey.py", "ingest/graphs.py"))
"""The modules whose code shapes the cached tables (part of the cache key)."""
CACHE_MAGIC = b"paritytrace-tables/1\n"
"""First bytes of a per-rank tables cache file: then its HMAC (``cachekey.MAC_BYTES``), then
the msgpack payload the HMAC covers."""


class RankMeta(msgspec.Struct, forbid_unknown_fields=True):
    """A rank's metadata (the ``ranktables.RankTables`` fields of these names) as a per-rank
    tables cache and a Dask worker's result (analyzer/ingest/daskwire.py) carry it, typed:
    fields of other types, or others than these, make the cache a miss and the result
    refused."""

    world_size: int | None
    device_kind: str
    distributed_info: dict[str, Any] | None
    main_tid: str | None
    whole_trace_mode: bool
    warnings: list[str]
    timeline_step: int
    whole_overlap_ns: int
    whole_comm_ns: int
    empty: bool
    first_ns: int


TABLES_NAME = r"[0-9a-f]{32}\.tables\.msgpack"
"""The name of every tables cache file (``tables_cache_path``): what ``trim`` may delete."""


def tables_cache_path(trace: Path) -> Path:
    """Where the tables of ``trace`` are cached (module docstring)."""
    name = hashlib.blake2b(os.fsencode(trace.resolve()), digest_size=16).hexdigest()
    return cache_dir() / "tables" / f"{name}.tables.msgpack"


def stat_sig(path: Path) -> list[int | str]:
    """Size, mtime, ctime, inode and device of ``path``, then its ``probe``: what a cache hit
    is matched on without reading the trace (docs/caches.md "What a hit is keyed on"). The
    ctime is there because the mtime can be set back (``cp -p``, ``touch -d``, ``os.utime``)
    after an edit that keeps the size; the kernel sets the ctime on every write and no user
    call sets it back. The probe is there for what the times miss: an edit within their
    granularity after the cache was written, a file system with no change time. Raises
    ``OSError``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        head = probe(fd, st.st_size) if stat.S_ISREG(st.st_mode) else ""
    finally:
        os.close(fd)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, head]


PROBE_BYTES = 64 << 10
"""Bytes read at each end of a trace for its ``probe``."""


def probe(fd: int, size_bytes: int) -> str:
    """BLAKE2b (32 hex digits) of the first and the last ``PROBE_BYTES`` of the open file
    ``fd`` of ``size_bytes`` (all of it when smaller). A gzip trace ends with its last
    member's trailer, the CRC-32 of that member's JSON (RFC 1952): for a one-member
    ``.json.gz`` (what the profiler and the tracer write) the probe changes with any byte of
    the JSON, at the cost of two reads (measured in bench/bench_ingest_read.py). Raises
    ``OSError``."""
    h = hashlib.blake2b(digest_size=16)
    h.update(os.pread(fd, PROBE_BYTES, 0))
    tail_at = max(PROBE_BYTES, size_bytes - PROBE_BYTES)
    if tail_at < size_bytes:
        h.update(os.pread(fd, size_bytes - tail_at, tail_at))
    return h.hexdigest()


def ipc(name: str, table) -> bytes:
    """Table ``name`` (Arrow, or a pandas DataFrame) as an Arrow IPC stream (``stream``).
    Raises ``ValueError`` when it is off its schema (``schemas.TABLE_SCHEMAS``)."""
    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table, preserve_index=False)
    if why := schemas.table_mismatch(table, schemas.TABLE_SCHEMAS[name]):
        raise ValueError(f"table {name}: {why}")
    return stream(table)


def stream(table: pa.Table) -> bytes:
    """``table`` as an Arrow IPC stream: how a ``ranktables.RankTables`` holds it, how the
    cache and a Dask worker's answer carry it."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def table_of(data: bytes) -> pa.Table:
    """The table of the Arrow IPC stream ``data`` (``stream``), its buffers in ``data``.
    Raises ``pyarrow.ArrowException`` for bytes that are not one."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


TABLES_PER_TRACE_BYTE = 64
"""A rank's tables cache holds at most this many bytes per byte of its trace file, plus
``TABLES_FIXED_BYTES`` (the schemas; measured: 0.01 to 2.6 bytes a byte over the corpus,
gzip or not): a larger file is not read (``read_tables``)."""
TABLES_FIXED_BYTES = 1 << 20


def load_cache_blob(cpath: Path, limit_bytes: int | None = None) -> dict[str, Any] | None:
    """The payload of the cache file ``cpath`` when its HMAC verifies under this user's key
    (``cachekey.read_signed``: nothing held in memory before it does): None when absent,
    unreadable, or not written by this user's analyzer (planted, copied from another user or
    machine, edited). ``limit_bytes``: the largest file read (default the cache cap)."""
    from analyzer.ingest.cachekey import read_signed

    try:
        body = read_signed(cpath, CACHE_MAGIC, limit_bytes)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.info("ignoring unreadable cache %s (%s)", cpath, exc)
        return None
    if body is None:
        log.info("ignoring cache %s: not signed with this user's cache key", cpath)
        return None
    try:
        blob = msgspec.msgpack.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        log.info("ignoring unreadable cache %s (%s)", cpath, exc)
        return None
    return blob if isinstance(blob, dict) else None


def dump_cache_blob(cpath: Path, blob: dict[str, Any]) -> int:
    """Write ``blob`` to ``cpath`` atomically, signed (``CACHE_MAGIC``, HMAC, payload); return
    the bytes written. Raises ``OSError`` (also when this user has no cache key)."""
    from analyzer.ingest.cachekey import sign

    payload = msgspec.msgpack.encode(blob)
    mac = sign(payload)
    if mac is None:
        raise OSError("no cache key to sign with")
    cpath.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cpath.parent, prefix=".tmp-", suffix=".msgpack")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(CACHE_MAGIC)
            fh.write(mac)
            fh.write(payload)
        os.replace(tmp, cpath)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return len(CACHE_MAGIC) + len(mac) + len(payload)


_NON_NEGATIVE = {
    "breakdown": ("step_ns", "compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns", "other_ns",
                  "idle_ns", "data_wait_ns", "cpu_step_ns"),
    "collectives": ("dur_ns",), "prefetch": ("comm_ns", "hidden_ns"),
}
_ORDERED = {"steps": (("cpu_start_ns", "cpu_end_ns"), ("start_ns", "end_ns")),
            "collectives": (("start_ns", "end_ns"),), "timeline": (("start_ns", "end_ns"),)}


def table_invariant(name: str, table: pa.Table) -> str | None:
    """Why table ``name`` cannot have been computed from a trace, None when it can: a duration
    below 0, an interval ending before it starts, a breakdown that does not add up to its
    step (compute + exposed comm + data wait + other + idle == step), a fraction outside
    [0, 1]. Checked on every cache read (a damaged or planted cache is a miss)."""
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return None
    for col in _NON_NEGATIVE.get(name, ()):
        if pc.any(pc.less(table[col], 0)).as_py():
            return f"negative {col}"
    for lo, hi in _ORDERED.get(name, ()):
        if pc.any(pc.less(table[hi], table[lo])).as_py():
            return f"{hi} before {lo}"
    if name == "breakdown":
        parts = [table[c].to_numpy().astype(object) for c in
                 ("compute_ns", "exposed_comm_ns", "data_wait_ns", "other_ns", "idle_ns")]
        if (sum(parts) != table["step_ns"].to_numpy().astype(object)).any():
            return "parts that do not add up to step_ns"
        for col in ("overlap_frac", "data_wait_frac"):
            v = table[col].to_numpy(zero_copy_only=False)
            if ((v < 0) | (v > 1)).any():
                return f"{col} outside [0, 1]"
    return None


def read_tables(cpath: Path, sig: list[int | str], sha: str | None) -> dict[str, Any] | None:
    """The ``RankTables`` fields (but ``path``) of the cache file ``cpath`` when it is valid:
    signed by this user (``load_cache_blob``), the key of the recorded SHA-256 (``sha`` None
    or "": the stat signature ``sig`` must equal the recorded one) or of ``sha`` agrees (a
    cache of a plain JSON trace is keyed by its signature, ``_content``), every table
    on its schema and its invariants (``table_invariant``), the metadata of its types."""
    if not sig:  # the trace could not be opened: read_trace says why
        return None
    limit = min(settings.cache_max_bytes(), TABLES_PER_TRACE_BYTE * sig[0] + TABLES_FIXED_BYTES)
    blob = load_cache_blob(cpath, limit)  # a cache of a few KB of trace is not 2 GiB
    if blob is None:
        return None
    try:
        if not sha and blob["stat"] != sig:
            return None
        sha = sha or str(blob["sha256"])
        if blob["key"] != cache_key(_content(sha, sig), CODE_MODULES):
            return None
        meta = msgspec.convert(blob["meta"], RankMeta)
        tables = {t: table_of(blob["tables"][t]) for t in schemas.TABLE_SCHEMAS}
        for t, table in tables.items():
            if why := schemas.table_mismatch(table, schemas.TABLE_SCHEMAS[t]):
                raise ValueError(f"table {t}: {why}")
            if why := table_invariant(t, table):
                raise ValueError(f"table {t}: {why}")
        if meta.whole_overlap_ns < 0 or meta.whole_comm_ns < meta.whole_overlap_ns:
            raise ValueError("whole-trace overlap beyond its communication")
        with contextlib.suppress(OSError):
            os.utime(cpath)  # used: the last to go when the folder is trimmed
        return {"cache_hit": True, "sha256": sha, **msgspec.structs.asdict(meta),
                "tables": {t: blob["tables"][t] for t in tables}}
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError,
            msgspec.ValidationError, pa.ArrowException) as exc:
        log.info("ignoring unreadable cache %s (%s)", cpath, exc)
        return None


def _content(sha: str, sig: list[int | str]) -> str:
    """What a cache key names the trace by: the SHA-256 of its bytes as stored when the parse
    hashed them (a gzip trace, or one a manifest lists), else (a plain JSON trace: "" ) its
    stat signature, so that a trace whose signature changes is parsed again rather than
    hashed whole (docs/caches.md)."""
    return sha or "stat " + msgspec.json.encode(sig).decode()


def write_tables(cpath: Path, sig: list[int | str], rt) -> None:
    """Cache ``rt`` (a ``ranktables.RankTables``); a table off its schema
    (``schemas.TABLE_SCHEMAS``) is not cached, logged."""
    try:
        blob = {"key": cache_key(_content(rt.sha256, sig), CODE_MODULES), "sha256": rt.sha256,
                "stat": sig,
                "meta": {k: getattr(rt, k) for k in RankMeta.__struct_fields__},
                "tables": {t: checked(t, rt.tables[t]) for t in schemas.TABLE_SCHEMAS}}
        trim(cpath.parent, TABLES_NAME, dump_cache_blob(cpath, blob))
    except (OSError, ValueError, pa.ArrowException) as exc:
        log.info("could not write cache %s (%s)", cpath, exc)


def checked(name: str, data: bytes) -> bytes:
    """``data`` (table ``name`` as an IPC stream, ``stream``) when the table is on its
    schema. Raises ``ValueError`` when it is not, as ``ipc``."""
    if why := schemas.table_mismatch(table_of(data), schemas.TABLE_SCHEMAS[name]):
        raise ValueError(f"table {name}: {why}")
    return data


def forget(traces: list[Path]) -> None:
    """Remove the tables caches of ``traces`` (``tables_cache_path``): an input refused after
    some of its ranks were parsed and cached (a truncated rank among good ones) leaves no
    cache file (issue 42). A cache that cannot be removed is left, logged."""
    for trace in traces:
        cpath = tables_cache_path(trace)
        try:
            cpath.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.info("could not remove cache %s (%s)", cpath, exc)

