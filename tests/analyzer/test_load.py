"""Loading (analyzer/ingest/pipeline.py): decoding robustness, rank rule, errors naming files, the
per-rank tables cache, parallel parse."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import stat
from pathlib import Path

import pytest

import msgspec
import pyarrow as pa

from analyzer.api import load_events, load_tables
from analyzer.compare.runs import analyse
from analyzer.ingest.cachekey import cache_key, sign
from analyzer.contract.errors import BadInput
from analyzer.ingest.ranktables import rank_tables
from analyzer.ingest.tablecache import (CACHE_MAGIC, CODE_MODULES, dump_cache_blob, load_cache_blob,
                                        stat_sig, tables_cache_path)
from tests.analyzer.helpers import FIXTURES, corpus


def write(path: Path, events, **top) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, **top, "traceEvents": events}))
    return path


def op(name, ts, dur, tid=1, **extra):
    e = {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    e.update(extra)
    return e


def di(rank, world=2):
    return {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world}}


def test_bad_ts_and_dur_skipped_counted_rest_analysed(tmp_path):
    evs = [op("ProfilerStep#0", 0, 100), op("aten::mm", 10, 20), op("bad1", "abc", 5),
           op("bad2", 5, -3), {"ph": "X", "name": "bad3", "pid": 1, "tid": 1, "ts": 3},
           op("bad4", None, 4), op("aten::add", 50.0004, 9.9996)]
    ts = load_tables(write(tmp_path / "t.json", evs))
    rt = ts.ranks[0]
    events, _ = load_events(tmp_path / "t.json")
    assert set(events["name"].astype(str)) == {"ProfilerStep#0", "aten::mm", "aten::add"}
    text = " ".join(rt.warnings)
    assert events.attrs["warnings"] == rt.warnings
    assert "skipped 2 complete events with a missing, negative or non-numeric ts" in text
    assert "skipped 2 complete events with a missing, negative or non-numeric dur" in text
    add = events[events["name"] == "aten::add"].iloc[0]
    # 50.0004 µs -> 50000.4 ns -> 50000 (half up on the 4th decimal); 9.9996 -> 10000
    assert (add["ts_ns"], add["dur_ns"]) == (50_000, 10_000)
    b = ts.breakdown.iloc[0]
    assert b["compute_ns"] == 20_000 + 10_000


def test_mixed_types_take_the_lenient_path(tmp_path):
    # External id as a string, pid/tid as strings and ints: decoded the same way
    evs = [op("ProfilerStep#1", 0, 50, tid="7"), op("aten::mm", 1, 2, tid=7,
                                                    args={"External id": "12"})]
    events, _ = load_events(write(tmp_path / "t.json", evs))
    assert set(events["tid"].astype(str)) == {"7"}
    assert list(events["external_id"]) == [-1, -1]


@pytest.mark.parametrize("content, reason", [
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "du', "truncated"),
    (gzip.compress(b'{"traceEvents": []}', mtime=0)[:-6], "truncated"),
    (b'{"hello": 1}', "not_a_trace"),
    (b'[1, 2, 3]', "not_a_trace"),
])
def test_unusable_file_is_bad_input_naming_it(tmp_path, content, reason):
    p = tmp_path / ("x.json.gz" if content[:2] == b"\x1f\x8b" else "x.json")
    p.write_bytes(content)
    with pytest.raises(BadInput) as exc:
        load_tables(p)
    assert exc.value.reason == reason and str(p) in str(exc.value)
    assert "\n" not in str(exc.value)


def test_folder_problems_are_collected(tmp_path):
    write(tmp_path / "rank0.json", [op("a", 0, 1)], **di(0))
    (tmp_path / "rank1.json").write_bytes(b'{"traceEvents": [')
    (tmp_path / "rank2.json").write_bytes(b'{"nope": 1}')
    with pytest.raises(BadInput) as exc:
        load_tables(tmp_path)
    assert {p.reason for p in exc.value.problems} == {"truncated", "not_a_trace"}
    assert "rank1.json" in str(exc.value) and "rank2.json" in str(exc.value)


def test_duplicate_rank_names_both_files(tmp_path):
    write(tmp_path / "a.json", [op("x", 0, 1)], **di(0))
    write(tmp_path / "b.json", [op("x", 0, 1)], **di(0))
    with pytest.raises(BadInput) as exc:
        load_tables(tmp_path)
    assert exc.value.reason == "duplicate_rank"
    assert "a.json" in str(exc.value) and "b.json" in str(exc.value)


def test_world_sizes_disagree(tmp_path):
    write(tmp_path / "a.json", [op("x", 0, 1)], **di(0, 2))
    write(tmp_path / "b.json", [op("x", 0, 1)], **di(1, 4))
    with pytest.raises(BadInput) as exc:
        load_tables(tmp_path)
    assert exc.value.reason == "world_size_mismatch" and "a.json" in str(exc.value)


def test_rank_rule_file_names_and_errors(tmp_path):
    d = tmp_path / "names"
    d.mkdir()
    write(d / "job_worker3.json", [op("x", 0, 1)])
    write(d / "job_worker1.json", [op("x", 0, 1)])
    ts = load_tables(d)
    # the rank is the number in the name, not the file order; world = max rank + 1
    assert [(r.rank, r.rank_source, r.path.name) for r in ts.ranks] == \
        [(1, "file name", "job_worker1.json"), (3, "file name", "job_worker3.json")]
    assert ts.world_size == 4 and ts.missing_ranks == [0, 2]
    e = tmp_path / "nonames"
    e.mkdir()
    write(e / "a.json", [op("x", 0, 1)])
    write(e / "b.json", [op("x", 0, 1)])
    with pytest.raises(BadInput) as exc:
        load_tables(e)
    assert exc.value.reason == "no_rank" and "a.json" in str(exc.value)
    m = tmp_path / "mixed"
    m.mkdir()
    write(m / "rank0.json", [op("x", 0, 1)], **di(0))
    write(m / "rank1.json", [op("x", 0, 1)])
    with pytest.raises(BadInput) as exc:
        load_tables(m)
    assert exc.value.reason == "mixed_rank_info" and "rank1.json" in str(exc.value)


@pytest.mark.integration
def test_single_file_without_rank_is_rank0_of_1():
    for rel in ("single/no_distributed_info.json.gz", "single/no_rank_key.json.gz"):
        ts = load_tables(corpus(rel))
        assert [(r.rank, r.rank_source) for r in ts.ranks] == [(0, "single file")]
        assert ts.world_size == 1


def test_a_folder_whose_only_traces_are_skipped_is_refused_as_empty(tmp_path):
    """A hidden *.json (a macOS ._ file, a bench's stamp) is not a trace: a folder of only those
    holds nothing to analyse, said in one line that names what was skipped, not a report of no
    ranks."""
    for name, body in ((".built.json", '{"k": 5}'), ("._rank0.json", "\x00\x05")):
        folder = tmp_path / name.strip("._")
        folder.mkdir()
        (folder / name).write_text(body)
        with pytest.raises(BadInput) as exc:
            analyse(folder)  # what analyzer report runs
        assert exc.value.reason == "empty" and name in str(exc.value)


def test_empty_missing_and_incomplete_run(tmp_path):
    with pytest.raises(BadInput) as exc:
        load_tables(tmp_path / "nowhere")
    assert exc.value.reason == "missing"
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput) as exc:
        load_tables(tmp_path / "empty")
    assert exc.value.reason == "empty"
    run = tmp_path / "run"
    run.mkdir()
    (run / "steps.parquet").write_bytes(b"")
    write(run / "rank0.trace.json.gz", [op("ProfilerStep#0", 0, 5)], **di(0, 2))
    with pytest.raises(BadInput) as exc:
        load_tables(run)
    assert exc.value.reason == "incomplete_run" and "incomplete run" in str(exc.value)
    ts = load_tables(run, allow_incomplete=True)
    assert [r.rank for r in ts.ranks] == [0] and ts.missing_ranks == [1]
    assert any("1 of 2 ranks" in w for w in ts.warnings)


def test_tables_cache_is_used_and_invalidated(tmp_path):
    p = write(tmp_path / "t.json", [op("ProfilerStep#0", 0, 100), op("aten::mm", 10, 20)])
    first = load_tables(p).ranks[0]
    cached = tables_cache_path(p)
    assert cached.exists() and not first.cache_hit
    assert sorted(f.name for f in tmp_path.iterdir()) == ["t.json"]  # nothing beside the trace
    hit = rank_tables(p)  # before the rank rule: rank -1
    assert hit.cache_hit
    assert hit.breakdown.drop(columns="rank").equals(first.breakdown.drop(columns="rank"))
    assert hit.steps.equals(first.steps)
    write(p, [op("ProfilerStep#0", 0, 100), op("aten::mm", 10, 30)])  # content changes
    again = rank_tables(p)
    assert not again.cache_hit  # a stale cache is never used
    assert again.steps["end_ns"].max() == 100_000 and again.breakdown["compute_ns"].iat[0] == 30_000
    # the one key rule: the trace's content (plain JSON: its stat signature, not hashed;
    # gzip: the SHA-256 of its bytes) and the code that made the tables
    blob = load_cache_blob(cached)
    assert blob["sha256"] == "" and blob["stat"] == stat_sig(p)
    assert blob["key"] == cache_key("stat " + json.dumps(stat_sig(p), separators=(",", ":")),
                                    CODE_MODULES)
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    rank_tables(gz)
    blob = load_cache_blob(tables_cache_path(gz))
    assert blob["key"] == cache_key(hashlib.sha256(gz.read_bytes()).hexdigest(), CODE_MODULES)


def test_unreadable_cache_is_skipped_and_rewritten(tmp_path):
    p = write(tmp_path / "t.json", [op("ProfilerStep#0", 0, 100), op("aten::mm", 10, 20)])
    want = load_tables(p).breakdown
    cached = tables_cache_path(p)
    for junk in (b"\x00not msgpack", msgspec.msgpack.encode({"stat": [], "key": "x"}), b"",
                 "signed", "signed-not-msgpack"):
        if junk == "signed":  # signed by this user, but not a cache's fields
            dump_cache_blob(cached, {"stat": [], "key": "x"})
        elif junk == "signed-not-msgpack":  # signed, but the payload is no msgpack
            body = b"\xc1"  # a byte msgpack never uses
            cached.write_bytes(CACHE_MAGIC + sign(body) + body)
        else:
            cached.write_bytes(junk)
        got = load_tables(p)
        assert not got.ranks[0].cache_hit and got.breakdown.equals(want)
        assert rank_tables(p).cache_hit  # written again, readable


def test_cache_off_the_table_schema_is_a_logged_miss(tmp_path, caplog):
    p = write(tmp_path / "t.json", [op("ProfilerStep#0", 0, 100), op("aten::mm", 10, 20)])
    want = load_tables(p).breakdown
    cached = tables_cache_path(p)
    blob = load_cache_blob(cached)
    table = pa.ipc.open_stream(pa.py_buffer(blob["tables"]["breakdown"])).read_all()
    for bad in (table.drop_columns(["idle_ns"]), table.set_column(
            table.schema.get_field_index("step_ns"), "step_ns", table["step_ns"].cast(pa.float64()))):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, bad.schema) as w:
            w.write_table(bad)
        blob["tables"]["breakdown"] = sink.getvalue().to_pybytes()
        dump_cache_blob(cached, blob)  # signed: the schema check is what refuses it
        with caplog.at_level(logging.INFO, logger="analyzer.ingest.tablecache"):
            got = load_tables(p)
        assert not got.ranks[0].cache_hit and got.breakdown.equals(want)
        assert "ignoring unreadable cache" in caplog.text and "table breakdown" in caplog.text
        assert rank_tables(p).cache_hit  # written again, on the schema
        caplog.clear()


def test_table_off_its_schema_is_not_cached(tmp_path, caplog, monkeypatch):
    from analyzer.analyses import breakdown
    p = write(tmp_path / "t.json", [op("ProfilerStep#0", 0, 100), op("aten::mm", 10, 20)])
    real = breakdown.rank_breakdown
    monkeypatch.setattr(breakdown, "rank_breakdown", lambda *a, **k: real(*a, **k).drop(columns="idle_ns"))
    with caplog.at_level(logging.INFO, logger="analyzer.ingest.tablecache"):
        rank_tables(p)
    assert "could not write cache" in caplog.text and "table breakdown: columns" in caplog.text
    assert not tables_cache_path(p).exists()


@pytest.mark.parametrize("mode", [stat.S_IRWXU, stat.S_IRUSR | stat.S_IXUSR],
                         ids=["writable", "read-only"])
def test_tables_cache_is_in_the_user_cache_whatever_the_folders_mode(tmp_path, monkeypatch, mode):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    folder = tmp_path / "traces"
    folder.mkdir()
    p = write(folder / "t.json", [op("ProfilerStep#0", 0, 100)])
    os.chmod(folder, mode)
    try:
        assert not load_tables(p).ranks[0].cache_hit
        assert [f.name for f in folder.iterdir()] == ["t.json"]
        target = tables_cache_path(p)
        assert target.parent == tmp_path / "xdg" / "paritytrace" / "tables"
        assert target.name == hashlib.blake2b(str(p.resolve()).encode(),
                                              digest_size=16).hexdigest() + ".tables.msgpack"
        assert target.exists()
        assert load_tables(p).ranks[0].cache_hit
    finally:
        os.chmod(folder, stat.S_IRWXU)


def test_parallel_parse_equals_serial(tmp_path):
    for r in range(3):
        write(tmp_path / f"r{r}.json", [op("ProfilerStep#0", 0, 100), op("aten::mm", r, 20)],
              **di(r, 3))
    a = load_tables(tmp_path, jobs=1).breakdown
    for r in range(3):
        tables_cache_path(tmp_path / f"r{r}.json").unlink()
    b = load_tables(tmp_path, jobs=3).breakdown
    assert a.equals(b)


def test_fixture_folder_untouched_by_tests():
    assert not any(FIXTURES.glob("*.msgpack")) and not any(FIXTURES.glob("*.parquet"))


def test_no_product_module_imports_the_facade():
    """analyzer/api.py is the top facade for notebooks (it imports the ingest, never the
    reverse): no module of analyzer/, reports/ or tracer/ imports it, so no import cycle runs
    through it."""
    import ast

    repo = FIXTURES.parents[1]
    importers = []
    for f in sorted(p for pkg in ("analyzer", "reports", "tracer") for p in (repo / pkg).rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) and node.module else [])
            if any(n == "analyzer.api" or n.startswith("analyzer.api.") for n in names):
                importers.append(f.name)
    assert len(list((repo / "analyzer").rglob("*.py"))) > 20  # the walk saw the package
    assert importers == []
