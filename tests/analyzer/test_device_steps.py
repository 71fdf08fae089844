"""The step rule (analyzer/ingest/steps.py): one ProfilerStep track, device windows that tile the
device timeline, work with no launch in the trace left out, steps without device work flagged.

Hand-built traces are written in each test (times in µs; the analyzer works in ns, so x1000);
every expected figure is worked out in the comment above it. What must hold on every public
GPU trace (windows never overlap, the breakdown adds up, summed idle <= the trace's device idle)
is checked in test_gpu_corpus_rules.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from analyzer.api import load_tables
from analyzer.compare.runs import _trace_figures
from analyzer.contract.errors import BadInput
from tests.corpus import corpus

US = 1000
PARTS = ["compute_ns", "exposed_comm_ns", "data_wait_ns", "other_ns", "idle_ns"]


def span(n, ts, dur, tid=1):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 100,
            "tid": tid, "ts": ts, "dur": dur}


def launch(ts, corr, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100,
            "tid": tid, "ts": ts, "dur": 1, "args": {"correlation": corr}}


def kernel(name, ts, dur, corr=None, stream=7):
    args = {"device": 0, "stream": stream}
    if corr is not None:
        args["correlation"] = corr
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts,
            "dur": dur, "args": args}


def cpu_op(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": tid, "ts": ts,
            "dur": dur}


def write(path, events, rank=0, world=1):
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {
        "backend": "nccl", "rank": rank, "world_size": world}, "traceEvents": events}))
    return path


def by_step(jt):
    b = jt.breakdown.set_index("step")
    assert (b[PARTS].sum(axis=1) == b["step_ns"]).all()  # the identity, exact integers
    return b


def test_gpu_behind_cpu_gets_windows_that_tile(tmp_path):
    # CPU: #1 [0,100), #2 [100,200). Step 1 launches k1 (runs [50,150)) and k2 ([150,210));
    # step 2 launches k3 ([220,300)) and k4 ([300,320)). The old rule (CPU span extended to
    # its work's end) gave [0,210) and [100,320): overlapping.
    # a_1 = 50, a_2 = 220 -> window 1 = [50,220) = 170, window 2 = [220,320) = 100 (the last:
    # a_2 + its CPU span 100 = 320 = the end of its work). Window 1: compute [50,210) = 160,
    # idle [210,220) = 10 (the GPU waiting for step 2's launches). Window 2: compute 100,
    # idle 0.
    # Device idle of the trace: [50,320) = 270 minus busy 260 = 10 = the summed idle.
    ev = [span(1, 0, 100), span(2, 100, 100),
          launch(10, 1), kernel("k1", 50, 100, 1), launch(20, 2), kernel("k2", 150, 60, 2),
          launch(110, 3), kernel("k3", 220, 80, 3), launch(120, 4), kernel("k4", 300, 20, 4)]
    jt = load_tables(write(tmp_path / "t.json", ev))
    b = by_step(jt)
    assert b.loc[1, "step_start_ns"] == 50 * US and b.loc[1, "step_ns"] == 170 * US
    assert b.loc[2, "step_start_ns"] == 220 * US and b.loc[2, "step_ns"] == 100 * US
    assert (b.loc[1, "compute_ns"], b.loc[1, "idle_ns"]) == (160 * US, 10 * US)
    assert (b.loc[2, "compute_ns"], b.loc[2, "idle_ns"]) == (100 * US, 0)
    assert list(b["cpu_step_ns"]) == [100 * US, 100 * US] and b["device_work"].all()
    assert b["idle_ns"].sum() == 10 * US


def test_work_spilling_past_a_boundary_counts_in_the_next_window(tmp_path):
    # #1 [0,100), #2 [100,200). Step 1: kA (stream 7) [20,80), all_reduce kB (stream 20)
    # [60,140); step 2: kC (stream 7) [120,170). a_1 = 20, a_2 = 120:
    # window 1 = [20,120) = 100: K [20,80) = 60, C = kB's part [60,120) = 60, overlap [60,80)
    #   = 20, exposed 40, idle 100 - 60 - 40 = 0.
    # window 2 (the last) = [a_2, a_2 + CPU span 100) = [120,220) = 100, later than its last
    #   work (170): K = 50, C = kB's spill [120,140) = 20, all under kC: overlap 20, exposed
    #   0, idle [170,220) = 50.
    ev = [span(1, 0, 100), span(2, 100, 100),
          launch(10, 1), kernel("kA", 20, 60, 1),
          launch(30, 2), kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 60, 80, 2, stream=20),
          launch(110, 3), kernel("kC", 120, 50, 3)]
    b = by_step(load_tables(write(tmp_path / "t.json", ev)))
    assert (b.loc[1, "step_ns"], b.loc[2, "step_ns"]) == (100 * US, 100 * US)
    assert (b.loc[1, "compute_ns"], b.loc[1, "comm_ns"], b.loc[1, "overlap_ns"]) == \
        (60 * US, 60 * US, 20 * US)
    assert (b.loc[1, "exposed_comm_ns"], b.loc[1, "idle_ns"]) == (40 * US, 0)
    assert (b.loc[2, "compute_ns"], b.loc[2, "comm_ns"], b.loc[2, "overlap_ns"]) == \
        (50 * US, 20 * US, 20 * US)
    assert b.loc[2, "idle_ns"] == 50 * US


def test_device_work_without_a_launch_is_left_out_and_named(tmp_path):
    # An all_reduce [5,35) and a gemm [35,45) whose launches are not in the trace (queued
    # before the profiler started: correlations 900, 901 have no runtime event); step 1
    # ([0,100)) launches k1, running [50,90). Window = [50, 50 + CPU span 100) = [50,150):
    # compute 40, idle 60; the two un-launched events run before it: in no step, no window
    # and no collective, and a note names them: 2 events, 40 µs, 1 of them communication,
    # 0.0 ms of it inside step windows.
    ev = [span(1, 0, 100),
          kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 5, 30, 900, stream=20),
          kernel("gemm_early", 35, 10, 901),
          launch(10, 1), kernel("k1", 50, 40, 1)]
    jt = load_tables(write(tmp_path / "t.json", ev))
    b = by_step(jt)
    assert (b.loc[1, "step_start_ns"], b.loc[1, "step_ns"]) == (50 * US, 100 * US)
    assert (b.loc[1, "compute_ns"], b.loc[1, "comm_ns"], b.loc[1, "other_ns"],
            b.loc[1, "idle_ns"]) == (40 * US, 0, 0, 60 * US)
    assert jt.collectives.empty
    note = next(w for w in jt.ranks[0].warnings if "no launch in the trace" in w)
    assert note.startswith("2 device events (0.0 ms)")
    assert "0.000 ms of it runs inside step windows" in note
    # the all_reduce (30 µs) is communication and the longest name in total
    assert "1 of them communication" in note and "longest in total ncclKernel_AllReduce" in note


def test_without_launch_links_device_work_goes_by_start_time(tmp_path):
    # No correlation on the kernels: each goes to the span containing its start. k1 [10,60)
    # -> step 1, k2 [120,150) -> step 2. Windows [10,120) = 110 and, the last, [120, 120 + CPU
    # span 100) = 100 with idle [150,220) = 70.
    ev = [span(1, 0, 100), span(2, 100, 100), kernel("k1", 10, 50), kernel("k2", 120, 30)]
    jt = load_tables(write(tmp_path / "t.json", ev))
    b = by_step(jt)
    assert (b.loc[1, "step_ns"], b.loc[1, "idle_ns"]) == (110 * US, 60 * US)
    assert (b.loc[2, "step_ns"], b.loc[2, "idle_ns"]) == (100 * US, 70 * US)
    assert any("no launch link" in w for w in jt.ranks[0].warnings)


def test_one_profiler_step_track_per_rank(tmp_path):
    # CPU rank. Thread 1 holds #1 [0,1000) and #2 [1000,2000); thread 2 holds one #1
    # [300,1300). Merging per step number made step 1 [0,1300) = 1.30 ms; the track is thread
    # 1 (most spans), so step 1 = [0,1000) = 1.00 ms, and thread 2's span is named as ignored.
    ev = [span(1, 0, 1000), span(2, 1000, 1000), span(1, 300, 1000, tid=2),
          cpu_op("aten::mm", 100, 200), cpu_op("aten::mm", 1100, 200)]
    jt = load_tables(write(tmp_path / "t.json", ev))
    b = by_step(jt)
    assert b.loc[1, "step_ns"] == 1000 * US and b.loc[2, "step_ns"] == 1000 * US
    assert any("thread(s) 2 ignored" in w for w in jt.ranks[0].warnings)


def test_the_track_is_the_thread_of_most_spans_then_first_span_then_tid(tmp_path):
    # Threads 9 and 3 hold two spans each, thread 5 one. 9 and 3 tie on count; 9's first span
    # (0) is before 3's (50): the track is 9. The others are named in that order: 3 (2 spans,
    # first at 50), then 5 (1 span). On 9, two spans numbered 4 are one step [0, 900): the
    # earliest start, the latest end; step 6 [900, 1500) follows it.
    ev = [span(4, 0, 400, tid=9), span(4, 300, 600, tid=9), span(6, 900, 600, tid=9),
          span(1, 50, 100, tid=3), span(2, 200, 100, tid=3), span(1, 0, 2000, tid=5),
          cpu_op("aten::mm", 100, 200, tid=9), cpu_op("aten::mm", 1000, 200, tid=9)]
    jt = load_tables(write(tmp_path / "t.json", ev))
    steps = jt.ranks[0].steps
    assert steps[["step", "cpu_start_ns", "cpu_end_ns"]].values.tolist() == [
        [4, 0, 900 * US], [6, 900 * US, 1500 * US]]
    assert "3 ProfilerStep span(s) on thread(s) 3, 5 ignored: one ProfilerStep track per " \
        "rank, thread 9 (the one with the most spans)" in jt.ranks[0].warnings


def test_overlapping_spans_are_clipped_at_the_next_start(tmp_path):
    # #1 [0,120) overlaps #2 [100,200): #1 is clipped to [0,100).
    ev = [span(1, 0, 120), span(2, 100, 100), cpu_op("aten::mm", 10, 20),
          cpu_op("aten::mm", 110, 20)]
    jt = load_tables(write(tmp_path / "t.json", ev))
    st = jt.ranks[0].steps.set_index("step")
    assert (st.loc[1, "cpu_start_ns"], st.loc[1, "cpu_end_ns"]) == (0, 100 * US)
    assert by_step(jt).loc[1, "step_ns"] == 100 * US
    assert any("clipped at the next span's start" in w for w in jt.ranks[0].warnings)


def test_op_starting_before_its_span_is_clipped_not_dropped(tmp_path):
    # CPU rank, #1 [100,200). aten::mm [50,150) starts before the span and ends inside it: it
    # belongs to step 1, clipped to [100,150) = 50 of compute (the old rule dropped it and
    # reported those 50 µs as idle). aten::add [160,180): 20. compute 70, idle 30.
    ev = [span(1, 100, 100), cpu_op("aten::mm", 50, 100), cpu_op("aten::add", 160, 20)]
    b = by_step(load_tables(write(tmp_path / "t.json", ev)))
    assert (b.loc[1, "step_ns"], b.loc[1, "compute_ns"], b.loc[1, "idle_ns"]) == \
        (100 * US, 70 * US, 30 * US)


def test_truncated_last_step_without_device_work_is_flagged_and_left_out(tmp_path):
    # #1 [0,100) launches k [20,90); #2 [100,105) launches nothing (cut short). Step 1 is the
    # last step with device work: window 1 = [20, 20 + CPU span 100) = [20,120) = 100, idle
    # 30; step 2 gets the empty window [120,120), device_work False, a note, and is left out
    # of the step times (the report's median is over [100 µs] only).
    ev = [span(1, 0, 100), span(2, 100, 5), launch(10, 1), kernel("k", 20, 70, 1)]
    jt = load_tables(write(tmp_path / "t.json", ev))
    b = by_step(jt)
    assert b.loc[1, "step_ns"] == 100 * US and bool(b.loc[1, "device_work"])
    assert b.loc[2, "step_ns"] == 0 and not bool(b.loc[2, "device_work"])
    assert b.loc[2, "cpu_step_ns"] == 5 * US
    assert any(w.startswith("step(s) 2 launched no device work") for w in jt.ranks[0].warnings)
    fields, step_ns, _ = _trace_figures(jt)
    assert step_ns == [100 * US] and fields["profiled_steps"] == 1


def test_metadata_only_rank_is_an_empty_rank(tmp_path):
    # rank 0 has one step (window [20,90) as above); rank 1's file holds only metadata.
    job = tmp_path / "job"
    job.mkdir()
    write(job / "rank0.json", [span(1, 0, 100), launch(10, 1), kernel("k", 20, 70, 1)], 0, 2)
    write(job / "rank1.json", [{"ph": "M", "name": "process_name", "pid": 1,
                                "args": {"name": "python"}}], 1, 2)
    jt = load_tables(job)
    assert [r.rank for r in jt.ranks] == [0, 1] and jt.ranks[1].empty
    assert jt.ranks[1].device_kind == "gpu"
    assert list(jt.breakdown["rank"]) == [0]
    assert any("rank 1" in w and "empty rank" in w for w in jt.warnings)
    # a single metadata-only file is still refused
    with pytest.raises(BadInput) as exc:
        load_tables(job / "rank1.json")
    assert exc.value.reason == "no_events"


def test_an_empty_rank_is_not_averaged_into_per_rank_figures(tmp_path):
    # rank 0: one step launching one all_reduce kernel [20,60) and a compute kernel [60,90);
    # rank 1 metadata-only. Per rank means are over ranks with events: 1 all_reduce per step
    # (averaging rank 1 in as zero gave 0.5), 40 µs of it, union 40 µs <= sum 40 µs.
    from analyzer.compare import runs

    job = tmp_path / "job"
    job.mkdir()
    write(job / "rank0.json", [span(1, 0, 100), launch(10, 1),
                               kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 20, 40, 1),
                               launch(12, 2), kernel("k", 60, 30, 2)], 0, 2)
    write(job / "rank1.json", [{"ph": "M", "name": "process_name", "pid": 1,
                                "args": {"name": "python"}}], 1, 2)
    r = runs.analyse(job).runs[0]
    ar = r.communication["all_reduce"]
    assert (ar.count, ar.count_per_step, ar.time_ns_per_step) == (1, 1, 40 * US)
    assert r.comm_ns_per_step == 40 * US
    assert all(n.startswith("rank ") for n in r.trace_info.trace_warnings)


# --- the public GPU traces ----------------------------------------------------------------

@pytest.mark.integration
def test_corpus_v100_device_step_is_close_to_the_cpu_step():
    # CPU steps of 35-96 ms used to become windows of 101-185 ms (the GPU runs a step behind);
    # the device windows now match the CPU's pace: medians within 2 %.
    jt = load_tables(corpus("single/v100_ddp_subus_timestamps.json.gz"), jobs=1)
    b = jt.breakdown
    dev, cpu = float(np.median(b["step_ns"])), float(np.median(b["cpu_step_ns"]))
    assert abs(dev - cpu) <= 0.02 * cpu
    assert b["step_ns"].max() < 100e6


def test_whole_trace_gpu_window_is_the_launched_device_work(tmp_path):
    # No ProfilerStep. CPU ops [0,1000). Kernel k0 [5,15) has no launch (queued before the
    # profiler started); k1 [100,300) and k2 [400,450) are launched. Step 0's window = the
    # launched device work's extent [100,450) = 350 (the old rule: the whole trace [0,1000)
    # with 650 of "idle" in which the GPU was not even given work yet): compute 250, idle
    # [300,400) = 100 = the trace's device idle inside that extent. k0 is left out, noted;
    # the CPU step is the whole trace, 1000.
    ev = [cpu_op("aten::train", 0, 1000), launch(50, 1), kernel("k1", 100, 200, 1),
          launch(60, 2), kernel("k2", 400, 50, 2), kernel("k0", 5, 10)]
    jt = load_tables(write(tmp_path / "t.json", ev))
    b = by_step(jt)
    assert jt.whole_trace_mode
    assert (b.loc[0, "step_start_ns"], b.loc[0, "step_ns"]) == (100 * US, 350 * US)
    assert (b.loc[0, "compute_ns"], b.loc[0, "idle_ns"]) == (250 * US, 100 * US)
    assert b.loc[0, "cpu_step_ns"] == 1000 * US
    notes = " ".join(jt.ranks[0].warnings)
    assert "1 device events (0.0 ms) have no launch in the trace" in notes


# --- issue 32: the last step's window, work of no step inside a window, out-of-step calls ----

def test_last_step_window_reads_as_if_another_step_followed(tmp_path):
    # One step: #1 [0,100) launches k [20,70). The same step followed by another: #2
    # [100,200) launches the same k 100 later, [120,170). Two steps: window 1 = [a_1, a_2) =
    # [20,120) = 100 (compute 50, idle 50). One step: no a_2, so window 1 ends at a_1 + its
    # CPU span = 20 + 100 = 120, later than its last work (70): the same 100, idle 50. (The
    # old rule ended it at its last work: 50, idle 0.)
    one = [span(1, 0, 100), launch(10, 1), kernel("k", 20, 50, 1)]
    two = one + [span(2, 100, 100), launch(110, 2), kernel("k", 120, 50, 2)]
    b1 = by_step(jt1 := load_tables(write(tmp_path / "one.json", one)))
    b2 = by_step(load_tables(write(tmp_path / "two.json", two)))
    for b in (b1, b2):
        assert (b.loc[1, "step_start_ns"], b.loc[1, "step_ns"]) == (20 * US, 100 * US)
        assert (b.loc[1, "compute_ns"], b.loc[1, "idle_ns"]) == (50 * US, 50 * US)
    assert (b2.loc[2, "step_ns"], b2.loc[2, "idle_ns"]) == (100 * US, 50 * US)
    note = next(w for w in jt1.ranks[0].warnings if "step 1's device window" in w)
    assert "ends at its first device work + its CPU ProfilerStep span (0.100 ms), 0.050 ms " \
        "after its last device work" in note


def test_last_step_window_of_a_device_behind_the_cpu_ends_at_its_work(tmp_path):
    # The GPU runs behind: #1 [0,100) launches k [20,300). Followed by #2 [100,200) whose k
    # (launched at 110) queues behind it, [300,350): window 1 = [20,300) = 280. Alone: a_1 +
    # CPU span = 120 < its last work's end 300, so the window ends at 300: 280 again, idle 0;
    # the note says the device ran behind the CPU (by 300 - 120 = 180 µs).
    one = [span(1, 0, 100), launch(10, 1), kernel("k", 20, 280, 1)]
    two = one + [span(2, 100, 100), launch(110, 2), kernel("k", 300, 50, 2)]
    jt1 = load_tables(write(tmp_path / "one.json", one))
    for jt in (jt1, load_tables(write(tmp_path / "two.json", two))):
        b = by_step(jt)
        assert (b.loc[1, "step_ns"], b.loc[1, "idle_ns"]) == (280 * US, 0)
    note = next(w for w in jt1.ranks[0].warnings if "step 1's device window" in w)
    assert "ends at its last device work, 0.180 ms after its first device work + its CPU " \
        "ProfilerStep span (0.100 ms)" in note


def test_device_work_of_no_step_inside_a_window_is_other_not_idle(tmp_path):
    # #1 [0,100) launches k1 [20,40) and k2 [80,100). An all_reduce with no launch in the
    # trace (queued before the profiler started, correlation 900) runs [35,65); a kernel
    # launched at 105, outside every span, runs [110,115). Window 1 = [20, 20 + 100) =
    # [20,120) = 100. K = [20,40) ∪ [80,100) = 40 (the all_reduce's [35,40) is under k1:
    # compute first); other = [40,65) + [110,115) = 30 (the GPU was busy, not idle); idle =
    # 100 - 40 - 30 = 30. Neither is the step's: comm 0, no collective counted. (The old rule
    # counted both as idle: 60.)
    ev = [span(1, 0, 100), launch(10, 1), kernel("k1", 20, 20, 1), launch(30, 2),
          kernel("k2", 80, 20, 2),
          kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 35, 30, 900, stream=20),
          launch(105, 3), kernel("k_out", 110, 5, 3)]
    jt = load_tables(write(tmp_path / "t.json", ev))
    b = by_step(jt)
    assert b.loc[1, "step_ns"] == 100 * US
    assert (b.loc[1, "compute_ns"], b.loc[1, "comm_ns"], b.loc[1, "other_ns"],
            b.loc[1, "idle_ns"]) == (40 * US, 0, 30 * US, 30 * US)
    notes = " ".join(jt.ranks[0].warnings)
    # inside the window: the all_reduce's [35,65) = 30 µs, k_out's [110,115) = 5 µs
    assert "0.030 ms of it runs inside step windows, counted there as other (not idle)" in notes
    assert "0.005 ms of it runs inside step windows" in notes
    assert "were launched outside every ProfilerStep" in notes


def test_whole_trace_work_without_a_launch_inside_the_extent_is_other(tmp_path):
    # No ProfilerStep: launched k1 [100,200) and k2 [300,400); k0 (no launch in the trace)
    # runs [250,270), inside the launched work's extent [100,400) = 300: compute 200, other
    # 20, idle 80 (the old rule: idle 100).
    ev = [cpu_op("aten::train", 0, 500), launch(50, 1), kernel("k1", 100, 100, 1),
          launch(60, 2), kernel("k2", 300, 100, 2), kernel("k0", 250, 20)]
    b = by_step(load_tables(write(tmp_path / "t.json", ev)))
    assert (b.loc[0, "step_ns"], b.loc[0, "compute_ns"], b.loc[0, "other_ns"],
            b.loc[0, "idle_ns"]) == (300 * US, 200 * US, 20 * US, 80 * US)


AR = "ncclKernel_AllReduce_RING_LL_Sum_float"


def test_collective_tables_leave_out_calls_launched_outside_every_step(tmp_path):
    # One step #1 [100,200). all_reduces launched at 50 (before it, runs [60,70)), at 110
    # (inside, [120,130)) and at 210 (after it, [220,230)). The note says the two outside
    # calls are left out; every collective table agrees: 1 call of 10 µs (report per kind,
    # per rank and per process group, summary per kind), not 3 and 30 µs. The per-instance
    # table keeps all three (step -1 for two of them) for cross-rank matching.
    from analyzer.analyses.summary import summarize
    from analyzer.compare import runs

    ev = [span(1, 100, 100), launch(50, 1), kernel(AR, 60, 10, 1, stream=20),
          launch(110, 2), kernel(AR, 120, 10, 2, stream=20),
          launch(210, 3), kernel(AR, 220, 10, 3, stream=20)]
    path = write(tmp_path / "t.json", ev)
    jt = load_tables(path)
    assert sorted(jt.collectives["step"].tolist()) == [-1, -1, 1]
    note = next(w for w in jt.ranks[0].warnings if "launched outside every ProfilerStep" in w)
    assert note.startswith("2 device events") and "2 of them communication" in note
    assert "left out of steps and the collective tables (calls, time, bytes)" in note
    r = runs.analyse(path).runs[0]
    ar = r.communication["all_reduce"]
    assert (ar.count, ar.time_ns, ar.count_per_step) == (1, 10 * US, 1)
    assert [(c.count, c.time_ns) for c in r.comm_ranks] == [(1, 10 * US)]
    assert [(g.count, g.time_ns) for g in r.comm_groups] == [(1, 10 * US)]
    k = summarize(jt).by_kind
    assert (k["count"].tolist(), k["time_ns"].tolist()) == ([1], [10 * US])
