"""What a manifest may make the analyzer read (issue 33 item 10, and the manifest's part of
item 14): only the tracer's own file names, each once, no more than a record writes, no sparse
file hashed; a manifest too deep or with a NUL in a path is one line, exit 2.

Oracles: a real record (``ddp_run``, copied) whose manifest the test edits one fault at a time;
the tracer's own name rule (tracer/rundir.py ``TRACER_FILE``) for the names."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from analyzer.contract import schemas
from tests.inputs import bad_input, cli, copy_run


def _edit(run, fn):
    m = json.loads((run / schemas.MANIFEST_NAME).read_text())
    fn(m)
    (run / schemas.MANIFEST_NAME).write_text(json.dumps(m))


def _entry(run, name):
    raw = (run / name).read_bytes()
    return {"path": name, "size_bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


def _opened(monkeypatch) -> list[str]:
    """The paths this process opens from now on through ``open`` / ``io.open`` (how
    ``schemas.sha256_file`` and ``Path.read_bytes`` read): "never read" checked, not timed."""
    import builtins
    import io

    seen: list[str] = []
    real = builtins.open

    def spy(file, *args, **kwargs):
        seen.append(str(file))
        return real(file, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(io, "open", spy)
    return seen


def test_a_listed_file_the_tracer_never_writes_is_refused_unhashed(tmp_path, ddp_run,
                                                                   monkeypatch):
    run = copy_run(ddp_run, tmp_path / "ddp")
    assert cli("gate", str(run)).returncode == 0
    with open(run / "huge.bin", "wb") as fh:  # 2 GiB of holes
        fh.truncate(2 << 30)
    _edit(run, lambda m: m["files"].append({"path": "huge.bin", "size_bytes": 2 << 30,
                                            "sha256": "0" * 64}))
    opened = _opened(monkeypatch)
    bad_input(cli("gate", str(run)), "manifest.json", "'huge.bin'",
              "is not a file tracer record writes")
    assert not [p for p in opened if p.endswith("huge.bin")]  # refused by name, never read


def test_a_sparse_tracer_file_is_refused_unhashed(tmp_path, ddp_run, monkeypatch):
    run = copy_run(ddp_run, tmp_path / "ddp")
    (run / schemas.NUMERICS_NAME).unlink()
    with open(run / schemas.NUMERICS_NAME, "wb") as fh:
        fh.truncate(2 << 30)
    _edit(run, lambda m: [f.update(size_bytes=2 << 30) for f in m["files"]
                          if f["path"] == schemas.NUMERICS_NAME])
    opened = _opened(monkeypatch)
    bad_input(cli("gate", str(run)), "numerics.parquet", "sparse file", "re-record")
    assert not [p for p in opened if p.endswith(schemas.NUMERICS_NAME)]


def test_duplicate_and_too_many_entries_are_refused(tmp_path, ddp_run):
    run = copy_run(ddp_run, tmp_path / "ddp")
    entry = _entry(run, "rank0.trace.json.gz")
    _edit(run, lambda m: m["files"].append(dict(entry)))
    bad_input(cli("gate", str(run)), "manifest.json", "'rank0.trace.json.gz' is listed twice")
    _edit(run, lambda m: m["files"].extend([dict(entry)] * 100_000))
    bad_input(cli("gate", str(run)), "manifest.json", "more than the 11 tracer record writes")


def test_a_rank_beyond_the_world_size_in_a_listed_name_is_refused(tmp_path, ddp_run):
    run = copy_run(ddp_run, tmp_path / "ddp")
    os.link(run / "rank1.trace.json.gz", run / "rank7.trace.json.gz")
    _edit(run, lambda m: m["files"].append(_entry(run, "rank7.trace.json.gz")))
    bad_input(cli("gate", str(run)), "manifest.json", "names rank 7, beyond world_size 2")


def test_a_nul_in_a_manifest_path_is_one_line(tmp_path, ddp_run):
    run = copy_run(ddp_run, tmp_path / "ddp")
    _edit(run, lambda m: m["files"].append({"path": "rank0.trace.json.gz\x00x",
                                            "size_bytes": 1, "sha256": "0" * 64}))
    for cmd in ("gate", "summary"):
        bad_input(cli(cmd, str(run)), "manifest.json", "\\x00", "re-record")


def test_a_deeply_nested_manifest_is_one_line(tmp_path, ddp_run):
    run = copy_run(ddp_run, tmp_path / "ddp")
    m = (run / schemas.MANIFEST_NAME).read_text()
    (run / schemas.MANIFEST_NAME).write_text(m[:-1] + ', "deep": ' + "[" * 100_000
                                             + "]" * 100_000 + "}")
    for cmd in ("gate", "summary"):
        bad_input(cli(cmd, str(run)), "manifest.json", "nested too deeply")


def test_the_contract_names_the_tracers_files():
    rundir = pytest.importorskip("tracer.rundir")
    ours = ("rank0.trace.json.gz", "rank12.trace.json.gz", "numerics.parquet",
            "steps.parquet", "kept.parquet", "golden.parquet", "baseline.safetensors",
            "memory_categories.parquet", "memory/memory.parquet", "memory/rank3.snapshot.pickle")
    others = ("rank0.trace.json.gz.tables.msgpack", "report/report.md", "manifest.json",
              "x.parquet", "memory/x.pickle")
    for rel in ours + others:
        assert (schemas.RUN_FILE.fullmatch(rel) is not None) == (rel in ours), rel
        assert rundir.is_tracer_file(rel) == (rel in ours), rel


def test_a_manifest_larger_than_any_record_writes_is_refused_unread(tmp_path, ddp_run, monkeypatch):
    run = copy_run(ddp_run, tmp_path / "ddp")
    size = (run / schemas.MANIFEST_NAME).stat().st_size
    monkeypatch.setattr(schemas, "MAX_MANIFEST_BYTES", size - 1)
    bad_input(cli("gate", str(run)), "manifest.json", f"{size:,} bytes", "re-record")
