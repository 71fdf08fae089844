"""Group size of a collective, and what rests on it: all_gather / reduce_scatter bytes, busbw,
the per-group table (issue 32; rules in analyzer/ingest/commid.py's module docstring).

Hand-built GPU-shaped trace of one rank (rank 3) of a ``WORLD``-rank job whose FSDP groups have
``GROUP`` members, written by torch versions that record no ``Group size`` and no pg_config
(times in µs; the analyzer works in ns, so x1000). One ProfilerStep#1 [0, 1000) on thread 1:

(a) reduce_scatter: ``c10d::_reduce_scatter_base_`` (output piece [N], input [GROUP x N]
    float), record_param_comms without arguments, ``nccl:_reduce_scatter_base`` (input
    [GROUP x N]); kernel [100, 140). Group = GROUP x N / N; bytes = the whole buffer
    GROUP x N x 4 B (x WORLD would be twice that).
(b) all_gather: ``c10d::_allgather_base_`` (output [GROUP x N], input [N] BFloat16),
    ``nccl:_all_gather_base`` (input [N]); kernel [200, 240). Group GROUP, bytes GROUP x N x 2.
(c) all_gather sized by record_param_comms' In / Out msg nelems (M, GROUP x M, Float), no
    Group size, no process group; kernel [300, 320). Group GROUP, bytes GROUP x M x 4.
(d) all_gather with only ``nccl:_all_gather_base`` (input piece [P] float): nothing sizes the
    group; kernel [400, 410). Group unknown, bytes unknown (not P x 4 x WORLD).
(e) all_reduce with only ``nccl:all_reduce`` (input [R] float); kernel [500, 550). Bytes
    R x 4 (an all_reduce's bytes need no group), group unknown, so busbw unknown.
"""

from __future__ import annotations

import json
import math

import pytest

from analyzer.analyses.collectives import by_kind
from analyzer.api import load_tables
from analyzer.compare import runs
from analyzer.contract import report_types
from analyzer.ingest import commid
from reports import markdown
from tests.analyzer.helpers import FIXTURES, HALF, gloo_job

US = 1000
N, M, P, R = 1024, 256, 96, 4000


def _x(name, cat, ts, dur, tid=1, pid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _launch(ts, corr):
    return _x("cudaLaunchKernel", "cuda_runtime", ts, 1, correlation=corr)


def _kernel(name, ts, dur, corr):
    return _x(name, "kernel", ts, dur, tid=7, pid=0, correlation=corr, stream=7)


def _events(group: int) -> list[dict]:
    return [
        _x("ProfilerStep#1", "user_annotation", 0, 1000),
        # (a)
        _x("c10d::_reduce_scatter_base_", "cpu_op", 10, 30, **{
            "Input Dims": [[N], [group * N], [], []], "Input type": ["float", "float", "", ""]}),
        _x("record_param_comms", "cpu_op", 11, 28, **{"Input Dims": [[], []],
                                                      "Input type": ["TensorList", ""]}),
        _x("nccl:_reduce_scatter_base", "user_annotation", 12, 26, **{
            "Input Dims": [[group * N]], "Input type": ["float"]}),
        _launch(20, 1),
        _kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 100, 40, 1),
        # (b)
        _x("c10d::_allgather_base_", "cpu_op", 50, 30, **{
            "Input Dims": [[group * N], [N], []], "Input type": ["c10::BFloat16",
                                                                "c10::BFloat16", ""]}),
        _x("nccl:_all_gather_base", "user_annotation", 52, 26, **{
            "Input Dims": [[N]], "Input type": ["c10::BFloat16"]}),
        _launch(60, 2),
        _kernel("ncclDevKernel_AllGather_RING_LL", 200, 40, 2),
        # (c)
        _x("record_param_comms", "cpu_op", 90, 20, **{
            "Collective name": "_allgather_base", "In msg nelems": M,
            "Out msg nelems": group * M, "dtype": "Float"}),
        _launch(95, 3),
        _kernel("ncclDevKernel_AllGather_RING_LL", 300, 20, 3),
        # (d)
        _x("nccl:_all_gather_base", "user_annotation", 120, 20, **{
            "Input Dims": [[P]], "Input type": ["float"]}),
        _launch(125, 4),
        _kernel("ncclDevKernel_AllGather_RING_LL", 400, 10, 4),
        # (e)
        _x("nccl:all_reduce", "user_annotation", 150, 20, **{
            "Input Dims": [[R]], "Input type": ["float"]}),
        _launch(155, 5),
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 500, 50, 5),
    ]


def _trace(folder, world: int, group: int, pg_config: list[dict] | None = None):
    dist = {"backend": "nccl", "rank": 3, "world_size": world}
    if pg_config is not None:
        dist |= {"pg_count": len(pg_config), "pg_config": pg_config}
    p = folder / "rank3.trace.json"
    folder.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"traceEvents": _events(group), "distributedInfo": dist}))
    return p


def _by_start(path):
    c = load_tables(path).collectives
    return c.set_index(c["start_ns"] // US)


JOBS = pytest.mark.parametrize("world,group", [(16, 8), (128, 64)])


@JOBS
def test_reduce_scatter_group_and_bytes_from_the_c10d_op_output_and_input(tmp_path, world, group):
    c = _by_start(_trace(tmp_path / "job", world, group))
    a = c.loc[100]
    # piece N, whole group x N float: group = group, bytes = group x N x 4 (not world x N x 4)
    assert a["kind"] == "reduce_scatter"
    assert (a["group_size"], a["bytes"]) == (group, group * N * 4)


@JOBS
def test_all_gather_group_from_the_c10d_op_output_and_input_sets_busbw(tmp_path, world, group):
    c = load_tables(_trace(tmp_path / "job", world, group)).collectives
    b = c[c["start_ns"] == 200 * US]
    assert (b["group_size"].iat[0], b["bytes"].iat[0]) == (group, group * N * 2)
    k = by_kind(b).iloc[0]
    # busbw factor (n-1)/n of the group: 16 ranks would give 15/16, 7 % above 7/8
    assert k["algbw_gbps"] == pytest.approx(group * N * 2 / 40_000)
    assert k["busbw_gbps"] == pytest.approx(group * N * 2 / 40_000 * (group - 1) / group)


@JOBS
def test_all_gather_group_from_in_and_out_msg_nelems(tmp_path, world, group):
    c = _by_start(_trace(tmp_path / "job", world, group))
    assert (c.loc[300, "group_size"], c.loc[300, "bytes"]) == (group, group * M * 4)


@JOBS
def test_group_nothing_sizes_is_unknown_not_the_world(tmp_path, world, group):
    t = load_tables(_trace(tmp_path / "job", world, group))
    c = t.collectives.set_index(t.collectives["start_ns"] // US)
    # (d) the piece alone: bytes need the group, which nothing gives
    assert (c.loc[400, "group_size"], c.loc[400, "bytes"]) == (-1, -1)
    # (e) all_reduce: bytes R x 4 without the group; its busbw factor needs it: unknown
    assert (c.loc[500, "group_size"], c.loc[500, "bytes"]) == (-1, R * 4)
    k = by_kind(t.collectives).set_index("kind")
    assert k.loc["all_reduce", "algbw_gbps"] == pytest.approx(R * 4 / 50_000)
    assert math.isnan(k.loc["all_reduce", "busbw_gbps"])
    r = runs.analyse(tmp_path / "job").runs[0]
    assert r.communication["all_reduce"].busbw_gbps is None
    assert r.communication["all_reduce"].bytes == R * 4


def test_world_size_only_where_pg_config_shows_every_group_is_the_world(tmp_path):
    world = [{"pg_name": "0", "pg_size": 16, "ranks": list(range(16))}]
    c = _by_start(_trace(tmp_path / "a", 16, 8, world))
    # pg_config lists one group, the world: every collective is in it
    assert (c.loc[500, "group_size"], c.loc[400, "group_size"], c.loc[400, "bytes"]) == \
        (16, 16, P * 4 * 16)
    assert set(c["pg"]) == {"0"} and set(c["pg_ranks"]) == {json.dumps(list(range(16)))}
    halves = world + [{"pg_name": "1", "pg_size": 8, "ranks": list(range(8))},
                      {"pg_name": "2", "pg_size": 8, "ranks": list(range(8, 16))}]
    c = _by_start(_trace(tmp_path / "b", 16, 8, halves))
    # a group smaller than the world exists: unnamed collectives are not sized by the world
    assert (c.loc[500, "group_size"], c.loc[400, "group_size"], c.loc[400, "bytes"]) == \
        (-1, -1, -1)
    assert c.loc[100, "group_size"] == 8 and set(c["pg"]) == {""}  # (a) still by its ratio
    assert commid.group_fallback({}, 16) == -1
    assert commid.group_fallback(None, 16) == -1
    assert commid.group_fallback({"0": 16}, 16) == 16
    assert commid.group_fallback({"0": 16, "1": 8}, 16) == -1


def test_group_ratio_rules():
    assert commid.group_from_counts("all_gather", 16, 128) == 8
    assert commid.group_from_counts("reduce_scatter", 128, 16) == 8
    assert commid.group_from_counts("all_gather", 16, 100) == -1  # not a whole number
    assert commid.group_from_counts("all_gather", 16, 8) == -1  # below 1
    assert commid.group_from_counts("all_gather", 0, 0) == -1
    assert commid.group_from_counts("all_reduce", 16, 128) == -1
    assert commid.group_from_tensors("c10d::_allgather_base_", "all_gather", 128, 16) == 8
    assert commid.group_from_tensors("c10d::_reduce_scatter_base_", "reduce_scatter", 16,
                                     128) == 8
    assert commid.group_from_tensors("nccl:_all_gather_base", "all_gather", 128, 16) == -1


def test_report_says_the_group_is_not_in_the_trace_and_its_size_unknown(tmp_path):
    _trace(tmp_path / "job", 16, 8)
    rep = runs.analyse(tmp_path / "job")
    groups = {(g.kind, g.dtype): g for g in rep.runs[0].comm_groups}
    rs = groups[("reduce_scatter", "Float")]
    assert (rs.pg, rs.group_size, rs.bytes, rs.n_ranks) == ("", 8, 8 * N * 4, 1)
    assert groups[("all_reduce", "Float")].group_size is None
    assert groups[("all_reduce", "Float")].busbw_gbps is None
    text = markdown.render(rep)
    assert "| reduce_scatter | not in trace | not in trace | 8 | Float |" in text
    assert "| all_reduce | not in trace | not in trace | unknown | Float |" in text


def test_process_group_named_by_the_only_group_in_pg_config(tmp_path):
    world = [{"pg_name": "0", "pg_size": 16, "ranks": list(range(16))}]
    _trace(tmp_path / "job", 16, 8, world)
    rep = runs.analyse(tmp_path / "job")
    assert {g.pg for g in rep.runs[0].comm_groups} == {"0"}
    ranks = markdown.escape(json.dumps(list(range(16))))
    assert f"| all_reduce | 0 | {ranks} | 16 | Float |" in markdown.render(rep)


def test_group_table_means_over_the_ranks_that_ran_it(tmp_path):
    # 6-rank gloo job (tests/analyzer/helpers.py gloo_rank): all_gathers only on group "1"
    # (ranks 0, 2, 4), 60 per member; all_reduces on "0" (all 6 ranks), 120 per rank
    job = gloo_job(tmp_path / "job")
    coll = load_tables(job).collectives
    rep = runs.analyse(job)
    groups = {(g.kind, g.pg): g for g in rep.runs[0].comm_groups}
    ag = groups[("all_gather", "1")]
    ag_ns = coll.loc[coll["kind"] == "all_gather", "dur_ns"].sum()
    # over the job's 6 ranks it would be 30 calls and half the time
    assert (ag.n_ranks, ag.count, ag.group_size) == (len(HALF), 60, 3)
    assert ag.time_ns == pytest.approx(ag_ns / 3)
    ar = groups[("all_reduce", "0")]
    assert (ar.n_ranks, ar.count, ar.group_size) == (6, 120, 6)
    assert "mean over the ranks that ran it" in markdown.render(rep)


def test_per_group_rank_count_in_report_json(tmp_path):
    rep = runs.analyse(gloo_job(tmp_path / "job"))
    doc = json.loads(report_types.encode(rep))
    got = {(g["kind"], g["pg"]): g["n_ranks"] for g in doc["runs"][0]["comm_groups"]}
    assert got == {("all_gather", "1"): 3, ("all_reduce", "0"): 6}


def test_gloo_all_gather_piece_times_the_group_pg_config_gives(tmp_path):
    # fixtures/core/gloo_rules.json (rank 1 of 2, no pg_config) with the pg_config of a job
    # whose only group is the world: gloo:all_gather's input piece 4 x 4 B x group 2 = 32 B
    doc = json.loads((FIXTURES / "gloo_rules.json").read_text())
    doc["distributedInfo"] |= {"pg_count": 1, "pg_config": [{"pg_name": "0", "pg_size": 2,
                                                             "ranks": [0, 1]}]}
    path = tmp_path / "gloo_rules.json"
    path.write_text(json.dumps(doc))
    c = load_tables(path).collectives.set_index("kind")
    assert (c.loc["all_gather", "bytes"], c.loc["all_gather", "group_size"]) == (32, 2)
    assert (c.loc["all_gather", "pg"], c.loc["all_gather", "pg_ranks"]) == ("0", "[0, 1]")
