"""bench/bench_scale.py (issue 46 Deliver 5): one run measures the tiled job as plain JSON and as
.json.gz, each with its own floor, report runs, ratios and a stage-table column; kept traces are
reused per format."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import bench_scale
from analyzer.ingest.decode import cpu_count
from bench.bench_scale import formats_arg, prepare, stamp_of
from tests.corpus import corpus_root, needs_corpus

REPO = Path(__file__).resolve().parents[1]


def test_formats_option_takes_json_gz_or_both_in_a_fixed_order():
    assert formats_arg("gz,json") == ["json", "gz"]
    assert formats_arg("gz") == ["gz"]
    with pytest.raises(argparse.ArgumentTypeError, match="give json, gz or json,gz"):
        formats_arg("json,zst")


def _json_folder(root: Path, **built) -> list[bytes]:
    """A kept ``root/json`` as the bench leaves it: ``built["ranks"]`` traces and the stamp of
    ``built``."""
    (root / "json").mkdir(parents=True)
    data = [json.dumps({"traceEvents": [], "distributedInfo": {"rank": r}}).encode()
            for r in range(built["ranks"])]
    for r, d in enumerate(data):
        (root / "json" / f"rank{r}.json").write_bytes(d)
    (root / ".built.json").write_text(json.dumps({"json": stamp_of("json", **built)}))
    return data


def test_a_kept_json_set_is_reused_and_gzipped_into_gz_without_tiling(tmp_path, monkeypatch, capsys):
    built = dict(k=3, ranks=2, sub_us=False, gzip_level=6)
    data = _json_folder(tmp_path, **built)
    monkeypatch.setattr(bench_scale, "build", lambda *a, **k: pytest.fail("tiled again"))
    dirs = prepare(tmp_path, ["json", "gz"], **built)
    assert dirs == {"json": tmp_path / "json", "gz": tmp_path / "gz"}
    assert [gzip.decompress(p.read_bytes()) for p in sorted((tmp_path / "gz").glob("rank*"))] == data
    assert json.loads((tmp_path / ".built.json").read_text()) == {
        "built_by": "bench/bench_scale.py", "json": {"k": 3, "ranks": 2, "sub_us": False},
        "gz": {"k": 3, "ranks": 2, "sub_us": False, "gzip_level": 6}}
    # nothing but traces where the traces are: HTA reads every *.json of its folder as one
    assert sorted(p.name for p in (tmp_path / "gz").iterdir()) == ["rank0.json.gz", "rank1.json.gz"]
    assert sorted(p.name for p in (tmp_path / "json").iterdir()) == ["rank0.json", "rank1.json"]
    assert f"reusing 2 traces in {tmp_path / 'json'}" in capsys.readouterr().out
    prepare(tmp_path, ["json", "gz"], **built)  # both stamps match now: nothing rebuilt
    assert capsys.readouterr().out == (f"reusing 2 traces in {tmp_path / 'json'}, "
                                       f"{tmp_path / 'gz'}\n")


def test_a_gz_set_of_another_level_is_gzipped_again(tmp_path, monkeypatch):
    built = dict(k=3, ranks=2, sub_us=False, gzip_level=6)
    _json_folder(tmp_path, **built)
    monkeypatch.setattr(bench_scale, "build", lambda *a, **k: pytest.fail("tiled again"))
    prepare(tmp_path, ["gz"], **built)
    prepare(tmp_path, ["gz"], **{**built, "gzip_level": 1})
    assert json.loads((tmp_path / ".built.json").read_text())["gz"]["gzip_level"] == 1
    assert (tmp_path / "gz" / "rank1.json.gz").read_bytes()[8] == 4  # XFL 4: fastest (level 1)


@pytest.mark.integration
@needs_corpus  # the bench tiles the corpus' DLRM traces
def test_one_run_prints_both_formats_rows_and_stage_columns(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "PARITYTRACE_CORPUS": str(corpus_root())}
    got = subprocess.run([sys.executable, str(REPO / "bench" / "bench_scale.py"), "--k", "1",
                          "--ranks", "2", "--repeat", "1", "--no-hta", "--no-check",
                          "--keep", str(tmp_path / "traces")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    lines = got.stdout.splitlines()
    procs = min(cpu_count(), 2)
    assert ("| 2 ranks x DLRM x1, median of 1 | measurement | wall s | CPU s | peak RSS, tree | "
            "largest process | CPU / floor | wall / HTA | CPU / HTA | RSS / HTA, tree |") in lines
    rows = [" | ".join(line.split(" | ")[:2]) for line in lines if line.startswith("| plain JSON")
            or line.startswith("| .json.gz")]
    assert rows == [f"| {fmt} | {what}" for fmt, floor in (("plain JSON", "read + decode"),
                                                           (".json.gz", "read + gunzip + decode"))
                    for what in (f"floor: {floor}, {procs} processes", "analyzer report, cold (no cache)",
                                 "analyzer report, warm (report cached)",
                                 "analyzer report, per-rank tables cached")]
    assert "| stage | plain JSON: CPU s (share) | .json.gz: CPU s (share) |" in lines
    assert any(line.startswith("gunzip: the report's ") for line in lines)
    assert any(line.startswith(".json.gz: cold / floor: wall ") for line in lines)
