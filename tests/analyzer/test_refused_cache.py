"""A refused input leaves no cache file (issue 42): ``analyzer report`` on a folder it refuses
(exit 2) writes nothing under ``$XDG_CACHE_HOME/paritytrace`` -- no cache key, no output-folder
lock, no tables of the ranks parsed before the one refused -- while an accepted input is cached
as before."""

from __future__ import annotations

import gzip
import shutil

import pytest

from tests.inputs import bad_input, cli
from tests.records import committed

pytestmark = pytest.mark.integration

TRUNCATED = '{"traceEvents": [{"ph": "X", "name": "a"'


def _files(cache) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())


@pytest.mark.parametrize("case", ["empty", "truncated", "good_rank_then_truncated"])
def test_a_refused_folder_leaves_no_cache_file(case, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    bad = tmp_path / "bad"
    bad.mkdir()
    if case != "empty":
        (bad / "rank1.trace.json").write_text(TRUNCATED)
    if case == "good_rank_then_truncated":  # rank 0 parses (and used to be cached) first
        src = committed("tiny") / "ddp" / "rank0.trace.json.gz"
        (bad / "rank0.trace.json").write_bytes(gzip.decompress(src.read_bytes()))
    proc = cli("report", str(bad), "--out", str(tmp_path / "out"))
    bad_input(proc, str(bad))
    assert _files(cache) == []


def test_an_accepted_folder_is_cached(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    run = tmp_path / "ddp"
    shutil.copytree(committed("tiny") / "ddp", run)
    proc = cli("report", str(run), "--out", str(tmp_path / "out"), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    files = _files(cache)
    assert "paritytrace/cache.key" in files
    assert sum(f.endswith(".tables.msgpack") for f in files) == 2
