"""A full TMPDIR during `tracer record`: one line saying so, and no temp file of ours left."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from tracer import launch


class _Statvfs:
    def __init__(self, free_bytes: int):
        self.f_bavail, self.f_frsize = free_bytes // 4096, 4096


def test_a_full_tmpdir_is_said_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(launch.os, "statvfs", lambda p: _Statvfs(8192))
    line = launch.tmpdir_full(tmp_path)
    assert line is not None and "\n" not in line
    assert f"{tmp_path} (TMPDIR) is full" in line and "point TMPDIR at a folder with room" in line
    monkeypatch.setattr(launch.os, "statvfs", lambda p: _Statvfs(1 << 30))
    assert launch.tmpdir_full(tmp_path) is None


def test_a_failed_rank_in_a_full_tmpdir_names_it_and_leaves_no_logs(tmp_path, monkeypatch):
    # a rank whose traceback the full TMPDIR cut to "[r": the line says TMPDIR, not the fragment
    monkeypatch.setattr(launch.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(launch.os, "statvfs", lambda p: _Statvfs(0))

    class Group:
        dumped: list[int] = []

        def __init__(self, cfg, ctrl_dir):
            (ctrl_dir / "rank0.log").write_text("[rank0]: Traceback (most recent call last):\n[r")

        def start(self, gated):
            pass

        def wait(self):
            raise launch.RecordFailed("rank 0 exited with code 1 at '2 step': [r")

        def kill_all(self):
            pass

    class Cfg:
        run_name = "ddp"

    monkeypatch.setattr(launch, "WorkerGroup", Group)
    with pytest.raises(launch.RecordFailed) as info:
        launch.run_workers(Cfg())
    assert str(info.value) == f"ddp: {launch.tmpdir_full(tmp_path)}"
    assert list(tmp_path.iterdir()) == []


def test_the_trace_export_leaves_nothing_in_tmpdir(tmp_path, monkeypatch):
    import tempfile

    from tracer.profiling import OneShotExport

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))

    class FullDiskProfile:  # Kineto on a full disk: its temp file cut short, no error raised
        def export_chrome_trace(self, path):
            Path(path + ".tmp").write_text('{"traceEvents": [')
            Path(path).write_text('{"traceEv')

    with pytest.raises(json.JSONDecodeError):
        OneShotExport(tmp_path / "rank0.trace.json.gz")(FullDiskProfile())
    assert list(tmpdir.iterdir()) == []


def test_write_error_survives_a_full_ctrl_dir(tmp_path, monkeypatch):
    from tracer import worker

    def full(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(worker, "write_atomic", full)
    env = worker.RankEnv(rank=0, world_size=2, local_rank=0, local_world_size=2, launch="spawn",
                         ctrl_dir=tmp_path)
    line = worker.write_error(env, 2, json.JSONDecodeError("Expecting value", "", 0), "TMPDIR full")
    assert line == "TMPDIR full"
