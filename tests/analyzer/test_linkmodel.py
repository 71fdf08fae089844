"""The link model (issue 44, Deliver 2; analyzer/analyses/linkmodel.py): nccl-tests files parsed
to exact rows, curves from a report's measured transfer times, and the lookup's log-log
interpolation, flags and refusals, each against a hand count."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from analyzer.analyses.linkmodel import (LinkCurve, LinkRow, LinkTime, busbw_gbps,
                                         curves_from_report, dump_curves, load_curves, lookup,
                                         parse_nccl_tests)
from analyzer.contract.errors import BadInput
from analyzer.contract.report_types import (CommGroup, CommKind, CommRank, Parity, Ranking,
                                            Report, RunEntry)

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "linkmodel"
# out-of-place time; spread: min and max of the out-of-place and in-place times of the row
ALL_REDUCE_ROWS = [LinkRow(bytes=1024, time_ns=20500, low_ns=20310, high_ns=20500),
                   LinkRow(bytes=4096, time_ns=21300, low_ns=21120, high_ns=21300),
                   LinkRow(bytes=16384, time_ns=24100, low_ns=23960, high_ns=24100),
                   LinkRow(bytes=65536, time_ns=35800, low_ns=35510, high_ns=35800),
                   LinkRow(bytes=1048576, time_ns=210400, low_ns=208900, high_ns=210400)]


def _all_reduce() -> LinkCurve:
    return parse_nccl_tests(FIX / "all_reduce_perf.txt")[0]


def test_nccl_tests_all_reduce_parses_to_its_out_of_place_rows_group_and_hosts():
    curves = parse_nccl_tests(FIX / "all_reduce_perf.txt")
    assert curves == [LinkCurve(source=f"nccl-tests file {FIX / 'all_reduce_perf.txt'}",
                                kind="all_reduce", group_size=4, nodes=2, dtype="float",
                                rows=ALL_REDUCE_ROWS)]


def test_nccl_tests_older_form_behind_mpirun_prefix_takes_its_kind_from_the_name():
    (curve,) = parse_nccl_tests(FIX / "alltoall_perf_mpirun.txt")
    assert (curve.kind, curve.group_size, curve.nodes, curve.dtype) == ("all_to_all", 2, 1,
                                                                       "float")
    assert [(r.bytes, r.time_ns) for r in curve.rows] == [
        (8, 9100), (64, 9200), (512, 9600), (4096, 11200), (32768, 16000)]


def test_busbw_of_a_row_is_the_files_busbw_column():
    # the file's row 65536: busbw column 2.75 (all_reduce on 4 ranks: factor 2 x 3 / 4)
    assert round(busbw_gbps(_all_reduce(), ALL_REDUCE_ROWS[3]), 2) == 2.75


def test_a_file_that_is_not_nccl_tests_output_is_refused_in_one_line():
    path = FIX / "osu_allreduce.txt"
    with pytest.raises(BadInput) as err:
        parse_nccl_tests(path)
    assert err.value.reason == "not_nccl_tests"
    assert str(err.value) == (
        f'{path}: not nccl-tests output: no column header ("#  size  count  type ... time  algbw'
        '  busbw"); pass the output of an nccl-tests binary (all_reduce_perf, all_gather_perf, '
        "reduce_scatter_perf, alltoall_perf, sendrecv_perf) as it printed it")


def test_nccl_tests_table_without_rank_lines_or_kind_is_refused(tmp_path):
    table = (FIX / "all_reduce_perf.txt").read_text().splitlines()
    no_ranks = tmp_path / "all_reduce_perf.txt"
    no_ranks.write_text("\n".join(line for line in table if "Rank" not in line))
    with pytest.raises(BadInput, match="no .* Rank .* lines"):
        parse_nccl_tests(no_ranks)
    no_kind = tmp_path / "out.txt"
    no_kind.write_text("\n".join(line for line in table if "starting" not in line))
    with pytest.raises(BadInput, match="cannot tell which collective"):
        parse_nccl_tests(no_kind)
    assert parse_nccl_tests(no_kind, kind="all_reduce")[0].rows == ALL_REDUCE_ROWS


def test_lookup_at_a_measured_size_is_that_rows_time():
    assert lookup([_all_reduce()], "all_reduce", 4096, 4, 2) == LinkTime(
        time_ns=21300.0, source=_all_reduce().source, low_ns=21120.0, high_ns=21300.0)


def test_lookup_between_two_sizes_interpolates_in_log_log():
    # 8192 is halfway between 4096 and 16384 in log(bytes): log-log interpolation gives the
    # geometric mean of their times, sqrt(21300 x 24100) = 22656.79 ns
    got = lookup([_all_reduce()], "all_reduce", 8192, 4, 2)
    assert got.outside == "" and got.time_ns == pytest.approx(math.sqrt(21300 * 24100), rel=1e-12)
    # 2^18 B between 65536 and 1048576: t = 35800 x 4 ** (log(210400/35800) / log(16))
    t = lookup([_all_reduce()], "all_reduce", 2**18, 4, 2).time_ns
    assert t == pytest.approx(35800 * 4 ** (math.log(210400 / 35800) / math.log(16)), rel=1e-12)


def test_lookup_outside_the_measured_sizes_is_flagged_or_refused():
    curve = _all_reduce()
    assert lookup([curve], "all_reduce", 512, 4, 2) == LinkTime(
        time_ns=20500.0, source=curve.source, outside="below", low_ns=20310.0, high_ns=20500.0)
    assert lookup([curve], "all_reduce", 2 * 1048576, 4, 2) == LinkTime(
        time_ns=420800.0, source=curve.source, outside="above", low_ns=417800.0,
        high_ns=420800.0)
    with pytest.raises(BadInput) as err:
        lookup([curve], "all_reduce", 2 * 1048576, 4, 2, outside="refuse")
    assert str(err.value) == (
        f"all_reduce g=4 n=2: 2097152 bytes is outside the measured sizes 1024..1048576 of "
        f"{curve.source}; measure the curve over the sizes the projection needs")


def test_lookup_of_a_span_without_a_curve_is_refused_naming_the_spans_there_are():
    with pytest.raises(BadInput) as err:
        lookup([_all_reduce()], "all_reduce", 4096, 8, 1)
    assert err.value.reason == "no_link_curve"
    assert str(err.value) == (
        "all_reduce g=8 n=1: no link curve measured on this group span (curves of all_reduce: "
        "g=4 n=2); pass nccl-tests output (all_reduce_perf) measured on 8 ranks over 1 node(s), "
        "or run the link benchmark on such a group")
    with pytest.raises(BadInput, match=r"curves of all_gather: none"):
        lookup([_all_reduce()], "all_gather", 4096, 4, 2)


def test_table_form_round_trips_through_json(tmp_path):
    path = tmp_path / "links.json"
    curves = parse_nccl_tests(FIX / "all_reduce_perf.txt") + parse_nccl_tests(
        FIX / "alltoall_perf_mpirun.txt")
    path.write_text(dump_curves(curves))
    assert load_curves(path) == curves
    path.write_text('[{"source": "x", "kind": "all_reduce", "group_size": 2, "nodes": 1, '
                    '"dtype": "", "rows": [{"bytes": 8, "time_ns": 5}, {"bytes": 8, '
                    '"time_ns": 6}]}]')
    with pytest.raises(BadInput, match="not valid"):
        load_curves(path)


def _run(name: str, kinds: dict, *, world: int = 2, per_host: int = 2) -> RunEntry:
    """A run whose ``kinds`` maps kind -> (count, bytes, [(transfer_ns, measured) per rank],
    [(group_size, pg_ranks)])."""
    comm, groups, ranks = {}, [], []
    for kind, (count, nbytes, per_rank, grps) in kinds.items():
        comm[kind] = CommKind(count=count, time_ns=1.0, bytes=nbytes, busbw_gbps=None,
                              count_per_step=None, time_ns_per_step=None, bytes_per_step=None)
        groups += [CommGroup(kind=kind, pg=str(i), pg_ranks=pr, group_size=g, dtype="Float",
                             count=count, time_ns=1.0, bytes=nbytes, unknown_bytes=0,
                             busbw_gbps=None) for i, (g, pr) in enumerate(grps)]
        ranks += [CommRank(rank=r, kind=kind, count=int(count), time_ns=t, transfer_ns=t,
                           wait_ns=0, unmatched=0, measured=m)
                  for r, (t, m) in enumerate(per_rank)]
    return RunEntry(name=name, strategy="ddp", parity=Parity(status="pass", reason=""),
                    world_size=world, machine={"ranks_on_host": per_host},
                    communication=comm, comm_groups=groups, comm_ranks=ranks)


def test_curves_from_a_reports_measured_transfer_times():
    pair = [(2, "[0, 1]")]
    report = Report(root="/runs", layout="root", ranking=Ranking(
        status="withheld", order=[], reason="", rule=""), runs=[
        # all_reduce of 4096 B: (50000 + 70000) ns over 10 + 10 measured instances = 6000 ns
        _run("ddp.r0", {"all_reduce": (10, 40960.0, [(50000, 10), (70000, 10)], pair),
                        "all_gather": (4, None, [(100, 4), (100, 4)], pair)}),
        # the same size again: 6400 ns; the curve holds their median, 6200 ns
        _run("ddp.r1", {"all_reduce": (10, 40960.0, [(64000, 10), (64000, 10)], pair),
                        # 2 of 4 instances measured: 9000 / 2 = 4500 ns at 16384 B
                        "reduce_scatter": (4, 65536.0, [(9000, 2), (0, 0)], pair)}),
        # world 4 on two hosts of 2 ranks: the group [0, 2] spans 2 nodes
        _run("ddp4", {"all_reduce": (5, 5 * 4096.0, [(10000, 5), (10000, 5)], [(2, "[0, 2]")]),
                      "all_to_all": (2, 200.0, [(10, 2)], [(2, "[0, 1]"), (4, "[0, 1, 2, 3]")])},
             world=4),
    ])
    curves, notes = curves_from_report(report)
    src = "measured in run {} (report /runs)"
    assert curves == [
        LinkCurve(source=src.format("ddp.r0, ddp.r1"), kind="all_reduce", group_size=2, nodes=1,
                  dtype="Float", rows=[LinkRow(bytes=4096, time_ns=6200)]),
        LinkCurve(source=src.format("ddp.r1"), kind="reduce_scatter", group_size=2, nodes=1,
                  dtype="Float", rows=[LinkRow(bytes=16384, time_ns=4500)]),
        LinkCurve(source=src.format("ddp4"), kind="all_reduce", group_size=2, nodes=2,
                  dtype="Float", rows=[LinkRow(bytes=4096, time_ns=2000)]),
    ]
    assert notes == [
        "run ddp.r0: all_gather left out of the link model: the trace does not tell the bytes "
        "of every instance",
        "run ddp4: all_to_all left out of the link model: it runs on groups of sizes [2, 4], "
        "which its per-kind times mix",
    ]
    assert lookup(curves, "all_reduce", 4096, 2, 1).time_ns == 6200.0


def test_curves_from_foreign_traces_take_the_node_count_the_caller_gives():
    run = _run("foreign", {"all_reduce": (2, 8192.0, [(3000, 2), (5000, 2)], [(2, "[0, 1]")])})
    run.machine = None  # foreign traces: no manifest, so no ranks per host
    report = Report(root="/t", layout="traces", runs=[run], ranking=Ranking(
        status="withheld", order=[], reason="", rule=""))
    assert curves_from_report(report) == ([], [
        "run foreign: all_reduce left out of the link model: the nodes its groups span are "
        "unknown (no ranks per host in the manifest: give the node count)"])
    # (3000 + 5000) ns over 2 + 2 measured instances = 2000 ns at 8192 / 2 = 4096 bytes
    assert curves_from_report(report, nodes=1)[0] == [LinkCurve(
        source="measured in run foreign (report /t)", kind="all_reduce", group_size=2, nodes=1,
        dtype="Float", rows=[LinkRow(bytes=4096, time_ns=2000)])]


def test_nccl_tests_keeps_one_curve_per_dtype_the_sum_rows_and_refuses_a_size_twice(tmp_path):
    lines = (FIX / "all_reduce_perf.txt").read_text().splitlines()
    rows = [i for i, line in enumerate(lines) if line.strip().startswith("1024 ")]
    extra = [  # -d all: a half row; -o all: a prod row of float (left out: sum is kept)
        "        1024           512      half     sum      -1     19.00    0.05    0.08    N/A"
        "     19.10    0.05    0.08    N/A",
        "        4096          1024     float    prod      -1     99.99    0.04    0.06      0"
        "     99.10    0.04    0.06      0"]
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text("\n".join(lines[:rows[0]] + extra + lines[rows[0]:]))
    curves = parse_nccl_tests(path)
    assert [(c.dtype, c.rows) for c in curves] == [
        ("half", [LinkRow(bytes=1024, time_ns=19000, low_ns=19000, high_ns=19100)]),
        ("float", ALL_REDUCE_ROWS)]
    path.write_text("\n".join(lines + lines[rows[0]:rows[0] + 1]))
    with pytest.raises(BadInput, match="size 1024 appears twice for float: two runs in one file"):
        parse_nccl_tests(path)


def test_nccl_tests_row_without_an_in_place_time_has_no_spread(tmp_path):
    lines = (FIX / "all_reduce_perf.txt").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("4096 "))
    lines[at] = ("        4096          1024     float     sum      -1     21.30    0.19    0.29"
                 "      0       N/A     N/A     N/A    N/A")
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text("\n".join(lines))
    rows = parse_nccl_tests(path)[0].rows
    assert rows[1] == LinkRow(bytes=4096, time_ns=21300)
    # no spread at 4096: a size between it and 16384 has none; the time still interpolates
    got = lookup([parse_nccl_tests(path)[0]], "all_reduce", 8192, 4, 2)
    assert (got.low_ns, got.high_ns) == (None, None)
    assert got.time_ns == pytest.approx(math.sqrt(21300 * 24100), rel=1e-12)


def test_lookup_interpolates_the_spread_as_the_time():
    # 8192 halfway in log(bytes) between 4096 and 16384: each end the geometric mean of the
    # rows' ends, low sqrt(21120 x 23960), high sqrt(21300 x 24100)
    got = lookup([_all_reduce()], "all_reduce", 8192, 4, 2)
    assert got.low_ns == pytest.approx(math.sqrt(21120 * 23960), rel=1e-12)
    assert got.high_ns == pytest.approx(math.sqrt(21300 * 24100), rel=1e-12)
    # a hand-built curve of exact powers: low 1000 -> 4000 ns, high 3000 -> 12000 ns over
    # 1024 -> 4096 B (slope 1): at 2048 B exactly 2000 and 6000 ns
    curve = LinkCurve(source="hand", kind="all_gather", group_size=2, nodes=1, dtype="",
                      rows=[LinkRow(bytes=1024, time_ns=2000, low_ns=1000, high_ns=3000),
                            LinkRow(bytes=4096, time_ns=8000, low_ns=4000, high_ns=12000)])
    got = lookup([curve], "all_gather", 2048, 2, 1)
    assert (got.time_ns, got.low_ns, got.high_ns) == pytest.approx((4000, 2000, 6000),
                                                                   rel=1e-12)


def test_table_form_keeps_the_spread_and_refuses_one_that_does_not_hold_the_time(tmp_path):
    path = tmp_path / "links.json"
    curves = [LinkCurve(source="hand", kind="send_recv", group_size=2, nodes=1, dtype="float32",
                        rows=[LinkRow(bytes=1024, time_ns=50, low_ns=40, high_ns=70),
                              LinkRow(bytes=2048, time_ns=60)])]
    path.write_text(dump_curves(curves))
    assert load_curves(path) == curves
    path.write_text('[{"source": "x", "kind": "all_reduce", "group_size": 2, "nodes": 1, '
                    '"dtype": "", "rows": [{"bytes": 8, "time_ns": 5, "low_ns": 6}]}]')
    with pytest.raises(BadInput, match=r"0 < low <= time <= high"):
        load_curves(path)


def test_a_report_json_is_a_link_model_of_its_measured_transfers_projections_left_out(tmp_path):
    from analyzer.analyses.linkmodel import read_link_model
    from analyzer.contract.report_types import encode

    pair = [(2, "[0, 1]")]
    real = _run("ddp", {"all_reduce": (10, 40960.0, [(50000, 10), (70000, 10)], pair)})
    fake = _run("ddp-at-2", {"all_gather": (4, 4096.0, [(100, 4), (100, 4)], pair)})
    fake.projection = {"world_size": 2, "roles_run": [0]}
    report = Report(root="/runs", layout="root", runs=[real, fake], ranking=Ranking(
        status="withheld", order=[], reason="", rule=""))
    path = tmp_path / "report.json"
    path.write_text(encode(report))
    # the record's all_reduce only: (50000 + 70000) / 20 = 6000 ns at 4096 B; the projection's
    # fake all_gather measured no transfer
    assert read_link_model([path]) == [LinkCurve(
        source="measured in run ddp (report /runs)", kind="all_reduce", group_size=2, nodes=1,
        dtype="Float", rows=[LinkRow(bytes=4096, time_ns=6000)])]
    only_fake = Report(root="/runs", layout="root", runs=[fake], ranking=report.ranking)
    path.write_text(encode(only_fake))
    with pytest.raises(BadInput, match="its runs measured no transfer"):
        read_link_model([path])
    path.write_text('{"runs": 3}')
    with pytest.raises(BadInput, match="not a report.json the analyzer wrote"):
        read_link_model([path])


def test_two_curves_of_one_kind_and_span_are_refused_not_chosen_by_file_order(tmp_path):
    from analyzer.analyses.linkmodel import read_link_model

    one = LinkCurve(source="a", kind="all_reduce", group_size=2, nodes=1, dtype="float32",
                    rows=[LinkRow(bytes=1024, time_ns=10)])
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(dump_curves([one]))
    b.write_text(dump_curves([LinkCurve(**{**{f: getattr(one, f) for f in one.__struct_fields__},
                                           "source": "b", "rows": [LinkRow(bytes=1024, time_ns=1000)]})]))
    with pytest.raises(BadInput, match="two curves of all_reduce on g=2 n=1 \\(float32\\): a; b"):
        read_link_model([a, b])
    assert read_link_model([a]) == [one]


def _table_text(arrival_rows: list[dict], g: int = 2) -> str:
    import json

    return json.dumps({"curves": [{"source": "bench", "kind": "all_reduce", "group_size": g,
                                   "nodes": 1, "dtype": "float32",
                                   "rows": [{"bytes": 1024, "time_ns": 10}]}],
                       "arrival": [{"source": "bench", "group_size": g, "nodes": 1,
                                    "rows": arrival_rows}]})


def test_a_link_benchmark_table_holds_curves_and_arrival_waits_a_plain_list_still_reads(tmp_path):
    from analyzer.analyses.linkmodel import ArrivalRow, load_table, read_link_table

    new, old = tmp_path / "new.json", tmp_path / "old.json"
    new.write_text(_table_text([{"segment_ns": 1000, "wait_ns": 50, "low_ns": 0, "high_ns": 90}]))
    old.write_text(dump_curves([_all_reduce()]))
    table = load_table(new)
    assert [c.kind for c in table.curves] == ["all_reduce"] and load_curves(new) == table.curves
    assert table.arrival[0].rows == [ArrivalRow(segment_ns=1000, wait_ns=50, low_ns=0, high_ns=90)]
    assert load_table(old).arrival == [] and load_curves(old) == [_all_reduce()]
    both = read_link_table([old, new])  # a table object is not taken for a report.json
    assert len(both.curves) == 2 and both.arrival == table.arrival


@pytest.mark.parametrize("rows", [
    [{"segment_ns": 1000, "wait_ns": 50, "low_ns": 60}],  # low above the wait
    [{"segment_ns": 1000, "wait_ns": -1}],  # a negative wait
    [{"segment_ns": 4000, "wait_ns": 5}, {"segment_ns": 1000, "wait_ns": 5}],  # descending
    [{"segment_ns": 0, "wait_ns": 5}],  # no segment
])
def test_an_arrival_curve_that_is_not_valid_is_refused_in_one_line(tmp_path, rows):
    from analyzer.analyses.linkmodel import load_table

    path = tmp_path / "links.json"
    path.write_text(_table_text(rows))
    with pytest.raises(BadInput, match="arrival curve of g=2 from 'bench' is not valid"):
        load_table(path)


def test_two_arrival_curves_of_one_span_are_refused(tmp_path):
    from analyzer.analyses.linkmodel import read_link_table

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(_table_text([{"segment_ns": 1000, "wait_ns": 5}]))
    b.write_text(_table_text([{"segment_ns": 1000, "wait_ns": 5}], g=4).replace(
        '"group_size": 4, "nodes": 1, "rows": [{"segment', '"group_size": 2, "nodes": 1, '
        '"rows": [{"segment'))
    with pytest.raises(BadInput, match="two arrival curves on g=2 n=1: bench; bench"):
        read_link_table([a, b])


def test_arrival_wait_interpolates_in_log_segment_and_holds_the_nearest_row_outside():
    from analyzer.analyses.linkmodel import ArrivalCurve, ArrivalRow, arrival_wait

    curve = ArrivalCurve(source="s", group_size=4, nodes=1, rows=[
        ArrivalRow(segment_ns=1_000_000, wait_ns=1000, low_ns=0, high_ns=3000),
        ArrivalRow(segment_ns=16_000_000, wait_ns=5000)])  # no spread: the wait itself
    # 4 ms is half-way in log from 1 to 16 ms: 1000 + 0.5 x 4000 = 3000; low 0 + 0.5 x 5000,
    # high 3000 + 0.5 x 2000
    assert arrival_wait([curve], 4, 1, 4_000_000) == pytest.approx((3000, 2500, 4000))
    assert arrival_wait([curve], 4, 1, 100) == (1000, 0, 3000)  # below: the first row's
    assert arrival_wait([curve], 4, 1, 1e9) == (5000, 5000, 5000)  # above: the last row's
    assert arrival_wait([curve], 2, 1, 4_000_000) is None  # no curve of the span


@pytest.mark.parametrize("text", ["{}", '{"arrival": []}'])
def test_an_object_without_runs_is_read_as_a_link_table_and_says_what_it_lacks(tmp_path, text):
    from analyzer.analyses.linkmodel import read_link_table

    path = tmp_path / "links.json"
    path.write_text(text)
    with pytest.raises(BadInput, match="not a link-model table \\(Object missing required field "
                       "`curves`\\)") as got:
        read_link_table([path])
    assert got.value.one_line().endswith("pass a file tracer linkbench wrote")
