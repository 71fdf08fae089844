"""What a per-rank tables cache is matched on (analyzer/ingest/tablecache.py, issue 46 item 4;
docs/caches.md "What a hit is keyed on"): a stale or planted cache is never served.

Oracles: each trace is parsed afresh (a miss) and its figures compared with the served ones;
edits are made here, in place, with ``os.utime`` restoring the times; the case the times cannot
show (an edit in the same clock tick, a file system with no change time) is made by signing the
edited file's stat signature into the cache, as a cache written after the edit would hold it."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from analyzer.contract import schemas
from analyzer.ingest import cachekey, tablecache
from analyzer.ingest.ranktables import rank_tables


def _events(mm_dur_us: int) -> list[dict]:
    ops = [("ProfilerStep#0", 0, 100), ("aten::mm", 10, mm_dur_us)]
    pad = [("aten::pad%d" % i, 200 + i, 1) for i in range(3000)]  # past both 64 KiB probes
    return [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 1, "ts": ts, "dur": d}
            for n, ts, d in ops + pad]


def _write(path: Path, mm_dur_us: int) -> Path:
    data = json.dumps({"schemaVersion": 1, "traceEvents": _events(mm_dur_us)}).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


def _edit_in_place(path: Path, mm_dur_us: int) -> None:
    """Rewrite ``path`` with aten::mm lasting ``mm_dur_us`` (same digits: same size), its
    inode kept and its atime / mtime set back as they were."""
    st = path.stat()
    fresh = _write(path.with_name("fresh" + "".join(path.suffixes)), mm_dur_us).read_bytes()
    assert len(fresh) == st.st_size
    with open(path, "r+b") as fh:
        fh.write(fresh)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_ino == st.st_ino and path.stat().st_mtime_ns == st.st_mtime_ns


def _mm_ns(rt) -> int:
    """Compute time of step 0 (ns): aten::mm alone (the padding lies after the step)."""
    return int(rt.breakdown["compute_ns"].iat[0])


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_edit_in_place_with_size_and_mtime_restored_is_a_miss(tmp_path, name):
    p = _write(tmp_path / name, 20)
    assert not rank_tables(p).cache_hit and rank_tables(p).cache_hit
    _edit_in_place(p, 30)
    got = rank_tables(p)  # the ctime moved: the stored bytes are hashed, and differ
    assert not got.cache_hit and _mm_ns(got) == 30_000


def _sign_stat_as_after_the_edit(p: Path) -> None:
    """The cache of ``p`` with the edited file's size, times, inode and device (not its probe):
    what a cache holds when the edit fell in the clock tick of its write, or on a file system
    whose change time an ``os.utime`` sets back."""
    cpath = tablecache.tables_cache_path(p)
    blob = tablecache.load_cache_blob(cpath)
    blob["stat"][:5] = tablecache.stat_sig(p)[:5]
    if not blob["sha256"]:  # a plain JSON trace's key is made from that signature
        blob["key"] = cachekey.cache_key(tablecache._content("", blob["stat"]),
                                         tablecache.CODE_MODULES)
    tablecache.dump_cache_blob(cpath, blob)


@pytest.mark.parametrize("name", ["t.json.gz", "t.json"])
def test_an_edit_the_stat_does_not_show_is_seen_by_the_probe(tmp_path, name):
    # .json.gz: the edit is in the middle of the JSON; the gzip trailer's CRC-32 (in the last
    # 64 KiB) changes with it. .json: the edit is in the first 64 KiB.
    p = _write(tmp_path / name, 20)
    rank_tables(p)
    _edit_in_place(p, 30)
    _sign_stat_as_after_the_edit(p)
    got = rank_tables(p)
    assert not got.cache_hit and _mm_ns(got) == 30_000


def test_residual_plain_json_edit_between_the_probes_with_an_equal_stat_is_served(tmp_path):
    """The risk docs/caches.md states: plain JSON edited only between its first and last
    64 KiB, with size, mtime, ctime, inode and device all equal (the same clock tick, or no
    change time), is not seen. The stored bytes are hashed as soon as any of them differs."""
    p = tmp_path / "t.json"
    data = json.dumps({"schemaVersion": 1, "traceEvents": _events(20)}).encode()
    p.write_bytes(data)
    first = rank_tables(p)
    mid = data.index(b'"aten::pad1500"')
    assert tablecache.PROBE_BYTES < mid < len(data) - tablecache.PROBE_BYTES
    edited = data[:mid] + b'"aten::pad9999"' + data[mid + 15:]
    st = p.stat()
    with open(p, "r+b") as fh:
        fh.write(edited)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    _sign_stat_as_after_the_edit(p)
    assert rank_tables(p).cache_hit and _mm_ns(rank_tables(p)) == _mm_ns(first)


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_a_file_replaced_by_another_is_a_miss_and_by_a_copy_a_hit_when_gzip(tmp_path, name):
    p = _write(tmp_path / name, 20)
    rank_tables(p)
    other = _write(tmp_path / ("other" + "".join(p.suffixes)), 40)
    os.replace(other, p)  # another inode, another content
    got = rank_tables(p)
    assert not got.cache_hit and _mm_ns(got) == 40_000
    copy = tmp_path / "copy"
    shutil.copy(p, copy)
    os.replace(copy, p)  # another inode, the same bytes
    again = rank_tables(p)
    # gzip: the SHA-256 of the stored bytes agrees; plain JSON is keyed by its signature, so
    # parsed again rather than hashed whole (docs/caches.md)
    assert again.cache_hit == name.endswith(".gz") and _mm_ns(again) == _mm_ns(got)
    assert again.sha256 == ("" if name == "t.json" else schemas.sha256_file(p))


def test_a_cache_copied_from_another_user_is_recomputed(tmp_path, monkeypatch):
    p = _write(tmp_path / "t.json.gz", 20)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "alice"))
    rank_tables(p)
    theirs = tablecache.tables_cache_path(p)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "bob"))
    mine = tablecache.tables_cache_path(p)
    mine.parent.mkdir(parents=True)
    shutil.copy(theirs, mine)  # this very trace's signature, size, times and probe in it
    assert not rank_tables(p).cache_hit  # signed with alice's key, not bob's
    assert mine.read_bytes() != theirs.read_bytes() and rank_tables(p).cache_hit


def test_stat_sig_of_a_fifo_does_not_block(tmp_path):
    fifo = tmp_path / "t.json"
    os.mkfifo(fifo)
    assert tablecache.stat_sig(fifo)[-1] == ""  # no probe read from a FIFO, no hang


def test_a_cache_of_the_signature_without_probe_is_hashed_once_then_hits(tmp_path):
    # a cache an older analyzer wrote (size, times, inode, device only): its signature never
    # equals the new one, so the trace is hashed, the key agrees and the signature is rewritten
    p = _write(tmp_path / "t.json.gz", 20)
    rank_tables(p)
    cpath = tablecache.tables_cache_path(p)
    blob = tablecache.load_cache_blob(cpath)
    blob["stat"] = blob["stat"][:5]
    tablecache.dump_cache_blob(cpath, blob)
    assert tablecache.read_tables(cpath, tablecache.stat_sig(p), None) is None
    assert rank_tables(p).cache_hit
    assert tablecache.load_cache_blob(cpath)["stat"] == tablecache.stat_sig(p)
