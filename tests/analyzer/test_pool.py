"""The worker pool (analyzer/ingest/pool.py): order, typed errors, dead workers, started workers,
no orphans."""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import time
from pathlib import Path

import pytest

from analyzer.ingest import pool as parallel
from analyzer.contract.errors import BadInput, ParityTraceError
from analyzer.ingest.pool import run_all
from tests.inputs import default_signals

_PARENT = os.getpid()


def _square(x: int) -> int:
    return x * x


def _met(meet) -> int:
    """Wait at the two-party barrier ``meet`` until a call in another process reaches it (each
    process runs its calls one at a time, so the two are in two processes), then return this
    process's pid. Two processes thus take the inputs in turns: every process takes part,
    however loaded the machine. The timeout guards against a hang (a pool that runs every input
    in one process breaks the barrier), it measures nothing."""
    meet.wait(timeout=HANG_S)
    return os.getpid()


HANG_S = 60
"""Seconds after which a wait that should end at once is taken for a hang."""


@pytest.fixture(scope="module")
def _manager():
    import multiprocessing as mp

    with mp.Manager() as manager:
        yield manager


@pytest.fixture
def meet(_manager):
    """A fresh two-party barrier the pool's workers can reach (a manager's proxy pickles)."""
    return _manager.Barrier(2)


def _in_worker() -> bool:
    return os.getpid() != _PARENT


def _die_in_worker(x: int) -> int:
    """A worker takes the first input (this process the next ones) and dies on it."""
    if _in_worker():
        os._exit(9)
    return x


def _die_on_1(x: int) -> int:
    """In a worker: 1 ends its process; 0 stays in work until the pool kills its worker (the
    sleep only bounds the test's time should the pool never do so)."""
    if _in_worker() and x == 1:
        os._exit(9)
    if _in_worker() and x == 0:
        time.sleep(HANG_S)
    return x


def _raise_in_worker(x: int) -> int:
    if _in_worker():
        raise RuntimeError("boom")
    return x


def _bad_input_in_worker(x: int) -> int:
    if _in_worker():
        raise BadInput(f"rank{x}.json", "truncated", "ends inside an event", "record it again",
                       problems=[BadInput("rank9.json", "not_a_trace", "no traceEvents")])
    return x


def test_results_come_in_input_order_and_every_process_takes_part(meet):
    assert run_all(_square, list(range(30)), jobs=3) == [x * x for x in range(30)]
    assert run_all(_square, [], jobs=4) == []
    assert run_all(_square, [5], jobs=4) == [25]
    pids = run_all(_met, [meet] * 12, jobs=2)
    assert os.getpid() in pids and len(set(pids)) == 2


def test_a_dead_worker_names_its_input():
    with pytest.raises(ParityTraceError, match=r"^0: the worker process parsing it died"):
        run_all(_die_in_worker, [0, 1, 2, 3], jobs=2)


def test_a_dead_worker_names_the_inputs_the_workers_were_on():
    with pytest.raises(ParityTraceError,
                       match=r"^0, 1: a worker process parsing one of these died"):
        run_all(_die_on_1, [0, 1, 2, 3], jobs=3)


def test_an_exception_in_a_worker_names_its_input():
    with pytest.raises(ParityTraceError,
                       match=r"^0: a worker process failed on it: RuntimeError: boom") as err:
        run_all(_raise_in_worker, [0, 1, 2, 3], jobs=2)
    assert isinstance(err.value.__cause__, RuntimeError)


def test_bad_input_raised_in_a_worker_arrives_unchanged():
    with pytest.raises(BadInput) as err:
        run_all(_bad_input_in_worker, [0, 1], jobs=2)
    e = err.value
    assert type(e) is BadInput and e.path == "rank0.json"
    assert (e.reason, e.message, e.fix) == ("truncated", "ends inside an event", "record it again")
    assert str(e) == "rank0.json: ends inside an event; record it again"
    assert [(p.path, p.reason, p.message, p.fix) for p in e.problems] == [
        ("rank9.json", "not_a_trace", "no traceEvents", "")]


def _preloaded(meet) -> tuple[int, bool]:
    return _met(meet), "colorsys" in sys.modules


def test_started_workers_preload_serve_several_rounds_and_stop(monkeypatch, meet):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)  # as if never imported here
    with parallel.workers(preload=("colorsys",), jobs=2):
        procs = list(parallel._POOL[-1]._processes.values())
        assert len(procs) == 1  # started before any input
        first = run_all(_preloaded, [meet] * 8, jobs=2)
        second = run_all(_met, [meet] * 8, jobs=2)
        assert run_all(_square, [3], jobs=2) == [9]  # one input: this process alone
    assert "colorsys" not in sys.modules
    assert {pid for pid, _ in first} == set(second) == {os.getpid(), procs[0].pid}
    assert all(preloaded for pid, preloaded in first if pid != os.getpid())
    assert not parallel._POOL and not procs[0].is_alive()


def test_a_worker_dying_inside_started_workers_is_named():
    with pytest.raises(ParityTraceError, match=r"^0: the worker process parsing it died"):
        with parallel.workers(jobs=2):
            run_all(_die_in_worker, [0, 1, 2, 3], jobs=2)
    assert not parallel._POOL


def _die_in_the_middle_of_an_answer(x: int) -> int:
    """In a worker: write the first 4 KiB of a 64 MiB answer to the executor's answer pipe (a
    ``multiprocessing.connection`` message: 4-byte length, then the bytes) and end the process,
    as a worker killed while sending its answer does."""
    if not _in_worker():
        return x
    answers = sys._getframe(1).f_locals["result_queue"]  # concurrent.futures' _process_worker
    os.write(answers._writer.fileno(), struct.pack("!i", 64 << 20) + b"\0" * 4096)
    os._exit(9)


def test_a_worker_killed_in_the_middle_of_its_answer_does_not_hang_the_caller():
    with pytest.raises(ParityTraceError, match=r"^0: the worker process parsing it died"):
        run_all(_die_in_the_middle_of_an_answer, [0, 1], jobs=2)


BUSY = """
import os, time
from analyzer.ingest.pool import run_all

def work(seconds):
    os.write(1, b"%d\\n" % os.getpid())  # in work now (a worker: its signals set up)
    time.sleep(seconds)

run_all(work, [600, 600, 600], jobs=2)
"""
IDLE = """
import os, time
from analyzer.ingest import pool

with pool.workers(preload=("says_ready",), jobs=3):  # each worker says so once set up
    os.write(1, b"%d\\n" % os.getpid())  # and this process once past their fork (a Ctrl-C
    time.sleep(600)                      # inside fork's handlers is lost: CPython ignores it)
"""


@pytest.mark.integration
def test_workers_end_with_a_killed_caller_and_ignore_ctrl_c(tmp_path):
    """kill -9 of the calling process ends its workers (no orphan parsing on for nothing);
    SIGINT to the whole group is left to the caller (no worker traceback), whether the workers
    are busy or waiting for work. The signal is sent once every process has said on stdout
    that it is in work (busy) or set up (idle): no guess of how long that takes."""
    import signal
    import subprocess

    import psutil

    (tmp_path / "says_ready.py").write_text('import os\nos.write(1, b"%d\\n" % os.getpid())\n')
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), repo,
                                                        os.environ.get("PYTHONPATH", "")])}
    for code, sig, n_said in ((BUSY, signal.SIGINT, 2), (BUSY, signal.SIGKILL, 2),
                              (IDLE, signal.SIGINT, 3)):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True, preexec_fn=default_signals)
        kids = []
        try:
            said = {int(proc.stdout.readline()) for _ in range(n_said)}
            kids = [psutil.Process(pid) for pid in said - {proc.pid}]
            assert kids and {k.pid for k in kids} <= {k.pid for k in psutil.Process(proc.pid).children()}
            if sig == signal.SIGINT:
                os.killpg(proc.pid, sig)  # what the terminal does on Ctrl-C
            else:
                proc.kill()
            proc.wait(timeout=HANG_S)
            gone, alive = psutil.wait_procs(kids, timeout=HANG_S)
            assert not alive, f"{sig!r}: worker(s) left running: {alive}"
            if sig == signal.SIGINT:
                err = proc.stderr.read()  # the caller's own KeyboardInterrupt, no worker's:
                assert "KeyboardInterrupt" in err and "Process " not in err, err
        finally:  # the processes this test started, a failed check's survivors included
            for p in [proc, *kids]:
                with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                    p.kill()
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()


def test_collector_paused_restores_the_collector_and_freezes_what_was_built():
    import gc

    was = gc.isenabled()
    gc.enable()
    before = gc.get_freeze_count()
    try:
        with parallel.collector_paused():
            assert not gc.isenabled()
            built = [[i] for i in range(1000)]  # tracked containers
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before + len(built)
        gc.disable()
        with parallel.collector_paused():
            pass
        assert not gc.isenabled()  # a paused collector stays paused
    finally:
        gc.unfreeze()
        (gc.enable if was else gc.disable)()
