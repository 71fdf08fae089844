"""`analyzer merge` on a hand-built 3-rank gloo job whose clock offsets and jitter are known."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from analyzer.timeline.chrome_check import check_trace
from analyzer.cli.app import app
from analyzer.contract.errors import BadInput
from analyzer.ingest import decode
from analyzer.timeline import merge
from analyzer.timeline.merge import MergeOptions, merge_traces
from tests.merge.builders import gloo_rank, read, write, x

# true end of the gloo all_reduce of step k, per rank (us); the jitter is the test's oracle
ENDS = {0: [500, 1500, 2500, 3500, 4500],
        1: [501, 1502, 2499, 3500, 4503],
        2: [500, 1500, 2500, 3500, 4493]}
# every clock starts 1000 us after 0: trace times are never negative (the ingest skips such
# events, for every command), and the offsets between ranks are what the test is about
OFFSET_US = {0: 1000.0, 1: 2000.0, 2: 749.5}
# rank r's end differences to rank 0 (us): rank 1: 1000 + [1, 2, -1, 0, 3] -> median 1001, MAD 1
# rank 2: -250.5 + [0, 0, 0, 0, -7] -> median -250.5, MAD 0
EXPECTED = {0: (0, 0), 1: (1_001_000, 1_000), 2: (-250_500, 0)}
OVERLAPPER = x("aten::overlapping", 2000 + 40, 40, pid=1001, tid=1001)  # rank 1, step 0: [40, 80] vs mm [10, 60]


@pytest.fixture()
def job(tmp_path):
    d = tmp_path / "job"
    for r in range(3):
        extra = [OVERLAPPER] if r == 1 else []
        write(d / f"rank{r}.trace.json.gz", gloo_rank(r, 3, offset_us=OFFSET_US[r], ends_us=ENDS[r], extra=extra))
    return d


def x_events(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_offsets_are_the_constructed_ones(job, tmp_path):
    res = merge_traces(job, tmp_path / "m.trace.json.gz")
    got = {row.rank: (row.offset_ns, row.mad_ns) for row in res.offsets.itertuples()}
    assert got == EXPECTED
    side = read(res.sidecar_path)
    assert {o["rank"]: (o["offset_ns"], o["mad_ns"]) for o in side["offsets"]} == EXPECTED
    assert side["ref_rank"] == 0 and side["matched_collectives"] == 5


def test_merged_trace_is_viewer_clean_and_keeps_every_event(job, tmp_path):
    res = merge_traces(job, tmp_path / "m.trace.json.gz")
    merged = read(res.out_path)
    assert check_trace(merged) == []
    n_in = sum(len(x_events(read(p))) for p in job.glob("*.trace.json.gz"))  # not the caches
    assert len(x_events(merged)) == n_in == 3 * 5 * 4 + 1
    procs = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {1: "rank 0", 2: "rank 1", 3: "rank 2"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in merged["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    # the partially overlapping event sits alone on an overlap track of rank 1's main thread
    moved = [e for e in x_events(merged) if e["name"] == "aten::overlapping"]
    assert threads[(moved[0]["pid"], moved[0]["tid"])] == "thread 1001 (python3) (overlap 1)"
    assert res.n_moved_to_overlap_tracks == 1
    # the ProfilerStep thread comes first in every rank
    first = {pid: name for (pid, tid), name in threads.items() if tid == 1}
    assert first == {1: "thread 1000 (python3)", 2: "thread 1001 (python3)", 3: "thread 1002 (python3)"}


def test_collective_ends_line_up_after_alignment(job, tmp_path):
    merged = read(merge_traces(job, tmp_path / "m.trace.json.gz").out_path)
    ends: dict[int, list[float]] = {}
    for e in sorted(x_events(merged), key=lambda e: e["ts"]):
        if e["name"] == "gloo:all_reduce":
            ends.setdefault(e["pid"] - 1, []).append(e["ts"] + e["dur"])
    # after alignment rank r's end - rank 0's end = true jitter - (median jitter of rank r)
    for r, med_jitter_us in ((1, 1.0), (2, 0.0)):
        for k in range(5):
            expect = ENDS[r][k] - ENDS[0][k] - med_jitter_us
            assert ends[r][k] - ends[0][k] == pytest.approx(expect, abs=1e-6)
    flows = [e for e in merged["traceEvents"] if e.get("cat") == "collective"]
    assert len(flows) == 5 * 2 * 2  # 5 collectives, 3 ranks -> 2 links of (s, f) each
    assert all(e["ph"] == "s" or e.get("bp") == "e" for e in flows)


def test_steps_limit_the_events(job, tmp_path):
    res = merge_traces(job, tmp_path / "m.json", MergeOptions(steps=(1, 2)))
    merged = read(res.out_path)
    steps = sorted({e["name"] for e in x_events(merged) if e["name"].startswith("ProfilerStep")})
    assert steps == ["ProfilerStep#1", "ProfilerStep#2"]
    assert len(x_events(merged)) == 3 * 2 * 4
    assert check_trace(merged) == []


def test_merge_decodes_each_rank_once_after_the_ingest(job, tmp_path, monkeypatch):
    """Per rank, merge reads the JSON twice: the ingest's decoder (the event table and the
    other events' times in one pass) and the tree of events it copies; nothing else."""
    parses: list[str] = []
    real_decode, real_tree, real_read = decode.decode_bytes, merge._TREE, merge._read_rank
    reading = False

    def counted_decode(*args, **kwargs):
        if reading:  # not the ingest's (cache misses in this process)
            parses.append("decode")
        return real_decode(*args, **kwargs)

    class CountedTree:
        def decode(self, raw):
            parses.append("tree")
            return real_tree.decode(raw)

    def read_rank(rt):
        nonlocal reading
        reading = True
        try:
            return real_read(rt)
        finally:
            reading = False

    for mod in (decode, merge):
        monkeypatch.setattr(mod, "decode_bytes", counted_decode)
    monkeypatch.setattr(merge, "_TREE", CountedTree())
    monkeypatch.setattr(merge, "_read_rank", read_rank)
    res = merge_traces(job, tmp_path / "m.trace.json.gz")
    assert len(res.ranks) == 3
    assert sorted(parses) == ["decode"] * 3 + ["tree"] * 3


def test_no_align_keeps_each_clock(job, tmp_path):
    res = merge_traces(job, tmp_path / "m.json", MergeOptions(align=False))
    merged = read(res.out_path)
    step0 = {e["pid"] - 1: e["ts"] for e in x_events(merged) if e["name"] == "ProfilerStep#0"}
    # rebased on the earliest event (rank 2 at 749.5 us): differences are the raw clock offsets
    assert step0 == {0: 250.5, 1: 1250.5, 2: 0}


def run_cli(*args):
    return CliRunner().invoke(app, ["merge", *map(str, args)])


def test_cli_prints_offsets_and_writes_default_output(job):
    res = run_cli(job)
    assert res.exit_code == 0, res.output
    assert "1,001.0" in res.output and "-250.5" in res.output
    assert (job / "merged.trace.json.gz").exists() and (job / "merged.offsets.json").exists()
    # a second merge of the same folder ignores the merged file and the sidecar
    assert run_cli(job).exit_code == 0


def test_bad_inputs_are_one_line_errors(job, tmp_path):
    dup = tmp_path / "dup"
    write(dup / "a.json", gloo_rank(0, 2, offset_us=0, ends_us=[500]))
    write(dup / "b.json", gloo_rank(0, 2, offset_us=0, ends_us=[500]))
    res = run_cli(dup)
    assert res.exit_code == 2 and "a.json and " in res.output and "both files are rank 0" in res.output
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank0.json").write_text("{not json")
    assert run_cli(bad).exit_code == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no" in run_cli(empty).output
    assert run_cli(job, "--steps", "7").exit_code == 2
    assert run_cli(job, "--steps", "3-1").exit_code == 2
    assert "Traceback" not in run_cli(job, "--steps", "x").output
    with pytest.raises(BadInput, match="no trace of rank 5"):
        merge_traces(job, tmp_path / "m.json", MergeOptions(ref_rank=5))
