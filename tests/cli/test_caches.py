"""The caches, through the commands: where the per-rank tables and report caches are written
(docs/caches.md: in the user cache, never beside the traces, and its clearing recipe run on a
real record), each cache folder trimmed to its cap least recently used first, and a report
served from the cache says again the notes the analysis said on stderr."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.inputs import cli, copy_run


def test_cached_report_repeats_the_stderr_notes(ddp_run, fsdp_fault_run, tmp_path, monkeypatch):
    from analyzer.compare import runs
    from analyzer.contract.report_types import AnalysisOptions
    from reports import cache

    root = tmp_path / "traces"
    copy_run(ddp_run, root / "ddp")
    inc = copy_run(fsdp_fault_run, root / "fsdp")
    (inc / "manifest.json").unlink()  # a record that did not finish
    args = ("report", str(root), "--allow-incomplete", "--out", str(tmp_path / "rep"))
    cold = cli(*args)
    assert cold.returncode == 0, cold.stderr
    note = (f"{inc}: no manifest.json (the tracer writes it last): the record did not complete "
            "(failed, interrupted or still running); analysed as found")
    assert cold.stderr.splitlines() == [note, f"analyzer: wrote report.md, report.json, "
                                              f"report.html to {tmp_path / 'rep'}"]
    assert note in cold.stdout  # also a note of the report itself

    def no_analysis(*a, **k):
        raise AssertionError("the warm report must come from the cache")

    monkeypatch.setattr(runs, "analyse", no_analysis)
    warm = cli(*args)
    assert warm.returncode == 0, warm.stderr
    assert warm.stderr == cold.stderr and warm.stdout == cold.stdout
    key = cache.key(root, tmp_path / "rep", AnalysisOptions(allow_incomplete=True))
    assert cache.load_entry(root, tmp_path / "rep", key)[1] == [note]


CACHES_DOC = Path(__file__).parents[2] / "docs" / "caches.md"


@pytest.mark.integration
def test_documented_cache_locations_and_clearing(ddp_run, tmp_path, monkeypatch):
    import os
    import re

    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    runs = {name: copy_run(ddp_run, tmp_path / "traces" / name)
            for name in ("writable", "readonly")}
    listed = {name: sorted(p.name for p in run.rglob("*")) for name, run in runs.items()}
    runs["readonly"].chmod(0o555)  # marked read-only: the same place as a writable folder
    try:
        for name, run in runs.items():
            assert cli("summary", str(run)).returncode == 0
            assert cli("report", str(run), "--out", str(tmp_path / f"rep-{name}")).returncode == 0
            assert sorted(p.name for p in run.rglob("*")) == listed[name]  # nothing written there
        user = xdg / "paritytrace"
        assert len(list((user / "tables").glob("*.tables.msgpack"))) == 4  # two ranks, two runs
        assert not list(user.glob("*.tables.msgpack")) and not list(user.rglob("*.parquet"))
        reports = sorted((user / "reports").glob("*.json"))
        written = [p for p in reports if p.name.endswith(".written.json")]
        assert len(reports) - len(written) == 2  # one per report, both runs
        assert len(written) == 2  # what each report wrote, by SHA-256
        section = CACHES_DOC.read_text()
        for said in ("$XDG_CACHE_HOME/paritytrace/tables/", "$XDG_CACHE_HOME/paritytrace/reports/",
                     ".written.json", "defaults to `~/.cache`",
                     "no cache is ever written beside your traces",
                     "`PARITYTRACE_CACHE_MAX_BYTES`", "2 GiB", "least recently used",
                     "by mtime", "never read and never removed"):
            assert said in section, said
        for run in runs.values():  # what an older version left beside the traces
            (run / "rank0.trace.json.gz.tables.msgpack").write_bytes(b"old")
        script = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
        script = script.replace("find DIR", f"find {tmp_path / 'traces'}")
        proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              env={**os.environ, "XDG_CACHE_HOME": str(xdg)})
        assert proc.returncode == 0, proc.stderr
        left = [p for p in (tmp_path / "traces").rglob("*")
                if p.name.endswith(".tables.msgpack")]
        assert left == [] and not user.exists()
    finally:
        runs["readonly"].chmod(0o755)


def test_report_on_a_writable_folder_writes_nothing_beside_the_traces(ddp_run, tmp_path,
                                                                      monkeypatch):
    from analyzer.api import load_tables
    from analyzer.compare import runs

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    run = copy_run(ddp_run, tmp_path / "run")
    run.chmod(0o777)
    before = sorted(p.name for p in run.rglob("*"))
    args = ("report", str(run), "--out", str(tmp_path / "rep"))
    cold = cli(*args)
    assert cold.returncode == 0, cold.stderr
    assert sorted(p.name for p in run.rglob("*")) == before
    assert not list(run.rglob("*.tables.msgpack"))
    assert all(r.cache_hit for r in load_tables(run).ranks)  # the ranks' tables, cached

    def no_analysis(*a, **k):
        raise AssertionError("the second report must come from the cache")

    monkeypatch.setattr(runs, "analyse", no_analysis)
    warm = cli(*args)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout == cold.stdout
    assert sorted(p.name for p in run.rglob("*")) == before


def _trace(path: Path, mm_us: int) -> Path:
    import json

    events = [{"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}
              for name, ts, dur in (("ProfilerStep#0", 0, 100), ("aten::mm", 10, mm_us))]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_tables_cache_is_trimmed_least_recently_used_first(tmp_path, monkeypatch):
    import os

    from analyzer.ingest.cachekey import KEY_NAME
    from analyzer.ingest.ranktables import rank_tables
    from analyzer.ingest.tablecache import tables_cache_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    traces = [_trace(tmp_path / f"t{i}.json", 20 + i) for i in range(3)]
    cached = [tables_cache_path(t) for t in traces]
    for t in traces:
        assert not rank_tables(t).cache_hit  # the default cap: all three kept
    sizes = [c.stat().st_size for c in cached]
    folder = cached[0].parent
    cached[2].unlink()
    others = {"notes.txt": b"x" * 10**6, ".tmp-abc.msgpack": b"being written",
              "f" * 32 + ".tables.msgpack.bak": b"not ours"}  # none of the tool's own names
    for name, data in others.items():
        (folder / name).write_bytes(data)
    os.utime(cached[0], ns=(10**18, 10**18))  # t0 used first,
    os.utime(cached[1], ns=(10**18 + 10**9, 10**18 + 10**9))  # t1 next,
    assert rank_tables(traces[0]).cache_hit  # then t0 again: the hit counts as its last use
    monkeypatch.setenv("PARITYTRACE_CACHE_MAX_BYTES", str(sizes[0] + sizes[2]))
    assert not rank_tables(traces[2]).cache_hit  # written: the folder is trimmed
    assert [c.exists() for c in cached] == [True, False, True]  # t1, least recently used, went
    assert sum(c.stat().st_size for c in cached if c.exists()) <= sizes[0] + sizes[2]
    assert (tmp_path / "xdg" / "paritytrace" / KEY_NAME).exists()
    assert {n: (folder / n).read_bytes() for n in others} == others
    assert rank_tables(traces[0]).cache_hit and rank_tables(traces[2]).cache_hit


def test_report_cache_is_trimmed_least_recently_used_first(tmp_path, monkeypatch):
    import os

    from reports import cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    roots = [tmp_path / name for name in ("a", "b", "c")]
    entries = [cache._path(r, tmp_path / "out") for r in roots]
    cache.store(roots[0], tmp_path / "out", "k" * 32, "{}")
    cache.store(roots[1], tmp_path / "out", "k" * 32, "{}")
    lock = entries[0].parent / "0123.written.lock"
    lock.write_bytes(b"")
    os.utime(entries[1], ns=(10**18, 10**18))  # b used first,
    os.utime(entries[0], ns=(10**18 + 10**9, 10**18 + 10**9))  # a next,
    assert cache.load_entry(roots[1], tmp_path / "out", "k" * 32) == ("{}", [])  # b again: a hit
    monkeypatch.setenv("PARITYTRACE_CACHE_MAX_BYTES", str(2 * entries[0].stat().st_size))
    cache.store(roots[2], tmp_path / "out", "k" * 32, "{}")
    assert [e.exists() for e in entries] == [False, True, True] and lock.exists()


@pytest.mark.parametrize("plant", ["devzero-link", "fifo", "too-big"])
def test_a_cache_file_that_is_not_a_small_regular_file_is_recomputed_unread(tmp_path, monkeypatch,
                                                                           plant):
    """A symlink to /dev/zero read whole filled the machine's memory; a FIFO hung the command;
    a file past the cap is not read either. Each is a miss: the tables are made from the
    trace, and the thing planted is left as it was (the next write replaces a regular file)."""
    import os

    from analyzer.ingest.ranktables import rank_tables
    from analyzer.ingest.tablecache import tables_cache_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    trace = _trace(tmp_path / "t.json", 20)
    want = rank_tables(trace).breakdown
    cpath = tables_cache_path(trace)
    cpath.unlink()
    if plant == "devzero-link":
        cpath.symlink_to("/dev/zero")
    elif plant == "fifo":
        os.mkfifo(cpath)
    else:
        monkeypatch.setenv("PARITYTRACE_CACHE_MAX_BYTES", "10")
        cpath.write_bytes(b"x" * 11)
    got = rank_tables(trace)
    assert not got.cache_hit
    assert got.breakdown.equals(want)


def test_a_capped_report_cache_keeps_the_record_of_written_files(ddp_run, tmp_path, monkeypatch):
    """The record of which report files the analyzer wrote is never trimmed: with the smallest
    cap, a report.md the user edited is still refused, not replaced."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PARITYTRACE_CACHE_MAX_BYTES", "1")
    run = copy_run(ddp_run, tmp_path / "traces" / "ddp")
    first = cli("report", str(run.parent), "--out", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr
    with open(tmp_path / "a" / "report.md", "a") as fh:
        fh.write("MY NOTE\n")
    assert cli("report", str(run.parent), "--out", str(tmp_path / "b")).returncode == 0
    again = cli("report", str(run.parent), "--out", str(tmp_path / "a"))
    assert again.returncode == 2 and "report.md" in again.stderr, again.stderr
    assert (tmp_path / "a" / "report.md").read_text().endswith("MY NOTE\n")


@pytest.mark.parametrize("value", ["0", "-1", "1e9", "2G", "lots", "\u00b2", " 12 x"])
def test_a_bad_cache_cap_is_logged_and_the_default_used(tmp_path, monkeypatch, caplog, value):
    import logging

    from analyzer.contract import settings
    from analyzer.ingest.ranktables import rank_tables
    from analyzer.ingest.tablecache import tables_cache_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(settings.CACHE_MAX_BYTES.name, value)
    monkeypatch.setattr(settings, "_SAID", set())  # what this process said before
    with caplog.at_level(logging.INFO, logger="analyzer.contract.settings"):
        assert settings.cache_max_bytes() == 2 * 2**30
        traces = [_trace(tmp_path / f"t{i}.json", 20 + i) for i in range(2)]
        for t in traces:
            rank_tables(t)  # no error, and nothing trimmed
    assert all(tables_cache_path(t).exists() for t in traces)
    # said once, not once per cache write
    assert caplog.text.count(f"ignoring PARITYTRACE_CACHE_MAX_BYTES={value.strip()!r}") == 1


def test_a_cache_cap_is_read_in_bytes(monkeypatch):
    from analyzer.contract import settings

    for value, want in (("1024", 1024), (" 4096 ", 4096), ("", 2 * 2**30)):
        monkeypatch.setenv(settings.CACHE_MAX_BYTES.name, value)
        assert settings.cache_max_bytes() == want


def test_cached_report_follows_a_re_recorded_run_behind_a_symlink(ddp_run, fsdp_run,
                                                                   fsdp_fault_run, tmp_path):
    """The documented "folder of symlinks to run dirs": a linked run re-recorded (here with
    --fault wrong-grad-scale) must not be served the cached report of the run it replaced."""
    import json
    import shutil

    store, links = tmp_path / "store", tmp_path / "links"
    copy_run(ddp_run, store / "ddp")
    copy_run(fsdp_run, store / "fsdp")
    links.mkdir()
    for name in ("ddp", "fsdp"):
        (links / name).symlink_to(store / name, target_is_directory=True)
    args = ("report", str(links), "--out", str(tmp_path / "rep"), "--format", "json")

    def fsdp_parity() -> str:
        data = json.loads((tmp_path / "rep" / "report.json").read_text())
        return next(r for r in data["runs"] if r["name"] == "fsdp")["parity"]["status"]

    assert cli(*args).returncode == 0
    assert fsdp_parity() == "pass"
    shutil.rmtree(store / "fsdp")  # re-recorded in place, as `tracer record` does
    copy_run(fsdp_fault_run, store / "fsdp")
    assert cli(*args).returncode == 0
    assert fsdp_parity() == "fail"
    assert cli("gate", str(links)).returncode == 3


def test_report_cache_key_survives_a_symlink_cycle(tmp_path):
    from analyzer.ingest.cachekey import input_signature

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.json").write_text("{}")
    (tmp_path / "a" / "loop").symlink_to(tmp_path / "a", target_is_directory=True)
    rows = input_signature(tmp_path, tmp_path / "out")
    assert [r[0] for r in rows] == ["a/f.json", "a/loop"]


def test_report_cache_key_walk_follows_links_as_the_ingest_does(tmp_path):
    """The key walk follows a symlink only where the ingest does (analyzer/ingest/fswalk.py
    ``link_skipped``): a link out of the input, or to a folder above it, is one row (the link),
    never a walk of what it names; a link inside the input is followed."""
    from analyzer.ingest.cachekey import input_signature

    root, outside = tmp_path / "traces", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    for i in range(5):
        (outside / f"x{i}.json").write_text("{}")
    _trace(root / "t.json", 20)
    (root / "sub").mkdir()
    (root / "away").symlink_to(outside, target_is_directory=True)
    (root / "file-away.json").symlink_to(outside / "x0.json")
    (root / "up").symlink_to(tmp_path, target_is_directory=True)
    (root / "sub" / "back").symlink_to(root / "t.json")
    rows = input_signature(root, tmp_path / "out")
    assert [r[0] for r in rows] == ["away", "file-away.json", "sub/back", "sub/back", "t.json",
                                    "up"]
    assert [r[1] for r in rows if r[0] in ("away", "file-away.json", "up")] == ["link"] * 3
    assert rows[3][1] == (root / "t.json").stat().st_size  # inside: followed


def test_report_of_a_folder_with_a_link_to_the_filesystem_root_walks_only_the_folder(
        tmp_path, monkeypatch):
    """A link to / or /sys in a folder of traces made the key walk list the whole machine
    (`report` past 180 s, `summary` 9.5 s). Counted in folders listed, not seconds."""
    import os

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "traces"
    root.mkdir()
    _trace(root / "t.json", 20)
    (root / "all").symlink_to("/", target_is_directory=True)
    (root / "sys").symlink_to("/sys" if os.path.isdir("/sys") else "/usr",
                              target_is_directory=True)
    listed, real_scandir = [], os.scandir

    def counted(path="."):
        listed.append(path)
        if len(listed) > 100:
            raise AssertionError(f"walked out of the input: {listed[-3:]}")
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", counted)
    done = cli("report", str(root), "--out", str(tmp_path / "rep"), "--format", "json")
    assert done.returncode == 0, done.stderr
    assert len(listed) < 20, listed


def _planted(path: Path, magic: bytes, size_bytes: int, *, dense: bool = False) -> None:
    """A file of ``size_bytes`` at ``path`` that starts as a cache file does: sparse, or with
    ``dense`` every byte written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(magic)
        if dense:
            for _ in range((size_bytes - len(magic)) >> 20):
                fh.write(bytes(1 << 20))
        fh.truncate(size_bytes)


@pytest.mark.parametrize("which", ["tables", "report"])
def test_a_planted_cache_file_costs_a_chunk_not_its_size(tmp_path, monkeypatch, which):
    """A file in the cache folder that starts as a cache file does, within the cap (2 GiB by
    default), was read whole before its HMAC was checked (a sparse file of 2 GiB: 22.7 s and
    2.2 GB peak): now its HMAC is computed in chunks and nothing is held until it verifies.
    Python's allocations are traced (32 MiB planted, every byte on disk; a few MiB allowed)."""
    import tracemalloc

    from analyzer.ingest import tablecache
    from reports import cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    size = 32 << 20
    if which == "tables":
        path = tablecache.tables_cache_path(tmp_path / "t.json")
        _planted(path, tablecache.CACHE_MAGIC, size, dense=True)
        load = lambda: tablecache.load_cache_blob(path)  # noqa: E731
    else:
        path = cache._path(tmp_path, tmp_path / "out")
        _planted(path, getattr(cache, "_MAGIC", b"{"), size, dense=True)
        load = lambda: cache.load_entry(tmp_path, tmp_path / "out", "k" * 32)  # noqa: E731
    tracemalloc.start()
    try:
        assert load() is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak


def test_a_report_entry_not_signed_by_this_user_is_a_miss(tmp_path, monkeypatch):
    """A report entry planted (or copied) into the cache folder with the right key -- the key
    is made of what anyone can know: paths, stat signatures, the code -- is not served."""
    import msgspec

    from reports import cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    out = tmp_path / "out"
    cache.store(tmp_path, out, "k" * 32, '{"schema_version": 1}')
    assert cache.load_entry(tmp_path, out, "k" * 32) == ('{"schema_version": 1}', [])
    path = cache._path(tmp_path, out)
    path.write_bytes(msgspec.json.encode({"key": "k" * 32, "notes": [], "report": "{}"}))
    assert cache.load_entry(tmp_path, out, "k" * 32) is None
    signed = path.read_bytes()
    path.write_bytes(signed)
    cache.store(tmp_path, out, "k" * 32, '{"schema_version": 2}')
    forged = bytearray(path.read_bytes())
    forged[-3] ^= 1  # an edited entry
    path.write_bytes(bytes(forged))
    assert cache.load_entry(tmp_path, out, "k" * 32) is None


@pytest.mark.integration
def test_planted_caches_in_the_cache_folder_cost_neither_time_nor_memory(tmp_path,
                                                                         monkeypatch):
    """The R2 variants in the cache folder itself, through `summary` and `report` under a
    1 GiB address-space limit: a FIFO, a link to /dev/zero and a sparse file just under the
    2 GiB cap that starts as a cache file does, for each rank's tables and for the report."""
    import json
    import os
    import resource
    import sys

    from analyzer.ingest import tablecache
    from reports import cache

    def capped():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    xdg, root, out = tmp_path / "xdg", tmp_path / "traces", tmp_path / "rep"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    root.mkdir()
    plants = [tablecache.tables_cache_path(_trace(root / f"rank{r}.json", 20 + r))
              for r in range(3)]
    plants[0].parent.mkdir(parents=True)
    os.mkfifo(plants[0])
    plants[1].symlink_to("/dev/zero")
    _planted(plants[2], tablecache.CACHE_MAGIC, (2 << 30) - 4096)
    _planted(cache._path(root, out), getattr(cache, "_MAGIC", b'{"key":'), (2 << 30) - 4096)
    for args in (["summary", str(root), "--format", "json"],
                 ["report", str(root), "--out", str(out), "--format", "json"]):
        proc = subprocess.run([sys.executable, "-m", "analyzer", *args], capture_output=True,
                              text=True, preexec_fn=capped, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "report.json").read_text())["schema_version"]


def test_a_sparse_or_oversized_tables_cache_is_not_read(tmp_path, monkeypatch):
    """A sparse file (the analyzer writes none) and a tables cache far larger than its trace
    could give (``TABLES_PER_TRACE_BYTE``) are refused before a byte is hashed: counted in
    bytes read, so that a 2 GiB plant costs no 30 s of hashing either."""
    from analyzer.ingest import cachekey, tablecache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    trace = _trace(tmp_path / "t.json", 20)
    sig = tablecache.stat_sig(trace)
    cpath = tablecache.tables_cache_path(trace)
    read: list[int] = []

    class Counted:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def read(self, n=-1):
            data = self.fh.read(n)
            read.append(len(data))
            return data

        def seek(self, *a):
            return self.fh.seek(*a)

    real_open_regular = cachekey._open_regular
    monkeypatch.setattr(cachekey, "_open_regular", lambda *a: Counted(real_open_regular(*a)))
    _planted(cpath, tablecache.CACHE_MAGIC, 64 << 20)  # sparse
    assert tablecache.read_tables(cpath, sig, None) is None
    cpath.unlink()
    _planted(cpath, tablecache.CACHE_MAGIC, 4 << 20, dense=True)  # dense, 4 MiB for 300 bytes
    assert tablecache.read_tables(cpath, sig, None) is None
    assert sum(read) == 0, read


def test_planted_caches_beside_traces_are_never_opened(tmp_path, monkeypatch):
    """The R2 variants beside the traces (where older versions cached): a FIFO, a link to
    /dev/zero and a 20 GB sparse file named ``<trace>.tables.msgpack``. Since the caches moved
    to the user cache (issue 40) nothing opens them: every command reads the traces alone."""
    import os

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "traces"
    root.mkdir()
    for r in range(3):
        _trace(root / f"rank{r}.json", 20 + r)
    os.mkfifo(root / "rank0.json.tables.msgpack")
    (root / "rank1.json.tables.msgpack").symlink_to("/dev/zero")
    with open(root / "rank2.json.tables.msgpack", "wb") as fh:
        fh.truncate(20 << 30)
    for args in (["summary", str(root)], ["merge", str(root), "-o", str(tmp_path / "m.json")],
                 ["report", str(root), "--out", str(tmp_path / "rep"), "--format", "json"]):
        done = cli(*args)
        assert done.returncode == 0, (args, done.stderr)
