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
                                      "fake_process_group": True}
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
    assert manifest["projection"] == {"world_size": world, "roles_run": [0, 1], "device": "cpu",
                                      "fake_process_group": True}
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


def test_fake_group_enqueue_op_is_the_collective(tmp_path):
    """On the fake process group no transfer op runs (no gloo:* op, no kernel): the c10d op
    call is the collective (classify.py cpu.fake_collective), once -- a functional collective
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
    assert got == [("all_reduce", 64, "0", -1, "cpu.fake_collective", 52_000),
                   ("send_recv", 2048, "0", 1, "cpu.fake_collective", 11_000),
                   ("send_recv", 2048, "0", 1, "cpu.fake_collective", 31_000)]
