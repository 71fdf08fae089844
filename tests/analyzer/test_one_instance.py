"""Cross-rank matches accepted only when they can be one collective (issue 32 items 2 and 7;
analyzer/analyses/clock.py ``one_instance``, commsplit.py, collectives.py ``stragglers``).

Hand-built gloo jobs, both ranks on one clock (true offset 0), one all_reduce of 1,000,000
float32 (4 MB) per ProfilerStep; times in µs from the step's start, worked by hand:

A. "partial": ranks 0 and 64 of 128, process group unknown, steps of 200 ms. Rank 0 runs
   [10 ms, 20 ms) in every step; rank 64 runs [144, 154) ms in steps 0 and 2 (another
   collective: ends 134 ms after rank 0's) and [15, 20) ms in steps 1 and 3. End differences
   134, 0, 134, 0 ms; causality bounds lo = 144 - 20 = 124 ms > hi = 20 - 10 = 10 ms: no single
   offset fits, rank 64's clock is "inconsistent". Before: offset 67 ms applied anyway; rank 0
   "waited" its whole 10 ms in steps 0 and 2 (transfer 0 on half the instances). Now: rank 64's
   clock is not measured (offset 0) and its collectives leave every cross-rank figure, so
   rank 0's instances are matched by nobody: transfer, wait and busbw from transfer are not
   measured (None), no straggler; caveat "partial: 2 of 128 ranks have a trace".
B. "bound": ranks 0 and 1 of 2, steps of 100 ms:
     k  rank 0            rank 1            what
     0  [10, 20) ms       [10, 20) ms       zero-skew tie: nobody is last
     1  [10, 20)          [12, 20)          skew 2 ms, rank 1 last; rank 0 waits 2 ms
     2  [10, 110)         [50, 51)          ends 59 ms apart > shortest 1 ms + 50 µs: not one
     3  [10, 20)          [10, 20)          tie
   End differences 0, 0, -59, 0 ms: offset 0 (MAD 0, lo -8 ms <= hi 10 ms: consistent). Rank 0:
   time 130 ms = wait 2 + transfer 28 + not measured 100; rank 1: 29 ms = 0 + 28 + 1.
   Stragglers: rank 1 once, 2 ms (before: rank 1 twice, 42 ms, and rank 0 twice, 0 ms).
C. "unresolved": ranks 0 and 1 of 2, steps of 100 ms. Rank 0 runs [10, 20) ms; rank 1 starts
   1 ms later and ends d = -2.642, -0.358, +1.926 ms from rank 0's end. Median -358 µs, MAD
   2,284 µs: the offset is smaller than its own spread and 0 is applied. Every end spread is
   under the shortest duration (6.358 ms), so all three instances are one: rank 0 waits 1 ms
   each (3 ms, transfer 27 ms), rank 1 waits 0 (transfer 6.358 + 8.642 + 10.926 = 25.926 ms).
   Before: -358 µs applied, rank 0 waited 1.358 ms each (4.074 ms).
"""

from __future__ import annotations

import json

import pytest

from analyzer.analyses import clock
from analyzer.analyses.collectives import match_ranks, stragglers
from analyzer.analyses.commsplit import rank_kind_split, wait_transfer
from tests.inputs import cli
from tests.merge.builders import meta, write, x

MS = 1_000_000
NUMEL = 1_000_000


def _rank(rank: int, world: int, runs_us: list[tuple[float, float]], step_us: int,
          pg: bool = True) -> dict:
    """One rank: step k = ProfilerStep#k of ``step_us``; its all_reduce runs on the gloo thread
    from step + runs_us[k][0] for runs_us[k][1] µs (enqueued on the main thread just before)."""
    pid, main, gloo = 1000 + rank, 1000 + rank, 2000 + rank
    ev = [meta(pid, 0, "process_name", name="python3"),
          meta(pid, main, "thread_name", name=f"thread {main} (python3)"),
          meta(pid, gloo, "thread_name", name=f"thread {gloo} (pt_gloo_runloop)")]
    for k, (start, dur) in enumerate(runs_us):
        t = k * step_us
        ev.append(x(f"ProfilerStep#{k}", t, step_us - 1, pid=pid, tid=main, cat="user_annotation"))
        ev.append(x("aten::mm", t + 1, 5, pid=pid, tid=main))
        ev.append(x("c10d::allreduce_", t + start - 5, 3, pid=pid, tid=main,
                    **{"Input Dims": [[[NUMEL]]], "Input type": ["TensorList"]}))
        ev.append(x("gloo:all_reduce", t + start, dur, pid=pid, tid=gloo,
                    **{"Input Dims": [[NUMEL]], "Input type": ["float"]}))
    info = {"backend": "gloo", "rank": rank, "world_size": world}
    if pg:
        info.update(pg_count=1, pg_config=[{"pg_name": "0", "pg_size": world,
                                            "ranks": list(range(world))}])
    return {"schemaVersion": 1, "traceEvents": ev, "distributedInfo": info}


PARTIAL = {0: [(10_000, 10_000)] * 4,
           64: [(144_000, 10_000), (15_000, 5_000), (144_000, 10_000), (15_000, 5_000)]}
BOUND = {0: [(10_000, 10_000), (10_000, 10_000), (10_000, 100_000), (10_000, 10_000)],
         1: [(10_000, 10_000), (12_000, 8_000), (50_000, 1_000), (10_000, 10_000)]}
ENDS_US = [-2642, -358, 1926]
UNRESOLVED = {0: [(10_000, 10_000)] * 3,
              1: [(11_000, 9_000 + d) for d in ENDS_US]}


def _job(tmp_path, name: str, runs: dict, world: int, step_us: int, pg: bool = True):
    d = tmp_path / name
    for r, rr in runs.items():
        write(d / f"rank{r}.trace.json", _rank(r, world, rr, step_us, pg))
    return d


def _split(d):
    from analyzer.ingest.pipeline import load_tables

    coll = load_tables(d).collectives
    off = clock.clock_offsets(coll)
    split = wait_transfer(coll, off)
    per = rank_kind_split(coll, split, None).set_index(["rank", "kind"])
    return coll, off.set_index("rank"), split, per


def test_a_partial_set_pairing_different_collectives_is_not_measured(tmp_path):
    d = _job(tmp_path, "partial", PARTIAL, 128, 200_000, pg=False)
    coll, off, split, per = _split(d)
    assert (off.loc[64, "lo_ns"], off.loc[64, "hi_ns"]) == (124 * MS, 10 * MS)
    assert off.loc[64, "clock"] == "inconsistent" and off.loc[64, "offset_ns"] == 0
    assert not split["measured"].any() and (split["transfer_ns"] == 0).all()
    assert per.loc[(0, "all_reduce"), ["transfer_ns", "wait_ns", "not_measured_ns"]].tolist() \
        == [0, 0, 40 * MS]
    m = match_ranks(coll, off.reset_index())
    assert stragglers(m).empty

    from analyzer.compare.runs import analyse

    run = analyse(d).runs[0]
    ar = run.communication["all_reduce"]
    assert (ar.transfer_ns, ar.wait_ns, ar.transfer_busbw_gbps) == (None, None, None)
    assert ar.not_measured_ns == (40 + 30) * MS / 2  # per-rank mean: all of it
    assert {(c.rank, c.transfer_ns, c.wait_ns) for c in run.comm_ranks} == \
        {(0, None, None), (64, None, None)}
    assert "partial: 2 of 128 ranks have a trace" in run.caveats
    assert any(c.startswith("clock offset of rank 64 not measured: its 4 matched collectives "
                            "contradict each other") for c in run.caveats)
    assert {k.rank: (k.clock_offset_ns, k.clock) for k in run.ranks} == \
        {0: (0, "reference"), 64: (None, "inconsistent")}


def test_ends_further_apart_than_one_transfer_are_not_one_instance(tmp_path):
    d = _job(tmp_path, "bound", BOUND, 2, 100_000)
    coll, off, split, per = _split(d)
    assert (off.loc[1, "offset_ns"], off.loc[1, "clock"]) == (0, "measured")
    assert per.loc[(0, "all_reduce"), ["time_ns", "wait_ns", "transfer_ns", "not_measured_ns",
                                       "inconsistent"]].tolist() == [130 * MS, 2 * MS, 28 * MS,
                                                                     100 * MS, 1]
    assert per.loc[(1, "all_reduce"), ["time_ns", "wait_ns", "transfer_ns", "not_measured_ns",
                                       "inconsistent"]].tolist() == [29 * MS, 0, 28 * MS, MS, 1]
    m = match_ranks(coll, off.reset_index()).sort_values("seq")
    assert m["measured"].tolist() == [True, True, False, True]
    skew = m["start_skew_ns"]
    assert skew.isna().tolist() == [False, False, True, False]
    assert skew.fillna(-1).tolist() == [0, 2 * MS, -1, 0]
    # a zero-skew tie is nobody's; the rejected instance is nobody's either
    assert stragglers(m).values.tolist() == [[1, 1, 2 * MS]]


def test_the_report_says_which_instances_are_not_one(tmp_path):
    from analyzer.compare.runs import analyse
    from reports import markdown

    rep = analyse(_job(tmp_path, "bound", BOUND, 2, 100_000))
    run = rep.runs[0]
    ar = run.communication["all_reduce"]
    assert (ar.wait_ns, ar.transfer_ns, ar.not_measured_ns) == (1 * MS, 28 * MS, 50.5 * MS)
    # busbw from transfer: the 3 measured instances per rank, 2 x 3 x 4 MB / (28 + 28) ms
    assert ar.transfer_busbw_gbps == pytest.approx(24e6 / 56e6)
    assert any(c.startswith("2 all_reduce calls (over all ranks) matched by process group, kind "
                            "and order are not one collective") for c in run.caveats)
    md = markdown.render(rep)
    assert "| bound | 0 | all_reduce | 32.50 ms | 7.00 ms | 0.50 ms | 25.00 ms | 4 | 0 | 1 |" \
        in md


def test_summary_stragglers_skip_ties_and_rejected_instances(tmp_path):
    out = tmp_path / "s.json"
    proc = cli("summary", str(_job(tmp_path, "bound", BOUND, 2, 100_000)), "--format", "json",
               "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    s = json.loads(out.read_text())
    assert [{k: r[k] for k in ("rank", "times_last", "skew_caused_ns")}
            for r in s["stragglers"]] == [{"rank": 1, "times_last": 1, "skew_caused_ns": 2 * MS}]
    # its 2 ms: rank 1 records nothing between its step's aten::mm and its late enqueue (a CPU
    # host delay, analyzer/analyses/straggler.py), the peer's gap being 2 ms shorter
    assert (s["stragglers"][0]["cause"], s["stragglers"][0]["host_delay_ns"]) == \
        ("host_delay", 2 * MS)
    rows = sorted(s["cross_rank"], key=lambda r: r["seq"])
    assert [(r["straggler_rank"], r["start_skew_ns"], r["measured"]) for r in rows] == \
        [(None, 0, True), (1, 2 * MS, True), (None, None, False), (None, 0, True)]
    assert any("1 of 4 collectives matched across ranks" in h for h in s["headline"])


def test_an_offset_within_its_own_spread_is_not_applied(tmp_path):
    d = _job(tmp_path, "unresolved", UNRESOLVED, 2, 100_000)
    coll, off, split, per = _split(d)
    assert (off.loc[1, "estimate_ns"], off.loc[1, "mad_ns"]) == (-358_000, 2_284_000)
    assert (off.loc[1, "offset_ns"], off.loc[1, "clock"]) == (0, "unresolved")
    assert split["measured"].all()
    assert per.loc[(0, "all_reduce"), ["wait_ns", "transfer_ns"]].tolist() == [3 * MS, 27 * MS]
    assert per.loc[(1, "all_reduce"), ["wait_ns", "transfer_ns"]].tolist() == [0, 25_926_000]

    from analyzer.compare.runs import analyse

    run = analyse(d).runs[0]
    assert {k.rank: (k.clock_offset_ns, k.clock) for k in run.ranks} == \
        {0: (0, "reference"), 1: (None, "unresolved")}
    assert "clock offset of rank 1 not resolved: -358 µs ± 2,284 µs (smaller than its own " \
           "spread): not applied (0); each matched collective still checked by the " \
           "one-instance bound" in run.caveats


def test_the_partial_caveat_counts_ranks_instead_of_listing_them():
    from analyzer.analyses.summary import partial_caveat

    assert partial_caveat(128, [r for r in range(128) if r not in (0, 64)]) == \
        "partial: 2 of 128 ranks have a trace"
    assert partial_caveat(8, [5]) == "partial: 7 of 8 ranks have a trace (no trace: rank 5)"
    assert partial_caveat(8, [1, 2]) == \
        "partial: 6 of 8 ranks have a trace (no trace: ranks 1, 2)"


@pytest.mark.parametrize("name", ["partial", "bound", "unresolved"])
def test_streamed_cross_rank_phase_gives_the_whole_table_answers(tmp_path, monkeypatch, name):
    # every rank on disk, a batch per rank (analyzer/analyses/crossrank.py): the same offsets,
    # split, matching and sums as the whole-table functions, with a rank's clock not measured
    # and matches rejected by the bound
    import pandas as pd

    from analyzer.analyses import collectives, crossrank
    from analyzer.ingest import pipeline
    from analyzer.ingest.pipeline import load_tables

    runs, world, step = {"partial": (PARTIAL, 128, 200_000), "bound": (BOUND, 2, 100_000),
                         "unresolved": (UNRESOLVED, 2, 100_000)}[name]
    d = _job(tmp_path, name, runs, world, step, pg=name != "partial")
    monkeypatch.setenv("PARITYTRACE_TABLES_MEMORY", "0")
    monkeypatch.setattr(pipeline, "BATCH_BYTES", 1)
    job = load_tables(d)
    coll = job.collectives
    off = crossrank.clock_offsets(job)
    pd.testing.assert_frame_equal(off, clock.clock_offsets(coll, [rt.rank for rt in job.ranks]))
    pd.testing.assert_frame_equal(crossrank.match_ranks(job, off),
                                  collectives.match_ranks(coll, off))
    steps = job.breakdown.groupby("rank")["step"].nunique()
    parts = crossrank.comm_parts(job, off, steps)
    split = wait_transfer(coll, off)
    pd.testing.assert_frame_equal(parts["ranks"], rank_kind_split(coll, split, steps))
    pd.testing.assert_frame_equal(parts["moved"],
                                  collectives.by_kind(crossrank.transfer_rows(coll, split)))


def test_no_instance_on_a_usable_clock_leaves_every_row_not_measured():
    """Every rank's clock unusable (or no instance shared): an empty instance table, so each
    collective's time is all not measured, none of it wait or transfer."""
    import pandas as pd

    from analyzer.analyses.commsplit import latest_starts

    coll = pd.DataFrame({"rank": [1, 1], "pg": ["", ""], "kind": ["all_reduce"] * 2,
                         "start_ns": [100, 500], "end_ns": [300, 900], "dur_ns": [200, 400]})
    empty = latest_starts(pd.DataFrame({"pg": [], "kind": [], "seq": [], "start": [],
                                        "end": [], "dur": []}))
    split = wait_transfer(coll, None, empty)
    assert split["not_measured_ns"].tolist() == [200, 400]
    assert split["wait_ns"].tolist() == [0, 0] and split["transfer_ns"].tolist() == [0, 0]
    assert not split["measured"].any()
