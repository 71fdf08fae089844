"""``--model SPEC`` read as text before torch (tracer/specform.py, issue 42): a SPEC that names no
model is refused in one line before torch is imported or a spec-check child starts; ``hf:``
models take config overrides (``hf:gpt2?n_layer=3,n_embd=32``), checked against the config
(built locally, offline: tracer/hf.py sets HF_HUB_OFFLINE) and kept in the manifest's
``model.spec``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.tracer.helpers import REPO, run_tracer
from tracer.config import RecordConfig
from tracer.specform import SpecError, SpecForm, parse_spec

needs_hf = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                              reason="transformers not installed (pip install 'paritytrace[hf]')")


def test_spec_forms_parse_without_importing_anything():
    assert parse_spec("reference") == SpecForm(kind="reference")
    assert parse_spec("hf:gpt2?n_layer=3,n_embd=32,use_cache=false,activation_function=relu") == \
        SpecForm(kind="hf", where="gpt2", overrides=(("n_layer", 3), ("n_embd", 32),
                                                     ("use_cache", False),
                                                     ("activation_function", "relu")))
    assert parse_spec("pkg.mod:build") == SpecForm(kind="module", where="pkg.mod", factory="build")


@pytest.mark.parametrize("spec,line", [
    ("/nonexistent/model.py:build",
     "--model /nonexistent/model.py:build: no such file /nonexistent/model.py; pass the path of "
     "your .py file"),
    ("hf:bert", "--model hf:bert: unknown family 'bert'; use one of hf:gpt2, hf:llama"),
    ("hf:gpt2?n_layer", "--model hf:gpt2?n_layer: 'n_layer' is not KEY=VALUE; write "
     "hf:gpt2?KEY=VALUE,... (e.g. hf:gpt2?n_layer=4,n_embd=128)"),
    ("hf:gpt2?n_layer=2,n_layer=3", "--model hf:gpt2?n_layer=2,n_layer=3: n_layer is given twice; "
     "give each config key once"),
])
def test_spec_that_names_no_model_is_one_line(spec, line):
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert str(info.value) == line


@pytest.mark.parametrize("spec,line", [
    ("hf:gpt2?n_layer=abc", "--model hf:gpt2?n_layer=abc: n_layer=abc is not a size (a whole "
     "number >= 1); change the override"),
    ("hf:gpt2?n_layer=0", "--model hf:gpt2?n_layer=0: n_layer=0 is not a size (a whole number "
     ">= 1); change the override"),
    ("hf:llama?num_attention_heads=-2", "--model hf:llama?num_attention_heads=-2: "
     "num_attention_heads=-2 is not a size (a whole number >= 1); change the override"),
    ("hf:gpt2?n_embd=64.5", "--model hf:gpt2?n_embd=64.5: n_embd=64.5 is not a size (a whole "
     "number >= 1); change the override"),
    ("hf:gpt2?vocab_size=true", "--model hf:gpt2?vocab_size=true: vocab_size=true is not a size "
     "(a whole number >= 1); change the override"),
])
def test_hf_size_overrides_that_are_not_sizes_are_refused_before_torch(spec, line):
    """``n_layer=0`` used to record a model of no blocks; ``n_layer=abc`` reached transformers
    and came back "the factory raised ...; fix the factory" (the user wrote no factory)."""
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert str(info.value) == line


def test_a_model_file_that_is_not_python_is_named_so(tmp_path, monkeypatch):
    """``notpy.txt:build`` (the file exists) was read as module ``notpy``: "no module 'notpy'"."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notpy.txt").write_text("def build(): pass\n")
    fix = "pass the path of your .py file (path/to/file.py:factory) or package.module:factory"
    for spec, where in (("notpy.txt:build", "notpy.txt"), ("models/m.txt:build", "models/m.txt")):
        with pytest.raises(SpecError) as info:
            parse_spec(spec)
        assert str(info.value) == f"--model {spec}: {where} is not a .py file; {fix}"
    assert parse_spec("pkg.mod:build").kind == "module"  # no such file: a module name


_AUDIT = """
import sys
seen = []
def hook(event, args):
    if event == "subprocess.Popen" or (event == "import" and args[0] == "torch"):
        seen.append(event)
sys.addaudithook(hook)
from tracer.cli import app
try:
    code = app(["record", "--strategy", "ddp", "--model", sys.argv[1], "--out", sys.argv[2]],
               standalone_mode=False)
except SystemExit as exc:
    code = exc.code
except BaseException as exc:
    code = getattr(exc, "exit_code", repr(exc))
print(code, "torch" in sys.modules, sorted(set(seen)))
"""


@pytest.mark.integration
def test_missing_model_file_is_refused_before_torch_or_a_child(tmp_path):
    spec = f"{tmp_path}/missing.py:build"
    proc = subprocess.run([sys.executable, "-c", _AUDIT, spec, str(tmp_path / "out")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "2 False []", proc.stderr  # exit 2, no torch, no child
    assert proc.stderr.strip() == (f"tracer: --model {spec}: no such file {tmp_path}/missing.py; "
                                   "pass the path of your .py file")
    assert not (tmp_path / "out").exists()


@needs_hf
def test_hf_overrides_resize_the_config():
    from tracer.specload import check_spec

    spec = check_spec(RecordConfig(strategy="ddp", model="hf:gpt2?n_layer=3,n_embd=32", batch=4))
    assert (spec.model.config.n_layer, spec.model.config.n_embd) == (3, 32)
    assert len(spec.model.transformer.h) == 3
    llama = check_spec(RecordConfig(strategy="ddp", model="hf:llama?num_hidden_layers=1", batch=4))
    assert len(llama.model.model.layers) == 1


@needs_hf
@pytest.mark.parametrize("spec,line", [
    ("hf:gpt2?n_embd=65", "--model hf:gpt2?n_embd=65: GPT2LMHeadModel refused it: `embed_dim` "
     "must be divisible by num_heads (got `embed_dim`: 65 and `num_heads`: 2); change the "
     "override"),
    ("hf:llama?hidden_size=65", "--model hf:llama?hidden_size=65: LlamaConfig refused it: Class "
     "validation error for validator 'validate_architecture': ValueError: The hidden size (65) "
     "is not a multiple of the number of attention heads (2); change the override"),
    ("hf:gpt2?layer_norm_epsilon=abc", "--model hf:gpt2?layer_norm_epsilon=abc: "
     "layer_norm_epsilon=abc is not a number (GPT2Config's layer_norm_epsilon is float); change "
     "the override"),
    ("hf:gpt2?scale_attn_weights=3", "--model hf:gpt2?scale_attn_weights=3: "
     "scale_attn_weights=3 is not true or false (GPT2Config's scale_attn_weights is bool); "
     "change the override"),
])
def test_hf_overrides_transformers_refuses_name_the_override_not_a_factory(spec, line):
    """Was "the factory raised StrictDataclassFieldValidationError: Validation error for field
    'n_layer':; fix the factory" (cut at its first line; the user wrote no factory)."""
    from tracer.specload import check_spec

    with pytest.raises(SpecError) as info:
        check_spec(RecordConfig(strategy="ddp", model=spec, batch=4))
    assert str(info.value) == line


@needs_hf
def test_hf_float_fields_take_whole_numbers():
    from tracer.specload import check_spec

    spec = check_spec(RecordConfig(strategy="ddp", model="hf:gpt2?layer_norm_epsilon=1", batch=4))
    assert spec.model.config.layer_norm_epsilon == 1.0


@needs_hf
def test_hf_unknown_config_key_names_it_and_the_valid_ones():
    from tracer.specload import check_spec

    with pytest.raises(SpecError) as info:
        check_spec(RecordConfig(strategy="ddp", model="hf:gpt2?n_layers=3", batch=4))
    text = str(info.value)
    assert text.startswith("--model hf:gpt2?n_layers=3: GPT2Config has no key 'n_layers'; "
                           "valid keys: activation_function, ")
    assert ", n_embd, " in text and ", n_layer, " in text and "\n" not in text


@needs_hf
@pytest.mark.record
def test_hf_overrides_are_recorded_in_the_manifest(tmp_path):
    model = "hf:gpt2?n_layer=1"
    proc, _ = run_tracer(["--strategy", "ddp", "--model", model, "--batch", "4", "--warmup", "0",
                          "--active", "1", "--out", str(tmp_path)], REPO)
    assert proc.returncode == 0, proc.stderr
    m = json.loads((tmp_path / "ddp" / "manifest.json").read_text())["model"]
    assert m["spec"] == model
    # one GPT2Block of width 64: 12 h^2 + 13 h = 49,984 (attention 4h^2+4h, MLP 8h^2+5h,
    # two LayerNorms 4h), + the tied embedding 256 x 64, the positions 16 x 64 and ln_f 2 x 64
    assert m["num_params"] == 12 * 64 * 64 + 13 * 64 + 256 * 64 + 16 * 64 + 2 * 64

