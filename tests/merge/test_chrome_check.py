"""The structural check (analyzer/timeline/chrome_check.py) on hand-built traces with known problems."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.timeline.chrome_check import check_trace, partial_overlaps
from analyzer.timeline.merge import assign_lanes
from tests.merge.builders import meta, named, x


def kinds(problems):
    return sorted({p.split(":")[0] for p in problems})


def test_a_well_formed_trace_passes():
    trace = {"traceEvents": named([
        x("parent", 0, 100), x("child", 10, 20), x("same_start_same_end", 10, 20),
        x("zero_at_parent_end", 100, 0), x("after", 100, 5),
        {"ph": "s", "cat": "c", "name": "f", "id": 1, "pid": 100, "tid": 100, "ts": 10},
        {"ph": "f", "bp": "e", "cat": "c", "name": "f", "id": 1, "pid": 100, "tid": 100, "ts": 100},
        {"ph": "i", "s": "g", "name": "mark", "pid": 100, "tid": 100, "ts": 3},
        {"ph": "C", "name": "mem", "pid": 100, "tid": 100, "ts": 3, "args": {"bytes": 5}},
    ]), "displayTimeUnit": "ms"}
    assert check_trace(trace) == []


def test_partial_overlap_is_reported_with_both_events():
    # 'b' starts inside 'a' (10 < 100) and ends after it (120 > 100): Perfetto would drop/move it
    problems = check_trace({"traceEvents": named([x("a", 0, 100), x("b", 10, 110)])})
    assert kinds(problems) == ["partial_overlap"]
    assert "'b' [10000, 120000] ns starts inside 'a' [0, 100000] ns" in problems[0]


def test_same_times_on_different_threads_do_not_overlap():
    trace = {"traceEvents": named([x("a", 0, 100, tid=100), x("b", 10, 110, tid=101)], tids=(100, 101))}
    assert check_trace(trace) == []


def test_field_rules_from_the_spec():
    trace = {"traceEvents": named([
        x("string_ts", "5", 1),                                   # ts must be a number
        x("negative_dur", 5, -1),                                 # dur >= 0
        {"ph": "X", "name": "no_dur", "pid": 100, "tid": 100, "ts": 1},
        {"ph": "X", "name": "no_pid", "tid": 100, "ts": 1, "dur": 1},
        {"ph": "Q", "name": "bad_phase", "pid": 100, "tid": 100, "ts": 1},
        {"ph": "s", "name": "flow_no_id", "pid": 100, "tid": 100, "ts": 1},
        {"ph": "s", "cat": "c", "name": "lonely", "id": 7, "pid": 100, "tid": 100, "ts": 1},
        {"ph": "E", "name": "end_without_begin", "pid": 100, "tid": 100, "ts": 1},
        {"ph": "i", "s": "x", "name": "bad_scope", "pid": 100, "tid": 100, "ts": 1},
        {"ph": "C", "name": "ctr", "pid": 100, "tid": 100, "ts": 1, "args": {"v": "high"}},
        meta(100, 0, "process_sort_index", sort_index="first"),
        x("bool_ts", True, 1),
    ])}
    assert kinds(check_trace(trace)) == sorted([
        "ts", "dur", "pid_tid", "phase", "flow_id", "flow_unpaired", "unmatched_E",
        "instant_scope", "counter", "metadata"])


def test_names_are_required_and_unique():
    trace = {"traceEvents": [
        meta(1, 0, "process_name", name="p"),
        meta(1, 7, "thread_name", name="thread 7 (python3)"),
        meta(1, 7, "thread_name", name="thread 7 (pt_gloo_runloop)"),
        x("a", 0, 1, pid=1, tid=7), x("b", 0, 1, pid=1, tid=8), x("c", 0, 1, pid=2, tid=9)]}
    problems = check_trace(trace)
    assert sum("has 2 different names" in p for p in problems) == 1
    assert any("pid 1 tid 8 has X events but no thread_name" in p for p in problems)
    assert any("pid 2 has events but no process_name" in p for p in problems)
    assert check_trace(trace, strict_names=False) == []


def test_partial_overlaps_exact_pairs():
    spans = [(0, 100), (10, 20), (50, 150), (60, 70), (200, 300)]
    # (50,150) starts inside (0,100) and ends after it; (60,70) then nests in (0,100) again
    assert partial_overlaps(spans) == [(0, 2)]


def test_assign_lanes_moves_only_the_offender():
    spans = [(0, 100), (10, 20), (50, 150), (60, 70), (140, 160)]
    # (50,150) -> lane 1; (140,160) starts inside (50,150) on lane 1 but lane 0 is free at 140
    assert assign_lanes(spans) == [0, 0, 1, 0, 0]


def _nested_or_disjoint(a, b):
    (s1, e1), (s2, e2) = a, b
    return e1 <= s2 or e2 <= s1 or (s1 <= s2 and e2 <= e1) or (s2 <= s1 and e1 <= e2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30)), max_size=25))
def test_every_lane_is_properly_nested(raw):
    spans = [(s, s + d) for s, d in raw]
    lanes = assign_lanes(spans)
    # oracle: brute force over all pairs on the same lane
    for i, j in itertools.combinations(range(len(spans)), 2):
        if lanes[i] == lanes[j]:
            assert _nested_or_disjoint(spans[i], spans[j]), (spans[i], spans[j])
    # lane 0 keeps everything when nothing partially overlaps
    if not any(not _nested_or_disjoint(a, b) for a, b in itertools.combinations(spans, 2)):
        assert set(lanes) <= {0}
    assert (partial_overlaps(spans) == []) == (not any(lanes))
