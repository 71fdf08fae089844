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
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.tracer.helpers import REPO, run_tracer

HIDDEN, LAYERS, FP32 = 32, 2, 4


def assert_projection_section(got: dict, world: int, roles: list[int]) -> None:
    """``got`` is ``projection_section``, with each role's co-runners' profiled step wall
    times (2 profiled steps of each of co - 1 twins; none with one runner)."""
    got = dict(got)
    twins = got.pop("co_runner_step_ns")
    assert got == projection_section(world, roles)
    co = got["co_runners"]
    assert sorted(twins) == (sorted(str(r) for r in roles) if co > 1 else [])
    assert all(len(v) == (co - 1) * 2 and min(v) > 0 for v in twins.values()), twins


def projection_section(world: int, roles: list[int]) -> dict:
    """The manifest's ``projection`` of a CPU projection at ``world`` on its defaults: the
    target's ranks per node the whole world, each role measured beside as many copies as this
    machine's CPUs allow (tracer/project.py ``co_runners``)."""
    return {"world_size": world, "roles_run": roles, "device": "cpu", "fake_process_group": True,
            "ranks_per_node": world, "co_runners": min(world, len(os.sched_getaffinity(0))),
            **REAL_TENSORS}


REAL_TENSORS = {"fake_tensors": False, "op_durations": "measured", "device_tflops": None,
                "device_mem_gbps": None, "compute_estimate": [], "live_peak_bytes": {}}
"""A projection's fake-tensor fields with real tensors (analyzer/contract/schemas.py ``Projection``)."""
WORLDS = (2, 4, 8, 64)
STEPS = ["--wait", "1", "--warmup", "1", "--active", "2"]
"""Profiled steps 2 and 3: the steady state (DDP rebuilds its buckets in its second iteration,
broadcasting the bucket indices from C++: a one-time call whose dtype the fake group's trace
does not hold, tracer/project.py)."""


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
    assert_projection_section(manifest["projection"], world, [0])
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


@pytest.mark.integration
@pytest.mark.parametrize(("args", "line"), [
    (["--nproc", "1", "--batch", "8"],
     "tracer: --nproc 1: a projection is of a world of 2 ranks or more; pass the world size to "
     "project"),
    (["--nproc", "2", "--fault", "wrong-grad-scale"],
     "tracer: --fault wrong-grad-scale: a fault canary plants a numerics error, and a projection "
     "computes no numerics to catch it; drop --fault")], ids=["world-1", "fault"])
def test_projection_refuses_a_world_of_one_and_a_fault_canary(tmp_path, args, line):
    proc, _ = run_tracer(["--strategy", "fsdp2", *args, "--out", str(tmp_path)], cwd=tmp_path,
                         module=[sys.executable, "-m", "tracer", "project"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [line]
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


# --- pp: one role per stage (tracer/project.py ``roles``), static stage shapes -----------------

PP_STAGES = 2
"""--pp 2 over the two layers: stage s owns layer s (tracer/pipeline.py ``stage_layers``)."""


def pp_counts(w: int, stage: int, batch: int, microbatches: int = 2 * PP_STAGES) -> dict:
    """Rank ``stage`` (dp index 0) of pp over ``w`` ranks, P = 2: memory bytes and per-step
    (calls, bytes) per (kind, pg_desc).

    - its one layer FSDP2-sharded over dp = w / P (``fsdp2_counts``' rule for one layer; dp 1:
      no FSDP, the whole layer); per step one all_gather (``reshard_after_forward=False`` under
      PP: the layer stays unsharded over the M microbatches) and one reduce_scatter of the
      padded layer x dp, on the dp group (``mesh_dp``);
    - Schedule1F1B, M microbatches of B / (dp M) rows: stage 0 sends M activations and receives
      M gradients, stage 1 the reverse, each [rows, seq 16, h] fp32, on the pp group
      (``mesh_pp``; the default group itself at dp 1, where the pp dimension is the world)."""
    dp = w // PP_STAGES
    per_layer = [s for _, s in layer_shapes(HIDDEN)]
    padded = sum(math.ceil(s[0] / dp) * math.prod(s[1:]) for s in per_layer)
    local = sum(min(s[0], math.ceil(s[0] / dp)) * math.prod(s[1:]) for s in per_layer)
    microbatch_bytes = batch // dp // microbatches * 16 * HIDDEN * FP32
    pp_desc = "default_pg" if dp == 1 else "mesh_pp"
    calls = {("send_recv", pp_desc): (2 * microbatches, 2 * microbatches * microbatch_bytes)}
    if dp > 1:
        calls |= {("all_gather", "mesh_dp"): (1, padded * dp * FP32),
                  ("reduce_scatter", "mesh_dp"): (1, padded * dp * FP32)}
    return {"parameters": padded * FP32, "gradients": padded * FP32,
            "optimizer_state": 2 * local * FP32 + len(per_layer) * FP32, "calls": calls}


def test_pp_hand_counts_at_dp_1_are_the_whole_layer():
    """The fast half: at dp 1 a stage holds its layer whole (9h^2 + 8h elements); at dp 32 the
    layer's padded shard (rows ceil(d0 / 32): 1 + 1 + 4 + 4 + 1 + 1 + 1 + 1 rows)."""
    one_layer = 9 * HIDDEN * HIDDEN + 8 * HIDDEN
    assert pp_counts(2, 0, 8)["parameters"] == one_layer * FP32 == N_PARAMS * FP32 // LAYERS
    assert pp_counts(64, 1, 128)["parameters"] == (HIDDEN + 1 + 4 * HIDDEN + 4 + HIDDEN * 4
                                                   + 1 + 1 + 1) * FP32
    assert pp_counts(4, 0, 8)["calls"][("send_recv", "mesh_pp")] == (8, 8 * 16 * HIDDEN * FP32)


PP_CASES = [(2, 8), (4, 8), (8, 16), (64, 128)]
"""(N, --batch): one microbatch row per pipeline at N > 2 (B / (dp M) with M = 4)."""


@pytest.mark.record
@pytest.mark.parametrize(("world", "batch"), PP_CASES, ids=[f"pp-{w}" for w, _ in PP_CASES])
def test_pp_projection_at_n_equals_the_hand_counts(tmp_path, world, batch):
    proc, _ = run_tracer(["--strategy", "pp", "--nproc", str(world), "--hidden", str(HIDDEN),
                          "--layers", str(LAYERS), "--seq", "16", "--batch", str(batch),
                          "--optimizer", "adamw", *STEPS, "--out", str(tmp_path), "--name", "p"],
                         cwd=tmp_path, module=[sys.executable, "-m", "tracer", "project"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "p"
    manifest = json.loads((run / "manifest.json").read_text())
    assert_projection_section(manifest["projection"], world, [0, 1])
    assert manifest["mesh"]["shape"] == [world // PP_STAGES, PP_STAGES]
    assert sorted(p.name for p in run.glob("rank*.trace.json.gz")) == [
        "rank0.trace.json.gz", "rank1.trace.json.gz"]
    rows = pq.read_table(run / "memory_categories.parquet").to_pylist()
    for stage in range(PP_STAGES):
        want = pp_counts(world, stage, batch)
        got = {r["category"]: r["bytes"] for r in rows if r["rank"] == stage}
        for cat in ("parameters", "gradients", "optimizer_state"):
            assert got[cat] == want[cat], (stage, cat, got[cat], want[cat])
        calls = per_step_calls(run / f"rank{stage}.trace.json.gz", [2, 3])
        for step, kinds in calls.items():
            assert kinds == want["calls"], (stage, step, kinds)


@pytest.mark.record
def test_pp_projection_grades_equal_to_the_gloo_record(tmp_path):
    """dp 2 x pp 2 at world 4: the projection's two stage ranks against a real 4-rank gloo
    record of the same options: every exact figure equal, ``analyzer grade`` exits 0."""
    opts = ["--strategy", "pp", "--nproc", "4", "--hidden", str(HIDDEN), "--layers", str(LAYERS),
            "--seq", "16", "--batch", "8", "--optimizer", "adamw", *STEPS, "--out", str(tmp_path)]
    proj, _ = run_tracer([*opts, "--name", "proj"], cwd=tmp_path,
                         module=[sys.executable, "-m", "tracer", "project"])
    assert proj.returncode == 0, proj.stderr[-3000:]
    real, _ = run_tracer([*opts, "--name", "real"], cwd=tmp_path)
    assert real.returncode == 0, real.stderr[-3000:]
    grade, _ = run_tracer([str(tmp_path / "proj"), str(tmp_path / "real")], cwd=tmp_path,
                          module=[sys.executable, "-m", "analyzer", "grade"])
    assert grade.returncode == 0, grade.stdout[-3000:] + grade.stderr[-3000:]
    assert grade.stdout.strip().splitlines()[-1] == (
        "grade: passed -- 18 exact figures equal on ranks 0, 1")


@pytest.mark.record
def test_pp_projection_of_a_zero_bubble_v_schedule_grades_equal_to_the_gloo_record(tmp_path):
    """zbv, 2 stages per rank over dp 2 x pp 2 (FSDP2 on each stage): the projection's stage
    ranks against a real 4-rank gloo record of the same options, every exact figure equal."""
    opts = ["--strategy", "pp", "--nproc", "4", "--hidden", str(HIDDEN), "--layers", "4",
            "--pp-schedule", "zbv", "--seq", "16", "--batch", "8", "--optimizer", "adamw", *STEPS,
            "--out", str(tmp_path)]
    proj, _ = run_tracer([*opts, "--name", "proj"], cwd=tmp_path,
                         module=[sys.executable, "-m", "tracer", "project"])
    assert proj.returncode == 0, proj.stderr[-3000:]
    manifest = json.loads((tmp_path / "proj" / "manifest.json").read_text())
    assert manifest["mesh"]["pp_stage_ids"] == [[0, 3], [1, 2]]
    real, _ = run_tracer([*opts, "--name", "real"], cwd=tmp_path)
    assert real.returncode == 0, real.stderr[-3000:]
    grade, _ = run_tracer([str(tmp_path / "proj"), str(tmp_path / "real")], cwd=tmp_path,
                          module=[sys.executable, "-m", "analyzer", "grade"])
    assert grade.returncode == 0, grade.stdout[-3000:] + grade.stderr[-3000:]
    assert grade.stdout.strip().splitlines()[-1].startswith("grade: passed")


def test_fake_group_enqueue_op_is_the_collective(tmp_path):
    """On the fake process group no transfer op runs (no gloo:* op, no kernel): the c10d op
    call is the collective (classify.py cpu.fake_pg_call), once -- a functional collective
    enclosing a c10d call is not counted again, the inner call is the row -- with the tag's
    bytes, group and peer."""
    from analyzer.api import load_tables

    def op(name, ts, dur, cat="cpu_op"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    events = [op("ProfilerStep#2", 0, 100, "user_annotation"),
              op("paritytrace::pg 0 tensor float32 512 peer 1", 10, 10, "user_annotation"),
              op("c10d::send", 11, 8),
              op("paritytrace::pg 0 tensor float32 512 peer 1", 30, 10, "user_annotation"),
              op("c10d::recv_", 31, 8),
              op("paritytrace::pg 0 tensor float32 16", 50, 20, "user_annotation"),
              op("_c10d_functional::all_reduce", 51, 18), op("c10d::allreduce_", 52, 16)]
    trace = tmp_path / "rank0.trace.json"
    trace.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, "distributedInfo": {
        "backend": "fake", "rank": 0, "world_size": 2}}))
    coll = load_tables(trace).collectives
    got = sorted(zip(coll["kind"].astype(str), coll["bytes"], coll["pg"].astype(str),
                     coll["peer"], coll["rule"].astype(str), coll["start_ns"]))
    assert got == [("all_reduce", 64, "0", -1, "cpu.fake_pg_call", 52_000),
                   ("send_recv", 2048, "0", 1, "cpu.fake_pg_call", 11_000),
                   ("send_recv", 2048, "0", 1, "cpu.fake_pg_call", 31_000)]


# --- fsdp2_tp: tensor parallel at N (issue 44, Deliver 1) -------------------------------------
#
# Hand rules (torch 2.13), the reference model's plan (tracer/model.py ``tp_plan``) over T = 2
# tp ranks, FSDP2 over the dp = N / T ranks of each tp coordinate:
# - TP-local shapes: attn (ColwiseParallel) and mlp.0 (ColwiseParallel) split their out
#   features (weight and bias dim 0) by T, mlp.2 (RowwiseParallel) its weight's in features
#   (dim 1), its bias and the norm stay whole; FSDP2 then shards each TP-local tensor on dim 0
#   over dp as ``fsdp2_counts`` does (chunks of ceil(d0 / dp) rows, padded).
# - dp (``mesh_dp``) per step and layer: all_gather forward and backward, one reduce_scatter,
#   each of the layer's padded TP-local shard x dp.
# - tp (``mesh_tp``) per step, each collective of one activation [B / dp, seq, h] (nccl-tests
#   bytes: all_gather the gathered whole): per layer one all_gather of attn's output
#   (``output_layouts=Replicate()``), one all_reduce of mlp.2's partial sums forward, one of
#   mlp.0's input gradient backward, and one of attn's input gradient on every layer but the
#   first (the batch needs no gradient): 3L - 1 all_reduces.
# - Roles: tp ranks 0..T-1 of dp index 0 (tracer/project.py ``roles``); with an even split
#   they hold and send the same.

TP = 2
SEQ = 16


def tp_local_shapes(h: int, tp: int) -> list[tuple[int, ...]]:
    """One layer's parameters as tp rank 0 holds them (even split: every tp rank)."""
    return [(h // tp, h), (h // tp,), (4 * h // tp, h), (4 * h // tp,), (h, 4 * h // tp), (h,),
            (h,), (h,)]


def fsdp2_tp_counts(world: int, batch: int) -> dict:
    """Rank 0 (and 1) of fsdp2_tp over ``world`` ranks, T = 2: memory bytes and per-step
    (calls, bytes) per (kind, pg_desc)."""
    dp = world // TP
    per_layer = tp_local_shapes(HIDDEN, TP)
    padded = sum(math.ceil(s[0] / dp) * math.prod(s[1:]) for s in per_layer)
    local = sum(min(s[0], math.ceil(s[0] / dp)) * math.prod(s[1:]) for s in per_layer)
    unit_bytes = padded * dp * FP32
    activation = batch // dp * SEQ * HIDDEN * FP32
    return {"parameters": LAYERS * padded * FP32, "gradients": LAYERS * padded * FP32,
            "optimizer_state": LAYERS * (2 * local * FP32 + len(per_layer) * FP32),
            "calls": {("all_gather", "mesh_dp"): (2 * LAYERS, 2 * LAYERS * unit_bytes),
                      ("reduce_scatter", "mesh_dp"): (LAYERS, LAYERS * unit_bytes),
                      ("all_gather", "mesh_tp"): (LAYERS, LAYERS * activation),
                      ("all_reduce", "mesh_tp"): (3 * LAYERS - 1, (3 * LAYERS - 1) * activation)}}


TP_WORLDS = (4, 8, 64)
"""Meshes 2 x 2, 4 x 2 and 32 x 2 (dp x tp)."""


def test_fsdp2_tp_hand_counts_agree_with_the_sharding_arithmetic():
    """The fast half: the hand count's parameters are the analyzer's padded TP arithmetic
    (analyzer/analyses/sharding.py ``tp_local_shape`` then ``_padded`` over dp) at every N, and
    at 2 x 2 the figures a real gloo record of this configuration measured (19,136 B a rank,
    4 dp all_gathers of 76,544 B, 5 tp all_reduces of 20,480 B per step)."""
    from analyzer.analyses import sharding

    plan = {f"layers.{i}.{m}": s for i in range(LAYERS)
            for m, s in (("attn", "colwise"), ("mlp.0", "colwise"), ("mlp.2", "rowwise"))}
    for world in (*TP_WORLDS, 16, 1024):
        local = [sharding.tp_local_shape(f, s, plan, 0, TP)
                 for f, s in sharding.reference_shapes(HIDDEN, LAYERS)]
        assert fsdp2_tp_counts(world, world)["parameters"] == \
            sharding._padded(local, world // TP) * FP32, world
    four = fsdp2_tp_counts(4, 4)
    assert (four["parameters"], four["optimizer_state"]) == (19_136, 38_336)
    assert four["calls"] == {("all_gather", "mesh_dp"): (4, 76_544),
                             ("reduce_scatter", "mesh_dp"): (2, 38_272),
                             ("all_gather", "mesh_tp"): (2, 8_192),
                             ("all_reduce", "mesh_tp"): (5, 20_480)}


def collective_calls(run: Path, ranks: list[int], profiled: list[int]
                     ) -> dict[int, dict[int, dict[tuple[str, str], tuple[int, int]]]]:
    """{rank: {step: {(kind, pg_desc): (calls, bytes)}}} of the collectives the analyzer
    counts (``load_tables``' collectives table, what report and grade read) in ``profiled``
    steps; every one with known bytes and dtype Float."""
    from analyzer.api import load_tables

    coll = load_tables(run).collectives
    out: dict[int, dict[int, dict]] = {r: {s: {} for s in profiled} for r in ranks}
    for (rank, step, kind, desc), g in coll.groupby(
            [coll["rank"], coll["step"], coll["kind"].astype(str), coll["pg_desc"].astype(str)]):
        if int(step) in profiled:
            assert (g["bytes"] > 0).all() and set(g["dtype"]) == {"Float"}, (rank, step, kind)
            out[int(rank)][int(step)][(kind, desc)] = (len(g), int(g["bytes"].sum()))
    return out


def rank_categories(run_dir: Path) -> dict[int, dict[str, int]]:
    rows = pq.read_table(run_dir / "memory_categories.parquet").to_pylist()
    out: dict[int, dict[str, int]] = {}
    for r in rows:
        out.setdefault(r["rank"], {})[r["category"]] = r["bytes"]
    return out


def _project_tp(tmp_path: Path, world: int, *extra: str, name: str = "p"):
    return run_tracer(["--strategy", "fsdp2_tp", "--nproc", str(world), *extra, *STEPS,
                       "--optimizer", "adamw", "--out", str(tmp_path), "--name", name],
                      cwd=tmp_path, module=[sys.executable, "-m", "tracer", "project"])[0]


@pytest.mark.record
@pytest.mark.parametrize("world", TP_WORLDS, ids=[f"fsdp2_tp-{w // TP}x{TP}" for w in TP_WORLDS])
def test_fsdp2_tp_projection_at_n_equals_the_hand_counts(tmp_path, world):
    proc = _project_tp(tmp_path, world, "--hidden", str(HIDDEN), "--layers", str(LAYERS),
                       "--seq", str(SEQ), "--batch", str(world))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "p"
    manifest = json.loads((run / "manifest.json").read_text())
    assert_projection_section(manifest["projection"], world, [0, 1])
    assert manifest["mesh"]["shape"] == [world // TP, TP]
    assert sorted(p.name for p in run.glob("rank*.trace.json.gz")) == [
        "rank0.trace.json.gz", "rank1.trace.json.gz"]
    want = fsdp2_tp_counts(world, world)
    got = rank_categories(run)
    assert sorted(got) == [0, 1]
    for rank in (0, 1):
        for cat in ("parameters", "gradients", "optimizer_state"):
            assert got[rank][cat] == want[cat], (rank, cat, got[rank][cat], want[cat])
    from analyzer.analyses import sharding
    from analyzer.contract.schemas import Manifest
    import msgspec

    m = msgspec.json.decode((run / "manifest.json").read_bytes(), type=Manifest)
    assert sharding.predict(m)["ranks"][0]["padded_elements"] * FP32 == want["parameters"]
    for rank, steps in collective_calls(run, [0, 1], [2, 3]).items():
        for step, kinds in steps.items():
            assert kinds == want["calls"], (rank, step, kinds)


@pytest.mark.record
def test_fsdp2_tp_projection_grades_equal_against_the_real_record(tmp_path):
    """World 4, mesh 2 x 2: the projection (ranks 0 and 1 from one process) and a real gloo
    record of the same options; ``analyzer grade`` finds every exact figure equal and exits 0."""
    opts = ["--hidden", str(HIDDEN), "--layers", str(LAYERS), "--seq", str(SEQ), "--batch", "4"]
    proc = _project_tp(tmp_path, 4, *opts)
    assert proc.returncode == 0, proc.stderr[-3000:]
    real, _ = run_tracer(["--strategy", "fsdp2_tp", "--nproc", "4", *opts, *STEPS, "--optimizer",
                          "adamw", "--out", str(tmp_path), "--name", "real"], cwd=tmp_path)
    assert real.returncode == 0, real.stderr[-3000:]
    graded, _ = run_tracer([str(tmp_path / "p"), str(tmp_path / "real")], cwd=tmp_path,
                           module=[sys.executable, "-m", "analyzer", "grade"])
    assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
    assert graded.stdout.strip().splitlines()[-1] == \
        "grade: passed -- 22 exact figures equal on ranks 0, 1"


UNEVEN = f"{REPO / 'tests' / 'tracer' / 'specs' / 'tp_uneven.py'}:build"
"""Linear(8, 10) ColwiseParallel(output_layouts=Replicate()), then Linear(10, 8) replicated;
each Linear an FSDP2 unit."""


def uneven_counts(t: int) -> dict:
    """tp rank ``t`` (dp index 0) of the uneven model at --tp 3 --nproc 6 --batch 6 (dp 2):
    the first Linear's 10 rows in torch.chunk pieces 4, 4, 2 over tp, each then over dp 2
    (ceil(rows / 2)); the second Linear whole, 8 rows over dp (4 each). tp: one all_gather per
    step of the first Linear's output, 3 rows of ceil(10 / 3) = 4 padded features from each
    of 3 ranks (DTensor pads an uneven shard to the largest before gathering,
    torch/distributed/tensor/placement_types.py ``Shard._to_replicate_tensor``)."""
    rows = (4, 4, 2)[t]
    first = math.ceil(rows / 2) * 8 + math.ceil(rows / 2)
    second = 4 * 10 + 4
    unit = [(first) * 2 * FP32, second * 2 * FP32]
    local = first + second  # dp rank 0 holds full chunks: unpadded = padded
    return {"parameters": local * FP32, "gradients": local * FP32,
            "optimizer_state": 2 * local * FP32 + 4 * FP32,
            "calls": {("all_gather", "mesh_dp"): (4, 2 * sum(unit)),
                      ("reduce_scatter", "mesh_dp"): (2, sum(unit)),
                      ("all_gather", "mesh_tp"): (1, 3 * 4 * 3 * FP32)}}


@pytest.mark.record
def test_uneven_tp_split_runs_every_tp_rank_and_grades_equal(tmp_path):
    """--tp 3 over 10 features: tp ranks hold 4, 4 and 2 rows, so the projection runs all
    three (roles 0, 1, 2; tracer/project.py ``roles``), rank 2 smaller, each equal to the hand
    count and to a real gloo record of the same options."""
    opts = ["--tp", "3", "--batch", "6", "--model", UNEVEN]
    proc = _project_tp(tmp_path, 6, *opts)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "p"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["projection"]["roles_run"] == [0, 1, 2]
    got = rank_categories(run)
    calls = collective_calls(run, [0, 1, 2], [2, 3])
    for t in (0, 1, 2):
        want = uneven_counts(t)
        assert {c: got[t][c] for c in ("parameters", "gradients", "optimizer_state")} == \
            {c: want[c] for c in ("parameters", "gradients", "optimizer_state")}, t
        for step, kinds in calls[t].items():
            assert kinds == want["calls"], (t, step, kinds)
    assert uneven_counts(2)["parameters"] < uneven_counts(0)["parameters"]
    real, _ = run_tracer(["--strategy", "fsdp2_tp", "--nproc", "6", *opts, *STEPS, "--optimizer",
                          "adamw", "--out", str(tmp_path), "--name", "real"], cwd=tmp_path)
    assert real.returncode == 0, real.stderr[-3000:]
    graded, _ = run_tracer([str(run), str(tmp_path / "real")], cwd=tmp_path,
                           module=[sys.executable, "-m", "analyzer", "grade"])
    assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
    assert graded.stdout.strip().splitlines()[-1] == \
        "grade: passed -- 27 exact figures equal on ranks 0-2"


def _fake_tp_trace(path: Path, backend: str = "fake") -> Path:
    """One profiled step of a fsdp2_tp rank on the fake group as torch 2.13 records it (times
    in µs): an FSDP2 all_gather through torch.distributed (its tag, then ``c10d::
    _allgather_base_`` with its own shapes), then two funcol calls, each tagged with the
    call's first tensor (tracer/pgtag.py) around ``_c10d_functional::<op>`` > the ``c10d::*``
    op it runs (a tensor list: no dtype), ``_wrap_tensor_autograd`` and ``wait_tensor``."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1,
           "ts": 0, "dur": 1000, "args": {}}]

    def op(name, ts, end, cat="cpu_op", **args):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts,
                   "dur": end - ts, "args": args})

    op("paritytrace::pg 1 tensor float32 4784", 10, 60, cat="user_annotation")
    op("c10d::_allgather_base_", 20, 50, **{"Input Dims": [[4784], [2392]],
                                           "Input type": ["float", "float"]})
    for t0, funcol, c10d, dims in ((100, "all_gather_into_tensor",
                                    "allgather_into_tensor_coalesced_", [2, 16, 16]),
                                   (300, "all_reduce", "allreduce_", [2, 16, 32])):
        op(f"paritytrace::pg 3 tensor float32 {math.prod(dims)}", t0, t0 + 100,
           cat="user_annotation")
        op(f"_c10d_functional::{funcol}", t0 + 10, t0 + 50, **{"Input Dims": [dims, []],
                                                                "Input type": ["float", ""]})
        op(f"c10d::{c10d}", t0 + 20, t0 + 40, **{"Input Dims": [[dims]],
                                                 "Input type": ["TensorList"]})
        op("_c10d_functional::_wrap_tensor_autograd", t0 + 55, t0 + 60)
        op("_c10d_functional::wait_tensor", t0 + 70, t0 + 80)
    doc = {"schemaVersion": 1, "traceEvents": ev, "distributedInfo": {
        "backend": backend, "rank": 0, "world_size": 4, "pg_config": [
            {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
            {"pg_name": "1", "pg_desc": "mesh_dp", "pg_size": 2, "ranks": [0, 2]},
            {"pg_name": "3", "pg_desc": "mesh_tp", "pg_size": 2, "ranks": [0, 1]}]}}
    path.write_text(json.dumps(doc))
    return path


def test_fake_group_counts_each_call_once_with_its_bytes(tmp_path):
    """On the fake group each call is its ``c10d::*`` op (analyzer/ingest/classify.py rule
    cpu.fake_pg_call), once, not its ``_c10d_functional::*`` op too; a funcol call's bytes
    come from its tag's tensor (the input: all_gather's piece x 2 ranks, all_reduce's buffer),
    as a gloo record's transfer gives them."""
    from analyzer.api import load_events, load_tables

    trace = _fake_tp_trace(tmp_path / "rank0.trace.json")
    coll = load_tables(trace).collectives
    got = [(r.kind, r.pg_desc, r.name, r.bytes, r.dtype, r.group_size, r.rule)
           for r in coll.itertuples()]
    assert got == [
        ("all_gather", "mesh_dp", "c10d::_allgather_base_", 19_136, "Float", 2, "cpu.fake_pg_call"),
        ("all_gather", "mesh_tp", "c10d::allgather_into_tensor_coalesced_", 4_096, "Float", 2,
         "cpu.fake_pg_call"),
        ("all_reduce", "mesh_tp", "c10d::allreduce_", 4_096, "Float", 2, "cpu.fake_pg_call")]
    events, _ = load_events(trace)
    funcol = events[events["name"].astype(str).str.startswith("_c10d_functional::")]
    assert set(funcol["role"].astype(str)) == {"comm_enqueue"}


def test_a_real_backend_keeps_its_c10d_ops_as_enqueues(tmp_path):
    """The same events on gloo: no transfer op in the trace, so no collective (a record's
    are its ``gloo:*`` ops): the rule reads the backend, never the events alone."""
    from analyzer.api import load_tables

    trace = _fake_tp_trace(tmp_path / "rank0.trace.json", backend="gloo")
    assert load_tables(trace).collectives.empty


def test_funcol_tag_carries_its_input_on_the_fake_group():
    """tracer/pgtag.py on the fake group: a funcol call's tag names its group and its first
    tensor, the input (all_reduce's buffer, all_gather's piece), as a torch.distributed call's
    does; without it the ``c10d::*`` op it runs (a tensor list) has no bytes in the trace."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from tracer.pgtag import tag_collectives

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with tag_collectives():
                funcol.all_reduce(torch.ones(2, 3), "sum", dist.group.WORLD).wait()
                funcol.all_gather_single(torch.ones(5), 0, dist.group.WORLD).wait()
                dist.all_reduce(torch.ones(7))
        tags = [e.name for e in prof.events() if e.name.startswith("paritytrace::pg")]
    finally:
        dist.destroy_process_group()
    assert tags == ["paritytrace::pg 0 tensor float32 6", "paritytrace::pg 0 tensor float32 5",
                    "paritytrace::pg 0 tensor float32 7"]


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
                          "fake_process_group": True, "ranks_per_node": 8, "co_runners": 1,
                          "co_runner_step_ns": {}, "fake_tensors": True,
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
