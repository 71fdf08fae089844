"""hsdp (FSDP2 on a replicate x shard mesh) and fsdp2_tp (TP plan, then FSDP2 over dp) on 4 gloo
ranks: the process-group tags in the trace, the manifest's mesh, memory by local shard, parity
through the analyzer's gate, each canary caught with its first diverging tensor, bad shapes
refused in one line. Records are tiny and shared (module-scoped fixtures)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analyzer.analyses.parity import check_run
from analyzer.contract import schemas
from tests.tracer.helpers import REPO, run_tracer

pytestmark = pytest.mark.record

H = 16
SHAPES = ["--nproc", "4", "--hidden", str(H), "--seq", "4", "--batch", "4", "--layers", "2",
          "--warmup", "0", "--active", "1"]
BOTH = ["--strategy", "hsdp,fsdp2_tp", "--mesh", "2,2", "--tp", "2"]
LAYER_PARAMS = 9 * H * H + 8 * H
TP_SHARDED = H * H + H + 4 * H * H + 4 * H + 4 * H * H  # attn w+b, mlp.0 w+b, mlp.2 w (per layer)
EXPECTED_PG_DESC = {"hsdp": {"c10d::_allgather_base_": "mesh_shard",
                             "c10d::_reduce_scatter_base_": "mesh_shard",
                             "c10d::allreduce_": "mesh_replicate"},
                    "fsdp2_tp": {"c10d::_allgather_base_": "mesh_dp",
                                 "c10d::_reduce_scatter_base_": "mesh_dp",
                                 "c10d::allreduce_": "mesh_tp",
                                 "c10d::allgather_into_tensor_coalesced_": "mesh_tp"}}


def _record(tmp_path_factory, name: str, args: list[str]) -> Path:
    out = tmp_path_factory.mktemp(name)
    proc, _ = run_tracer(args + SHAPES + ["--out", str(out)], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    return _record(tmp_path_factory, "mesh2d", BOTH)


def _parity(run: Path):
    return check_run(run, schemas.read_manifest(run / schemas.MANIFEST_NAME))


def _events(trace: Path) -> tuple[dict, list[dict]]:
    with gzip.open(trace, "rt") as f:
        doc = json.load(f)
    return doc, [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def _enclosing_tags(events: list[dict]) -> list[tuple[dict, str | None]]:
    """(c10d op, the pg tag enclosing it on its thread or None), every ``c10d::`` cpu_op."""
    tags = [e for e in events if e["name"].startswith(schemas.PG_TAG_PREFIX)]
    out = []
    for op in (e for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("c10d::")):
        inside = [t for t in tags if t["tid"] == op["tid"] and t["ts"] <= op["ts"]
                  and op["ts"] + op["dur"] <= t["ts"] + t["dur"]]
        out.append((op, inside[-1]["name"][len(schemas.PG_TAG_PREFIX):] if inside else None))
    return out


@pytest.mark.parametrize("strategy", ["hsdp", "fsdp2_tp"])
def test_every_collective_carries_its_mesh_dimension(clean, strategy):
    for rank in range(4):
        doc, events = _events(clean / strategy / schemas.trace_name(rank))
        desc = {g["pg_name"]: g["pg_desc"] for g in doc["distributedInfo"]["pg_config"]}
        found = _enclosing_tags(events)
        assert len(found) >= 8  # per layer: 2 all_gathers (fwd, bwd) and a reduce_scatter at least
        for op, pg in found:
            assert pg is not None, f"rank {rank}: {op['name']} at {op['ts']} has no pg tag"
            assert desc.get(pg) == EXPECTED_PG_DESC[strategy][op["name"]], (rank, op["name"], pg)
        gloo = [e for e in events if e["name"].startswith("gloo:")]
        assert len(gloo) >= len(found)  # each enqueue has its gloo work (on the runloop threads)


def test_tp_collectives_per_step_follow_the_plan(clean):
    # per layer: attn fwd all_gather, mlp.2 fwd all_reduce, mlp.0 and attn bwd all_reduce of the
    # input gradient -- except layer 0's attn, whose input (the batch) needs no gradient
    _, events = _events(clean / "fsdp2_tp" / schemas.trace_name(0))
    kinds = [op["name"] for op, pg in _enclosing_tags(events)
             if EXPECTED_PG_DESC["fsdp2_tp"][op["name"]] == "mesh_tp"]
    assert kinds.count("c10d::allreduce_") == 3 * 2 - 1
    assert kinds.count("c10d::allgather_into_tensor_coalesced_") == 2


def test_manifest_mesh_and_options(clean):
    hsdp = schemas.read_manifest(clean / "hsdp" / schemas.MANIFEST_NAME)
    assert hsdp.mesh == schemas.Mesh(shape=[2, 2], dim_names=["replicate", "shard"])
    assert hsdp.strategy_options["fsdp_units"] == ["layers.0", "layers.1"]
    assert hsdp.batch.per_rank_batch == 1
    tp = schemas.read_manifest(clean / "fsdp2_tp" / schemas.MANIFEST_NAME)
    assert tp.mesh.shape == [2, 2] and tp.mesh.dim_names == ["dp", "tp"]
    assert tp.mesh.tp_plan == {f"layers.{i}.{m}": s for i in range(2)
                               for m, s in (("attn", "colwise"), ("mlp.0", "colwise"), ("mlp.2", "rowwise"))}
    assert tp.mesh.tp_sharded_params == 2 * TP_SHARDED
    assert tp.strategy_options["fsdp_units"] == ["layers.0", "layers.1"]
    assert tp.batch.per_rank_batch == 2  # batch 4 over dp 2: the tp ranks share their rows


def test_memory_counts_local_shards(clean):
    # hsdp: every parameter split in two over the shard dimension (dims divide evenly);
    # fsdp2_tp: the TP-sharded ones over tp x dp = 4, the rest (norm, mlp.2 bias) over dp = 2
    expected = {"hsdp": 2 * LAYER_PARAMS // 2 * 4,
                "fsdp2_tp": 2 * (TP_SHARDED // 4 + (LAYER_PARAMS - TP_SHARDED) // 2) * 4}
    for strategy, per_rank in expected.items():
        cats = pd.read_parquet(clean / strategy / schemas.MEMORY_CATEGORIES_NAME)
        for category in ("parameters", "gradients"):
            got = cats[cats["category"] == category].set_index("rank")["bytes"]
            assert got.to_dict() == {r: per_rank for r in range(4)}, (strategy, category)


@pytest.mark.parametrize("strategy", ["hsdp", "fsdp2_tp"])
def test_parity_passes_and_covers_every_activation(clean, strategy):
    parity = _parity(clean / strategy)
    assert parity.status == "pass", parity.reason
    numerics = pd.read_parquet(clean / strategy / schemas.NUMERICS_NAME)
    act = numerics[(numerics["kind"] == "activation") & (numerics["metric"] == "numel")]
    numel = act.groupby("tensor", observed=True)["value"].sum()
    # the ranks' rows partition each baseline output [4, 4, width] exactly once
    widths = {"mlp.0": 4 * H, "mlp.1": 4 * H}
    assert len(numel) == 2 * 7
    for tensor, n in numel.items():
        assert n == 4 * 4 * widths.get(tensor.split(".", 2)[-1], H), tensor
    grads = numerics[(numerics["kind"] == "grad") & (numerics["metric"] == "replicated")]
    assert (grads["value"] == 1.0).all()  # compared whole (full_tensor) on every rank


def test_gate_cli_passes(clean):
    proc = subprocess.run([sys.executable, "-m", "analyzer", "gate", str(clean)], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS hsdp" in proc.stdout and "PASS fsdp2_tp" in proc.stdout


CANARIES = [  # (strategies, fault, {strategy: (kind, first diverging tensor)})
    (["--strategy", "hsdp", "--mesh", "2,2"], "skip-replicate-sync",
     {"hsdp": ("grad", "layers.0.attn.weight")}),
    (["--strategy", "fsdp2_tp", "--tp", "2"], "wrong-tp-placement",
     {"fsdp2_tp": ("activation", "layers.0.mlp.2")}),
    (BOTH, "wrong-grad-scale",
     {"hsdp": ("grad", "layers.0.attn.weight"), "fsdp2_tp": ("grad", "layers.0.attn.weight")}),
    (BOTH, "unsynced-init",
     {"hsdp": ("activation", "layers.0.attn"), "fsdp2_tp": ("activation", "layers.0.attn")}),
]


@pytest.mark.parametrize("args,fault,first", CANARIES, ids=[c[1] for c in CANARIES])
def test_canary_fails_with_its_first_divergence(tmp_path_factory, args, fault, first):
    out = _record(tmp_path_factory, fault, args + ["--fault", fault])
    for strategy, (kind, tensor) in first.items():
        parity = _parity(out / strategy)
        assert parity.status == "fail", (strategy, parity.reason)
        assert (parity.first_divergence.kind, parity.first_divergence.tensor) == (kind, tensor), parity.reason
    if fault == "wrong-grad-scale":  # g / 4 against g on every parameter, activations untouched
        numerics = pd.read_parquet(out / "hsdp" / schemas.NUMERICS_NAME)
        wide = numerics[numerics["kind"] == "grad"].pivot_table(
            index=["tensor", "rank"], columns="metric", values="value", observed=True)
        rel = (wide["diff_sq_sum"] / wide["ref_sq_sum"]) ** 0.5
        assert ((rel - 0.75).abs() < 1e-4).all(), rel
    if fault == "skip-replicate-sync":  # no replicate-dimension all_reduce was issued at all
        doc, events = _events(out / "hsdp" / schemas.trace_name(0))
        desc = {g["pg_name"]: g["pg_desc"] for g in doc["distributedInfo"]["pg_config"]}
        assert not [op for op, pg in _enclosing_tags(events) if desc.get(pg) == "mesh_replicate"]


def test_pg_tags_on_p2p_functional_and_restored(tmp_path):
    """send / recv / isend / irecv (peer by dst, group_dst), batch_isend_irecv with a P2POp made
    before the patch and one made inside it, functional collectives by group and by ranks,
    barrier: every c10d op tagged with its group (and peer); every name restored after."""
    proc = subprocess.run([sys.executable, "-m", "tests.tracer.pgtag_ranks", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.restored").exists()
        doc = json.loads((tmp_path / f"rank{rank}.json").read_text())
        events = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
        tagged = [(op["name"], pg) for op, pg in _enclosing_tags(events)]
        peer = 1 - rank
        send, recv = ("c10d::send", "c10d::recv_") if rank == 0 else ("c10d::recv_", "c10d::send")
        default, pair = "0", "1"
        assert tagged == [
            ("c10d::allreduce_", default), ("c10d::_allgather_base_", pair),
            ("c10d::_reduce_scatter_base_", pair), (send, f"{default} peer {peer}"),
            (send, f"{pair} peer {peer}"),
            (send, f"{default} peer {peer}"),  # the early P2POp: rank 0 isend, rank 1 irecv
            (recv, f"{pair} peer {peer}"),  # the late one: the other way round
            ("c10d::allreduce_", pair), ("c10d::allgather_into_tensor_coalesced_", default),
            ("c10d::barrier", pair)], tagged


@pytest.mark.parametrize("args,says", [
    (["--strategy", "hsdp", "--nproc", "4", "--mesh", "3,2"], "--mesh 3,2: replicate x shard = 6"),
    (["--strategy", "fsdp2_tp", "--nproc", "4", "--tp", "4", "--hidden", "18"], "--tp 4: must divide --hidden 18"),
    (["--strategy", "fsdp2_tp", "--nproc", "2", "--model", "tests/tracer/specs/odd.py:build"],
     "--strategy fsdp2_tp needs a tensor-parallel plan"),
])
def test_bad_mesh_refused_in_one_line(tmp_path, args, says):
    proc, _ = run_tracer(args + ["--out", str(tmp_path / "out")], REPO)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_users_model_with_its_tp_plan(tmp_path):
    proc, _ = run_tracer(["--strategy", "fsdp2_tp", "--tp", "2", "--nproc", "4", "--batch", "4",
                          "--model", "tests/tracer/specs/tp_mlp.py:build", "--warmup", "0",
                          "--active", "1", "--out", str(tmp_path)], REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "fsdp2_tp"
    manifest = schemas.read_manifest(run / schemas.MANIFEST_NAME)
    assert manifest.mesh.tp_plan == {"0": "colwise", "2": "rowwise"}
    assert manifest.mesh.tp_sharded_params == 16 * 8 + 16 + 8 * 16  # 0: weight + bias; 2: weight
    assert manifest.strategy_options["fsdp_units"] == ["0", "2"]
    parity = _parity(run)
    assert parity.status == "pass", parity.reason
    numerics = pd.read_parquet(run / schemas.NUMERICS_NAME)
    assert set(numerics.loc[numerics["kind"] == "activation", "tensor"]) == {"0", "1", "2"}


def _report(root: Path, out: Path) -> dict:
    """``analyzer report ROOT --format json`` (the CLI, another process) as a dict by run name."""
    proc = subprocess.run([sys.executable, "-m", "analyzer", "report", str(root), "--format", "json",
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["name"]: r for r in json.loads((out / "report.json").read_text())["runs"]}


def test_bytes_per_mesh_dimension_equal_the_hand_count(clean, tmp_path):
    """Per rank and profiled step (active 1), nccl-tests bytes (all_gather / reduce_scatter: the
    whole buffer), f32 = 4 bytes, h = 16 (every dim divides by 2: no FSDP2 padding), 2 units:
    hsdp: shard = 2 units x (all_gather fwd + bwd + reduce_scatter) x the layer's 9h^2+8h
    elements (the full gradient); replicate = 2 units x one all_reduce of one shard (1/S).
    fsdp2_tp: dp = 2 units x 3 x the tp-local layer (TP-sharded 9h^2+5h / T + the 3h of mlp.2's
    bias and the norm); tp = (3L - 1) all_reduce + L all_gather, each of the dp rows'
    activations [B / dp, seq, h]."""
    runs = _report(clean, tmp_path / "report")
    dims = {(name, d["name"]): d for name, r in runs.items() for d in r["mesh_dims"]}
    layer_bytes = LAYER_PARAMS * 4
    assert dims["hsdp", "shard"]["bytes"] == 2 * 3 * layer_bytes
    assert dims["hsdp", "replicate"]["bytes"] == 2 * layer_bytes // 2
    assert dims["hsdp", "shard"]["group_size"] == dims["hsdp", "replicate"]["group_size"] == 2
    tp_local = (9 * H * H + 5 * H) // 2 + 3 * H
    assert TP_SHARDED == 9 * H * H + 5 * H
    assert dims["fsdp2_tp", "dp"]["bytes"] == 2 * 3 * tp_local * 4
    activations_bytes = (4 // 2) * 4 * H * 4  # --batch 4 / dp 2, --seq 4, h, f32
    assert dims["fsdp2_tp", "tp"]["bytes"] == (3 * 2 - 1 + 2) * activations_bytes
    assert set(dims["fsdp2_tp", "tp"]["kinds"]) == {"all_gather", "all_reduce"}
    for (name, dim), d in dims.items():
        assert d["source"] == "pg_desc", (name, dim)
        assert d["union_ns"] <= d["time_ns"] and d["exposed_ns"] <= d["union_ns"]
    groups = {(name, g["kind"], g["mesh_dim"]) for name, r in runs.items() for g in r["comm_groups"]}
    assert ("hsdp", "all_reduce", "replicate") in groups and ("hsdp", "all_gather", "shard") in groups
    assert ("fsdp2_tp", "all_reduce", "tp") in groups and ("fsdp2_tp", "reduce_scatter", "dp") in groups
