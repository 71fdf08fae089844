"""Run one function over many inputs in ``jobs`` processes: ``jobs - 1`` workers and this one.

Used to parse ranks (analyzer/load.py, analyzer/tables.py). Every process, this one included,
takes the next input from one shared queue when it is free, so the inputs are dealt out one at
a time as processes finish (an executor that queues inputs ahead for its workers, while this
process works too, can leave this one idle while a worker still has a queued input: measured
5 of 8 equal inputs in the worker and 3 here, a fifth longer than 4 + 4). This process takes
part rather than waiting, so there is one Python interpreter fewer in memory.

Results travel back pickled through a pipe between processes this call started (never from a
file). A worker that dies without answering (killed, out of memory) raises
``ParityTraceError`` naming the input it held.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
from collections.abc import Callable, Sequence
from typing import Any

from analyzer.errors import ParityTraceError

_POLL_S = 0.2


def run_all(fn: Callable[[Any], Any], items: Sequence[Any], jobs: int | None = None
            ) -> list[Any]:
    """``[fn(x) for x in items]``, in ``jobs`` processes (default min(cpu count, len(items))).

    ``fn`` must be a module-level function whose exceptions are part of its result (an
    exception raised in a worker is re-raised here as ``ParityTraceError``). Raises
    ``ParityTraceError`` when a worker dies without answering.
    """
    jobs = min(jobs or os.cpu_count() or 1, len(items))
    if jobs <= 1:
        return [fn(x) for x in items]
    ctx = mp.get_context()
    todo = ctx.SimpleQueue()
    done = ctx.Queue()
    # busy[k]: the input worker k is on (-1 none), in shared memory: written at once, so it
    # survives a worker killed before its queued messages were sent
    busy = ctx.Array("q", [-1] * (jobs - 1), lock=False)
    workers = [ctx.Process(target=_work, args=(fn, items, todo, done, busy, k), daemon=True)
               for k in range(jobs - 1)]
    for w in workers:
        w.start()
    for i in range(len(items)):  # after the start: a full pipe waits for the workers
        todo.put(i)
    for _ in range(jobs):
        todo.put(None)  # one stop mark for each taker (workers and this process)
    results: dict[int, Any] = {}
    try:
        while (i := todo.get()) is not None:
            results[i] = fn(items[i])
            _drain(done, results, items, block=False)
        while len(results) < len(items):
            if not _drain(done, results, items, block=True):
                _check_alive(workers, busy, done, results, items)
    finally:
        for w in workers:
            w.join(timeout=5)
            if w.is_alive():
                w.kill()
    return [results[i] for i in range(len(items))]


def _work(fn, items, todo, done, busy, k: int) -> None:
    """Worker loop: take an input index, mark it busy, answer, until the stop mark."""
    while (i := todo.get()) is not None:
        busy[k] = i
        try:
            done.put(("result", i, fn(items[i])))
        except Exception as exc:  # noqa: BLE001 - carried to the caller, raised there
            done.put(("error", i, f"{type(exc).__name__}: {exc}"))
        busy[k] = -1


def _drain(done, results: dict, items, *, block: bool) -> bool:
    """Take the workers' answers; False when none came within the poll time."""
    got = False
    while True:
        try:
            kind, i, value = done.get(block=block and not got, timeout=_POLL_S)
        except queue.Empty:
            return got
        got = True
        if kind == "error":
            raise ParityTraceError(f"{items[i]}: a worker process failed on it: {value}")
        results[i] = value


def _check_alive(workers, busy, done, results: dict, items) -> None:
    """Raise when a worker died on an input, or when every worker has exited and inputs are
    still unanswered (after taking what is left in the pipe)."""
    for k, w in enumerate(workers):
        if not w.is_alive() and busy[k] >= 0:
            _died(items[busy[k]], w.exitcode)
    if not any(w.is_alive() for w in workers):
        _drain(done, results, items, block=False)
        missing = [i for i in range(len(items)) if i not in results]
        if missing:
            _died(items[missing[0]], next((w.exitcode for w in workers if w.exitcode), None))


def _died(item: Any, code: int | None) -> None:
    raise ParityTraceError(f"{item}: the worker process parsing it died (exit code {code}, "
                           "e.g. killed or out of memory); rerun, or give it more memory")
