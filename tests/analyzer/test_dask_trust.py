"""What ``--scheduler`` trusts (analyzer/ingest/daskwire.py, analyzer/ingest/cluster.py): a
Dask worker sends back data that the client decodes and checks, never code it runs; fetching a
result is bounded by ``PARITYTRACE_DASK_TIMEOUT_S``; a non-loopback tcp:// scheduler is warned
of once.

The misbehaving workers are real ``dask worker`` processes on loopback with a preload
(tests/analyzer/dask_preload.py); the scheduler is in this process. Oracle of "no code ran":
the file the crafted pickle would create (``marker``) does not exist, in this process or any.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

distributed = pytest.importorskip(
    "distributed", reason="dask[distributed] is not installed (pip install 'paritytrace[dask]')")

from analyzer.contract.settings import DASK_TIMEOUT_S  # noqa: E402
from analyzer.ingest import cluster  # noqa: E402
from tests.inputs import HANG_S, bad_input, cli  # noqa: E402

pytestmark = pytest.mark.integration

DEFAULT_WAIT_S = float(DASK_TIMEOUT_S.default)
"""The Dask wait with PARITYTRACE_DASK_TIMEOUT_S unset. A test that sets a shorter one checks it
ended before this: the setting was used (a bound the product's default sets, not a speed check)."""

ROOT = Path(__file__).parents[2]
PRELOAD = Path(__file__).with_name("dask_preload.py")


@pytest.fixture
def scheduler():
    """A scheduler on loopback, no workers (they are started per test)."""
    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp",
                                  host="127.0.0.1", dashboard_address=":0") as c:
        yield c


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    return {**env, **extra}


def _wait_for(cond, what: str, limit_s: float = HANG_S) -> None:
    end = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < end, f"no {what} within {limit_s} s"
        time.sleep(0.05)


def _worker(c, mode: str, marker: Path) -> subprocess.Popen:
    """A ``dask worker`` process of ``c``, misbehaving as ``mode`` (dask_preload.py)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", c.scheduler_address,
         "--nthreads", "1", "--no-nanny", "--host", "127.0.0.1", "--no-dashboard",
         "--preload", str(PRELOAD)],
        env=_env(PARITYTRACE_TEST_WORKER=mode, PARITYTRACE_TEST_MARKER=str(marker)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: c.scheduler.workers or proc.poll() is not None, "worker")
        assert proc.poll() is None, "the worker did not start"
    except BaseException:
        proc.kill()
        raise
    return proc


def _one_line(proc, code: int, *must: str) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-3000:]
    for m in must:
        assert m in lines[0], (m, lines[0])
    return lines[0]


def _report_beside(scheduler, mode: str, marker, path, out):
    """``analyzer report PATH --out OUT --scheduler`` with one hostile worker (``_worker``) on
    the cluster, stopped afterwards whatever happened."""
    worker = _worker(scheduler, mode, marker)
    try:
        return cli("report", str(path), "--out", str(out), "--scheduler",
                   scheduler.scheduler_address)
    finally:
        worker.kill()
        worker.wait(30)


@pytest.mark.parametrize("mode", ["dask-type", "pickle"])
def test_a_worker_sending_a_crafted_pickle_runs_nothing_here(tmp_path, fixture_copy,
                                                             scheduler, mode):
    """The worker runs the task honestly, then sends its bytes back with a crafted pickle as
    their type (the bytes are read, the type never: the report is made) or as a crafted
    pickle (refused in one line, exit 1). The pickle is never loaded."""
    trace = fixture_copy("gloo_rules.json")
    marker = tmp_path / "code-ran"
    proc = _report_beside(scheduler, mode, marker, trace, tmp_path / "o")
    assert not marker.exists()
    if mode == "dask-type":
        assert proc.returncode == 0, proc.stderr
        return
    _one_line(proc, 1, str(trace), "refused what the Dask cluster", "serialised with 'pickle'")
    assert not (tmp_path / "o").exists()


def test_a_worker_listing_host_local_traces_as_a_crafted_pickle_runs_nothing_here(
        tmp_path, fixture_copy, scheduler, monkeypatch):
    """Traces the client does not see (analyzer/ingest/hostlocal.py): the worker's listing
    comes back as a crafted pickle: refused naming the worker, exit 2, nothing loaded."""
    from analyzer.ingest import hostlocal

    job = fixture_copy("gloo_rules.json").parent
    monkeypatch.setattr(hostlocal, "client_sees", lambda p: False)
    marker = tmp_path / "code-ran"
    proc = _report_beside(scheduler, "pickle", marker, job, tmp_path / "o")
    assert not marker.exists()
    bad_input(proc, "tcp://127.0.0.1:", f"listing {job}", "refused its answer",
              "serialised with 'pickle'")
    assert not (tmp_path / "o").exists()


def test_a_result_off_its_schema_is_refused_in_one_line(tmp_path, fixture_copy, scheduler):
    trace = fixture_copy("gloo_rules.json")
    worker = _worker(scheduler, "schema", tmp_path / "unused")
    try:
        proc = cli("report", str(trace), "--out", str(tmp_path / "o"), "--scheduler",
                   scheduler.scheduler_address)
    finally:
        worker.kill()
        worker.wait(30)
    _one_line(proc, 1, str(trace), "refused", "table steps: columns ['step']")
    assert not (tmp_path / "o").exists()


def test_distributed_alone_unpickles_what_the_guard_refuses(tmp_path, monkeypatch):
    """The fact the guard answers: ``deserializers`` does not cover ``__Pickled__``."""
    from distributed.protocol import dumps, loads
    from distributed.protocol.serialize import Serialize, ToPickle

    from analyzer.ingest import daskwire

    marker = tmp_path / "code-ran"

    class Crafted:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    for sub in (ToPickle(Crafted()), Serialize(Crafted())):
        frames = dumps({"op": "x", "data": sub})
        got = daskwire.loads(frames)
        assert isinstance(got["data"], daskwire.Refused) and not marker.exists()
    loads(dumps({"data": ToPickle(Crafted())}), deserializers=["msgpack"])
    assert marker.exists()  # distributed's own loads ran it
    assert daskwire.loads(dumps({"b": Serialize(b"ab"), "m": [1, "x"]})) == \
        {"b": b"ab", "m": (1, "x")}
    erred = daskwire.loads(dumps({"op": "task-erred", "exception": Serialize(Crafted()),
                                  "traceback": ToPickle(Crafted())}))
    # an error stays an error; a traceback distributed could not take is dropped (no hang)
    assert isinstance(erred["exception"], daskwire.Refused) and erred["traceback"] is None
    with pytest.raises(daskwire.Refused, match="not a paritytrace result"):
        daskwire.decode(b"\x81\xa4type\xa6tables")
    with pytest.raises(daskwire.Refused, match="not the bytes"):
        daskwire.decode({"type": "tables"})


def _start_report(tmp_path, trace, address, timeout_s: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "analyzer", "report", str(trace), "--out", str(tmp_path / "o"),
         "--scheduler", address], env=_env(PARITYTRACE_DASK_TIMEOUT_S=timeout_s),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, limit_s: float) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"still running {limit_s} s later: {err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("how", ["worker-killed", "sigterm"])
def test_fetching_a_finished_result_is_bounded(tmp_path, fixture_copy, scheduler, how):
    """The trace is parsed, then the worker holding the result never answers the fetch and
    is killed: one line, exit 1, within about PARITYTRACE_DASK_TIMEOUT_S; or, with a longer
    timeout, the report is sent SIGTERM while it waits: one line, exit 130."""
    trace = fixture_copy("gloo_rules.json")
    marker = tmp_path / "m"
    worker = _worker(scheduler, "block", marker)
    report = None
    try:
        wait_s = "3" if how == "worker-killed" else "60"
        report = _start_report(tmp_path, trace, scheduler.scheduler_address, wait_s)
        fetching = Path(str(marker) + ".fetching")
        _wait_for(lambda: fetching.exists() or report.poll() is not None, "fetch")
        assert report.poll() is None, report.communicate()
        worker.kill()
        start = time.monotonic()
        if how == "sigterm":  # while it waits for the fetch, its worker gone
            _wait_for(lambda: not scheduler.scheduler.workers, "worker removal")
            report.send_signal(signal.SIGTERM)
            proc = _finish(report, HANG_S)
            assert _one_line(proc, 130) == "analyzer: interrupted"
        else:
            proc = _finish(report, HANG_S)
            assert time.monotonic() - start < DEFAULT_WAIT_S, "waited the default, not 3 s"
            _one_line(proc, 1, str(trace), "waited 3 s")
    finally:
        worker.kill()
        worker.wait(30)
        if report is not None and report.poll() is None:
            report.kill()
            report.communicate()
    assert not (tmp_path / "o").exists()


def test_a_scheduler_off_loopback_without_tls_is_warned_of_once(tmp_path, fixture_copy,
                                                                monkeypatch):
    monkeypatch.setattr(cluster, "_WARNED", set())
    assert not cluster.warn_if_open("tcp://127.0.0.1:8786")
    assert not cluster.warn_if_open("localhost:8786")
    assert not cluster.warn_if_open("tls://10.0.0.5:8786")
    assert cluster.warn_if_open("tcp://10.0.0.5:8786")
    assert not cluster.warn_if_open("tcp://10.0.0.5:8786")  # once
    trace = fixture_copy("gloo_rules.json")
    proc = subprocess.run(  # a fresh process: its warning goes to stderr, not to pytest's log
        [sys.executable, "-m", "analyzer", "report", str(trace), "--out", str(tmp_path / "o"),
         "--scheduler", "tcp://192.0.2.1:8786"],  # TEST-NET-1: nothing answers
        env=_env(PARITYTRACE_DASK_TIMEOUT_S="1"), capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 2, proc.stderr
    assert "is not loopback and not tls://" in lines[0] and "no Dask scheduler" in lines[1]
    monkeypatch.setenv("PARITYTRACE_DASK_TIMEOUT_S", "1")
    bad_input(cli("report", str(trace), "--out", str(tmp_path / "o"), "--scheduler",
                  "tcp://127.0.0.1:1"), "no Dask scheduler")  # loopback: no warning
