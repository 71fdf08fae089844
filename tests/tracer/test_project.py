"""``tracer project`` (issue 44): one process, world size N on torch's fake process group.

The projected rank's parameter / gradient / AdamW state bytes and its all_gather /
reduce_scatter / all_reduce calls and bytes per step equal hand counts made here from the
reference model's parameter shapes (tracer/model.py; listed again below, not imported) and each
strategy's rule, at N = 2, 4, 8 and 64; the parameter bytes also equal the analyzer's sharding
arithmetic (analyzer/analyses/sharding.py ``predict``), the second way.

Hand rules (torch 2.13):
- FSDP2 (``fully_shard`` per layer, torch/distributed/fsdp/_fully_shard/_fsdp_param.py): each
  parameter sharded on dim 0 into chunks of ceil(d0 / N) rows, every rank's shard padded to that.
  Per step and layer: one all_gather in forward, one in backward (reshard after forward), one
  reduce_scatter, each of the layer's padded buffer x N (nccl-tests bytes: the whole buffer).
- FSDP1 (``use_orig_params``; torch/distributed/fsdp/_flat_param.py): per unit the layer's
  parameters flattened (each start aligned to 16 bytes: none needed at hidden 32), padded to a
  multiple of N; the same calls as FSDP2 on the flat buffer.
- DDP: the whole model on every rank; one all_reduce per step of the one bucket (75,776 bytes:
  under torch's 1 MiB first bucket, torch/nn/parallel/distributed.py
  ``_DEFAULT_FIRST_BUCKET_BYTES``).
- AdamW: exp_avg and exp_avg_sq of the local unpadded view, plus a 4-byte step per parameter
  that has a state (tests/tracer/test_memory_categories.py, measured on real records).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.tracer.helpers import run_tracer

HIDDEN, LAYERS, FP32 = 32, 2, 4
WORLDS = (2, 4, 8, 64)
STEPS = ["--wait", "1", "--warmup", "1", "--active", "2"]
"""Profiled steps 2 and 3: the steady state (DDP rebuilds its buckets in its second iteration,
broadcasting the bucket indices from C++: a one-time call whose dtype the fake group's trace
does not hold, tracer/project.py)."""


REAL_TENSORS = {"fake_tensors": False, "op_durations": "measured", "device_tflops": None,
                "device_mem_gbps": None, "compute_estimate": [], "live_peak_bytes": {}}
"""A projection's fake-tensor fields with real tensors (analyzer/contract/schemas.py ``Projection``)."""


def layer_shapes(h: int) -> list[tuple[str, tuple[int, ...]]]:
    """One SimpleTransformerLayer's parameters in registration order."""
    return [("attn.weight", (h, h)), ("attn.bias", (h,)), ("mlp.0.weight", (4 * h, h)),
            ("mlp.0.bias", (4 * h,)), ("mlp.2.weight", (h, 4 * h)), ("mlp.2.bias", (h,)),
            ("norm.weight", (h,)), ("norm.bias", (h,))]


SHAPES = [s for _ in range(LAYERS) for _, s in layer_shapes(HIDDEN)]
N_PARAMS = sum(math.prod(s) for s in SHAPES)  # 18,944


def fsdp2_counts(w: int) -> dict:
    """Rank 0 of FSDP2 over ``w`` ranks: memory bytes and per-step (calls, bytes) per kind."""
    per_layer = [s for _, s in layer_shapes(HIDDEN)]
    padded = sum(math.ceil(s[0] / w) * math.prod(s[1:]) for s in per_layer)
    local = sum(min(s[0], math.ceil(s[0] / w)) * math.prod(s[1:]) for s in per_layer)  # rank 0's rows
    unit_bytes = padded * w * FP32
    return {"parameters": LAYERS * padded * FP32, "gradients": LAYERS * padded * FP32,
            "optimizer_state": LAYERS * (2 * local * FP32 + len(per_layer) * FP32),
            "calls": {("all_gather", "default_pg"): (2 * LAYERS, 2 * LAYERS * unit_bytes),
                      ("reduce_scatter", "default_pg"): (LAYERS, LAYERS * unit_bytes)}}


def hsdp_counts(r: int, s: int) -> dict:
    """Rank 0 of HSDP on an R x S mesh: FSDP2 over the shard group of S ranks (memory and
    calls as ``fsdp2_counts(S)`` there), and per step and layer one all_reduce of the layer's
    padded shard over the replicate group of R ranks (FSDP2's HSDP path:
    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py ``foreach_reduce``)."""
    flat = fsdp2_counts(s)
    shard_bytes = flat["parameters"] // LAYERS
    calls = {(kind, "mesh_shard"): v for (kind, _), v in flat["calls"].items()}
    calls[("all_reduce", "mesh_replicate")] = (LAYERS, LAYERS * shard_bytes)
    return {**flat, "calls": calls}


def fsdp1_counts(w: int) -> dict:
    """Rank 0 of FSDP1 full_shard over ``w`` ranks (one flat parameter per layer)."""
    offsets, total = [], 0
    for _, shape in layer_shapes(HIDDEN):
        total += (-total) % 4
        offsets.append((total, math.prod(shape)))
        total += math.prod(shape)
    total += (-total) % w
    shard = total // w
    mine = [max(0, min(shard, start + numel) - start) for start, numel in offsets]  # rank 0: [0, shard)
    state = 2 * sum(mine) * FP32 + sum(m > 0 for m in mine) * FP32
    return {"parameters": LAYERS * shard * FP32, "gradients": LAYERS * shard * FP32,
            "optimizer_state": LAYERS * state,
            "calls": {("all_gather", "default_pg"): (2 * LAYERS, 2 * LAYERS * total * FP32),
                      ("reduce_scatter", "default_pg"): (LAYERS, LAYERS * total * FP32)}}


def ddp_counts(w: int) -> dict:
    """Any rank of DDP: the whole model, one bucket all_reduced per step."""
    whole = N_PARAMS * FP32
    return {"parameters": whole, "gradients": whole,
            "optimizer_state": 2 * whole + len(SHAPES) * FP32,
            "calls": {("all_reduce", "default_pg"): (1, whole)}}


HAND = {"fsdp2": fsdp2_counts, "fsdp": fsdp1_counts, "ddp": ddp_counts}
CASES = [(s, w, []) for s in HAND for w in WORLDS] + [
    ("hsdp", r * c, ["--mesh", f"{r},{c}"]) for r, c in ((2, 2), (2, 4), (8, 8))] + [
    ("ddp", 8, ["--mixed-precision", "fp32,bf16,fp32"])]
"""(strategy, N, extra options). The last: DDP reducing in bf16 (tracer/training.py
``ddp_comm_hook``): fp32 parameters, gradients and state, the bucket all_reduced in bf16, half
the bytes."""


def test_hand_counts_agree_with_the_sharding_arithmetic():
    """The fast half: FSDP2's hand count is the analyzer's padded arithmetic
    (``sharding._padded`` over the reference shapes) at every N, and the 1 MiB first DDP bucket
    holds the whole reference model (one all_reduce a step)."""
    from analyzer.analyses import sharding

    shapes = [s for _, s in sharding.reference_shapes(HIDDEN, LAYERS)]
    assert shapes == SHAPES
    for w in (*WORLDS, 3, 1024):
        assert fsdp2_counts(w)["parameters"] == sharding._padded(shapes, w) * FP32, w
    assert fsdp2_counts(64)["parameters"] == LAYERS * 230 * FP32  # 1 + 1 + 2 + 2 + 128 + 1 + ... rows
    assert N_PARAMS * FP32 < 1024 * 1024


def per_step_calls(trace: Path, profiled: list[int], dtype: str = "Float") -> dict[int, dict[tuple[str, str], tuple[int, int]]]:
    """{step: {(kind, pg_desc): (calls, bytes)}} of the collective calls (comm enqueue rows) the analyzer
    reads in ``trace``, for the ``profiled`` steps."""
    from analyzer.api import load_events

    events, _ = load_events(trace)
    comm = events[events["role"].astype(str).isin(["comm", "comm_enqueue"])]
    out: dict[int, dict[tuple[str, str], tuple[int, int]]] = {s: {} for s in profiled}
    for (step, kind), g in comm.groupby([comm["step"], comm["coll_kind"].astype(str)], observed=True):
        if int(step) in out:
            assert (g["bytes"] > 0).all(), (step, kind, g[["name", "bytes"]])
            assert set(g["dtype"]) == {dtype}, (step, kind)
            assert g["pg"].astype(str).str.len().gt(0).all()
            for desc, h in g.groupby(g["pg_desc"].astype(str)):
                out[int(step)][(kind, desc)] = (len(h), int(h["bytes"].sum()))
    return out


def categories(run_dir: Path) -> dict[str, int]:
    rows = pq.read_table(run_dir / "memory_categories.parquet").to_pylist()
    assert {r["rank"] for r in rows} == {0}
    return {r["category"]: r["bytes"] for r in rows}


@pytest.mark.record
@pytest.mark.parametrize(("strategy", "world", "extra"), CASES,
                         ids=[f"{s}-{w}{'-' + m[1] if m else ''}" for s, w, m in CASES])
def test_projection_at_n_equals_the_hand_counts(tmp_path, strategy, world, extra):
    proc, _ = run_tracer(["--strategy", strategy, "--nproc", str(world), *extra, "--hidden", str(HIDDEN),
                          "--layers", str(LAYERS), "--seq", "16", "--batch", str(world),
                          "--optimizer", "adamw", *STEPS, "--out", str(tmp_path), "--name", "p"],
                         cwd=tmp_path, module=[sys.executable, "-m", "tracer", "project"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f"projected {tmp_path / 'p'}"
    run = tmp_path / "p"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["projection"] == {"world_size": world, "roles_run": [0], "device": "cpu",
                                      "fake_process_group": True, **REAL_TENSORS}
    assert manifest["world_size"] == world and manifest["backend"] == "fake"
    assert sorted(p.name for p in run.glob("rank*.trace.json.gz")) == ["rank0.trace.json.gz"]
    want = hsdp_counts(*map(int, extra[1].split(","))) if strategy == "hsdp" else HAND[strategy](world)
    dtype = "Float"
    if "--mixed-precision" in extra:
        dtype = "BFloat16"
        want["calls"] = {k: (n, b // 2) for k, (n, b) in want["calls"].items()}
    got = categories(run)
    for cat in ("parameters", "gradients", "optimizer_state"):
        assert got[cat] == want[cat], (cat, got[cat], want[cat])
    if strategy != "fsdp":  # the second way: FSDP1's flat padding is not in the manifest
        from analyzer.analyses import sharding
        from analyzer.contract.schemas import Manifest
        import msgspec

        m = msgspec.json.decode((run / "manifest.json").read_bytes(), type=Manifest)
        assert sharding.predict(m)["ranks"][0]["padded_elements"] * FP32 == got["parameters"]
    calls = per_step_calls(run / "rank0.trace.json.gz", [2, 3], dtype)
    for step, kinds in calls.items():
        assert kinds == want["calls"], (step, kinds)


@pytest.mark.integration
def test_projection_refuses_a_mesh_that_does_not_divide_the_world(tmp_path):
    proc, _ = run_tracer(["--strategy", "hsdp", "--nproc", "8", "--mesh", "3,3", "--out",
                          str(tmp_path)], cwd=tmp_path,
                         module=[sys.executable, "-m", "tracer", "project"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "tracer: --mesh 3,3: replicate x shard = 9, not the world size 8; pass R,S with R*S = 8"]


@pytest.mark.integration
def test_projection_refuses_a_batch_the_world_does_not_divide(tmp_path):
    proc, _ = run_tracer(["--strategy", "fsdp2", "--nproc", "64", "--batch", "8", "--out",
                          str(tmp_path)], cwd=tmp_path,
                         module=[sys.executable, "-m", "tracer", "project"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "tracer: --batch 8: global batch must divide by the world size 64; pass a multiple of 64"]
    assert not (tmp_path / "fsdp2").exists()


def test_tag_tensor_note_reads_back():
    """The fake group's process-group tag: its tensor note gives dtype and elements, and the
    process group and peer read as before."""
    from analyzer.ingest.classify import parse_pg_tag, parse_tag_tensor

    assert parse_pg_tag("paritytrace::pg 0 tensor float32 18944") == ("0", -1)
    assert parse_pg_tag("paritytrace::pg 3 tensor bfloat16 8 peer 5") == ("3", 5)
    assert parse_tag_tensor("paritytrace::pg 3 tensor bfloat16 8 peer 5") == ("bfloat16", 8)
    assert parse_tag_tensor("paritytrace::pg 0") is None


def test_tensor_note_sums_a_tensor_list():
    import torch

    from tracer.pgtag import tensor_note

    out = [torch.zeros(4), torch.zeros(4)]
    assert tensor_note((out, torch.zeros(4)), {}) == " tensor float32 8"
    assert tensor_note((torch.zeros(2, 3, dtype=torch.bfloat16),), {}) == " tensor bfloat16 6"
    assert tensor_note((), {"group": None}) == ""


@pytest.mark.record
def test_projection_parity_reads_not_verified(tmp_path):
    """A projection's numbers are not the job's (no data moves): the report says so, never
    pass or fail; its trace passes the Chrome-trace check (analyzer/timeline/chrome_check.py)."""
    proc, _ = run_tracer(["--strategy", "fsdp2", "--nproc", "8", "--hidden", str(HIDDEN), "--seq",
                          "16", "--batch", "8", *STEPS, "--out", str(tmp_path), "--name", "p"],
                         cwd=tmp_path, module=[sys.executable, "-m", "tracer", "project"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    report, _ = run_tracer([str(tmp_path)], cwd=tmp_path,
                           module=[sys.executable, "-m", "analyzer", "report"])
    assert report.returncode == 0, report.stderr[-3000:]
    md = (tmp_path / "report" / "report.md").read_text().splitlines()
    assert ("- Parity: not verified for p (projection: the fake process group moves no data): "
            "their numbers are not checked against the baseline.") in md
    parity = json.loads((tmp_path / "report" / "report.json").read_text())["runs"][0]["parity"]
    assert (parity["status"], parity["reason"]) == (
        "not_recorded", "projection: the fake process group moves no data")
    import gzip

    from analyzer.timeline.chrome_check import check_trace

    with gzip.open(tmp_path / "p" / "rank0.trace.json.gz") as f:  # what Perfetto opens
        assert check_trace(json.load(f)) == []


# ---- Fake tensors and the projection's inputs (issue 44, Deliver 1) ----

FAKE_CASES = [("fsdp2", []), ("hsdp", ["--mesh", "2,4"]), ("fsdp", [])]
"""World 8, with and without --fake-tensors (DDP is refused on fake tensors)."""


def _project(tmp_path: Path, name: str, strategy: str, extra: list[str]) -> Path:
    proc, _ = run_tracer(["--strategy", strategy, "--nproc", "8", *extra, "--hidden", str(HIDDEN),
                          "--layers", str(LAYERS), "--seq", "16", "--batch", "8", "--optimizer",
                          "adamw", *STEPS, "--out", str(tmp_path), "--name", name],
                         cwd=tmp_path, module=[sys.executable, "-m", "tracer", "project"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp_path / name


def reference_matmul_flops(tokens: int, h: int, layers: int) -> dict[str, int]:
    """Hand count of a step's matmul FLOPs on ``tokens`` rows of the reference model
    (torch/utils/flop_counter.py: 2 m n k per [m, k] x [k, n]): per layer three Linear layers
    of h x h, h x 4h, 4h x h (9 h^2 multiply-adds a token). Forward: one ``addmm`` each.
    Backward: an ``mm`` for each weight's gradient and one for each input's, except the first
    layer's input, which needs no gradient."""
    fwd = 2 * tokens * 9 * h * h * layers
    return {"aten::addmm": fwd, "aten::mm": 2 * fwd - 2 * tokens * h * h}


@pytest.mark.record
@pytest.mark.parametrize(("strategy", "extra"), FAKE_CASES, ids=[s for s, _ in FAKE_CASES])
def test_fake_tensors_give_the_real_projections_exact_figures(tmp_path, strategy, extra):
    """The same configuration with and without --fake-tensors: equal collective calls and bytes
    per step, kind and mesh dimension, equal memory by category, and `analyzer grade` passes;
    the fake run's manifest says so and carries the compute estimate, whose matmul FLOPs are
    the hand count and whose times are the roofline of the given figures."""
    real = _project(tmp_path, "real", strategy, extra)
    fake = _project(tmp_path, "fake", strategy, [*extra, "--fake-tensors", "--device-tflops", "2",
                                                 "--device-mem-gbps", "50"])
    assert per_step_calls(fake / "rank0.trace.json.gz", [2, 3]) == per_step_calls(
        real / "rank0.trace.json.gz", [2, 3])
    assert categories(fake) == categories(real)
    want = hsdp_counts(2, 4) if strategy == "hsdp" else HAND[strategy](8)
    for cat in ("parameters", "gradients", "optimizer_state"):
        assert categories(fake)[cat] == want[cat], cat
    graded, _ = run_tracer([str(fake), str(real), "--format", "json"], cwd=tmp_path,
                           module=[sys.executable, "-m", "analyzer", "grade"])
    assert graded.returncode == 0, graded.stdout + graded.stderr
    exact = json.loads(graded.stdout)["exact"]
    assert {(f["kind"], f["status"]) for f in exact} >= {
        ("parameters", "equal"), ("gradients", "equal"), ("optimizer_state", "equal")}
    assert all(f["status"] == "equal" for f in exact), exact
    projection = json.loads((fake / "manifest.json").read_text())["projection"]
    estimate = projection.pop("compute_estimate")
    # live tensor bytes at the peak (tracer/livebytes.py): at least what the rank holds at once
    # after its backward (the categories' sum, which the report shows as a lower bound)
    live = projection.pop("live_peak_bytes")
    assert list(live) == ["0"] and live["0"] >= categories(fake)["peak"], live
    assert projection == {"world_size": 8, "roles_run": [0], "device": "cpu",
                          "fake_process_group": True, "fake_tensors": True,
                          "op_durations": "meta_kernels", "device_tflops": 2.0,
                          "device_mem_gbps": 50.0}
    ops = {r["op"]: r for r in estimate}
    rows = 8 // (2 if strategy == "hsdp" else 1) // (4 if strategy == "hsdp" else 8)  # batch rows a rank
    for op, flops in reference_matmul_flops(rows * 16, HIDDEN, LAYERS).items():
        assert ops[op]["flops_per_step"] == flops, (op, ops[op])
    # AdamW's last update, param.addcdiv_(exp_avg, denom): three tensors of the rank's shard
    # (its local views, not a DTensor's global shape; no padding at h 32 over 4 or 8)
    assert ops["aten::addcdiv_"]["bytes_per_step"] == 3 * want["parameters"], ops["aten::addcdiv_"]
    for r in estimate:
        assert r["estimated_ns_per_step"] == round(max(r["flops_per_step"] / 2e12,
                                                       r["bytes_per_step"] / 50e9) * 1e9), r
    assert not any(r["op"].startswith("c10d::") for r in estimate)  # collectives are not compute
    steps = pq.read_table(fake / "steps.parquet").to_pylist()  # nothing allocated: no allocator peaks
    assert {(r["profiler_allocated_peak_bytes"], r["cuda_max_allocated_bytes"]) for r in steps} == {(None, None)}


@pytest.mark.integration
def test_fake_tensors_refuse_ddp(tmp_path):
    proc, _ = run_tracer(["--strategy", "ddp", "--nproc", "8", "--fake-tensors", "--out",
                          str(tmp_path)], cwd=tmp_path,
                         module=[sys.executable, "-m", "tracer", "project"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "tracer: --strategy ddp --fake-tensors: DDP's reducer reads its gradient buckets' data, "
        "which fake tensors do not have; project it with real tensors (--real-tensors) at a "
        "size this device holds"]


def test_a_roofline_needs_both_device_figures_and_fake_tensors():
    from tracer.fakeproject import FakeOptions

    with pytest.raises(ValueError, match=r"^--device-tflops and --device-mem-gbps: give both"):
        FakeOptions(fake_tensors=True, device_tflops=100.0)
    with pytest.raises(ValueError, match=r"^--device-tflops 100: the compute estimate is for --fake-tensors"):
        FakeOptions(fake_tensors=False, device_tflops=100.0, device_mem_gbps=1000.0)
    with pytest.raises(ValueError, match=r"^--device-mem-gbps -1.0: must be a positive number"):
        FakeOptions(fake_tensors=True, device_tflops=1.0, device_mem_gbps=-1.0)
    FakeOptions(fake_tensors=None, device_tflops=1.0, device_mem_gbps=1.0)  # decided later


def test_fake_tensors_are_decided_by_the_models_state_per_rank(monkeypatch, caplog):
    """Undecided (--fake-tensors not given): fake exactly when the whole model's parameters
    (built whole before sharding) plus one rank's parameters + gradients + AdamW state exceed
    the free memory; one log line says so. Reference model h 32, 2 layers: 18,944 fp32
    parameters = 75,776 B; FSDP2 over 8: 9,472 B a rank, x 4 (parameters, gradients, exp_avg,
    exp_avg_sq) = 37,888 B; together 113,664 B."""
    import logging

    from tracer import fakeproject
    from tracer.config import RecordConfig

    cfg = RecordConfig(strategy="fsdp2", nproc=8, hidden=HIDDEN, layers=LAYERS, seq=16, batch=8,
                       optimizer="adamw")
    assert fakeproject.state_bytes(cfg) == (75_776, 37_888)
    undecided = fakeproject.FakeOptions(fake_tensors=None)
    monkeypatch.setattr(fakeproject, "free_bytes", lambda device_type: 113_664)
    assert fakeproject.decide_fake_tensors(cfg, "cpu", undecided) is False
    monkeypatch.setattr(fakeproject, "free_bytes", lambda device_type: 113_663)
    with caplog.at_level(logging.WARNING, logger="tracer.fakeproject"):
        assert fakeproject.decide_fake_tensors(cfg, "cpu", undecided) is True
    assert [r.getMessage() for r in caplog.records] == [
        "--fake-tensors on: the model's parameters (0.00 GiB, built whole before sharding) and "
        "one rank's parameters + gradients + optimizer state at fsdp2 over 8 ranks (0.00 GiB) "
        "exceed this machine's free memory (0.00 GiB); no real tensors, numerics not verified"]
    assert fakeproject.decide_fake_tensors(cfg, "cpu", fakeproject.FakeOptions(fake_tensors=False)) is False


def test_op_cost_counts_each_op_once_with_its_flops_and_bytes():
    """A [4, 8] x [8, 16] matmul on fake tensors: 2 x 4 x 8 x 16 FLOPs, (32 + 128 + 64) x 4
    bytes; a view counts no bytes; ops outside the profiled steps are not counted."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tracer.opcost import OpCost

    cost = OpCost(range(1, 2))
    with FakeTensorMode(), cost:
        a, b = torch.empty(4, 8), torch.empty(8, 16)
        cost.step = 0
        torch.mm(a, b)
        cost.step = 1
        torch.mm(a, b).view(64, 1)
    assert cost.ops == {"aten::mm": [1, 1024, 896], "aten::view": [1, 0, 0]}
    from tracer.fakeproject import FakeOptions

    rows = cost.rows(0, FakeOptions(fake_tensors=True, device_tflops=1e-3, device_mem_gbps=1.0))
    assert rows[0] == {"rank": 0, "op": "aten::mm", "calls_per_step": 1, "flops_per_step": 1024,
                       "bytes_per_step": 896, "estimated_ns_per_step": 1024}


def test_projection_inputs_hold_no_numerics_reference():
    """What a projection writes instead of the baseline: the batch, the initial parameters and
    a NaN loss per step; no gradients, updated parameters or activations to compare with
    (tracer/projinputs.py), so its cost does not grow with the global batch's compute."""
    import math as _math

    from tracer.config import RecordConfig
    from tracer.projinputs import projection_inputs

    cfg = RecordConfig(strategy="fsdp2", nproc=8, hidden=HIDDEN, layers=LAYERS, seq=16, batch=8)
    tensors, meta = projection_inputs(cfg, "cpu")
    assert sorted({k.split(".")[0] for k in tensors}) == ["batch", "init", "loss"]
    assert sum(1 for k in tensors if k.startswith("init.")) == len(SHAPES)
    assert tuple(tensors["batch.x"].shape) == (8, 16, HIDDEN)
    assert len(tensors["loss"]) == cfg.total_steps and all(_math.isnan(v) for v in tensors["loss"].tolist())
    assert json.loads(meta["activation_order"]) == []


def test_live_bytes_follow_allocation_free_and_resize():
    """tracer/livebytes.py on fake tensors: a storage counts from the op that returns it until it
    dies or is resized (FSDP2's free of an unsharded parameter: ``resize_(0)``); the peak is
    sampled in the profiled steps only."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tracer.livebytes import LiveBytes
    from tracer.opcost import OpCost

    cost = OpCost(range(1, 2))
    cost.live = LiveBytes("cpu", range(1, 2))
    with FakeTensorMode(), cost, cost.live.tracking_resize():
        cost.step = 0
        big = torch.empty(4096)  # 16 KiB, before the profiled step: live, not a peak
        assert (cost.live.live, cost.live.peak) == (16384, 0)
        cost.step = 1
        a, b = torch.empty(1024), torch.empty(1024)
        del a
        c = torch.empty(2048)
        assert (cost.live.live, cost.live.peak) == (16384 + 4096 + 8192, 16384 + 8192 + 4096)
        big.untyped_storage().resize_(0)
        d = torch.empty(8)
        assert cost.live.live == 4096 + 8192 + 32 and cost.live.peak == 28672
        del b, c, d
    assert cost.live.live == 0
