"""Communication split into transfer and waiting for the slowest rank (issue 20 item 4,
analyzer/analyses/commsplit.py).

Hand-built 2-rank gloo job, worked by hand (true time, µs; rank 1's clock runs 3600 s ahead,
so the split must use aligned clocks): in each of 2 steps one all_reduce of 1,000,000 float32
(4 MB); rank 0 starts it at step + 1000, rank 1 at step + 44000 (43 ms late), both end at step +
51000. Wait: rank 0 43 ms per instance, rank 1 0; transfer (last start .. end): 7 ms on both.
Rank 0 also runs one broadcast that rank 1 never runs: unmatched, so not measured (neither
wait nor transfer: nothing shows either).
Per rank over the trace: rank 0 all_reduce 100 ms = 86 ms wait + 14 ms transfer; rank 1 14 ms =
0 + 14. busbw (nccl-tests, all_reduce factor 2(n-1)/n = 1): from the whole durations 2 x 4 MB /
mean time (100 + 14) / 2 ms = 0.140 GB/s; from transfer time 8 MB / 14 ms = 0.571 GB/s.
"""

from __future__ import annotations

import pandas as pd
import pytest

from analyzer.analyses import clock
from analyzer.analyses.collectives import by_kind
from analyzer.analyses.commsplit import rank_kind_split, wait_transfer
from tests.merge.builders import meta, write, x

HOUR_US = 3_600_000_000
CLOCK_US = {0: 0, 1: HOUR_US}
START_US = {0: 1000, 1: 44000}
END_US = 51000
STEP_US = 100_000
MS = 1_000_000
NUMEL = 1_000_000


def _rank(rank: int) -> dict:
    pid, main, gloo = 1000 + rank, 1000 + rank, 2000 + rank
    c = CLOCK_US[rank]
    ev = [meta(pid, 0, "process_name", name="python3"),
          meta(pid, main, "thread_name", name=f"thread {main} (python3)"),
          meta(pid, gloo, "thread_name", name=f"thread {gloo} (pt_gloo_runloop)")]
    for k in range(2):
        t = c + k * STEP_US
        ev.append(x(f"ProfilerStep#{k}", t, STEP_US - 1, pid=pid, tid=main, cat="user_annotation"))
        ev.append(x("aten::mm", t + 10, 50, pid=pid, tid=main))
        ev.append(x("c10d::allreduce_", t + START_US[rank] - 5, 3, pid=pid, tid=main,
                    **{"Input Dims": [[[NUMEL]]], "Input type": ["TensorList"]}))
        ev.append(x("gloo:all_reduce", t + START_US[rank], END_US - START_US[rank], pid=pid,
                    tid=gloo, **{"Input Dims": [[NUMEL]], "Input type": ["float"]}))
    if rank == 0:  # a collective no other rank runs: unmatched
        ev.append(x("c10d::broadcast_", c + 60000, 3, pid=pid, tid=main))
        ev.append(x("gloo:broadcast", c + 60005, 2000, pid=pid, tid=gloo))
    return {"schemaVersion": 1, "traceEvents": ev,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2, "pg_count": 1,
                                "pg_config": [{"pg_name": "0", "pg_size": 2, "ranks": [0, 1]}]}}


@pytest.fixture()
def job(tmp_path):
    d = tmp_path / "job"
    for r in (0, 1):
        write(d / f"rank{r}.trace.json", _rank(r))
    return d


def test_late_rank_makes_the_other_wait_and_transfer_is_equal(job):
    from analyzer.ingest.pipeline import load_tables

    coll = load_tables(job).collectives
    split = wait_transfer(coll, clock.clock_offsets(coll))
    t = pd.concat([coll[["rank", "kind", "dur_ns"]], split], axis=1)
    ar = t[t["kind"] == "all_reduce"].sort_values(["rank"], kind="stable")
    assert ar["wait_ns"].tolist() == [43 * MS, 43 * MS, 0, 0]
    assert ar["transfer_ns"].tolist() == [7 * MS] * 4
    assert ar["matched"].all()
    bc = t[t["kind"] == "broadcast"]
    assert bc[["wait_ns", "transfer_ns", "not_measured_ns", "matched", "measured"]
              ].values.tolist() == [[0, 0, 2 * MS, False, False]]
    # control: on raw clocks rank 1 (an hour ahead) would look last by an hour and rank 0
    # would wait its whole duration
    raw = wait_transfer(coll, None)
    assert raw.loc[ar.index[:2], "transfer_ns"].tolist() == [0, 0]


def test_wait_plus_transfer_is_the_comm_time_per_rank(job):
    from analyzer.ingest.pipeline import load_tables

    coll = load_tables(job).collectives
    split = wait_transfer(coll, clock.clock_offsets(coll))
    per = rank_kind_split(coll, split, pd.Series({0: 2, 1: 2})).set_index(["rank", "kind"])
    assert per.loc[(0, "all_reduce"), ["time_ns", "wait_ns", "transfer_ns"]].tolist() == \
        [100 * MS, 86 * MS, 14 * MS]
    assert per.loc[(1, "all_reduce"), ["time_ns", "wait_ns", "transfer_ns"]].tolist() == \
        [14 * MS, 0, 14 * MS]
    assert per.loc[(0, "all_reduce"), "wait_ns_per_step"] == 43 * MS
    assert per.loc[(0, "broadcast"), "unmatched"] == 1
    # the comm time a second way: by_kind's sum of durations
    k = by_kind(coll).set_index(["rank", "kind"])
    assert (per["wait_ns"] + per["transfer_ns"] + per["not_measured_ns"]).to_dict() == \
        k["time_ns"].to_dict()
    assert per.loc[(0, "broadcast"), ["transfer_ns", "not_measured_ns"]].tolist() == [0, 2 * MS]


def test_report_shows_the_split_and_busbw_from_transfer_time(job):
    from analyzer.compare.runs import analyse
    from reports import markdown

    rep = analyse(job)
    run = rep.runs[0]
    ar = run.communication["all_reduce"]
    assert (ar.wait_ns, ar.transfer_ns) == (43 * MS, 14 * MS)  # per-rank means: 86/2, 28/2
    assert ar.wait_ns + ar.transfer_ns == ar.time_ns
    assert ar.bytes == 2 * 4 * NUMEL
    assert ar.busbw_gbps == pytest.approx(8e6 / 57e6)  # whole durations: mean 57 ms
    assert ar.transfer_busbw_gbps == pytest.approx(8e6 / 14e6)
    rows = {(c.rank, c.kind): c for c in run.comm_ranks}
    assert (rows[0, "all_reduce"].wait_ns, rows[1, "all_reduce"].wait_ns) == (86 * MS, 0)
    md = markdown.render(rep)
    comm = md[md.index("## Communication"):]
    assert "| job | 0 | all_reduce | 50.00 ms | 7.00 ms | 43.00 ms |" in comm
    assert "| job | 1 | all_reduce | 7.00 ms | 7.00 ms | 0.00 ms |" in comm
    assert "0.571" in comm  # busbw from transfer time shown; the distorted one is not
    assert "0.140" not in comm


def test_summary_uses_the_same_split(job, tmp_path):
    # `analyzer summary`'s cross-rank table: per instance the shortest transfer (7 ms) and
    # the longest wait (rank 0's 43 ms), the report's rule (summary matches by (pg, order)
    # across kinds: rank 0's extra broadcast shifts its later instances, kinds_agree False)
    from tests.inputs import cli

    import json

    out = tmp_path / "s.json"
    proc = cli("summary", str(job), "--format", "json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in json.loads(out.read_text())["cross_rank"]
            if r["kinds_agree"] and r["n_ranks"] == 2]
    assert [(r["kind"], r["transfer_ns"], r["max_wait_ns"]) for r in rows] == \
        [("all_reduce", 7 * MS, 43 * MS)]
