"""Real traces nobody here wrote, checked against published oracle values (corpus README)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analyzer.api import load_events, load_tables
from analyzer.analyses.collectives import by_kind
from bench.tile import tile_file
from tests.analyzer.helpers import CORPUS, corpus, link_folder

pytestmark = pytest.mark.integration

HTA_PUBLISHED_PCT = [4.50, 2.47, 7.88, 3.31, 0.56, 0.64, 7.56, 9.51]  # corpus README
IDENTITY = ["compute_ns", "exposed_comm_ns", "data_wait_ns", "other_ns", "idle_ns"]
FIGURES = ["step_ns", "compute_ns", "comm_ns", "overlap_ns", "exposed_comm_ns", "other_ns",
           "idle_ns"]


@pytest.fixture(scope="module")
def dlrm():
    return load_tables(corpus("dlrm_ddp_8rank_v100"))


def test_dlrm_overlap_matches_hta_published(dlrm):
    b = dlrm.breakdown.sort_values("rank")
    assert list(b["rank"]) == list(range(8)) and list(b["step"]) == [10] * 8
    assert [r.rank_source for r in dlrm.ranks] == ["distributedInfo"] * 8
    for frac, pct in zip(b["overlap_frac"], HTA_PUBLISHED_PCT):
        assert abs(frac - pct / 100) <= 0.001


def test_dlrm_overlap_equals_hta_run_here(dlrm):
    try:
        from analyzer.compare.crosscheck_hta import compare, run_hta_overlap
        import hta  # noqa: F401
    except ImportError:
        pytest.skip("HolisticTraceAnalysis not importable: the in-test HTA run is skipped")
    hta_df = run_hta_overlap(corpus("dlrm_ddp_8rank_v100"))
    b = dlrm.breakdown.set_index("rank")
    for rank, pct in zip(hta_df["rank"], hta_df["hta_overlap_pct"]):
        # HTA rounds to 0.01 %: ours, unrounded, must round to the same figure
        assert round(100 * b.loc[rank, "overlap_frac"], 2) == pytest.approx(pct, abs=1e-9)
    cmp = compare(dlrm, hta_df)
    assert (cmp["diff_pct"].abs() <= 0.005 + 1e-9).all()
    assert (cmp["explanation"] == "").all()


def test_dlrm_kinds(dlrm):
    c = dlrm.collectives
    # corpus README: ncclKernel_SendRecv (all_to_all) and ncclKernel_AllReduce
    assert set(c["kind"]) == {"all_to_all", "all_reduce"}
    send_recv = c[c["name"].str.startswith("ncclKernel_SendRecv")]
    assert (send_recv["kind"] == "all_to_all").all()


def _plugin_view(ev):
    """The TensorBoard plugin's definitions, built from our event table (see the mapping
    below)."""
    from analyzer.analyses import intervals as iv

    role = ev["role"].astype(str).to_numpy()
    name = ev["name"].astype(str).to_numpy()
    s, e = ev["ts_ns"].to_numpy(), ev["end_ns"].to_numpy()
    gpu = ev["is_gpu"].to_numpy()
    # plugin "step" without ProfilerStep: the span of the CPU events
    lo, hi = int(s[~gpu].min()), int(e[~gpu].max())
    # plugin communication = our comm rows (NCCL kernels, gloo ops) ∪ the CPU-side nccl:* ops
    # (our comm_enqueue rows named nccl:*); plugin computation = our compute rows (GPU kernels;
    # on a CPU-only trace every non-comm CPU op, i.e. our compute + other)
    comm_mask = (role == "comm") | ((role == "comm_enqueue") & np.char.startswith(
        name.astype(str), "nccl:"))
    if ev.attrs["device_kind"] == "gpu":
        comp_mask = role == "compute"
    else:
        comp_mask = ~gpu & ~comm_mask & np.isin(role, ["compute", "other"])
    C = iv.clip(iv.merge(s[comm_mask], e[comm_mask]), lo, hi)
    K = iv.clip(iv.merge(s[comp_mask], e[comp_mask]), lo, hi)
    both = iv.measure(iv.intersect(C, K))
    return [iv.measure(K) - both, both, iv.measure(C) - both,
            (hi - lo) - iv.measure(iv.union(C, K))]


@pytest.mark.parametrize("job, expected", [
    ("nccl", {0: [30, 75, 75, 55], 1: [121, 40, 74, 0]}),
    ("gloo_cpu", {0: [47, 74, 35, 0], 1: [36, 64, 34, 12]}),
])
def test_tbplugin_expected_breakdown(tmp_path, job, expected):
    """Mapping: plugin "computation only" = |K \\ C|, "overlapped" = |K ∩ C|, "communication
    only" = |C \\ K|, "other" = step - |C ∪ K| (= our other + idle). Their C also counts the
    CPU-side nccl:* op, and their step is the CPU span when there is no ProfilerStep."""
    files = sorted(corpus("tbplugin_2rank").glob(f"{job}__worker*.json"))
    ts = load_tables(link_folder(tmp_path / job, files))
    assert [(r.rank, r.rank_source) for r in ts.ranks] == [(0, "file name"), (1, "file name")]
    assert ts.whole_trace_mode
    for rt in ts.ranks:
        assert [v // 1000 for v in _plugin_view(load_events(rt.path)[0])] == expected[rt.rank]
    if job == "nccl":
        # plugin's op table, worker0: nccl:broadcast 212,480 B 75 µs; nccl:all_reduce 8,196,000 B
        # 1,558 µs. Their op time spans the CPU op and its kernels: ours from the enqueue columns.
        c = ts.collectives
        w0 = c[c["rank"] == 0].set_index("kind")
        assert w0.loc["broadcast", "bytes"] == 212_480
        assert w0.loc["all_reduce", "bytes"] == 8_196_000
        span = (np.maximum(w0["end_ns"], w0["enqueue_end_ns"])
                - np.minimum(w0["start_ns"], w0["enqueue_start_ns"]))
        assert span["broadcast"] == 75_000 and span["all_reduce"] == 1_558_000


def test_a100_nccl_args():
    ts = load_tables(corpus("single/a100_ddp_rank0_nccl_args.json.gz"))
    c = ts.collectives
    assert len(c) == 21  # 7 collectives x 3 steps
    assert sorted(set(c["step"])) == [4, 5, 6]
    assert (c.groupby("step").size() == 7).all()
    big = c[c["bytes"] == 2_049_000 * 4]
    assert len(big) >= 1
    assert (big["kind"] == "all_reduce").all() and (big["pg"] == "0").all()
    ev, _ = load_events(ts.ranks[0].path)
    rpc = ev[(ev["name"] == "record_param_comms") & (ev["in_nelems"] == 2_049_000)]
    assert (rpc["out_nelems"] == 2_049_000).all() and (rpc["pg"] == "0").all()
    assert set(rpc["pg_ranks"]) == {"[0, 1]"}
    assert ts.world_size == 2 and ts.missing_ranks == [1]


def test_b200_devkernel_allgather():
    ts = load_tables(corpus("single/b200_allgather_rank0.json.gz"))
    c = ts.collectives
    ag = c[c["name"].str.startswith("ncclDevKernel_AllGather")]
    assert len(ag) >= 1 and (ag["kind"] == "all_gather").all()
    # bytes as nccl-tests counts all_gather: the total buffer, Out msg nelems 201,088 x 2 (bf16)
    assert (ag["bytes"] == 201_088 * 2).all()
    assert ts.whole_trace_mode and ts.world_size == 8


def test_cpu_gloo_rank34():
    ts = load_tables(corpus("single/cpu_gloo_ddp_rank34.json.gz"))
    rt = ts.ranks[0]
    assert (rt.rank, rt.rank_source, ts.world_size, rt.device_kind) == \
        (34, "distributedInfo", 300, "cpu")
    assert len(ts.missing_ranks) == 299
    c = ts.collectives
    assert len(c) > 0 and set(c["kind"]) == {"all_reduce"}
    assert set(c["name"]) == {"gloo:all_reduce"}
    k = by_kind(ts.collectives)
    assert list(k["kind"]) == ["all_reduce"] and (k["bytes"] > 0).all()


def _all_corpus_inputs():
    single = sorted((CORPUS / "single").glob("*.json.gz")) if CORPUS.exists() else []
    return ["dlrm_ddp_8rank_v100"] + [f"single/{p.name}" for p in single]


@pytest.mark.parametrize("rel", _all_corpus_inputs())
def test_conservation_identity(rel):
    b = load_tables(corpus(rel)).breakdown
    assert len(b) > 0
    assert (b[IDENTITY].sum(axis=1) == b["step_ns"]).all()
    assert (b[FIGURES] >= 0).all().all()
    assert (b["overlap_ns"] <= b[["comm_ns", "compute_ns"]].min(axis=1)).all()


@pytest.mark.parametrize("job", ["nccl", "gloo_cpu"])
def test_conservation_identity_tbplugin(tmp_path, job):
    files = sorted(corpus("tbplugin_2rank").glob(f"{job}__worker*.json"))
    b = load_tables(link_folder(tmp_path, files)).breakdown
    assert (b[IDENTITY].sum(axis=1) == b["step_ns"]).all()


@pytest.mark.parametrize("rel", ["dlrm_ddp_8rank_v100/worker0.pt.trace.json.gz",
                                 "single/v100_ddp_subus_timestamps.json.gz",
                                 "single/cpu_gloo_ddp_rank34.json.gz"])
def test_tiling_leaves_per_step_figures_unchanged(tmp_path, rel):
    k = 3
    src = corpus(rel)
    dst = tmp_path / "tiled.json.gz"
    tile_file(src, dst, k)
    a = load_tables(src).breakdown
    b = load_tables(dst).breakdown
    n = len(a)
    assert len(b) == k * n
    assert list(b["step"]) == sorted(b["step"])
    gpu = load_tables(src).ranks[0].device_kind == "gpu"
    for i in range(k):
        # on a GPU rank a tile's last step is no longer the trace's last: its device window
        # runs on to the next tile's first device work (analyzer/ingest/steps.py), so it is
        # compared only in the last tile
        m = n - 1 if gpu and i < k - 1 else n
        assert (b[FIGURES].iloc[i * n:i * n + m].to_numpy() == a[FIGURES].iloc[:m].to_numpy()).all()


def test_subus_timestamps_exact(tmp_path):
    """Sub-µs epoch timestamps: our int64 ns equal the decimal text exactly (float64 would be
    off by up to 125 ns at this magnitude)."""
    import gzip
    from decimal import Decimal

    src = corpus("single/v100_ddp_subus_timestamps.json.gz")
    raw = json.loads(gzip.decompress(src.read_bytes()), parse_float=Decimal)
    want = sorted(int((Decimal(e["ts"]) * 1000).to_integral_value(rounding="ROUND_HALF_UP"))
                  for e in raw["traceEvents"] if e.get("ph") == "X")
    got = sorted(load_events(src)[0]["ts_ns"].tolist())
    assert got == want
