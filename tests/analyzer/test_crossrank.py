"""The cross-rank phase one rank at a time (analyzer/analyses/crossrank.py) and the per-rank
tables on disk past a memory budget (analyzer/ingest/spill.py).

Oracle: the whole-table functions (``clock.clock_offsets``, ``collectives.match_ranks``,
``by_kind``, ``commsplit.wait_transfer`` / ``rank_kind_split``) on the concatenated table of
every rank, which the report used before it streamed; and ``analyzer report`` with every rank
held in memory. The hand-built job: 6 gloo ranks, each clock shifted by its own offset, 120
all_reduces on the world group and 60 all_gathers on a 3-rank group, starts jittered by a
seeded generator so that every rank is sometimes the last to start.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.analyses import clock, collectives, commsplit, crossrank
from analyzer.contract.owner import OWNER_NAME
from analyzer.ingest import spill
from analyzer.ingest import pipeline
from analyzer.compare import runs
from analyzer.ingest.pipeline import load_tables
from tests.inputs import HANG_S, bad_input, cli, copy_run
from tests.analyzer.helpers import REPO, gloo_job

RANKS = 6


def _job(folder: Path, ranks: int = RANKS, **kw) -> Path:
    return gloo_job(folder, ranks, **kw)


@pytest.fixture()
def job_dir(tmp_path):
    return _job(tmp_path / "job")


@pytest.fixture(params=[("held", None), ("spilled", 1), ("spilled", 50_000)],
                ids=["held-one-batch", "spilled-batch-per-rank", "spilled-batches-of-2"])
def budget(request, monkeypatch):
    """Every rank's tables in memory, the job one batch; or every rank's on disk, a batch per
    rank or per two ranks (a rank's collectives: 24-36 kB); several reductions of 1-2 ranks'
    rows."""
    how, batch = request.param
    monkeypatch.setenv("PARITYTRACE_TABLES_MEMORY", "1G" if how == "held" else "0")
    monkeypatch.setattr(crossrank, "REDUCE_ROWS", 250)
    if batch is not None:
        monkeypatch.setattr(pipeline, "BATCH_BYTES", batch)
    return how


def test_streamed_figures_equal_the_whole_table_functions(job_dir, budget):
    job = load_tables(job_dir)
    assert all(bool(rt.spilled) == (budget == "spilled") for rt in job.ranks)
    coll = job.collectives
    assert set(coll["kind"]) == {"all_reduce", "all_gather"}
    ranks = [rt.rank for rt in job.ranks]

    off = crossrank.clock_offsets(job)
    pd.testing.assert_frame_equal(off, clock.clock_offsets(coll, ranks))
    assert off["n_matched"].tolist() == [180, 120, 180, 120, 180, 120]  # rank 0: the reference
    assert off["offset_ns"].tolist() == [777_000 * r for r in range(RANKS)]

    want = collectives.match_ranks(coll, off)
    pd.testing.assert_frame_equal(crossrank.match_ranks(job, off), want)
    assert set(want["straggler_rank"]) == set(range(RANKS))  # the jitter moves the straggler
    pd.testing.assert_frame_equal(crossrank.kind_table(job), collectives.by_kind(coll))

    split = commsplit.wait_transfer(coll, off)
    assert split["wait_ns"].sum() > 0
    steps = job.breakdown.groupby("rank")["step"].nunique()
    parts = crossrank.comm_parts(job, off, steps)
    pd.testing.assert_frame_equal(parts["ranks"], commsplit.rank_kind_split(coll, split, steps))
    pd.testing.assert_frame_equal(parts["whole"], collectives.by_kind(coll))
    moved = collectives.by_kind(coll.assign(dur_ns=split["transfer_ns"].to_numpy()))
    pd.testing.assert_frame_equal(parts["moved"], moved)


def test_spilled_ranks_give_the_report_of_held_ranks(tmp_path, monkeypatch, job_dir, ddp_run,
                                                     fsdp_run):
    copy_run(ddp_run, job_dir.parent / "runs" / "ddp")
    copy_run(fsdp_run, job_dir.parent / "runs" / "fsdp")
    reports = {}
    for how, size in (("held", "1G"), ("spilled", "0")):
        monkeypatch.setenv("PARITYTRACE_TABLES_MEMORY", size)
        for name, src in (("job", job_dir), ("runs", job_dir.parent / "runs")):
            out = tmp_path / f"{how}-{name}"
            proc = cli("report", str(src), "--out", str(out), "--format", "json")
            assert proc.returncode == 0, proc.stderr
            reports[how, name] = json.loads((out / "report.json").read_text())
    for name in ("job", "runs"):
        assert reports["spilled", name] == reports["held", name]
    fsdp = next(r for r in reports["spilled", "runs"]["runs"] if r["name"] == "fsdp")
    assert fsdp["prefetch"]["units"]  # FSDP units went through the disk too
    assert reports["held", "job"]["runs"][0]["comm_groups"]


def test_the_disk_folder_goes_with_its_job(job_dir, monkeypatch):
    monkeypatch.setenv("PARITYTRACE_TABLES_MEMORY", "0")
    job = load_tables(job_dir)
    folder = job.spill.folder
    assert folder is not None and len([f for f in folder.iterdir() if f.name != OWNER_NAME]) == 2 * RANKS
    del job
    gc.collect()
    assert not folder.exists()


def test_an_interrupt_while_the_disk_tables_go_stops_the_report(job_dir, monkeypatch):
    """A Ctrl-C / SIGTERM that lands while a job's tables on disk are removed reaches the
    report: the removal runs in the report's code (``with load_run(...)``), not in a collected
    object's finalizer, which would print the KeyboardInterrupt and drop it."""
    monkeypatch.setenv("PARITYTRACE_TABLES_MEMORY", "0")
    real = shutil.rmtree
    removed = []

    def interrupted(path, *args, **kwargs):
        real(path, *args, **kwargs)
        if Path(path).name.startswith(spill.PREFIX):
            removed.append(path)
            raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runs.analyse(job_dir)
    assert len(removed) == 1 and not Path(removed[0]).exists()


def test_held_bytes_stay_under_the_budget(job_dir, monkeypatch):
    one = spill.frame_bytes(load_tables(job_dir).ranks[0].collectives)
    monkeypatch.setenv("PARITYTRACE_TABLES_MEMORY", str(3 * one))
    job = load_tables(job_dir)
    held = [rt.rank for rt in job.ranks if not rt.spilled]
    assert 1 <= len(held) < RANKS and job.spill.held_bytes <= 3 * one


def test_a_bad_budget_is_one_line(job_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("PARITYTRACE_TABLES_MEMORY", "lots")
    bad_input(cli("report", str(job_dir), "--out", str(tmp_path / "o")), "PARITYTRACE_TABLES_MEMORY", "not a size")


def _peak_bytes(fn) -> int:
    """Peak bytes while ``fn()`` runs: Python's and numpy's (tracemalloc) plus Arrow's (a
    proxy of its memory pool, whose own statistics start at 0), each its own peak: an upper
    bound of the two held at once."""
    import pyarrow as pa

    pool = pa.proxy_memory_pool(pa.default_memory_pool())
    before = pa.default_memory_pool()
    gc.collect()
    pa.set_memory_pool(pool)
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] + pool.max_memory()
    finally:
        tracemalloc.stop()
        pa.set_memory_pool(before)


def _phase_peak(folder: Path) -> tuple[int, int, int]:
    """(bytes of the job's collectives, peak bytes of the streamed cross-rank phase, of the
    same offsets computed on the concatenated table)."""
    job = load_tables(folder, jobs=2)
    whole = spill.frame_bytes(job.collectives)
    steps = job.breakdown.groupby("rank")["step"].nunique()

    def streamed():
        off = crossrank.clock_offsets(job)
        crossrank.comm_parts(job, off, steps)
        crossrank.match_ranks(job, off)

    return whole, _peak_bytes(streamed), _peak_bytes(lambda: clock.clock_offsets(job.collectives))


@pytest.mark.integration  # a scale test: 40 ranks of 1,800 collectives, tens of seconds
def test_cross_rank_phase_memory_does_not_follow_the_ranks(tmp_path, monkeypatch):
    """8 and 32 ranks x 1,800 collectives, ranks on disk: the streamed phase (offsets, split,
    per-instance matching) grows by under a quarter of what the concatenated table grows by,
    and peaks under a quarter of it at 32 ranks; the same offsets on the concatenated table
    hold more than half of it."""
    monkeypatch.setenv("PARITYTRACE_TABLES_MEMORY", "0")
    monkeypatch.setattr(crossrank, "REDUCE_ROWS", 1800)  # about one rank's, as at 4,096 ranks
    monkeypatch.setattr(pipeline, "BATCH_BYTES", 1)  # a batch per rank
    small = _phase_peak(_job(tmp_path / "8", ranks=8, n_reduce=1200, n_gather=600))
    big = _phase_peak(_job(tmp_path / "32", ranks=32, n_reduce=1200, n_gather=600))
    assert big[1] - small[1] < (big[0] - small[0]) / 4, (small, big)
    assert big[1] < big[0] / 4 < big[2] / 2, big


def test_a_member_list_on_every_collective_is_written_once(job_dir, monkeypatch):
    """4,096 members as text (23 kB) on every collective of a rank: the file on disk holds it
    once (dictionary-encoded) and reads back equal; the budget counts what memory holds."""
    monkeypatch.setenv("PARITYTRACE_TABLES_MEMORY", "1G")
    from analyzer.ingest.ranktables import arrow

    rt = load_tables(job_dir).ranks[0]
    members = str(list(range(4096)))
    want = rt.frame("collectives")
    want["pg_ranks"] = [members] * len(want)
    rt.tables["collectives"] = arrow(want)
    held = spill.frame_bytes(want)
    assert held >= int(want.memory_usage(index=False, deep=False).sum())
    store = spill.Spill(budget=0)
    store.keep(rt)
    on_disk = Path(rt.spilled["collectives"]).stat().st_size
    assert on_disk < len(want) * 400 + 2 * len(members) < len(want) * len(members) / 10
    pd.testing.assert_frame_equal(spill.read(rt.spilled["collectives"]), want)
    assert "collectives" not in rt.tables and rt.collectives["pg_ranks"].eq(members).all()


def _spill_folders(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("paritytrace-tables-*"))


def test_a_refused_job_leaves_no_tables_on_disk(tmp_path, monkeypatch):
    job = _job(tmp_path / "job")
    (job / "rank3.trace.json").write_text((job / "rank3.trace.json").read_text()[:5000])
    monkeypatch.setenv("PARITYTRACE_TABLES_MEMORY", "0")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again
    bad_input(cli("report", str(job), "--out", str(tmp_path / "o")), "rank3.trace.json")
    assert _spill_folders(tmp_path / "tmp") == []


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_sigterm_mid_report_exits_130_and_leaves_nothing(tmp_path):
    """A report of 120 ranks, every rank's tables on disk, with --tables-out: SIGTERM while the
    tables are on disk gives one line, exit 130, and neither the tables folder nor the
    dataset's staging folder stays. The report is stopped (SIGSTOP) while its tables folder is
    seen on disk, so the signal lands mid-report however slow this machine is; a report that
    removed its tables before it was stopped is started again."""
    job = gloo_job(tmp_path / "job", 120, n_reduce=200, n_gather=100, suffix=".json.gz")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), **{"PARITYTRACE_TABLES_MEMORY": "0"})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    for _ in range(5):
        shutil.rmtree(tmp_path / "o", ignore_errors=True)
        proc = subprocess.Popen([sys.executable, "-m", "analyzer", "report", str(job), "--out",
                                 str(tmp_path / "o"), "--tables-out", str(tmp_path / "ds")],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        while not _spill_folders(tmp) and proc.poll() is None:
            time.sleep(0.01)
        proc.send_signal(signal.SIGSTOP)
        mid_report = proc.poll() is None and _spill_folders(tmp)
        if mid_report:
            proc.send_signal(signal.SIGTERM)  # pending until it runs again
        proc.send_signal(signal.SIGCONT)
        _, err = proc.communicate(timeout=HANG_S)
        if mid_report:
            break
    else:
        pytest.fail("in 5 tries the report never held its tables on disk when stopped")
    assert proc.returncode == 130 and err.strip() == "analyzer: interrupted", (proc.returncode, err)
    assert _spill_folders(tmp) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job", "tmp"]  # no ds, no .tmp-*
