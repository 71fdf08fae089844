"""Child processes that never outlive the command: the one supervisor of the tracer's workers
and spec check, and of the analyzer's HTA cross-check (the parse workers share
``die_with_parent``).

A child is started in its own session (``spawn``: a process group the command alone decides the
end of, holding the child's own children: DataLoader or HTA pool workers), dies with the command
(Linux ``PR_SET_PDEATHSIG`` = SIGKILL: no orphan after a kill -9), logs to a file, never to the
terminal. It is waited for up to a limit (``exited``), then its whole group is SIGKILLed and the
child reaped (``kill``): on a timeout, on any exception of the caller (the ``KeyboardInterrupt``
of a stop signal included) and once it ended (what it started must not run on). ``run`` is the
three in one.

Waits never go through ``Popen``'s waitpid lock: a stop signal raised as ``KeyboardInterrupt``
inside ``Popen.poll()`` between its acquiring and releasing that lock leaves it held for good,
and a later ``Popen.wait()`` blocks forever. ``exited`` leaves the child unreaped (a zombie),
so its pid, the id of its group, cannot be reused before ``kill`` signals the group.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REAP_DEADLINE_S = 10.0
"""Seconds ``kill`` waits for SIGKILLed children to be collectable (a process in an
uninterruptible kernel wait, e.g. a GPU driver call, dies only when that returns)."""
POLL_S = 0.05
_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
"""Looked up here, not in a forked child: ``dlsym`` after a fork may wait for a lock another
thread of the parent held."""


def die_with_parent(parent: int) -> None:
    """In a child of ``parent`` (a pid): end with SIGKILL when the parent ends (Linux; no-op
    elsewhere), and at once when it already has (it ended before this took effect)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)


def spawn(argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None,
          pass_fds: Sequence[int] = ()) -> subprocess.Popen:
    """Start ``argv`` in its own session, dying with this process, stdin from /dev/null, stdout
    and stderr into the file ``log`` (created or truncated). Raises ``OSError``."""
    parent = os.getpid()
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, pass_fds=pass_fds,
                                start_new_session=True, preexec_fn=lambda: die_with_parent(parent))


def exited(proc: subprocess.Popen, limit_s: float) -> bool:
    """Whether ``proc`` ended (or ends within ``limit_s`` seconds; 0: look once), left unreaped
    (module docstring)."""
    end = time.monotonic() + limit_s
    delay = 0.001
    while proc.returncode is None:
        try:
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                break
        except ChildProcessError:  # reaped already (an interrupted poll())
            break
        if (left := end - time.monotonic()) <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(2 * delay, POLL_S)
    return True


def reap(proc: subprocess.Popen, deadline_s: float = REAP_DEADLINE_S) -> int | None:
    """Collect ``proc`` once it has exited, waiting up to ``deadline_s`` seconds (0: look once),
    through ``os.waitpid`` (module docstring). Sets and returns ``proc.returncode`` (negative:
    killed by that signal); None when it still runs at the deadline. A status an interrupted
    ``poll()`` collected is lost: the process counts as SIGKILLed (``-9``)."""
    if exited(proc, deadline_s) and proc.returncode is None:
        try:
            proc.returncode = os.waitstatus_to_exitcode(os.waitpid(proc.pid, 0)[1])
        except ChildProcessError:
            proc.returncode = -signal.SIGKILL
    return proc.returncode


def kill(*procs: subprocess.Popen, deadline_s: float = REAP_DEADLINE_S) -> list[int | None]:
    """SIGKILL the process group of each of ``procs`` (``spawn``'s children, ended or not: what
    they started may outlive them) and, where psutil is installed, every process they started
    that left it; then reap them, all within ``deadline_s``. Returns each one's exit status
    (its own where it had ended: negative, killed by that signal), None for one still not
    collectable (it dies with this process)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    strays = []
    for proc in procs:
        if psutil is not None and proc.returncode is None:
            with contextlib.suppress(psutil.Error):
                strays += psutil.Process(proc.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is empty
            os.killpg(proc.pid, signal.SIGKILL)
    for p in strays:
        with contextlib.suppress(psutil.Error):
            p.kill()
    end = time.monotonic() + deadline_s
    codes = [reap(proc, max(0.0, end - time.monotonic())) for proc in procs]
    if strays:
        psutil.wait_procs(strays, timeout=max(0.0, end - time.monotonic()))
    return codes


def log_lines(log: Path, tail_bytes: int = 4096) -> list[str]:
    """The non-empty lines (stripped) of the last ``tail_bytes`` of the file ``log`` (a child's
    output: what it said last tells why it ended); [] when it cannot be read."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [ln.strip() for ln in text.splitlines() if ln.strip()]


def run(argv: Sequence[str], log: Path, limit_s: float, *,
        env: Mapping[str, str] | None = None) -> int | None:
    """``spawn`` ``argv``, wait up to ``limit_s`` seconds, then ``kill`` its group (also on any
    exception here, ``KeyboardInterrupt`` included, which propagates). Returns its exit status
    (negative: killed by that signal), None when it ran past ``limit_s``."""
    proc = spawn(argv, log, env=env)
    try:
        done = exited(proc, limit_s)
    finally:
        code, = kill(proc)
    return code if done else None
