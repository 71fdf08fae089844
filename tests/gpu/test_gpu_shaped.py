"""GPU-shaped traces (fixtures/gpu_shaped, built by its build.py) through the whole analyzer:
decode -> classify -> breakdown / prefetch, and memory from memory.parquet.

Every expected number is worked out by hand below from the events in build.py (whole
microseconds there, so values here are us * 1000 ns).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from analyzer import api
from analyzer.analyses import memory, prefetch
from tests.reports.test_prefetch import run_sums

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "gpu_shaped"
US = 1000


def _builder():
    spec = importlib.util.spec_from_file_location("gpu_shaped_build", FIX / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load(name: str, tmp_path: Path):
    """Load a scenario's tables from a copy (the per-rank tables cache lands in tmp_path)."""
    dst = tmp_path / name
    shutil.copytree(FIX / name, dst)
    return api.load_tables(dst / "rank0.trace.json")


def events(name: str):
    """A scenario's event table (``api.load_events``: no cache is written)."""
    return api.load_events(FIX / name / "rank0.trace.json")[0]


def test_fixtures_are_current(tmp_path):
    b = _builder()
    b.build(tmp_path)
    for name in b.SCENARIOS:
        assert (tmp_path / name / "rank0.trace.json").read_text() == (FIX / name / "rank0.trace.json").read_text(), \
            f"fixtures/gpu_shaped/{name} is stale: run python3 fixtures/gpu_shaped/build.py"
    b.write_memory(tmp_path)
    for f in ("memory.parquet", "steps.parquet", "memory_categories.parquet"):
        assert pq.read_table(tmp_path / "memory" / f).equals(pq.read_table(FIX / "memory" / f))


def test_overlap_across_streams(tmp_path):
    """Device windows (analyzer/ingest/steps.py): step 1 from its first kernel (100) to step
    2's first (1100), step 2 from 1100 to the end of its last kernel (1600).
    Step 1 (window 100..1100):
    K = gemm s7 100..300 + 300..400, add s13 350..500, gemm s7 700..750 -> [100,500] [700,750] = 450
    C = all_reduce s20 250..450, all_gather s20 600..800 = 400
    C ∩ K = 250..450 (200) + 700..750 (50) = 250; exposed 150
    O = memcpy s9 780..900 and memset s7 950..960, minus C ∪ K -> 800..900 + 950..960 = 110
        (the memcpy's 780..800 under the all_gather is neither compute nor extra time)
    idle = 1000 - 450 - 150 - 110 = 290 (960..1100: the GPU waits for step 2's launches).
    The gpu_user_annotation on s20 counts as nothing.
    Step 2 (window 1100..1600: the reduce_scatter launched in step 2 ends at 1600):
    K = 1100..1300 (200), C = 1200..1600 (400), overlap 100, exposed 300, idle 500-200-300 = 0.
    """
    ts = load("overlap", tmp_path)
    assert ts.ranks[0].device_kind == "gpu"
    bd = ts.breakdown.set_index("step")
    us = lambda col: [int(v) // US for v in bd[col]]  # noqa: E731
    assert us("step_ns") == [1000, 500]
    assert us("compute_ns") == [450, 200]
    assert us("comm_ns") == [400, 400]
    assert us("overlap_ns") == [250, 100]
    assert us("exposed_comm_ns") == [150, 300]
    assert us("other_ns") == [110, 0]
    assert us("idle_ns") == [290, 0]
    assert list(bd["overlap_frac"]) == [pytest.approx(250 / 400), pytest.approx(100 / 400)]
    # identity, and the whole-trace (HTA-scope) figure from the same sets: (250+100)/(400+400)
    assert (bd["compute_ns"] + bd["exposed_comm_ns"] + bd["data_wait_ns"] + bd["other_ns"] + bd["idle_ns"] == bd["step_ns"]).all()
    ev = events("overlap")
    from analyzer.analyses.breakdown import whole_trace_overlap
    assert whole_trace_overlap(ev) == (350 * US, 800 * US)
    assert (ts.ranks[0].whole_overlap_ns, ts.ranks[0].whole_comm_ns) == (350 * US, 800 * US)
    kinds = ev[ev["role"] == "comm"].sort_values("ts_ns")["coll_kind"].astype(str).tolist()
    assert kinds == ["all_reduce", "all_gather", "reduce_scatter"]


def test_fsdp2_breakdown_across_streams(tmp_path):
    """K: embedding 50..150 (copy-in s20 90..100 inside) = 100; s7 300..900 = 600;
    s7 1250..1900 = 650; optimizer 2000..2100 = 100 -> 1450.
    C: all_gathers s20 100..500 and 1050..1450 (400 + 400), reduce_scatter s21 1600..1800 -> 1000.
    C ∩ K: 100..150 + 300..500 (250) + 1250..1450 (200) + 1600..1800 (200) = 650; exposed 350.
    device window (the only step, analyzer/ingest/steps.py rule 4) = first kernel 50 .. 50 +
    its CPU span 0..3000 = 3050, later than its last kernel's end 2100: 3000;
    idle = 3000 - 1450 - 350 = 1200."""
    bd = load("fsdp2", tmp_path).breakdown.iloc[0]
    got = {c: int(bd[c]) // US for c in ("step_ns", "compute_ns", "comm_ns", "overlap_ns",
                                         "exposed_comm_ns", "other_ns", "idle_ns")}
    assert got == {"step_ns": 3000, "compute_ns": 1450, "comm_ns": 1000, "overlap_ns": 650,
                   "exposed_comm_ns": 350, "other_ns": 0, "idle_ns": 1200}


def test_fsdp2_prefetch_on_gpu(tmp_path):
    """One row per CPU ``FSDP::all_gather (<fqn>)`` (the gpu_user_annotation mirrors on the
    streams are not issues); each paired with the NCCL kernel its span launched; need = ready
    time of the copy-out kernel on s7 = max(its launch, end of the previous op on s7).

    layers.0 fwd: issue 30, AG 100..300; copy-out launched 105, previous s7 op (embedding) ends
        150 -> need 150, slack -150 (s7 waited 150..300); hidden: embedding 100..150 -> 50/200.
    layers.1 fwd: issue 210, AG 300..500; copy-out launched 280, previous s7 op gemm ends 700 ->
        need 700, slack +200; hidden: copy-out 300..320 + gemm 320..500 -> 200/200.
    layers.1 bwd: issue 1020, AG 1050..1250; copy-out launched 1097, s7 idle since 900 ->
        need 1097, slack -153; hidden 0 (s7 idle 900..1250).
    layers.0 bwd (inside FSDP::backward_prefetch -> prefetched): issue 1070, AG 1250..1450;
        copy-out launched 1220, previous s7 op gemm ends 1600 -> need 1600, slack +150;
        hidden 1250..1450 fully (copy-out + gemm) -> 200/200.
    """
    ev = events("fsdp2")
    t = prefetch.prefetch_table(ev, rank=0)
    assert list(zip(t["phase"], t["unit"], t["prefetched"])) == [
        ("forward", "layers.0", False), ("forward", "layers.1", False),
        ("backward", "layers.1", False), ("backward", "layers.0", True)]
    us = lambda col: [int(v) // US for v in t[col]]  # noqa: E731
    assert us("issued_ns") == [30, 210, 1020, 1070]
    assert us("comm_start_ns") == [100, 300, 1050, 1250]
    assert us("finished_ns") == [300, 500, 1250, 1450]
    assert us("need_ns") == [150, 700, 1097, 1600]
    assert us("slack_ns") == [-150, 200, -153, 150]
    assert us("hidden_ns") == [50, 200, 0, 200]
    assert list(t["hidden_frac"]) == [pytest.approx(0.25), 1.0, 0.0, 1.0]
    s = run_sums(t)
    assert (s["all_gathers"], s["prefetched"], s["late"]) == (4, 1, 2)
    assert (s["comm_ns"], s["hidden_ns"], s["wait_ns"]) == (800 * US, 450 * US, 303 * US)


def test_fsdp2_prefetch_with_gpu_behind_cpu():
    """fsdp2_lag: the GPU runs ~2 ms behind the CPU; labels as torch 2.13's fully_shard writes
    them. Consumer = first GPU kernel / memcpy launched (correlation id -> launch call) from
    inside the unit's FSDP::all_gather_copy_out; need = its ready time = max(launch call start,
    end of the previous op on its stream).

    layers.0 fwd: issue 30 inside its own FSDP::pre_forward -> not prefetched; AG 100..300;
        copy-out kernel launched 110, nothing before it on s7 -> need 110, slack -190 (late:
        s7 waited 110..300). hidden: compute 90..100 (copy-in) ends as the AG starts -> 0.
    layers.1 fwd: issue 155 inside FSDP::forward_prefetch for layers.1 -> prefetched;
        AG 300..2000; copy-out = Memcpy DtoD launched 930 (cudaMemcpyAsync), previous s7 op
        gemm 970..2800 -> need 2800, slack 2800 - 2000 = +800. hidden: s7 busy 300..2800 ->
        1700/1700. The old rule found no *compute* kernel launched in copy-out 920..950 and took
        the first compute kernel *starting* after CPU time 920: layers.0's gemm 970..2800
        (ready max(210, 970) = 970) -> slack 970 - 2000 = -1030, and called the unit not
        prefetched (no FSDP::pre_forward around the issue).
    layers.1 bwd: issue 3020 inside FSDP::pre_backward (layers.1) -> backward, not prefetched;
        AG 3100..3400; copy-out launched 3080, s7 idle since 3000 -> need 3080, slack -320.
        hidden 0 (s7 idle 3000..3400, copy-in 3400..3410 after it).
    layers.0 bwd: issue 3160 inside FSDP::backward_prefetch for layers.0 -> backward,
        prefetched; AG 3410..3600; copy-out launched 3520, previous s7 op gemm ends 4000 ->
        need 4000, slack +400. hidden: s7 3400..3420 + 3420..4000 cover it -> 190/190.
    Summary: late 2 (190 + 320 = 510 waited), unknown 0; comm 200+1700+300+190 = 2390,
    hidden 0+1700+0+190 = 1890.
    """
    t = prefetch.prefetch_table(events("fsdp2_lag"), rank=0)
    assert list(zip(t["phase"], t["unit"], t["prefetched"])) == [
        ("forward", "layers.0", False), ("forward", "layers.1", True),
        ("backward", "layers.1", False), ("backward", "layers.0", True)]
    us = lambda col: [int(v) // US for v in t[col]]  # noqa: E731
    assert us("issued_ns") == [30, 155, 3020, 3160]
    assert us("finished_ns") == [300, 2000, 3400, 3600]
    assert us("need_ns") == [110, 2800, 3080, 4000]
    assert us("slack_ns") == [-190, 800, -320, 400]
    assert us("hidden_ns") == [0, 1700, 0, 190]
    s = run_sums(t)
    assert (s["late"], s["unknown"], s["wait_ns"]) == (2, 0, 510 * US)
    assert (s["comm_ns"], s["hidden_ns"]) == (2390 * US, 1890 * US)


def test_fsdp2_without_hook_labels_slack_is_not_measured(tmp_path):
    """fsdp2_lag with only its FSDP::all_gather labels left (no pre_forward / pre_backward /
    *_prefetch / all_gather_copy_out): the phase comes from the autograd engine -- issues 3020
    and 3160 lie inside autograd::engine::evaluate_function (3000..3400) -> backward, 30 and
    155 outside -> forward (the old rule folded all four into forward); no consumer can be
    found, so every slack is unknown and the headline says so instead of "none finished after
    its unit needed it"."""
    from types import SimpleNamespace

    from analyzer.contract.report_types import Prefetch
    from reports import notes

    data = json.loads((FIX / "fsdp2_lag" / "rank0.trace.json").read_text())
    hooks = ("FSDP::pre_", "FSDP::forward_prefetch", "FSDP::backward_prefetch",
             "FSDP::all_gather_copy_out")
    data["traceEvents"] = [e for e in data["traceEvents"] if not e["name"].startswith(hooks)]
    (tmp_path / "rank0.trace.json").write_text(json.dumps(data))
    ev = api.load_events(tmp_path / "rank0.trace.json")[0]
    t = prefetch.prefetch_table(ev, rank=0)
    assert list(t["phase"]) == ["forward", "forward", "backward", "backward"]
    assert t["slack_ns"].isna().all() and t["need_ns"].isna().all()
    s = run_sums(t)
    assert (s["all_gathers"], s["late"], s["unknown"]) == (4, 0, 4)
    run = SimpleNamespace(name="fsdp2", exposed_comm_ns=0,
                          prefetch=Prefetch(**s, note=None, units=[]))
    text = notes.prefetch_sentence(run)
    assert "not measured for any of them" in text
    assert "none" not in text and "finished after" not in text


def test_fsdp1_prefetch_on_gpu(tmp_path):
    """FSDP1: one issue per *outermost* all_gather enqueue (c10d::_allgather_base_ holds
    record_param_comms holds nccl:_all_gather_base: one issue, not three); need = ready time of
    the first compute kernel launched after the consuming pre-hook returned.

    fwd #0: issue 20 in _pre_forward 10..100, AG 100..250; first compute launched after 100 is
        the gemm launched 110 (previous s7 op ends 60) -> need 110, slack -140; hidden 0.
    fwd #1: issue 75 in _pre_forward_prefetch, AG 250..400; consumer hook = next _pre_forward
        300..350, first compute launched after 350 at 360, previous s7 gemm ends 500 ->
        need 500, slack +100; hidden: gemm 250..500 covers 250..400 -> 150/150.
    bwd #0: issue 1010 in _pre_backward_hook 1000..1100, AG 1100..1300; gemm launched 1120,
        s7 idle since 700 -> need 1120, slack -180; hidden 0.
    """
    ev = events("fsdp1")
    assert prefetch.detect_labels(ev) == "fsdp1"
    t = prefetch.prefetch_table(ev, rank=0)
    assert list(zip(t["phase"], t["unit"], t["prefetched"])) == [
        ("forward", "#0", False), ("forward", "#1", True), ("backward", "#0", False)]
    us = lambda col: [int(v) // US for v in t[col]]  # noqa: E731
    assert us("issued_ns") == [20, 75, 1010]
    assert us("finished_ns") == [250, 400, 1300]
    assert us("need_ns") == [110, 500, 1120]
    assert us("slack_ns") == [-140, 100, -180]
    assert us("hidden_ns") == [0, 150, 0]


def test_fsdp1_breakdown(tmp_path):
    """K: 10..60 + 250..700 + 1300..1500 = 700; C: 100..400 + 1100..1300 + 1500..1600 = 600;
    C ∩ K = 250..400 = 150; exposed 450; device window 10..2010 (the only step: first kernel
    + its CPU span 0..2000, later than the last kernel's end 1600): idle = 2000 - 700 - 450 =
    850."""
    bd = load("fsdp1", tmp_path).breakdown.iloc[0]
    assert [int(bd[c]) // US for c in ("compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns", "idle_ns")] \
        == [700, 600, 150, 450, 850]


def test_memory_summary_from_parquet():
    """memory.parquet (build.py memory_rows, MiB): rank 0 live = parameter 64 + 32, unknown
    16 + 8 (inactive 128 and pending-free 4 are not live); rank 1 live = parameter 48,
    unknown 24."""
    MIB = 1 << 20
    mem = memory.read_memory(FIX / "memory" / "memory.parquet")
    cat = memory.memory_by_category(mem)
    assert [(r.rank, r.category, r.blocks, r.bytes // MIB) for r in cat.itertuples()] == [
        (0, "parameter", 2, 96), (0, "unknown", 2, 24), (1, "parameter", 1, 48), (1, "unknown", 1, 24)]
    big = memory.largest_allocations(mem, n=2)
    assert [(r.rank, r.block_size_bytes // MIB) for r in big.itertuples()] == [(0, 64), (0, 32), (1, 48), (1, 24)]
    assert big["top_frame"].iloc[3] == "/repo/tracer/model.py:40:forward"


def test_cuda_peaks_from_steps():
    """steps.parquet (build.py steps_rows, MiB): max allocated rank 0 = max(300, 420, 410) =
    420, rank 1 = max(280, 400, 430) = 430; reserved 640 / 576; run peak = 430 (CUDA wins over
    the profiler's 64)."""
    MIB = 1 << 20
    peaks = memory.rank_peaks(memory.read_steps(FIX / "memory" / "steps.parquet"))
    assert [int(v) // MIB for v in peaks["cuda_max_allocated_bytes"]] == [420, 430]
    assert [int(v) // MIB for v in peaks["cuda_max_reserved_bytes"]] == [640, 576]
    assert memory.peak_allocated_bytes(peaks) == 430 * MIB


def test_categories_agree_with_the_snapshot_totals():
    """memory_categories.parquet beside memory.parquet (build.py, MiB). Snapshot totals by hand:
    rank 0 live 64 + 32 + 16 + 8 = 120, all blocks 120 + 128 + 4 = 252; rank 1 live 48 + 24 =
    72, all 72 + 96 = 168. Between steps (gradients freed) a rank holds its parameters and
    optimizer state: 96 + 24 = 120 and 48 + 24 = 72, exactly the live blocks; the peak row is
    steps.parquet's largest allocated / reserved after step 0 (420 / 640, 430 / 576), above both
    totals."""
    MIB = 1 << 20
    cats = memory.read_categories(FIX / "memory" / "memory_categories.parquet")
    totals = memory.snapshot_totals(memory.read_memory(FIX / "memory" / "memory.parquet"))
    assert [(r.rank, r.allocated_bytes // MIB, r.reserved_bytes // MIB) for r in totals.itertuples()] == [
        (0, 120, 252), (1, 72, 168)]
    steps = memory.read_steps(FIX / "memory" / "steps.parquet")
    after0 = steps[steps["step"] > 0].groupby("rank")
    peak = cats[cats["category"] == "peak"].set_index("rank")
    assert list(peak["bytes"]) == list(after0["cuda_max_allocated_bytes"].max())
    assert list(peak["reserved_bytes"]) == list(after0["cuda_max_reserved_bytes"].max())
    agree = memory.snapshot_agreement(cats, totals)
    assert list(agree["held_bytes"]) == list(totals["allocated_bytes"])
    assert list(agree["other_live_bytes"]) == [0, 0] and agree["agrees"].all()


def test_snapshot_and_categories_in_the_report(tmp_path):
    """A GPU-shaped run directory (the fixture's three memory files, a manifest): the report's
    peak is the categories' (430 MiB on rank 1, reserved 640), and the snapshot totals carry the
    agreement."""
    from analyzer.compare.runs import analyse
    from tests.reports.builders import manifest, write_manifest

    run = tmp_path / "ddp"
    (run / "memory").mkdir(parents=True)
    shutil.copy(FIX / "memory" / "memory.parquet", run / "memory" / "memory.parquet")
    for f in ("steps.parquet", "memory_categories.parquet"):
        shutil.copy(FIX / "memory" / f, run / f)
    write_manifest(run, manifest(run_name="ddp", strategy="ddp", device="cuda"))
    mem = analyse(run).runs[0].memory
    MIB = 1 << 20
    assert (mem.peak_allocated_bytes, mem.peak_reserved_bytes) == (430 * MIB, 640 * MIB)
    assert "max_memory_allocated" in mem.peak_source
    assert [(t.rank, t.held_bytes // MIB, t.agrees) for t in mem.snapshot_totals] == [(0, 120, True), (1, 72, True)]


def test_traces_are_valid_json_with_nccl_info():
    for name in ("overlap", "fsdp2", "fsdp2_lag", "fsdp1"):
        data = json.loads((FIX / name / "rank0.trace.json").read_text())
        assert data["distributedInfo"]["backend"] == "nccl"
