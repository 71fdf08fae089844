"""The torchtitan recipe (examples/torchtitan_llama3.py, docs/howto/your-model.md "A torchtitan
model"), tested with a stand-in of ``torchtitan.models.llama3`` (tests/tracer/specs/
titan_standin.py): torchtitan 0.3.0 does not train on CPU, and paritytrace does not require it.

Oracles: the stand-in's own module tree (its blocks are the FSDP units, its decoder is called
with positions and masks), and for the record the analyzer's gate.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.tracer.helpers import REPO, run_tracer
from tracer.config import RecordConfig
from tracer.modelspec import SpecError
from tracer.specload import check_spec
from tracer.strategies import unit_names

STANDIN = "tests.tracer.specs.titan_standin:build"
RECIPE = str(REPO / "examples" / "torchtitan_llama3.py") + ":build"


def test_recipe_wraps_a_titan_decoder_with_its_blocks_as_units():
    spec = check_spec(RecordConfig(strategy="fsdp2", model=STANDIN, batch=4))
    assert unit_names(spec.model, spec) == ["titan.layers.0", "titan.layers.1"]
    assert spec.tp_plan is None  # fused q / k / v: no colwise split
    x, y = spec.make_batch(4, 0)
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    inner = spec.model.titan
    positions = torch.arange(16).expand(4, -1)
    assert torch.equal(spec.model(x), inner(x, positions, inner.get_attention_masks(positions)))
    assert spec.config == {"torchtitan": "llama3:debugmodel", "layers": 2, "vocab_size": 128,
                           "seq": 16}


def test_recipe_without_torchtitan_is_one_line_naming_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchtitan", None)  # absent, even where it is installed
    with pytest.raises(SpecError) as info:
        check_spec(RecordConfig(strategy="fsdp2", model=RECIPE, batch=4))
    assert str(info.value) == ("torchtitan is not installed; pip install torchtitan==0.3.0 "
                               "triton, on a CUDA machine (torchtitan's attention has no CPU "
                               "backward)")


@pytest.mark.record
def test_recipe_on_the_standin_passes_parity_under_fsdp2(tmp_path):
    proc, _ = run_tracer(["--strategy", "fsdp2", "--model", STANDIN, "--batch", "4", "--warmup",
                          "0", "--active", "1", "--out", str(tmp_path)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    gate = subprocess.run([sys.executable, "-m", "analyzer", "gate", str(tmp_path)],
                          capture_output=True, text=True)
    assert gate.returncode == 0 and gate.stdout.startswith("PASS fsdp2: pass"), gate.stdout
