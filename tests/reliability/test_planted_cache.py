"""Caches are untrusted input (issue 33 item 4): a per-rank tables cache planted in the user
cache, or copied into it, never replaces the trace's analysis; one beside a trace (where older
versions wrote them) is never read, and never removed.

Oracles: the tables computed from the trace itself (no cache at all); the planted caches are
built by the test as an attacker who knows the format would (the right key of the trace's
SHA-256 and the code, the trace's stat signature, every table on its schema), with step times
a tenth of the trace's, or negative."""

from __future__ import annotations

import os
import shutil

import msgspec
import pyarrow as pa

from analyzer.contract import schemas
from analyzer.ingest import tablecache
from analyzer.ingest.cachekey import cache_key
from analyzer.ingest.pipeline import load_tables
from analyzer.ingest.ranktables import rank_tables
from analyzer.ingest.tablecache import CODE_MODULES, tables_cache_path
from tests.inputs import cli, copy_run

_TIME = ("step_ns", "compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns", "other_ns",
         "idle_ns", "data_wait_ns", "cpu_step_ns")


def _fresh(run):
    for p in run.glob("*.trace.json.gz"):
        tables_cache_path(p).unlink(missing_ok=True)
    return load_tables(run).breakdown


def _planted_blob(trace, scale):
    """The cache an attacker writes: the trace's own tables with every time times ``scale``."""
    rt = rank_tables(trace)
    bd = rt.breakdown.copy()
    for c in _TIME:
        bd[c] = (bd[c] * scale).astype("int64")
    bd["idle_ns"] = bd["step_ns"] - bd[["compute_ns", "exposed_comm_ns", "data_wait_ns",
                                        "other_ns"]].sum(axis=1)
    tables = {t: tablecache.ipc(t, bd if t == "breakdown" else getattr(rt, t))
              for t in schemas.TABLE_SCHEMAS}
    return {"key": cache_key(rt.sha256, CODE_MODULES), "sha256": rt.sha256,
            "stat": tablecache.stat_sig(trace),
            "meta": {k: getattr(rt, k) for k in tablecache.RankMeta.__struct_fields__},
            "tables": tables}


def test_planted_cache_beside_a_real_trace_is_not_used(tmp_path, ddp_run):
    run = copy_run(ddp_run, tmp_path / "run")
    want = _fresh(run)
    trace = run / "rank0.trace.json.gz"
    blob = _planted_blob(trace, 0.1)
    payload = msgspec.msgpack.encode(blob)
    magic = tablecache.CACHE_MAGIC
    for planted in (payload,  # the unsigned format
                    magic + os.urandom(32) + payload):  # signed with another user's key
        tables_cache_path(trace).write_bytes(planted)
        got = load_tables(run)
        assert not got.ranks[0].cache_hit
        assert got.breakdown.equals(want)
        # copied with the trace (cp -r): still not trusted
        other = tmp_path / "copied"
        shutil.rmtree(other, ignore_errors=True)
        shutil.copytree(run, other)
        tables_cache_path(other / "rank0.trace.json.gz").write_bytes(planted)
        got = load_tables(other)
        assert not got.ranks[0].cache_hit
        assert got.breakdown["step_ns"].tolist() == want["step_ns"].tolist()


def test_own_cache_with_impossible_tables_is_recomputed(tmp_path, ddp_run):
    run = copy_run(ddp_run, tmp_path / "run")
    want = _fresh(run)
    trace = run / "rank0.trace.json.gz"
    for scale in (-1.0, 0.1):
        blob = _planted_blob(trace, scale)
        if scale > 0:  # parts that do not add up to the step
            blob = _planted_blob(trace, 1.0)
            bd = pa.ipc.open_stream(blob["tables"]["breakdown"]).read_all().to_pandas()
            bd["idle_ns"] += 1
            blob["tables"]["breakdown"] = tablecache.ipc("breakdown", bd)
        # signed by this user's own key (a bug or a damaged disk, not an attacker)
        tablecache.dump_cache_blob(tables_cache_path(trace), blob)
        got = load_tables(run)
        assert not got.ranks[0].cache_hit
        assert got.breakdown.equals(want)
        assert rank_tables(trace).cache_hit  # recomputed and written again, valid


def test_cache_beside_a_trace_is_neither_read_nor_removed(tmp_path, ddp_run, monkeypatch):
    """A cache an older version wrote beside a trace, here signed with this user's own key and
    valid in every way but its tenfold shorter steps: the tables come from the trace."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    run = copy_run(ddp_run, tmp_path / "run")
    want = _fresh(run)
    trace = run / "rank0.trace.json.gz"
    beside = trace.with_name(trace.name + ".tables.msgpack")
    tablecache.dump_cache_blob(beside, _planted_blob(trace, 0.1))
    planted = beside.read_bytes()
    tables_cache_path(trace).unlink()  # nothing in the user cache: only the file beside
    got = load_tables(run)
    assert not got.ranks[0].cache_hit and got.breakdown.equals(want)
    assert load_tables(run).ranks[0].cache_hit  # from the user cache, not from beside
    assert cli("report", str(run), "--out", str(tmp_path / "rep")).returncode == 0
    assert beside.read_bytes() == planted  # never removed nor rewritten
    assert sorted(p.name for p in run.glob("*.tables.msgpack")) == [beside.name]
