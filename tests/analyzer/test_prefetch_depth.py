"""FSDP prefetch depth and the group each unit gathers over (issue 45), on a hand-built CPU
FSDP2 step with exact answers: forward at explicit depth 2, backward at depth 1 over a
post-forward group of 2 ranks (``reshard_after_forward=2`` on 4 ranks)."""

from __future__ import annotations

from analyzer.analyses import crossrank, prefetch
from tests.reports.builders import event, events


def ann(name, ts, end):
    return event(name, ts, end, role="annotation", cat="user_annotation")


def gloo(ts, end, group_size):
    row = event("gloo:all_gather", ts, end, role="comm", tid="gloo", coll_kind="all_gather")
    row["group_size"] = group_size
    return row


def depth_two_forward_depth_one_backward():
    """Units a, b, c. Forward: a's pre_forward issues its own all_gather, then prefetches b and
    c (depth 2): a 0, b 1 (issued one unit before its use), c 2. Backward (reverse order): c's
    own, then c prefetches b, b prefetches a (depth 1): c 0, b 1, a 1. Forward all_gathers run
    over 4 ranks, backward's over the post-forward group of 2."""
    rows = [
        ann("ProfilerStep#0", 0, 2000),
        ann("FSDP::pre_forward (a)", 100, 300), ann("FSDP::all_gather (a)", 110, 130),
        ann("FSDP::forward_prefetch for b", 140, 180), ann("FSDP::all_gather (b)", 150, 170),
        ann("FSDP::forward_prefetch for c", 190, 230), ann("FSDP::all_gather (c)", 200, 220),
        ann("FSDP::all_gather_copy_out (a)", 240, 250),
        ann("FSDP::pre_forward (b)", 400, 450), ann("FSDP::all_gather_copy_out (b)", 410, 420),
        ann("FSDP::pre_forward (c)", 600, 650), ann("FSDP::all_gather_copy_out (c)", 610, 620),
        ann("FSDP::pre_backward (c)", 1000, 1100), ann("FSDP::all_gather (c)", 1010, 1020),
        ann("FSDP::all_gather_copy_out (c)", 1022, 1025),
        ann("FSDP::backward_prefetch for b", 1030, 1060), ann("FSDP::all_gather (b)", 1040, 1050),
        ann("FSDP::pre_backward (b)", 1200, 1300), ann("FSDP::all_gather_copy_out (b)", 1202, 1205),
        ann("FSDP::backward_prefetch for a", 1210, 1240), ann("FSDP::all_gather (a)", 1220, 1230),
        ann("FSDP::pre_backward (a)", 1400, 1500), ann("FSDP::all_gather_copy_out (a)", 1402, 1405),
        gloo(115, 128, 4), gloo(152, 168, 4), gloo(202, 218, 4),
        gloo(1012, 1018, 2), gloo(1042, 1048, 2), gloo(1222, 1228, 2),
    ]
    for r in rows:
        r.setdefault("group_size", -1)
    ev = events(rows)
    ev["group_size"] = ev["group_size"].astype("int64")
    return ev


def test_prefetch_depth_is_read_per_all_gather():
    t = prefetch.prefetch_table(depth_two_forward_depth_one_backward(), rank=0)
    got = list(zip(t["phase"], t["unit"], t["prefetched"], t["ahead_units"], t["group_size"]))
    assert got == [("forward", "a", False, 0, 4), ("forward", "b", True, 1, 4),
                   ("forward", "c", True, 2, 4), ("backward", "c", False, 0, 2),
                   ("backward", "b", True, 1, 2), ("backward", "a", True, 1, 2)]


def test_units_report_their_most_units_ahead_and_group():
    table = prefetch.prefetch_table(depth_two_forward_depth_one_backward(), rank=0)

    class OneBatch:
        def batches(self, name):
            return [(None, table)]

    units, _ = crossrank.prefetch_parts(OneBatch())
    got = [(u["phase"], u["unit"], u["ahead_units"], u["group_size"])
           for u in units.to_dict("records")]
    assert got == [("forward", "a", 0, 4), ("forward", "b", 1, 4), ("forward", "c", 2, 4),
                   ("backward", "c", 0, 2), ("backward", "b", 1, 2), ("backward", "a", 1, 2)]


def test_ahead_is_unknown_without_the_units_own_hook():
    rows = [ann("ProfilerStep#0", 0, 500), ann("FSDP::pre_forward (a)", 100, 300),
            ann("FSDP::forward_prefetch for b", 140, 180), ann("FSDP::all_gather (b)", 150, 170)]
    t = prefetch.prefetch_table(events(rows), rank=0)
    assert t["ahead_units"].isna().all() and t["group_size"].isna().all()



def test_runs_differing_only_in_fsdp2_prefetch_depth_are_compared_side_by_side():
    from analyzer.compare import ranking
    from types import SimpleNamespace

    from analyzer.contract.report_types import Parity, RunEntry
    from reports.markdown import prefetch_group_rows

    def run(name, depth, reshard=True):
        return RunEntry(name=name, strategy="fsdp2", settings={"seed": 0}, parity=Parity(
            status="pass", reason=""), options={"reshard_after_forward": reshard, "fsdp2_prefetch": {
                "forward": depth, "backward": depth or "implicit"}})
    runs = [run("p0", 0), run("p1", 1), run("p2", 2), run("p2r", 2, reshard=2)]
    assert ranking.prefetch_groups(runs) == [["p0", "p1", "p2"]]
    head, rows = prefetch_group_rows(SimpleNamespace(runs=runs), ["p0", "p2"])
    assert head[3] == "fsdp2_prefetch (forward / backward)"
    assert [r[3] for r in rows] == ["0 / implicit", "2 / 2"]
