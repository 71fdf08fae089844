"""``tracer record --model SPEC`` (issue 18): every SPEC form, every refused SPEC, and numerics on a
model with a BatchNorm buffer, a tied weight and a parameter of 3 rows on 2 ranks.

Oracles: the model's own ``named_parameters`` / ``named_buffers`` (what must be compared and
what not), torch.chunk row counts worked out by hand (3 rows over 2 ranks: 2 and 1), and for the
records the analyzer's gate, an independent reader of the run directory.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pandas as pd
import pytest
import torch

from analyzer.contract import schemas
from analyzer.contract.tolerance import TOLERANCES
from tests.tracer.helpers import REPO, run_tracer, tensor_rel_l2
from tracer.config import RecordConfig
from tracer.modelspec import ModelSpec, SpecError
from tracer.specload import check_spec, load_spec
from tracer.strategies import unit_names

EXAMPLE = REPO / "examples" / "tiny_lm.py"
SPECS = "tests.tracer.specs.odd"
needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                              reason="transformers not installed (pip install 'paritytrace[hf]')")


def _cfg(model: str, **kw) -> RecordConfig:
    return RecordConfig(strategy="ddp", model=model, batch=kw.pop("batch", 4), **kw)


def test_reference_spec_is_the_reference_model_with_size_based_units():
    spec = check_spec(_cfg("reference", hidden=16, seq=4))
    assert type(spec.model).__name__ == "SimpleTransformer" and spec.units == ()
    assert spec.wrap_min_params == 9 * 16 * 16 + 8 * 16  # one layer's parameters (config.layer_num_params)
    assert unit_names(spec.model, spec) == ["layers.0", "layers.1"]
    x, y = spec.make_batch(4, 0)
    assert x.shape == y.shape == (4, 4, 16)


def test_module_spec_loads_factory_from_an_importable_module():
    spec = check_spec(_cfg(f"{SPECS}:build"))
    assert isinstance(spec, ModelSpec) and type(spec.model).__name__ == "Odd"
    # tied: head.weight is embed.weight, so named_parameters lists it once
    assert [n for n, _ in spec.model.named_parameters()].count("embed.weight") == 1
    assert "head.weight" not in dict(spec.model.named_parameters())


def test_file_spec_loads_the_example_and_its_units_are_its_blocks():
    spec = check_spec(_cfg(f"{EXAMPLE}:build"))
    assert unit_names(spec.model, spec) == ["blocks.0", "blocks.1"]
    x, y = spec.make_batch(4, 0)
    assert x.dtype == torch.int64 and x.shape == (4, 8) and torch.equal(x[:, 1:], y[:, :-1])


def test_factory_seeded_by_seed_builds_the_same_weights_twice():
    a, b = load_spec(_cfg(f"{EXAMPLE}:build", seed=3)), load_spec(_cfg(f"{EXAMPLE}:build", seed=3))
    c = load_spec(_cfg(f"{EXAMPLE}:build", seed=4))
    assert torch.equal(a.model.embed.weight, b.model.embed.weight)
    assert not torch.equal(a.model.embed.weight, c.model.embed.weight)


@needs_hf
@pytest.mark.parametrize("family,unit", [("gpt2", "GPT2Block"), ("llama", "LlamaDecoderLayer")])
def test_hf_spec_builds_a_tiny_offline_model(family, unit):
    spec = check_spec(_cfg(f"hf:{family}"))
    names = unit_names(spec.model, spec)
    assert len(names) == 2 and all(type(spec.model.get_submodule(n)).__name__ == unit for n in names)
    assert sum(p.numel() for p in spec.model.parameters()) < 200_000
    drop = [m.p for m in spec.model.modules() if isinstance(m, torch.nn.Dropout)]
    assert all(p == 0 for p in drop)
    if family == "gpt2":  # the LM head is tied to the token embedding: one FQN
        params = dict(spec.model.named_parameters())
        assert "transformer.wte.weight" in params and "lm_head.weight" not in params


@needs_hf
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_hf_baseline_with_activation_checkpointing_computes_the_same_numbers(family):
    """Checkpointing recomputes each block in backward; with the KV cache on, the recompute
    appended to the cache a second time (Llama: attention over 32 keys against a 16-token
    mask). Oracle: the same baseline without checkpointing (the recompute changes no number)."""
    from tracer.baseline import compute_baseline

    plain, _ = compute_baseline(_cfg(f"hf:{family}"), "cpu")
    ckpt, _ = compute_baseline(_cfg(f"hf:{family}", activation_checkpointing=True),
                               "cpu")
    grads = [k for k in plain if k.startswith("grad.")]
    assert grads and set(grads) == {k for k in ckpt if k.startswith("grad.")}
    for k in grads:
        torch.testing.assert_close(ckpt[k], plain[k], rtol=0, atol=0)


@pytest.mark.parametrize("spec,says", [
    ("nosuchpkg_xyz.mod:build", "no module 'nosuchpkg_xyz'"),
    ("/nonexistent/model.py:build", "no such file"),
    (f"{SPECS}:missing", "has no function 'missing'"),
    ("justaname", "not a model spec"),
    ("hf:bert", "unknown family 'bert'"),
    (f"{SPECS}:raises", "the factory raised RuntimeError: no GPU here"),
    (f"{SPECS}:not_a_spec", "returned Linear, not a tracer.ModelSpec"),
    (f"{SPECS}:bad_batch", "not a tensor of 4 rows"),
    (f"{SPECS}:forward_raises", "the forward or loss raised"),
    (f"{SPECS}:with_dropout", "Dropout(p=0.1)"),
])
def test_bad_spec_is_one_line_naming_it(spec, says):
    with pytest.raises(SpecError) as info:
        check_spec(_cfg(spec))
    text = str(info.value)
    assert text.startswith(f"--model {spec}: ") and says in text and "\n" not in text


def test_reference_options_refused_with_another_model():
    with pytest.raises(ValueError, match="--hidden 32: only for --model reference"):
        _cfg(f"{SPECS}:build", hidden=32)


@pytest.mark.record
@pytest.mark.parametrize("spec", [f"{SPECS}:raises", "examples/no_such.py:build"])
def test_bad_spec_cli_exits_2_before_any_worker(tmp_path, spec):
    proc, _ = run_tracer(["--strategy", "all", "--model", spec, "--out", str(tmp_path / "out")], REPO)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracer: --model ") and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()  # no run dir claimed, no worker started


@pytest.mark.record
def test_numerics_on_batchnorm_tied_and_uneven_parameters(tmp_path):
    proc, _ = run_tracer(["--strategy", "fsdp2", "--model", f"{SPECS}:build", "--batch", "4",
                          "--warmup", "0", "--active", "1", "--out", str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "fsdp2"
    manifest = schemas.read_manifest(run / schemas.MANIFEST_NAME)
    assert manifest.model.spec == f"{SPECS}:build" and manifest.model.name == "Odd"
    assert manifest.model.buffers_not_compared == ["bn.running_mean", "bn.running_var",
                                                   "bn.num_batches_tracked"]
    num = pd.read_parquet(run / schemas.NUMERICS_NAME)
    grads = num[num["kind"] == "grad"]
    # every parameter once (tied head.weight is embed.weight), no buffer
    assert set(grads["tensor"]) == {"embed.weight", "proj.weight", "proj.bias", "bn.weight", "bn.bias",
                                    "gate.weight", "gate.bias", "mix.weight", "mix.bias"}
    numel = grads[grads["metric"] == "numel"].set_index(["tensor", "rank"])["value"]
    # gate.weight [3, 8] in torch.chunk rows over 2 ranks: 2 rows (16) and 1 row (8);
    # gate.bias [3]: 2 and 1; embed.weight [5, 8]: 3 rows (24) and 2 rows (16)
    assert (numel["gate.weight", 0], numel["gate.weight", 1]) == (16.0, 8.0)
    assert (numel["gate.bias", 0], numel["gate.bias", 1]) == (2.0, 1.0)
    assert (numel["embed.weight", 0], numel["embed.weight", 1]) == (24.0, 16.0)
    acts = tensor_rel_l2(num, "activation")
    rtol = TOLERANCES["fp32"].rtol
    # before the BatchNorm each rank's rows equal the baseline's rows; BatchNorm in training
    # mode normalises with each rank's own 2 rows, not the 4 of the baseline: a real divergence
    # (DDP / FSDP without SyncBatchNorm), which the numerics show and the gate would fail
    assert acts["proj"] <= rtol and acts["embed"] <= rtol
    assert acts["bn"] > 1000 * rtol


def _gate(root) -> tuple[int, str]:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "analyzer", "gate", str(root)], capture_output=True,
                          text=True)
    return proc.returncode, proc.stdout + proc.stderr


_RECORD = ["--batch", "4", "--warmup", "0", "--active", "2"]


def _where(model: str) -> str:
    """The example's path from the test's folder (records run there: their temp files stay in it)."""
    return str(REPO / model) if model.endswith(":build") else model


@pytest.mark.record
@pytest.mark.parametrize("model", [pytest.param("hf:gpt2", marks=needs_hf), "examples/tiny_lm.py:build"])
def test_user_model_records_every_strategy_and_passes_the_gate(tmp_path, model):
    proc, _ = run_tracer(["--strategy", "all", "--model", _where(model), "--out", str(tmp_path)] + _RECORD,
                         tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    code, text = _gate(tmp_path)
    assert code == 0, text
    for strategy in ("ddp", "fsdp", "fsdp2"):
        assert f"PASS {strategy}: pass" in text, text
    m = json.loads((tmp_path / "fsdp" / schemas.MANIFEST_NAME).read_text())
    units = {"hf:gpt2": ["transformer.h.0", "transformer.h.1"], }.get(model, ["blocks.0", "blocks.1"])
    assert m["strategy_options"]["fsdp_units"] == units


# Each canary on a user model, and each user model with a canary: the gate fails it. fsdp2
# carries wrong-grad-scale and unsynced-init, ddp skip-grad-sync (the rows' ``faults``: FSDP
# has no local-only gradient). The canaries do not depend on the model's code (tests/tracer/
# test_faults.py runs each on the reference model), so one model each keeps every pairing of
# fault and model family that differs: a tied-weight HF model and a file spec.
CANARIES = [pytest.param("hf:gpt2", "fsdp2", "wrong-grad-scale", marks=needs_hf),
            pytest.param("hf:gpt2", "fsdp", "unsynced-init", marks=needs_hf),
            ("examples/tiny_lm.py:build", "ddp", "skip-grad-sync")]


@pytest.mark.record
@pytest.mark.parametrize("model,strategy,fault", CANARIES)
def test_fault_canary_fails_the_gate_on_user_model(tmp_path, model, strategy, fault):
    proc, _ = run_tracer(["--strategy", strategy, "--fault", fault, "--model", _where(model),
                          "--out", str(tmp_path), "--batch", "4", "--warmup", "0", "--active", "1"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    num = pd.read_parquet(tmp_path / strategy / schemas.NUMERICS_NAME)
    worst = max(tensor_rel_l2(num, "grad").values())
    assert worst > 1000 * TOLERANCES["fp32"].rtol, worst
    if fault == "wrong-grad-scale":  # g / 2 against g: rel L2 exactly 1/2 for every gradient
        assert all(math.isclose(v, 0.5, abs_tol=1e-4) for v in tensor_rel_l2(num, "grad").values())
    code, text = _gate(tmp_path)
    assert code != 0 and f"FAIL {strategy}" in text, text
