"""Collective identity, bytes, non-NCCL communication and dtype / process group (issue 16).

One hand-built GPU-shaped trace (times in µs; the analyzer works in ns, so x1000): world 4,
process groups "0" (4 ranks) and "1" (ranks [0, 1], size 2), one ProfilerStep#1 [0, 1000) on
thread 1. Every expected figure is worked out by hand in the comments.
"""

from __future__ import annotations

import json

import pytest

from analyzer.analyses.collectives import by_kind
from analyzer.api import load_tables
from analyzer.compare import runs
from analyzer.ingest.classify import RULES
from reports import markdown
from tests.corpus import corpus

US = 1000


def _x(name, cat, ts, dur, tid=1, pid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _launch(ts, corr, ext=-1, tid=1):
    return _x("cudaLaunchKernel", "cuda_runtime", ts, 1, tid=tid, correlation=corr,
              **({"External id": ext} if ext >= 0 else {}))


def _kernel(name, ts, dur, corr, ext=None, stream=7, **args):
    a = {"correlation": corr, "stream": stream, **args}
    if ext is not None:
        a["External id"] = ext
    return _x(name, "kernel", ts, dur, tid=stream, pid=0, **a)


EVENTS = [
    _x("ProfilerStep#1", "user_annotation", 0, 1000),
    # (a) all_gather on the half-world group "1" whose kernel is named Broadcast
    _x("c10d::_allgather_base_", "cpu_op", 10, 50, **{
        "External id": 100, "Input Dims": [[8, 4], [4, 4]],
        "Input type": ["c10::BFloat16", "c10::BFloat16"]}),
    _x("record_param_comms", "cpu_op", 12, 46, **{
        "External id": 101, "Collective name": "_allgather_base", "In msg nelems": 16,
        "Out msg nelems": 32, "Group size": 2, "dtype": "BFloat16", "Process Group Name": "1",
        "Process Group Ranks": "[0, 1]"}),
    _launch(20, 7, 101),
    _kernel("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 100, 40, 7, 101),
    # (b) all_gather with no element counts: record_param_comms gives the group size 2, the
    # nccl:* op the input piece [4, 4] Float
    _x("record_param_comms", "cpu_op", 60, 20, **{"External id": 110, "Group size": 2,
                                                  "Process Group Name": "1"}),
    _x("nccl:_all_gather_base", "user_annotation", 62, 16, **{
        "External id": 111, "Input Dims": [[4, 4]], "Input type": ["float"]}),
    _launch(65, 8, 111),
    _kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 150, 20, 8, 111),
    # (c) lower-case NCCL kernel name, no CPU op; nccl::Allreduce with Collective name args
    _launch(85, 13),
    _kernel("nccldevkernel_allreduce_sum_f32", 180, 10, 13),
    _launch(86, 14),
    _kernel("nccl::Allreduce", 200, 10, 14, **{"Collective name": "allreduce",
                                                "In msg nelems": 10, "Out msg nelems": 10,
                                                "dtype": "Float", "Group size": 4,
                                                "Process Group Name": "0"}),
    # (d) External id == correlation id (as on the DLRM set), launched outside any comm op:
    # must not take the unrelated record_param_comms whose External id is also 500
    _launch(96, 500),
    _x("record_param_comms", "cpu_op", 90, 5, **{
        "External id": 500, "Collective name": "allreduce", "In msg nelems": 1000,
        "Out msg nelems": 1000, "dtype": "Float", "Group size": 2, "Process Group Name": "1"}),
    _kernel("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
            220, 10, 500, 500),
    # (e) symm_mem, hccl and dispatch ops launching kernels; a DeepEP kernel
    _x("symm_mem::one_shot_all_reduce", "cpu_op", 300, 20, **{
        "External id": 600, "Input Dims": [[100]], "Input type": ["c10::BFloat16"]}),
    _launch(305, 9, 600),
    _kernel("void one_shot_all_reduce_kernel<c10::BFloat16>(...)", 400, 10, 9, 600),
    _x("hccl:all_gather", "cpu_op", 330, 10, **{"External id": 610, "Input Dims": [[10]],
                                                "Input type": ["float"]}),
    _launch(332, 10, 610),
    _kernel("hcclAllGatherKernel", 420, 5, 10, 610),
    _x("moe::dispatch", "cpu_op", 350, 10, **{"External id": 620}),
    _launch(352, 11, 620),
    _kernel("void dispatch_tokens_kernel<float>(...)", 430, 10, 11, 620),
    _launch(370, 12),
    _kernel("void deep_ep::intranode::combine<8>(...)", 450, 5, 12),
    # (f) two all_reduces at once on two streams: union [500,550) = 50 µs, sum 40 + 40 = 80
    _launch(380, 15),
    _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 500, 40, 15, stream=7),
    _launch(381, 16),
    _kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 510, 40, 16, stream=8),
    # (g) device work queued before the profiler started: no launch on a linked trace
    _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 2000, 3, 999),
]
DIST = {"backend": "nccl", "rank": 0, "world_size": 4, "pg_config": [
    {"pg_name": "0", "pg_size": 4, "ranks": [0, 1, 2, 3]},
    {"pg_name": "1", "pg_size": 2, "ranks": [0, 1]}]}


@pytest.fixture
def trace(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    p = d / "rank0.trace.json"
    p.write_text(json.dumps({"traceEvents": EVENTS, "distributedInfo": DIST}))
    return p


def _by_start(tables):
    return tables.collectives.set_index(tables.collectives["start_ns"] // US)


def test_kind_comes_from_the_cpu_side_before_the_kernel_name(trace):
    c = _by_start(load_tables(trace))
    # (a) kernel named Broadcast under c10d::_allgather_base_ / record_param_comms(_allgather_base)
    assert c.loc[100, "kind"] == "all_gather"
    assert c.loc[100, "rule"] == "gpu.nccl_kernel.launch"


def test_in_and_out_element_counts_are_read_as_written(trace):
    from analyzer.api import load_events

    ev, _ = load_events(trace)
    rpc = ev[(ev["name"] == "record_param_comms") & (ev["ts_ns"] == 12 * US)]
    # (a) In msg nelems 16, Out msg nelems 32: the piece and the gathered buffer, not swapped
    assert rpc[["in_nelems", "out_nelems"]].values.tolist() == [[16, 32]]


def test_all_gather_bytes_use_the_process_group_not_the_world(trace):
    t = load_tables(trace)
    c = _by_start(t)
    # (a) max(in 16, out 32) elements x 2 B (BFloat16) = 64 B = piece 16 x 2 B x group 2
    #     (x world 4 would be 128); group 2, pg "1", dtype BFloat16
    a = c.loc[100]
    assert (a["bytes"], a["group_size"], a["pg"], a["dtype"], a["pg_ranks"]) == \
        (64, 2, "1", "BFloat16", "[0, 1]")
    # (b) nccl:* records the input piece [4, 4] Float = 64 B, x group 2 = 128 (world: 256)
    assert c.loc[150, "bytes"] == 128 and c.loc[150, "group_size"] == 2
    assert c.loc[150, "dtype"] == "Float"
    # busbw of (a) alone: algbw 64 B / 40 µs = 0.0016 GB/s, x (2-1)/2 = 0.0008 GB/s
    one = t.collectives[t.collectives["start_ns"] == 100 * US]
    k = by_kind(one).iloc[0]
    assert k["algbw_gbps"] == pytest.approx(64 / 40_000)
    assert k["busbw_gbps"] == pytest.approx(64 / 40_000 * 0.5)


def test_nccl_kernels_matched_without_case_and_by_collective_name(trace):
    c = _by_start(load_tables(trace))
    # (c) lower-case name: comm, kind from the name, no bytes known
    assert (c.loc[180, "kind"], c.loc[180, "rule"], c.loc[180, "bytes"]) == \
        ("all_reduce", "gpu.nccl_kernel", -1)
    # nccl::Allreduce with Collective name args: 10 x 4 B (Float) = 40 B, group 4
    assert (c.loc[200, "kind"], c.loc[200, "rule"], c.loc[200, "bytes"]) == \
        ("all_reduce", "gpu.nccl_kernel.args", 40)
    assert c.loc[200, "group_size"] == 4


def test_external_id_equal_to_correlation_takes_no_other_collective(trace):
    c = _by_start(load_tables(trace))
    d = c.loc[220]
    # without the rule it took record_param_comms #500: all_reduce, 4000 B, pg "1"
    assert (d["kind"], d["bytes"], d["pg"]) == ("send_recv", -1, "")
    # no group named and a process group smaller than the world exists: unknown, not 4
    assert d["group_size"] == -1


def test_non_nccl_collectives_counted_as_communication(trace):
    t = load_tables(trace)
    c = _by_start(t)
    # symm_mem: 100 x 2 B (BFloat16) = 200 B, all_reduce
    assert (c.loc[400, "kind"], c.loc[400, "rule"], c.loc[400, "bytes"]) == \
        ("all_reduce", "gpu.symm_mem_kernel", 200)
    # hccl:all_gather: the input piece 10 x 4 B needs the group size, which is unknown -> -1
    assert (c.loc[420, "kind"], c.loc[420, "rule"], c.loc[420, "bytes"]) == \
        ("all_gather", "gpu.hccl_kernel", -1)
    assert (c.loc[430, "kind"], c.loc[430, "rule"]) == ("all_to_all", "gpu.dispatch_kernel")
    assert (c.loc[450, "kind"], c.loc[450, "rule"]) == ("all_to_all", "gpu.deep_ep_kernel")
    notes = " ".join(t.ranks[0].warnings)
    assert "symm_mem" in notes and "gpu.symm_mem_kernel" in notes and "0.010 ms" in notes
    for rule in ("gpu.symm_mem_kernel", "gpu.hccl_kernel", "gpu.dispatch_kernel",
                 "gpu.deep_ep_kernel", "cpu.symm_mem_op", "cpu.hccl_op", "cpu.dispatch_op"):
        assert rule in RULES


def test_unlaunched_device_work_left_out_of_the_collectives(trace):
    c = load_tables(trace).collectives
    # (g) the kernel at 2000 µs has no launch on a trace with launch links
    assert 2000 * US not in set(c["start_ns"])
    # a..f: 100 150 180 200 220 400 420 430 450 500 510 = 11 rows
    assert len(c) == 11


def test_report_shows_union_unknown_bytes_dtype_and_group(trace):
    rep = runs.analyse(trace.parent)
    r = rep.runs[0]
    # (f) union: kernels inside the step: [100,140) [150,170) [180,190) [200,210) [220,230)
    # [400,410) [420,425) [430,440) [450,455) [500,550) = 40+20+10+10+10+10+5+10+5+50 = 170 µs
    # (sum of durations 210: the two all_reduces at 500 and 510 overlap by 30)
    assert r.comm_ns_per_step == 170 * US
    assert sum(v.time_ns_per_step for v in r.communication.values()) == 200 * US
    text = markdown.render(rep)
    assert "0.17 ms (union)" in text and "sums by kind" in text
    groups = {(g.kind, g.pg, g.dtype): g for g in r.comm_groups}
    ag = groups[("all_gather", "1", "BFloat16")]
    assert ag.bytes == 64 and ag.group_size == 2 and ag.pg_ranks == "[0, 1]"
    assert groups[("send_recv", "", "")].bytes is None
    assert groups[("send_recv", "", "")].group_size is None  # unknown: null in report.json
    assert "unknown" in text and "| all_gather | 1 | \\[0, 1\\] | 2 | BFloat16 |" in text
    assert r.communication["send_recv"].bytes is None
    assert "0.0 MiB" not in text


@pytest.mark.integration
def test_corpus_a100_record_param_comms_identity():
    t = load_tables(corpus("single/a100_ddp_rank0_nccl_args.json.gz"))
    c = t.collectives
    # published (corpus README): 21 NCCL kernels; one all_reduce of 2,049,000 elements in and
    # out, process group "0", ranks [0, 1]; Float: 2,049,000 x 4 B = 8,196,000 B
    assert len(c) == 21
    hit = c[c["bytes"] == 2_049_000 * 4]
    assert len(hit) >= 1 and set(hit["kind"]) == {"all_reduce"}
    assert set(hit["pg"]) == {"0"} and set(hit["pg_ranks"]) == {"[0, 1]"}
    assert set(hit["group_size"]) == {2} and set(hit["dtype"]) == {"Float"}


@pytest.mark.integration
def test_corpus_b200_symm_mem_all_reduces_are_communication():
    t = load_tables(corpus("single/b200_allgather_rank0.json.gz"))
    c = t.collectives
    sm = c[c["rule"] == "gpu.symm_mem_kernel"]
    # 73 symm_mem::multimem_all_reduce_ ops, each launching one kernel: 2.1 ms
    assert len(sm) == 73 and set(sm["kind"]) == {"all_reduce"}
    assert sm["dur_ns"].sum() == pytest.approx(2.12e6, rel=0.01)
    assert set(sm["dtype"]) == {"BFloat16"}
    # the first: Input Dims [[2557440]] BFloat16 -> 5,114,880 B
    assert sm.sort_values("start_ns")["bytes"].iloc[0] == 2_557_440 * 2
    ag = c[c["kind"] == "all_gather"].iloc[0]
    # record_param_comms on the kernel: out 201,088 BFloat16 = 402,176 B, group 8, pg "3"
    assert (ag["bytes"], ag["group_size"], ag["pg"]) == (402_176, 8, "3")


@pytest.mark.integration
@pytest.mark.parametrize("rel,cats", [
    ("single/mtia_inference_rank0.json.gz", ["mtia_ccp_events", "mtia_runtime"]),
    ("single/cupti_range_profiler.json.gz", ["cuda_profiler_range"])])
def test_corpus_device_kinds_not_understood_are_named(rel, cats):
    t = load_tables(corpus(rel))
    notes = " ".join(t.ranks[0].warnings)
    for cat in cats:
        assert f"category '{cat}'" in notes and "not understand" in notes


@pytest.mark.integration
def test_corpus_dlrm_bytes_known():
    t = load_tables(corpus("dlrm_ddp_8rank_v100/worker0.pt.trace.json.gz"))
    c = t.collectives
    # External id == correlation on every kernel: identity through the runtime launch; the
    # all_to_all of 24 "long int" elements: 24 x 8 B = 192 B, known now
    assert (c["bytes"] >= 0).all()
    assert set(c["kind"]) == {"all_reduce", "all_to_all"}
    assert 192 in set(c["bytes"])
    # the uneven all_to_all (c10d output [768], nccl:all_to_all input [3392] int): 3392 x 4 B
    assert 3392 * 4 in set(c["bytes"])
    # all_to_all total: 6144 x 4 x 2 + 24 x 8 + 384 x 4 + 3392 x 4 = 64,448 B
    assert c.loc[c["kind"] == "all_to_all", "bytes"].sum() == 64_448
    assert not any("dispatch" in w for w in t.ranks[0].warnings)  # cub::DispatchReduceByKey
