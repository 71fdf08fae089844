"""The manifest's model / batch sizes for hf: and custom models (tracer/manifest.py model_sizes)."""
from types import SimpleNamespace

from tracer.manifest import model_sizes


def _cfg(model):
    return SimpleNamespace(model=model, hidden=32, layers=2)


def test_hf_llama_sizes_come_from_the_built_config():
    config = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    assert model_sizes(_cfg("hf:llama?layers=2,hidden=64,heads=4,seq=16"), config) == (64, 2)


def test_hf_gpt2_sizes_come_from_its_own_keys():
    assert model_sizes(_cfg("hf:gpt2"), {"n_embd": 48, "n_layer": 3}) == (48, 3)


def test_reference_sizes_are_the_options():
    assert model_sizes(_cfg("reference"), None) == (32, 2)


def test_custom_model_without_sizes_keeps_zero():
    assert model_sizes(_cfg("mypkg.models:build"), {"hidden_size": 64}) == (0, 0)
