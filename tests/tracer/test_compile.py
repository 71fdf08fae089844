"""``tracer record --compile`` (issue 45): the option's refusals, the baseline it needs, the
tolerance it states, the manifest's compile section; and, recorded, parity of a compiled fsdp2
run against a compiled baseline, a canary caught under compile, the compile warm-up kept out
of the profiled steps."""

from __future__ import annotations

import json

import msgspec
import pytest

from analyzer.contract.tolerance import compile_tolerance
from tracer.config import RecordConfig


def test_compile_model_refused_for_fsdp1_in_one_line():
    with pytest.raises(ValueError) as exc:
        RecordConfig(strategy="fsdp", compile="model")
    assert str(exc.value) == (
        "--compile model: dynamo skips FullyShardedDataParallel's code (torch/distributed/fsdp/"
        "_dynamo_utils.py), so a compiled FSDP1 root runs eagerly and compiles nothing; use "
        "--compile blocks (inside its units) or --strategy fsdp2")
    assert RecordConfig(strategy="fsdp", compile="blocks").compile == "blocks"


def test_compile_refuses_an_unknown_mode_and_a_profiled_compile_step():
    with pytest.raises(ValueError, match=r"^--compile all: expected one of none, blocks, model$"):
        RecordConfig(strategy="ddp", compile="all")
    with pytest.raises(ValueError) as exc:
        RecordConfig(strategy="fsdp2", compile="blocks", warmup=0)
    assert str(exc.value) == (
        "--compile blocks: needs --wait + --warmup >= 2 (got 1 + 0): step 0 compiles with the "
        "numerics hooks, step 1 recompiles without them, and neither may be profiled")


@pytest.mark.parametrize("strategy", ["single", "ddp", "fsdp2", "hsdp", "fsdp2_tp", "pp"])
def test_compile_taken_by_every_strategy_but_fsdp1_model(strategy):
    for mode in ("blocks", "model"):
        assert RecordConfig(strategy=strategy, nproc=4, compile=mode).compile == mode


def test_baseline_id_changes_with_compile_only():
    from tracer.baseline import baseline_id, baseline_key

    eager = RecordConfig(strategy="fsdp2")
    assert "compile" not in baseline_key(eager, "cpu")  # eager ids as before the option
    ids = {baseline_id(RecordConfig(strategy="fsdp2", compile=m), "cpu") for m in ("none", "blocks", "model")}
    assert len(ids) == 3


def test_compile_tolerance_stated():
    tol = compile_tolerance("fp32", 4, "blocks")
    assert tol.describe() == (
        "rtol 1.3e-06, atol 1e-05; torch.compile (blocks) on both sides: the baseline runs the same "
        "inductor graphs, specialised for its whole batch, so sums over rows change order; "
        "2 (W - 1) u for W = 4 or torch.testing.assert_close's fp32 default when larger")
    assert compile_tolerance("fp32", 16, "model").rtol == pytest.approx(2 * 15 * 2.0 ** -24)


def test_manifest_says_what_was_compiled_and_keeps_warmup_apart():
    from torch import nn

    from tracer.compiling import compile_blocks, compile_section, warmup_section

    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    compile_blocks(model, ["1"])
    cfg = RecordConfig(strategy="fsdp2", compile="blocks")
    assert json.loads(msgspec.json.encode(compile_section(cfg, model))) == {
        "mode": "blocks", "backend": "inductor", "fullgraph": True, "modules": ["1"]}
    rows = [{"wall_ns": 9, "profiled": False, "compile_ns": 7}, {"wall_ns": 3, "profiled": False, "compile_ns": 2},
            {"wall_ns": 1, "profiled": True, "compile_ns": 0}]
    assert json.loads(msgspec.json.encode(warmup_section(cfg, rows))) == {
        "compile_ns_by_step": [7, 2, 0], "first_step_wall_ns": 9, "profiled_compile_ns": 0}
    eager = RecordConfig(strategy="fsdp2")
    assert compile_section(eager, model) is None and warmup_section(eager, rows) is None
    with pytest.raises(RuntimeError, match=r"^--compile blocks: torch compiled nothing in 3 steps"):
        warmup_section(cfg, [{**r, "compile_ns": 0} for r in rows])


def test_parity_applies_the_compile_tolerance_of_the_manifest():
    from analyzer.analyses.parity import tolerance_for

    assert tolerance_for("fp32", world_size=4, compile="blocks") == compile_tolerance("fp32", 4, "blocks")
    assert tolerance_for("fp32", world_size=4).source == "torch.testing.assert_close defaults for fp32"


_SHAPES = ["--hidden", "32", "--layers", "2", "--batch", "4", "--seq", "16", "--active", "2"]


def _record_and_report(tmp_path, args: list[str], layers: int = 2) -> tuple[dict, dict]:
    """Record ``args`` + tiny shapes (``layers`` blocks) into ``tmp_path/run``; returns
    (manifest, its report.json run entry)."""
    import subprocess
    import sys

    from tests.tracer.helpers import REPO, run_tracer

    shapes = [str(layers) if i and _SHAPES[i - 1] == "--layers" else a for i, a in enumerate(_SHAPES)]
    proc, _ = run_tracer(args + shapes + ["--out", str(tmp_path), "--name", "run", "--timeout", "300"],
                         tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    rep = subprocess.run([sys.executable, "-m", "analyzer", "report", str(run), "--format", "json"],
                         cwd=REPO, capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr[-3000:]
    manifest = json.loads((run / "manifest.json").read_text())
    (entry,) = json.loads((run / "report" / "report.json").read_text())["runs"]
    return manifest, entry


@pytest.mark.record
@pytest.mark.parametrize("strategy, extra", [("ddp", []), ("fsdp2", []),
                                             ("hsdp", ["--nproc", "4", "--mesh", "2,2"])])
def test_compile_blocks_passes_parity_against_a_compiled_baseline(tmp_path, strategy, extra):
    manifest, entry = _record_and_report(tmp_path, ["--strategy", strategy, "--compile", "blocks"] + extra)
    assert entry["parity"]["status"] == "pass", entry["parity"]
    assert entry["parity"]["tolerance"]["source"].startswith("torch.compile (blocks) on both sides")
    assert manifest["training"]["compile"] == {"mode": "blocks", "backend": "inductor", "fullgraph": True,
                                               "modules": ["layers.0", "layers.1"]}
    warm = manifest["compile_warmup"]
    # steps 0 (hooks on) and 1 (hooks off) compile, never profiled; the profiled steps do not
    assert warm["compile_ns_by_step"][0] > 0 and warm["compile_ns_by_step"][2:] == [0, 0]
    assert warm["profiled_compile_ns"] == 0 and warm["first_step_wall_ns"] > warm["compile_ns_by_step"][0]


@pytest.mark.record
@pytest.mark.parametrize("strategy, extra, layers", [
    ("fsdp2", [], 6),  # 6 blocks: 6 step-0 graphs of one forward, past dynamo's default limit of 8 with step 1's
    ("pp", ["--pp-schedule", "interleaved-1f1b", "--pp-virtual", "2", "--microbatches", "4"], 4)])
def test_compile_blocks_records_many_blocks_and_pipelined_stages(tmp_path, strategy, extra, layers):
    manifest, entry = _record_and_report(tmp_path, ["--strategy", strategy, "--compile", "blocks"] + extra,
                                         layers)
    assert entry["parity"]["status"] == "pass", entry["parity"]
    assert manifest["training"]["compile"]["mode"] == "blocks"


@pytest.mark.record
def test_wrong_grad_scale_fails_parity_under_compile(tmp_path):
    _, entry = _record_and_report(tmp_path, ["--strategy", "fsdp2", "--compile", "blocks",
                                             "--fault", "wrong-grad-scale"])
    assert entry["parity"]["status"] == "fail"
    first = entry["parity"]["first_divergence"]
    assert (first["kind"], first["tensor"]) == ("grad", "layers.0.attn.weight")


def test_compile_refused_with_activation_checkpointing_in_one_line():
    with pytest.raises(ValueError) as exc:
        RecordConfig(strategy="fsdp2", compile="blocks", activation_checkpointing=True)
    assert str(exc.value) == (
        "--compile blocks: not recorded with --activation-checkpointing: compiling the checkpointed "
        "block (torchtitan's order) meets the step-0 numerics hooks inside torch's checkpoint "
        "operator, which dynamo refuses (\"HOP: Unsafe side effect\"), and a checkpoint around the "
        "compiled block fails its recompute check (CheckpointError: recomputed tensors' metadata "
        "differ); drop one of them")


@pytest.mark.record
def test_a_compile_sweep_on_fsdp2_decides_with_its_kernel_counts_first(tmp_path):
    """`--sweep compile=none,blocks` on fsdp2: one experiment (compile is a declared setting),
    a decision line, and on the first screen the kernels the fusion saved, with the collectives
    and memory said to be the same."""
    import re
    import subprocess
    import sys

    from tests.tracer.helpers import REPO, run_tracer

    out = tmp_path / "t"
    proc, _ = run_tracer(["--strategy", "fsdp2", "--sweep", "compile=none,blocks", "--out", str(out),
                          "--timeout", "300"] + _SHAPES, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = subprocess.run([sys.executable, "-m", "analyzer", "report", str(out)], cwd=REPO,
                         capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr[-3000:]
    lines = rep.stdout.splitlines()
    assert lines[2].startswith("**Decision:** fsdp2 with compile=")
    first = lines[:lines.index("**Context:**")]
    assert "- arms: fsdp2 with compile=none → with compile=blocks" in first
    (kern,) = [ln for ln in first if ln.startswith("- compute kernels: ")]
    eager, compiled = map(int, re.fullmatch(r"- compute kernels: (\d+) → (\d+) per step \(per rank\)", kern).groups())
    assert compiled < eager  # inductor fused the blocks' elementwise ops
    assert ("- no collective call or byte per kind and mesh dimension and no memory category "
            "differs between the arms") in first
