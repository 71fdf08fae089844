"""tracer.trace_names on a hand-built trace shaped like torch 2.13's gloo export."""

from analyzer.timeline.chrome_check import check_trace
from tracer.trace_names import name_tracks


def _trace():
    m = lambda meta, pid, tid, **args: {"ph": "M", "name": meta, "pid": pid, "tid": tid, "args": args}
    x = lambda pid, tid, ts: {"ph": "X", "name": "op", "pid": pid, "tid": tid, "ts": ts, "dur": 1}
    return {"traceEvents": [
        m("process_name", 7, 0, name="python3.11"),
        m("thread_name", 7, 9, name="thread 9 (pt_gloo_runloop)"),
        m("thread_name", 7, 9, name="thread 9 (python3.11)"),
        m("thread_name", 7, 8, name="thread 8 (python3.11)"),
        m("thread_name", 7, 8, name="thread 8 (python3.11)"),
        x(7, 8, 0), x(7, 9, 5), x("Spans", "PyTorch Profiler", 0),
        {"ph": "i", "name": "Iteration Start", "pid": "", "tid": "", "ts": 1, "s": "t"},
    ]}


def test_every_track_named_once_and_timed_events_untouched():
    trace = _trace()
    timed_before = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    assert any("thread_name" in p for p in check_trace(trace))
    name_tracks(trace)
    assert check_trace(trace) == []
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[(7, 9)] == "thread 9 (pt_gloo_runloop)"  # the specific name wins
    assert names[(7, 8)] == "thread 8 (python3.11)"
    assert names[("Spans", "PyTorch Profiler")] == "thread PyTorch Profiler"
    thread_8 = [e for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"
                and e["tid"] == 8]
    assert len(thread_8) == 1  # the exact duplicate is dropped too
    procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {7: "python3.11", "Spans": "Spans", "": "(no pid)"}
    assert [e for e in trace["traceEvents"] if e["ph"] != "M"] == timed_before


def test_names_written_after_the_events_are_not_added_again():
    trace = {"traceEvents": [
        {"ph": "X", "name": "op", "pid": 7, "tid": 1, "ts": 0, "dur": 1},
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "main"}},
    ]}
    out = name_tracks(trace)["traceEvents"]
    meta = [(e["name"], e["args"]["name"]) for e in out if e["ph"] == "M"]
    assert meta == [("process_name", "python"), ("thread_name", "main")]
