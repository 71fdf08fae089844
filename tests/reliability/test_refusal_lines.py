"""Hostile shapes that used to end in 'internal error' (exit 1) or a misnamed refusal (issue 33
item 14): each is now one line, exit 2, naming the file, or is analysed and said.

Oracles: inputs written by hand from real ones (a recorded run's baseline.safetensors, a
synthetic gloo job's traces); the JSON and safetensors formats' own rules (RFC 8259 8.2: a lone
UTF-16 surrogate escape names no character)."""

from __future__ import annotations

import json
from pathlib import Path

from analyzer.contract import schemas
from analyzer.ingest.pipeline import load_tables
from analyzer.ingest.tablecache import CACHE_MAGIC, tables_cache_path
from tests.inputs import bad_input, cli, copy_run
from tests.merge.builders import gloo_rank, write
from tests.remanifest import refresh_manifest


def _job(folder: Path) -> Path:
    for r in (0, 1):
        t = gloo_rank(r, 2, offset_us=0.0, ends_us=[600.0, 1600.0])
        t["distributedInfo"] = {"rank": r, "world_size": 2, "backend": "gloo"}
        write(folder / f"rank{r}.json", t)
    return folder


def _with_name_escape(path: Path, escape: str, extra: str = "") -> None:
    raw = path.read_text()
    i = raw.index('"name": "') + len('"name": "')
    path.write_text(raw[:i] + escape + raw[i:-1] + extra + "}")


def test_a_lone_surrogate_escape_in_a_trace_is_read_as_u_fffd_and_said(tmp_path):
    folder = _job(tmp_path / "job")
    _with_name_escape(folder / "rank1.json", "\\udce9")
    proc = cli("summary", str(folder))
    assert proc.returncode == 0, proc.stderr
    assert "truncated" not in proc.stderr
    tables = load_tables(folder)
    assert any("lone UTF-16 surrogates" in w for w in tables.ranks[1].warnings)


def test_a_lone_surrogate_beside_nan_is_not_an_internal_error(tmp_path):
    folder = _job(tmp_path / "job")
    _with_name_escape(folder / "rank1.json", "\\ud83d", ', "junk": NaN')
    proc = cli("summary", str(folder))
    assert proc.returncode == 0, proc.stderr
    # a real pair stays the character it names
    folder2 = _job(tmp_path / "job2")
    _with_name_escape(folder2 / "rank1.json", "\\ud83d\\ude00")
    assert cli("summary", str(folder2)).returncode == 0


def test_a_deep_safetensors_header_is_one_line(tmp_path, ddp_run):
    old = copy_run(ddp_run, tmp_path / "old")
    new = copy_run(ddp_run, tmp_path / "new")
    header = b"[" * 100_000 + b"]" * 100_000
    (new / schemas.KEPT_TENSORS_NAME).write_bytes(len(header).to_bytes(8, "little") + header)
    refresh_manifest(new)
    bad_input(cli("drift", str(old), str(new)), "baseline.safetensors", "nested too deeply",
              "re-record")
    header = json.dumps({"grad.x": {"dtype": "F32", "shape": "abc",
                                    "data_offsets": [0, 4]}}).encode()
    (new / schemas.KEPT_TENSORS_NAME).write_bytes(len(header).to_bytes(8, "little") + header
                                                  + bytes(4))
    refresh_manifest(new)
    proc = cli("drift", str(old), str(new))
    assert proc.returncode == 2 and "internal error" not in proc.stderr, proc.stderr


def test_a_malformed_cache_signed_or_not_is_recomputed(tmp_path, monkeypatch):
    from analyzer.ingest.cachekey import sign

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    folder = _job(tmp_path / "job")
    want = load_tables(folder).breakdown
    cpath = tables_cache_path(folder / "rank0.json")
    for body in (b"\x00" * 40, b"\x91" + b"\x91" * 50_000 + b"\xc0",  # deep msgpack
                 __import__("msgspec").msgpack.encode({"key": 1, "meta": {"warnings": 5}})):
        for data in (body, CACHE_MAGIC + sign(body) + body):
            cpath.write_bytes(data)
            proc = cli("summary", str(folder))
            assert proc.returncode == 0, proc.stderr
            assert cpath.read_bytes() != data  # recomputed and written again, in the user cache
            got = load_tables(folder)
            assert got.breakdown.equals(want) and got.ranks[0].cache_hit
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.json", "rank1.json"]
