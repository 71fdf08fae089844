"""``--strategy pp`` (tracer/pipeline.py): 4 gloo ranks, dp 2 x pp 2, tiny shapes.

Oracles: the analyzer's gate (an independent reader of numerics.parquet), the manifest, the
memory table against the parameter count from the layer formula 9h^2 + 8h, and the raw traces
read with gzip/json.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from collections import Counter

import pandas as pd
import pytest

from analyzer.analyses import parity
from analyzer.contract import schemas
from tests.tracer.helpers import REPO, run_tracer

H, SEQ, BATCH, LAYERS = 16, 4, 8, 2
PP_TINY = ["--nproc", "4", "--pp", "2", "--hidden", str(H), "--seq", str(SEQ), "--batch", str(BATCH),
           "--layers", str(LAYERS), "--active", "1"]
LAYER_PARAMS = 9 * H * H + 8 * H  # attn h^2+h, mlp 8h^2+5h, norm 2h


def _record(tmp_path_factory, name: str, extra: list[str]):
    out = tmp_path_factory.mktemp(name)
    proc, _ = run_tracer(["--strategy", "pp", "--name", name, "--out", str(out)] + PP_TINY + extra,
                         cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / name


@pytest.fixture(scope="module")
def pp_1f1b(tmp_path_factory):
    return _record(tmp_path_factory, "pp-1f1b", ["--pp-schedule", "1f1b", "--microbatches", "4"])


@pytest.fixture(scope="module")
def pp_gpipe(tmp_path_factory):
    return _record(tmp_path_factory, "pp-gpipe", ["--pp-schedule", "gpipe", "--microbatches", "2"])


@pytest.fixture(scope="module")
def pp_canary(tmp_path_factory):
    return _record(tmp_path_factory, "pp-skip", ["--microbatches", "4", "--fault", "skip-microbatch"])


def _gate(run_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analyzer", "gate", str(run_dir)], capture_output=True,
                          text=True, cwd=REPO)


@pytest.mark.record
@pytest.mark.parametrize("which,schedule,microbatches", [("pp_1f1b", "1f1b", 4), ("pp_gpipe", "gpipe", 2)])
def test_pp_records_its_mesh_and_passes_the_gate(request, which, schedule, microbatches):
    run_dir = request.getfixturevalue(which)
    manifest = schemas.read_manifest(run_dir / schemas.MANIFEST_NAME)
    assert manifest.strategy == "pp" and manifest.world_size == 4
    mesh = manifest.mesh
    assert (mesh.shape, mesh.dim_names) == ([2, 2], ["dp", "pp"])
    assert (mesh.pp_schedule, mesh.microbatches) == (schedule, microbatches)
    assert mesh.pp_stages == [["layers.0"], ["layers.1"]]
    assert mesh.stage_params == [LAYER_PARAMS, LAYER_PARAMS]
    assert manifest.batch.per_rank_batch == BATCH // 2  # the rows of its pipeline
    gate = _gate(run_dir)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "pass" in gate.stdout


@pytest.mark.record
def test_pp_ranks_cover_each_tensor_once_and_share_their_pipeline_loss(pp_1f1b):
    numerics = pd.read_parquet(pp_1f1b / schemas.NUMERICS_NAME)
    numel = numerics[numerics["metric"] == "numel"]
    for kind in ("grad", "param"):
        rows = numel[(numel["kind"] == kind) & (numel["tensor"] == "layers.1.attn.weight")]
        by_rank = rows.set_index("rank")["value"].to_dict()
        # stage 1 = ranks 1, 3 (row-major dp x pp): half of the [h, h] weight each; stage 0 none
        assert by_rank == {0: 0.0, 1: H * H / 2, 2: 0.0, 3: H * H / 2}, (kind, by_rank)
    act = numel[(numel["kind"] == "activation") & (numel["tensor"] == "layers.0.mlp.0")]
    assert act.set_index("rank")["value"].to_dict() == {0: 4 * SEQ * 4 * H, 1: 0.0, 2: 4 * SEQ * 4 * H, 3: 0.0}
    assert set(numerics[numerics["metric"] == "replicated"]["value"]) == {0.0}
    loss = numerics[(numerics["kind"] == "loss") & (numerics["metric"] == "value")]
    per_rank = loss.pivot(index="step", columns="rank", values="value")
    assert (per_rank[0] == per_rank[1]).all() and (per_rank[2] == per_rank[3]).all()
    assert (per_rank[0] != per_rank[2]).all()  # two pipelines, two halves of the batch


@pytest.mark.record
def test_pp_memory_counts_the_local_stage_shard(pp_1f1b):
    mem = pd.read_parquet(pp_1f1b / schemas.MEMORY_CATEGORIES_NAME)
    for category in ("parameters", "gradients"):
        got = mem[mem["category"] == category].set_index("rank")["bytes"].to_dict()
        # one layer per stage, FSDP2 Shard(0) over dp 2 (every dim 0 even), fp32
        assert got == {r: LAYER_PARAMS // 2 * 4 for r in range(4)}, (category, got)


@pytest.mark.record
def test_pp_trace_holds_the_microbatch_send_recv(pp_1f1b):
    """Facts the analyzer relies on (gloo, torch 2.13): per profiled step each rank issues one
    ``c10d::send`` and one ``c10d::recv_`` per microbatch on its main thread (stage 0 sends
    activations and receives their gradients, stage 1 the reverse), each followed by a
    ``gloo:send`` / ``gloo:recv`` user_annotation on the same thread; shapes are one
    microbatch [B / (dp M), seq, h]; Concrete Inputs[2] is the peer's rank in the pp group."""
    for rank in range(4):
        with gzip.open(pp_1f1b / f"rank{rank}.trace.json.gz", "rt") as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        names = Counter(e["name"] for e in events)
        assert names["c10d::send"] == names["c10d::recv_"] == 4, rank
        assert names["gloo:send"] == names["gloo:recv"] == 4, rank
        main = {e["tid"] for e in events if e["name"] == "pipeline"}
        for e in events:
            if e["name"] in ("c10d::send", "c10d::recv_", "gloo:send", "gloo:recv"):
                assert e["tid"] in main, (rank, e["name"])
            if e["name"] in ("c10d::send", "c10d::recv_"):
                assert e["args"]["Input Dims"][0] == [[1, SEQ, H]]
                assert e["args"]["Concrete Inputs"][2] == str(1 - rank % 2)


@pytest.mark.record
def test_skip_microbatch_canary_fails_at_the_first_gradient(pp_canary):
    manifest = schemas.read_manifest(pp_canary / schemas.MANIFEST_NAME)
    assert manifest.fault == "skip-microbatch"
    verdict = parity.check_run(pp_canary, manifest)
    assert verdict.status == "fail"
    first = verdict.first_divergence
    # the forward is untouched (activations pass); the lost microbatch's gradient reaches every
    # parameter, and the first in order is stage 0's first one
    assert (first.kind, first.tensor, first.step) == ("grad", "layers.0.attn.weight", 0)
    assert first.rel_l2 > 0.1
    gate = _gate(pp_canary)
    assert gate.returncode == 3 and "layers.0.attn.weight" in gate.stdout, gate.stdout


@pytest.mark.record
@pytest.mark.parametrize("args,says", [
    (["--pp", "4", "--layers", "2"], "--pp 4: more stages than --layers 2"),
    (["--pp", "2", "--microbatches", "3", "--batch", "8"], "--microbatches 3: must divide the batch of each pipeline 4"),
    (["--pp", "2", "--model", "hf:gpt2"], "--model hf:gpt2: --strategy pp needs a stage-split hook "
                                           "(ModelSpec.pp_split) and hf: models have none"),
    (["--pp", "2", "--mixed-precision", "bf16,fp32,fp32"],
     "--mixed-precision bf16,fp32,fp32: not recorded with --strategy pp (the baseline emulates it"),
    (["--pp", "2", "--pp-schedule", "interleaved-1f1b", "--layers", "3"],
     "--pp 2: 2 x --pp-virtual 2 = 4 stages, more than --layers 3"),
    (["--pp", "2", "--model", f"{REPO}/tests/tracer/specs/pp_chain.py:build_skip"],
     "the chain of the 2 stages' modules does not give model(inputs)"),
])
def test_pp_refuses_bad_shapes_in_one_line(tmp_path, args, says):
    proc, _ = run_tracer(["--strategy", "pp", "--nproc", "4", "--out", str(tmp_path)] + args, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert not (tmp_path / "pp").exists()  # refused before anything ran


@pytest.mark.record
@pytest.mark.parametrize("fault,first_kind", [("wrong-grad-scale", "grad"), ("unsynced-init", "activation")])
def test_pp_fault_canaries_fail_the_gate(tmp_path_factory, fault, first_kind):
    run_dir = _record(tmp_path_factory, f"pp-{fault}", ["--microbatches", "2", "--pp-schedule", "gpipe",
                                                         "--fault", fault])
    verdict = parity.check_run(run_dir, schemas.read_manifest(run_dir / schemas.MANIFEST_NAME))
    assert verdict.status == "fail"
    assert verdict.first_divergence.kind == first_kind and verdict.first_divergence.step == 0
    if fault == "wrong-grad-scale":  # g / W against g, W = 4
        assert verdict.first_divergence.rel_l2 == pytest.approx(0.75, rel=1e-3)


def test_stage_layers_split_contiguously():
    from tracer.pipeline import owner_stage, stage_layers, stage_modules

    assert [list(stage_layers(5, 2, s)) for s in range(2)] == [[0, 1], [2, 3, 4]]
    assert [list(stage_layers(4, 4, s)) for s in range(4)] == [[0], [1], [2], [3]]
    assert stage_modules(3, 2) == [["layers.0"], ["layers.1", "layers.2"]]
    stages = stage_modules(12, 2)
    assert owner_stage("layers.1.attn.weight", stages) == 0
    assert owner_stage("layers.10.norm", stages) == 1 and owner_stage("layers.1", stages) == 0
    with pytest.raises(ValueError):
        stage_layers(2, 3, 0)


def test_skip_microbatch_zeroes_the_last_microbatch_of_every_step():
    import torch

    from tracer.pipeline import microbatch_loss

    loss = microbatch_loss(lambda out, y: (out - y).abs().mean(), "skip-microbatch", 3)
    one = torch.ones(2)
    got = [float(loss(one, torch.zeros(2))) for _ in range(6)]
    assert got == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    assert microbatch_loss(len, None, 3) is len


@pytest.mark.record
def test_pp_bytes_per_mesh_dimension_and_bubble(pp_1f1b, tmp_path):
    """Per rank and profiled step (active 1): pp = M sends + M recvs of one microbatch's
    activations (or their gradients) [B / dp / M, seq, h] f32; dp = the stage's one layer
    (9h^2+8h elements, f32) all-gathered once (reshard_after_forward False under PP) and
    reduce-scattered once. The pipeline section: 2 stages, the ideal bubble (P-1)/(M+P-1)."""
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "analyzer", "report", str(pp_1f1b), "--format", "json",
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads((out / "report.json").read_text())["runs"]
    dims = {d["name"]: d for d in run["mesh_dims"]}
    m = 4
    microbatch_bytes = BATCH // 2 // m * SEQ * H * 4
    assert dims["pp"]["bytes"] == 2 * m * microbatch_bytes
    assert dims["pp"]["kinds"] == ["send_recv"]
    assert dims["dp"]["bytes"] == 2 * LAYER_PARAMS * 4
    pipe = run["pipeline"]
    assert (pipe["stages"], pipe["microbatches"], pipe["schedule"]) == (2, m, "1f1b")
    assert pipe["ideal_bubble_frac"] == pytest.approx((2 - 1) / (m + 2 - 1))
    assert [s["ranks"] for s in pipe["per_stage"]] == [[0, 2], [1, 3]]
    pairs = {(p["src_stage"], p["dst_stage"]): p for p in pipe["pairs"]}
    assert set(pairs) == {(0, 1), (1, 0)}
    assert all(p["peer_source"] == "peer" for p in pairs.values())


# --- schedules with several stages per rank (issue 45) -------------------------------------

V_TINY = ["--nproc", "4", "--pp", "4", "--layers", "8", "--hidden", "8", "--seq", "2", "--batch", "8",
          "--microbatches", "4", "--active", "1"]


@pytest.fixture(scope="module")
def pp_interleaved(tmp_path_factory):
    out = tmp_path_factory.mktemp("pp-il")
    proc, _ = run_tracer(["--strategy", "pp", "--name", "il", "--out", str(out), "--pp-schedule",
                          "interleaved-1f1b", "--pp-virtual", "2"] + V_TINY, cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "il"


@pytest.fixture(scope="module")
def pp_zbv(tmp_path_factory):
    out = tmp_path_factory.mktemp("pp-zbv")
    proc, _ = run_tracer(["--strategy", "pp", "--name", "zbv", "--out", str(out), "--pp-schedule", "zbv"]
                         + V_TINY, cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "zbv"


@pytest.mark.record
@pytest.mark.parametrize("which,cls,stage_ids", [
    ("pp_interleaved", "ScheduleInterleaved1F1B", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("pp_zbv", "ScheduleZBVZeroBubble", [[0, 7], [1, 6], [2, 5], [3, 4]])])
def test_multi_stage_schedules_record_8_stages_on_4_ranks_and_pass_parity(request, which, cls, stage_ids):
    run_dir = request.getfixturevalue(which)
    m = schemas.read_manifest(run_dir / schemas.MANIFEST_NAME)
    assert (m.mesh.pp_schedule_class, m.mesh.pp_stage_ids, m.mesh.microbatches) == (cls, stage_ids, 4)
    assert m.mesh.pp_stages == [[f"layers.{i}" for i in ids] for ids in stage_ids]
    assert m.strategy_options["pp_virtual"] == 2
    verdict = parity.check_run(run_dir, m)
    assert verdict.status == "pass", verdict
    # every parameter's gradient compared once, on the rank whose stage owns it
    df = pd.read_parquet(run_dir / "numerics.parquet")
    grads = df[(df["kind"] == "grad") & (df["step"] == 0) & (df["metric"] == "numel")]
    owned = grads[grads["value"] > 0].groupby("tensor")["rank"].agg(list)
    assert owned["layers.7.attn.weight"] == [3 if which == "pp_interleaved" else 0]
    assert owned["layers.4.mlp.0.weight"] == [0 if which == "pp_interleaved" else 3]


@pytest.mark.record
def test_report_gives_the_schedules_ideal_bubble_beside_the_measured(pp_interleaved, tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "analyzer", "report", str(pp_interleaved), "--format",
                           "json,md", "--out", str(out)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads((out / "report.json").read_text())["runs"]
    pipe = run["pipeline"]
    assert (pipe["schedule_class"], pipe["virtual_stages"]) == ("ScheduleInterleaved1F1B", 2)
    assert pipe["ideal_bubble_frac"] == pytest.approx(3 / (2 * 4 + 3))  # (P-1)/(VM+P-1)
    assert all(s["bubble_frac"] is not None for s in pipe["per_stage"])
    assert ("il: 8 stages (2 per rank on 4 ranks) x 4 microbatches, schedule interleaved-1f1b, dp 1; "
            "ideal bubble 27.3 % ((P - 1) / (V M + P - 1)") in (out / "report.md").read_text()


@pytest.mark.record
def test_own_model_pipelines_through_its_stage_split_hook(tmp_path):
    """tests/tracer/specs/pp_chain.py: embed, 4 blocks, head over 2 ranks x 2 stages, FSDP2 over
    dp 2: each stage's shapes come from the chain (8 -> 16 -> 4 features)."""
    proc, _ = run_tracer(["--strategy", "pp", "--name", "chain", "--out", str(tmp_path), "--nproc", "4",
                          "--pp", "2", "--pp-schedule", "looped-bfs", "--model",
                          "tests/tracer/specs/pp_chain.py:build", "--batch", "8", "--microbatches", "2",
                          "--active", "1"], cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = schemas.read_manifest(tmp_path / "chain" / schemas.MANIFEST_NAME)
    assert m.mesh.pp_stages == [["embed", "blocks.0", "blocks.2"], ["blocks.1", "blocks.3", "head"]]
    assert parity.check_run(tmp_path / "chain", m).status == "pass"


def test_stage_placement_is_torchs_loop_or_v():
    from tracer.pipeline import stage_placement

    assert stage_placement(4, 2, "interleaved-1f1b") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert stage_placement(2, 3, "looped-bfs") == [[0, 2, 4], [1, 3, 5]]
    assert stage_placement(4, 2, "zbv") == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert stage_placement(2, 1, "1f1b") == [[0], [1]]


def test_split_module_list_puts_first_and_last_modules_on_the_end_stages():
    from torch import nn

    from tracer.modelspec import split_module_list

    model = nn.Module()
    model.blocks = nn.ModuleList(nn.Linear(2, 2) for _ in range(5))
    split = split_module_list("blocks", first=("embed",), last=("norm", "head"))
    assert split(model, 2) == [["embed", "blocks.0", "blocks.1"], ["blocks.2", "blocks.3", "blocks.4", "norm", "head"]]
    assert split_module_list("blocks")(model, 5)[4] == ["blocks.4"]
    with pytest.raises(ValueError, match="6 pipeline stages over 5 blocks"):
        split(model, 6)


def test_a_split_that_misses_or_ties_a_parameter_is_refused():
    import torch
    from torch import nn

    from tracer.modelspec import ModelSpec
    from tracer.pipeline import check_split, split_stages

    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))

    def spec(split):
        return ModelSpec(model=model, make_batch=None, loss=None, pp_split=lambda m, n: split)

    with pytest.raises(ValueError, match="parameter 2.weight is under no stage's modules"):
        split_stages(spec([["0"], ["1"]]), 2)
    with pytest.raises(ValueError, match="must return 2 non-empty lists"):
        split_stages(spec([["0", "1", "2"], []]), 2)
    with pytest.raises(ValueError, match="'3' is not a submodule"):
        split_stages(spec([["0"], ["1", "2", "3"]]), 2)
    model[2] = model[0]  # tied: one module in two stages
    with pytest.raises(ValueError, match="also in stage 0"):
        split_stages(spec([["0"], ["1", "2"]]), 2)
    with pytest.raises(ValueError, match="no stage-split hook"):
        split_stages(ModelSpec(model=model, make_batch=None, loss=None), 2)
    with pytest.raises(ValueError, match="does not give model"):  # it runs 0, 1, 0; the chain 0, 1
        check_split(spec([["0"], ["1"]]), 2, torch.ones(3, 2))
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    check_split(spec([["0"], ["1"]]), 2, torch.ones(3, 2))


@pytest.mark.parametrize("options,said", [
    (dict(pp_schedule="1f1b", pp_virtual=2), "--pp-virtual 2: 1f1b runs one stage per rank"),
    (dict(pp_schedule="zbv", pp_virtual=3, layers=6), "--pp-virtual 3: zbv needs exactly 2 stages per rank"),
    (dict(pp_schedule="dualpipev", microbatches=4, layers=8, pp=4),
     "--microbatches 4: dualpipev needs at least as many microbatches as stages (8"),
    (dict(pp_schedule="interleaved-1f1b", microbatches=6, pp=4, layers=8, batch=12, nproc=4),
     "--microbatches 6: interleaved-1f1b needs a multiple of its rounds max(1, M // P) = 1"),
])
def test_schedule_and_virtual_stages_that_torch_refuses_are_one_line(options, said):
    from tracer.config import RecordConfig

    kw = dict(strategy="pp", nproc=4, batch=8, layers=4) | options
    if "rounds max(1, M // P) = 1" in said:  # M 6 over P 4 is 1 round: torch takes it
        RecordConfig(**kw)
        return
    with pytest.raises(ValueError, match="^" + re.escape(said)):
        RecordConfig(**kw)


def test_multi_stage_schedules_default_to_2_stages_per_rank():
    from tracer.config import RecordConfig

    assert RecordConfig(strategy="pp", nproc=4, batch=8, layers=4, pp_schedule="looped-bfs").pp_virtual_stages == 2
    assert RecordConfig(strategy="pp", nproc=4, batch=8, layers=4).pp_virtual_stages == 1


def test_a_sweep_over_schedules_names_the_stages_per_rank_each_ran():
    from tracer.arms import expand_arms
    from tracer.cli import arm_parser
    from tracer.config import _DEFAULTS

    def _expand(sweeps, strategy, **given):
        parse, kinds = arm_parser()
        common = {k: v for k, v in _DEFAULTS.items() if k not in ("strategy", "name")} | given
        return expand_arms([], sweeps, strategy=strategy, common=common, given=list(given),
                           parse=parse, option_kinds=kinds)

    configs = _expand(sweeps=["pp-schedule=1f1b,interleaved-1f1b,zbv"], strategy="pp", nproc=4, pp=2,
                      layers=4, batch=8)
    assert {c.arm: json.loads(c.arm_settings) for c in configs} == {
        "pp-schedule=1f1b": {"pp_schedule": "1f1b", "pp_virtual": 1},
        "pp-schedule=interleaved-1f1b": {"pp_schedule": "interleaved-1f1b", "pp_virtual": 2},
        "pp-schedule=zbv": {"pp_schedule": "zbv", "pp_virtual": 2}}
    grid = _expand(sweeps=["pp-virtual=1,2"], strategy="pp", nproc=4, pp=2, layers=4, batch=8,
                   pp_schedule="looped-bfs")
    assert [c.pp_virtual_stages for c in grid] == [1, 2]


@pytest.mark.record
def test_bf16_autocasts_each_stage_forward_and_passes_parity(tmp_path):
    """--precision bf16 under an interleaved schedule, dp 2 x pp 2 x 2 stages per rank:
    autocast around each stage's forward and the loss, the backward outside it, as the
    baseline; the bf16 tolerance (analyzer/contract/tolerance.py) holds."""
    proc, _ = run_tracer(["--strategy", "pp", "--name", "bf", "--out", str(tmp_path), "--nproc", "4",
                          "--pp", "2", "--pp-schedule", "interleaved-1f1b", "--layers", "4", "--hidden", "16",
                          "--seq", "4", "--batch", "8", "--microbatches", "2", "--active", "1",
                          "--precision", "bf16"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = schemas.read_manifest(tmp_path / "bf" / schemas.MANIFEST_NAME)
    verdict = parity.check_run(tmp_path / "bf", m)
    assert verdict.status == "pass", verdict
    assert "rtol 0.016" in _gate(tmp_path / "bf").stdout


def test_forward_recorder_skips_the_recomputation_inside_backward():
    """A checkpointed module runs its forward again inside backward (non-reentrant
    recomputation); the pipeline's recorder keeps only the M forward calls."""
    import torch
    from torch import nn

    from tracer.numerics import ActivationRecorder
    from tracer.pipeline import ForwardRecorder
    from tracer.training import apply_checkpointing

    model = nn.Sequential(nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3)), nn.Linear(3, 1))
    apply_checkpointing(model, ["0"])
    xs = [torch.randn(2, 3), torch.randn(2, 3)]
    with ForwardRecorder(model, calls=slice(-2, None)) as fwd, ActivationRecorder(model, calls=slice(-2, None)) as every:
        outs = [model(x) for x in xs]
        (outs[0].sum() + outs[1].sum()).backward()
    # the recomputation stops once it has rebuilt what backward saved (torch's early stop), so
    # the unit's inner modules finish their forward again, and their hooks fire again
    assert len(fwd.outputs["0.0"]) == 2 and len(every.outputs["0.0"]) == 4
    with torch.no_grad():
        want = torch.cat([model[0][0](x) for x in xs])
    assert torch.equal(fwd.output("0.0"), want)


@pytest.mark.record
def test_activation_checkpointing_recomputes_inside_the_schedule_and_passes_parity(tmp_path):
    """--activation-checkpointing on each stage's layers, interleaved 1F1B (2 stages per rank):
    each layer's forward runs twice per microbatch (the trace's layer_norm calls double) and
    parity holds at fp32's tolerance."""
    common = ["--strategy", "pp", "--out", str(tmp_path), "--nproc", "2", "--pp", "2", "--pp-schedule",
              "interleaved-1f1b", "--layers", "4", "--hidden", "8", "--seq", "2", "--batch", "4",
              "--microbatches", "2", "--active", "1"]
    for name, extra in (("ac", ["--activation-checkpointing"]), ("plain", [])):
        proc, _ = run_tracer(common + ["--name", name] + extra, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    m = schemas.read_manifest(tmp_path / "ac" / schemas.MANIFEST_NAME)
    assert parity.check_run(tmp_path / "ac", m).status == "pass"

    def layer_norms(run):
        with gzip.open(tmp_path / run / "rank0.trace.json.gz") as f:
            return sum(e.get("name") == "aten::layer_norm" for e in json.load(f)["traceEvents"])
    assert layer_norms("ac") == 2 * layer_norms("plain") > 0
