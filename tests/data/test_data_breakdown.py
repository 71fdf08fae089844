"""Data supply in the breakdown (issue 10): hand-built traces with exact answers, and a real
foreign trace (DLRM, corpus) checked against the same quantity computed a second way.

Fixtures: fixtures/data/*.json (built by fixtures/data/build.py; times in µs, x1000 = ns).
"""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest

from analyzer.api import load_events, load_tables
from tests.corpus import CORPUS, need

US = 1000
PARTS = ["compute_ns", "exposed_comm_ns", "data_wait_ns", "other_ns", "idle_ns"]


def test_cpu_loader_exact(data_fixture):
    ts = load_tables(data_fixture("cpu_loader.json"))
    b = ts.breakdown.set_index("step")
    s1 = b.loc[1]
    # window [0,200). D = main-thread DataLoader range [0,60) ∪ thread-5 range [160,180).
    # K = main-thread ops [40,55) stack, [60,120) mm, [130,150) add_, minus D on the main thread
    #     (the collate op aten::stack [40,55) lies in [0,60): data, not compute) = 60 + 20 = 80
    assert s1["compute_ns"] == 80 * US
    # C = gloo [126,170) = 44; C∩K = [130,150) = 20; exposed = 24
    assert (s1["comm_ns"], s1["overlap_ns"], s1["exposed_comm_ns"]) == (44 * US, 20 * US, 24 * US)
    # D \ (C ∪ K) = [0,60) + [170,180) (the thread-5 range is hidden under gloo until 170) = 70
    assert s1["data_wait_ns"] == 70 * US
    # O = c10d enqueue [120,125) + copy_ on thread 4 [175,190); minus C∪K∪D -> 5 + 10 = 15
    assert s1["other_ns"] == 15 * US
    # idle = [125,126) + [190,200) = 11
    assert s1["idle_ns"] == 11 * US
    assert s1["data_wait_frac"] == pytest.approx(70 / 200) and bool(s1["input_bound"])
    # step 2 has no DataLoader range: data 0, mm [200,290) compute, idle 10
    s2 = b.loc[2]
    assert (s2["data_wait_ns"], s2["compute_ns"], s2["idle_ns"]) == (0, 90 * US, 10 * US)
    assert s2["data_wait_frac"] == 0 and not bool(s2["input_bound"])
    assert (b[PARTS].sum(axis=1) == b["step_ns"]).all()


def test_cpu_loader_roles_and_timeline(data_fixture):
    ts = load_tables(data_fixture("cpu_loader.json"))
    ev, _ = load_events(ts.ranks[0].path)
    data = ev[ev["role"].astype(str) == "data"]
    assert sorted(data["name"].astype(str)) == sorted([
        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
        "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"])
    assert set(data["rule"].astype(str)) == {"cpu.dataloader_next"}
    # the timeline's compute lane leaves out the collate op inside the DataLoader range
    tl = ts.timeline(0, 1)
    comp = tl[tl["lane"] == "compute"]
    assert list(zip(comp["start_ns"], comp["end_ns"])) == [(60 * US, 120 * US), (130 * US, 150 * US)]


def test_gpu_loader_exact(data_fixture):
    ts = load_tables(data_fixture("gpu_loader.json"))
    b = ts.breakdown.iloc[0]
    # device window (analyzer/ingest/steps.py): first device work (NCCL at 10) to, this being
    # the last step, 10 + its CPU span [0,100) = 110, later than its last work (memset, 80):
    # [10,110) = 100
    assert b["step"] == 5 and b["step_ns"] == 100 * US and b["cpu_step_ns"] == 100 * US
    # C = NCCL [10,25) = 15, K = gemm [40,70) = 30, no overlap: exposed 15
    assert (b["compute_ns"], b["comm_ns"], b["exposed_comm_ns"]) == (30 * US, 15 * US, 15 * US)
    # D = DataLoader range [0,30) ∪ HtoD copy [32,40), clipped to [10,110), minus C ∪ K:
    # [25,30) [32,40) = 13 (the fetch before the first device work, [0,10), is outside the
    # window: with more steps it lies in the previous step's window)
    assert b["data_wait_ns"] == 13 * US
    # O = HtoD memcpy [32,40) (counted as data first) + memset [75,80) -> 5
    assert b["other_ns"] == 5 * US
    # idle = [30,32) + [70,75) + [80,110) = 37
    assert b["idle_ns"] == 37 * US
    # 13 / 100 = 0.13 < INPUT_BOUND_FRAC 0.2
    assert b["data_wait_frac"] == pytest.approx(13 / 100) and not bool(b["input_bound"])
    ev, _ = load_events(ts.ranks[0].path)
    htod = ev[ev["name"].astype(str).str.startswith("Memcpy HtoD")]
    assert list(htod["rule"].astype(str)) == ["gpu.memcpy.htod"]
    assert list(htod["role"].astype(str)) == ["memcpy"]


def _mask(n: int, lo: int, spans) -> np.ndarray:
    m = np.zeros(n, bool)
    for s, e in spans:
        m[max(s - lo, 0):max(min(e - lo, n), 0)] = True
    return m


@pytest.mark.integration
def test_dlrm_data_wait_second_way(tmp_path):
    """DLRM rank 0 (8x V100, NCCL; one DataLoader range and HtoD input copies in step 10):
    data_wait_ns recomputed on a 1 µs boolean grid straight from the JSON (no analyzer code):
    D = DataLoader ranges ∪ 'Memcpy HtoD' events, C = NCCL kernels, K = other kernels."""
    src = CORPUS / "dlrm_ddp_8rank_v100" / "worker0.pt.trace.json.gz"
    need(src)
    (tmp_path / "job").mkdir()
    shutil.copy(src, tmp_path / "job" / src.name)
    b = load_tables(tmp_path / "job").breakdown.iloc[0]
    assert b["step"] == 10
    lo_us, n = int(b["step_start_ns"]) // US, int(b["step_ns"]) // US
    events = [e for e in json.loads(gzip.decompress(src.read_bytes()))["traceEvents"]
              if e.get("ph") == "X"]

    def spans(pred):
        return [(int(e["ts"]), int(e["ts"]) + int(e["dur"])) for e in events if pred(e)]

    kernel = lambda e: e.get("cat") == "kernel"  # noqa: E731
    nccl = lambda e: kernel(e) and e["name"].startswith("nccl")  # noqa: E731
    C = _mask(n, lo_us, spans(nccl))
    K = _mask(n, lo_us, spans(lambda e: kernel(e) and not nccl(e)))
    D = _mask(n, lo_us, spans(lambda e: e["name"].startswith("enumerate(DataLoader)#")
                             or (e.get("cat") == "gpu_memcpy" and "HtoD" in e["name"])))
    expected_us = int((D & ~C & ~K).sum())
    assert expected_us > 0  # the trace does wait for its batch
    assert b["data_wait_ns"] == expected_us * US
    assert b["compute_ns"] == int(K.sum()) * US
    assert sum(int(b[c]) for c in PARTS) == b["step_ns"]
