"""The structural check and `analyzer merge` on our own tracer's traces (a tiny 2-rank DDP record)."""

from __future__ import annotations

import gzip
import json

import pytest

from analyzer.timeline.chrome_check import check_trace
from analyzer.timeline.merge import merge_traces
from tests.inputs import copy_run
from tests.merge.builders import hta_trace_facts, read

SHIFT_US = 2_000_000  # injected into rank 1's clock: far beyond the natural spread (tens of ms under load)


@pytest.fixture(scope="module")
def merged(ddp_run, tmp_path_factory):
    """The merge of a copy of ``ddp_run`` (merge's tables caches land beside the traces)."""
    d = tmp_path_factory.mktemp("merged")
    return merge_traces(copy_run(ddp_run, d / "ddp"), d / "merged.trace.json.gz")


def test_tracer_traces_pass_the_structural_check(ddp_run):
    for path in sorted(ddp_run.glob("rank*.trace.json.gz")):
        assert check_trace(read(path), strict_names=False) == [], path.name


def test_tracer_traces_name_every_track(ddp_run):
    for path in sorted(ddp_run.glob("rank*.trace.json.gz")):
        assert check_trace(read(path)) == [], path.name


def test_merged_tracer_run_is_viewer_clean(merged):
    trace = read(merged.out_path)
    assert check_trace(trace) == []
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any("pt_gloo_runloop" in t for t in threads)  # the gloo thread keeps its specific name
    assert merged.offsets["n_matched"].min() >= 1


def test_alignment_never_spreads_matched_ends_on_one_clock(merged):
    # both ranks share the host clock (true offset 0, inside the causality bounds): the clamped
    # median lies between the median and 0, so the summed |end difference| cannot grow
    sp = merged.spread
    assert sp["spread_after_ns"].sum() <= sp["spread_before_ns"].sum()


def test_injected_shift_is_recovered_exactly(ddp_run, merged, tmp_path):
    d = tmp_path / "shifted"
    d.mkdir()
    for path in ddp_run.glob("rank*.trace.json.gz"):
        data = json.loads(gzip.decompress(path.read_bytes()))
        if path.name.startswith("rank1"):
            for e in data["traceEvents"]:
                if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float)):
                    e["ts"] += SHIFT_US
        (d / path.name).write_bytes(gzip.compress(json.dumps(data).encode()))
    res = merge_traces(d, tmp_path / "m.trace.json.gz")
    # the estimates: the unshifted run's own offset may be within its spread and not applied
    base = merged.offsets.set_index("rank")["estimate_ns"]
    got = res.offsets.set_index("rank")["estimate_ns"]
    # float us with ns decimals: each shifted ts may round by 1 ns
    assert abs((got[1] - base[1]) - SHIFT_US * 1000) <= 2
    assert (res.spread["spread_before_ns"] > SHIFT_US * 1000 // 2).all()
    assert res.spread["spread_after_ns"].sum() <= merged.spread["spread_after_ns"].sum() + 2 * len(res.spread)


@pytest.mark.integration  # HTA in a child interpreter
def test_hta_loads_tracer_traces_and_the_merged_trace(ddp_run, merged):
    pytest.importorskip("hta.trace_analysis")
    # trace_files, not trace_dir: HTA reads every *.json in a folder, manifest.json included
    files = {r: str(ddp_run / f"rank{r}.trace.json.gz") for r in (0, 1)}
    assert sorted(hta_trace_facts(files, str(ddp_run))) == [0, 1]
    got = hta_trace_facts({0: str(merged.out_path)}, str(merged.out_path.parent),
                          include_last_profiler_step=True)[0]
    assert got["pids"] == [1, 2]
    n_x = sum(1 for e in read(merged.out_path)["traceEvents"] if e["ph"] == "X" and e.get("cat") != "Trace")
    assert len(got["names"]) == n_x  # HTA drops only the profiler's own "Trace" spans
