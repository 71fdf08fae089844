"""Events that are odd but analysed: bad or non-finite ts/dur skipped, counted and said; names
with HTML, quotes and invalid UTF-8; integers beyond int64; no ProfilerStep (whole-trace mode);
improperly nested events. The rest of the rank is analysed and the step identity holds."""

from __future__ import annotations

import pytest

import re

from analyzer.api import load_events, load_tables
from tests.inputs import DLRM, cli, copy_run, load, need, save
from tests.reports.builders import caveats, context

IDENTITY = ["compute_ns", "exposed_comm_ns", "data_wait_ns", "other_ns", "idle_ns"]


@pytest.mark.integration
def test_events_with_bad_ts_or_dur_are_skipped_counted_and_said(tmp_path):
    t = load(need(DLRM / "worker0.pt.trace.json.gz"))
    xs = [e for e in t["traceEvents"] if e.get("ph") == "X"]
    n_x = len(xs)
    del xs[0]["ts"]
    xs[1]["ts"] = -5
    xs[2]["ts"] = "abc"
    xs[3]["dur"] = None
    xs[4]["dur"] = -1
    xs[5]["dur"] = [1]
    save(tmp_path / "job" / "worker0.json.gz", t)
    ts = load_tables(tmp_path / "job")
    rank = ts.ranks[0]
    # the rest is analysed: exactly six events fewer than the file's complete events
    assert len(load_events(rank.path)[0]) == n_x - 6
    assert any("skipped 3 complete events" in w and "ts" in w for w in rank.warnings)
    assert any("skipped 3 complete events" in w and "dur" in w for w in rank.warnings)
    b = ts.breakdown
    assert (b[IDENTITY].sum(axis=1) == b["step_ns"]).all()
    proc = cli("summary", str(tmp_path / "job"))
    assert proc.returncode == 0 and "skipped 3 complete events" in proc.stdout
    proc = cli("report", str(tmp_path / "job"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0 and "skipped 3 complete events" in proc.stdout


def test_nan_and_infinity_times_are_skipped_and_counted(tmp_path, ddp_run):
    """Python's json writes NaN / Infinity (not JSON): those events are skipped and counted,
    the rest of the rank analysed, as for any other non-numeric time."""
    job = copy_run(ddp_run, tmp_path / "ddp")
    t = load(job / "rank0.trace.json.gz")
    xs = [e for e in t["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"
          and e["name"].startswith("aten::")]
    xs[0]["ts"], xs[1]["dur"], xs[2]["dur"] = float("nan"), float("inf"), float("-inf")
    xs[3]["name"] = "NaN"  # the word in a string stays a name
    save(job / "rank0.trace.json.gz", t)
    assert b"NaN" in load_bytes(job / "rank0.trace.json.gz")
    ts = load_tables(job)
    rank = ts.ranks[0]
    events = load_events(rank.path)[0]
    assert any("NaN / Infinity" in w for w in rank.warnings)
    assert any("skipped 1 complete events" in w and "ts" in w for w in rank.warnings)
    assert any("skipped 2 complete events" in w and "dur" in w for w in rank.warnings)
    assert "NaN" in set(events["name"].astype(str))
    n_clean = len(load_events(copy_run(ddp_run, tmp_path / "clean") / "rank0.trace.json.gz")[0])
    assert len(events) == n_clean - 3
    proc = cli("report", str(job), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr


def load_bytes(path) -> bytes:
    import gzip
    return gzip.decompress(path.read_bytes())


def test_names_with_html_quotes_backslashes_and_invalid_utf8(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    t = load(job / "rank0.trace.json.gz")
    evil = '<script>alert("x")</script> | a\\b \'q\' \udcff'
    n = 0
    for e in t["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e["name"].startswith("aten::"):
            e["name"] = evil
            n += 1
    assert n
    raw = __import__("json").dumps(t, ensure_ascii=False).encode("utf-8", "surrogateescape")
    assert b"\xff" in raw  # the file really holds a byte that is not UTF-8
    save(job / "rank0.trace.json.gz", raw)
    ts = load_tables(job)
    names = set(load_events(ts.ranks[0].path)[0]["name"].astype(str))
    assert evil.replace("\udcff", "\ufffd") in names
    assert any("invalid UTF-8" in w for w in ts.ranks[0].warnings)
    proc = cli("report", str(job), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert "<script>" not in (tmp_path / "o" / "report.html").read_text()
    proc = cli("merge", str(job), "-o", str(tmp_path / "m.json.gz"))
    assert proc.returncode == 0, proc.stderr


def test_integers_beyond_int64_in_args(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    t = load(job / "rank0.trace.json.gz")
    big = 0
    for e in t["traceEvents"]:
        if e.get("ph") == "X" and isinstance(e.get("args"), dict):
            e["args"]["External id"] = 2**70  # beyond int64 and uint64
            e["args"]["correlation"] = 2**63 + 5  # fits uint64, not int64
            big += 1
        if "c10d" in str(e.get("name", "")) or "gloo" in str(e.get("name", "")):
            e.setdefault("args", {})["In msg nelems"] = 2**65
            e["args"]["Group size"] = 10**30
    assert big
    save(job / "rank0.trace.json.gz", t)
    ts = load_tables(job)
    ev = load_events(ts.ranks[0].path)[0]
    assert (ev["external_id"] == -1).all() and (ev["correlation"] == -1).all()  # unknown, not wrapped
    said = f"{2 * big} External id / correlation / graph node id values beyond 64 bits read as absent"
    assert any(said in w for w in ts.ranks[0].warnings), ts.ranks[0].warnings  # and said
    for cmd in ("summary", "report", "merge"):
        extra = {"report": ["--out", str(tmp_path / "o")], "merge": ["-o", str(tmp_path / "m.json.gz")]}
        proc = cli(cmd, str(job), *extra.get(cmd, []))
        assert proc.returncode == 0, proc.stderr


def test_no_profiler_step_is_whole_trace_mode_and_said(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    for r in (0, 1):
        t = load(job / f"rank{r}.trace.json.gz")
        t["traceEvents"] = [e for e in t["traceEvents"]
                            if not str(e.get("name", "")).startswith("ProfilerStep")]
        save(job / f"rank{r}.trace.json.gz", t)
    ts = load_tables(job)
    assert ts.whole_trace_mode
    b = ts.breakdown
    assert list(b["step"]) == [0, 0]
    assert (b[IDENTITY].sum(axis=1) == b["step_ns"]).all()
    assert "whole-trace mode" in cli("summary", str(job)).stdout
    proc = cli("report", str(job), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0 and any("whole-trace mode" in c for c in caveats(proc.stdout))
    assert ("No ProfilerStep (1 of 1 run): whole-trace mode, one step is the whole trace; "
            "per-step figures are per trace.") in context(proc.stdout)
    assert "whole-trace mode" in (tmp_path / "o" / "report.html").read_text()


def test_improperly_nested_events_on_one_thread(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    t = load(job / "rank0.trace.json.gz")
    ops = [e for e in t["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    for a, b in zip(ops[::2], ops[1::2]):  # b starts inside a and ends after it
        b["tid"], b["ts"], b["dur"] = a["tid"], a["ts"] + max(1, a["dur"] // 2), a["dur"] * 3 + 5
    save(job / "rank0.trace.json.gz", t)
    ts = load_tables(job)
    b = ts.breakdown
    assert (b[IDENTITY].sum(axis=1) == b["step_ns"]).all()
    assert cli("report", str(job), "--out", str(tmp_path / "o")).returncode == 0
    proc = cli("merge", str(job), "-o", str(tmp_path / "m.json.gz"))
    assert proc.returncode == 0
    # Perfetto would drop partially overlapping events: merge moves them to overlap tracks
    moved = re.search(r"(\d+) on overlap tracks", proc.stdout)
    assert moved and int(moved.group(1)) > 0, proc.stdout


def test_a_utf8_byte_order_mark_before_the_json_is_read(tmp_path):
    """An editor's BOM before an otherwise valid trace: read as the same trace (RFC 8259 lets
    a reader ignore it), not refused as truncated JSON."""
    import json

    trace = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                              "tid": 1, "ts": 10, "dur": 5}]}
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(trace))
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    a, _ = load_events(plain)
    b, _ = load_events(bom)
    assert list(b["name"].astype(str)) == ["aten::mm"]
    assert b["ts_ns"].tolist() == a["ts_ns"].tolist() == [10_000]


def test_kineto_window_span_counts_as_nothing(tmp_path, ddp_run):
    """Kineto writes one span of the whole profiled window (cat "Trace", "PyTorch Profiler (0)"
    on pid "Spans"); no work ran in it, so the breakdown is the same without it (it used to
    turn a CPU rank's idle in its first step into other)."""
    with_span = copy_run(ddp_run, tmp_path / "with")
    without = copy_run(ddp_run, tmp_path / "without")
    for r in (0, 1):
        t = load(without / f"rank{r}.trace.json.gz")
        spans = [e for e in t["traceEvents"] if e.get("cat") == "Trace"]
        assert spans and spans[0]["name"].startswith("PyTorch Profiler")
        t["traceEvents"] = [e for e in t["traceEvents"] if e.get("cat") != "Trace"]
        save(without / f"rank{r}.trace.json.gz", t)
    a, b = load_tables(with_span).breakdown, load_tables(without).breakdown
    assert (a["other_ns"].to_numpy() == b["other_ns"].to_numpy()).all()  # the span is no work
    first = a.groupby("rank")["step"].transform("min") == a["step"]
    cols = IDENTITY + ["step_ns"]
    assert a.loc[~first, cols].to_numpy().tolist() == b.loc[~first.to_numpy(), cols].to_numpy().tolist()
    # the step the span opens starts at its first event (analyzer/ingest/steps.py rule 5): what
    # it leaves out is idle -- the profiler's start-up -- and nothing else
    left_out = b.loc[first.to_numpy(), "step_ns"].to_numpy() - a.loc[first, "step_ns"].to_numpy()
    assert (left_out >= 0).all()
    assert (b.loc[first.to_numpy(), "idle_ns"].to_numpy() - a.loc[first, "idle_ns"].to_numpy()
            == left_out).all()
