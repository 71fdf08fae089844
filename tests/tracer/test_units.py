"""Unit tests of tracer pieces against hand-built inputs with exact answers (no processes)."""

from __future__ import annotations

import gzip
import json
import math
import re

import pytest
import torch

from analyzer.contract import schemas
from tracer.config import RecordConfig, layer_num_params
from tracer.memory import snapshot_to_table
from tracer.model import SimpleTransformer, make_batch, rank_rows
from tracer.numerics import ActivationRecorder, NumericsRows, clean_fqn, tensor_metrics
from tracer.profiling import OneShotExport, peaks_of_events
from tracer.record import expand
from tracer.rundir import clear_run_dir, file_entries, unlock_run_dir
from tracer.strategies import fsdp_unit_names


def test_clean_fqn_strips_wrapper_parts():
    assert clean_fqn("module.layers.0.attn.weight") == "layers.0.attn.weight"
    assert clean_fqn("_fsdp_wrapped_module.layers.1._fsdp_wrapped_module.mlp.0.bias") == "layers.1.mlp.0.bias"
    assert clean_fqn("layers.0._checkpoint_wrapped_module.norm") == "layers.0.norm"


def test_tensor_metrics_exact():
    x = torch.tensor([[1.0, 2.0], [3.0, float("nan")]])
    r = torch.tensor([[1.0, 0.0], [4.0, 2.0]])
    m = tensor_metrics(x[:, :1], r[:, :1], replicated=True)
    assert m == {"numel": 2.0, "sq_sum": 10.0, "ref_sq_sum": 17.0, "diff_sq_sum": 1.0,
                 "max_abs_diff": 1.0, "max_abs_ref": 4.0, "nonfinite": 0.0, "replicated": 1.0}
    m = tensor_metrics(x, r, replicated=False)
    assert m["nonfinite"] == 1.0 and m["replicated"] == 0.0 and math.isnan(m["diff_sq_sum"])
    empty = tensor_metrics(x[:0], r[:0], replicated=False)
    assert empty["numel"] == 0.0 and empty["max_abs_diff"] == 0.0
    with pytest.raises(ValueError, match="shape"):
        tensor_metrics(x, r[:1], replicated=True)


def test_numerics_rows_follow_the_schema():
    rows = NumericsRows(rank=1)
    rows.add_loss(0, 1.5, 1.25)
    rows.add_tensor(0, "grad", "layers.0.attn.weight", 0, tensor_metrics(torch.ones(2), torch.zeros(2), replicated=True))
    table = rows.table()
    assert table.schema.equals(schemas.NUMERICS_SCHEMA)
    assert table.num_rows == 2 + len(schemas.TENSOR_METRICS)
    df = table.to_pandas()
    assert df.loc[df["metric"] == "diff_sq_sum", "value"].item() == 2.0


def test_rank_rows_partition_the_batch():
    assert [rank_rows(8, 2, r) for r in range(2)] == [slice(0, 4), slice(4, 8)]
    with pytest.raises(ValueError, match="does not divide"):
        rank_rows(7, 2, 0)


def test_batch_is_deterministic_and_layer_size_formula():
    a, b = make_batch(2, 3, 4, seed=5), make_batch(2, 3, 4, seed=5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and not torch.equal(a[0], a[1])
    model = SimpleTransformer(hidden=12, layers=1)
    assert sum(p.numel() for p in model.parameters()) == layer_num_params(12)


def test_activation_recorder_forward_order():
    model = SimpleTransformer(hidden=4, layers=1)
    with ActivationRecorder(model) as rec:
        out = model(torch.randn(2, 3, 4))
    names = [n for _, n, _ in rec.items()]
    # norm(x + attn(x)) finishes attn, then norm, then mlp's children, mlp, and the layer.
    assert names == ["layers.0.attn", "layers.0.norm", "layers.0.mlp.0", "layers.0.mlp.1",
                     "layers.0.mlp.2", "layers.0.mlp", "layers.0"]
    assert torch.equal(rec.output("layers.0"), out)


def test_activation_recorder_keeps_a_module_s_first_call():
    model = SimpleTransformer(hidden=4, layers=1)
    with ActivationRecorder(model) as rec:
        first = model(torch.randn(2, 3, 4))
        model(torch.randn(2, 3, 4))
    assert len(rec.outputs["layers.0"]) == 1 and torch.equal(rec.output("layers.0"), first)


def test_activation_recorder_joins_a_stage_s_last_microbatches():
    """A pipeline stage: its layers only; the shape-inference forward before its M
    microbatches is dropped, the microbatches' outputs are joined in order."""
    model = SimpleTransformer(hidden=4, layers=2)
    mbs = [torch.randn(1, 3, 4) for _ in range(3)]
    with ActivationRecorder(model, calls=slice(-2, None), within=["layers.1"]) as rec:
        outs = [model(x) for x in mbs]
    assert all(n.startswith("layers.1") for n in rec.outputs) and "layers.1.mlp.0" in rec.outputs
    assert torch.equal(rec.output("layers.1"), torch.cat(outs[1:]))
    assert rec.output("layers.0") is None


@pytest.mark.parametrize("min_params", [1, 100, 1000, 5000, layer_num_params(32), 10**9])
def test_fsdp_units_mirror_size_based_policy(min_params):
    """Oracle: torch's own size_based_auto_wrap_policy, asked module by module in post-order."""
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    model = SimpleTransformer(hidden=32, layers=2)
    expected = []

    def visit(name, module):
        remaining = sum(p.numel() for p in module.parameters(recurse=False))
        for child_name, child in module.named_children():
            remaining += visit(f"{name}.{child_name}" if name else child_name, child)
        if name and size_based_auto_wrap_policy(module, recurse=False, nonwrapped_numel=remaining,
                                                min_num_params=min_params):
            expected.append(name)
            return 0
        return remaining

    visit("", model)
    assert fsdp_unit_names(model, min_params) == expected
    if min_params == layer_num_params(32):
        assert expected == ["layers.0", "layers.1"]


def test_allocated_peaks_from_memory_events():
    def mem(ts, total, dev=0):
        return {"ph": "i", "name": "[memory]", "ts": ts, "args": {"Device Type": dev, "Total Allocated": total}}
    trace = {"traceEvents": [
        {"ph": "X", "name": "ProfilerStep#2", "ts": 100, "dur": 50},
        {"ph": "X", "name": "ProfilerStep#3", "ts": 200, "dur": 50},
        mem(110, 1000), mem(120, 3000), mem(140, 2000), mem(130, 9999, dev=1),
        mem(210, 500), mem(180, 7777),  # between steps: ignored
    ]}
    assert peaks_of_events(trace["traceEvents"]) == {2: 3000, 3: 500}


def test_snapshot_to_memory_parquet():
    snapshot = {"segments": [
        {"address": 4096, "stream": 0, "total_size": 3072, "blocks": [
            {"size": 1024, "requested_size": 1000, "state": "active_allocated",
             "frames": [{"filename": "/x/torch/nn/functional.py", "line": 1, "name": "linear"},
                        {"filename": "/work/train.py", "line": 42, "name": "step"}]},
            {"size": 2048, "state": "inactive", "frames": []}]},
        {"address": 1 << 40, "stream": 7, "blocks": [{"size": 512, "requested_size": 512,
                                                      "state": "active_pending_free"}]},
    ]}
    table = snapshot_to_table(snapshot, rank=3)
    assert table.schema.equals(schemas.MEMORY_SCHEMA)
    rows = table.to_pylist()
    assert [r["block_size_bytes"] for r in rows] == [1024, 2048, 512]
    assert sum(r["block_size_bytes"] for r in rows if r["state"] == "active_allocated") == 1024
    assert rows[0]["top_frame"] == "/work/train.py:42:step" and rows[1]["top_frame"] is None
    assert rows[1]["requested_size_bytes"] is None and rows[2]["segment_address"] == 1 << 40
    assert {r["rank"] for r in rows} == {3} and rows[2]["stream"] == 7


def test_clear_run_dir_removes_manifest_and_record_files_only(tmp_path):
    for name in ("manifest.json", "rank0.trace.json.gz", "numerics.parquet", "baseline.safetensors",
                 "notes.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.parquet").write_text("x")
    clear_run_dir(tmp_path)
    unlock_run_dir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [schemas.RECORDING_NAME, "notes.txt"]
    assert file_entries(tmp_path) == []  # notes.txt is not the record's
    (tmp_path / "numerics.parquet").write_text("x")
    # sha256 of b"x", independently known
    assert [(e.path, e.sha256) for e in file_entries(tmp_path)] == [
        ("numerics.parquet", "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881")]


def test_expand_all_and_option_errors():
    cfgs = expand("all", None, fault="unsynced-init")
    assert [c.strategy for c in cfgs] == list(schemas.FLAT_STRATEGIES)
    assert [c.fault for c in cfgs] == [None, "unsynced-init", "unsynced-init", "unsynced-init"]
    assert [c.run_name for c in expand("all", "exp")] == [f"exp-{s}" for s in schemas.FLAT_STRATEGIES]
    with pytest.raises(ValueError, match="--steps 2"):
        RecordConfig(strategy="ddp", steps=2)
    with pytest.raises(ValueError, match="--batch 3"):
        RecordConfig(strategy="ddp", batch=3)
    assert RecordConfig(strategy="single", batch=3).world_size == 1
    with pytest.raises(ValueError, match="--reshard-after-forward"):
        RecordConfig(strategy="fsdp", sharding_strategy="full_shard", reshard_after_forward=False)


def test_to_argv_round_trips_through_the_cli():
    """What a spawned worker parses is the config the launcher had."""
    import typer.main

    from tracer.cli import app

    cfg = RecordConfig(strategy="fsdp", hidden=48, steps=9, wrap_min_params=123, precision="bf16",
                       sharding_strategy="shard_grad_op", backward_prefetch="post", forward_prefetch=True,
                       timeout_s=7.5, fault="wrong-grad-scale", name="x", lr=0.25,
                       arm_settings='{"precision": "bf16"}', baseline_id="0123456789ab")
    command = typer.main.get_command(app).commands["record"]
    ctx = command.make_context("record", cfg.to_argv())
    # every option but --arm / --sweep (the launcher's, expanded into configs) is a
    # RecordConfig field of the same name
    assert not ctx.params.pop("arm") and not ctx.params.pop("sweep")
    again = RecordConfig(**ctx.params)
    assert again == cfg


class _FakeProfiler:
    """Stands in for torch.profiler.profile: ``export_chrome_trace`` writes a fixed trace as plain
    JSON (as Kineto does) and remembers the path it was given."""

    def __init__(self, trace: dict):
        self.trace = trace
        self.paths: list[str] = []

    def export_chrome_trace(self, path: str) -> None:
        self.paths.append(path)
        with open(path, "w") as f:
            json.dump(self.trace, f)


def _kineto_like_trace() -> dict:
    return {"schemaVersion": 1, "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python3.11"}},
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "thread 1 (python3.11)"}},
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "thread 1 (main)"}},
        {"ph": "X", "name": "ProfilerStep#2", "pid": 7, "tid": 1, "ts": 100, "dur": 50},
        {"ph": "X", "name": "ProfilerStep#3", "pid": 7, "tid": 1, "ts": 200, "dur": 50},
        {"ph": "i", "name": "[memory]", "pid": 7, "tid": 1, "ts": 120, "args": {"Device Type": 0, "Total Allocated": 3000}},
        {"ph": "i", "name": "[memory]", "pid": 7, "tid": 1, "ts": 130, "args": {"Device Type": 0, "Total Allocated": 1000}},
        {"ph": "i", "name": "[memory]", "pid": 7, "tid": 1, "ts": 210, "args": {"Device Type": 0, "Total Allocated": 500}},
        {"ph": "i", "name": "[memory]", "pid": 7, "tid": 1, "ts": 215, "args": {"Device Type": 1, "Total Allocated": 9999}},
    ]}


def test_one_shot_export_writes_named_trace_and_keeps_peaks(tmp_path, monkeypatch):
    """One parse of Kineto's plain JSON: the .json.gz holds the trace with every track named
    once, the peaks come from the same events, and no temp file is left anywhere."""
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    target = run_dir / "rank0.trace.json.gz"
    prof = _FakeProfiler(_kineto_like_trace())
    export = OneShotExport(target)
    export(prof)
    assert export.exported
    assert len(prof.paths) == 1 and not prof.paths[0].endswith(".gz")  # Kineto writes JSON itself
    written = json.loads(gzip.decompress(target.read_bytes()))
    events = written["traceEvents"]
    assert [e for e in events if e["ph"] != "M"] == [e for e in _kineto_like_trace()["traceEvents"] if e["ph"] != "M"]
    thread_names = [e["args"]["name"] for e in events if e.get("name") == "thread_name"]
    assert thread_names == ["thread 1 (main)"]  # tracks named (trace_names.py): the specific name, once
    assert written["schemaVersion"] == 1
    # by hand: step 2 spans 100..150 (3000 and 1000 inside), step 3 spans 200..250 (500; the
    # 9999 is another device)
    assert export.allocated_peaks == {2: 3000, 3: 500}
    assert export.allocated_peaks == peaks_of_events(events)  # the written trace's own peaks
    assert sorted(p.name for p in run_dir.iterdir()) == [target.name]
    assert list(scratch.iterdir()) == []
    with pytest.raises(RuntimeError, match="already exported"):
        export(prof)


def test_one_shot_export_cancelled_writes_nothing(tmp_path):
    prof = _FakeProfiler(_kineto_like_trace())
    export = OneShotExport(tmp_path / "rank1.trace.json.gz")
    export.cancel()
    export(prof)
    assert not export.exported and prof.paths == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kw, says", [
    ({"strategy": "hsdp"}, "--nproc 2: hsdp's default mesh 2,N/2 needs an even world of at least 4"),
    ({"strategy": "hsdp", "nproc": 4, "mesh": "1,4"}, "--mesh 1,4: a dimension of 1 is not HSDP"),
    ({"strategy": "hsdp", "nproc": 4, "mesh": "4,1"}, "--mesh 4,1: a dimension of 1 is not HSDP"),
    ({"strategy": "ddp", "fault": "skip-microbatch"}, "not available for --strategy ddp (only pp)"),
    ({"strategy": "ddp", "fault": "wrong-tp-placement"}, "(only fsdp2_tp)"),
    ({"strategy": "ddp", "fault": "skip-replicate-sync"}, "(only hsdp)"),
])
def test_mesh_canaries_and_degenerate_meshes_are_refused(kw, says):
    """A canary on a strategy where it cannot act, or an HSDP mesh with a dimension of 1 (no
    replica to all_reduce across, or no shard), would record a run that proves nothing."""
    with pytest.raises(ValueError, match=re.escape(says)):
        RecordConfig(**kw)
