"""FSDP prefetch on hand-built event tables with exact answers (worked out by hand below)."""

from __future__ import annotations

import pandas as pd
import pytest

from analyzer.analyses import crossrank, prefetch
from tests.reports.builders import event, events


def run_sums(table: pd.DataFrame) -> dict | None:
    """The report's run-level prefetch sums (``crossrank.prefetch_parts``) of ``table``, the
    job's one batch of ranks."""

    class OneBatch:
        def batches(self, name):
            return [(None, table)]

    parts = crossrank.prefetch_parts(OneBatch())
    return None if parts is None else parts[1]


def ann(name, ts, end, **kw):
    return event(name, ts, end, role="annotation", cat="user_annotation", **kw)


def kernel(name, ts, end, *, role="compute", stream=7, corr=-1, coll_kind=None):
    return event(name, ts, end, role=role, cat="kernel", tid="stream", is_gpu=True, stream=stream,
                 correlation=corr, coll_kind=coll_kind)


def launch(ts, corr):
    return event("cudaLaunchKernel", ts, ts + 5, role="other", cat="cuda_runtime", correlation=corr)


def gpu_fsdp2():
    """GPU-shaped FSDP2 step: all_gather kernels on comm stream 20, compute kernels on stream 7.

    compute union: [400,600] [900,950] [1500,2500] [3000,3100] [3500,4500] [5500,5600]
    need = ready time of the copy-out kernel = max(its launch call, end of the previous op on
    stream 7) (GPU need, analyzer/analyses/prefetch.py):
    unit 2 (forward):  issue 120, exec 300..800, covered 400..600 = 200 -> 0.4;
                       copy-out kernel (corr 5, launched 860, previous gemm ends 600):
                       need 860 -> slack +60
    unit 1 (backward): issue 1100, exec 2000..3000, covered 2000..2500 = 500 -> 0.5;
                       corr 7 kernel (launched 1460, previous gemm ends 2500): need 2500 ->
                       slack -500 (stream 7 idle 2500..3000 waiting for the all_gather)
    unit 0 (backward, prefetched): issue 1310, exec 3000..5000, covered 100 + 1000 -> 0.55;
                       corr 9 kernel (launched 2010, previous gemm ends 4500): need 4500 ->
                       slack -500
    """
    rows = [
        ann("ProfilerStep#0", 0, 10000), ann("FSDP::pre_forward (2)", 100, 900),
        ann("FSDP::all_gather (2)", 120, 200), ann("FSDP::all_gather_copy_out (2)", 850, 880),
        launch(860, 5),
        ann("FSDP::pre_backward (1)", 1000, 1500), ann("FSDP::all_gather (1)", 1100, 1200),
        ann("FSDP::backward_prefetch for 0", 1300, 1400), ann("FSDP::all_gather (0)", 1310, 1390),
        ann("FSDP::all_gather_copy_out (1)", 1450, 1480), launch(1460, 7),
        ann("FSDP::pre_backward (0)", 1990, 2100),
        ann("FSDP::all_gather_copy_out (0)", 2000, 2050), launch(2010, 9),
        kernel("ncclDevKernel_AllGather", 300, 800, role="comm", stream=20, coll_kind="all_gather"),
        kernel("ncclDevKernel_AllGather", 2000, 3000, role="comm", stream=20, coll_kind="all_gather"),
        kernel("ncclDevKernel_AllGather", 3000, 5000, role="comm", stream=20, coll_kind="all_gather"),
        kernel("gemm", 400, 600), kernel("copy_out", 900, 950, corr=5), kernel("gemm", 1500, 2500),
        kernel("copy_out", 3000, 3100, corr=7), kernel("gemm", 3500, 4500),
        kernel("copy_out", 5500, 5600, corr=9),
    ]
    return events(rows)


def test_gpu_fsdp2_hidden_fraction_and_slack():
    ev = gpu_fsdp2()
    assert prefetch.detect_labels(ev) == "fsdp2"
    t = prefetch.prefetch_table(ev, rank=0).set_index("unit")
    assert list(t.index) == ["2", "1", "0"]
    assert list(t["phase"]) == ["forward", "backward", "backward"]
    assert list(t["prefetched"]) == [False, False, True]
    assert list(t["issued_ns"]) == [120, 1100, 1310]
    assert list(t["finished_ns"]) == [800, 3000, 5000]
    assert list(t["need_ns"]) == [860, 2500, 4500]
    assert list(t["slack_ns"]) == [60, -500, -500]
    assert list(t["hidden_frac"]) == [pytest.approx(0.4), pytest.approx(0.5), pytest.approx(0.55)]
    s = run_sums(t.reset_index())
    assert (s["comm_ns"], s["hidden_ns"], s["late"], s["prefetched"]) == (3500, 1800, 2, 1)
    assert s["wait_ns"] == 1000
    assert s["hidden_frac"] == pytest.approx(1800 / 3500)


def cpu_fsdp1():
    """CPU/gloo FSDP1 step (labels as torch 2.13 writes them; gloo work on thread 9).

    fwd #0: enqueue 200 in _pre_forward 100..1000; gloo 300..900; need 1000 -> slack +100; hidden 0
    fwd #1: enqueue 600 in _pre_forward_prefetch; gloo 1000..2500; need = end of the next
            _pre_forward (1200..2000) = 2000 -> slack -500 (late); hidden 1050..1150 = 100/1500
    bwd #0: enqueue 3100 in _pre_backward_hook 3000..3500; gloo 3200..3400; need 3500 -> +100;
            the hook runs inside an autograd op (compute, 2900..3600) as in real traces, but the
            main thread is blocked in the hook: hidden 0, not 200
    """
    F = "FullyShardedDataParallel."
    rows = [
        ann("ProfilerStep#0", 0, 10000),
        ann(F + "_pre_forward", 100, 1000),
        event("c10d::allgather_", 200, 250, role="comm_enqueue", coll_kind="all_gather"),
        ann(F + "_pre_forward_prefetch", 500, 990),
        event("c10d::allgather_", 600, 650, role="comm_enqueue", coll_kind="all_gather"),
        event("aten::addmm", 1050, 1150),
        ann(F + "_pre_forward", 1200, 2000),
        event("autograd::engine::evaluate_function: AddBackward0", 2900, 3600),
        ann(F + "_pre_backward_hook", 3000, 3500),
        event("c10d::allgather_", 3100, 3150, role="comm_enqueue", coll_kind="all_gather"),
        event("gloo:all_gather", 300, 900, role="comm", cat="user_annotation", tid="9", coll_kind="all_gather"),
        event("gloo:all_gather", 1000, 2500, role="comm", cat="user_annotation", tid="9", coll_kind="all_gather"),
        event("gloo:all_gather", 3200, 3400, role="comm", cat="user_annotation", tid="9", coll_kind="all_gather"),
    ]
    return events(rows)


def test_cpu_fsdp1_units_by_order_and_late_prefetch():
    ev = cpu_fsdp1()
    assert prefetch.detect_labels(ev) == "fsdp1"
    t = prefetch.prefetch_table(ev, rank=1)
    assert list(zip(t["phase"], t["unit"])) == [("forward", "#0"), ("forward", "#1"), ("backward", "#0")]
    assert list(t["prefetched"]) == [False, True, False]
    assert list(t["need_ns"]) == [1000, 2000, 3500]
    assert list(t["slack_ns"]) == [100, -500, 100]
    assert list(t["hidden_ns"]) == [0, 100, 0]
    s = run_sums(t)
    assert (s["late"], s["wait_ns"], s["comm_ns"]) == (1, 500, 2300)


def test_no_fsdp_labels_gives_empty_table():
    ev = events([event("aten::mm", 0, 10), event("gloo:all_reduce", 0, 5, role="comm", coll_kind="all_reduce")])
    assert prefetch.detect_labels(ev) is None
    assert prefetch.prefetch_table(ev, rank=0).empty
    assert run_sums(prefetch.prefetch_table(ev, rank=0)) is None


def test_epoch_ns_stay_exact_when_a_unit_has_no_consumer():
    """Kineto's epoch timestamps (~1.7e18 ns) are beyond float64's integers: the prefetch columns
    must stay int64 even when some row has no value (a unit whose copy-out never came), which
    used to send every row through float64 (found in the issue-6 rewrite)."""
    off = 1_694_128_201_427_256_123
    ev = gpu_fsdp2()
    extra = events([ann("FSDP::all_gather (3)", 6000, 6100),
                    kernel("ncclDevKernel_AllGather", 6200, 6900, role="comm", stream=20,
                           coll_kind="all_gather")])
    ev = pd.concat([ev, extra], ignore_index=True)
    for c in ("ts_ns", "end_ns"):
        ev[c] = ev[c] + off
    t = prefetch.prefetch_table(ev, rank=0).set_index("unit")
    assert [int(v) for v in t.loc[["2", "1", "0"], "need_ns"]] == [off + 860, off + 2500,
                                                                  off + 4500]
    assert [int(v) for v in t["issued_ns"]] == [off + 120, off + 1100, off + 1310, off + 6000]
    assert [int(v) for v in t["finished_ns"]] == [off + 800, off + 3000, off + 5000, off + 6900]
    assert pd.isna(t.loc["3", "need_ns"]) and pd.isna(t.loc["3", "slack_ns"])


def test_gpu_consumer_from_pre_backward_after_copy_out_skips_copy_in():
    """Consumers found by launch call, never by GPU start (GPU-shaped; s7 compute, s20 comm).

    unit 1 (backward, own FSDP::pre_backward 1000..1500): issue 1010, AG 1100..1300. Its
        copy-out 1060..1080 launched nothing, so the consumer is the first compute kernel
        launched inside the pre_backward after 1080 and outside every FSDP::all_gather span:
        the copy-in launched 1120 lies inside FSDP::all_gather (0) 1110..1190 (the next unit's,
        on s20) -> skipped; the kernel launched 1300 (s7 1400..1420, previous s7 op ends 1350)
        -> need max(1300, 1350) = 1350, slack +50. (Taking the copy-in: need 1300, slack 0.)
    unit 0 (backward_prefetch for 0 -> backward, prefetched): issue 1110, AG 1310..1500, no
        copy-out label -> need / slack unknown.
    unit 2 (no hook label, outside the autograd op 900..2000 -> forward): issue 3000,
        AG 3100..3200; copy-out 3300..3320 launched nothing, no pre-hook -> unknown. (The old
        rule took the first compute kernel *starting* after 3300: s7 3400..3500, launched 2500,
        ready 2500 -> slack -700.)
    """
    rows = [
        ann("ProfilerStep#0", 0, 10000),
        event("autograd::engine::evaluate_function: MmBackward0", 900, 2000),
        ann("FSDP::pre_backward (1)", 1000, 1500), ann("FSDP::all_gather (1)", 1010, 1050),
        launch(1020, 20), ann("FSDP::all_gather_copy_out (1)", 1060, 1080),
        ann("FSDP::backward_prefetch for 0", 1100, 1200), ann("FSDP::all_gather (0)", 1110, 1190),
        launch(1120, 21), launch(1150, 22), launch(1300, 23),
        ann("FSDP::all_gather (2)", 3000, 3050), launch(3010, 30),
        ann("FSDP::all_gather_copy_out (2)", 3300, 3320), launch(500, 19), launch(2500, 31),
        kernel("gemm", 400, 1350, corr=19),
        kernel("ncclDevKernel_AllGather", 1100, 1300, role="comm", stream=20, corr=20,
               coll_kind="all_gather"),
        kernel("copy_in", 1300, 1310, stream=20, corr=21),
        kernel("ncclDevKernel_AllGather", 1310, 1500, role="comm", stream=20, corr=22,
               coll_kind="all_gather"),
        kernel("cast", 1400, 1420, corr=23),
        kernel("ncclDevKernel_AllGather", 3100, 3200, role="comm", stream=20, corr=30,
               coll_kind="all_gather"),
        kernel("gemm", 3400, 3500, corr=31),
    ]
    t = prefetch.prefetch_table(events(rows), rank=0).set_index("unit")
    assert list(t.index) == ["1", "0", "2"]
    assert list(t["phase"]) == ["backward", "backward", "forward"]
    assert list(t["prefetched"]) == [False, True, False]
    assert list(t["finished_ns"]) == [1300, 1500, 3200]
    assert t.loc["1", "need_ns"] == 1350 and t.loc["1", "slack_ns"] == 50
    assert t.loc[["0", "2"], "slack_ns"].isna().all()
    s = run_sums(t.reset_index())
    assert (s["late"], s["unknown"]) == (0, 2)


def test_fsdp2_labels_with_process_group_suffix():
    """FSDPParamGroup._with_fqn appends " [pg=<n>]" when a module has several parameter groups:
    issue 10 in its own pre_forward, AG 100..200, copy-out kernel launched 70, s7 empty before
    it -> need 70, slack -130; the unit keeps its suffix."""
    rows = [
        ann("ProfilerStep#0", 0, 1000), ann("FSDP::pre_forward (a) [pg=2]", 0, 500),
        ann("FSDP::all_gather (a) [pg=2]", 10, 50), launch(20, 1),
        ann("FSDP::all_gather_copy_out (a) [pg=2]", 60, 80), launch(70, 2),
        kernel("ncclDevKernel_AllGather", 100, 200, role="comm", stream=20, corr=1,
               coll_kind="all_gather"),
        kernel("copy_out", 200, 210, corr=2),
    ]
    ev = events(rows)
    assert prefetch.detect_labels(ev) == "fsdp2"
    t = prefetch.prefetch_table(ev, rank=0)
    assert list(zip(t["unit"], t["phase"], t["prefetched"])) == [("a [pg=2]", "forward", False)]
    assert (int(t["need_ns"].iloc[0]), int(t["slack_ns"].iloc[0])) == (70, -130)


def test_fsdp1_post_backward_prefetch_is_a_prefetch():
    """FSDP1 BACKWARD_POST issues the next unit's all_gather inside
    FullyShardedDataParallel._post_backward_prefetch: backward, prefetched; gloo 260..400;
    need = end of the next _pre_backward_hook (600..700) = 700 -> slack +300."""
    F = "FullyShardedDataParallel."
    rows = [
        ann("ProfilerStep#0", 0, 1000), ann(F + "_post_backward_hook", 100, 500),
        ann(F + "_post_backward_prefetch", 200, 300),
        event("c10d::allgather_", 210, 250, role="comm_enqueue", coll_kind="all_gather"),
        event("gloo:all_gather", 260, 400, role="comm", cat="user_annotation", tid="9",
              coll_kind="all_gather"),
        ann(F + "_pre_backward_hook", 600, 700),
    ]
    t = prefetch.prefetch_table(events(rows), rank=0)
    assert list(zip(t["phase"], t["prefetched"])) == [("backward", True)]
    assert list(t["slack_ns"]) == [300]


def test_headline_counts_only_measured_slacks():
    """3 of 4 slacks measured, none late: the headline says "none of the 3 measured" and names
    the one not measured; with all late-free and measured it keeps the plain claim."""
    from types import SimpleNamespace

    from analyzer.contract.report_types import Prefetch
    from reports import notes

    def sentence(unknown):
        p = Prefetch(all_gathers=4, prefetched=1, comm_ns=4000, hidden_ns=1000, hidden_frac=0.25,
                     late=0, unknown=unknown, wait_ns=0, labels="fsdp2", note=None, units=[])
        return notes.prefetch_sentence(SimpleNamespace(name="r", exposed_comm_ns=0, prefetch=p))

    text = sentence(1)
    assert "none of the 3 measured finished after its unit needed it" in text
    assert "Not measured for 1" in text
    assert "none of the 4 measured" in sentence(0) and "Not measured" not in sentence(0)


def _engine_thread_fsdp2():
    """GPU-shaped FSDP2 step: the training loop (thread 1, ProfilerStep) runs forward; the
    autograd engine's device thread (thread 2) runs backward. Unit 1's backward all_gather is
    issued on thread 2 at 2100, between two evaluate_function spans (1500..2000, 2500..3000),
    under no FSDP hook label: backward, not prefetched. Unit 2's forward all_gather at 120 on
    thread 1 stays forward."""
    rows = [
        ann("ProfilerStep#0", 0, 10000), ann("FSDP::pre_forward (2)", 100, 900),
        ann("FSDP::all_gather (2)", 120, 200),
        event("autograd::engine::evaluate_function: MmBackward0", 1500, 2000, tid="2"),
        ann("FSDP::all_gather (1)", 2100, 2200, tid="2"),
        event("autograd::engine::evaluate_function: MmBackward0", 2500, 3000, tid="2"),
        kernel("ncclDevKernel_AllGather", 300, 800, role="comm", stream=20, coll_kind="all_gather"),
        kernel("ncclDevKernel_AllGather", 2300, 2400, role="comm", stream=20, coll_kind="all_gather"),
        kernel("gemm", 400, 600),
    ]
    return events(rows)


def test_fsdp2_all_gather_on_the_autograd_thread_is_backward():
    t = prefetch.prefetch_table(_engine_thread_fsdp2(), rank=0).set_index("unit")
    assert list(t.index) == ["2", "1"]
    assert list(t["phase"]) == ["forward", "backward"]
    assert list(t["prefetched"]) == [False, False]


def test_fsdp1_all_gather_on_the_autograd_thread_is_backward():
    """FSDP1: an all_gather enqueue on the engine's thread (2) under no FSDP hook is the
    backward's #0; the main thread's enqueue in _pre_forward is the forward's #0."""
    F = "FullyShardedDataParallel."
    rows = [
        ann("ProfilerStep#0", 0, 10000), ann(F + "_pre_forward", 100, 1000),
        event("c10d::allgather_", 200, 250, role="comm_enqueue", coll_kind="all_gather"),
        event("autograd::engine::evaluate_function: AddBackward0", 2900, 3000, tid="2"),
        event("c10d::allgather_", 3100, 3150, role="comm_enqueue", coll_kind="all_gather", tid="2"),
        event("gloo:all_gather", 300, 900, role="comm", cat="user_annotation", tid="9", coll_kind="all_gather"),
        event("gloo:all_gather", 3200, 3400, role="comm", cat="user_annotation", tid="9", coll_kind="all_gather"),
    ]
    t = prefetch.prefetch_table(events(rows), rank=0)
    assert list(zip(t["phase"], t["unit"])) == [("forward", "#0"), ("backward", "#0")]
