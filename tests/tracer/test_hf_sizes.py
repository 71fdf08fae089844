"""``hf:`` models of the user's shape (issue 45): family-independent size names
(``hf:llama?layers=4,hidden=256,heads=4,vocab=512,seq=32``, tracer/specform.py
``HF_SIZE_NAMES``), sizes that cannot build a model refused in one line, the config torch built
in the manifest, and Llama's tensor-parallel plan (transformers' ``base_model_tp_plan``) under
fsdp2_tp.

Oracles: transformers' own config classes (``attribute_map``, ``base_model_tp_plan``), the
built modules' shapes, parameter counts worked out by hand, and for the records the analyzer's
gate, an independent reader of the run directory, with its canary (wrong-tp-placement) failing.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.tracer.helpers import REPO, run_tracer
from tracer.config import RecordConfig
from tracer.specform import (HF_CONFIG_ALIASES, HF_SIZE_NAMES, SpecError, hf_sizes,
                             hf_tp_refusal, parse_spec)

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                              reason="transformers not installed (pip install 'paritytrace[hf]')")

LLAMA = "hf:llama?layers=4,hidden=256,heads=4,seq=16"
"""The issue's scaled-down Llama: 4 layers, hidden 256 (4 heads of 64, 4 key / value heads,
MLP 512), vocabulary 256, sequence 16."""
LLAMA_PARAMS = 4 * (4 * 256 * 256 + 3 * 256 * 512 + 2 * 256) + 2 * 256 * 256 + 256
"""Per layer q / k / v / o (h x h each), gate / up / down (h x 512), two RMSNorms (h); the
embedding and the untied LM head (256 x h); the final RMSNorm: 2,754,816."""


def test_size_names_become_each_familys_config_keys():
    assert parse_spec("hf:llama?layers=4,hidden=256,heads=4,kv_heads=2,ffn=768,vocab=512,seq=32"
                      ).overrides == (
        ("num_hidden_layers", 4), ("hidden_size", 256), ("num_attention_heads", 4),
        ("num_key_value_heads", 2), ("intermediate_size", 768), ("vocab_size", 512),
        ("max_position_embeddings", 32))
    assert parse_spec("hf:gpt2?layers=3,hidden=32,heads=4,ffn=64,vocab=100,seq=8").overrides == (
        ("n_layer", 3), ("n_embd", 32), ("n_head", 4), ("n_inner", 64), ("vocab_size", 100),
        ("n_positions", 8))


def test_derived_sizes_follow_the_given_ones():
    assert hf_sizes(parse_spec("hf:llama?hidden=256,heads=4")) == dict(
        layers=2, hidden=256, heads=4, kv_heads=4, ffn=512, vocab=256, seq=16, head_dim=64)
    assert hf_sizes(parse_spec("hf:gpt2?n_embd=128")) == dict(
        layers=2, hidden=128, heads=2, kv_heads=2, ffn=512, vocab=256, seq=16, head_dim=64)


@pytest.mark.parametrize("spec,line", [
    ("hf:llama?heads=4,kv_heads=3", "--model hf:llama?heads=4,kv_heads=3: heads 4 do not divide "
     "by kv_heads 3 (each key / value head serves heads / kv_heads query heads: transformers' "
     "LlamaAttention.num_key_value_groups, repeat_kv); change the override"),
    ("hf:gpt2?kv_heads=2", "--model hf:gpt2?kv_heads=2: hf:gpt2 has no size kv_heads; use one of "
     "layers, hidden, heads, ffn, vocab, seq"),
    ("hf:gpt2?hidden=32,hidden_size=32", "--model hf:gpt2?hidden=32,hidden_size=32: hidden and "
     "hidden_size both set n_embd; give each config key once"),
    ("hf:llama?layers=4,num_hidden_layers=4", "--model hf:llama?layers=4,num_hidden_layers=4: "
     "layers and num_hidden_layers both set num_hidden_layers; give each config key once"),
    ("hf:llama?seq=0", "--model hf:llama?seq=0: seq=0 is not a size (a whole number >= 1); "
     "change the override"),
])
def test_sizes_that_build_no_model_are_refused_before_torch(spec, line):
    """heads=4,kv_heads=3 used to build, then fail in the forward: "the forward or loss raised
    RuntimeError: The size of tensor a (4) must match ..."."""
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert str(info.value) == line


@pytest.mark.parametrize("model,tp,line", [
    ("hf:llama?hidden=96,heads=3", 2, "--tp 2: must divide the model's heads 3 (the TP plan gives "
     "each rank heads / T of q / k / v and gate / up / down)"),
    ("hf:llama?heads=4,kv_heads=2", 4, "--tp 4: must divide the model's kv_heads 2 (the TP plan "
     "gives each rank kv_heads / T of q / k / v and gate / up / down)"),
])
def test_fsdp2_tp_refuses_heads_that_do_not_divide_by_tp(model, tp, line):
    with pytest.raises(ValueError) as info:
        RecordConfig(strategy="fsdp2_tp", model=model, nproc=4, tp=tp, batch=4)
    assert str(info.value) == line
    assert hf_tp_refusal(LLAMA, 2) is None and hf_tp_refusal("hf:gpt2?n_head=3", 2) is None


@needs_hf
def test_gpt2_config_aliases_are_transformers_attribute_map():
    import transformers

    assert HF_CONFIG_ALIASES["gpt2"] == transformers.GPT2Config.attribute_map
    assert HF_CONFIG_ALIASES["llama"] == transformers.LlamaConfig.attribute_map
    for family, config in (("gpt2", transformers.GPT2Config), ("llama", transformers.LlamaConfig)):
        keys = set(config().to_dict())
        assert all(k[family] in keys for k in HF_SIZE_NAMES.values() if family in k)


@needs_hf
def test_sized_llama_is_built_with_those_sizes_and_trains_at_its_sequence():
    from tracer.specload import check_spec

    spec = check_spec(RecordConfig(strategy="ddp", model="hf:llama?layers=3,hidden=128,heads=4,"
                                   "vocab=512,seq=32", batch=4))
    layers = spec.model.model.layers
    assert len(layers) == 3 and spec.model.model.embed_tokens.weight.shape == (512, 128)
    assert layers[0].mlp.gate_proj.weight.shape == (256, 128)  # ffn follows hidden: 2 x 128
    assert layers[0].self_attn.k_proj.weight.shape == (128, 128)  # kv_heads follow heads
    assert spec.config["num_hidden_layers"] == 3 and spec.config["head_dim"] == 32
    assert "transformers_version" not in spec.config and "id2label" not in spec.config
    x, y = spec.make_batch(4, 0)
    assert x.shape == y.shape == (4, 32) and 256 <= int(x.max()) < 512  # the whole vocabulary
    assert spec.tp_plan is not None


@needs_hf
def test_llama_tp_plan_is_transformers_plan_for_every_layer():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from tracer.hf import llama, llama_tp_plan

    plan = llama_tp_plan(llama().model, None)
    assert len(plan) == 2 * 7
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
                 "mlp.up_proj"):
        assert type(plan[f"model.layers.1.{name}"]) is ColwiseParallel
    for name in ("self_attn.o_proj", "mlp.down_proj"):
        assert type(plan[f"model.layers.1.{name}"]) is RowwiseParallel


_CLI = """
import sys
from tracer.cli import app
try:
    code = app(["record", "--strategy", "ddp", "--model", sys.argv[1], "--out", sys.argv[2]],
               standalone_mode=False)
except SystemExit as exc:
    code = exc.code
except BaseException as exc:
    code = getattr(exc, "exit_code", repr(exc))
print(code)
"""


@needs_hf
@pytest.mark.integration
def test_hidden_not_divisible_by_heads_is_one_line_exit_2(tmp_path):
    spec = "hf:llama?hidden=100,heads=3"
    proc = subprocess.run([sys.executable, "-c", _CLI, spec, str(tmp_path / "out")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "2", proc.stderr
    assert proc.stderr.strip() == (
        f"tracer: --model {spec}: LlamaConfig refused it: Class validation error for validator "
        "'validate_architecture': ValueError: The hidden size (100) is not a multiple of the "
        "number of attention heads (3); change the override")


def _gate(root) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "analyzer", "gate", str(root)],
                          capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


_RECORD = ["--model", LLAMA, "--batch", "4", "--warmup", "0", "--active", "1"]


@needs_hf
@pytest.mark.record
@pytest.mark.parametrize("strategy,extra", [("fsdp2", ["--nproc", "2"]),
                                            ("fsdp2_tp", ["--nproc", "4", "--tp", "2"])])
def test_sized_llama_passes_parity(tmp_path, strategy, extra):
    proc, _ = run_tracer(["--strategy", strategy, "--out", str(tmp_path)] + _RECORD + extra, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    code, text = _gate(tmp_path)
    assert code == 0, text
    assert text.splitlines()[0] == (
        f"PASS {strategy}: pass -- all 133 tensors and the loss at 2 step(s) within rtol 1.3e-06, "
        "atol 1e-05; torch.testing.assert_close defaults for fp32")
    m = json.loads((tmp_path / strategy / "manifest.json").read_text())
    assert m["model"]["spec"] == LLAMA and m["model"]["num_params"] == LLAMA_PARAMS
    config = m["model"]["config"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["intermediate_size"], config["max_position_embeddings"]) == (4, 256, 4, 512, 16)
    if strategy == "fsdp2_tp":
        assert m["mesh"]["shape"] == [2, 2]
        assert m["mesh"]["tp_plan"]["model.layers.3.self_attn.o_proj"] == "rowwise"
        assert m["mesh"]["tp_sharded_params"] == 4 * (4 * 256 * 256 + 3 * 256 * 512)


@needs_hf
@pytest.mark.record
def test_wrong_tp_placement_fails_the_gate_on_sized_llama(tmp_path):
    proc, _ = run_tracer(["--strategy", "fsdp2_tp", "--nproc", "2", "--tp", "2", "--fault",
                          "wrong-tp-placement", "--out", str(tmp_path)] + _RECORD, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    code, text = _gate(tmp_path)
    assert code != 0 and text.startswith("FAIL fsdp2_tp: fail -- first divergence: activation "
                                         "model.layers.0.self_attn.o_proj (step 0)"), text


def test_a_model_config_the_manifest_cannot_hold_is_refused_when_the_factory_returns():
    import torch
    from torch import nn

    from tracer.modelspec import ModelSpec

    with pytest.raises(ValueError) as info:
        ModelSpec(model=nn.Linear(2, 2), make_batch=lambda b, s: (torch.zeros(b, 2),) * 2,
                  loss=nn.functional.mse_loss, config={"dtype": torch.float32})
    assert str(info.value) == ("ModelSpec.config is not JSON (Object of type dtype is not JSON "
                               "serializable)")
