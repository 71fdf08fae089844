"""`analyzer merge` on a full disk: one line naming the output, exit 2, nothing half-written."""

from __future__ import annotations

import errno
import gzip
import os

import pytest

from analyzer.timeline import merge
from tests.inputs import bad_input, cli
from tests.merge.builders import gloo_rank, write


def _job(folder):
    for r in (0, 1):
        write(folder / f"rank{r}.trace.json", gloo_rank(r, 2, offset_us=0.0, ends_us=[600.0, 1600.0]))
    return folder


class _FullDisk(gzip.GzipFile):
    """The merged trace's writer on a disk that fills after the first few KB."""

    taken = 0

    def write(self, data):
        _FullDisk.taken += len(data)
        if _FullDisk.taken > 1024:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(data)


def _left(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("name", ["m.trace.json.gz", "m.trace.json"])
def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, name):
    job = _job(tmp_path / "job")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    if name.endswith(".gz"):
        monkeypatch.setattr(_FullDisk, "taken", 0)
        monkeypatch.setattr(merge.gzip, "GzipFile", _FullDisk)
    else:  # the plain writer: every file the merge opens fills the disk
        real_open = open

        class Full:
            def __init__(self, f):
                self.f = f

            def __getattr__(self, a):
                return getattr(self.f, a)

            def __enter__(self):
                return self

            def __exit__(self, *a):
                self.f.close()

            def write(self, data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def full_open(p, mode="r", *a, **k):
            f = real_open(p, mode, *a, **k)
            return Full(f) if "w" in mode else f

        monkeypatch.setattr(merge, "open", full_open, raising=False)
    line = bad_input(cli("merge", str(job), "-o", str(out_dir / name)), str(out_dir / name),
                     "No space left on device", "free space there", "-o")
    assert _left(out_dir) == [], line


def test_a_failed_sidecar_takes_the_trace_with_it(tmp_path, monkeypatch):
    job = _job(tmp_path / "job")
    out = tmp_path / "out" / "m.trace.json"

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(merge, "write_atomic", full)
    bad_input(cli("merge", str(job), "-o", str(out)), str(out), "No space left on device")
    assert _left(out.parent) == []


def test_an_unwritable_output_names_it(tmp_path, monkeypatch):
    job = _job(tmp_path / "job")
    out = tmp_path / "m.trace.json"

    def denied(path, data):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(merge, "write_atomic", denied)
    bad_input(cli("merge", str(job), "-o", str(out)), str(out), "cannot be written", "-o")
    assert not out.exists()
