"""One hand-built fixture per classification / breakdown rule, with exact answers.

Fixtures: fixtures/core/*.json (times in µs; the analyzer works in ns, so x1000).
The expected numbers are derived by hand in the comments from the fixture's events.
"""

from __future__ import annotations

import math

import pytest

from analyzer.api import load_events, load_tables
from analyzer.analyses.collectives import by_kind

US = 1000


def _row(df):
    assert len(df) == 1
    return df.iloc[0]


def test_gpu_rules_breakdown(fixture_copy):
    ts = load_tables(fixture_copy("gpu_rules.json"))
    b = _row(ts.breakdown)
    # device window (analyzer/ingest/steps.py): the step's first device work, gemm at 20, to
    # the end of its last, relu_kernel (launched at 60 inside the step, runs [90,120)) ->
    # [20,120). late_kernel is launched at 105, outside the step: step -1, out.
    assert b["step"] == 1 and b["step_start_ns"] == 20 * US and b["step_ns"] == 100 * US
    assert b["cpu_step_ns"] == 100 * US and b["device_work"]
    # C = [40,60) Generic + [70,80) SendRecv + [85,95) AllGather = 40
    # K = gemm [20,50) + relu [90,120) = 60 (memcpy/memset/annotation excluded)
    assert b["comm_ns"] == 40 * US and b["compute_ns"] == 60 * US
    # C∩K = [40,50) + [90,95) = 15; exposed = 25
    assert b["overlap_ns"] == 15 * US and b["exposed_comm_ns"] == 25 * US
    # O = memcpy [55,65) + memset [96,98); outside C∪K only [60,65) = 5
    assert b["other_ns"] == 5 * US
    assert b["idle_ns"] == 10 * US  # 100 - 60 - 25 - 5
    assert b["overlap_frac"] == pytest.approx(15 / 40)


def test_gpu_rules_collectives_kinds_bytes_and_rule(fixture_copy):
    ts = load_tables(fixture_copy("gpu_rules.json"))
    c = ts.collectives.set_index("kind")
    # Generic kernel: kind from the launching record_param_comms (correlation -> launch ->
    # enclosing op), bytes = max(in 8, out 4) x 4 (Float) = 32, pg "0"
    assert c.loc["reduce_scatter", "rule"] == "gpu.nccl_kernel.launch"
    assert c.loc["reduce_scatter", "bytes"] == 32 and c.loc["reduce_scatter", "pg"] == "0"
    # SendRecv kernel under nccl:all_to_all: all_to_all, bytes from its shape 6 x 4 = 24
    assert c.loc["all_to_all", "rule"] == "gpu.nccl_kernel.launch"
    assert c.loc["all_to_all", "bytes"] == 24
    # ncclDevKernel_AllGather: kind from its own Collective name argument (the CPU side's
    # record_param_comms copied onto it comes before the name); bytes from its args:
    # out 4 x 2 (BFloat16) = 8
    assert c.loc["all_gather", "rule"] == "gpu.nccl_kernel.args"
    assert c.loc["all_gather", "bytes"] == 8
    assert c.loc["all_gather", "start_ns"] == 85 * US and c.loc["all_gather", "dur_ns"] == 10 * US
    k = by_kind(ts.collectives).set_index("kind")
    # reduce_scatter: 32 B / 20 µs = 0.0016 GB/s; busbw x (n-1)/n with n = 2 -> 0.0008
    assert k.loc["reduce_scatter", "algbw_gbps"] == pytest.approx(32 / 20_000)
    assert k.loc["reduce_scatter", "busbw_gbps"] == pytest.approx(32 / 20_000 * 0.5)


def test_gpu_rules_roles(fixture_copy):
    ev, _ = load_events(fixture_copy("gpu_rules.json"))
    role = dict(zip(ev["name"].astype(str), ev["role"].astype(str)))
    assert role["Memcpy DtoH (Device -> Pinned)"] == "memcpy"
    assert role["Memset (Device)"] == "memset"
    assert role["void gemm_kernel<float>(...)"] == "compute"
    assert role["record_param_comms"] == "comm_enqueue"
    steps = dict(zip(ev["name"].astype(str), ev["step"]))
    assert steps["void relu_kernel(...)"] == 1  # launched inside the step, ends after it
    assert steps["void late_kernel(...)"] == -1  # launched after the step


def test_gloo_rules_pairing_wait_and_breakdown(fixture_copy):
    ts = load_tables(fixture_copy("gloo_rules.json"))
    rt = ts.ranks[0]
    assert rt.rank == 1 and rt.device_kind == "cpu" and rt.main_tid == "1"
    b = _row(ts.breakdown)
    assert b["step"] == 3 and b["step_ns"] == 200 * US
    # K = main-thread ops [10,40) ∪ [50,150) ∪ [100,110) ∪ [170,190)
    #     - c10d spans [55,60), [160,165)
    #     - waits: reduce_scatter [60,130) minus the non-enclosing add_ [100,110)
    #              all_gather [165,180) minus relu [170,190)
    #   = [10,40) [50,55) [100,110) [130,150) [170,190) = 30+5+10+20+20 = 85
    assert b["compute_ns"] == 85 * US
    assert b["comm_ns"] == 79 * US  # [65,130) + [166,180)
    assert b["overlap_ns"] == 20 * US  # [100,110) + [170,180)
    assert b["exposed_comm_ns"] == 59 * US
    assert b["other_ns"] == 10 * US  # c10d enqueue spans; copy_ on thread 4 lies inside K
    assert b["idle_ns"] == 46 * US
    c = ts.collectives.set_index("kind")
    # gloo:all_reduce paired with c10d::_reduce_scatter_base_: reported as reduce_scatter,
    # bytes = the full buffer 16 x 4 = 64
    assert c.loc["reduce_scatter", "rule"] == "cpu.gloo_op.paired"
    assert c.loc["reduce_scatter", "bytes"] == 64
    assert c.loc["reduce_scatter", "enqueue_start_ns"] == 55 * US
    # gloo:all_gather input is one rank's piece, 4 x 4 B; the group size is unknown (no
    # pg_config, c10d::allgather_ records tensor lists): bytes unknown, not x world 2
    # (x group 2 = 32 where pg_config says so: tests/analyzer/test_group_size.py)
    assert (c.loc["all_gather", "bytes"], c.loc["all_gather", "group_size"]) == (-1, -1)


def test_whole_trace_mode(fixture_copy):
    ts = load_tables(fixture_copy("whole_trace.json"))
    assert ts.whole_trace_mode and ts.ranks[0].rank_source == "single file"
    b = _row(ts.breakdown)
    # GPU rank: window = the device work's extent [20,40) (the whole trace is [5,40): the
    # CPU span, cpu_step_ns); C [20,30), K [25,40): overlap 5, exposed 5, idle 0
    assert (b["step"], b["step_start_ns"], b["step_ns"]) == (0, 20 * US, 20 * US)
    assert b["cpu_step_ns"] == 35 * US
    assert (b["compute_ns"], b["comm_ns"], b["overlap_ns"]) == (15 * US, 10 * US, 5 * US)
    assert (b["exposed_comm_ns"], b["other_ns"], b["idle_ns"]) == (5 * US, 0, 0)
    c = _row(ts.collectives)
    assert c["kind"] == "all_reduce" and c["bytes"] == -1
    k = _row(by_kind(ts.collectives))
    assert k["bytes"] == -1 and math.isnan(k["algbw_gbps"])


def test_timeline_lanes(fixture_copy):
    ts = load_tables(fixture_copy("gpu_rules.json"))
    t = ts.timeline(0, 1)
    comp = t[t["lane"] == "compute"]
    assert list(zip(comp["start_ns"], comp["end_ns"])) == [(20 * US, 50 * US), (90 * US, 120 * US)]
    comm = t[t["lane"] == "comm"].set_index("kind")
    assert comm.loc["all_to_all", "start_ns"] == 70 * US
    with pytest.raises(KeyError):
        ts.timeline(0, 99)


@pytest.mark.parametrize("name, kind", [
    ("nccl:_all_gather_base", "all_gather"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce_scatter"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
    ("allreduce", "all_reduce"),
    ("gloo:all_reduce", "all_reduce"),
    ("nccl:all_to_all", "all_to_all"),
    ("gloo:barrier", "barrier"),
    # kernels whose name does not say the collective: the kind comes from the launching op
    # (gpu.nccl_kernel.launch; test_gpu_rules_collectives_kinds_bytes_and_rule)
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", None),
    ("ncclDevKernel_Generic_1", None),
])
def test_kind_from_text(name, kind):
    """The one rule for a collective's kind from a name, for every command (report, summary,
    merge: analyzer/ingest/classify.py)."""
    from analyzer.ingest.classify import kind_from_text

    assert kind_from_text(name) == kind


def test_fake_group_collective_calls_are_the_comm_rows(fixture_copy):
    """fixtures/core/fake_group_rules.json: a ``tracer project`` rank (backend "fake"): no
    transfer op, so each collective call's ``c10d::*`` op is its comm row (rule
    cpu.fake_pg_call), once."""
    ts = load_tables(fixture_copy("fake_group_rules.json"))
    c = ts.collectives.sort_values("start_ns")
    # c10d::_allgather_base_ [20,25) under tag pg 0 float32 x 64 -> 256 bytes; the
    # functional all_reduce [100,110) runs c10d::allreduce_ [102,106): the inner call is the
    # row (tag pg 1 bfloat16 x 16 -> 32 bytes), the outer an enqueue, not counted again;
    # c10d::wait and wait_tensor are waits, not calls; a functional op that runs no c10d op
    # ([160,170): no FakeProcessGroup call) stays an enqueue
    assert list(c["kind"]) == ["all_gather", "all_reduce"]
    assert list(c["rule"]) == ["cpu.fake_pg_call"] * 2
    assert list(c["start_ns"]) == [20 * US, 102 * US]
    assert list(c["dur_ns"]) == [5 * US, 4 * US]
    assert list(c["bytes"]) == [256, 32]
    assert list(c["pg"]) == ["0", "1"]
    assert list(c["pg_desc"]) == ["default_pg", "mesh_tp"]
    assert _row(ts.breakdown)["comm_ns"] == 9 * US  # 5 + 4: each call's own time
