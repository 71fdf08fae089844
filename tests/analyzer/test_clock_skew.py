"""Start skew and stragglers on aligned clocks (issue 16 item 8): a hand-built 2-rank gloo job
whose rank 1 clock runs exactly 3600 s ahead. `summary`, `report` and `merge` share one offset
estimator (analyzer/analyses/clock.py) and must agree on it.

Worked by hand (true time, µs; rank 0's clock = true + 1000, rank 1's = true + 1000 + 3600 s):
  all_reduce k   start rank 0   start rank 1   end (both)   aligned skew   last to start
  0              100            130            500          30             rank 1
  1              1150           1100           1500         50             rank 0
  2              2100           2125           2500         25             rank 1
Ends agree on both ranks, so every end difference rank 1 - rank 0 is exactly 3600 s: offset =
median = 3_600_000_000_000 ns, MAD 0; causality bounds 3600 s - 370 µs .. 3600 s + 350 µs.
Stragglers: rank 1 last twice, 30 + 25 = 55 µs; rank 0 last once, 50 µs.
On raw clocks rank 1 would be last every time with ~3600 s of skew each (10800 s in all).
"""

from __future__ import annotations

import json

import pytest

from analyzer.analyses import clock
from analyzer.analyses.collectives import match_ranks, stragglers
from tests.inputs import cli
from tests.merge.builders import meta, write, x

HOUR_US = 3_600_000_000
CLOCK_US = {0: 1000, 1: 1000 + HOUR_US}
STARTS_US = {0: [100, 1150, 2100], 1: [130, 1100, 2125]}
ENDS_US = [500, 1500, 2500]
OFFSET_NS = HOUR_US * 1000


def _rank(rank: int) -> dict:
    pid, main, gloo = 1000 + rank, 1000 + rank, 2000 + rank
    c = CLOCK_US[rank]
    ev = [meta(pid, 0, "process_name", name="python3"),
          meta(pid, main, "thread_name", name=f"thread {main} (python3)"),
          meta(pid, gloo, "thread_name", name=f"thread {gloo} (pt_gloo_runloop)")]
    for k, (start, end) in enumerate(zip(STARTS_US[rank], ENDS_US)):
        ev.append(x(f"ProfilerStep#{k}", c + 1000 * k, 999, pid=pid, tid=main, cat="user_annotation"))
        ev.append(x("aten::mm", c + 1000 * k + 10, 50, pid=pid, tid=main))
        ev.append(x("c10d::allreduce_", c + start - 10, 5, pid=pid, tid=main))
        ev.append(x("gloo:all_reduce", c + start, end - start, pid=pid, tid=gloo))
    return {"schemaVersion": 1, "traceEvents": ev,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2, "pg_count": 1,
                                "pg_config": [{"pg_name": "0", "pg_size": 2, "ranks": [0, 1]}]}}


@pytest.fixture()
def job(tmp_path):
    d = tmp_path / "job"
    for r in (0, 1):
        write(d / f"rank{r}.trace.json", _rank(r))
    return d


def test_offset_is_the_hour_and_skew_is_measured_on_aligned_clocks(job):
    from analyzer.ingest.pipeline import load_tables

    coll = load_tables(job).collectives
    off = clock.clock_offsets(coll).set_index("rank")
    assert off.loc[1, "offset_ns"] == OFFSET_NS and off.loc[1, "mad_ns"] == 0
    assert (off.loc[1, "lo_ns"], off.loc[1, "hi_ns"]) == (OFFSET_NS - 370_000, OFFSET_NS + 350_000)
    m = match_ranks(coll, clock.clock_offsets(coll)).sort_values("seq")
    assert m["start_skew_ns"].tolist() == [30_000, 50_000, 25_000]
    assert m["straggler_rank"].tolist() == [1, 0, 1]
    s = stragglers(m)
    assert s.values.tolist() == [[1, 2, 55_000], [0, 1, 50_000]]
    # control: on raw clocks (no offsets) rank 1 would start every collective an hour after
    # rank 0 ended it: no match is one instance, so none gives a skew or a straggler
    raw = match_ranks(coll, off.iloc[:0].reset_index())
    assert not raw["measured"].any() and raw["straggler_rank"].isna().all()
    assert stragglers(raw).empty


def test_summary_report_and_merge_agree_on_the_offset(job, tmp_path):
    from analyzer.compare.runs import analyse
    from analyzer.timeline.merge import merge_traces
    from reports import markdown

    out = tmp_path / "s.json"
    proc = cli("summary", str(job), "--format", "json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert {o["rank"]: o["offset_ns"] for o in data["clock_offsets"]} == {0: 0, 1: OFFSET_NS}
    assert [(s["rank"], s["times_last"], s["skew_caused_ns"]) for s in data["stragglers"]] == \
        [(1, 2, 55_000), (0, 1, 50_000)]
    assert any("aligned clocks" in line for line in data["headline"])

    table = cli("summary", str(job))
    assert table.returncode == 0, table.stderr
    assert " 3600000.000 " in table.stdout  # the offset shown, to 1 µs (ms in the header)

    merged = merge_traces(job, tmp_path / "m.trace.json.gz")
    assert dict(zip(merged.offsets["rank"], merged.offsets["offset_ns"])) == {0: 0, 1: OFFSET_NS}

    report = analyse(job)
    ranks = {k.rank: k.clock_offset_ns for k in report.runs[0].ranks}
    assert ranks == {0: 0, 1: OFFSET_NS}
    md = markdown.render(report)
    assert "clock offset" in md and "3600000.000 ms" in md
