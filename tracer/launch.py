"""``tracer record`` without torchrun: spawn one worker process per rank and watch them.

Each worker is ``python -m tracer record <same options>`` with the torchrun environment (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT=<port>), so
the worker code path is the one torchrun runs; the rendezvous listens on 127.0.0.1 only (the
launcher binds its socket and hands it to rank 0: ``STORE_FD_ENV``). Workers are children of
analyzer/contract/children.py: each in its own session (the launcher alone decides when they
die), dying with the launcher, logging to ``rank<r>.log`` in a control folder.

Failure handling: when a worker exits non-zero the others get ``FAIL_GRACE_S`` to write their
own errors, then every remaining worker's process group is SIGKILLed. The failing rank is
(1) a rank killed by a signal the launcher did not send, else (2) when the earliest error is a
collective timeout, the ranks still alive without an error (they hung), else (3) the rank with
the earliest error. A hang watchdog (for hangs outside collectives, which the collective
timeout cannot see) kills everything when no worker made progress for ``2 * timeout +
HANG_SLACK_S`` seconds (lenient: a step or a torch import under load is slow).

Flight Recorder: before the remaining workers are killed after a failure or by the watchdog,
each one whose dump listener runs (tracer/flightrec.py; ``rank<r>.flightrec.listening`` in the
control folder) is asked, on its own pipe, for a JSON dump of its Flight Recorder into the run
dir, and given up to ``DUMP_DEADLINE_S`` to answer (``request_dumps``; a worker that dies
meanwhile is not waited for). An interrupted record asks for none.

Stopping: a stop signal on the launcher (analyzer/contract/stopping.py) raises
``KeyboardInterrupt`` once, and the clean-up (SIGKILL every worker's process group, remove the
staging folder) runs to its end in well under a second. A worker's process group holds its own children (DataLoader worker
processes), so they end with it, also when the worker itself was already dead. The clean-up
never waits through ``Popen`` (``children.kill``: an interrupted ``poll()`` may hold its lock).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from analyzer.contract import children
from analyzer.contract.schemas import flightrec_name
from analyzer.contract.stopping import stop_signals_held
from tracer import flightrec
from tracer.config import RecordConfig

log = logging.getLogger(__name__)

FAIL_GRACE_S = 2.0
HANG_SLACK_S = 30.0
POLL_S = 0.05
LAUNCH_ENV = "PARITYTRACE_LAUNCH"
CTRL_ENV = "PARITYTRACE_CTRL_DIR"
GO_ENV = "PARITYTRACE_GO_FD"
"""Spawned workers of a gated start: the inherited fd on which the launcher signals that the run
dir is prepared (``WorkerGroup.release``; read by tracer.worker.wait_for_go)."""
STORE_FD_ENV = "PARITYTRACE_STORE_FD"
"""Rank 0 of a spawned record: the inherited fd of the socket the launcher bound on 127.0.0.1
for the rendezvous (``loopback_listener``), where its TCPStore serves (tracer.worker
``rendezvous_store``): a one-machine record listens on loopback only, never on every interface."""
LOG_TAIL_BYTES = 64 * 1024
"""How much of the end of a rank's log ``_log_line`` reads."""
DUMP_DEADLINE_S = 30.0
"""Seconds ``request_dumps`` waits for the live workers' Flight Recorder dumps (each takes
milliseconds; the margin is for a loaded machine). Only a worker that neither answers nor dies
costs the whole wait."""


TMPDIR_FULL_BYTES = 1 << 20
"""Free space under which a failed record's temporary folder counts as full (``tmpdir_full``)."""


def tmpdir_full(folder: Path) -> str | None:
    """The one line for a rank that failed with its temporary folder ``folder`` (TMPDIR) full,
    None when it has room: a full TMPDIR cuts the rank's log (and its traceback)
    short, so the log cannot say why."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    if st.f_bavail * st.f_frsize >= TMPDIR_FULL_BYTES:
        return None
    return (f"the temporary folder {folder} (TMPDIR) is full: free space there, "
            "or point TMPDIR at a folder with room")


class RecordFailed(Exception):
    """A record did not complete; the message is the one line to show (rank and first error)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_listener() -> socket.socket:
    """A TCP socket listening on 127.0.0.1 on a port of its own, for the rendezvous of a spawned
    record: held from here until rank 0's TCPStore serves on it, so no other process can take
    the port meanwhile (``free_port``'s race) and no other interface ever listens."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        s.listen(socket.SOMAXCONN)
    except BaseException:
        s.close()
        raise
    return s


@dataclass(kw_only=True, slots=True)
class _Worker:
    rank: int
    proc: subprocess.Popen
    go_fd: int | None = None
    """Write end of this worker's start-signal pipe (gated start only) until ``release``."""
    fr_fd: int | None = None
    """Write end of this worker's Flight Recorder dump-request pipe, until ``kill_all``."""
    exited_at: float | None = None
    killed_by_us: bool = False
    finished: bool = False
    """It exited 0 after its heartbeat said ``done`` (the end of ``worker.worker_main``)."""


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class WorkerGroup:
    """The spawned workers of one record; ``wait()`` returns on success, raises ``RecordFailed``."""

    def __init__(self, cfg: RecordConfig, ctrl_dir: Path):
        self.cfg = cfg
        self.ctrl_dir = ctrl_dir
        self.workers: list[_Worker] = []
        self.dumped: list[int] = []
        """Ranks whose Flight Recorder dump is in the run dir after a failure (``request_dumps``)."""

    def start(self, *, gated: bool = False) -> None:
        """Start ``cfg.world_size`` workers. ``gated``: each waits, before it reads anything
        from the run dir, until ``release()`` (tracer.worker.wait_for_go), so the launcher can
        prepare the run dir while the workers import torch."""
        with loopback_listener() as store_socket:  # rank 0 inherits it; ours closes at the end
            self._start(store_socket, gated)

    def _start(self, store_socket: socket.socket, gated: bool) -> None:
        port = store_socket.getsockname()[1]
        world = self.cfg.world_size
        for rank in range(world):
            env = dict(os.environ)
            env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                        "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port), LAUNCH_ENV: "spawn", CTRL_ENV: str(self.ctrl_dir),
                        "OMP_NUM_THREADS": "1"})
            env.pop("TORCHELASTIC_RUN_ID", None)
            env.pop(GO_ENV, None)
            env.pop(STORE_FD_ENV, None)
            store_fd = ()
            if rank == 0:
                store_fd = (store_socket.fileno(),)
                env[STORE_FD_ENV] = str(store_fd[0])
            read_fd = write_fd = None
            if gated:
                read_fd, write_fd = os.pipe()  # both non-inheritable; pass_fds hands on the read end
                env[GO_ENV] = str(read_fd)
            fr_read, fr_write = os.pipe()
            env[flightrec.REQUEST_ENV] = str(fr_read)
            passed = ((fr_read,) if read_fd is None else (read_fd, fr_read)) + store_fd
            # A stop signal raised inside Popen, after the fork, would leave a worker that
            # kill_all does not know: hold the signals until it is in self.workers.
            with stop_signals_held():
                try:
                    proc = children.spawn([sys.executable, "-m", "tracer", "record", *self.cfg.to_argv()],
                                          self.ctrl_dir / f"rank{rank}.log", env=env, pass_fds=passed)
                except BaseException:
                    for fd in (read_fd, write_fd, fr_read, fr_write):
                        if fd is not None:
                            os.close(fd)
                    raise
                for fd in (read_fd, fr_read):
                    if fd is not None:
                        os.close(fd)
                self.workers.append(_Worker(rank=rank, proc=proc, go_fd=write_fd, fr_fd=fr_write))

    def release(self) -> None:
        """Let gated workers go on (one byte on each start pipe); no-op for others."""
        for w in self.workers:
            if w.go_fd is not None:
                with contextlib.suppress(BrokenPipeError):  # a dead worker: wait() reports it
                    os.write(w.go_fd, b"g")
                self._close_go(w)

    def _close_go(self, w: _Worker) -> None:
        if w.go_fd is not None:
            os.close(w.go_fd)
            w.go_fd = None

    def _close_fr(self, w: _Worker) -> None:
        """Close the dump-request pipe (its listener thread ends; a record of many repeats
        keeps no descriptor per finished worker)."""
        if w.fr_fd is not None:
            os.close(w.fr_fd)
            w.fr_fd = None

    def kill_all(self) -> None:
        """SIGKILL every worker's process group, also a dead worker's (its DataLoader workers
        may outlive it), and reap the workers (``children.kill``): within about
        ``children.REAP_DEADLINE_S`` seconds; a worker still not collectable by then is named in
        a warning and left to the kernel (it dies with the launcher). A worker that was still
        running is ``killed_by_us``."""
        for w in self.workers:
            if not children.exited(w.proc, 0):
                w.killed_by_us = True
        codes = children.kill(*(w.proc for w in self.workers))
        for w, code in zip(self.workers, codes):
            self._close_go(w)
            self._close_fr(w)
            if code is None:
                log.warning("rank %d (pid %d) still runs %gs after SIGKILL", w.rank, w.proc.pid,
                            children.REAP_DEADLINE_S)

    def request_dumps(self) -> list[int]:
        """Ask every live worker whose dump listener runs for a Flight Recorder dump into the
        run dir and wait, up to ``DUMP_DEADLINE_S``, until each has answered or died. Returns
        the ranks that dumped (their own failure's dump included: ``rank<r>.flightrec.json``
        in the run dir)."""
        asked = []
        for w in self.workers:
            listening = (self.ctrl_dir / f"rank{w.rank}{flightrec.LISTENING_SUFFIX}").exists()
            if w.fr_fd is None or not listening or w.proc.poll() is not None:
                continue
            (self.ctrl_dir / f"rank{w.rank}{flightrec.DONE_SUFFIX}").unlink(missing_ok=True)
            try:
                os.write(w.fr_fd, b"d")
            except OSError:  # it died meanwhile
                continue
            asked.append(w)
        end = time.monotonic() + DUMP_DEADLINE_S
        while asked and time.monotonic() < end:
            asked = [w for w in asked if w.proc.poll() is None
                     and not (self.ctrl_dir / f"rank{w.rank}{flightrec.DONE_SUFFIX}").exists()]
            time.sleep(POLL_S)
        for w in asked:
            log.warning("rank %d did not answer the Flight Recorder dump request in %gs", w.rank, DUMP_DEADLINE_S)
        return [w.rank for w in self.workers if (self.cfg.run_dir / flightrec_name(w.rank)).is_file()]

    def _errors(self) -> dict[int, dict]:
        out = {}
        for w in self.workers:
            f = self.ctrl_dir / f"rank{w.rank}.error.json"
            if f.exists():
                out[w.rank] = json.loads(f.read_text())
        return out

    def _last_progress(self) -> float:
        """Newest heartbeat mtime of any live worker (start time when none yet)."""
        times = [self.started]
        for w in self.workers:
            hb = self.ctrl_dir / f"rank{w.rank}.hb"
            if w.proc.poll() is None and hb.exists():
                times.append(hb.stat().st_mtime)
        return max(times)

    @property
    def watchdog_s(self) -> float:
        """Seconds without any heartbeat after which the workers count as hung."""
        return 2 * self.cfg.timeout_s + HANG_SLACK_S

    def _heartbeat_step(self, rank: int) -> str:
        hb = self.ctrl_dir / f"rank{rank}.hb"
        return hb.read_text().strip() if hb.exists() else "not started"

    def wait(self) -> None:
        """Block until all workers succeed; else kill the rest and raise ``RecordFailed``."""
        self.started = time.time()
        first_failure: float | None = None
        while True:
            now = time.monotonic()
            for w in self.workers:
                if w.exited_at is None and w.proc.poll() is not None:
                    w.exited_at = now
                    w.finished = w.proc.returncode == 0 and self._heartbeat_step(w.rank).endswith(" done")
            codes = [w.proc.returncode for w in self.workers]
            if all(w.finished for w in self.workers):
                for w in self.workers:
                    self._close_fr(w)
                return
            # exit 0 before the end (model code called os._exit(0)) is a failure like any other
            if first_failure is None and any(c is not None and not w.finished
                                             for c, w in zip(codes, self.workers)):
                first_failure = now
            if first_failure is not None and (all(c is not None for c in codes)
                                              or now - first_failure > FAIL_GRACE_S):
                alive = [w.rank for w in self.workers if w.proc.poll() is None]
                self.dumped = self.request_dumps()
                self.kill_all()
                raise RecordFailed(self._diagnose(alive))
            if first_failure is None and time.time() - self._last_progress() > self.watchdog_s:
                stale = [w.rank for w in self.workers if w.proc.poll() is None]
                steps = {r: self._heartbeat_step(r) for r in stale}
                self.dumped = self.request_dumps()
                self.kill_all()
                where = "; ".join(f"rank {r} at '{steps[r]}'" for r in stale)
                raise RecordFailed(f"rank {stale[0]} hung: no progress for {self.watchdog_s:.0f}s ({where})")
            time.sleep(POLL_S)

    def _diagnose(self, alive_at_kill: list[int]) -> str:
        """The one line naming the failure's cause. A rank that ended abruptly comes first:
        killed by a signal, exited 0 before its work was done (model code's ``os._exit(0)``),
        exited non-zero without writing an error (its log's line says why); the errors its
        peers then wrote (a closed connection, a timed-out collective) follow from it. Else the
        earliest error, or a hang."""
        errors = self._errors()
        by_signal = [w for w in self.workers
                     if w.proc.returncode is not None and w.proc.returncode < 0 and not w.killed_by_us]
        if by_signal:
            w = min(by_signal, key=lambda w: w.exited_at or 0.0)
            return (f"rank {w.rank} was killed by {_signal_name(w.proc.returncode)} "
                    f"(last progress: {self._heartbeat_step(w.rank)})")
        quit_early = [w for w in self.workers if w.proc.returncode == 0 and not w.finished]
        if quit_early:
            w = min(quit_early, key=lambda w: w.exited_at or 0.0)
            return (f"rank {w.rank}: the model code exited with status 0 during the record, at "
                    f"'{self._heartbeat_step(w.rank)}' (os._exit(0) or the like: the rank ended "
                    "before its work was done)")
        silent = [w for w in self.workers if w.proc.returncode not in (None, 0)
                  and not w.killed_by_us and w.rank not in errors]
        if silent:
            w = min(silent, key=lambda w: w.exited_at or 0.0)
            said = self._log_line(w.rank)
            if said:
                return f"rank {w.rank} exited with code {w.proc.returncode} at '{self._heartbeat_step(w.rank)}': {said}"
            return f"rank {w.rank} exited with code {w.proc.returncode} and wrote no error (its log is empty)"
        if errors:
            first = min(errors.values(), key=lambda e: e["time"])
            hung = [r for r in alive_at_kill if r not in errors]
            if hung and any(w in first["error"].lower() for w in ("timed out", "timeout")):
                return (f"rank {hung[0]} hung at '{self._heartbeat_step(hung[0])}': rank {first['rank']} "
                        f"timed out waiting for it after {self.cfg.timeout_s:g}s ({first['error']})")
            return f"rank {first['rank']} failed at step {first['step']}: {first['error']}"
        w = self.workers[0]
        return f"rank {w.rank} exited with code {w.proc.returncode} and wrote no error"

    def _log_line(self, rank: int) -> str:
        """The line of ``rank``'s log that says why it ended: its last ``tracer: `` line
        (prefix dropped), else its last line (a traceback's exception), "" for an empty log."""
        lines = children.log_lines(self.ctrl_dir / f"rank{rank}.log", LOG_TAIL_BYTES)
        ours = [ln for ln in lines if ln.startswith("tracer: ")]
        return ours[-1][len("tracer: "):] if ours else (lines[-1] if lines else "")


def run_workers(cfg: RecordConfig, prepare: Callable[[], None] | None = None) -> None:
    """Spawn and watch the workers of one record. Raises ``RecordFailed`` (worker logs kept in a
    temp folder named in the message) or ``KeyboardInterrupt`` (after killing the workers).

    ``prepare``: run here right after the workers started (while they import torch) and before
    they may read the run dir (gated start); whatever it raises kills the workers; a
    ``ValueError`` (bad input, one line) or ``KeyboardInterrupt`` propagates as is, any other
    ``Exception`` (the baseline process failed) as ``RecordFailed`` with its first line.
    """
    ctrl_dir = Path(tempfile.mkdtemp(prefix=f"tracer-{cfg.run_name}-"))
    group = WorkerGroup(cfg, ctrl_dir)
    try:
        group.start(gated=prepare is not None)
        if prepare is not None:
            try:
                prepare()
            except ValueError:
                raise
            except Exception as exc:
                text = str(exc).strip().splitlines()
                raise RecordFailed(f"baseline: {type(exc).__name__}: {text[0] if text else ''}") from exc
            group.release()
        group.wait()
    except RecordFailed as exc:
        group.kill_all()  # a failed prepare left them waiting; after wait() a no-op
        dumps = (f"; Flight Recorder dumps of rank(s) {', '.join(map(str, group.dumped))} in the run dir"
                 if group.dumped else "")
        full = tmpdir_full(ctrl_dir.parent)
        if full:  # the logs are cut short: the line says why, and nothing is left in TMPDIR
            shutil.rmtree(ctrl_dir, ignore_errors=True)
            raise RecordFailed(f"{cfg.run_name}: {full}{dumps}") from None
        raise RecordFailed(f"{cfg.run_name}: {exc} (worker logs: {ctrl_dir}{dumps})") from None
    except BaseException:
        group.kill_all()
        shutil.rmtree(ctrl_dir, ignore_errors=True)  # interrupted: the logs tell nothing new
        raise
    shutil.rmtree(ctrl_dir, ignore_errors=True)
