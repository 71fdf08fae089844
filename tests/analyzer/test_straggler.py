"""Straggler with a cause (analyzer/analyses/straggler.py) on hand-built GPU-shaped traces.

Three ranks of one job (fixtures/gpu_shaped/build.py's ``Trace``: CPU ops on thread 1, kernels
on stream 7, NCCL on stream 20, launches linked by correlation id), whole microseconds. Every
rank: ProfilerStep 0..1000; a GEMM 20..120; all_reduce #0 140..300 (pg "0", ends together, no
skew: the anchor of the next gap); then the gap; all_reduce #1 ending at 600 on every rank.
Ranks 0 and 1 (the peers): GEMM launched at 290, runs 300..400, all_reduce #1 launched at 395,
runs 400..600: gap 300..400 = 100 us of compute, nothing else. Rank 2 is the scenario's; it
starts all_reduce #1 at 500, so its lateness (start skew) is 100 us, and the expected split is
worked out per scenario next to its events.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from analyzer import api
from analyzer.analyses import crossrank, straggler
from analyzer.contract.report_types import CAUSE_THRESHOLD

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "gpu_shaped"
US = 1000
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1"


def _trace_cls():
    spec = importlib.util.spec_from_file_location("gpu_shaped_build", FIX / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.Trace


def _collective(t, kernel, coll_name, pg, ranks, ts, end, launch_ts, corr):
    """A collective as torch writes it for NCCL: c10d op > record_param_comms > launch."""
    t.cpu("c10d::" + coll_name + "_", launch_ts - 3, launch_ts + 3)
    t.cpu("record_param_comms", launch_ts - 2, launch_ts + 2, **{
        "Collective name": coll_name, "In msg nelems": 1024, "Out msg nelems": 1024,
        "dtype": "Float", "Group size": len(ranks), "Process Group Name": pg,
        "Process Group Ranks": str(list(ranks))})
    t.gpu(kernel, 20 if pg == "0" else 21, ts, end, corr=corr, launch_ts=launch_ts)


def _rank(Trace, rank: int, gap) -> object:
    t = Trace(rank=rank, world_size=3)
    t.ann("ProfilerStep#1", 0, 1000)
    t.gpu(GEMM, 7, 20, 120, corr=1, launch_ts=10)
    _collective(t, AR, "allreduce", "0", (0, 1, 2), 140, 300, 130, 2)
    ar1_start = gap(t)
    _collective(t, AR, "allreduce", "0", (0, 1, 2), ar1_start, 600, 395 if ar1_start >= 400 else
                ar1_start - 5, 9)
    return t


def _peer(t) -> int:
    t.gpu(GEMM, 7, 300, 400, corr=3, launch_ts=290)
    return 400


def _job(tmp_path: Path, gap, peer=None):
    Trace = _trace_cls()
    for r in range(3):
        _rank(Trace, r, gap if r == 2 else (peer or _peer)).write(tmp_path / f"rank{r}.trace.json")
    job = api.load_tables(tmp_path, jobs=1)
    off = crossrank.clock_offsets(job)
    return job, off, crossrank.straggler_causes(job, off)


def _one(causes):
    assert len(causes) == 1, causes
    c = causes[0]
    assert (c.rank, c.kind, c.times_last, c.late_ns) == (2, "all_reduce", 1, 100 * US)
    assert sum(c.split_ns.values()) == pytest.approx(c.late_ns)
    return c


def test_longer_compute_is_device_compute(tmp_path):
    """Rank 2's GEMM runs 300..500 (200 us, peers 100): device_compute excess 100 = the whole
    lateness; no idle (its all_reduce was launched at 395, before the GEMM ended)."""
    def gap(t):
        t.gpu(GEMM, 7, 300, 500, corr=3, launch_ts=290)
        return 500
    c = _one(_job(tmp_path, gap)[2])
    assert c.split_ns == {"device_compute": 100 * US, "host_delay": 0, "data_wait": 0,
                          "own_collective": 0, "unexplained": 0}
    assert (c.cause, c.explained_frac) == ("device_compute", 1.0)


def test_late_launch_is_host_delay(tmp_path):
    """Rank 2 launches its GEMM at 395 (peers: 290), it runs 400..500: device idle 300..400,
    of which 300..395 before the launch call (host delay 95), 395..400 after it (launch
    latency: unexplained 5). Compute 100 = peers'."""
    def gap(t):
        t.gpu(GEMM, 7, 400, 500, corr=3, launch_ts=395)
        return 500
    c = _one(_job(tmp_path, gap)[2])
    assert c.split_ns == {"device_compute": 0, "host_delay": 95 * US, "data_wait": 0,
                          "own_collective": 0, "unexplained": 5 * US}
    assert (c.cause, c.explained_frac) == ("host_delay", 0.95)


def test_dataloader_range_is_data_wait(tmp_path):
    """Rank 2 is in a DataLoader __next__ range 300..400 on the host (the device idle under
    it counts as data wait, not host delay), launches its GEMM at 400, runs 400..500."""
    def gap(t):
        t.ann("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 300, 400)
        t.gpu(GEMM, 7, 400, 500, corr=3, launch_ts=400)
        return 500
    c = _one(_job(tmp_path, gap)[2])
    assert c.split_ns == {"device_compute": 0, "host_delay": 0, "data_wait": 100 * US,
                          "own_collective": 0, "unexplained": 0}
    assert (c.cause, c.explained_frac) == ("data_wait", 1.0)


def test_other_group_collective_is_own_collective(tmp_path):
    """Rank 2 runs an all_gather of another process group ("7", ranks [2, 5]) 300..400 first,
    then its GEMM 400..500 (launched at 290, queued behind it on one stream's order)."""
    def gap(t):
        _collective(t, AG, "allgather", "7", (2, 5), 300, 400, 292, 4)
        t.gpu(GEMM, 7, 400, 500, corr=3, launch_ts=290)
        return 500
    c = _one(_job(tmp_path, gap)[2])
    assert c.split_ns == {"device_compute": 0, "host_delay": 0, "data_wait": 0,
                          "own_collective": 100 * US, "unexplained": 0}
    assert (c.cause, c.explained_frac) == ("own_collective", 1.0)


def test_mixed_causes_establish_none(tmp_path):
    """Rank 2 launches its GEMM at 345, it runs 350..500 (150 us): host delay 300..345 = 45,
    compute excess 50, launch latency 345..350 = 5 unexplained: no part reaches 80 %."""
    def gap(t):
        t.gpu(GEMM, 7, 350, 500, corr=3, launch_ts=345)
        return 500
    c = _one(_job(tmp_path, gap)[2])
    assert c.split_ns == {"device_compute": 50 * US, "host_delay": 45 * US, "data_wait": 0,
                          "own_collective": 0, "unexplained": 5 * US}
    assert c.cause is None and c.explained_frac == 0.5 < CAUSE_THRESHOLD


def test_no_skew_no_straggler(tmp_path):
    """Every rank as the peers: no start skew, nobody is a straggler."""
    assert _job(tmp_path, _peer)[2] == []


def test_excess_over_lateness_is_scaled(tmp_path):
    """Peers here launch their GEMM at 350 and run it 350..400 (host delay 50, compute 50);
    rank 2 runs its GEMM 300..500 (compute 200): excess 150 over a lateness of 100, scaled to
    100 (the parts never explain more than the lateness)."""
    def peer(t):
        t.gpu(GEMM, 7, 350, 400, corr=3, launch_ts=350)
        return 400

    def gap(t):
        t.gpu(GEMM, 7, 300, 500, corr=3, launch_ts=290)
        return 500
    c = _one(_job(tmp_path, gap, peer)[2])
    assert c.split_ns == {"device_compute": 100 * US, "host_delay": 0, "data_wait": 0,
                          "own_collective": 0, "unexplained": 0}
    assert (c.cause, c.explained_frac) == ("device_compute", 1.0)


def test_idle_with_work_queued_is_not_host_delay(tmp_path):
    """Rank 2's GEMM 300..450 (excess 50), then the device idles 450..500 while its next op
    (the all_reduce, launched at 395) is already queued: not host delay, unexplained 50."""
    def gap(t):
        t.gpu(GEMM, 7, 300, 450, corr=3, launch_ts=290)
        return 500
    c = _one(_job(tmp_path, gap)[2])
    assert c.split_ns == {"device_compute": 50 * US, "host_delay": 0, "data_wait": 0,
                          "own_collective": 0, "unexplained": 50 * US}
    assert c.cause is None and c.explained_frac == 0.5


def test_batched_equals_whole_table(tmp_path, monkeypatch):
    """crossrank.straggler_causes, one rank per batch, equals the whole-table reference."""
    def gap(t):
        t.gpu(GEMM, 7, 350, 500, corr=3, launch_ts=345)
        return 500
    job, off, want = _job(tmp_path, gap)
    from analyzer.ingest import pipeline
    monkeypatch.setattr(pipeline, "BATCH_BYTES", 1)
    assert crossrank.straggler_causes(job, off) == want
    assert straggler.straggler_causes_frame(
        job.collectives, crossrank.match_ranks(job, off)) == want
