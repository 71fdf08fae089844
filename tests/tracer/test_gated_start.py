"""Gated start: the first strategy's workers start before the baseline exists and wait for the
launcher's signal (tracer.launch.run_workers(prepare=...), tracer.worker.wait_for_go)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from analyzer.contract import schemas
from tests.tracer.helpers import TAG_ENV, alive_with_tag
from tracer.baseline import BASELINE_NAME, write_baseline
from tracer.config import RecordConfig
from tracer.launch import GO_ENV, RecordFailed, run_workers
from tracer.worker import Heartbeat, RankEnv, wait_for_go

TINY = dict(hidden=32, seq=8, batch=4)


def _heartbeat() -> Heartbeat:
    return Heartbeat(RankEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, launch="spawn",
                             ctrl_dir=None))


def test_wait_for_go_returns_on_the_signal(monkeypatch):
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"g")
    os.close(write_fd)
    monkeypatch.setenv(GO_ENV, str(read_fd))
    wait_for_go(_heartbeat())
    assert GO_ENV not in os.environ  # not handed on to anything this rank starts
    with pytest.raises(OSError):  # the rank closed its end
        os.fstat(read_fd)


def test_wait_for_go_refuses_a_closed_pipe(monkeypatch):
    read_fd, write_fd = os.pipe()
    os.close(write_fd)  # the launcher gave up without the signal
    monkeypatch.setenv(GO_ENV, str(read_fd))
    with pytest.raises(RuntimeError, match="without sending it"):
        wait_for_go(_heartbeat())


def test_wait_for_go_without_a_gate_returns(monkeypatch):
    monkeypatch.delenv(GO_ENV, raising=False)
    wait_for_go(_heartbeat())


def _worker_env(monkeypatch, tmp_path: Path) -> str:
    """Workers inherit a unique tag (to find leftovers) and keep temp folders in ``tmp_path``."""
    tag = os.urandom(8).hex()
    monkeypatch.setenv(TAG_ENV, tag)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    return tag


@pytest.mark.record
def test_workers_wait_until_the_run_dir_is_prepared(tmp_path, monkeypatch):
    """prepare() waits until the worker says it waits for the launcher, and only then writes the
    baseline: the record completes, so the worker read nothing before the signal."""
    tag = _worker_env(monkeypatch, tmp_path)
    cfg = RecordConfig(strategy="single", device="cpu", out=str(tmp_path / "out"), timeout_s=60, **TINY)
    cfg.run_dir.mkdir(parents=True)
    seen = []

    def prepare():
        deadline = time.monotonic() + 120
        hb = None
        while time.monotonic() < deadline:
            beats = list(tmp_path.glob("tracer-single-*/rank0.hb"))
            if beats and "wait_for_launcher" in beats[0].read_text():
                hb = beats[0].read_text()
                break
            time.sleep(0.05)
        seen.append(hb)
        assert not (cfg.run_dir / BASELINE_NAME).exists()
        write_baseline(cfg, "cpu", cfg.run_dir / BASELINE_NAME)

    run_workers(cfg, prepare=prepare)
    assert seen and seen[0] is not None and "wait_for_launcher" in seen[0]
    manifest = schemas.read_manifest(cfg.run_dir / schemas.MANIFEST_NAME)
    assert manifest.strategy == "single"
    assert alive_with_tag(tag) == []


@pytest.mark.record
def test_failed_prepare_kills_the_waiting_workers(tmp_path, monkeypatch):
    tag = _worker_env(monkeypatch, tmp_path)
    cfg = RecordConfig(strategy="ddp", device="cpu", out=str(tmp_path / "out"), **TINY)
    cfg.run_dir.mkdir(parents=True)

    def prepare():
        raise RuntimeError("baseline process failed: boom")

    # a failed baseline is a failed record (exit 1, one line), not a traceback
    with pytest.raises(RecordFailed, match="ddp: baseline: RuntimeError: baseline process failed: boom"):
        run_workers(cfg, prepare=prepare)
    assert alive_with_tag(tag) == []
    assert list(cfg.run_dir.iterdir()) == []
