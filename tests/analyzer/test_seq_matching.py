"""Cross-rank matching by Seq / Comms Id, order as the fallback (issue 30 item 1;
analyzer/analyses/matchkey.py, clock.py ``match_rule``).

Hand-built 2-rank NCCL-shaped job, process group "0" (both ranks), one all_reduce per step of
1,000 µs true time; rank 1's clock runs 300 µs ahead. Rank 0's profiler window holds steps
0..4 (all_reduces Seq 1..5), rank 1's begins one all_reduce later: steps 1..4 (Seq 2..5).
In step k (true time T = 1000 k µs) rank 0's kernel runs [T + 100, T + 400), rank 1's
[T + 100 + d_k, T + 400) with d = 20, 40, 60, 80 µs for k = 1..4: both end together, rank 1
starts d_k late. Worked by hand:

with Seq (on the kernel, kineto #1296; or only on record_param_comms, older traces; or a
Comms Id alone, kineto #1300): Seq 2..5 pair the same step; end differences all 300 µs:
offset 300 µs (MAD 0, measured). Skew of Seq k+1 = d_k, rank 1 last; rank 0 waits d_k and
transfers 300 - d_k; rank 1 waits 0, transfers 300 - d_k. Seq 1 is on rank 0 only: not
measured. Rank 0: wait 200 µs, transfer 1,000 µs, not measured 300 µs; stragglers: rank 1
4 times, 200 µs.

without either: order pairs rank 0's k-th with rank 1's k-th (rank 0's step k with rank 1's
step k + 1): ends differ by 1,300 µs each, causality bounds [1,080, 1,600] µs admit it, so a
1,300 µs offset is "measured" -- a shift nobody could tell from a clock offset; the note says
matching fell back to order and that rank 1 has 4 all_reduce in group 0, rank 0 has 5.
"""

from __future__ import annotations

import pytest

from analyzer.analyses import clock, crossrank
from analyzer.analyses.collectives import match_ranks, stragglers
from analyzer.analyses.commsplit import rank_kind_split, wait_transfer
from analyzer.api import load_tables
from tests.merge.builders import meta, write

US = 1000
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
DELAY = {1: 20, 2: 40, 3: 60, 4: 80}
OFFSET_US = {0: 0, 1: 300}
NUMEL = 1 << 20


def _rank(rank: int, key: str) -> dict:
    """One rank (module docstring); ``key``: where the cross-rank key is written ("kernel":
    Seq on the kernel, "cpu": Seq on record_param_comms only, "comms_id": a Comms Id on the
    kernel only, "none")."""
    cpu, tid = 4242, 1
    ev = [meta(cpu, 0, "process_name", name="python3"),
          meta(cpu, tid, "thread_name", name="thread 1 (python3)"),
          meta(0, 0, "process_name", name="GPU 0")]
    coll = {"Collective name": "allreduce", "In msg nelems": NUMEL, "Out msg nelems": NUMEL,
            "Group size": 2, "dtype": "Float", "Process Group Name": "0",
            "Process Group Ranks": "[0, 1]"}
    for k in range(0 if rank == 0 else 1, 5):
        t = 1000 * k + OFFSET_US[rank]
        seq = {"Seq": k + 1}
        cid = {"Comms Id": 9_000_000_000_000_000_000 + k}  # a uint64 beyond int64
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}",
                   "pid": cpu, "tid": tid, "ts": t, "dur": 999})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": cpu,
                   "tid": tid, "ts": t + 10, "dur": 20,
                   "args": {**coll, **(seq if key == "cpu" else {})}})
        corr = 100 + k
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": cpu,
                   "tid": tid, "ts": t + 20, "dur": 1,
                   "args": {"correlation": corr, "External id": corr}})
        start = t + 100 + (DELAY[k] if rank == 1 else 0)
        own = {"kernel": seq, "comms_id": cid}.get(key, {})
        ev.append({"ph": "X", "cat": "kernel", "name": AR, "pid": 0, "tid": 20, "ts": start,
                   "dur": t + 400 - start,
                   "args": {"device": 0, "stream": 20, "correlation": corr,
                            "External id": corr, **coll, **own}})
    return {"schemaVersion": 1, "traceEvents": ev,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2}}


def _job(tmp_path, key: str):
    for r in (0, 1):
        write(tmp_path / key / f"rank{r}.trace.json", _rank(r, key))
    return load_tables(tmp_path / key, jobs=1)


@pytest.mark.parametrize("key", ["kernel", "cpu", "comms_id"])
def test_seq_pairs_the_same_collective(tmp_path, key):
    job = _job(tmp_path, key)
    coll = job.collectives
    want = "Comms Id" if key == "comms_id" else "Seq"
    assert set(coll["seq_source"].astype(str)) == {want}
    if key != "comms_id":
        assert sorted(coll[coll["rank"] == 1]["seq"]) == [2, 3, 4, 5]
        assert sorted(coll[coll["rank"] == 1]["pg_seq"]) == [2, 3, 4, 5]
    offsets = crossrank.clock_offsets(job)
    assert offsets.set_index("rank").loc[1, "offset_ns"] == 300 * US
    assert offsets.set_index("rank").loc[1, "clock"] == "measured"
    assert offsets.equals(clock.clock_offsets(coll))  # the merge's estimator agrees
    note = clock.clock_note(next(offsets.itertuples(index=False)))
    assert note.startswith(f"collectives matched across ranks by {want} ")
    m = crossrank.match_ranks(job, offsets)
    assert m.reset_index(drop=True).equals(match_ranks(coll, offsets).reset_index(drop=True))
    measured = m[m["measured"]]
    assert len(measured) == 4 and len(m) == 5
    assert sorted(measured["start_skew_ns"].astype(int)) == [20 * US, 40 * US, 60 * US, 80 * US]
    assert sorted(measured["max_wait_ns"].astype(int)) == [20 * US, 40 * US, 60 * US, 80 * US]
    assert sorted(measured["transfer_ns"].astype(int)) == [220 * US, 240 * US, 260 * US,
                                                           280 * US]
    assert set(measured["straggler_rank"].astype(int)) == {1}
    s = stragglers(m)
    assert s.to_dict("records") == [{"rank": 1, "times_last": 4, "skew_caused_ns": 200 * US}]
    split = rank_kind_split(coll, wait_transfer(coll, offsets)).set_index("rank")
    assert (split.loc[0, "wait_ns"], split.loc[0, "transfer_ns"],
            split.loc[0, "not_measured_ns"]) == (200 * US, 1000 * US, 300 * US)
    assert (split.loc[1, "wait_ns"], split.loc[1, "transfer_ns"],
            split.loc[1, "not_measured_ns"]) == (0, 1000 * US, 0)


def test_without_seq_order_pairs_and_says_so(tmp_path):
    job = _job(tmp_path, "none")
    coll = job.collectives
    assert set(coll["seq_source"].astype(str)) == {"order"}
    assert (coll["pg_seq"] == -1).all() and (coll["comms_id"] == "").all()
    matched = clock.match_collectives(coll)
    r0 = matched[matched["rank"] == 0].sort_values("seq")
    r1 = matched[matched["rank"] == 1].sort_values("seq")
    # order: rank 0's step k with rank 1's step k + 1 (its k-th collective in the window)
    assert (r1["start_ns"].to_numpy() - r0["start_ns"].to_numpy()).tolist() == \
        [(1000 + 300 + d) * US for d in (20, 40, 60, 80)]
    offsets = crossrank.clock_offsets(job)
    assert offsets.set_index("rank").loc[1, "offset_ns"] == 1300 * US
    note = clock.clock_note(next(offsets.itertuples(index=False)))
    assert note.startswith("collectives matched across ranks by order within process group "
                           "and kind (fallback: no Seq or Comms Id in the traces)")
    assert "windows may begin at different collectives: rank 1 has 4 all_reduce in process " \
           "group 0, rank 0 5" in note


def test_annotated_graph_seq_is_no_key():
    """A CUDA graph replay's Seq was recorded at capture and repeats on every replay
    (analyzer/ingest/graphs.py): a pg whose Seq repeats falls back to order."""
    from analyzer.analyses.matchkey import rank_keys
    import numpy as np

    pg = np.array(["0", "0", "0", "1", "1"], object)
    key, src = rank_keys(pg, np.array([True, True, False, True, True]),
                         np.arange(5, dtype=np.int64), np.array([7, 8, -1, 3, 3]),
                         np.array([None] * 5, object))
    assert key.tolist() == [7, 8, -1, 3, 4] and src.tolist() == ["Seq"] * 3 + ["order"] * 2


@pytest.mark.integration
def test_corpus_job_without_seq_keeps_order_keys():
    """The DLRM set (no Seq, no Comms Id): every key is the order within (rank, pg) by start,
    as before the rule, so no figure moves; the reference row says order was used."""
    import numpy as np

    from tests.corpus import corpus

    job = load_tables(corpus("dlrm_ddp_8rank_v100"))
    c = job.collectives
    assert set(c["seq_source"].astype(str)) == {"order"} and (c["pg_seq"] == -1).all()
    order = c.assign(pos=np.arange(len(c))).sort_values(["rank", "pg", "start_ns", "pos"])
    assert (order["seq"].to_numpy() == order.groupby(["rank", "pg"]).cumcount().to_numpy()).all()
    offsets = crossrank.clock_offsets(job)
    assert clock.clock_note(next(offsets.itertuples(index=False))) == (
        "collectives matched across ranks by order within process group and kind (fallback: "
        "no Seq or Comms Id in the traces)")


def test_order_fallback_is_a_note_and_a_window_shift_a_caveat(tmp_path):
    """In the report: order matching with equal counts per group (every gloo trace) is one of
    the run's notes, off the first screen; with the shift above it is a caveat."""
    from analyzer.compare.runs import analyse

    for r in (0, 1):  # both windows hold steps 1..4: nothing amiss
        doc = _rank(r, "none")
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") != "X" or e["ts"] >= 1000]
        write(tmp_path / "even" / f"rank{r}.trace.json", doc)
    (even,) = analyse(tmp_path / "even").runs
    assert clock.ORDER_FALLBACK in even.notes
    assert not any("matched across ranks" in c for c in even.caveats)
    _job(tmp_path, "none")
    (shifted,) = analyse(tmp_path / "none").runs
    (caveat,) = [c for c in shifted.caveats if "matched across ranks" in c]
    assert caveat.startswith(clock.ORDER_FALLBACK) and "windows may begin" in caveat
