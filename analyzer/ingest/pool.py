"""``run_all``: one function over many inputs, in this process and ``jobs - 1`` workers of a
``ProcessPoolExecutor``, each taking the next input as it frees up (callers pass the largest
first). ``workers()`` starts the workers ahead (each importing ``preload``: where they are forked
after this process imported it, as ``analyzer report`` does, that costs nothing); ``run_all``
inside reuses them. Workers end with this process, however it ends.
Inside ``analyzer.ingest.cluster.connected`` (``--scheduler``), ``run_all`` hands the inputs to
that Dask cluster instead (``push_map``)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from analyzer.contract import children
from analyzer.contract.errors import ParityTraceError

_POOL: list[ProcessPoolExecutor] = []  # the workers of the innermost open ``workers()``
_MAPS: list[Callable[..., list]] = []  # ``push_map``


def run_all(fn: Callable[[Any], Any], items: Sequence[Any], jobs: int | None = None, *,
            keep: Callable[[Any], Any] | None = None) -> list[Any]:
    """``[keep(fn(x)) for x in items]`` (``fn`` module-level; ``keep`` None: the identity) in
    ``jobs`` processes (default min(cpu count, len(items))). ``keep`` runs in this process on
    each answer as it arrives, so a caller can put a big answer on disk before the next one
    comes (analyzer/ingest/spill.py). A ``ParityTraceError`` (``BadInput``...) raised in a worker is
    re-raised as is; another exception, or a worker that dies (killed, out of memory), raises
    ``ParityTraceError`` naming the input(s) the workers were on. Inside ``push_map`` (a Dask
    cluster) the innermost map pushed runs them instead, ``jobs`` unused."""
    keep = keep or _same
    if _MAPS:
        return _MAPS[-1](fn, items, keep)
    jobs = min(jobs or os.cpu_count() or 1, len(items))
    if jobs <= 1:
        return [keep(fn(x)) for x in items]
    if _POOL:
        return _map(_POOL[-1], fn, items, jobs - 1, keep)
    with _pool(jobs - 1) as ex:
        return _map(ex, fn, items, jobs - 1, keep)


def _same(x: Any) -> Any:
    return x


def push_map(fn_map: Callable[..., list]) -> None:
    """Make ``fn_map(fn, items, keep)`` (results in input order, ``keep`` applied to each as it
    arrives, errors as ``run_all``'s) what
    ``run_all`` calls until ``pop_map(fn_map)``."""
    _MAPS.append(fn_map)


def pop_map(fn_map: Callable[..., list]) -> None:
    """Undo ``push_map(fn_map)``."""
    _MAPS.remove(fn_map)


@contextlib.contextmanager
def workers(preload: Sequence[str] = (), jobs: int | None = None) -> Iterator[None]:
    """Start ``jobs - 1`` workers now (default cpu count - 1), each importing ``preload``."""
    n = (jobs or os.cpu_count() or 1) - 1
    retain_freed_memory()
    if n < 1:
        yield
        return
    with _pool(n, preload) as ex:
        for _ in range(n):
            ex.submit(int)  # start them now, not at the first input
        _POOL.append(ex)
        try:
            yield
        finally:
            _POOL.remove(ex)


@contextlib.contextmanager
def _pool(n: int, preload: Sequence[str] = ()) -> Iterator[ProcessPoolExecutor]:
    ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
    ex = ProcessPoolExecutor(n, ctx, initializer=_init_worker, initargs=(preload, os.getpid()))
    try:
        yield ex
    except BaseException:  # Ctrl-C included: nothing to wait for
        _kill(ex)
        raise
    finally:
        ex.shutdown(cancel_futures=True)


def _kill(ex: ProcessPoolExecutor) -> None:
    """Kill the workers, and close this process's end of their answer pipe: the executor waits
    forever for the rest of an answer whose sender was killed while writing it, until EOF."""
    for p in list(ex._processes.values()):
        p.kill()
    ex._result_queue._writer.close()


def _map(ex: ProcessPoolExecutor, fn: Callable, items: Sequence[Any], n: int,
         keep: Callable[[Any], Any]) -> list[Any]:
    """This process and ``n`` workers take the inputs in order. A worker's next input is
    submitted when its answer arrives (a done-callback, in the executor's thread): none waits
    queued behind a busy worker, and a dead worker breaks only the inputs in work."""
    out: dict[int, Any] = {}
    todo = iter(range(len(items)))  # shared by both threads (next() is atomic under the GIL)
    running: dict[Future, int] = {}

    def feed(done: Future | None = None) -> None:
        if done and (done.cancelled() or done.exception()) or (i := next(todo, None)) is None:
            return
        with contextlib.suppress(RuntimeError):  # broken or shut down: seen below
            running[f := ex.submit(fn, items[i])] = i
            f.add_done_callback(feed)
    try:
        for _ in range(n):
            feed()
        while (i := next(todo, None)) is not None:
            out[i] = keep(fn(items[i]))
        while len(out) < len(items):
            done, _ = wait(list(running), timeout=0.05, return_when=FIRST_COMPLETED)
            if not done and any(p.exitcode is not None for p in list(ex._processes.values())):
                raise BrokenProcessPool  # killed while answering: see _kill
            for f in done:
                if isinstance(exc := f.exception(), ParityTraceError | BrokenProcessPool):
                    raise exc
                if exc:
                    raise ParityTraceError(f"{items[running[f]]}: a worker process failed on "
                                           f"it: {type(exc).__name__}: {exc}") from exc
                out[running.pop(f)] = keep(f.result())
    except BrokenProcessPool:
        _kill(ex)
        lost = [items[i] for f, i in sorted(running.items(), key=lambda fi: fi[1])
                if not f.done() or isinstance(f.exception(), BrokenProcessPool)] or \
            [x for i, x in enumerate(items) if i not in out]
        what = "the worker process parsing it" if len(lost) == 1 else "a worker process " \
            "parsing one of these"
        raise ParityTraceError(f"{', '.join(map(str, lost))}: {what} died (e.g. killed or out "
                               "of memory); rerun, or give it more memory") from None
    finally:
        for _ in todo:  # on an error: feed the workers no more
            pass
    return [out[i] for i in range(len(items))]


def _init_worker(preload: Sequence[str], parent: int) -> None:
    """Leave Ctrl-C to ``parent`` (the terminal sends SIGINT to the whole group), end quietly
    on SIGTERM / SIGHUP (the default action: a fork inherits the parent's handler, whose
    KeyboardInterrupt would print a worker's traceback when a whole process group is stopped;
    the parent says the one line), end when the parent ends (no orphan after a kill -9), import
    ``preload``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(s) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
            signal.signal(s, signal.SIG_DFL)
    children.die_with_parent(parent)
    retain_freed_memory()
    with collector_paused():
        for name in preload:
            importlib.import_module(name)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cycle collector during heavy imports and freeze what they built (~60k objects
    that stay alive: its passes over them cost ~50 ms of CPU per process and found nothing)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.freeze()


def retain_freed_memory() -> None:
    """glibc malloc: keep freed memory (no mmap, no trim under 1 GiB), so each next rank reuses
    mapped pages: ~20 ms of system time less per 41 MB rank. For processes ending with the
    command. (mallopt M_MMAP_THRESHOLD -3, M_TRIM_THRESHOLD -1; no-op without glibc.)"""
    with contextlib.suppress(OSError, AttributeError):
        for param in (-3, -1):
            ctypes.CDLL("libc.so.6").mallopt(param, 1 << 30)
