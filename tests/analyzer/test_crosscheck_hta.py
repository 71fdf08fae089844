"""`summary FILE --crosscheck hta` gives HTA only that file (oracle: HTA run by hand on a folder
holding a copy of it), in a temporary folder removed afterwards."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.inputs import CORPUS, HANG_S, cli, default_signals, need

pytestmark = pytest.mark.integration

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
                   "unlaunched_dropped": 1, "last_step_kept": 0, "cutoff_step": "ProfilerStep#2",
                   "cutoff_on_gpu": False, "no_step_rank": False, "no_stream_kernels": 0,
                   "sub_us": False}
    # fewer than two ProfilerSteps: HTA filters nothing. comm = [2,12) + [40,80) + [130,170)
    # = 90 µs; overlap = [40,60) + [130,150) = 40 µs
    whole = hta_scope_overlap(ev, filtered=False)
    assert (whole["overlap_ns"], whole["comm_ns"]) == (40_000, 90_000)


def _standin(monkeypatch, name: str) -> None:
    """HTA's place in the child process taken by tests/analyzer/hta_standins.py NAME; HTA itself
    need not be installed."""
    from analyzer.compare import crosscheck_hta

    monkeypatch.setattr(crosscheck_hta, "hta_available", lambda: True)
    monkeypatch.setenv("PARITYTRACE_HTA_RUNNER", f"tests.analyzer.hta_standins:{name}")


def _summary_beside(standin: str, tmp_path, monkeypatch) -> tuple[dict, Path]:
    """``summary --crosscheck hta --format json`` of a 2-rank GPU-shaped trace with the HTA
    stand-in ``standin``: (its JSON, the trace's path); the command must exit 0."""
    from typer.testing import CliRunner

    from analyzer.cli.app import app

    _standin(monkeypatch, standin)
    p = tmp_path / "rank0.trace.json"
    p.write_text(json.dumps(_gpu_trace(2)))
    res = CliRunner().invoke(app, ["summary", str(p), "--crosscheck", "hta", "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output[res.output.index("{"):]), p


def test_hta_failure_is_one_line_and_our_figures_stay(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from analyzer.cli.app import app

    data, p = _summary_beside("key_error", tmp_path, monkeypatch)
    failed = [n for n in data["notes"] if n.startswith("HTA failed")]
    assert len(failed) == 1 and "KeyError" in failed[0] and "second line" not in failed[0]
    row = data["crosscheck_hta"][0]
    assert row["hta_overlap_pct"] is None
    assert row["ours_hta_scope_pct"] == pytest.approx(50.0)  # 20 / 40 µs, worked above
    assert data["breakdown"], "our per-step figures are still printed"
    table = CliRunner().invoke(app, ["summary", str(p), "--crosscheck", "hta"])
    assert table.exit_code == 0 and sum("HTA failed" in ln for ln in table.output.splitlines()) == 1


def test_hta_process_that_dies_is_one_line(tmp_path, monkeypatch):
    data, _ = _summary_beside("dies", tmp_path, monkeypatch)
    failed = [n for n in data["notes"] if n.startswith("HTA failed")]
    assert len(failed) == 1 and "signal 9" in failed[0] and "\n" not in failed[0]
    assert data["breakdown"] and data["crosscheck_hta"][0]["hta_overlap_pct"] is None


def _job(tmp_path) -> Path:
    """A folder holding the one-rank trace of ``_gpu_trace(2)``: its path names the HTA child
    and the pool workers it forks (their command line), so the test can find them."""
    job = tmp_path / "job-hta-child-marker"
    job.mkdir()
    (job / "rank0.trace.json").write_text(json.dumps(_gpu_trace(2)))
    return job


def _survivors(marker: str) -> list:
    """Processes alive whose command line names ``marker`` (zombies count as gone)."""
    psutil = pytest.importorskip("psutil")
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(p.info["cmdline"] or []):
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_hta_that_never_returns_is_cut_off_with_our_figures_kept(tmp_path, monkeypatch):
    """An HTA stand-in that logs, forks a pool as HTA does, and never returns: with
    PARITYTRACE_HTA_TIMEOUT_S=2 the command ends (cli_proc's own limit bounds the test), says so
    in one line, keeps our figures, exits 0, and leaves no process of HTA's behind."""
    from tests.analyzer.hta_standins import LOG_TEXT
    from tests.inputs import cli_proc

    pytest.importorskip("psutil")
    job = _job(tmp_path)
    monkeypatch.setenv("PARITYTRACE_HTA_RUNNER", "tests.analyzer.hta_standins:hang")
    monkeypatch.setenv("PARITYTRACE_HTA_TIMEOUT_S", "2")
    proc = cli_proc("summary", str(job), "--crosscheck", "hta", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    hung = [n for n in data["notes"] if "HTA did not finish" in n]
    assert len(hung) == 1 and hung[0].startswith("HTA did not finish within 2 s")
    assert "our figures stand" in hung[0] and "\n" not in hung[0]
    assert data["crosscheck_hta"][0]["hta_overlap_pct"] is None
    assert data["crosscheck_hta"][0]["ours_hta_scope_pct"] == pytest.approx(50.0)
    assert data["breakdown"]
    # HTA's log is off the terminal: at most its last line, inside that one note
    assert LOG_TEXT not in proc.stderr
    assert proc.stdout.count(LOG_TEXT) <= 1 and (LOG_TEXT not in proc.stdout or
                                                 LOG_TEXT in hung[0])
    assert _survivors(str(job)) == []


def test_hta_log_stays_off_the_terminal(tmp_path, monkeypatch):
    """An HTA stand-in that logs and prints on both streams and returns 12.34 %: the table shows
    the figure, and none of its lines reaches our stdout or stderr."""
    from tests.analyzer.hta_standins import LOG_TEXT
    from tests.inputs import cli_proc

    job = _job(tmp_path)
    monkeypatch.setenv("PARITYTRACE_HTA_RUNNER", "tests.analyzer.hta_standins:chatty")
    proc = cli_proc("summary", str(job), "--crosscheck", "hta")
    assert proc.returncode == 0, proc.stderr
    assert "12.34" in proc.stdout
    assert LOG_TEXT not in proc.stdout + proc.stderr


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_stop_signal_while_hta_runs_leaves_no_process(tmp_path, signame):
    """SIGTERM, or SIGINT (Ctrl-C) to the command alone, while the (never-returning) HTA
    stand-in and its pool run: exit 130, and the child and its pool workers are gone. Waits on
    process events with bounds."""
    import os
    import signal
    import subprocess
    import sys
    import time

    psutil = pytest.importorskip("psutil")
    job = _job(tmp_path)
    env = dict(os.environ, PARITYTRACE_HTA_RUNNER="tests.analyzer.hta_standins:hang",
               PARITYTRACE_HTA_TIMEOUT_S="600")
    cmd = subprocess.Popen([sys.executable, "-m", "analyzer", "summary", str(job),
                            "--crosscheck", "hta"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + HANG_S
        while len(_survivors(str(job))) < 3:  # the child and its two pool workers
            assert cmd.poll() is None, cmd.communicate()
            assert time.monotonic() < deadline, "HTA's stand-in never started its pool"
            psutil.wait_procs([psutil.Process(cmd.pid)], timeout=0.2)
        cmd.send_signal(getattr(signal, signame))
        out, err = cmd.communicate(timeout=HANG_S)
    finally:
        if cmd.poll() is None:
            cmd.kill()
    assert cmd.returncode == 130, err
    assert "interrupted" in err
    assert _survivors(str(job)) == []


def test_bad_hta_timeout_is_refused_before_the_analysis(tmp_path, monkeypatch):
    from tests.inputs import bad_input, cli

    _standin(monkeypatch, "chatty")
    monkeypatch.setenv("PARITYTRACE_HTA_TIMEOUT_S", "soon")
    bad_input(cli("summary", str(_job(tmp_path)), "--crosscheck", "hta"),
              "PARITYTRACE_HTA_TIMEOUT_S", "not a number of seconds")


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


# --- ProfilerStep copies on the GPU track are CPU rows to HTA (issue 32 item 6) ---

def _gpu_trace_with_step_copies(copy2_us: int) -> dict:
    """``_gpu_trace(2)`` with C2 lengthened to [130, 190) µs and the GPU-track copies Kineto
    writes of each step (gpu_user_annotation, no stream, no correlation): ProfilerStep#1
    [20, 80), ProfilerStep#2 from ``copy2_us`` to 190 (the GPU runs behind the CPU, whose
    ProfilerStep#2 starts at 100)."""
    t = _gpu_trace(2)
    for e in t["traceEvents"]:
        if e.get("cat") == "kernel" and e["args"]["correlation"] == 4:
            e["dur"] = 60
    t["traceEvents"] += [
        {"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{n}", "pid": 0,
         "tid": 7, "ts": ts, "dur": 190 - ts if n == 2 else 60, "args": {"External id": n}}
        for n, ts in ((1, 20), (2, copy2_us))]
    return t


# copy2_us, hand-worked (µs). HTA's cutoff is the GPU copy's start (its latest ProfilerStep row):
# 120: launches at 10, 12, 110, 112 start before it -> K1 [20,60), C1 [40,80), K2 [120,150),
#      C2 [130,190) kept; comm 40 + 60 = 100, overlap [40,60) + [130,150) = 40 -> 40.00 %
# 111: launch 112 (C2) is not before it -> C2 dropped, K2 kept; comm 40, overlap 20 -> 50.00 %
# (the rule before: cutoff 100 = the CPU span, K2 and C2 dropped -> 50.00 % for both)
STEP_COPY_CASES = {120: (40_000, 100_000, 0, 2, 40.0), 111: (20_000, 40_000, 1, 1, 50.0)}


@pytest.mark.parametrize("copy2_us", sorted(STEP_COPY_CASES))
def test_hta_scope_takes_gpu_step_copies_as_cpu_rows(tmp_path, copy2_us):
    pytest.importorskip("hta.trace_analysis")
    from analyzer.api import load_events
    from analyzer.compare.crosscheck_hta import hta_scope_overlap, run_hta_overlap

    job = tmp_path / "job"
    job.mkdir()
    p = job / "rank0.trace.json"
    p.write_text(json.dumps(_gpu_trace_with_step_copies(copy2_us)))
    overlap, comm, dropped, kept, pct = STEP_COPY_CASES[copy2_us]
    got = hta_scope_overlap(load_events(p)[0], filtered=True)
    assert (got["overlap_ns"], got["comm_ns"]) == (overlap, comm)
    assert (got["last_step_dropped"], got["last_step_kept"]) == (dropped, kept)
    assert got["cutoff_on_gpu"] and got["cutoff_step"] == "ProfilerStep#2"
    assert got["unlaunched_dropped"] == 1  # C0, queued before the profiler started
    hta = run_hta_overlap(job)  # the oracle: HTA itself
    assert list(hta["rank"]) == [0] and hta["hta_overlap_pct"].iat[0] == pytest.approx(pct)

    res = cli("summary", str(job), "--crosscheck", "hta", "--format", "json")
    assert res.returncode == 0, res.stderr
    row = json.loads(res.stdout)["crosscheck_hta"][0]
    assert row["hta_overlap_pct"] == pytest.approx(pct)
    assert abs(row["ours_hta_scope_pct"] - pct) <= 0.005 + 1e-9
    assert "drops the last ProfilerStep" not in row["explanation"]
    assert "different figure" not in row["explanation"]


def test_hta_keeps_nothing_of_a_rank_without_profiler_steps(tmp_path):
    """Two ranks: rank 0 names ProfilerStep#1 and #2, rank 1 (the same events) none. HTA's
    cutoff on rank 1 is its first CPU row's start, so it keeps no kernel there and gives no
    figure (hta/common/trace.py); ours on HTA's scope is undefined too, and says why."""
    pytest.importorskip("hta.trace_analysis")
    from analyzer.compare.crosscheck_hta import run_hta_overlap

    job = tmp_path / "job"
    job.mkdir()
    for rank in (0, 1):
        t = _gpu_trace(2)
        t["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
        if rank == 1:
            t["traceEvents"] = [e for e in t["traceEvents"]
                                if not str(e.get("name", "")).startswith("ProfilerStep")]
        (job / f"rank{rank}.trace.json").write_text(json.dumps(t))
    hta = run_hta_overlap(job).set_index("rank")["hta_overlap_pct"]
    assert hta[0] == pytest.approx(50.0) and math.isnan(hta[1])
    res = cli("summary", str(job), "--crosscheck", "hta", "--format", "json")
    assert res.returncode == 0, res.stderr
    rows = {r["rank"]: r for r in json.loads(res.stdout)["crosscheck_hta"]}
    assert rows[0]["ours_hta_scope_pct"] == pytest.approx(50.0)
    assert rows[1]["ours_hta_scope_pct"] is None
    assert "no ProfilerStep on this rank" in rows[1]["explanation"]


def test_kernels_without_a_stream_are_not_counted_by_hta(tmp_path):
    """The tb_plugin's test traces write kernels with a correlation and no ``stream`` argument:
    CPU rows to HTA, so it counts no kernel at all (checked against HTA itself), and the
    explanation says why."""
    pytest.importorskip("hta.trace_analysis")
    from analyzer.api import load_events
    from analyzer.compare.crosscheck_hta import hta_scope_overlap, run_hta_overlap

    job = tmp_path / "job"
    job.mkdir()
    t = _gpu_trace(1)
    for e in t["traceEvents"]:
        if e.get("cat") == "kernel":
            del e["args"]["stream"]
    (job / "rank0.trace.json").write_text(json.dumps(t))
    got = hta_scope_overlap(load_events(job / "rank0.trace.json")[0], filtered=False)
    assert (got["comm_ns"], got["no_stream_kernels"]) == (0, 5)
    assert math.isnan(run_hta_overlap(job)["hta_overlap_pct"].iat[0])
    res = cli("summary", str(job), "--crosscheck", "hta", "--format", "json")
    row = json.loads(res.stdout)["crosscheck_hta"][0]
    assert row["ours_hta_scope_pct"] is None and "5 kernels carry no stream argument" in \
        row["explanation"]


def test_hta_time_limit_scales_with_the_traces_and_env_overrides_it(tmp_path, monkeypatch):
    from analyzer.compare.crosscheck_hta import timeout_s

    monkeypatch.delenv("PARITYTRACE_HTA_TIMEOUT_S", raising=False)
    (tmp_path / "rank0.trace.json.gz").write_bytes(b"\0" * 2_000_000)
    (tmp_path / "notes.txt").write_bytes(b"\0" * 5_000_000)  # not a trace: not counted
    assert timeout_s(tmp_path) == pytest.approx(302.0)  # 300 s + 1 s per MB of traces
    monkeypatch.setenv("PARITYTRACE_HTA_TIMEOUT_S", "7.5")
    assert timeout_s(tmp_path) == 7.5
