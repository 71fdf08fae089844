"""Run one function over many inputs in ``jobs`` processes: ``jobs - 1`` workers and this one.

Used to parse ranks (analyzer/load.py, analyzer/tables.py). Every process, this one included,
claims the next input from one shared counter when it is free, so the inputs are dealt out one
at a time as processes finish (an executor that queues inputs ahead for its workers, while this
process works too, can leave this one idle while a worker still has a queued input: measured
5 of 8 equal inputs in the worker and 3 here, a fifth longer than 4 + 4). This process takes
part rather than waiting, so there is one Python interpreter fewer in memory.

``workers()`` starts the workers ahead of the work: a command opens it before its own heavy
imports, so the workers' start-up (importing ``preload``) runs on the other cores meanwhile
instead of after; ``run_all`` inside it uses those workers, round after round.

Results travel back pickled through a pipe between processes this module started (never from
a file). A worker that dies without answering (killed, out of memory) raises
``ParityTraceError`` naming the input it was on.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import multiprocessing as mp
import os
import queue
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from analyzer.errors import ParityTraceError

_POLL_S = 0.2
_POOL: list[_Workers] = []  # the workers of the innermost open ``workers()``, if any


def run_all(fn: Callable[[Any], Any], items: Sequence[Any], jobs: int | None = None
            ) -> list[Any]:
    """``[fn(x) for x in items]``, in ``jobs`` processes (default min(cpu count, len(items))).

    ``fn`` must be a module-level function whose exceptions are part of its result (an
    exception raised in a worker is re-raised here as ``ParityTraceError``). Inside
    ``workers()`` its workers are used (``jobs`` then only limits to one process when 1).
    Raises ``ParityTraceError`` when a worker dies without answering.
    """
    jobs = min(jobs or os.cpu_count() or 1, len(items))
    if jobs <= 1:
        return [fn(x) for x in items]
    if _POOL:
        return _POOL[-1].run(fn, items)
    pool = _Workers(jobs - 1)
    try:
        return pool.run(fn, items)
    finally:
        pool.close()


@contextlib.contextmanager
def workers(preload: Sequence[str] = (), jobs: int | None = None) -> Iterator[None]:
    """Start ``jobs - 1`` workers now (default: cpu count - 1), each importing the modules
    ``preload``; ``run_all`` calls inside use them. Closed (stopped) on exit."""
    n = (jobs or os.cpu_count() or 1) - 1
    retain_freed_memory()
    if n < 1:
        yield
        return
    pool = _Workers(n, preload)
    _POOL.append(pool)
    try:
        yield
    finally:
        _POOL.remove(pool)
        pool.close()


class _Workers:
    """``n`` worker processes. Each round, this process sends every worker (fn, items) and
    they all, this process too, claim input indices from a shared (round, next index)."""

    def __init__(self, n: int, preload: Sequence[str] = ()):
        ctx = mp.get_context()
        self.inbox = [ctx.SimpleQueue() for _ in range(n)]
        self.done = ctx.Queue()
        self.claim = ctx.Array("q", [0, 0])  # [round, next index], under its lock
        # busy[k]: the input worker k is on (-1 none), in shared memory: written at once, so it
        # survives a worker killed before its queued messages were sent
        self.busy = ctx.Array("q", [-1] * n, lock=False)
        self.procs = [ctx.Process(target=_serve, daemon=True,
                                  args=(self.inbox[k], self.done, self.claim, self.busy, k,
                                        tuple(preload), os.getpid()))
                      for k in range(n)]
        for p in self.procs:
            p.start()
        self.round = 0
        self.inbound: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=_pump, args=(self.done, self.inbound), daemon=True).start()

    def run(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        with self.claim.get_lock():
            self.round += 1
            self.claim[0], self.claim[1] = self.round, 0
        for box in self.inbox:
            box.put((self.round, fn, items))
        results: dict[int, Any] = {}
        while (i := self._claim(len(items), results, items)) is not None:
            results[i] = fn(items[i])
            self._drain(results, items, block=False)
        while len(results) < len(items):
            if not self._drain(results, items, block=True):
                self._check_alive(results, items)
        return [results[i] for i in range(len(items))]

    def close(self) -> None:
        for box, p in zip(self.inbox, self.procs):
            if p.is_alive():
                box.put(None)
        for p in self.procs:
            p.join(timeout=1)
            if p.is_alive():  # still importing ``preload``, or stuck: it holds nothing of ours
                p.kill()
                p.join(timeout=5)
        # The pump thread (a daemon) stays blocked on the pipe: this process never writes to
        # it, because a worker killed while writing holds the queue's write lock forever, and
        # a write from here would then block this process's exit (multiprocessing joins the
        # queue's feeder thread at exit).

    def _claim(self, n: int, results: dict, items) -> int | None:
        """``_next`` for this process, which never waits forever on the lock: a worker killed
        while holding it raises here."""
        lock = self.claim.get_lock()
        while not lock.acquire(timeout=_POLL_S):
            self._check_alive(results, items)
        try:
            return _next_locked(self.claim, self.round, n)
        finally:
            lock.release()

    def _drain(self, results: dict, items, *, block: bool) -> bool:
        """Take the workers' answers; False when none came within the poll time. The pipe is
        read by a thread (``_pump``): a worker killed in the middle of writing an answer leaves
        a partial message that would block a reader forever, and this thread must stay free to
        notice the death."""
        got = False
        while True:
            try:
                msg = self.inbound.get(block=block and not got, timeout=_POLL_S)
            except queue.Empty:
                return got
            got = True
            rnd, i, ok, value = msg
            if rnd != self.round:
                continue
            if not ok:
                raise ParityTraceError(f"{items[i]}: a worker process failed on it: {value}")
            results[i] = value

    def _check_alive(self, results: dict, items) -> None:
        """Raise when a worker has died during a round (workers only end at ``close``): naming
        the input it was on, else the first unanswered one."""
        for k, p in enumerate(self.procs):
            if p.is_alive():
                continue
            i = self.busy[k]
            if i < 0:
                self._drain(results, items, block=False)  # what it answered before it died
                i = next((j for j in range(len(items)) if j not in results), -1)
            if i >= 0:
                _died(items[i], p.exitcode)


def _pump(done, inbound: queue.SimpleQueue) -> None:
    """Daemon thread: move the workers' answers from the process pipe to ``inbound``."""
    while True:
        try:
            msg = done.get()
        except (EOFError, OSError):
            return
        inbound.put(msg)


def _next(claim, rnd: int, n: int) -> int | None:
    """The next unclaimed input index of round ``rnd``; None when all are taken or the round
    is over (a worker late from an earlier round must not take the new round's inputs)."""
    with claim.get_lock():
        return _next_locked(claim, rnd, n)


def _next_locked(claim, rnd: int, n: int) -> int | None:
    if claim[0] != rnd or claim[1] >= n:
        return None
    i = claim[1]
    claim[1] = i + 1
    return i


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cycle collector for a block of heavy imports, then freeze what they built.

    Importing pandas and the analysis creates ~60k objects that all stay alive; the collector's
    passes over them during the imports cost ~50-60 ms of CPU per process here, and finding
    nothing. Frozen (``gc.freeze``), they are left out of later collections too."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.freeze()


def retain_freed_memory() -> None:
    """Let glibc's malloc keep freed memory for reuse instead of returning it to the OS after
    each rank (no mmap for blocks under 1 GiB, no trim of the heap top under 1 GiB): the next
    rank's 40 MB buffers then reuse pages already mapped, not fresh ones faulted in: about 30 ms
    of system time per 41 MB rank (0.09 -> 0.06 s). For processes that end with the command
    (``workers()``: the CLI and its workers). No-op without glibc (``mallopt``:
    M_MMAP_THRESHOLD = -3, M_TRIM_THRESHOLD = -1, malloc.h)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)
        libc.mallopt(-1, 1 << 30)
    except (OSError, AttributeError):
        pass


def _bind_to_parent(parent: int) -> None:
    """End this worker when the process that started it ends, however it ends (Linux
    PR_SET_PDEATHSIG = SIGKILL: a killed ``analyzer`` leaves no worker behind), and leave Ctrl-C
    to that process (the terminal sends SIGINT to the whole group; the caller stops the workers
    and says "interrupted", without a worker's traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux
        return
    if os.getppid() != parent:  # it ended before the line above took effect
        os._exit(1)


def _serve(inbox, done, claim, busy, k: int, preload: tuple[str, ...], parent: int) -> None:
    """Worker: import ``preload``, then serve rounds until the stop mark."""
    _bind_to_parent(parent)
    retain_freed_memory()
    with collector_paused():
        for name in preload:
            importlib.import_module(name)
    while (msg := inbox.get()) is not None:
        rnd, fn, items = msg
        while (i := _next(claim, rnd, len(items))) is not None:
            busy[k] = i
            try:
                done.put((rnd, i, True, fn(items[i])))
            except Exception as exc:  # noqa: BLE001 - carried to the caller, raised there
                done.put((rnd, i, False, f"{type(exc).__name__}: {exc}"))
            busy[k] = -1


def _died(item: Any, code: int | None) -> None:
    raise ParityTraceError(f"{item}: the worker process parsing it died (exit code {code}, "
                           "e.g. killed or out of memory); rerun, or give it more memory")
