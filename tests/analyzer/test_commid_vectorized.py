"""The collective-identity stage on columns (issue 46): the same answers as the row-at-a-time
stage it replaced (tests/analyzer/commid_oracle.py, the code at 8821002), on hand-built tables
with nesting, ties, several threads and missing links, and on the corpus traces.

Hand-built traces are in µs (the analyzer works in ns); ``_random_trace`` draws GPU, gloo and
fake-group shaped traces from a seed.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pandas as pd
import pytest

from analyzer.contract.schemas import PG_TAG_PREFIX, PG_TAG_TENSOR
from analyzer.ingest import classify as C
from analyzer.ingest import commid
from analyzer.ingest.decode import decode_bytes
from analyzer.ingest.distinfo import read as read_distinfo
from tests.analyzer import commid_oracle as oracle
from tests.corpus import CORPUS, corpus_root, skip_reason


def _x(name, cat, ts, dur, tid=1, pid=1, **args):
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _classified_both(events, dist=None):
    """(new, old) classify of a trace of ``events`` (µs) with ``distributedInfo`` ``dist``."""
    trace = {"schemaVersion": 1, "traceEvents": events}
    if dist is not None:
        trace["distributedInfo"] = dist
    dec = decode_bytes(json.dumps(trace).encode())
    d = read_distinfo(dec.distributed_info)
    kw = dict(world_size=d.world_size, pg_sizes=d.sizes(), pg_ranks=d.ranks_text(),
              pg_descs=d.descs(), backend=d.backend)
    new = C.classify(dec.events, **kw)
    with oracle.old_identity():
        old = C.classify(dec.events, **kw)
    return new, old


def _assert_same(new, old):
    pd.testing.assert_frame_equal(new[0], old[0])
    assert new[1]["notes"] == old[1]["notes"]


# --- launching_ops and ops_enclosing on arrays -------------------------------------------------

def _old_launching(launch, ext_k, corr_k, enq, ext, ts, end, tid):
    cols = (enq, ext[enq], ts[enq], end[enq], tid[enq])
    return [oracle.launching_ops(int(launch[k]), int(ext_k[k]), int(corr_k[k]), cols, ext, ts,
                                 end, tid) for k in range(len(launch))]


def _new_launching(*args):
    offsets, rows = commid.launching_ops(*args)
    return [rows[offsets[k]:offsets[k + 1]].tolist() for k in range(len(offsets) - 1)]


def test_launching_ops_innermost_first_then_external_id():
    # rows: 0 c10d [0, 100] t0; 1 record_param_comms [10, 90] t0; 2 nccl [10, 90] t0 (a tie
    # with 1: the smaller row first); 3 op [20, 80] on t1 (another thread); 4 launch [30, 31]
    # t0; 5 op [50, 60] t0 (after the launch); 6 op [0, 5] t1, External id 9 (the launch's)
    ts = np.array([0, 10, 10, 20, 30, 50, 0], np.int64)
    end = np.array([100, 90, 90, 80, 31, 60, 5], np.int64)
    tid = np.array([0, 0, 0, 1, 0, 0, 1], np.int64)
    ext = np.array([1, 2, 3, 4, 9, 5, 9], np.int64)
    enq = np.array([0, 1, 2, 3, 5, 6], np.int64)
    got = _new_launching(np.array([4]), np.array([-1]), np.array([-1]), enq, ext, ts, end, tid)
    assert got == [[1, 2, 0, 6]]


def test_launching_ops_without_launch_take_the_only_op_with_the_external_id_and_its_nest():
    # kernel 0: External id 2 names op 1 only: op 1, then its nest innermost first (op 3 inside
    # it, op 1 itself, op 0 around it; op 4 on another thread is not in it); kernel 1: External id
    # 7 is on two ops: none; kernel 2: External id == correlation: none; kernel 3: no id: none
    ts = np.array([0, 10, 10, 20, 10, 200, 300], np.int64)
    end = np.array([100, 90, 90, 30, 90, 210, 310], np.int64)
    tid = np.array([0, 0, 5, 0, 1, 0, 0], np.int64)
    ext = np.array([1, 2, -1, 3, 4, 7, 7], np.int64)
    enq = np.array([0, 1, 3, 4, 5, 6], np.int64)
    launch = np.array([-1, -1, -1, -1])
    ext_k, corr_k = np.array([2, 7, 3, -1]), np.array([50, 51, 3, 52])
    got = _new_launching(launch, ext_k, corr_k, enq, ext, ts, end, tid)
    assert got == [[1, 3, 0], [], [], []]
    assert got == _old_launching(launch, ext_k, corr_k, enq, ext, ts, end, tid)


def _random_columns(rng, n, n_tid, span, ties):
    ts = rng.integers(0, span, n)
    dur = rng.integers(0, span // 3, n)
    if ties:  # copies of earlier rows' intervals: equal starts, equal ends
        k = rng.integers(0, n, n // 3)
        ts[k[1:]], dur[k[1:]] = ts[k[:-1]], dur[k[:-1]]
    tid = rng.integers(0, n_tid, n)
    ext = np.where(rng.random(n) < 0.8, rng.integers(0, n // 2 + 1, n), -1)
    return ts.astype(np.int64), (ts + dur).astype(np.int64), tid.astype(np.int64), \
        ext.astype(np.int64)


@pytest.mark.parametrize("seed", range(40))
def test_launching_ops_match_the_row_at_a_time_rule(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 120))
    ts, end, tid, ext = _random_columns(rng, n, int(rng.integers(1, 4)), 200, seed % 2 == 0)
    enq = np.sort(rng.choice(n, int(rng.integers(1, n)), replace=False)).astype(np.int64)
    k = int(rng.integers(1, 60))
    launch = np.where(rng.random(k) < 0.6, rng.integers(0, n, k), -1).astype(np.int64)
    ext_k = np.where(rng.random(k) < 0.8, rng.integers(0, n // 2 + 1, k), -1).astype(np.int64)
    corr_k = np.where(rng.random(k) < 0.3, ext_k, rng.integers(0, n, k)).astype(np.int64)
    args = (launch, ext_k, corr_k, enq, ext, ts, end, tid)
    assert _new_launching(*args) == _old_launching(*args)


@pytest.mark.parametrize("seed", range(40))
def test_ops_enclosing_matches_the_row_at_a_time_rule(seed):
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(2, 150))
    ts, end, tid, _ = _random_columns(rng, n, int(rng.integers(1, 4)), 300, seed % 2 == 1)
    if seed % 5 == 0:  # a few negative durations: a table classify may be handed
        bad = rng.integers(0, n, 3)
        end[bad] = ts[bad] - rng.integers(1, 20, 3)
    ops = np.sort(rng.choice(n, int(rng.integers(1, n)), replace=False)).astype(np.int64)
    cand = rng.integers(0, n, int(rng.integers(1, 80))).astype(np.int64)  # repeats allowed
    new = commid.ops_enclosing(ops, cand, ts, end, tid)
    assert new.tolist() == oracle.ops_enclosing(ops, cand, ts, end, tid).tolist()


def test_ops_enclosing_picks_the_innermost_and_the_later_of_equal_ops():
    # ops 0 [0, 100], 1 [10, 90], 2 [10, 90] (equal to 1: the later in op_rows wins), 3 [10, 95]
    # (starts with 1 and 2, ends later: outer); candidate 4 [20, 30]; 5 [20, 30] on thread 1
    ts = np.array([0, 10, 10, 10, 20, 20], np.int64)
    end = np.array([100, 90, 90, 95, 30, 30], np.int64)
    tid = np.array([0, 0, 0, 0, 0, 1], np.int64)
    got = commid.ops_enclosing(np.array([0, 1, 2, 3]), np.array([4, 5]), ts, end, tid)
    assert got.tolist() == [2, -1]


# --- the whole stage through classify ----------------------------------------------------------

_C10D = ("c10d::allreduce_", "c10d::_allgather_base_", "c10d::_reduce_scatter_base_",
         "c10d::broadcast_", "c10d::alltoall_base_", "c10d::send")
_NCCL = ("nccl:all_reduce", "nccl:_all_gather_base", "nccl:_reduce_scatter_base",
         "nccl:broadcast", "nccl:all_to_all", "nccl:send")
_KERNEL = ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclDevKernel_AllGather_RING_LL",
           "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "ncclDevKernel_Broadcast_RING_LL",
           "ncclDevKernel_SendRecv", "ncclKernel_Generic")
_COLL = ("allreduce", "_allgather_base", "_reduce_scatter_base", "broadcast", "all_to_all",
         "send")


def _random_trace(seed: int) -> tuple[list, dict | None]:
    """A GPU-shaped trace (``seed`` % 3 == 0: gloo on CPU; == 1 with a fake group's calls):
    collectives on up to 3 threads, each a c10d op around record_param_comms (sometimes with
    its args) around an nccl:* op around the launch; ties (two ops on the same interval),
    process-group tags, kernels without a launch (External id unique, shared, or a copy of the
    correlation id), kernels with none at all."""
    rnd = random.Random(seed)
    gloo, fake = seed % 3 == 0, seed % 3 == 1
    ev = [_x("ProfilerStep#1", "user_annotation", 0, 100_000)]
    ext = iter(range(1, 10**6))
    corr = iter(range(10_000, 10**6))
    t = 10
    for c in range(rnd.randint(1, 25)):
        tid = rnd.choice((1, 1, 2, 3))
        k = rnd.randrange(len(_C10D))
        dur = rnd.randint(20, 60)
        pg = rnd.choice(("0", "1", None))
        if rnd.random() < 0.4:  # a process-group tag around the call
            note = f"{PG_TAG_TENSOR}float {rnd.choice((16, 64))}" if fake and rnd.random() < .6 \
                else ""
            peer = f" peer {rnd.randint(0, 3)}" if k == 5 else ""
            ev.append(_x(f"{PG_TAG_PREFIX}{rnd.choice(('0', '1'))}{note}{peer}",
                         "user_annotation", t - 1, dur + 2, tid=tid))
        if fake and rnd.random() < 0.5:
            ev.append(_x(f"_c10d_functional::{_COLL[k].strip('_')}", "cpu_op", t - 1, dur + 1,
                         tid=tid, **{"External id": next(ext), "Input Dims": [[4, 4]],
                                     "Input type": ["float"]}))
        e_c10d = next(ext)
        ev.append(_x(_C10D[k], "cpu_op", t, dur, tid=tid, **{
            "External id": e_c10d, "Input Dims": [[8, 4], [4, 4]] if rnd.random() < .7 else [],
            "Input type": ["float", "float"]}))
        if rnd.random() < 0.2:  # a tie: a second op on the same interval
            ev.append(_x(_NCCL[k], "user_annotation", t, dur, tid=tid,
                         **{"External id": next(ext), "Input Dims": [[4, 4]],
                            "Input type": ["c10::BFloat16"]}))
        args = {"External id": next(ext)}
        if rnd.random() < 0.5:
            args.update({"Collective name": _COLL[k], "In msg nelems": rnd.choice((16, 32, -1)),
                         "Out msg nelems": rnd.choice((32, 16)), "dtype": "Float"})
        if rnd.random() < 0.5:
            args["Group size"] = rnd.choice((2, 4))
        if pg is not None:
            args["Process Group Name"] = pg
        if rnd.random() < 0.3:
            args["Seq"] = c
        ev.append(_x("record_param_comms", "cpu_op", t + 1, dur - 2, tid=tid, **args))
        e_nccl = next(ext)
        if gloo:
            ev.append(_x(f"gloo:{_COLL[k].strip('_').replace('_base', '')}", "cpu_op",
                         t + rnd.randint(0, 30), 10, tid=10 + rnd.randint(0, 1)))
        elif not fake:
            ev.append(_x(_NCCL[k], "user_annotation", t + 2, dur - 4, tid=tid,
                         **{"External id": e_nccl, "Input Dims": [[4, 4]],
                            "Input type": ["float"]}))
            cr = next(corr)
            link = rnd.random()
            if link < 0.6:  # launched
                ev.append(_x("cudaLaunchKernel", "cuda_runtime", t + 3, 1, tid=tid,
                             correlation=cr, **{"External id": rnd.choice((e_nccl, e_c10d))}))
                kargs = {"correlation": cr, "stream": 7}
            elif link < 0.75:  # no launch: the External id of one op
                kargs = {"correlation": cr, "stream": 7, "External id": e_nccl}
            elif link < 0.85:  # no launch: External id == correlation id
                kargs = {"correlation": cr, "stream": 7, "External id": cr}
            elif link < 0.93:  # an External id two ops carry
                kargs = {"correlation": cr, "stream": 7, "External id": 1}
            else:
                kargs = {"stream": 7}
            if rnd.random() < 0.15:  # newer Kineto: the kernel carries the collective's args
                kargs.update({"Collective name": _COLL[k], "Process Group Name": "0",
                              "In msg nelems": 8, "Out msg nelems": 8, "dtype": "Half"})
            ev.append(_x(rnd.choice(_KERNEL[k:k + 1] + _KERNEL[-2:]), "kernel", t + 30,
                         rnd.randint(5, 50), tid=7, pid=0, **kargs))
        t += rnd.choice((dur + 5, dur // 2, 0))  # overlapping calls on other threads
    if not gloo and not fake:
        ev.append(_x("void gemm", "kernel", 1, 5, tid=7, pid=0, correlation=1, stream=7))
    dist = None
    if seed % 4 != 3:
        groups = {"0": {"pg_name": "0", "size": 4, "ranks": [0, 1, 2, 3], "pg_desc": "default_pg"}}
        if seed % 4 != 2:
            groups["1"] = {"pg_name": "1", "size": 2, "ranks": [0, 1], "pg_desc": "sub"}
        dist = {"rank": 0, "world_size": 4, "backend": "fake" if fake else
                "gloo" if gloo else "nccl", "pg_config": list(groups.values())}
    return ev, dist


@pytest.mark.parametrize("seed", range(60))
def test_identity_stage_matches_the_row_at_a_time_stage(seed):
    events, dist = _random_trace(seed)
    _assert_same(*_classified_both(events, dist))


def test_identity_of_nested_tied_ops_on_two_threads():
    # thread 1: c10d all_gather [10, 60] around record_param_comms [12, 58] (group "1", 16 -> 32
    # elements) around two nccl ops on the same interval [14, 56]; thread 2: an all_reduce whose
    # kernel has no launch and the External id of its nccl op only
    us = 1000
    ev = [
        _x("ProfilerStep#1", "user_annotation", 0, 1000),
        _x("c10d::_allgather_base_", "cpu_op", 10, 50, **{"External id": 100}),
        _x("record_param_comms", "cpu_op", 12, 46, **{
            "External id": 101, "Collective name": "_allgather_base", "In msg nelems": 16,
            "Out msg nelems": 32, "dtype": "BFloat16", "Process Group Name": "1"}),
        _x("nccl:_all_gather_base", "user_annotation", 14, 42, **{"External id": 102}),
        _x("nccl:_all_gather_base", "user_annotation", 14, 42, **{"External id": 103}),
        _x("cudaLaunchKernel", "cuda_runtime", 20, 1, correlation=7, **{"External id": 102}),
        _x("ncclDevKernel_Broadcast_RING_LL", "kernel", 100, 40, tid=7, pid=0, correlation=7,
           stream=7),
        _x("c10d::allreduce_", "cpu_op", 15, 30, tid=2, **{"External id": 200}),
        _x("nccl:all_reduce", "user_annotation", 16, 28, tid=2, **{
            "External id": 201, "Input Dims": [[8]], "Input type": ["float"]}),
        _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 150, 20, tid=7, pid=0,
           correlation=8, stream=7, **{"External id": 201}),
    ]
    dist = {"rank": 0, "world_size": 4, "pg_config": [
        {"pg_name": "0", "size": 4, "ranks": [0, 1, 2, 3]},
        {"pg_name": "1", "size": 2, "ranks": [0, 1]}]}
    new, old = _classified_both(ev, dist)
    _assert_same(new, old)
    k = new[0][new[0]["is_gpu"] & (new[0]["role"] == "comm")].sort_values("ts_ns")
    assert k["ts_ns"].tolist() == [100 * us, 150 * us]
    assert k["coll_kind"].tolist() == ["all_gather", "all_reduce"]
    assert k["rule"].tolist() == ["gpu.nccl_kernel.launch", "gpu.nccl_kernel.launch"]
    assert k["bytes"].tolist() == [64, 32]  # 32 BFloat16; 8 float
    # the all_reduce names no group, and pg_config has one smaller than the world: unknown
    assert k["group_size"].tolist() == [2, -1]
    assert k["pg"].fillna("-").tolist() == ["1", "-"]
    assert k["pg_ranks"].fillna("-").tolist() == ["[0, 1]", "-"]


# --- the corpus --------------------------------------------------------------------------------

def _corpus_traces():
    root = corpus_root()
    if root is None:
        return [pytest.param(None, marks=pytest.mark.skip(reason=skip_reason()))]
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name.endswith((".json", ".json.gz")))


@pytest.mark.integration
@pytest.mark.parametrize("rel", _corpus_traces())
def test_identity_stage_matches_the_row_at_a_time_stage_on_the_corpus(rel):
    from analyzer.ingest.decode import decompress

    path = CORPUS / rel
    dec = decode_bytes(decompress(path.read_bytes(), path), path)
    d = read_distinfo(dec.distributed_info)
    kw = dict(world_size=d.world_size, pg_sizes=d.sizes(), pg_ranks=d.ranks_text(),
              pg_descs=d.descs(), backend=d.backend, path=str(path))
    new = C.classify(dec.events, **kw)
    with oracle.old_identity():
        old = C.classify(dec.events, **kw)
    _assert_same(new, old)


def test_byte_and_group_rules_on_columns_match_the_scalar_rules():
    kinds = ("all_gather", "reduce_scatter", "all_reduce", None)
    names = ("c10d::_allgather_base_", "nccl:_all_gather_base")
    values = (-1, 0, 1, 8, 16, 100, 128)
    for kind in kinds:
        for name in names:
            for a in values:
                for b in values:
                    assert commid.total_bytes(name, kind, a, b, 4) == \
                        oracle.total_bytes(name, kind, a, b, 4)
                    assert commid.total_bytes(name, kind, a, 4, b) == \
                        oracle.total_bytes(name, kind, a, 4, b)
                    assert commid.group_from_counts(kind, a, b) == \
                        oracle.group_from_counts(kind, a, b)
                    assert commid.group_from_tensors(name, kind, a, b) == \
                        oracle.group_from_tensors(name, kind, a, b)


@pytest.mark.parametrize("seed", range(30))
def test_gloo_pairing_matches_the_row_at_a_time_rule(seed):
    rng = np.random.default_rng(2000 + seed)
    n = int(rng.integers(2, 200))
    ts = np.sort(rng.integers(0, 100, n)).astype(np.int64)  # ties in time
    kinds = rng.integers(-1, len(C.KINDS), n).astype(np.int8)
    name_kind = rng.integers(-1, len(C.KINDS), n).astype(np.int8)
    is_gloo = rng.random(n) < 0.5
    c10d, gloo = np.flatnonzero(~is_gloo), np.flatnonzero(is_gloo)
    new = C._pair_gloo(c10d, gloo, kinds, name_kind, ts, np.full(n, -1, np.int64))
    old = oracle._pair_gloo(c10d, gloo, kinds, name_kind, ts, np.full(n, -1, np.int64))
    assert new.tolist() == old.tolist()


@pytest.mark.parametrize("seed", range(30))
def test_gloo_pairing_by_group_matches_the_row_at_a_time_rule(seed):
    rng = np.random.default_rng(3000 + seed)
    n = int(rng.integers(2, 200))
    ts = np.sort(rng.integers(0, 100, n)).astype(np.int64)
    kinds = rng.integers(-1, 3, n).astype(np.int8)
    name_kind = rng.integers(-1, 3, n).astype(np.int8)
    is_gloo = rng.random(n) < 0.5
    c10d, gloo = np.flatnonzero(~is_gloo), np.flatnonzero(is_gloo)
    tid = rng.integers(0, 4, n).astype(np.int64)  # runloop threads, some serving two groups
    pg = np.array([rng.choice(["0", "1", "10", "", None]) for _ in range(n)] + [None],
                  object)[:-1]
    first = oracle._pair_gloo(c10d, gloo, kinds, name_kind, ts, np.full(n, -1, np.int64))
    new = C._pair_gloo_by_group(c10d, gloo, kinds, name_kind, ts, first.copy(), pg, tid)
    old = oracle._pair_gloo_by_group(c10d, gloo, kinds, name_kind, ts, first.copy(), pg, tid)
    assert new.tolist() == old.tolist()


def test_bytes_that_would_not_fit_int64_are_unknown_never_wrapped():
    from analyzer.ingest.commid import total_bytes

    # 2^62 floats: 2^64 bytes; a gathered 2^40 x 4 bytes over 2^30 ranks: 2^72 bytes
    assert total_bytes("nccl:all_gather", "all_reduce", 2**62, 4, 2) == -1
    assert total_bytes("nccl:all_gather", "all_gather", 2**40, 4, 2**30) == -1
    assert total_bytes("nccl:all_gather", "all_gather", 10, 4, 2) == 80  # the piece x the group
    assert total_bytes("c10d::allgather_", "all_gather", 10, 4, 2) == 40  # the whole buffer
