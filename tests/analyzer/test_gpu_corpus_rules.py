"""Issue 16's "done when", on every corpus GPU trace: device step windows never overlap; compute +
exposed comm + data wait + other + idle = window exactly; summed idle <= the trace's own
device-idle total plus the last step's tail past the trace's last device event
(analyzer/ingest/steps.py rule 4); every class of device events left out of the steps is named in a note; our
overlap on HTA's scope equals HTA's own figure.

Oracles: the device-idle total is computed here from the raw trace JSON (hull of the device
events minus their union, without the analyzer's decoding or classification), and so are the
device events left out of the steps (``_raw_left_out``: launch links by correlation id); HTA figures are
HolisticTraceAnalysis 0.5.0 ``get_comm_comp_overlap`` run by hand on a folder holding only that
file (DLRM: corpus README)."""

from __future__ import annotations

import gzip
import json
import math
import re
from decimal import Decimal

import numpy as np
import pytest

from analyzer.analyses import intervals as iv
from analyzer.api import load_events, load_tables
from tests.corpus import corpus

pytestmark = pytest.mark.integration

GPU_TRACES = ["single/v100_ddp_subus_timestamps.json.gz", "single/a100_ddp_rank0_nccl_args.json.gz",
              "single/b200_allgather_rank0.json.gz", "single/mtia_inference_rank0.json.gz",
              "single/cupti_range_profiler.json.gz",
              "single/rocm_mi250_truncated_last_step.json.gz",
              "single/resnet_dataloader_1gpu.json.gz", "single/sglang_cudagraph_capture.json.gz",
              "dlrm_ddp_8rank_v100"]
HTA_OVERLAP_PCT = {  # HTA 0.5.0, by hand; NaN: no communication kernel
    "single/a100_ddp_rank0_nccl_args.json.gz": 14.31, "single/b200_allgather_rank0.json.gz": 0.0}
_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_sync"}


def _raw_device_idle_ns(path) -> tuple[int, int]:
    """(device-idle total, last device event end) of one trace straight from its JSON: within
    [first device event start, last device event end), the time no kernel / memcpy / memset /
    sync runs (exact decimal µs -> ns, no analyzer code)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        doc = json.loads(fh.read(), parse_float=Decimal)
    s, e = [], []
    for ev in doc.get("traceEvents", []):
        if ev.get("ph") == "X" and str(ev.get("cat", "")).lower() in _DEVICE_CATS:
            t0 = int(Decimal(ev["ts"]) * 1000)
            s.append(t0)
            e.append(t0 + int(Decimal(ev.get("dur", 0)) * 1000))
    if not s:
        return 0, 0
    busy = iv.merge(np.array(s, np.int64), np.array(e, np.int64))
    return int(max(e) - min(s)) - iv.measure(busy), int(max(e))


@pytest.mark.parametrize("rel", GPU_TRACES)
def test_device_windows_tile_without_overlap_and_identity_holds(rel):
    jt = load_tables(corpus(rel), jobs=1)
    for rt in jt.ranks:
        st = rt.steps.sort_values("start_ns")
        assert (st["end_ns"].to_numpy() >= st["start_ns"].to_numpy()).all()
        assert (st["start_ns"].to_numpy()[1:] >= st["end_ns"].to_numpy()[:-1]).all(), rt.path
        b = rt.breakdown
        parts = (b["compute_ns"] + b["exposed_comm_ns"] + b["data_wait_ns"] + b["other_ns"]
                 + b["idle_ns"])
        assert (parts == b["step_ns"]).all()
        assert (b[["compute_ns", "exposed_comm_ns", "data_wait_ns", "other_ns", "idle_ns"]]
                >= 0).all().all()


@pytest.mark.parametrize("rel", GPU_TRACES)
def test_summed_idle_is_at_most_the_traces_device_idle(rel):
    jt = load_tables(corpus(rel), jobs=1)
    for rt in jt.ranks:
        if rt.device_kind != "gpu":
            continue
        idle = int(rt.breakdown["idle_ns"].sum())
        raw_idle, last_end = _raw_device_idle_ns(rt.path)
        # the last step's window may run on past the last device event (rule 4): that tail is
        # idle no device-idle hull holds
        tail = max(int(rt.steps["end_ns"].max()) - last_end, 0) if last_end else 0
        assert idle <= raw_idle + tail, rt.path


def _raw_left_out(path) -> dict[str, int]:
    """Device events a trace's steps leave out, counted straight from its JSON (no analyzer
    code): why -> count, for the two reasons of analyzer/ingest/steps.py (rule 3). A device
    event (kernel, memcpy, memset, sync) is launched by the cuda_runtime / cuda_driver event of
    its ``args.correlation``; with no such event it was queued before the profiler started;
    launched at a time no CPU ProfilerStep span holds, it is outside every step (a trace with
    no ProfilerStep has no steps to be outside of). A trace whose device events carry no link
    at all is another rule (one note, no counts): {}."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        x = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in x
                 if str(e.get("cat", "")).lower() in ("cuda_runtime", "cuda_driver")
                 and "correlation" in e.get("args", {})}
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in x if e.get("cat") == "user_annotation"
             and str(e.get("name", "")).startswith("ProfilerStep#")]
    dev = [e.get("args", {}).get("correlation") for e in x
           if str(e.get("cat", "")).lower() in _DEVICE_CATS]
    linked = [launch_ts[c] for c in dev if c in launch_ts]
    if not linked:
        return {}
    counts = {"have no launch in the trace": len(dev) - len(linked),
              "were launched outside every ProfilerStep":
                  sum(1 for t in linked if spans and not any(a <= t < b for a, b in spans))}
    return {why: n for why, n in counts.items() if n}


_LEFT_OUT_NOTE = re.compile(r"([\d,]+) device events \([^)]*\) (have no launch in the trace|"
                            r"were launched outside every ProfilerStep)")


@pytest.mark.parametrize("rel", GPU_TRACES)
def test_device_work_outside_every_step_is_named_in_a_note(rel):
    """Device events left out of the steps (no launch in the trace, or launched outside every
    ProfilerStep) are counted in a note of their rank, exactly as many as the raw JSON holds;
    no such note where it holds none."""
    jt = load_tables(corpus(rel), jobs=1)
    for rt in jt.ranks:
        noted = {m.group(2): int(m.group(1).replace(",", ""))
                 for m in map(_LEFT_OUT_NOTE.match, rt.warnings) if m}
        assert noted == _raw_left_out(rt.path), rt.path.name


def test_the_corpus_holds_device_work_queued_before_the_profiler():
    """The note test above meets the case it is about: DLRM ranks 1 and 3 each hold 64 device
    events whose launch the trace does not have."""
    dlrm = corpus("dlrm_ddp_8rank_v100")
    counts = {p.name: _raw_left_out(p) for p in sorted(dlrm.glob("*.json.gz"))}
    assert {n: c for n, c in counts.items() if c} == {
        f"worker{r}.pt.trace.json.gz": {"have no launch in the trace": 64} for r in (1, 3)}


@pytest.mark.parametrize("rel", sorted(HTA_OVERLAP_PCT))
def test_overlap_on_htas_scope_equals_htas_figure(rel):
    from analyzer.compare.crosscheck_hta import hta_scope_overlap, step_names

    ev, _ = load_events(corpus(rel))
    got = hta_scope_overlap(ev, filtered=len(step_names(ev)) >= 2)
    pct = 100 * got["overlap_ns"] / got["comm_ns"] if got["comm_ns"] else math.nan
    assert round(pct, 2) == HTA_OVERLAP_PCT[rel]


def test_collective_calls_without_device_communication_are_named():
    """v100: world size 1; the CPU side calls c10d::allreduce_ 25 times and c10d::broadcast_ 10
    times (counted in the raw JSON by hand) and NCCL launches no kernel: a note says so."""
    jt = load_tables(corpus("single/v100_ddp_subus_timestamps.json.gz"), jobs=1)
    assert jt.collectives.empty
    notes = " ".join(jt.ranks[0].warnings)
    assert "35 collective calls on the CPU side (c10d::allreduce_ x25, c10d::broadcast_ x10)" \
        in notes and "world size 1" in notes
