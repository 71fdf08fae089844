"""The cache folders' trim (analyzer/ingest/cachekey.py ``trim``): a scan of the folder on a
process's first write, then only when what it knows passes the cap or it has written a share of
the files it counted, so a job of N ranks does not read N^2 / 2 directory entries."""

from __future__ import annotations

import os

from analyzer.ingest import cachekey

NAMES = r"[0-9]+\.c"


def _write(folder, i: int, size: int = 10) -> int:
    (folder / f"{i}.c").write_bytes(b"x" * size)
    os.utime(folder / f"{i}.c", ns=(10**18 + i * 10**9, 10**18 + i * 10**9))  # i-th used
    return size


def _scans(monkeypatch) -> list[str]:
    seen: list[str] = []
    scandir = os.scandir
    monkeypatch.setattr(cachekey.os, "scandir", lambda p: (seen.append(str(p)), scandir(p))[1])
    return seen


def test_a_folder_is_scanned_once_per_share_of_its_files_written(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITYTRACE_CACHE_MAX_BYTES", str(10**9))
    for i in range(160):  # what an earlier job left
        _write(tmp_path, i)
    scans = _scans(monkeypatch)
    for i in range(160, 160 + 40):
        cachekey.trim(tmp_path, NAMES, _write(tmp_path, i))
    # the first write scans (161 files), the next scan after 161 / 16 = 10.06: the 11th write
    # since (172 files), then after 172 / 16: the 11th again (183), then the 12th (195)
    assert len(scans) == 4
    assert len(list(tmp_path.iterdir())) == 200  # under the cap: nothing deleted


def test_a_write_past_the_cap_scans_and_trims_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITYTRACE_CACHE_MAX_BYTES", str(10**9))
    for i in range(100):
        _write(tmp_path, i)
    cachekey.trim(tmp_path, NAMES, _write(tmp_path, 100))  # scanned: 101 files, 1,010 bytes
    scans = _scans(monkeypatch)
    monkeypatch.setenv("PARITYTRACE_CACHE_MAX_BYTES", "1015")
    cachekey.trim(tmp_path, NAMES, _write(tmp_path, 101))  # 1,020 known: past the cap
    assert len(scans) == 1
    assert sorted(int(p.stem) for p in tmp_path.iterdir()) == list(range(1, 102))  # 0 went


def test_few_files_are_scanned_on_every_write(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITYTRACE_CACHE_MAX_BYTES", str(10**9))
    scans = _scans(monkeypatch)
    for i in range(5):
        cachekey.trim(tmp_path, NAMES, _write(tmp_path, i))
    assert len(scans) == 5  # under 16 files: a share of them is under one write
