"""The one ingest path of every command: a job's trace files -> per-rank tables, cached.

discover (analyzer/ingest/rundirs.py: the job's trace files and its manifest, each read once) -> read +
SHA-256 -> decode (analyzer/ingest/decode.py) -> classify (analyzer/ingest/classify.py) -> per-rank tables
(breakdown, collectives, prefetch, the first step's timeline, the whole-trace overlap) -> rank
rule -> the traces' SHA-256 against the manifest -> same-job check (analyzer/ingest/samejob.py).

Each rank is decoded, classified and reduced to its small tables in a worker process
(analyzer/ingest/pool.py), or a Dask worker with ``--scheduler`` (analyzer/ingest/cluster.py),
which sends back only them: the parent never holds any rank's events and each worker one
rank's at a time, so peak memory follows (largest rank) x (workers), not the sum of the ranks.
The parent holds each rank's small tables (step windows, breakdown, one step's timeline:
rows per step) and, until the job's pass ``PARITYTRACE_TABLES_MEMORY``, its collectives and
prefetch tables; past that budget each arriving rank's two are put on disk
(analyzer/ingest/spill.py) and the cross-rank phase reads batches of consecutive ranks
(``JobTables.batches``, analyzer/analyses/crossrank.py). With ``--tables-out`` each job's tables
are also written as a Parquet dataset (analyzer/ingest/dataset.py).

Rank rule (DESIGN.md "Trace semantics"): ``distributedInfo.rank`` when every file has one; a
single file without one is rank 0 of 1; several files without one take the number from a
``rank<N>`` / ``worker<N>`` pattern in the file name only when every file has one and all
differ; anything else (some files with a rank and some without, names without a number,
duplicates) is ``BadInput`` naming the files. Files of one folder must agree on the world size,
the backend and the members of each process group.

Cache (the analyzer's only cache of trace analyses): ``<trace>.tables.msgpack`` beside the
trace when its folder is writable (and not marked read-only), else
``$XDG_CACHE_HOME/paritytrace/<hash of the trace's absolute path>.tables.msgpack``: msgpack of
the rank's metadata and one Arrow IPC stream per table (never pickle). Valid when its key equals
``cachekey.cache_key(<SHA-256 of the trace file>, CODE_MODULES)`` (analyzer/ingest/cachekey.py: any
edit of the trace, of the code that makes the tables or of its libraries is a miss). As git's
index does, a cache whose recorded stat signature of the trace (size, mtime, ctime, inode,
device) equals the file's is trusted without hashing the file again. Writes are atomic; a cache
that cannot be read or written is skipped with a log line, never an error. A cache is input
nobody vouches for (planted beside a trace, copied with it): it is used only when its HMAC
verifies under this user's secret key (analyzer/ingest/cachekey.py ``user_key``; another user's
or machine's cache, or an edited one, is recomputed), and its tables are on their schemas and
their invariants (``table_invariant``: no negative durations, breakdowns that add up).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa

from analyzer.ingest.cachekey import cache_dir, cache_key
from analyzer.ingest.commid import group_fallback, pg_descs_of, pg_ranks_of, pg_sizes_of
from analyzer.ingest.spill import Spill
from analyzer.contract import schemas
from analyzer.contract.errors import BadInput

log = logging.getLogger(__name__)

_ANALYZER = Path(__file__).parents[1]
CODE_MODULES = tuple(_ANALYZER / m for m in (
    "ingest/decode.py", "ingest/classify.py", "ingest/commid.py", "ingest/steps.py",
    "ingest/pipeline.py", "analyses/breakdown.py", "analyses/memory.py",
    "analyses/collectives.py", "analyses/prefetch.py", "analyses/intervals.py",
    "analyses/straggler.py", "analyses/matchkey.py", "ingest/graphs.py"))
"""The modules whose code shapes the cached tables (part of the cache key)."""
BATCH_BYTES = 64 * 2**20
"""Bytes of a batch of ranks' table in the cross-rank phase (``JobTables.batches``)."""
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)
_META = ("world_size", "device_kind", "distributed_info", "main_tid", "whole_trace_mode",
         "warnings", "timeline_step", "whole_overlap_ns", "whole_comm_ns", "empty", "first_ns")


@dataclass(kw_only=True, slots=True)
class RankTables:
    """One rank: its metadata and its result tables (no events).

    Tables as ``schemas.TABLE_SCHEMAS`` says (``prefetch`` is empty without FSDP labels;
    ``timeline`` is the one of ``timeline_step``).
    """

    path: Path
    """The trace file."""
    rank: int = -1
    """Rank number (-1 until the rank rule has run)."""
    rank_source: str = ""
    """How the rank was found: "distributedInfo", "file name", "single file"."""
    world_size: int | None = None
    """World size the trace says (distributedInfo.world_size), None when it does not."""
    device_kind: str = "cpu"
    """"gpu" when the trace has GPU kernels, else "cpu"."""
    distributed_info: dict[str, Any] | None = None
    """The trace's distributedInfo as written (backend, pg_config ...), None when absent."""
    main_tid: str | None = None
    """The main thread's tid on a CPU-only rank (analyzer/ingest/classify.py says how it is found)."""
    whole_trace_mode: bool = False
    """No ProfilerStep in the trace: step 0 is the whole trace."""
    warnings: list[str] = field(default_factory=list)
    """Problems skipped while decoding (bad ts/dur counts ...) and the step rules' notes
    (analyzer/ingest/steps.py: events left out, spans ignored or clipped), one line each."""
    empty: bool = False
    """The file holds no complete events (metadata only): an empty rank (``load_run``)."""
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    breakdown: pd.DataFrame = field(default_factory=pd.DataFrame)
    collectives: pd.DataFrame = field(default_factory=pd.DataFrame)
    prefetch: pd.DataFrame = field(default_factory=pd.DataFrame)
    timeline: pd.DataFrame = field(default_factory=pd.DataFrame)
    device_memory: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Peak memory per device from the trace's ``[memory]`` events
    (``schemas.DEVICE_MEMORY_SCHEMA``; empty when it has none)."""
    timeline_step: int = -1
    """The step of ``timeline``: the smallest step >= 0, -1 when none."""
    whole_overlap_ns: int = 0
    """|comm ∩ compute| over every GPU event of the trace, whatever its step (HTA's scope:
    ``breakdown.whole_trace_overlap``); 0 on a CPU-only rank."""
    whole_comm_ns: int = 0
    """|comm| over every GPU event of the trace (same scope)."""
    first_ns: int = -1
    """Start of the earliest complete event (trace clock, ns; -1 for an empty rank): where
    ``analyzer merge`` puts ts 0 without reading every rank first."""
    cache_hit: bool = False
    """True when the tables came from the cache."""
    sha256: str = ""
    """SHA-256 of the trace file (hex), checked against the run's manifest.json."""
    group_fallback: int = 0
    """The group size a collective of unknown group size takes (``commid.group_fallback``),
    set with the rank."""
    spilled: dict[str, str] = field(default_factory=dict)
    """Tables moved to disk (analyzer/ingest/spill.py): name -> file. Read them with
    ``JobTables.rank_table``; the attribute of a spilled table is empty."""


@dataclass(kw_only=True, slots=True)
class JobTables:
    """Every rank's tables of one job: what every command reads (no events held)."""

    root: Path
    """The run directory, folder of traces or trace file that was loaded."""
    ranks: list[RankTables]
    """Sorted by rank."""
    world_size: int
    """World size: the traces', else the manifest's, else max(ranks seen, highest rank + 1)."""
    manifest: schemas.Manifest | None
    """The run's manifest, None for foreign traces."""
    whole_trace_mode: bool
    """No rank has a ProfilerStep: each rank's whole trace is step 0."""
    warnings: list[str] = field(default_factory=list)
    """Load-level notes (files skipped, ranks missing, ranks in whole-trace mode ...)."""
    breakdown: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Per rank and step time breakdown (``schemas.BREAKDOWN_SCHEMA``), sorted by rank,
    step. Identity: compute_ns + exposed_comm_ns + data_wait_ns + other_ns + idle_ns ==
    step_ns exactly."""
    spill: Any = None
    """The ``spill.Spill`` holding the ranks' spilled tables (kept alive with the job)."""

    def __enter__(self) -> "JobTables":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove the spilled tables now. Callers close (``with load_run(...) as job``) rather
        than leave it to the garbage collector: a Ctrl-C / SIGTERM that lands in a collected
        object's finalizer is printed and dropped, so the command would run on and exit 0."""
        if self.spill is not None:
            self.spill.close()

    def rank_table(self, rt: RankTables, name: str, columns: list[str] | None = None
                   ) -> pd.DataFrame:
        """Table ``name`` of rank ``rt`` (only ``columns``, None: all), from memory or from
        disk (analyzer/ingest/spill.py); collectives' group_size and the rank column as
        ``load_run`` set them."""
        if name not in rt.spilled:
            df = getattr(rt, name)
            return df if columns is None else df[columns]
        from analyzer.ingest import spill

        return _fixed(rt, name, spill.read(rt.spilled[name], columns))

    def each(self, name: str, columns: list[str] | None = None):
        """(rank tables, its table ``name``) of every rank in rank order, one rank read at a
        time (``rank_table``); ``batches`` groups them."""
        for rt in self.ranks:
            yield rt, self.rank_table(rt, name, columns)

    def batches(self, name: str, columns: list[str] | None = None,
                max_bytes: int | None = None):
        """(the ranks' tables, their tables ``name`` one below the other, in rank order) for
        consecutive ranks, each batch closed once it holds ``max_bytes`` (default
        ``BATCH_BYTES``; a rank larger than that is a batch of its own): the cross-rank
        phase's unit of work, so that a job of many small ranks costs a few pandas calls and
        one of large ranks holds one batch at a time."""
        from analyzer.ingest.spill import frame_bytes

        limit = BATCH_BYTES if max_bytes is None else max_bytes
        names = columns or schemas.TABLE_SCHEMAS[name].names
        held: list[RankTables] = []
        frames: list[pd.DataFrame] = []
        size = 0
        for rt, df in self.each(name, columns):
            held.append(rt)
            frames.append(df)
            size += frame_bytes(df)
            if size >= limit:
                yield held, _concat(frames, names)
                held, frames, size = [], [], 0
        if held:
            yield held, _concat(frames, names)

    @property
    def collectives(self) -> pd.DataFrame:
        """One row per collective instance per rank (``schemas.COLLECTIVES_SCHEMA``), ranks in
        order, group_size falling back to the world size only when the trace's pg_config
        proves every group is the world (else -1, unknown: analyzer/ingest/commid.py
        ``group_fallback``); ``collectives.by_kind`` /
        ``match_ranks`` take it. Built on each call and holds every rank's rows: for the
        library API and ``analyzer merge``; ``report`` and ``summary`` walk ``batches``."""
        return _concat([df for _, df in self.each("collectives")],
                       schemas.COLLECTIVES_SCHEMA.names)

    @property
    def prefetch(self) -> pd.DataFrame:
        """``prefetch.prefetch_table`` rows of every rank (empty when none has FSDP labels);
        built on each call, as ``collectives``."""
        return _concat([df for _, df in self.each("prefetch")], schemas.PREFETCH_SCHEMA.names)

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks in ``range(world_size)`` with no trace."""
        have = {r.rank for r in self.ranks}
        return [r for r in range(self.world_size) if r not in have]

    def timeline(self, rank: int, step: int) -> pd.DataFrame:
        """Merged intervals of ``rank`` and ``step`` for plotting: lane ("compute" | "comm"),
        kind ("" | the collective kind), start_ns, end_ns (trace clock). Only each rank's
        first step (>= 0) is kept; raises ``KeyError`` for another rank or step."""
        rt = next((r for r in self.ranks if r.rank == rank), None)
        if rt is None or rt.timeline_step != step or step < 0:
            raise KeyError(f"no timeline of rank {rank} step {step} in {self.root}")
        return rt.timeline


# --- one file: read, decode, classify -----------------------------------------------------------

def read_trace(path: Path, max_bytes: int | None = None) -> bytes:
    """The bytes of the trace file at ``path``. Raises ``BadInput``: ``bad_name`` (the name is
    not UTF-8, ``fswalk.check_name``), ``unreadable``, ``too_large`` (a file, gzip or not, over
    ``max_bytes``, default ``decode.max_trace_bytes()``: refused before it is read; the
    gunzipped size is checked by ``decode.decompress``)."""
    from analyzer.ingest.decode import max_trace_bytes, too_large
    from analyzer.ingest.fswalk import check_name

    check_name(path)
    cap = max_trace_bytes() if max_bytes is None else max_bytes
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > cap:
                raise too_large(path, f"the file ({size:,} bytes)", cap)
            return fh.read()
    except OSError as exc:
        raise BadInput(path, "unreadable", f"cannot read the file ({exc.strerror})",
                       "check the path and its permissions") from None


def _no_events(path: Path) -> BadInput:
    return BadInput(path, "no_events", "holds no complete (ph X) events with a valid ts and "
                    "dur (only metadata, or every event skipped): this rank recorded nothing",
                    "re-record it, or move the file out of the folder to analyse the other "
                    "ranks")


def _decoded(path: Path, raw: bytes | None):
    from analyzer.ingest.decode import decode_bytes, decompress

    return decode_bytes(decompress(read_trace(path) if raw is None else raw, path), path)


def classified(path: Path, raw: bytes | None = None, dec=None
               ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Decode and classify one trace file (``raw``: its bytes, read when None; ``dec``: its
    decoded form, when already decoded).

    Returns ``(events, info)``: the event table (analyzer/api.py module docstring) and info =
    {device_kind, main_tid, whole_trace_mode, steps, unlaunched, distributed_info, warnings
    (the decoder's, then classify's notes)}. Raises ``BadInput`` (unreadable, truncated,
    not a trace, no complete events)."""
    from analyzer.ingest.classify import classify

    dec = _decoded(path, raw) if dec is None else dec
    if dec.events.empty:
        raise _no_events(path)
    di = dec.distributed_info
    ws = di.get("world_size") if di else None
    events, info = classify(dec.events, world_size=ws if isinstance(ws, int) else None,
                            pg_sizes=pg_sizes_of(di), pg_ranks=pg_ranks_of(di),
                            pg_descs=pg_descs_of(di))
    return events, {**info, "distributed_info": di, "warnings": dec.warnings + info["notes"]}


def rank_tables(path: Path, max_bytes: int | None = None) -> RankTables:
    """The tables of one trace file, through the cache, reading at most ``max_bytes`` of JSON
    (default ``decode.max_trace_bytes()``). Rank-dependent fields stay unset (rank -1,
    group_size <= 0 left as -1): ``load_run`` fills them after the rank rule. Raises
    ``BadInput``."""
    from analyzer.analyses.breakdown import (comm_shares, rank_breakdown, timeline_rows,
                                             whole_trace_overlap)
    from analyzer.analyses.collectives import rank_collectives
    from analyzer.analyses.memory import device_peaks
    from analyzer.analyses.prefetch import prefetch_table
    from analyzer.analyses.straggler import gap_parts
    from analyzer.ingest.decode import decode_bytes, decompress, memory_events

    try:
        sig = _stat_sig(path)
    except OSError:
        sig = []  # read_trace says what is wrong
    cpath = tables_cache_path(path)
    hit = _read_tables(cpath, path, sig, None)
    if hit is not None:
        return hit
    raw = read_trace(path, max_bytes)
    sha = hashlib.sha256(raw).hexdigest()
    hit = _read_tables(cpath, path, sig, sha)  # touched but unchanged: the key agrees
    if hit is not None:
        _write_tables(cpath, sig, hit)  # record the new stat signature
        return hit
    data = decompress(raw, path, max_bytes)
    del raw
    dec = decode_bytes(data, path)
    mem_events, mem_notes = memory_events(dec.repaired_json or data)  # the bytes decoded
    del data
    dec.repaired_json = None
    dev_mem = device_peaks(mem_events)
    dec.warnings += [f"{path}: {n}" for n in mem_notes]
    if dec.events.empty:  # an empty rank; load_run refuses a job of empty ranks only
        ws = (dec.distributed_info or {}).get("world_size")
        rt = RankTables(path=path, world_size=ws if isinstance(ws, int) else None,
                        distributed_info=dec.distributed_info, empty=True,
                        warnings=dec.warnings, sha256=sha,
                        **{t: s.empty_table().to_pandas()
                           for t, s in schemas.TABLE_SCHEMAS.items()
                           if t != "device_memory"}, device_memory=dev_mem)
        _write_tables(cpath, sig, rt)
        return rt
    ev, info = classified(path, dec=dec)
    del dec
    steps, device_kind, main_tid = info["steps"], info["device_kind"], info["main_tid"]
    valid = steps[(steps["step"] >= 0) & steps["device_work"]] if len(steps) else steps
    tl_step = int(valid["step"].min()) if len(valid) else -1
    step_col = ev["step"].to_numpy()
    if tl_step >= 0:
        win = steps[steps["step"] == tl_step]
        lo, hi = int(win["start_ns"].iat[0]), int(win["end_ns"].iat[0])
        # a device window holds device activity of every step by time (analyzer/ingest/steps.py)
        rows = step_col >= 0 if device_kind == "gpu" else step_col == tl_step
        tl = timeline_rows(ev[rows], device_kind, main_tid, lo, hi, ev["end_ns"].to_numpy())
    else:
        tl = pd.DataFrame({"lane": [], "kind": [], "start_ns": [], "end_ns": []})
    overlap_ns, comm_ns = whole_trace_overlap(ev)
    coll = rank_collectives(-1, ev, comm_shares(ev, steps, device_kind, main_tid))
    if info["unlaunched"].any():  # left out of collectives too (analyzer/ingest/steps.py)
        gone = ev["event_idx"].to_numpy()[info["unlaunched"]]
        coll = coll[~np.isin(coll["event_idx"].to_numpy(), gone)].reset_index(drop=True)
    gaps = gap_parts(ev, coll, steps, device_kind, main_tid)
    for c in gaps.columns:
        coll[c] = gaps[c].to_numpy()
    ws = (info["distributed_info"] or {}).get("world_size")
    rt = RankTables(path=path, world_size=ws if isinstance(ws, int) else None,
                    device_kind=device_kind, distributed_info=info["distributed_info"],
                    main_tid=main_tid, whole_trace_mode=info["whole_trace_mode"],
                    warnings=info["warnings"], steps=steps,
                    breakdown=rank_breakdown(-1, ev, steps, device_kind, main_tid),
                    collectives=coll, prefetch=prefetch_table(ev, rank=-1),
                    timeline=tl, device_memory=dev_mem, timeline_step=tl_step,
                    whole_overlap_ns=int(overlap_ns),
                    whole_comm_ns=int(comm_ns), sha256=sha, first_ns=int(ev["ts_ns"].min()))
    del ev
    _write_tables(cpath, sig, rt)
    return rt


# --- the cache ----------------------------------------------------------------------------------

def folder_writable(folder: Path) -> bool:
    """True when ``folder`` is writable *and* its mode has a write bit: root passes
    ``os.access`` everywhere, but a folder marked read-only (a shared corpus) stays untouched."""
    try:
        mode = folder.stat().st_mode
    except OSError:
        return False
    return bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) and os.access(folder, os.W_OK)


def tables_cache_path(trace: Path) -> Path:
    """Where the tables of ``trace`` are cached (module docstring)."""
    if folder_writable(trace.parent):
        return trace.with_name(trace.name + ".tables.msgpack")
    name = hashlib.blake2b(str(trace.resolve()).encode(), digest_size=16).hexdigest()
    return cache_dir() / f"{name}.tables.msgpack"


def _stat_sig(path: Path) -> list[int]:
    """Size, mtime, ctime, inode and device of ``path``. The ctime is there because the mtime
    can be set back (``cp -p``, ``touch -d``, ``os.utime``) after an edit that keeps the size;
    the kernel sets the ctime on every write and no user call sets it back."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _ipc(name: str, df: pd.DataFrame) -> bytes:
    table = pa.Table.from_pandas(df, preserve_index=False)
    if why := schemas.table_mismatch(table, schemas.TABLE_SCHEMAS[name]):
        raise ValueError(f"table {name}: {why}")
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


CACHE_MAGIC = b"paritytrace-tables/1\n"
"""First bytes of a per-rank tables cache file: then its HMAC (``cachekey.MAC_BYTES``), then
the msgpack payload the HMAC covers."""


class RankMeta(msgspec.Struct, forbid_unknown_fields=True):
    """A rank's metadata (``_META``) as a per-rank tables cache and a Dask worker's result
    (analyzer/ingest/daskwire.py) carry it, typed: fields of other types, or others than
    these, make the cache a miss and the result refused."""

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


def load_cache_blob(cpath: Path) -> dict[str, Any] | None:
    """The payload of the cache file ``cpath`` when its HMAC verifies under this user's key
    (``cachekey.verify``): None when absent, unreadable, or not written by this user's
    analyzer (planted, copied from another user or machine, edited)."""
    from analyzer.ingest.cachekey import MAC_BYTES, verify

    try:
        data = cpath.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.info("ignoring unreadable cache %s (%s)", cpath, exc)
        return None
    head = len(CACHE_MAGIC) + MAC_BYTES
    body = memoryview(data)[head:]
    if not data.startswith(CACHE_MAGIC) or not verify(body, data[len(CACHE_MAGIC):head]):
        log.info("ignoring cache %s: not signed with this user's cache key", cpath)
        return None
    try:
        blob = msgspec.msgpack.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        log.info("ignoring unreadable cache %s (%s)", cpath, exc)
        return None
    return blob if isinstance(blob, dict) else None


def dump_cache_blob(cpath: Path, blob: dict[str, Any]) -> None:
    """Write ``blob`` to ``cpath`` atomically, signed (``CACHE_MAGIC``, HMAC, payload). Raises
    ``OSError`` (also when this user has no cache key)."""
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


def _read_tables(cpath: Path, path: Path, sig: list[int], sha: str | None) -> RankTables | None:
    """The cached tables of ``path`` when valid: signed by this user (``load_cache_blob``),
    the key of the recorded SHA-256 (``sha`` None: the stat signature ``sig`` must equal the
    recorded one) or of ``sha`` agrees, every table on its schema and its invariants
    (``table_invariant``), the metadata of its types."""
    blob = load_cache_blob(cpath)
    if blob is None:
        return None
    try:
        if sha is None and blob["stat"] != sig:
            return None
        sha = sha or str(blob["sha256"])
        if blob["key"] != cache_key(sha, CODE_MODULES):
            return None
        meta = msgspec.convert(blob["meta"], RankMeta)
        tables = {t: pa.ipc.open_stream(pa.py_buffer(blob["tables"][t])).read_all()
                  for t in schemas.TABLE_SCHEMAS}
        for t, table in tables.items():
            if why := schemas.table_mismatch(table, schemas.TABLE_SCHEMAS[t]):
                raise ValueError(f"table {t}: {why}")
            if why := table_invariant(t, table):
                raise ValueError(f"table {t}: {why}")
        if meta.whole_overlap_ns < 0 or meta.whole_comm_ns < meta.whole_overlap_ns:
            raise ValueError("whole-trace overlap beyond its communication")
        return RankTables(path=path, cache_hit=True, sha256=sha,
                          **{k: getattr(meta, k) for k in _META},
                          **{t: table.to_pandas() for t, table in tables.items()})
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError,
            msgspec.ValidationError, pa.ArrowException) as exc:
        log.info("ignoring unreadable cache %s (%s)", cpath, exc)
        return None


def _write_tables(cpath: Path, sig: list[int], rt: RankTables) -> None:
    """Cache ``rt``; a table off its schema (``schemas.TABLE_SCHEMAS``) is not cached, logged."""
    try:
        blob = {"key": cache_key(rt.sha256, CODE_MODULES), "sha256": rt.sha256, "stat": sig,
                "meta": {k: getattr(rt, k) for k in _META},
                "tables": {t: _ipc(t, getattr(rt, t)) for t in schemas.TABLE_SCHEMAS}}
        dump_cache_blob(cpath, blob)
    except (OSError, ValueError, pa.ArrowException) as exc:
        log.info("could not write cache %s (%s)", cpath, exc)


def _cached(path: Path) -> RankTables | None:
    """The tables of ``path`` from a cache whose stat signature matches, else None."""
    try:
        sig = _stat_sig(path)
    except OSError:
        return None
    return _read_tables(tables_cache_path(path), path, sig, None)


def _tables_worker(path: Path, max_bytes: int | None = None) -> RankTables | BadInput:
    """Process-pool (and Dask task) entry: ``rank_tables(path, max_bytes)``; a bad file's
    ``BadInput`` is returned, not raised, so that every file's problem is reported at once."""
    try:
        return rank_tables(path, max_bytes)
    except BadInput as exc:
        return exc


def _size_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # the worker says what is wrong


def parse_files(paths: list[Path], jobs: int | None, *, worker=None, keep=None
                ) -> tuple[list[Any], list[BadInput]]:
    """``worker`` (a path -> a result, or the ``BadInput`` of a bad file; None: the per-rank
    tables, ``rank_tables``) over every path, in ``jobs`` processes (analyzer/ingest/pool.py),
    largest file first; ``keep`` (``spill.Spill.keep``, None: none) takes each result as it
    arrives. Returns the results in the order of ``paths`` and the problems (``BadInput``), so
    that all are reported. The default worker is given this process's size cap
    (``decode.max_trace_bytes`` for that many processes) as an argument, so a Dask worker,
    whose environment is not the client's, reads with the client's cap."""
    from functools import partial

    from analyzer.ingest.decode import cpu_count, max_trace_bytes
    from analyzer.ingest.pool import run_all

    if worker is None:
        procs = min(jobs or cpu_count(), max(1, len(paths)))
        worker = partial(_tables_worker, max_bytes=max_trace_bytes(procs))

    # largest first (longest-processing-time-first scheduling): processes taking the next file
    # as they free up then end within about one small file of each other
    order = sorted(range(len(paths)), key=lambda i: -_size_bytes(paths[i]))
    results: list[Any] = [None] * len(paths)
    for i, r in zip(order, run_all(worker, [paths[i] for i in order], jobs, keep=keep)):
        results[i] = r
    ok = [r for r in results if not isinstance(r, BadInput)]
    bad = [r for r in results if isinstance(r, BadInput)]
    return ok, bad


# --- the job: rank rule, checks, JobTables ------------------------------------------------------

def assign_ranks(files: list[RankTables]) -> tuple[list[tuple[int, str, RankTables]], int | None,
                                                    list[BadInput]]:
    """Apply the rank rule (module docstring). Returns ([(rank, rank_source, file)], world size
    the traces say or None, problems)."""
    problems: list[BadInput] = []
    ranks: list[int | None] = []
    for f in files:
        r = (f.distributed_info or {}).get("rank")
        ranks.append(r if isinstance(r, int) and not isinstance(r, bool) and r >= 0 else None)
    with_rank = [f for f, r in zip(files, ranks) if r is not None]
    without = [f for f, r in zip(files, ranks) if r is None]
    out: list[tuple[int, str, RankTables]] = []
    if with_rank and without:
        problems.append(BadInput(
            ", ".join(str(f.path) for f in without), "mixed_rank_info",
            f"no distributedInfo.rank while {len(with_rank)} other file(s) of the folder have one",
            "put only one job's traces in the folder"))
        return out, None, problems
    if without:
        if len(without) == 1:
            out = [(0, "single file", without[0])]
        else:
            nums = [_RANK_IN_NAME.findall(f.path.name) for f in without]
            if any(not m for m in nums):
                names = ", ".join(str(f.path) for f, m in zip(without, nums) if not m)
                problems.append(BadInput(names, "no_rank",
                                         "no distributedInfo.rank and no rank<N>/worker<N> in "
                                         "the file name", "rename the files rank<N>.json or "
                                         "record with torch.distributed initialised"))
                return [], None, problems
            out = [(int(m[-1]), "file name", f) for f, m in zip(without, nums)]
    else:
        out = [(r, "distributedInfo", f) for f, r in zip(files, ranks)]  # type: ignore[misc]
    by_rank: dict[int, list[RankTables]] = {}
    for r, _, f in out:
        by_rank.setdefault(r, []).append(f)
    for r, fs in sorted(by_rank.items()):
        if len(fs) > 1:
            problems.append(BadInput(" and ".join(str(f.path) for f in fs), "duplicate_rank",
                                     f"both files are rank {r}",
                                     "keep one trace per rank in the folder"))
    problems += _job_mismatches(files)
    sizes: dict[int, list[RankTables]] = {}
    for f in files:
        ws = (f.distributed_info or {}).get("world_size")
        if isinstance(ws, int):
            sizes.setdefault(ws, []).append(f)
    world = None
    if len(sizes) > 1:
        desc = "; ".join(f"{ws} in {', '.join(str(f.path) for f in fs)}"
                         for ws, fs in sorted(sizes.items()))
        problems.append(BadInput(files[0].path.parent, "world_size_mismatch",
                                 f"world sizes disagree: {desc}",
                                 "put only one job's traces in the folder"))
    elif sizes:
        world = next(iter(sizes))
        beyond = [(r, f) for r, _, f in out if r >= world]
        if beyond:
            problems.append(BadInput(", ".join(str(f.path) for _, f in beyond), "rank_out_of_range",
                                     f"rank {', '.join(str(r) for r, _ in beyond)} but world size "
                                     f"{world}", "put only one job's traces in the folder"))
    return sorted(out, key=lambda t: t[0]), world, problems


def _job_mismatches(files: list[RankTables]) -> list[BadInput]:
    """Files that cannot come from one job: ``distributedInfo.backend`` differs, or a process
    group of the same name has different member ranks (``distributedInfo.pg_config``). Ranks may
    list different groups (a rank outside a subgroup does not know it), so only groups present
    in several files are compared."""
    problems: list[BadInput] = []
    if not files:
        return problems
    folder = files[0].path.parent
    backends: dict[str, list[RankTables]] = {}
    groups: dict[str, dict[str, list[RankTables]]] = {}
    for f in files:
        di = f.distributed_info or {}
        if isinstance(di.get("backend"), str):
            backends.setdefault(di["backend"], []).append(f)
        pgs = di.get("pg_config")
        for pg in pgs if isinstance(pgs, list) else []:
            if isinstance(pg, dict) and "pg_name" in pg and isinstance(pg.get("ranks"), list):
                members = json.dumps(pg["ranks"])
                groups.setdefault(str(pg["pg_name"]), {}).setdefault(members, []).append(f)

    def names(fs: list[RankTables]) -> str:
        return ", ".join(f.path.name for f in fs)

    if len(backends) > 1:
        desc = "; ".join(f"{b} in {names(fs)}" for b, fs in sorted(backends.items()))
        problems.append(BadInput(folder, "mixed_jobs", f"backends disagree: {desc}",
                                 "put only one job's traces in the folder"))
    for pg, by_members in sorted(groups.items()):
        if len(by_members) > 1:
            desc = "; ".join(f"ranks {m} in {names(fs)}" for m, fs in sorted(by_members.items()))
            problems.append(BadInput(folder, "mixed_jobs",
                                     f"process group {pg!r} has different members: {desc}",
                                     "put only one job's traces in the folder"))
    return problems


def check_manifest_sha256(root: Path, manifest: schemas.Manifest | None,
                          files: list[RankTables]) -> None:
    """Raise ``BadInput`` (reason ``file_changed``) for the first trace whose SHA-256 differs
    from the one ``manifest.json`` of run directory ``root`` records for it. The hash each
    parse computes anyway is used, so analyzer/ingest/rundirs.py does not read big traces twice."""
    for f in files if manifest is not None else []:
        rel = f.path.relative_to(root).as_posix() if f.path.is_relative_to(root) else f.path.name
        entry = manifest.file(rel)
        if entry is None:  # rundirs refuses unlisted traces first; never skip the check
            raise BadInput(f.path, "bad_run_file", "not listed in manifest.json: added after "
                           "the record, so not checked against it",
                           "move the file out of the run directory, or re-record the run")
        if f.sha256 and f.sha256 != entry.sha256.lower():
            raise BadInput(f.path, "file_changed",
                           "changed since it was recorded (sha256 differs from manifest.json)",
                           "re-record the run")


def _set_rank(rt: RankTables, rank: int, source: str, world_size: int) -> None:
    rt.rank, rt.rank_source = rank, source
    rt.group_fallback = group_fallback(pg_sizes_of(rt.distributed_info), world_size)
    for name in ("breakdown", "collectives", "prefetch"):
        if name not in rt.spilled:  # a spilled table is fixed as it is read
            _fixed(rt, name, getattr(rt, name))


def _fixed(rt: RankTables, name: str, df: pd.DataFrame) -> pd.DataFrame:
    """``df`` (table ``name`` of ``rt``, in place) with the rank column set to ``rt.rank`` and,
    in collectives, an unknown group size (<= 0) set to ``rt.group_fallback`` when that is
    known (the job's world size where the trace's pg_config proves every group is the world;
    unknown stays -1 otherwise: no pg_config, or a smaller process group in it)."""
    if "rank" in df.columns:
        df["rank"] = pd.Series(rt.rank, index=df.index, dtype=df["rank"].dtype
                               if df["rank"].dtype != object else "int64")
    if name == "collectives" and len(df) and "group_size" in df.columns \
            and rt.group_fallback > 0:
        gs = df["group_size"].to_numpy().copy()
        gs[gs <= 0] = rt.group_fallback
        df["group_size"] = gs
    return df


def _concat(parts: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=columns)
    return pd.concat(parts, ignore_index=True)


def load_run(run, *, jobs: int | None = None) -> JobTables:
    """The tables of the job ``run`` (an ``analyzer.ingest.rundirs.RunDir``: its trace files and its
    manifest, already found and read), ranks computed in ``jobs`` processes (default min(cpu
    count, files)). All problems of the folder (unusable files, the rank rule, world sizes,
    mixed jobs) are raised together as one ``BadInput`` whose ``problems`` lists them; then a
    trace changed since the record (``file_changed``) and traces of different jobs
    (``mixed_jobs``, analyzer/ingest/samejob.py)."""
    from analyzer.ingest.decode import max_trace_bytes

    max_trace_bytes()  # a bad PARITYTRACE_MAX_TRACE_BYTES is said even when every rank is cached
    root, paths = run.path, run.traces
    if not paths:
        what = "*.json / *.json.gz trace" if run.manifest is None and not run.incomplete \
            else "rank*.trace.json.gz"
        raise BadInput(root, "empty", f"holds no {what} files",
                       "point at a folder of PyTorch profiler traces")
    notes = [f"{root}: incomplete run (no manifest.json), analysed as found"] \
        if run.incomplete else []
    notes += run.notes
    # valid caches (stat fast path) are read here; only the others go to worker processes.
    # Each rank's big tables go to disk as it arrives once the job's pass the budget.
    store = Spill()  # reads PARITYTRACE_TABLES_MEMORY: a bad value is said before any parse
    try:
        return _load(run, jobs, store, notes)
    except BaseException:  # a refused job (or an interrupt) leaves nothing on disk
        store.close()
        raise


def _load(run, jobs: int | None, store: Spill, notes: list[str]) -> JobTables:
    """``load_run`` once its notes are made, with ``store`` taking each rank's tables."""
    from analyzer.ingest.samejob import check_same_job

    root, manifest, paths = run.path, run.manifest, run.traces
    cached = {p: store.keep(_cached(p)) for p in paths}
    computed, problems = parse_files([p for p, hit in cached.items() if hit is None], jobs,
                                     keep=store.keep)
    by_path = {**{p: hit for p, hit in cached.items() if hit is not None},
               **{f.path: f for f in computed}}
    files = [by_path[p] for p in paths if p in by_path]
    check_manifest_sha256(root, manifest, files)
    if files and all(f.empty for f in files):
        problems += [_no_events(f.path) for f in files]
        files = []
    assigned, world, more = assign_ranks(files) if files else ([], None, [])
    problems += more
    if problems:
        if len(problems) == 1:
            raise problems[0]
        raise BadInput(root, "bad_folder", f"{len(problems)} problems: "
                       + " | ".join(p.one_line() for p in problems),
                       "fix or remove the files named", problems=problems)
    if manifest is not None:
        if world is not None and world != manifest.world_size:
            raise BadInput(root / schemas.MANIFEST_NAME, "world_size_mismatch",
                           f"manifest world_size {manifest.world_size} but the traces say "
                           f"{world}", "re-record the run")
        world = manifest.world_size
    if world is None:
        world = max(len(assigned), max(r for r, _, _ in assigned) + 1)
    ranks = []
    kind = next((f.device_kind for _, _, f in assigned if not f.empty), "cpu")
    for r, source, f in assigned:
        _set_rank(f, r, source, world)
        if f.empty:
            f.device_kind = kind  # as its job's other ranks
            notes.append(f"rank {r} ({f.path.name}) holds only metadata, no complete events: "
                         "reported as an empty rank")
        ranks.append(f)
    whole = [rt.rank for rt in ranks if rt.whole_trace_mode]
    if whole and len(whole) < len(ranks):
        notes.append(f"ranks {whole} have no ProfilerStep and are analysed in whole-trace mode")
    out = JobTables(root=root, ranks=ranks, world_size=world, manifest=manifest,
                    whole_trace_mode=bool(whole) and len(whole) == len(ranks), warnings=notes,
                    breakdown=_concat([r.breakdown for r in ranks], schemas.BREAKDOWN_SCHEMA.names),
                    spill=store)
    check_same_job(root, out.batches("collectives", ["rank", "step", "pg", "kind"]),
                   {r.rank: r.path for r in ranks})
    if out.missing_ranks:
        notes.append(f"{len(ranks)} of {world} ranks")
    from analyzer.ingest import dataset

    dataset.offer(run.name, out)  # --tables-out (analyzer/ingest/dataset.py)
    return out


def load_tables(path: Path | str, *, allow_incomplete: bool = False, jobs: int | None = None
                ) -> JobTables:
    """``load_run`` of the one job at ``path`` (``rundirs.find_job``: a run directory, a folder
    of traces or one trace file). Raises ``BadInput``."""
    from analyzer.ingest.rundirs import find_job

    return load_run(find_job(path, allow_incomplete=allow_incomplete), jobs=jobs)
