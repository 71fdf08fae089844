"""Early Kineto categories (analyzer/ingest/classify.py ``EARLY_DEVICE_CATS``): a trace that
writes ``Memcpy`` / ``Memset`` (Kineto before ``gpu_memcpy`` / ``gpu_memset``) has its copies
and memsets on the device, so its step windows start at its first device work.

The trace is hand-built in the shape of kineto's tb_plugin/test/test_profiler.py
``test_all_categories`` (categories ``Operator``, ``Runtime``, ``Memcpy``, ``Memset``,
``Kernel``; ``external id`` in lower case on the device rows, no ``distributedInfo``); times in
µs, the analyzer works in ns (x1000). Each step: an input copy, a kernel, a memset.

  step 1: ProfilerStep#1 [100, 1100); Memcpy HtoD [200, 400), Kernel [450, 850),
          Memset [860, 900)
  step 2: ProfilerStep#2 [1100, 2100); Memcpy HtoD [1150, 1400), Kernel [1450, 1850),
          Memset [1860, 1900)

Windows (analyzer/ingest/steps.py rule 4): step 1 [200, 1150) = 950 µs; step 2, the last,
[1150, 1150 + 1000) = 1000 µs (its first device work + its CPU span, later than 1900).
Breakdown: the HtoD copies are data wait (rule gpu.memcpy.htod), the memsets other:
  step 1: data 200, compute 400, other 40, idle 950 - 640 = 310
  step 2: data 250, compute 400, other 40, idle 1000 - 690 = 310
On 18fb8ff the copies and memsets were CPU rows: windows [450, 1450) and [1450, 2450).
"""

from __future__ import annotations

import json

from analyzer.api import load_events, load_tables

US = 1000
PID = 13721


def op(name, ts, dur, ext, tid="123"):
    return {"ph": "X", "cat": "Operator", "name": name, "pid": PID, "tid": tid, "ts": ts,
            "dur": dur, "args": {"Input Dims": [], "External id": ext}}


def runtime(name, ts, corr, ext):
    return {"ph": "X", "cat": "Runtime", "name": name, "pid": PID, "tid": "123", "ts": ts,
            "dur": 5, "args": {"correlation": corr, "external id": ext}}


def device(cat, name, ts, dur, corr, ext):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": "stream 7", "ts": ts,
            "dur": dur, "args": {"device": 0, "stream": 7, "correlation": corr,
                                 "external id": ext}}


def early_trace(path):
    events = []
    for k, t0, copy_at, copy_dur in ((1, 100, 200, 200), (2, 1100, 1150, 250)):
        e = 10 * k
        events += [
            op(f"ProfilerStep#{k}", t0, 1000, e),
            op("aten::copy_", t0 + 10, 30, e + 1),
            runtime("cudaMemcpyAsync", t0 + 20, 100 * k + 1, e + 1),
            device("Memcpy", "Memcpy HtoD (Pageable -> Device)", copy_at, copy_dur,
                   100 * k + 1, e + 1),
            op("aten::conv2d", t0 + 50, 20, e + 2),
            runtime("cudaLaunchKernel", t0 + 55, 100 * k + 2, e + 2),
            device("Kernel", "void cudnn::conv_kernel", t0 + 350, 400, 100 * k + 2, e + 2),
            op("aten::zero_", t0 + 80, 10, e + 3),
            runtime("cudaMemsetAsync", t0 + 82, 100 * k + 3, e + 3),
            device("Memset", "Memset (Device)", t0 + 760, 40, 100 * k + 3, e + 3)]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_memcpy_and_memset_categories_are_device_work(tmp_path):
    ev, _ = load_events(early_trace(tmp_path / "worker0.pt.trace.json"))
    copies = ev[ev["name"].astype(str).str.startswith(("Memcpy", "Memset"))]
    assert copies["is_gpu"].all()
    assert sorted(copies["role"].astype(str).unique()) == ["memcpy", "memset"]


def test_early_trace_windows_start_at_the_input_copy(tmp_path):
    _, steps = load_events(early_trace(tmp_path / "worker0.pt.trace.json"))
    s = steps.set_index("step")
    assert s.loc[1, "start_ns"] == 200 * US and s.loc[1, "end_ns"] == 1150 * US
    assert s.loc[2, "start_ns"] == 1150 * US and s.loc[2, "end_ns"] == 2150 * US


def test_early_trace_breakdown_counts_copies_as_data_and_memsets_as_other(tmp_path):
    jt = load_tables(early_trace(tmp_path / "worker0.pt.trace.json"))
    b = jt.breakdown.set_index("step")
    cols = ["step_ns", "compute_ns", "data_wait_ns", "other_ns", "idle_ns"]
    assert b.loc[1, cols].tolist() == [950 * US, 400 * US, 200 * US, 40 * US, 310 * US]
    assert b.loc[2, cols].tolist() == [1000 * US, 400 * US, 250 * US, 40 * US, 310 * US]
