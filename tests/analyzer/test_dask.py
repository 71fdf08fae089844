"""The per-rank map on a Dask cluster (analyzer/ingest/cluster.py) and the Parquet dataset of
the per-rank tables (analyzer/ingest/dataset.py), issue 21.

Oracles: the same ``analyzer report`` with the local process pool on an identical copy of the
input (report.json must be identical but for the folder's path), the in-memory tables of
``api.load_tables`` (the dataset read back with pyarrow.dataset must equal them), the
scheduler's own count of the tasks it ran, and hand-made failures (a closed port, a scheduler
without workers, a task that kills its worker process)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

distributed = pytest.importorskip(
    "distributed", reason="dask[distributed] is not installed (pip install 'paritytrace[dask]')")

import pandas as pd  # noqa: E402
import pyarrow.dataset as pads  # noqa: E402

from analyzer import api  # noqa: E402
from analyzer.contract.errors import ParityTraceError  # noqa: E402
from analyzer.contract.settings import DASK_TIMEOUT_S  # noqa: E402
from analyzer.ingest import cluster, dataset, pipeline, spill  # noqa: E402
from analyzer.ingest.pool import run_all  # noqa: E402
from tests.analyzer.helpers import dask_ranks_ran  # noqa: E402
from tests.inputs import DLRM, bad_input, cli, cli_proc, copy_run, need  # noqa: E402

pytestmark = pytest.mark.integration  # real Dask workers on loopback TCP

DEFAULT_WAIT_S = float(DASK_TIMEOUT_S.default)
"""The Dask wait with PARITYTRACE_DASK_TIMEOUT_S unset. A test that sets a shorter one checks it
ended before this: the setting was used (a bound the product's default sets, not a speed check)."""


def _report(out: Path, root: Path) -> dict:
    """report.json with the input folder's path taken out (the one thing that differs)."""
    text = (out / "report.json").read_text().replace(str(root), "ROOT")
    return json.loads(text)


def _same_report_both_ways(tmp_path, src_copy, c, n_ranks, monkeypatch=None):
    """``analyzer report`` of two identical copies: the local pool (a fresh interpreter, its
    forked workers, every rank held in memory) and the Dask cluster (with --tables-out; with
    ``monkeypatch``, every rank's tables put on disk as they arrive, analyzer/ingest/spill.py).
    Returns the Dask copy's root."""
    local, remote = src_copy(tmp_path / "local" / "in"), src_copy(tmp_path / "dask" / "in")
    env_addr = os.environ.pop("DASK_SCHEDULER_ADDRESS", None)
    try:
        proc = cli_proc("report", str(local), "--out", str(tmp_path / "lo"), "--format", "json")
    finally:
        if env_addr is not None:
            os.environ["DASK_SCHEDULER_ADDRESS"] = env_addr
    assert proc.returncode == 0, proc.stderr
    before = dask_ranks_ran(c)
    if monkeypatch is not None:
        monkeypatch.setenv("PARITYTRACE_TABLES_MEMORY", "0")
        monkeypatch.setattr(pipeline, "BATCH_BYTES", 1)  # each rank's rows read and written alone
    proc = cli("report", str(remote), "--out", str(tmp_path / "do"), "--format", "json",
               "--scheduler", c.scheduler_address, "--tables-out", str(tmp_path / "ds"))
    assert proc.returncode == 0, proc.stderr
    assert dask_ranks_ran(c) - before == n_ranks  # every rank parsed by the cluster's workers
    assert _report(tmp_path / "do", remote) == _report(tmp_path / "lo", local)
    return remote


def _read(ds: Path, table: str) -> pd.DataFrame:
    t = pads.dataset(ds / table, partitioning=dataset.partitioning(), format="parquet").to_table()
    return t.to_pandas()


def _check_round_trip(ds: Path, run: str, job) -> None:
    """Every table of ``job`` (in memory) equals the dataset's rows of ``run``."""
    for name in ("breakdown", "collectives", "prefetch"):
        want = getattr(job, name).sort_values(["rank", "step"], kind="stable")
        got = _read(ds, name)
        got = got[got["run"] == run].drop(columns="run") if len(got) else got
        if not len(want):
            assert not len(got), name
            continue
        got = got.sort_values(["rank", "step"], kind="stable")[list(want.columns)]
        pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True),
                                      check_dtype=False, check_categorical=False)
    for name in ("steps", "timeline", "device_memory"):
        got = _read(ds, name)
        for r in job.ranks:
            mine = got[(got["run"] == run) & (got["rank"] == r.rank)]
            mine = mine.drop(columns=["run", "rank"]).reset_index(drop=True)
            pd.testing.assert_frame_equal(mine, getattr(r, name).reset_index(drop=True),
                                          check_dtype=False, check_categorical=False)
    ranks = _read(ds, "ranks")
    ranks = ranks[ranks["run"] == run].sort_values("rank")
    assert ranks["rank"].tolist() == [r.rank for r in job.ranks]
    assert ranks["sha256"].tolist() == [r.sha256 for r in job.ranks]
    assert ranks["whole_comm_ns"].tolist() == [r.whole_comm_ns for r in job.ranks]


def test_dlrm_corpus_report_on_a_dask_cluster_equals_the_local_pool(tmp_path, local_cluster):
    need(DLRM)
    import shutil

    def copy(dst: Path) -> Path:
        shutil.copytree(DLRM, dst)
        return dst

    root = _same_report_both_ways(tmp_path, copy, local_cluster, 8)
    _check_round_trip(tmp_path / "ds", "in", api.load_tables(root))


def test_recorded_runs_on_a_dask_cluster_equal_the_local_pool(tmp_path, local_cluster, ddp_run,
                                                              fsdp_run, monkeypatch):
    def copy(dst: Path) -> Path:
        copy_run(ddp_run, dst / "ddp")
        copy_run(fsdp_run, dst / "fsdp")
        return dst

    # an empty user cache: no cached tables, every rank parsed again (on the cluster)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    root = _same_report_both_ways(tmp_path, copy, local_cluster, 4, monkeypatch)
    for run in ("ddp", "fsdp"):
        _check_round_trip(tmp_path / "ds", run, api.load_tables(root / run))
    assert len(_read(tmp_path / "ds", "prefetch")) > 0  # FSDP's all_gathers are in it
    marker = json.loads((tmp_path / "ds" / dataset.MARKER).read_text())
    assert [r["run"] for r in marker["runs"]] == ["ddp", "fsdp"]


def test_tables_out_replaces_its_own_dataset_and_refuses_other_folders(tmp_path, fixture_copy):
    trace = fixture_copy("gloo_rules.json")
    ds = tmp_path / "ds"
    args = ("report", str(trace), "--out", str(tmp_path / "o"), "--format", "json")
    assert cli(*args, "--tables-out", str(ds)).returncode == 0
    first = sorted(p.relative_to(ds) for p in ds.rglob("*"))
    assert cli(*args, "--tables-out", str(ds)).returncode == 0  # its own: replaced
    assert sorted(p.relative_to(ds) for p in ds.rglob("*")) == first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    (ds / "notes.txt").write_text("mine")
    bad_input(cli(*args, "--tables-out", str(ds)), str(ds), "did not write")
    assert (ds / "notes.txt").read_text() == "mine"
    (ds / "notes.txt").unlink()
    deep = next(p for p in ds.rglob("part-0.parquet")).parent / "my_analysis.csv"
    deep.write_text("mine")  # a user's file deep inside the dataset: never deleted
    bad_input(cli(*args, "--tables-out", str(ds)), str(ds), "did not write")
    assert deep.read_text() == "mine"
    deep.unlink()
    (ds / "breakdown" / "extra").mkdir()
    (ds / "breakdown" / "extra" / "keep.txt").write_text("x")
    bad_input(cli(*args, "--tables-out", str(ds)), str(ds), "did not write")
    assert (ds / "breakdown" / "extra" / "keep.txt").read_text() == "x"
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.parquet").write_bytes(b"keep")
    bad_input(cli(*args, "--tables-out", str(other)), str(other), "did not write")
    assert (other / "x.parquet").read_bytes() == b"keep"
    inside = tmp_path / "job"
    inside.mkdir()
    (inside / "worker0.json").write_bytes(trace.read_bytes())
    bad_input(cli("report", str(inside), "--out", str(tmp_path / "o2"),
                  "--tables-out", str(inside / "ds")), "inside the input")
    assert not (inside / "ds").exists()


def test_the_readme_duckdb_query_reads_the_dataset(tmp_path, fixture_copy):
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed (pip install duckdb)")
    trace = fixture_copy("gloo_rules.json")
    ds = tmp_path / "tables"
    assert cli("report", str(trace), "--out", str(tmp_path / "o"), "--format", "json",
               "--tables-out", str(ds)).returncode == 0
    q = duckdb.sql(f"SELECT run, rank, sum(exposed_comm_ns) AS exposed_ns FROM read_parquet("
                   f"'{ds}/breakdown/**/*.parquet', hive_partitioning=true) GROUP BY ALL").df()
    bd = api.load_tables(trace).breakdown
    assert q["rank"].tolist() == [1] and q["exposed_ns"].tolist() == [59_000]  # test_rules
    assert q["exposed_ns"].tolist() == [int(bd["exposed_comm_ns"].sum())]
    assert q["run"].tolist() == [json.loads((ds / dataset.MARKER).read_text())["runs"][0]["run"]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_rank_cached_never_contacts_the_scheduler(tmp_path, fixture_copy, monkeypatch):
    """A second analysis whose ranks all come from the per-rank tables caches parses nothing, so
    an unreachable --scheduler is not an error (--tables-out: the analysis runs, report cache or
    not)."""
    monkeypatch.setenv("PARITYTRACE_DASK_TIMEOUT_S", "1")
    trace = fixture_copy("gloo_rules.json")
    assert cli("report", str(trace), "--out", str(tmp_path / "o1")).returncode == 0
    proc = cli("report", str(trace), "--out", str(tmp_path / "o2"), "--tables-out",
               str(tmp_path / "ds"), "--scheduler", f"tcp://127.0.0.1:{_free_port()}")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "ds" / dataset.MARKER).is_file()


def test_unreachable_or_malformed_scheduler_is_one_line_exit_2(tmp_path, fixture_copy,
                                                               monkeypatch):
    monkeypatch.setenv("PARITYTRACE_DASK_TIMEOUT_S", "1")
    trace = fixture_copy("gloo_rules.json")
    for address in (f"tcp://127.0.0.1:{_free_port()}", "nonsense://nowhere"):
        start = time.monotonic()
        line = bad_input(cli("report", str(trace), "--out", str(tmp_path / "o"),
                             "--scheduler", address), address, "no Dask scheduler answers")
        assert "dask scheduler" in line
        assert time.monotonic() - start < DEFAULT_WAIT_S, "waited the default, not the 1 s set"
    assert not (tmp_path / "o").exists()
    # the environment names it when the option does not; "local" is the local pool
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", f"tcp://127.0.0.1:{_free_port()}")
    bad_input(cli("report", str(trace), "--out", str(tmp_path / "o")), "no Dask scheduler")
    assert cli("report", str(trace), "--out", str(tmp_path / "o"),
               "--scheduler", "local").returncode == 0


def test_scheduler_without_dask_installed_is_one_line_exit_2(tmp_path, fixture_copy,
                                                            monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed: ImportError
    trace = fixture_copy("gloo_rules.json")
    bad_input(cli("report", str(trace), "--out", str(tmp_path / "o"), "--scheduler",
                  "tcp://127.0.0.1:8786"), "needs dask.distributed", "paritytrace[dask]")


def test_a_scheduler_without_workers_gives_one_line_naming_the_trace(tmp_path, fixture_copy,
                                                                    monkeypatch):
    monkeypatch.setenv("PARITYTRACE_DASK_TIMEOUT_S", "1")
    trace = fixture_copy("gloo_rules.json")
    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp",
                                  host="127.0.0.1", dashboard_address=":0") as c:
        start = time.monotonic()
        proc = cli("report", str(trace), "--out", str(tmp_path / "o"),
                   "--scheduler", c.scheduler_address)
        assert time.monotonic() - start < DEFAULT_WAIT_S, "waited the default, not the 1 s set"
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert str(trace) in lines[0] and "waited 1 s for a Dask worker" in lines[0]


def _die_each_time(log: str) -> str:
    """Note the attempt in ``log``, then kill the worker process running it."""
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    os._exit(9)


def test_a_killed_worker_is_retried_then_named_in_one_line(tmp_path):
    """One worker process (its nanny restarts it); the scheduler allows one death per task: a
    task that kills its worker runs twice, on two worker processes, then is named."""
    import cloudpickle
    import dask

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)  # no import of tests/ there
    log = tmp_path / "attempts"
    try:
        with dask.config.set({"distributed.scheduler.allowed-failures": 1}), \
                distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                         host="127.0.0.1", dashboard_address=":0") as c:
            with cluster.connected(c.scheduler_address):
                with pytest.raises(ParityTraceError, match=r"^.*attempts: the Dask workers "
                                   r"parsing it died \(killed, or out of memory\)"):
                    run_all(_die_each_time, [str(log)])
    finally:  # process-wide: other tests pickle this module by reference
        cloudpickle.unregister_pickle_by_value(module)
    pids = log.read_text().split()
    assert len(pids) == 2 and len(set(pids)) == 2


def _serve(reply: bytes) -> tuple[socket.socket, str]:
    """A TCP server on loopback that answers each connection with ``reply`` (b"": says
    nothing, as an HTTP server waiting for a request does) and keeps it open."""
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []

    def loop() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)
            if reply:
                conn.sendall(reply)

    threading.Thread(target=loop, daemon=True).start()
    return srv, f"tcp://127.0.0.1:{srv.getsockname()[1]}"


@pytest.mark.parametrize("reply", [b"", b"SSH-2.0-OpenSSH_9.6\r\n" * 8],
                         ids=["silent-like-the-dashboard", "speaks-first"])
def test_a_server_that_is_not_a_scheduler_is_one_line_in_time(tmp_path, fixture_copy,
                                                              monkeypatch, reply):
    monkeypatch.setenv("PARITYTRACE_DASK_TIMEOUT_S", "1")
    trace = fixture_copy("gloo_rules.json")
    srv, address = _serve(reply)
    try:
        start = time.monotonic()
        bad_input(cli("report", str(trace), "--out", str(tmp_path / "o"), "--scheduler",
                      address), address, "no Dask scheduler answers there")
        assert time.monotonic() - start < DEFAULT_WAIT_S, "waited the default, not the 1 s set"
    finally:
        srv.close()


def test_addresses_and_outputs_refused_before_any_work(tmp_path, fixture_copy):
    trace = fixture_copy("gloo_rules.json")
    bad_input(cli("report", str(trace), "--scheduler", "tcp://127.0.0.1:99999"), "1-65535")
    for out, ds in ((tmp_path / "a", tmp_path / "a"), (tmp_path / "b" / "rep", tmp_path / "b"),
                    (tmp_path / "c", tmp_path / "c" / "ds")):
        bad_input(cli("report", str(trace), "--out", str(out), "--tables-out", str(ds)),
                  "overlaps --out")
    bad_input(cli("report", str(trace), "--tables-out", ""), "an empty path")
    ds = tmp_path / "ds"
    assert cli("report", str(trace), "--out", str(tmp_path / "o"), "--tables-out",
               str(ds)).returncode == 0
    bad_input(cli("report", str(ds), "--out", str(tmp_path / "o2")), str(ds),
              "dataset written by --tables-out")


def test_each_rank_is_one_file_per_table_beyond_the_open_files(tmp_path):
    """More ranks than the dataset writer keeps files open (``dataset.MAX_OPEN_FILES``): each
    rank's table is still one file, part-0.parquet, with every row of that rank."""
    import pyarrow.parquet as pq

    from analyzer.ingest import dataset
    from analyzer.ingest.pipeline import load_tables
    from tests.analyzer.helpers import gloo_job

    n = dataset.MAX_OPEN_FILES + 6
    job = gloo_job(tmp_path / "job", ranks=n, n_reduce=2, n_gather=1)
    ds = tmp_path / "ds"
    assert cli("report", str(job), "--out", str(tmp_path / "o"), "--format", "json",
               "--tables-out", str(ds)).returncode == 0
    want = load_tables(job)
    for name in ("collectives", "timeline"):
        files = sorted(ds.glob(f"{name}/run=*/rank=*/*.parquet"))
        assert [f.name for f in files] == ["part-0.parquet"] * n
        rows = {int(f.parent.name.removeprefix("rank=")): pq.read_metadata(f).num_rows
                for f in files}
        assert rows == {rt.rank: len(rt.frame(name)) for rt in want.ranks}
