"""The clean-up after a stop signal never blocks on ``Popen``'s waitpid lock.

A stop signal is raised as ``KeyboardInterrupt`` wherever the launcher's main thread is; inside
``Popen.poll()`` between acquiring and releasing ``Popen._waitpid_lock`` it leaves that lock
held for good (a tester's launcher hung in ``kill_all -> Popen.wait()`` that way). Here the
interrupted poll is simulated by holding the lock; the clean-up runs in a thread whose end is
awaited with a generous deadline only to turn a hang into a failure (no timing is asserted).

Oracles: the kernel (``os.waitpid`` on the pid raises ``ChildProcessError`` once it is
collected) and the exit status the kernel reports for a SIGKILLed process.
"""

from __future__ import annotations

import pytest

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from analyzer.contract import children
from tracer import launch
from tracer.config import RecordConfig

pytestmark = pytest.mark.integration

HANG_S = 60.0  # far above any clean-up; only turns a hang into a failure


def _sleeper() -> subprocess.Popen:
    """A child in its own session (as a worker is), running until killed."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)


def _in_thread(fn) -> tuple[threading.Thread, list]:
    outcome: list = []

    def body():
        try:
            outcome.append(("returned", fn()))
        except BaseException as exc:  # noqa: BLE001 - the test inspects what it raised
            outcome.append(("raised", exc))

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(HANG_S)
    return t, outcome


def _collected(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def _group(tmp_path: Path, procs: list[subprocess.Popen]) -> launch.WorkerGroup:
    group = launch.WorkerGroup(RecordConfig(strategy="ddp", device="cpu"), tmp_path)
    group.workers = [launch._Worker(rank=r, proc=p) for r, p in enumerate(procs)]
    return group


def test_kill_all_kills_and_collects_a_worker_whose_waitpid_lock_an_interrupt_left_held(tmp_path):
    held, free = _sleeper(), _sleeper()
    group = _group(tmp_path, [held, free])
    assert held._waitpid_lock.acquire(blocking=False)  # what an interrupted poll() leaves
    try:
        t, outcome = _in_thread(group.kill_all)
        assert not t.is_alive(), "kill_all blocked on the held Popen lock"
        assert outcome == [("returned", None)]
    finally:
        held._waitpid_lock.release()
        for p in (held, free):
            if p.returncode is None:
                os.killpg(p.pid, signal.SIGKILL)
    for p in (held, free):
        assert p.returncode == -signal.SIGKILL
        assert _collected(p.pid)
    assert all(w.killed_by_us for w in group.workers)


def test_kill_all_keeps_the_exit_code_of_a_worker_that_had_already_exited(tmp_path):
    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], start_new_session=True)
    os.waitid(os.P_PID, done.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet collected
    group = _group(tmp_path, [done])
    group.kill_all()
    assert done.returncode == 3
    assert not group.workers[0].killed_by_us
    assert _collected(done.pid)


def test_reap_counts_a_status_an_interrupted_poll_collected_as_sigkill():
    p = _sleeper()
    os.killpg(p.pid, signal.SIGKILL)
    os.waitpid(p.pid, 0)  # collected, but the interrupted poll never stored the status
    assert children.reap(p, 1.0) == -signal.SIGKILL


def test_reap_returns_none_at_the_deadline_for_a_running_process():
    p = _sleeper()
    try:
        assert children.reap(p, 0) is None
        assert p.returncode is None
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        assert children.reap(p, HANG_S) == -signal.SIGKILL

