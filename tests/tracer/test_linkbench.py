"""The link benchmark (tracer/linkbench.py, issue 44 Deliver 2 (c)) and ``tracer linkbench``:
groups of every size dividing the world, all at once, rows with a spread, in the link model's
table form, which the analyzer reads and looks up; bad input one line, exit 2."""

from __future__ import annotations

import sys

import pytest

from analyzer.analyses.linkmodel import KINDS, LinkRow, load_curves, lookup
from tests.tracer.helpers import run_tracer
from tracer.linkbench import curves_of, group_sizes, groups_of, spread_ns


def test_group_sizes_are_every_divisor_of_the_world_from_two():
    assert group_sizes(2) == [2]
    assert group_sizes(4) == [2, 4]
    assert group_sizes(12) == [2, 3, 4, 6, 12]
    assert group_sizes(7) == [7]


def test_the_world_splits_into_contiguous_or_strided_groups():
    assert groups_of(4, 2) == [[0, 1], [2, 3]]
    assert groups_of(4, 2, "strided") == [[0, 2], [1, 3]]
    assert groups_of(6, 3, "strided") == [[0, 2, 4], [1, 3, 5]]
    assert groups_of(4, 4) == groups_of(4, 4, "strided") == [[0, 1, 2, 3]]


def test_spread_is_the_10th_and_90th_percentile_widened_to_hold_the_time():
    # 11 calls 0, 10, ..., 100 ns: inclusive percentiles at positions 1 and 9 -> 10 and 90 ns
    calls = list(range(0, 101, 10))
    assert spread_ns(calls, 50) == (10, 90)
    assert spread_ns(calls, 95) == (10, 95)  # a mean of medians above p90: the spread holds it
    assert spread_ns([7], 7) == (7, 7)


def test_curves_hold_each_group_size_the_mean_and_spread_of_all_calls_of_all_ranks():
    # 4 ranks, group sizes 2 and 4, one kind, one size, 3 calls per rank (JSON keys: strings)
    per_rank = [{"2": {"all_reduce": {"1024": calls}}, "4": {"all_reduce": {"1024": [c * 2 for c in calls]}}}
                for calls in ([10, 20, 30], [20, 40, 60], [10, 10, 10], [30, 30, 90])]
    curves = curves_of(per_rank, "bench ({groups} group(s) of {g})", ("all_reduce",), (1024,))
    # pooled 12 calls sorted 10,10,10,10,20,20,30,30,30,40,60,90: mean 360 / 12 = 30 (a median
    # per rank would give 25: the tail of rank 3's 90 ns counts); p10 at position 1.1 -> 10,
    # p90 at position 9.9 -> 40 + 0.9 x 20 = 58
    assert [(c["group_size"], c["source"], c["rows"]) for c in curves] == [
        (2, "bench (2 group(s) of 2)", [{"bytes": 1024, "time_ns": 30, "low_ns": 10, "high_ns": 58}]),
        (4, "bench (1 group(s) of 4)", [{"bytes": 1024, "time_ns": 60, "low_ns": 20, "high_ns": 116}]),
    ]


@pytest.mark.integration
@pytest.mark.parametrize("args, said", [
    (["--nproc", "1"], "tracer: --nproc 1: the link benchmark needs at least 2 processes"),
    (["--iters", "0"], "tracer: --iters 0: time at least 1 call per size"),
    (["--nproc", "4", "--sizes", "1024,1032"],
     "tracer: --sizes 1024,1032: distinct sizes in bytes, each a positive multiple of 16 "
     "(4-byte elements split over up to 4 ranks)"),
    (["--sizes", "1k"], "tracer: '1k': comma-separated sizes in bytes, e.g. 1024,65536"),
    (["--out", "{tmp}/file/links.json"], "tracer: {tmp}/file: is a file, not a folder; pass "
     "--out a file in a folder"),
    (["--out", "{tmp}"], "tracer: {tmp}: --out names an existing directory, not a file; pass a "
     "file name, e.g. --out {tmp}/links.json"),
])
def test_bad_linkbench_options_are_one_line_exit_2(tmp_path, args, said):
    (tmp_path / "file").write_text("")
    args = [a.format(tmp=tmp_path) for a in args]
    out = [] if "--out" in args else ["--out", str(tmp_path / "links.json")]
    proc, _ = run_tracer([*args, *out], tmp_path,
                         module=[sys.executable, "-m", "tracer", "linkbench"])
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", said.format(tmp=tmp_path) + "\n")
    assert not (tmp_path / "links.json").exists()


@pytest.mark.record
def test_linkbench_writes_a_curve_per_group_size_and_kind_the_analyzer_reads(tmp_path):
    out = tmp_path / "links.json"
    proc, _ = run_tracer(["--nproc", "2", "--iters", "2", "--sizes", "1024,4096", "--out",
                          str(out)], tmp_path, module=[sys.executable, "-m", "tracer",
                                                       "linkbench"])
    assert proc.returncode == 0, proc.stderr
    from analyzer.analyses.linkmodel import load_table

    table = load_table(out)
    (arrival,) = table.arrival  # gloo: one arrival curve per group size, at the 3 segments
    assert (arrival.group_size, arrival.nodes, [r.segment_ns for r in arrival.rows]) == (
        2, 1, [1_000_000, 4_000_000, 16_000_000])
    assert "20 compute + all_reduce of 4096 B per rank and segment" in arrival.source
    said = ", ".join(f"{r.wait_ns / 1e6:.2g} ms [{r.low_ns / 1e6:.2g}..{r.high_ns / 1e6:.2g}] "
                     f"after {r.segment_ns / 1e6:g} ms" for r in arrival.rows)
    assert proc.stdout == (f"wrote {out}: 5 curves (g=2; 5 kinds x 2 sizes each); arrival wait "
                           f"per call g=2: {said} of compute\n")
    curves = load_curves(out)
    assert [(c.kind, c.group_size, c.nodes, c.dtype, [r.bytes for r in c.rows])
            for c in curves] == [(k, 2, 1, "float32", [1024, 4096]) for k in KINDS]
    assert all(c.source.startswith("link benchmark on this machine ") and "(gloo, CPU, 2 "
               "processes, 1 contiguous group(s) of 2 at once, mean of 2 calls per rank, spread "
               "p10..p90)" in c.source for c in curves)
    assert all(isinstance(r, LinkRow) and 0 < r.low_ns <= r.time_ns <= r.high_ns
               for c in curves for r in c.rows)
    got = lookup(curves, "all_reduce", 2048, 2, 1)
    lo, hi = curves[0].rows
    assert got.outside == "" and min(lo.time_ns, hi.time_ns) <= got.time_ns <= max(
        lo.time_ns, hi.time_ns)
    assert min(lo.low_ns, hi.low_ns) <= got.low_ns <= max(lo.low_ns, hi.low_ns)


def test_a_time_that_falls_by_half_as_the_size_grows_is_said_to_be_noise():
    from tracer.linkbench import falling

    curves = [{"kind": "all_gather", "group_size": 4, "rows": [
        {"bytes": 65536, "time_ns": 6_100_000}, {"bytes": 1 << 20, "time_ns": 1_750_000}]},
        {"kind": "all_reduce", "group_size": 2, "rows": [  # falls by less than half: kept quiet
            {"bytes": 1024, "time_ns": 200_000}, {"bytes": 4096, "time_ns": 150_000}]}]
    assert falling(curves) == ["all_gather g=4: 6.1 ms at 65,536 B but 1.75 ms at 1,048,576 B: "
                               "noise; rerun on a quiet machine or with more --iters"]


def test_arrival_wait_is_compute_and_call_less_each_alone_the_mean_of_every_iteration():
    from tracer.linkbench import arrival_noise, arrival_of

    # 2 ranks, g = 2, one segment of 1000 ns; per rank compute alone, compute + call, call alone
    per_rank = [{"2": {"1000": {"compute": [1000, 1200], "both": [1500, 1900], "call": [100, 100]}}},
                {"2": {"1000": {"compute": [1100, 1100], "both": [1300, 1700], "call": [200, 200]}}}]
    # compute mean 1100, call mean 150: waits 1500 - 1250 = 250, 650, 50, 450: mean 350;
    # p10 at position 0.3 of 50, 250, 450, 650 -> 110; p90 at 2.7 -> 590
    got = arrival_of(per_rank, "bench ({groups} group(s) of {g})")
    assert got == [{"source": "bench (1 group(s) of 2)", "group_size": 2, "nodes": 1,
                    "rows": [{"segment_ns": 1000, "wait_ns": 350, "low_ns": 110, "high_ns": 590}]}]
    # ranks faster with the call than without (noise): the wait is never below 0, and the
    # mean that was (1000 - 1100 - 150 = -250 ns) is kept and said
    per_rank[0]["2"]["1000"]["both"] = per_rank[1]["2"]["1000"]["both"] = [1000, 1000]
    got = arrival_of(per_rank, "b")
    assert got[0]["rows"] == [{"segment_ns": 1000, "wait_ns": 0, "low_ns": 0, "high_ns": 0,
                               "below_zero_ns": -250}]
    assert arrival_noise(got) == [
        "arrival wait g=2 after 0.001 ms of compute: compute + call took 0.00025 ms less than "
        "compute alone (the load changed between the series), so its 0 ms is noise; rerun on a "
        "quiet machine or with more --iters"]
    quiet = [{"2": {"1000": {"compute": [10], "both": [20], "call": [1]}}}]  # waited 9 ns
    assert arrival_noise(arrival_of(quiet, "b")) == []
