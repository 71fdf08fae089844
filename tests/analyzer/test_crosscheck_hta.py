"""`summary FILE --crosscheck hta` gives HTA only that file (oracle: HTA run by hand on a folder
holding a copy of it), in a temporary folder removed afterwards."""

from __future__ import annotations

import json
import math
import shutil
import tempfile

import pytest

from tests.inputs import CORPUS, cli, need

A100 = CORPUS / "single" / "a100_ddp_rank0_nccl_args.json.gz"


def test_crosscheck_hta_on_one_file_reads_only_that_file(tmp_path, monkeypatch):
    pytest.importorskip("hta.trace_analysis")
    from analyzer.compare.crosscheck_hta import run_hta_overlap

    src = need(A100)
    # oracle: HTA run by hand on a folder holding a copy of that one file
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(src, alone / src.name)
    expected = run_hta_overlap(alone)
    assert list(expected["rank"]) == [0] and not math.isnan(expected["hta_overlap_pct"].iat[0])

    tmp_root = tmp_path / "tmp"
    tmp_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_root))
    out = tmp_path / "s.json"
    proc = cli("summary", str(src), "--crosscheck", "hta", "--format", "json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "same rank" not in proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["crosscheck_hta"]
    assert [r["rank"] for r in rows] == [0]
    assert rows[0]["hta_overlap_pct"] == pytest.approx(float(expected["hta_overlap_pct"].iat[0]))
    assert "no figure" not in rows[0]["explanation"]
    assert list(tmp_root.iterdir()) == []  # the temporary folder is removed afterwards


# --- HTA's scope on a hand-built GPU-shaped trace, and HTA's own failure (issue 16 item 11) ---

def _gpu_trace(steps: int) -> dict:
    """One GPU rank (µs). Step 1 [0, 100): launches compute K1 [20, 60) (corr 1) and
    ncclKernel_AllReduce C1 [40, 80) (corr 2). Step 2 [100, 200): compute K2 [120, 150)
    (corr 3), C2 [130, 170) (corr 4). C0 [2, 12) has correlation 99 and no launch in the trace
    (queued before the profiler started). ``steps`` = 1 leaves out ProfilerStep#2's span."""
    cpu = dict(pid=4242, tid=1)

    def launch(ts, corr):
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1,
                "args": {"correlation": corr, "External id": corr}, **cpu}

    def kernel(name, ts, dur, corr, stream):
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts,
                "dur": dur, "args": {"device": 0, "stream": stream, "correlation": corr}}

    nccl, gemm = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", "sm80_gemm_tn"
    ev = [{"ph": "M", "name": "process_name", "pid": 4242, "tid": 0, "args": {"name": "python3"}},
          {"ph": "M", "name": "thread_name", "pid": 4242, "tid": 1, "args": {"name": "thread 1 (python3)"}},
          {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, **cpu},
          launch(10, 1), launch(12, 2), launch(110, 3), launch(112, 4),
          kernel(gemm, 20, 40, 1, 7), kernel(nccl, 40, 40, 2, 20), kernel(gemm, 120, 30, 3, 7),
          kernel(nccl, 130, 40, 4, 20), kernel(nccl, 2, 10, 99, 20)]
    if steps == 2:
        ev.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "ts": 100,
                   "dur": 100, **cpu})
    return {"schemaVersion": 1, "traceEvents": ev,
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}}


def test_hta_scope_drops_the_last_step_and_unlaunched_kernels(tmp_path):
    from analyzer.api import load_events
    from analyzer.compare.crosscheck_hta import hta_scope_overlap, step_names

    p = tmp_path / "rank0.trace.json"
    p.write_text(json.dumps(_gpu_trace(2)))
    ev, _ = load_events(p)
    assert step_names(ev) == {"ProfilerStep#1", "ProfilerStep#2"}
    got = hta_scope_overlap(ev, filtered=True)
    # cutoff = start of ProfilerStep#2 = 100 µs: launches 1, 2 kept -> K1 [20, 60), C1 [40, 80)
    # overlap [40, 60) = 20 µs of 40 µs communication; K2, C2 dropped (last step), C0 unlaunched
    assert got == {"overlap_ns": 20_000, "comm_ns": 40_000, "last_step_dropped": 2,
                   "unlaunched_dropped": 1, "sub_us": False}
    # fewer than two ProfilerSteps: HTA filters nothing. comm = [2,12) + [40,80) + [130,170)
    # = 90 µs; overlap = [40,60) + [130,150) = 40 µs
    whole = hta_scope_overlap(ev, filtered=False)
    assert (whole["overlap_ns"], whole["comm_ns"]) == (40_000, 90_000)


def test_hta_failure_is_one_line_and_our_figures_stay(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from analyzer.cli.app import app
    from analyzer.compare import crosscheck_hta

    def broken(trace_dir):
        raise KeyError("'stream'\nsecond line of HTA's traceback text")

    monkeypatch.setattr(crosscheck_hta, "hta_available", lambda: True)
    monkeypatch.setattr(crosscheck_hta, "run_hta_overlap", broken)
    p = tmp_path / "rank0.trace.json"
    p.write_text(json.dumps(_gpu_trace(2)))
    res = CliRunner().invoke(app, ["summary", str(p), "--crosscheck", "hta", "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output[res.output.index("{"):])
    failed = [n for n in data["notes"] if n.startswith("HTA failed")]
    assert len(failed) == 1 and "KeyError" in failed[0] and "second line" not in failed[0]
    row = data["crosscheck_hta"][0]
    assert row["hta_overlap_pct"] is None
    assert row["ours_hta_scope_pct"] == pytest.approx(50.0)  # 20 / 40 µs, worked above
    assert data["breakdown"], "our per-step figures are still printed"
    table = CliRunner().invoke(app, ["summary", str(p), "--crosscheck", "hta"])
    assert table.exit_code == 0 and sum("HTA failed" in ln for ln in table.output.splitlines()) == 1


def test_crosscheck_on_the_rocm_trace_exits_0_with_our_figures():
    """HTA 0.5.0 and traceinsight 0.6.1 under pandas 3.1 give no figure here (no communication
    kernel); whichever way HTA ends, the command prints ours and exits 0."""
    pytest.importorskip("hta.trace_analysis")
    from typer.testing import CliRunner

    from analyzer.cli.app import app

    src = need(CORPUS / "single" / "rocm_mi250_truncated_last_step.json.gz")
    res = CliRunner().invoke(app, ["summary", str(src), "--crosscheck", "hta", "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output[res.output.index("{"):])
    assert data["breakdown"] and len(data["crosscheck_hta"]) == 1
    assert sum(n.startswith("HTA failed") for n in data["notes"]) <= 1


def test_hta_scope_overlap_rounds_sub_us_times_as_hta_does():
    """The A100 corpus trace has sub-µs times. Oracle: HTA 0.5.0 ``get_comm_comp_overlap`` run
    by hand on a folder holding only this file gives 14.31 % (its parser moves starts up and
    ends down to whole µs). Exact ns on the same kernels give 14.76 %."""
    from analyzer.api import load_events
    from analyzer.compare.crosscheck_hta import hta_scope_overlap

    ev, _ = load_events(need(A100))
    got = hta_scope_overlap(ev, filtered=True)
    assert got["sub_us"] and got["last_step_dropped"] == 900
    assert round(100 * got["overlap_ns"] / got["comm_ns"], 2) == 14.31
    exact_ns = ev[ev["is_gpu"]]
    assert (exact_ns["ts_ns"] % 1000 != 0).any()  # the rounding has something to do
