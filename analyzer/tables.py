"""Per-rank result tables, computed where the rank is parsed and cached: the report's input.

The report needs, per rank, only small tables: its breakdown rows, its collective instances, its
FSDP prefetch rows and the merged timeline of its first step. ``load_tables`` computes them in
the worker process that parses the rank (analyzer/load.py's pool) and sends back only them, so
the parent never holds any rank's events, and each worker holds one rank's events at a time:
peak memory follows (largest rank) x (worker processes), not the sum of the ranks.

Cache: ``<trace>.tables.msgpack`` beside the trace when that folder is writable (else
``$XDG_CACHE_HOME/paritytrace/<hash of the absolute path>.tables.msgpack``): msgpack of the
rank's metadata and one Arrow IPC stream per table (pandas dtypes kept by Arrow's pandas
metadata; never pickle). Valid when its ``key`` equals the content key of the trace
(SHA-256 of the file, analyzer/load.py) combined with a hash of the analysis code that made it
(``code_key``: any edit to decode/classify/breakdown/collectives/prefetch/intervals/tables
invalidates it). As git's index does, a cache whose recorded (size, mtime_ns, inode, device) of
the trace equals the file's current ones is trusted without re-hashing the file; any change of
those re-hashes it. Writes are atomic; an unreadable or unwritable cache is skipped with a log
line.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import msgspec
import pandas as pd
import pyarrow as pa

from analyzer.errors import BadInput

log = logging.getLogger(__name__)

TABLES = ("breakdown", "collectives", "prefetch", "timeline")
_CODE_MODULES = ("decode", "classify", "breakdown", "collectives", "prefetch", "intervals",
                 "tables", "load")


@dataclass(kw_only=True, slots=True)
class RankTables:
    """One rank's metadata (as ``api.RankTrace``, without events) and result tables.

    ``breakdown``: analyzer.breakdown COLUMNS; ``collectives``: analyzer.collectives COLUMNS;
    ``prefetch``: analyzer.prefetch COLUMNS (empty without FSDP labels); ``timeline``:
    ``breakdown.timeline_rows`` of ``timeline_step`` (the smallest step >= 0, -1 when none).
    """

    path: Path
    """The trace file."""
    rank: int = -1
    """Rank number (-1 until the rank rule has run)."""
    rank_source: str = ""
    """How the rank was found (analyzer/load.py rank rule)."""
    world_size: int | None = None
    """World size the trace says, None when it does not."""
    device_kind: str = "cpu"
    """"gpu" when the trace has GPU kernels, else "cpu"."""
    distributed_info: dict[str, Any] | None = None
    """The trace's distributedInfo as written."""
    main_tid: str | None = None
    """Main thread of a CPU-only rank."""
    whole_trace_mode: bool = False
    """No ProfilerStep in the trace: step 0 is the whole trace."""
    warnings: list[str] = field(default_factory=list)
    """Parse problems, one line each."""
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Step windows (api.py module docstring)."""
    breakdown: pd.DataFrame = field(default_factory=pd.DataFrame)
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)
    prefetch: pd.DataFrame = field(default_factory=pd.DataFrame)
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame)
    timeline_step: int = -1
    cache_hit: bool = False
    """True when the tables came from the cache."""
    sha256: str = ""
    """SHA-256 of the trace file (hex), checked against the run's manifest.json."""


@dataclass(kw_only=True, slots=True)
class TraceTables:
    """Every rank's tables of one job: what ``analyzer report`` reads (no events held)."""

    root: Path
    """The folder that was loaded."""
    ranks: list[RankTables]
    """Sorted by rank."""
    world_size: int
    """World size (api.TraceSet rule)."""
    manifest: dict[str, Any] | None
    """The run's manifest, None for foreign traces."""
    whole_trace_mode: bool
    """No rank has a ProfilerStep."""
    warnings: list[str] = field(default_factory=list)
    """Load-level notes, one line each."""
    breakdown: pd.DataFrame = field(default_factory=pd.DataFrame)
    """``api.breakdown`` of the whole job."""
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)
    """``api.collectives`` of the whole job."""
    prefetch: pd.DataFrame = field(default_factory=pd.DataFrame)
    """``prefetch.prefetch_table`` rows of every rank (empty when none has FSDP labels)."""

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks in ``range(world_size)`` with no trace."""
        have = {r.rank for r in self.ranks}
        return [r for r in range(self.world_size) if r not in have]

    def timeline(self, rank: int, step: int) -> pd.DataFrame:
        """``api.timeline`` of ``rank`` and ``step``; only each rank's first step (>= 0) is
        kept. Raises ``KeyError`` for another rank or step."""
        rt = next((r for r in self.ranks if r.rank == rank), None)
        if rt is None or rt.timeline_step != step or step < 0:
            raise KeyError(f"no timeline of rank {rank} step {step} in {self.root}")
        return rt.timeline


@lru_cache(maxsize=1)
def code_key() -> str:
    """BLAKE2b of the source of every module that shapes the tables."""
    h = hashlib.blake2b(digest_size=8)
    here = Path(__file__).parent
    for m in _CODE_MODULES:
        h.update((here / f"{m}.py").read_bytes())
    return h.hexdigest()


def _stat_sig(path: Path) -> list[int]:
    """Size, mtime, ctime, inode and device of ``path``: equal, the cached tables are used
    without reading the trace. The ctime is there because the mtime can be set back (``cp -p``,
    ``touch -d``, ``os.utime``) after an edit that keeps the size; the kernel sets the ctime on
    every write and no user call sets it back (reports/cache.py keys the report the same way)."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def tables_cache_path(trace: Path) -> Path:
    """Where the tables of ``trace`` are cached (beside it when the folder is writable)."""
    from analyzer.load import folder_writable

    if folder_writable(trace.parent):
        return trace.with_name(trace.name + ".tables.msgpack")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    name = hashlib.blake2b(str(trace.resolve()).encode(), digest_size=16).hexdigest()
    return Path(base) / "paritytrace" / f"{name}.tables.msgpack"


_META = ("rank_source", "world_size", "device_kind", "distributed_info", "main_tid",
         "whole_trace_mode", "warnings", "timeline_step")


def _ipc(df: pd.DataFrame) -> bytes:
    table = pa.Table.from_pandas(df, preserve_index=False)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pd.DataFrame:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all().to_pandas()


def _read_tables(cpath: Path, path: Path, key: str | None, stat: list[int]) -> RankTables | None:
    """The cached tables when valid: stat signature equal, or content key equal."""
    from analyzer.load import key_sha256

    try:
        blob = msgspec.msgpack.decode(cpath.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError) as exc:
        log.info("ignoring unreadable cache %s (%s)", cpath, exc)
        return None
    try:
        if blob.get("code") != code_key():
            return None
        if blob.get("stat") != stat and (key is None or blob.get("key") != key):
            return None
        tables = {t: _from_ipc(blob["tables"][t]) for t in (*TABLES, "steps")}
        meta = blob["meta"]
        return RankTables(path=path, cache_hit=True, sha256=key_sha256(str(blob["key"])),
                          **{k: meta[k] for k in _META}, **tables)
    except (KeyError, TypeError, ValueError, AttributeError, pa.ArrowException) as exc:
        log.info("ignoring unreadable cache %s (%s)", cpath, exc)
        return None


def _write_tables(cpath: Path, key: str, stat: list[int], rt: RankTables) -> None:
    blob = {"key": key, "code": code_key(), "stat": stat,
            "meta": {k: getattr(rt, k) for k in _META},
            "tables": {t: _ipc(getattr(rt, t)) for t in (*TABLES, "steps")}}
    try:
        cpath.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cpath.parent, prefix=".tmp-", suffix=".msgpack")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(msgspec.msgpack.encode(blob))
            os.replace(tmp, cpath)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except (OSError, pa.ArrowException) as exc:
        log.info("could not write cache %s (%s)", cpath, exc)


def rank_tables(path: Path, *, use_cache: bool = True) -> RankTables:
    """Parse one trace (through the events cache when one is there) and compute its tables.
    Rank-dependent fields stay unset (rank -1, group_size <= 0 left as -1): ``load_tables``
    fills them after the rank rule. Raises ``BadInput``."""
    from analyzer.breakdown import rank_breakdown, timeline_rows
    from analyzer.collectives import rank_collectives
    from analyzer.load import content_key, key_sha256, parse_raw, read_raw
    from analyzer.prefetch import prefetch_table

    try:
        stat = _stat_sig(path)
    except OSError:
        stat = []  # read_raw says what is wrong
    cpath = tables_cache_path(path)
    if use_cache:
        hit = _read_tables(cpath, path, None, stat)
        if hit is not None:
            return hit
    raw = read_raw(path)
    key = content_key(raw)
    if use_cache:
        hit = _read_tables(cpath, path, key, stat)  # touched but unchanged: content key agrees
        if hit is not None:
            _write_tables(cpath, key, stat, hit)  # record the new stat signature
            return hit
    pf = parse_raw(path, raw, key, read_cache=use_cache, write_cache=False)
    del raw
    ev, steps = pf.events, pf.steps
    ws = (pf.distributed_info or {}).get("world_size")
    coll = rank_collectives(-1, ev, -1)
    valid = steps[steps["step"] >= 0] if len(steps) else steps
    tl_step = int(valid["step"].min()) if len(valid) else -1
    if tl_step >= 0:
        win = steps[steps["step"] == tl_step]
        lo, hi = int(win["start_ns"].iat[0]), int(win["end_ns"].iat[0])
        tl = timeline_rows(ev[ev["step"].to_numpy() == tl_step], pf.device_kind, pf.main_tid,
                           lo, hi, ev["end_ns"].to_numpy())
    else:
        tl = pd.DataFrame({"lane": [], "kind": [], "start_ns": [], "end_ns": []})
    rt = RankTables(path=path, world_size=ws if isinstance(ws, int) else None,
                    device_kind=pf.device_kind, distributed_info=pf.distributed_info,
                    main_tid=pf.main_tid, whole_trace_mode=pf.whole_trace_mode,
                    warnings=pf.warnings, steps=steps,
                    breakdown=rank_breakdown(-1, ev, steps, pf.device_kind, pf.main_tid),
                    collectives=coll, prefetch=prefetch_table(ev, rank=-1), timeline=tl,
                    timeline_step=tl_step, sha256=key_sha256(key))
    del pf, ev
    if use_cache:
        _write_tables(cpath, key, stat, rt)
    return rt


def _set_rank(rt: RankTables, rank: int, source: str, world_size: int) -> None:
    rt.rank, rt.rank_source = rank, source
    for name in ("breakdown", "collectives", "prefetch"):
        df = getattr(rt, name)
        if "rank" in df.columns:
            df["rank"] = pd.Series(rank, index=df.index, dtype=df["rank"].dtype
                                   if df["rank"].dtype != object else "int64")
    c = rt.collectives
    if len(c):
        gs = c["group_size"].to_numpy().copy()
        gs[gs <= 0] = world_size
        c["group_size"] = gs


def _concat(parts: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=columns)
    return pd.concat(parts, ignore_index=True)


def load_tables(root: Path, *, allow_incomplete: bool = False, jobs: int | None = None
                ) -> TraceTables:
    """Implementation of ``analyzer.api.load_tables`` (see there)."""
    from analyzer.breakdown import COLUMNS as BD_COLUMNS
    from analyzer.collectives import COLUMNS as COLL_COLUMNS
    from analyzer.load import check_manifest_sha256, discover_paths, parse_files, resolve_ranks
    from analyzer.prefetch import COLUMNS as PF_COLUMNS

    manifest, notes, paths = discover_paths(root, allow_incomplete=allow_incomplete)
    # valid caches (stat fast path) are read here; only the others go to worker processes
    cached = {p: _cached(p) for p in paths}
    misses = [p for p, hit in cached.items() if hit is None]
    parsed, problems = parse_files(misses, jobs, worker=_tables_worker)
    by_path = {**{p: hit for p, hit in cached.items() if hit is not None},
               **{f.path: f for f in parsed}}
    files = [by_path[p] for p in paths if p in by_path]
    check_manifest_sha256(root, manifest, [(f.path, f.sha256) for f in files])
    assigned, world = resolve_ranks(root, files, problems, manifest)
    ranks = []
    for r, source, f in assigned:
        _set_rank(f, r, source, world)
        ranks.append(f)
    from analyzer.samejob import check_same_job

    check_same_job(root, _concat([r.collectives for r in ranks], COLL_COLUMNS),
                   {r.rank: r.path for r in ranks})
    whole = [rt.rank for rt in ranks if rt.whole_trace_mode]
    if whole and len(whole) < len(ranks):
        notes.append(f"ranks {whole} have no ProfilerStep and are analysed in whole-trace mode")
    pf_parts = [r.prefetch for r in ranks if len(r.prefetch)]
    out = TraceTables(root=root, ranks=ranks, world_size=world, manifest=manifest,
                      whole_trace_mode=bool(whole) and len(whole) == len(ranks), warnings=notes,
                      breakdown=_concat([r.breakdown for r in ranks], BD_COLUMNS),
                      collectives=_concat([r.collectives for r in ranks], COLL_COLUMNS),
                      prefetch=_concat(pf_parts, PF_COLUMNS))
    if out.missing_ranks:
        notes.append(f"{len(ranks)} of {world} ranks")
    return out


def _cached(path: Path) -> RankTables | None:
    """The tables of ``path`` from a cache whose stat signature matches, else None."""
    try:
        stat = _stat_sig(path)
    except OSError:
        return None
    return _read_tables(tables_cache_path(path), path, None, stat)


def _tables_worker(path: Path) -> RankTables | tuple[str, str, str, str]:
    """Process-pool entry: errors come back as plain tuples (BadInput is not picklable)."""
    try:
        return rank_tables(path)
    except BadInput as exc:
        return (exc.path, exc.reason, exc.message, exc.fix)
