"""FSDP prefetch on hand-built event tables with exact answers (worked out by hand below)."""

from __future__ import annotations

import pandas as pd
import pytest

from analyzer.analyses import prefetch
from tests.reports.builders import event, events


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
    s = prefetch.prefetch_summary(t.reset_index())
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
    s = prefetch.prefetch_summary(t)
    assert (s["late"], s["wait_ns"], s["comm_ns"]) == (1, 500, 2300)


def test_no_fsdp_labels_gives_empty_table():
    ev = events([event("aten::mm", 0, 10), event("gloo:all_reduce", 0, 5, role="comm", coll_kind="all_reduce")])
    assert prefetch.detect_labels(ev) is None
    assert prefetch.prefetch_table(ev, rank=0).empty
    assert prefetch.prefetch_summary(prefetch.prefetch_table(ev, rank=0)) is None


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
