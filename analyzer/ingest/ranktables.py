"""One trace file -> its rank's tables (``RankTables``; no events), through the parse cache.

read + SHA-256 -> decode (analyzer/ingest/decode.py) -> classify (analyzer/ingest/classify.py) ->
per-rank tables (analyzer/analyses/), cached in the user's cache, never beside the trace
(analyzer/ingest/tablecache.py). The job sets the rank (analyzer/ingest/pipeline.py ``load_run``).
"""

from __future__ import annotations

import gc
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from analyzer.contract import schemas
from analyzer.contract.errors import BadInput
from analyzer.ingest import tablecache
from analyzer.ingest.distinfo import DistInfo, read as read_distinfo


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
    """The trace's distributedInfo as written (``dist`` reads it), None when absent."""
    main_tid: str | None = None
    """The main thread's tid on a CPU-only rank (analyzer/ingest/classify.py says how it is found)."""
    whole_trace_mode: bool = False
    """No ProfilerStep in the trace: step 0 is the whole trace."""
    warnings: list[str] = field(default_factory=list)
    """Problems skipped while decoding (bad ts/dur counts ...) and the step rules' notes
    (analyzer/ingest/steps.py: events left out, spans ignored or clipped), one line each."""
    empty: bool = False
    """The file holds no complete events (metadata only): an empty rank (``load_run``)."""
    tables: dict[str, bytes] = field(default_factory=dict)
    """Each table of ``schemas.TABLE_SCHEMAS`` (but a spilled one) as the Arrow IPC stream
    the cache holds (``tablecache.stream``), its rank column -1: ``table`` / ``frame`` read
    it with the rank set. Bytes, not pandas frames nor Arrow tables, because a job of
    thousands of ranks holds thousands of them: a rank's six small tables take ~31 kB as
    streams against 36 to 90 kB as frames or tables (objects and allocations per column),
    and a cache hit reads them without building any (bench/RESULTS.md, issue 46)."""
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
    """SHA-256 of the trace file's bytes as stored (hex) when it is gzip; "" for a plain JSON
    trace, hashed only where a manifest lists it (``pipeline.check_manifest_sha256``)."""
    group_fallback: int = 0
    """The group size a collective of unknown group size takes (``commid.group_fallback``),
    set with the rank."""
    spilled: dict[str, str] = field(default_factory=dict)
    """Tables moved to disk (analyzer/ingest/spill.py): name -> file, out of ``tables``;
    ``table`` reads them from there."""

    @property
    def dist(self) -> DistInfo:
        """``distributed_info`` read (analyzer/ingest/distinfo.py)."""
        return read_distinfo(self.distributed_info)

    def table(self, name: str, columns: list[str] | None = None) -> pa.Table:
        """Table ``name`` (only ``columns``, None: all) from memory or from disk
        (analyzer/ingest/spill.py), with ``load_run``'s fixes: the rank column set to
        ``rank``, and in collectives an unknown group size (<= 0) set to ``group_fallback``
        when that is known (the job's world size where the trace's pg_config proves every
        group is the world; unknown stays -1 otherwise: no pg_config, or a smaller process
        group in it). Raises ``KeyError`` for a name not in ``schemas.TABLE_SCHEMAS``."""
        if name in self.spilled:
            from analyzer.ingest import spill

            t = spill.read_table(self.spilled[name], columns)
        else:
            t = tablecache.table_of(self.tables[name])
            t = t if columns is None else t.select(columns)
        names = t.column_names
        if "rank" in names:
            t = t.set_column(names.index("rank"), "rank",
                             pa.array(np.full(t.num_rows, self.rank, np.int64)))
        if name == "collectives" and t.num_rows and "group_size" in names \
                and self.group_fallback > 0:
            gs = t["group_size"].to_numpy()
            t = t.set_column(names.index("group_size"), "group_size",
                             pa.array(np.where(gs <= 0, self.group_fallback, gs)))
        return t

    def frame(self, name: str, columns: list[str] | None = None) -> pd.DataFrame:
        """``table(name, columns)`` as pandas."""
        return self.table(name, columns).to_pandas()

    # each table as pandas (``frame``), for the library API and the tests
    steps = property(lambda self: self.frame("steps"))
    breakdown = property(lambda self: self.frame("breakdown"))
    collectives = property(lambda self: self.frame("collectives"))
    prefetch = property(lambda self: self.frame("prefetch"))
    timeline = property(lambda self: self.frame("timeline"))
    device_memory = property(lambda self: self.frame("device_memory"))
    """Peak memory per device from the trace's ``[memory]`` events
    (``schemas.DEVICE_MEMORY_SCHEMA``; empty when it has none)."""


GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of a gzip member (RFC 1952)."""


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
                raise too_large(path, f"the file ({size:,} bytes)", cap, size)
            return fh.read()
    except OSError as exc:
        raise BadInput(path, "unreadable", f"cannot read the file ({exc.strerror})",
                       "check the path and its permissions") from None


def no_events(path: Path) -> BadInput:
    """The refusal of a trace with no complete events."""
    return BadInput(path, "no_events", "holds no complete (ph X) events with a valid ts and "
                    "dur (only metadata, or every event skipped): this rank recorded nothing",
                    "re-record it, or move the file out of the folder to analyse the other "
                    "ranks")


def _beyond_int64(value: Any) -> int | None:
    """The first integer in ``value`` (JSON: dicts, lists, scalars; nesting bounded by the
    decoder) outside int64, which neither the cache's msgpack nor numpy holds; else None."""
    if type(value) is int:
        return value if not -2**63 <= value < 2**63 else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((b for v in items if (b := _beyond_int64(v)) is not None), None)


def classified(path: Path, dec=None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Decode and classify one trace file (``dec``: its decoded form, when already decoded).

    Returns ``(events, info)``: the event table (analyzer/api.py module docstring) and info =
    {device_kind, main_tid, whole_trace_mode, steps, unlaunched, distributed_info, warnings
    (the decoder's, then classify's notes)}. Raises ``BadInput`` (unreadable, truncated,
    not a trace, no complete events)."""
    from analyzer.ingest.classify import classify
    from analyzer.ingest.decode import decode_bytes, decompress

    if dec is None:
        dec = decode_bytes(decompress(read_trace(path), path), path)
    if dec.events.empty:
        raise no_events(path)
    if (big := _beyond_int64(dec.distributed_info)) is not None:
        raise BadInput(path, "not_a_trace", f"distributedInfo holds an integer of {big.bit_length()} "
                       "bits, beyond 64: no process group, rank or size is that large",
                       "pass the trace as the profiler wrote it")
    d = read_distinfo(dec.distributed_info)
    events, info = classify(dec.events, world_size=d.world_size, pg_sizes=d.sizes(),
                            pg_ranks=d.ranks_text(), pg_descs=d.descs(), path=str(path),
                            backend=d.backend)
    return events, {**info, "distributed_info": dec.distributed_info,
                    "warnings": dec.warnings + info["notes"]}


def rank_tables(path: Path, max_bytes: int | None = None) -> RankTables:
    """The tables of one trace file, through the cache, reading at most ``max_bytes`` of JSON
    (default ``decode.max_trace_bytes()``). Rank-dependent fields stay unset (rank -1,
    group_size <= 0 left as -1): ``load_run`` fills them after the rank rule. Raises
    ``BadInput``."""
    from analyzer.analyses.memory import device_peaks
    from analyzer.ingest.decode import columns, decompress, memory_events, parse

    try:
        sig = tablecache.stat_sig(path)
    except OSError:
        sig = []  # read_trace says what is wrong
    if (hit := _cached(path, sig, None)) is not None:
        return hit
    raw = read_trace(path, max_bytes)
    # the bytes as stored are hashed when cheap (gzip: ~1.5 ms a rank); a plain JSON trace's
    # 20-24 ms only where a manifest asks (pipeline.check_manifest_sha256, docs/caches.md)
    sha = hashlib.sha256(raw).hexdigest() if raw[:2] == GZIP_MAGIC else ""
    cpath = tablecache.tables_cache_path(path)
    if sha and (hit := _cached(path, sig, sha)) is not None:  # touched but unchanged
        tablecache.write_tables(cpath, sig, hit)  # record the new stat signature
        return hit
    data = decompress(raw, path, max_bytes)
    del raw
    parsed = parse(data, path)
    del data  # held by ``parsed`` alone, freed before the columns are built
    # the bytes decoded, read again only when the decode saw [memory] events (b"": none)
    mem_events, mem_notes = memory_events(parsed.json if parsed.memory_events else b"")
    parsed.json = None
    dec = columns(parsed, path)
    del parsed
    dev_mem = device_peaks(mem_events)
    dec.warnings += [f"{path}: {n}" for n in mem_notes]
    if dec.events.empty:  # an empty rank; load_run refuses a job of empty ranks only
        rt = RankTables(path=path, world_size=read_distinfo(dec.distributed_info).world_size,
                        distributed_info=dec.distributed_info, empty=True,
                        warnings=dec.warnings, sha256=sha,
                        tables={**{t: tablecache.stream(s.empty_table())
                                   for t, s in schemas.TABLE_SCHEMAS.items()},
                                "device_memory": arrow(dev_mem)})
        tablecache.write_tables(cpath, sig, rt)
        return rt
    ev, info = classified(path, dec=dec)
    del dec
    rt = _rank_of(path, ev, info, dev_mem, sha)
    del ev
    tablecache.write_tables(cpath, sig, rt)
    return rt


def _rank_of(path: Path, ev: pd.DataFrame, info: dict[str, Any], dev_mem: pd.DataFrame,
             sha: str) -> RankTables:
    """The ``RankTables`` of the classified events ``ev`` of ``path`` (``classified``'s
    ``info``; ``dev_mem``: its device memory table; ``sha``: its SHA-256 or "")."""
    from analyzer.analyses.breakdown import (comm_shares, rank_breakdown, timeline_rows,
                                             whole_trace_overlap)
    from analyzer.analyses.collectives import rank_collectives
    from analyzer.analyses.prefetch import prefetch_table
    from analyzer.analyses.straggler import gap_parts

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
    return RankTables(path=path, world_size=read_distinfo(info["distributed_info"]).world_size,
                        device_kind=device_kind, distributed_info=info["distributed_info"],
                        main_tid=main_tid, whole_trace_mode=info["whole_trace_mode"],
                        warnings=info["warnings"], tables={t: arrow(df) for t, df in {
                            "steps": steps,
                            "breakdown": rank_breakdown(-1, ev, steps, device_kind, main_tid),
                            "collectives": coll, "prefetch": prefetch_table(ev, rank=-1),
                            "timeline": tl, "device_memory": dev_mem}.items()},
                        timeline_step=tl_step,
                        whole_overlap_ns=int(overlap_ns),
                        whole_comm_ns=int(comm_ns), sha256=sha, first_ns=int(ev["ts_ns"].min()))


def arrow(df: pd.DataFrame) -> bytes:
    """``df`` as a ``RankTables`` holds it (``tablecache.stream``): its columns as they are
    (the cache's write checks them against their schema, ``tablecache.checked``), with
    pandas' metadata, which gives ``RankTables.frame`` back the dtypes the analyses made
    (a nullable ``Int64`` column stays one)."""
    return tablecache.stream(pa.Table.from_pandas(df, preserve_index=False))


def cached(path: Path) -> RankTables | None:
    """The tables of ``path`` from a cache whose stat signature matches, else None."""
    try:
        sig = tablecache.stat_sig(path)
    except OSError:
        return None
    return _cached(path, sig, None)


def _cached(path: Path, sig: list[int], sha: str | None) -> RankTables | None:
    hit = tablecache.read_tables(tablecache.tables_cache_path(path), sig, sha)
    return None if hit is None else RankTables(path=path, **hit)


def out_of_memory(path: Path) -> BadInput:
    """The refusal of a trace whose decoding ran out of memory: the size cap bounds JSON
    bytes, and decoding dense events takes up to ~``decode.RAM_SHARE`` times that."""
    from analyzer.ingest.decode import MAX_TRACE_ENV, RAM_SHARE

    return BadInput(path, "too_large", "ran out of memory while decoding it (a trace takes up "
                    f"to ~{RAM_SHARE}x its JSON size in memory)",
                    f"free memory or analyse on a larger machine; {MAX_TRACE_ENV} (bytes of "
                    "JSON) set lower refuses such traces before they are read")


def tables_worker(path: Path, max_bytes: int | None = None) -> RankTables | BadInput:
    """Process-pool (and Dask task) entry: ``rank_tables(path, max_bytes)``; a bad file's
    ``BadInput`` is returned, not raised, so that every file's problem is reported at once."""
    enabled = gc.isenabled()
    gc.disable()  # ~3 % of a parse, which makes no reference cycles (none after a DLRM rank)
    try:
        return rank_tables(path, max_bytes)
    except BadInput as exc:
        return exc
    except MemoryError:  # what was allocated for it is freed by now: one line for this file
        return out_of_memory(path)
    finally:
        if enabled:
            gc.enable()
