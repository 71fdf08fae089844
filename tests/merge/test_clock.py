"""Clock offsets (analyzer.analyses.clock.py) on hand-built collectives with exact answers."""

from __future__ import annotations

import pandas as pd

from analyzer.analyses import clock


def matched(rows):
    """rows: (rank, seq, start_ns, end_ns) of all_reduce in pg "0"."""
    return pd.DataFrame([dict(rank=r, pg="0", kind="all_reduce", seq=s, event_idx=0,
                              start_ns=a, end_ns=b) for r, s, a, b in rows])


def test_offset_is_the_median_of_end_differences_and_mad_their_median_deviation():
    # rank 1's clock is 1_000 ns ahead; its ends jitter by +10, -20, +0, +5 ns and one ends
    # 300 ns late (descheduled): the median and MAD ignore it, a mean would not
    ref = [(0, k, 1000 * k * 10, 1000 * k * 10 + 500) for k in range(5)]
    jitter = [10, -20, 0, 300, 5]
    r1 = [(1, k, s + 1000, e + 1000 + j) for (_, k, s, e), j in zip(ref, jitter)]
    out = clock.estimate_offsets(matched(ref + r1), [0, 1], 0).set_index("rank")
    # diffs 1010, 980, 1000, 1300, 1005 -> median 1005 (mean 1059);
    # |d - 1005| = 5, 25, 5, 295, 0 -> median 5 (mean 66)
    assert out.loc[1, "offset_ns"] == 1005
    assert out.loc[1, "mad_ns"] == 5
    assert out.loc[1, "n_matched"] == 5
    # bounds: lo = max(start1 - end0) = 1000 - 500; hi = min(end1 - start0) = 500 + 1000 - 20
    assert (out.loc[1, "lo_ns"], out.loc[1, "hi_ns"]) == (500, 1480)
    assert out.loc[0, "offset_ns"] == 0


def test_causality_bounds_clamp_a_median_pulled_by_a_late_rank():
    # same clock; rank 1 was descheduled and ended collective 0 800 ns late
    rows = [(0, 0, 0, 100), (0, 1, 1000, 1100), (1, 0, 0, 900), (1, 1, 1000, 1105)]
    out = clock.estimate_offsets(matched(rows), [0, 1], 0).set_index("rank")
    # median(800, 5) = 402 (round half to even of 402.5) lies above hi = min(900 - 0, 1105 - 1000) = 105
    assert out.loc[1, "hi_ns"] == 105 and out.loc[1, "lo_ns"] == -100
    assert out.loc[1, "estimate_ns"] == 105
    assert bool(out.loc[1, "consistent"])
    # MAD = median(|800 - 402|, |5 - 402|) = 398 > 105: the offset is within its own spread,
    # not resolved, and 0 (the true offset here) is applied
    assert (out.loc[1, "mad_ns"], out.loc[1, "clock"], out.loc[1, "offset_ns"]) == \
        (398, "unresolved", 0)


def test_contradictory_bounds_fall_back_to_the_median():
    # collective 1 of rank 1 ends before rank 0 starts it and vice versa: mismatched data
    rows = [(0, 0, 0, 10), (0, 1, 1000, 1010), (1, 0, 500, 510), (1, 1, 0, 10)]
    out = clock.estimate_offsets(matched(rows), [0, 1], 0).set_index("rank")
    assert not bool(out.loc[1, "consistent"])
    assert out.loc[1, "estimate_ns"] == round((500 + -1000) / 2)
    assert (out.loc[1, "clock"], out.loc[1, "offset_ns"]) == ("inconsistent", 0)  # not applied


def test_rank_without_common_collective_is_not_aligned():
    out = clock.estimate_offsets(matched([(0, 0, 0, 10), (1, 0, 0, 12)]), [0, 1, 2], 0).set_index("rank")
    assert out.loc[2, "n_matched"] == 0 and out.loc[2, "offset_ns"] == 0
    assert pd.isna(out.loc[2, "mad_ns"])


def test_match_by_order_within_group_and_kind():
    def colls(rank, kinds):  # the ingest's collectives table: each rank's rows by start
        return pd.DataFrame([dict(rank=rank, pg="0", kind=k, event_idx=i, start_ns=10 * i,
                                  end_ns=10 * i + 5) for i, k in enumerate(kinds)])
    m = clock.match_collectives(pd.concat([
        colls(0, ["all_gather", "reduce_scatter", "all_gather", "send_recv"]),
        colls(1, ["all_gather", "all_gather", "reduce_scatter", "send_recv"])]))
    # send_recv is point to point: never matched; the 2nd all_gather of rank 0 is event 2, of rank 1 event 1
    assert set(m["kind"]) == {"all_gather", "reduce_scatter"}
    ag1 = m[(m["kind"] == "all_gather") & (m["seq"] == 1)].set_index("rank")["event_idx"].to_dict()
    assert ag1 == {0: 2, 1: 1}
