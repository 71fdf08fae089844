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

import numpy as np
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
                          "own_collective": 0, "late_step_start": 0, "unexplained": 0}
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
                          "own_collective": 0, "late_step_start": 0, "unexplained": 5 * US}
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
                          "own_collective": 0, "late_step_start": 0, "unexplained": 0}
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
                          "own_collective": 100 * US, "late_step_start": 0, "unexplained": 0}
    assert (c.cause, c.explained_frac) == ("own_collective", 1.0)


def test_mixed_causes_establish_none(tmp_path):
    """Rank 2 launches its GEMM at 345, it runs 350..500 (150 us): host delay 300..345 = 45,
    compute excess 50, launch latency 345..350 = 5 unexplained: no part reaches 80 %."""
    def gap(t):
        t.gpu(GEMM, 7, 350, 500, corr=3, launch_ts=345)
        return 500
    c = _one(_job(tmp_path, gap)[2])
    assert c.split_ns == {"device_compute": 50 * US, "host_delay": 45 * US, "data_wait": 0,
                          "own_collective": 0, "late_step_start": 0, "unexplained": 5 * US}
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
                          "own_collective": 0, "late_step_start": 0, "unexplained": 0}
    assert (c.cause, c.explained_frac) == ("device_compute", 1.0)


def test_idle_with_work_queued_is_not_host_delay(tmp_path):
    """Rank 2's GEMM 300..450 (excess 50), then the device idles 450..500 while its next op
    (the all_reduce, launched at 395) is already queued: not host delay, unexplained 50."""
    def gap(t):
        t.gpu(GEMM, 7, 300, 450, corr=3, launch_ts=290)
        return 500
    c = _one(_job(tmp_path, gap)[2])
    assert c.split_ns == {"device_compute": 50 * US, "host_delay": 0, "data_wait": 0,
                          "own_collective": 0, "late_step_start": 0, "unexplained": 50 * US}
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
    whole = straggler.instance_rows(job.collectives, crossrank.match_ranks(job, off))
    assert straggler.causes(straggler.split_instances(straggler.bounded(whole))) == want


def test_late_step_start_is_its_own_part(tmp_path):
    """Rank 2 enters its step 100 us after its peers (ProfilerStep from 100, theirs from 0)
    and then does what they do, 100 us later: GEMM launched at step start + 10, running
    + 20..+ 120, all_reduce #0 launched at + 130, starting at + 140 (peers 140, rank 2 240;
    all end at 300). Its gap (step start .. + 140) holds the same compute (100) and host delay
    (10 + 10) as theirs: no gap part explains the 100 us; its anchor, the step's start, is
    100 us after the first peer's: late_step_start = the whole lateness."""
    Trace = _trace_cls()
    for r in range(3):
        t = Trace(rank=r, world_size=3)
        d = 100 if r == 2 else 0
        t.ann("ProfilerStep#1", d, 1000)
        t.gpu(GEMM, 7, d + 20, d + 120, corr=1, launch_ts=d + 10)
        _collective(t, AR, "allreduce", "0", (0, 1, 2), d + 140, 300, d + 130, 2)
        _collective(t, AR, "allreduce", "0", (0, 1, 2), _peer(t), 600, 395, 9)
        t.write(tmp_path / f"rank{r}.trace.json")
    job = api.load_tables(tmp_path, jobs=1)
    off = crossrank.clock_offsets(job)
    c = _one(crossrank.straggler_causes(job, off))
    assert c.split_ns == {"device_compute": 0, "host_delay": 0, "data_wait": 0,
                          "own_collective": 0, "late_step_start": 100 * US, "unexplained": 0}
    assert (c.cause, c.explained_frac) == ("late_step_start", 1.0)
    # analyzer summary's per-rank table names the same largest part
    from analyzer.analyses.summary import summarize
    row = summarize(job).stragglers.iloc[0]
    assert (row["rank"], row["largest_part"], row["late_step_start_ns"]) == \
        (2, "late_step_start", 100 * US)


def test_step_anchors_only_where_the_gap_starts_at_a_step_start():
    """Per row: the anchor (start - gap - the rank's offset) of a rank's first collective of
    each group inside a step; none for a later one (its anchor is the previous collective),
    one outside any step, a rank whose clock is not usable, or a rank without ProfilerStep
    (its one step starts when the profiler did)."""
    import pandas as pd

    coll = pd.DataFrame({"rank": [0, 0, 0, 1, 2, 3, 4], "pg": ["0", "0", "7", "0", "0", "0", "0"],
                         "seq": [0, 1, 0, 0, 0, 0, 0], "step": [5, 5, 5, 5, -1, 5, 5],
                         "start_ns": [1000, 2000, 1500, 1100, 900, 1000, 1000],
                         "gap_ns": [400, 300, 200, 100, 50, 10, 10]})
    off = pd.DataFrame({"rank": [0, 1, 2, 3, 4], "offset_ns": [0, -30, 0, 0, 0],
                        "clock": ["reference", "measured", "measured", "inconsistent",
                                  "measured"]})
    none = straggler.NO_ANCHOR
    assert straggler.step_anchors(coll, off, [4]).tolist() == [600, none, 1300, 1030, none,
                                                                none, none]


# --- the 8-rank DLRM corpus job, checked against a second, plain-Python computation ----------

def _merged(pairs):
    out = []
    for s, e in sorted(p for p in pairs if p[1] > p[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _minus(a, b):
    """Interval lists a \\ b (both merged), instant by instant."""
    out = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append([cur, bs])
            cur = max(cur, be)
        if cur < e:
            out.append([cur, e])
    return out


def _inside(a, lo, hi):
    return sum(max(0, min(e, hi) - max(s, lo)) for s, e in a)


def _gaps_by_hand(path, coll):
    """Per collective row of one GPU rank: (gap, compute, host, data, coll) by the module
    docstring's rule, from the event table with Python lists (no interval library)."""
    ev, steps = api.load_events(path)
    gpu = ev["is_gpu"].to_numpy(bool)
    role = ev["role"].astype(str).to_numpy()
    rule = ev["rule"].astype(str).to_numpy()
    s, e = ev["ts_ns"].to_numpy(), ev["end_ns"].to_numpy()
    step = ev["step"].to_numpy()
    launch = ev["launch_row"].to_numpy()
    htod = rule == "gpu.memcpy.htod"
    stray = gpu & (step < 0) & np.isin(role, ["comm", "compute", "memcpy", "memset", "sync"])
    data_rows = ((role == "data") & ~gpu) | (gpu & htod & ~stray)
    sets = {"C": gpu & (role == "comm") & ~stray, "K": gpu & (role == "compute") & ~stray,
            "O": (gpu & np.isin(role, ["memcpy", "memset", "sync"])) | stray, "D": data_rows}
    iv_ = {k: _merged(zip(s[m].tolist(), e[m].tolist())) for k, m in sets.items()}
    t0, t1 = int(min(s.min(), coll["start_ns"].min())), int(max(e.max(), coll["end_ns"].max()))
    busy = _merged([tuple(x) for k in "CKOD" for x in iv_[k]])
    idle = _minus([[t0, t1]], busy)
    dev = [i for i in np.flatnonzero(gpu & (sets["C"] | sets["K"] | sets["O"] | sets["D"]))]
    dev.sort(key=lambda i: (s[i], i))
    host = []
    for x, y in idle:
        nxt = next((i for i in dev if s[i] >= y), None)
        if nxt is not None and launch[nxt] >= 0:
            host.append([x, min(max(s[launch[nxt]], x), y)])
    compute = _minus(iv_["K"], iv_["C"])
    data = _minus(iv_["D"], _merged([tuple(x) for x in iv_["C"] + iv_["K"]]))
    cpu_start = dict(zip(steps["step"].tolist(), steps["cpu_start_ns"].tolist()))
    out, prev = {}, {}
    for r in coll.sort_values(["pg", "seq"]).itertuples():
        anchor = prev.get(r.pg, cpu_start.get(r.step, t0) if r.step >= 0 else t0)
        lo = min(anchor, r.start_ns)
        step_start = r.pg not in prev and r.step >= 0  # the anchor is the step's start
        out[(r.pg, r.seq)] = (r.start_ns - lo, _inside(compute, lo, r.start_ns),
                              _inside(host, lo, r.start_ns), _inside(data, lo, r.start_ns),
                              _inside(iv_["C"], lo, r.start_ns), lo if step_start else None)
        prev[r.pg] = r.end_ns
    return out


@pytest.mark.integration
def test_dlrm_straggler_split_by_hand(tmp_path):
    """DLRM, DDP on 8 V100 (corpus): the all_to_all waits for rank 7 (last at 4 of the 6
    all_to_all, 9.02 ms of start skew). Its split, recomputed here from the events by the
    rule in plain Python: the first all_to_all's 7.62 ms skew is rank 7 starting its step
    late (its ProfilerStep begins 7.51 ms after rank 1's on aligned clocks; nothing in its gap
    explains it): late_step_start, 83 % of the lateness, the cause."""
    import shutil
    import statistics

    from tests.corpus import CORPUS, need

    src = need(CORPUS / "dlrm_ddp_8rank_v100")
    for p in sorted(src.glob("worker*.pt.trace.json.gz")):
        shutil.copy(p, tmp_path / p.name)
    job = api.load_tables(tmp_path, jobs=2)
    off = crossrank.clock_offsets(job)
    got = crossrank.straggler_causes(job, off)
    coll = job.collectives
    hand = {}
    for rt in job.ranks:
        mine = coll[coll["rank"] == rt.rank]
        byhand = _gaps_by_hand(rt.path, mine)
        for r in mine.itertuples():
            hand[(rt.rank, r.pg, r.seq)] = byhand[(r.pg, r.seq)]
            assert byhand[(r.pg, r.seq)][:5] == (r.gap_ns, r.gap_compute_ns, r.gap_host_ns,
                                                 r.gap_data_ns, r.gap_coll_ns)
    # across ranks: aligned starts, last rank, skew, excess over the peers' median
    shift = dict(zip(off["rank"], off["offset_ns"]))
    split = {}
    for (pg, seq), g in coll.groupby(["pg", "seq"]):
        starts = {int(r.rank): int(r.start_ns) - int(shift[r.rank]) for r in g.itertuples()}
        last = max(sorted(starts), key=lambda k: starts[k])
        late = starts[last] - min(starts.values())
        if late <= 0:
            continue
        kind = g["kind"].iat[0]
        parts = [max(hand[(last, pg, seq)][1 + k]
                     - statistics.median(hand[(p, pg, seq)][1 + k] for p in starts if p != last),
                     0) for k in range(4)]
        # late_step_start: its step-start anchor after the earliest peer's, aligned clocks
        anchors = {p: hand[(p, pg, seq)][5] - int(shift[p]) for p in starts
                   if hand[(p, pg, seq)][5] is not None}
        peers = [a for p, a in anchors.items() if p != last]
        parts.append(max(anchors[last] - min(peers), 0) if last in anchors and peers else 0)
        f = min(1.0, late / sum(parts)) if sum(parts) else 1.0
        acc = split.setdefault((last, kind), [0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
        acc[0] += late
        for k in range(5):
            acc[1 + k] += parts[k] * f
        acc[6] += late - sum(p * f for p in parts)
    want = sorted(split.items(), key=lambda kv: (-kv[1][0], kv[0]))
    assert [(c.rank, c.kind) for c in got] == [k for k, _ in want]
    for c, (_, v) in zip(got, want):
        assert c.late_ns == v[0]
        assert [c.split_ns[k] for k in (*straggler.NAMED, "unexplained")] == \
            pytest.approx(v[1:], abs=1e-6)
    top = got[0]
    assert (top.rank, top.kind, top.times_last, top.late_ns) == (7, "all_to_all", 4, 9_019_500)
    assert top.split_ns == pytest.approx({"device_compute": 21_000, "host_delay": 1_235_000,
                                          "data_wait": 57_000, "own_collective": 0,
                                          "late_step_start": 7_513_500, "unexplained": 193_000})
    assert top.cause == "late_step_start"
    assert top.explained_frac == pytest.approx(7_513_500 / 9_019_500)


# --- CPU (gloo) ranks: compute = main-thread ops, host delay = nothing recorded -----------------

def _cpu_rank(rank: int, gap) -> dict:
    """A gloo rank (whole us): ProfilerStep 0..1000, aten::mm 10..100, all_reduce #0 enqueued
    110..113, gloo:all_reduce 115..300 (ends together); then ``gap(ev)`` returns the start of
    all_reduce #1's enqueue op (3 us); its gloo op runs from 2 us after that to 600."""
    from tests.merge.builders import meta, x

    pid, main, gloo = 1000 + rank, 1000 + rank, 2000 + rank
    ev = [meta(pid, 0, "process_name", name="python3"),
          meta(pid, main, "thread_name", name=f"thread {main} (python3)"),
          meta(pid, gloo, "thread_name", name=f"thread {gloo} (pt_gloo_runloop)"),
          x("ProfilerStep#0", 0, 1000, pid=pid, tid=main, cat="user_annotation"),
          x("aten::mm", 10, 90, pid=pid, tid=main)]
    args = {"Process Group Name": "0", "Process Group Ranks": "[0, 1, 2]", "Group size": 3,
            "dtype": "Float", "In msg nelems": 1024, "Out msg nelems": 1024}

    def allreduce(enq: int, end: int) -> None:
        ev.append(x("c10d::allreduce_", enq, 3, pid=pid, tid=main, **args))
        ev.append(x("gloo:all_reduce", enq + 5, end - enq - 5, pid=pid, tid=gloo))
    allreduce(110, 300)
    allreduce(gap(ev, pid, main, x), 600)
    return {"schemaVersion": 1, "traceEvents": ev,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 3}}


def _cpu_peer(ev, pid, main, x) -> int:
    """aten::mm 300..400, then all_reduce #1 enqueued at 400 (gap 300..405: compute 100,
    the enqueue op 3, nothing recorded 403..405)."""
    ev.append(x("aten::mm", 300, 100, pid=pid, tid=main))
    return 400


def _cpu_job(tmp_path: Path, gap):
    from tests.merge.builders import write

    for r in range(3):
        write(tmp_path / f"rank{r}.trace.json", _cpu_rank(r, gap if r == 2 else _cpu_peer))
    job = api.load_tables(tmp_path, jobs=1)
    assert job.ranks[0].device_kind == "cpu"
    return crossrank.straggler_causes(job, crossrank.clock_offsets(job))


def test_cpu_python_gap_is_host_delay(tmp_path):
    """Rank 2: aten::mm 300..400, then nothing recorded until its enqueue at 500."""
    def gap(ev, pid, main, x):
        ev.append(x("aten::mm", 300, 100, pid=pid, tid=main))
        return 500
    c = _one(_cpu_job(tmp_path, gap))
    assert c.split_ns == {"device_compute": 0, "host_delay": 100 * US, "data_wait": 0,
                          "own_collective": 0, "late_step_start": 0, "unexplained": 0}
    assert c.cause == "host_delay"


def test_cpu_longer_op_is_compute(tmp_path):
    """Rank 2: aten::mm 300..500 (peers 100 us)."""
    def gap(ev, pid, main, x):
        ev.append(x("aten::mm", 300, 200, pid=pid, tid=main))
        return 500
    c = _one(_cpu_job(tmp_path, gap))
    assert c.split_ns == {"device_compute": 100 * US, "host_delay": 0, "data_wait": 0,
                          "own_collective": 0, "late_step_start": 0, "unexplained": 0}
    assert c.cause == "device_compute"


def test_cpu_dataloader_is_data_wait(tmp_path):
    """Rank 2: aten::mm 300..400, then a DataLoader __next__ range 400..500."""
    def gap(ev, pid, main, x):
        ev.append(x("aten::mm", 300, 100, pid=pid, tid=main))
        ev.append(x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 400, 100,
                    pid=pid, tid=main, cat="user_annotation"))
        return 500
    c = _one(_cpu_job(tmp_path, gap))
    assert c.split_ns == {"device_compute": 0, "host_delay": 0, "data_wait": 100 * US,
                          "own_collective": 0, "late_step_start": 0, "unexplained": 0}
    assert c.cause == "data_wait"


def test_summary_table_carries_the_cause(tmp_path):
    """``analyzer summary``'s straggler table: per rank over all kinds, the same split, its
    lateness the table's own skew_caused_ns."""
    from analyzer.analyses.summary import summarize

    def gap(t):
        t.gpu(GEMM, 7, 300, 500, corr=3, launch_ts=290)
        return 500
    job, _, _ = _job(tmp_path, gap)
    row = summarize(job).stragglers.iloc[0]
    assert (row["rank"], row["skew_caused_ns"], row["cause"], row["largest_part"]) == \
        (2, 100 * US, "device_compute", "device_compute")
    assert (row["device_compute_ns"], row["unexplained_ns"], row["explained_frac"]) == \
        (100 * US, 0, 1.0)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["a100_ddp_rank0_nccl_args.json.gz", "cpu_gloo_ddp_rank34.json.gz",
                                  "b200_allgather_rank0.json.gz"])
def test_gap_parts_are_disjoint_on_real_traces(name):
    """On real single-rank traces (GPU and gloo CPU): every gap is >= 0 and its four parts,
    disjoint by rule, sum to at most the gap."""
    from tests.corpus import corpus

    from analyzer.analyses.collectives import rank_collectives

    ev, steps = api.load_events(corpus(f"single/{name}"))
    coll = rank_collectives(0, ev)
    assert len(coll)
    g = straggler.gap_parts(ev, coll, steps, ev.attrs["device_kind"], ev.attrs["main_tid"])
    assert (g["gap_ns"] >= 0).all()
    assert (g[list(straggler.PARTS.values())].sum(axis=1) <= g["gap_ns"]).all()
    assert (g[list(straggler.PARTS.values())] >= 0).all().all()


def test_report_json_carries_the_stragglers(tmp_path):
    """``analyzer report``'s analysis (compare/runs.py) fills RunEntry.stragglers, and
    report.json round-trips it."""
    import msgspec

    from analyzer.compare.runs import analyse
    from analyzer.contract.report_types import Report

    def gap(t):
        t.ann("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 300, 400)
        t.gpu(GEMM, 7, 400, 500, corr=3, launch_ts=400)
        return 500
    _, _, want = _job(tmp_path, gap)
    rep = analyse(tmp_path)
    assert rep.runs[0].stragglers == want and want[0].cause == "data_wait"
    back = msgspec.json.decode(msgspec.json.encode(rep), type=Report)
    assert back.runs[0].stragglers == want
