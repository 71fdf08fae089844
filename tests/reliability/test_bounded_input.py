"""Bounded input (issue 17 item 6): every command reads a trace with a size cap, refuses
hostile shapes as bad input (exit 2, one line), and ``merge`` holds one rank at a time.

Oracles: the cap is set by the test (``PARITYTRACE_MAX_TRACE_BYTES``) against sizes the test
makes (a gzip bomb of a few KB expanding to 1 MiB of zeros); the nesting depth, the bad name
and the bad versions are written by the test; the merge mechanism is observed directly (how
many ranks' raw events are alive when the next rank is read)."""

from __future__ import annotations

import gc
import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from analyzer.contract.errors import BadInput
from analyzer.ingest import decode
from analyzer.timeline import merge
from tests.inputs import bad_input, cli
from tests.merge.builders import gloo_rank, write

COMMANDS = ("summary", "report", "gate", "merge")


def _job(folder: Path, world: int = 2) -> Path:
    """``world`` ranks of a small synthetic gloo job (tests/merge/builders.py)."""
    for r in range(world):
        write(folder / f"rank{r}.json", gloo_rank(r, world, offset_us=0.0,
                                                   ends_us=[600.0, 1600.0]))
    return folder


def test_gzip_bomb_is_refused_over_the_cap_in_every_command(tmp_path, monkeypatch):
    folder = _job(tmp_path / "job")
    bomb = gzip.compress(b" " * (1 << 20), compresslevel=9)  # 1 MiB of blanks (valid JSON space)
    assert len(bomb) < 8 << 10  # a few KB on disk
    (folder / "rank1.json").unlink()
    (folder / "rank1.json.gz").write_bytes(bomb)
    monkeypatch.setenv(decode.MAX_TRACE_ENV, str(256 << 10))  # 256 KiB < 1 MiB
    for cmd in COMMANDS:
        line = bad_input(cli(cmd, str(folder), *(["--out", str(tmp_path / "o")]
                                                 if cmd == "report" else [])),
                         "rank1.json.gz", "262,144 bytes", decode.MAX_TRACE_ENV)
        assert "gunzipped" in line, line


def test_decompress_stops_at_the_cap_not_after_the_whole_stream():
    # 64 MiB of zeros: a cap of 1 MiB must stop after about one chunk, never building 64 MiB
    bomb = gzip.compress(bytes(64 << 20), compresslevel=9)
    with pytest.raises(BadInput) as exc:
        decode.decompress(bomb, "bomb.json.gz", max_bytes=1 << 20)
    assert exc.value.reason == "too_large"
    # under the cap: the same bytes as gzip.decompress, concatenated members included
    two = gzip.compress(b'{"a": ') + gzip.compress(b"1}")
    assert decode.decompress(two, "x.gz", max_bytes=100) == b'{"a": 1}'
    with pytest.raises(BadInput) as exc:
        decode.decompress(gzip.compress(b"x" * 1000)[:-9], "cut.gz", max_bytes=10 << 20)
    assert exc.value.reason == "truncated"


def test_plain_json_over_the_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    folder = _job(tmp_path / "job", world=1)
    size = (folder / "rank0.json").stat().st_size
    monkeypatch.setenv(decode.MAX_TRACE_ENV, str(size - 1))
    bad_input(cli("summary", str(folder)), "rank0.json", f"{size - 1:,} bytes")
    monkeypatch.setenv(decode.MAX_TRACE_ENV, str(size))  # at the cap: read
    assert cli("summary", str(folder)).returncode == 0
    monkeypatch.setenv(decode.MAX_TRACE_ENV, "lots")
    bad_input(cli("summary", str(folder)), decode.MAX_TRACE_ENV, "positive number of bytes")


def test_deeply_nested_json_is_bad_input(tmp_path):
    folder = _job(tmp_path / "job")
    trace = json.loads((folder / "rank0.json").read_text())
    text = json.dumps(trace).replace('"args": {', '"args": {"deep": ' + "[" * 100_000
                                     + "]" * 100_000 + ", ", 1)
    (folder / "rank0.json").write_text(text)
    for cmd in COMMANDS:
        bad_input(cli(cmd, str(folder), *(["--out", str(tmp_path / "o")]
                                          if cmd == "report" else [])),
                  "rank0.json", "nested too deeply")


def test_file_name_that_is_not_utf8_is_bad_input(tmp_path):
    folder = _job(tmp_path / "job", world=1)
    bad = os.fsencode(folder) + b"/rank0\xff.json"
    os.rename(folder / "rank0.json", bad)
    for cmd in COMMANDS:
        bad_input(cli(cmd, str(folder), *(["--out", str(tmp_path / "o")]
                                          if cmd == "report" else [])),
                  "rank0\\xff.json", "not valid UTF-8", "rename")
    bad_input(cli("summary", os.fsdecode(bad)), "rank0\\xff.json", "not valid UTF-8")


@pytest.mark.parametrize("version", ["garbage", -1, 1.5, True, {"v": 1}])
def test_garbage_schema_version_in_a_trace_is_bad_input(tmp_path, version):
    folder = _job(tmp_path / "job", world=1)
    trace = json.loads((folder / "rank0.json").read_text())
    trace["schemaVersion"] = version
    write(folder / "rank0.json", trace)
    for cmd in ("summary", "merge"):
        bad_input(cli(cmd, str(folder)), "rank0.json", "schemaVersion", "not a version number")


def test_trace_schema_version_of_kineto_is_accepted(tmp_path):
    folder = _job(tmp_path / "job", world=1)
    trace = json.loads((folder / "rank0.json").read_text())
    trace["schemaVersion"] = 1  # what Kineto writes (every trace of the corpus)
    write(folder / "rank0.json", trace)
    assert cli("summary", str(folder)).returncode == 0


def test_merge_holds_one_rank_at_a_time(tmp_path, monkeypatch):
    folder = _job(tmp_path / "job", world=4)
    alive_at_read: list[int] = []
    real = merge._read_rank

    def spy(rt):  # ranks still holding raw events when the next is read
        alive_at_read.append(sum(1 for o in gc.get_objects() if type(o) is merge.RankInput))
        return real(rt)

    monkeypatch.setattr(merge, "_read_rank", spy)
    res = merge.merge_traces(folder, tmp_path / "m.json.gz")
    assert alive_at_read == [0, 0, 0, 0]
    merged = json.loads(gzip.decompress(res.out_path.read_bytes()))
    assert {e["pid"] for e in merged["traceEvents"]} == {1, 2, 3, 4}
    assert merged["traceEvents"][0]["ph"] == "M" and merge.MERGE_KEY in merged


def test_merge_warns_early_when_a_rank_is_large(tmp_path, monkeypatch, caplog):
    folder = _job(tmp_path / "job")
    size = max((folder / f"rank{r}.json").stat().st_size for r in (0, 1))
    monkeypatch.setattr(merge, "LARGE_RANK_BYTES", size)
    order: list[str] = []
    real = merge.pipeline.load_run
    monkeypatch.setattr(merge.pipeline, "load_run",
                        lambda run, **kw: (order.append("load"), real(run, **kw))[1])
    with caplog.at_level("WARNING", logger="analyzer.timeline.merge"):
        caplog.handler.emit = (lambda emit: lambda rec: (order.append("warn"), emit(rec)))(
            caplog.handler.emit)
        res = merge.merge_traces(folder, tmp_path / "m.json")
    assert order[:2] == ["warn", "load"]  # said before any rank is read
    assert any(f"{size / 2**20:,.1f} MiB of JSON" in w and "10x the largest rank" in w
               for w in res.warnings), res.warnings
    monkeypatch.setattr(merge, "LARGE_RANK_BYTES", size + 1)
    assert not any("10x" in w for w in merge.merge_traces(folder, tmp_path / "n.json").warnings)


def test_gzip_trailer_gives_the_json_size_for_the_warning(tmp_path, monkeypatch):
    folder = _job(tmp_path / "job", world=1)
    raw = (folder / "rank0.json").read_bytes()
    (folder / "rank0.json.gz").write_bytes(gzip.compress(raw))
    (folder / "rank0.json").unlink()
    monkeypatch.setattr(merge, "LARGE_RANK_BYTES", len(raw))  # JSON size, above the .gz's
    assert merge.size_warning([folder / "rank0.json.gz"]) is not None
    monkeypatch.setattr(merge, "LARGE_RANK_BYTES", len(raw) + 1)
    assert merge.size_warning([folder / "rank0.json.gz"]) is None
    # a cut file's last 4 bytes are no trailer: a claimed size beyond DEFLATE's 1032:1 is ignored
    cut = gzip.compress(raw)[:-8] + (2**31).to_bytes(4, "little")
    (folder / "rank0.json.gz").write_bytes(cut)
    monkeypatch.setattr(merge, "LARGE_RANK_BYTES", len(cut) + 1)
    assert merge.size_warning([folder / "rank0.json.gz"]) is None
    shutil.rmtree(folder)


def test_the_limit_a_refusal_suggests_admits_the_trace():
    """A trace of known size over the cap is told a value that admits it (a cap of 1 byte and a
    60 kB trace once suggested 4); one cut off at the cap is told four times the cap."""
    from analyzer.ingest import decode

    line = decode.too_large("rank0.json", "the file (59,763 bytes)", 1, 59_763).one_line()
    suggested = int(line.rsplit("=", 1)[1])
    assert suggested >= 59_763 and suggested % 2**20 == 0
    line = decode.too_large("rank0.json", "the gunzipped trace", 2**30).one_line()
    assert line.endswith(f"={4 * 2**30}")


@pytest.mark.integration
@pytest.mark.parametrize("command", ["summary", "report"])
def test_a_world_size_no_job_holds_is_refused_before_it_is_allocated(tmp_path, command):
    """A trace claiming 10^9 ranks once built range(world_size) of its missing ranks and ended
    in MemoryError; it is one line naming the file, exit 2, under a 1 GiB address space."""
    import resource
    import subprocess
    import sys

    folder = tmp_path / "job"
    folder.mkdir()
    trace = json.loads(json.dumps(gloo_rank(0, 2, offset_us=0.0, ends_us=[600.0, 1600.0])))
    trace.setdefault("distributedInfo", {})["world_size"] = 10**9
    (folder / "rank0.json").write_text(json.dumps(trace))
    argv = [sys.executable, "-m", "analyzer", command, str(folder)]
    if command == "report":
        argv += ["--out", str(tmp_path / "out")]
    proc = subprocess.run(argv, capture_output=True, text=True, preexec_fn=lambda: resource.setrlimit(
        resource.RLIMIT_AS, (1 << 30, 1 << 30)))
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = proc.stderr.strip().splitlines()
    assert "rank0.json: distributedInfo.world_size 1,000,000,000 is over the 131,072 ranks" in line


@pytest.mark.parametrize("where", ["world_size", "pg_count", "pg_size", "rank"])
def test_an_integer_beyond_64_bits_in_distributed_info_is_one_line(tmp_path, where):
    """10**30 anywhere in distributedInfo once ended in "internal error: OverflowError" (the
    cache's msgpack, numpy's C long); no process group, rank or size is that large."""
    folder = tmp_path / "job"
    folder.mkdir()
    trace = json.loads(json.dumps(gloo_rank(0, 2, offset_us=0.0, ends_us=[600.0, 1600.0])))
    info = trace.setdefault("distributedInfo", {"rank": 0, "world_size": 2, "backend": "gloo"})
    if where == "pg_size":
        info["pg_config"] = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1],
                              "pg_size": 10**30}]
    else:
        info[where] = 10**30
    (folder / "rank0.json").write_text(json.dumps(trace))
    bad_input(cli("summary", str(folder)), "rank0.json", "integer of 100 bits, beyond 64")
