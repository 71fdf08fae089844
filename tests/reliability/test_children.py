"""The child-process supervisor (analyzer/contract/children.py): a child past its limit is killed
with its whole process group and reaped, one that fails has its status reported, and a stop
signal on the supervising process or its death leaves no child running. Tiny Python children;
oracles: the kernel (a collected pid, a process gone) and the exit statuses it reports.
Every wait is bounded by ``HANG_S``, which only turns a hang into a failure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from analyzer.contract import children

pytestmark = pytest.mark.integration

psutil = pytest.importorskip("psutil")
HANG_S = 60.0
REPO = str(Path(__file__).resolve().parents[2])
FAMILY = ("import os, subprocess, sys, time\n"
          "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
          "print(os.getpid(), kid.pid, flush=True)\n"
          "time.sleep(600)\n")
"""A child that starts a grandchild (in its process group), prints both pids, then hangs."""


def _gone(*pids: int) -> bool:
    """True once none of ``pids`` runs (zombies of another parent count as gone)."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=HANG_S)
    return all(p.status() == psutil.STATUS_ZOMBIE for p in alive)


def _pids(log: Path) -> list[int]:
    deadline = time.monotonic() + HANG_S
    while not (text := log.read_text() if log.exists() else "").endswith("\n"):
        assert time.monotonic() < deadline, "the child never said its pids"
        time.sleep(0.02)
    return [int(w) for w in text.split()]


def test_a_child_past_its_limit_is_killed_at_it_and_reaped(tmp_path):
    before = {p.pid for p in psutil.Process().children()}
    began = time.monotonic()
    assert children.run([sys.executable, "-c", "import time; time.sleep(600)"],
                        tmp_path / "child.log", 1.0) is None
    assert 1.0 <= time.monotonic() - began < HANG_S
    assert {p.pid for p in psutil.Process().children()} <= before  # none left, not even a zombie


def test_kill_ends_the_childs_whole_group_and_collects_the_child(tmp_path):
    proc = children.spawn([sys.executable, "-c", FAMILY], tmp_path / "child.log")
    try:
        child, grandchild = _pids(tmp_path / "child.log")
        assert child == proc.pid and not children.exited(proc, 0.1)
    finally:
        assert children.kill(proc) == [-signal.SIGKILL]
    with pytest.raises(ChildProcessError):  # collected: no zombie left
        os.waitpid(proc.pid, os.WNOHANG)
    assert _gone(grandchild)


def test_a_child_that_fails_has_its_status_and_output_kept(tmp_path):
    log = tmp_path / "child.log"
    code = "import sys; print('said on stderr', file=sys.stderr); raise SystemExit(3)"
    assert children.run([sys.executable, "-c", code], log, HANG_S) == 3
    assert log.read_text().strip() == "said on stderr"
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    assert children.run([sys.executable, "-c", killed], log, HANG_S) == -signal.SIGSEGV


def test_a_child_that_ended_keeps_its_status_through_kill_and_its_group_goes(tmp_path):
    code = FAMILY.replace("time.sleep(600)\n", "raise SystemExit(5)\n")
    proc = children.spawn([sys.executable, "-c", code], tmp_path / "child.log")
    try:
        assert children.exited(proc, HANG_S)
        assert proc.returncode is None  # left unreaped: its pid names its group until kill
        _, grandchild = _pids(tmp_path / "child.log")
    finally:
        assert children.kill(proc) == [5]
    assert _gone(grandchild)


SUPERVISOR = """
import signal, sys
sys.path.insert(0, {repo!r})
from analyzer.contract import children

def stop(signum, frame):
    signal.signal(signum, lambda *_: None)
    raise KeyboardInterrupt

signal.signal(signal.SIGTERM, stop)
try:
    children.run([sys.executable, "-c", {family!r}], {log!r}, 600)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_stop_or_death_of_the_supervisor_leaves_no_child(tmp_path, sig):
    """SIGTERM on the supervising process (its handler raises ``KeyboardInterrupt``) kills the
    child's group and reaps it before it ends; SIGKILL, which runs no clean-up, ends the child
    too (it dies with its parent), and so its group's sleeper is left to be killed by nobody:
    only the child is checked there."""
    log = tmp_path / "child.log"
    code = textwrap.dedent(SUPERVISOR.format(repo=REPO, family=FAMILY, log=str(log)))
    sup = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child, grandchild = _pids(log)
        sup.send_signal(sig)
        out, _ = sup.communicate(timeout=HANG_S)
        assert _gone(child)
        if sig == signal.SIGTERM:
            assert sup.returncode == 0 and out == "interrupted\n"
            assert _gone(grandchild)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
        for pid in _pids(log):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
