"""`tracer record --strategy all` end to end: complete run dirs, traces, numerics, steps, manifest."""

from __future__ import annotations

import gzip
import hashlib
import json

import pandas as pd
import pyarrow.parquet as pq
import pytest

from analyzer.contract import schemas
from analyzer.contract.tolerance import TOLERANCES
from tests.tracer.helpers import tensor_rel_l2

pytestmark = pytest.mark.record
DISTRIBUTED = ("ddp", "fsdp", "fsdp2")
HIDDEN, BATCH, SEQ = 32, 4, 8  # helpers.TINY
# Parameters of the tiny model, by hand: per layer attn 32*32+32, mlp 32*128+128 + 128*32+32,
# norm 2*32 = 9472; two layers.
TINY_NUM_PARAMS = 2 * (32 * 32 + 32 + 32 * 128 + 128 + 128 * 32 + 32 + 2 * 32)


def _run_dir(fp32_all, strategy):
    return fp32_all[0] / strategy


def _trace(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


def test_prints_where_run_dirs_went(fp32_all):
    out, printed = fp32_all
    for s in schemas.FLAT_STRATEGIES:
        assert f"recorded {out / s}" in printed


@pytest.mark.parametrize("strategy", schemas.FLAT_STRATEGIES)
def test_run_dir_is_complete(fp32_all, strategy):
    run_dir = _run_dir(fp32_all, strategy)
    manifest = schemas.read_manifest(run_dir / schemas.MANIFEST_NAME)
    world = 1 if strategy == "single" else 2
    assert manifest.strategy == strategy and manifest.world_size == world
    assert manifest.launch.method == ("single" if strategy == "single" else "spawn")
    assert manifest.batch == schemas.Batch(global_batch=BATCH, seq_len=SEQ, per_rank_batch=BATCH // world,
                                           hidden=HIDDEN)
    assert manifest.model.num_params == TINY_NUM_PARAMS
    assert manifest.backend == "gloo" and manifest.device.type == "cpu"
    assert manifest.fault is None and manifest.precision == "fp32"
    assert manifest.tolerance.rtol == TOLERANCES["fp32"].rtol
    for rank in range(world):
        trace = _trace(run_dir / schemas.trace_name(rank))
        info = trace["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, world, "gloo")
        names = [e.get("name", "") for e in trace["traceEvents"]]
        steps = sorted(n for n in names if n.startswith("ProfilerStep#"))
        # schedule wait 1, warmup 1, active 3: steps 2..4 are recorded, step 0 never is
        assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
        for label in ("forward", "backward", "optimizer"):
            assert names.count(label) == 3, label
    assert pq.read_schema(run_dir / schemas.NUMERICS_NAME).equals(schemas.NUMERICS_SCHEMA)
    assert pq.read_schema(run_dir / schemas.STEPS_NAME).equals(schemas.STEPS_SCHEMA)
    assert not (run_dir / schemas.MEMORY_DIR).exists()  # CPU: no allocator snapshots


@pytest.mark.parametrize("strategy", schemas.FLAT_STRATEGIES)
def test_manifest_files_match_size_and_sha256(fp32_all, strategy):
    run_dir = _run_dir(fp32_all, strategy)
    manifest = json.loads((run_dir / schemas.MANIFEST_NAME).read_text())
    on_disk = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")
                     if p.is_file() and p.name != schemas.MANIFEST_NAME)
    assert sorted(f["path"] for f in manifest["files"]) == on_disk
    for f in manifest["files"]:
        data = (run_dir / f["path"]).read_bytes()
        assert f["size_bytes"] == len(data)
        assert f["sha256"] == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("strategy", DISTRIBUTED)
def test_fp32_first_step_matches_baseline(fp32_all, strategy):
    numerics = pd.read_parquet(_run_dir(fp32_all, strategy) / schemas.NUMERICS_NAME)
    for kind in ("grad", "param", "activation"):
        rel = tensor_rel_l2(numerics, kind)
        assert rel, kind
        assert max(rel.values()) < 1e-5, (kind, max(rel, key=rel.get))
    grads = tensor_rel_l2(numerics, "grad")
    assert set(grads) == {f"layers.{i}.{p}" for i in range(2) for p in (
        "attn.weight", "attn.bias", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias",
        "norm.weight", "norm.bias")}


@pytest.mark.parametrize("strategy", DISTRIBUTED)
def test_compared_elements_cover_every_parameter_once(fp32_all, strategy):
    """Sharded (fsdp2): the ranks' numel partition the model; replicated: each rank has all."""
    numerics = pd.read_parquet(_run_dir(fp32_all, strategy) / schemas.NUMERICS_NAME)
    grads = numerics[(numerics["kind"] == "grad") & (numerics["metric"] == "numel")]
    per_rank = grads.groupby("rank", observed=True)["value"].sum()
    if strategy == "fsdp2":
        assert per_rank.sum() == TINY_NUM_PARAMS
    else:
        assert (per_rank == TINY_NUM_PARAMS).all()


@pytest.mark.parametrize("strategy", schemas.FLAT_STRATEGIES)
def test_loss_every_step_matches_baseline(fp32_all, strategy):
    numerics = pd.read_parquet(_run_dir(fp32_all, strategy) / schemas.NUMERICS_NAME)
    loss = numerics[numerics["kind"] == "loss"].pivot_table(
        index=["step", "rank"], columns="metric", values="value", observed=True).reset_index()
    assert sorted(loss["step"].unique()) == [0, 1, 2, 3, 4]
    # Equal slices: the global loss is the mean of the ranks' losses.
    per_step = loss.groupby("step").agg(value=("value", "mean"), ref=("ref_value", "first"))
    assert ((per_step["value"] - per_step["ref"]).abs() <= 1e-5 * per_step["ref"].abs()).all()
    if strategy == "single":
        assert set(numerics["kind"].unique()) == {"loss"}
        assert (loss["value"] == loss["ref_value"]).all()
    assert per_step["ref"].is_monotonic_decreasing  # SGD on a fixed batch


@pytest.mark.parametrize("strategy", schemas.FLAT_STRATEGIES)
def test_steps_table(fp32_all, strategy):
    steps = pd.read_parquet(_run_dir(fp32_all, strategy) / schemas.STEPS_NAME)
    world = 1 if strategy == "single" else 2
    assert len(steps) == world * 5
    for _, g in steps.groupby("rank"):
        g = g.sort_values("step")
        assert g["profiled"].tolist() == [False, False, True, True, True]
        assert (g["wall_ns"] > 0).all()
        assert g["peak_rss_bytes"].is_monotonic_increasing and (g["peak_rss_bytes"] > 0).all()
        prof_peak = g["profiler_allocated_peak_bytes"]
        assert prof_peak[g["profiled"]].notna().all() and prof_peak[~g["profiled"]].isna().all()
        # The tiny model's parameters (fp32) alone are allocated throughout the step.
        assert (prof_peak[g["profiled"]] >= 4 * TINY_NUM_PARAMS // world).all()
        # Same peaks read back from the written trace, computed here: max "Total Allocated" of the
        # CPU [memory] events inside each ProfilerStep#N span.
        events = _trace(_run_dir(fp32_all, strategy) / schemas.trace_name(int(g["rank"].iloc[0])))["traceEvents"]
        spans = {int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")}
        expected = {}
        for step, (t0, t1) in spans.items():
            inside = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"
                      and e["args"].get("Device Type") == 0 and t0 <= e["ts"] <= t1]
            expected[step] = max(inside)
        assert dict(zip(g.loc[g["profiled"], "step"], prof_peak[g["profiled"]])) == expected
        assert g["cuda_max_allocated_bytes"].isna().all()


@pytest.mark.parametrize("strategy", ("fsdp", "fsdp2"))
def test_fsdp_options_recorded(fp32_all, strategy):
    manifest = json.loads((_run_dir(fp32_all, strategy) / schemas.MANIFEST_NAME).read_text())
    opts = manifest["strategy_options"]
    assert opts["auto_wrap_min_num_params"] == 9 * HIDDEN * HIDDEN + 8 * HIDDEN
    assert opts["fsdp_units"] == ["layers.0", "layers.1"]
    assert opts["reshard_after_forward"] is True and opts["sharding_strategy"] == "full_shard"


def test_baseline_shared_by_all_runs(fp32_all):
    digests = {hashlib.sha256((fp32_all[0] / s / "baseline.safetensors").read_bytes()).hexdigest()
               for s in schemas.FLAT_STRATEGIES}
    assert len(digests) == 1
