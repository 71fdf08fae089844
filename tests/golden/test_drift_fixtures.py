"""analyzer drift on hand-built run directories (tests/golden/builders.py): exact answers."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from analyzer.compare import drift, kept
from analyzer.contract import schemas
from analyzer.contract.errors import BadInput
from tests.golden.builders import run_dir

# torch.testing.assert_close defaults, as published (https://pytorch.org/docs/stable/testing.html)
BF16_RTOL, BF16_ATOL = 1.6e-2, 1e-5

BASE = {"batch.x": [[0.25, -1.0]], "init.w": [1.0, 2.0], "grad.w": [1.0, -2.0, 0.5], "param.w": [1.0],
        "loss": [0.75, 0.5]}


def _by_name(result):
    return {t["tensor"]: t for t in result["tensors"]}


def test_identical_runs_are_bitwise(tmp_path):
    a = run_dir(tmp_path, "a", BASE)
    b = run_dir(tmp_path, "b", BASE)
    r = drift.drift(a, b)
    assert r["expectation"]["mode"] == "bitwise" and r["settings_differ"] == []
    assert r["ok"] and r["verdict"].startswith("bitwise identical: all 5 kept tensors")
    assert {t["status"] for t in r["tensors"]} == {"identical"}


def test_same_settings_any_difference_is_nondeterminism(tmp_path):
    a = run_dir(tmp_path, "a", BASE)
    b = run_dir(tmp_path, "b", {**BASE, "grad.w": [1.0, -2.0, 0.5 + 2.0 ** -20]})
    r = drift.drift(a, b)
    t = _by_name(r)
    assert not r["ok"] and r["verdict"].startswith("non-determinism: 1 of 5")
    assert "grad.w" in r["verdict"]
    assert t["grad.w"]["status"] == "non-determinism" and t["grad.w"]["limit"] == 0.0
    assert t["grad.w"]["max_abs_diff"] == 2.0 ** -20
    assert t["init.w"]["status"] == "identical"


def test_fp32_vs_bf16_uses_bf16_tolerance(tmp_path):
    a = run_dir(tmp_path, "a", BASE)
    new = {**BASE, "grad.w": [1.0078125, -2.0, 0.5], "param.w": [1.5]}  # bf16-exact values
    b = run_dir(tmp_path, "b", new, bf16=("grad.w", "param.w"), precision="bf16", torch_version="2.14.0")
    r = drift.drift(a, b)
    assert r["expectation"]["mode"] == "tolerance"
    tol = r["expectation"]["tolerance"]
    assert (tol["rtol"], tol["atol"], tol["precision"]) == (BF16_RTOL, BF16_ATOL, "bf16")
    assert "versions, precision differ:" in r["expectation"]["why"]
    assert {d["setting"]: (d["old"], d["new"]) for d in r["settings_differ"]} == {
        "versions": ({"torch": "2.13.0"}, {"torch": "2.14.0"}), "precision": ("fp32", "bf16")}
    t = _by_name(r)
    g = t["grad.w"]
    assert g["basis"] == "tensors" and g["max_abs_diff"] == 2.0 ** -7
    assert g["max_abs_ref"] == 2.0 and g["limit"] == pytest.approx(BF16_ATOL + BF16_RTOL * 2.0)
    assert g["rel_l2"] == pytest.approx(2.0 ** -7 / math.sqrt(1 + 4 + 0.25))
    assert g["status"] == "within tolerance"
    p = t["param.w"]
    assert p["max_abs_diff"] == 0.5 and p["status"] == "exceeds tolerance"
    assert not r["ok"] and "1 of 5" in r["verdict"] and "param.w" in r["verdict"]


def test_summaries_give_lower_bounds(tmp_path):
    a = run_dir(tmp_path, "a", BASE)
    b = run_dir(tmp_path, "b", {**BASE, "grad.w": [1.0, -2.25, 0.5]}, keep="summaries",
                precision="bf16")
    r = drift.drift(a, b)
    g = _by_name(r)["grad.w"]
    assert r["new"]["keep_tensors"] == "summaries" and g["basis"] == "summaries"
    # the minimum moved from -2 to -2.25: max |diff| >= 0.25 (here exactly 0.25)
    assert g["max_abs_diff"] == 0.25
    assert g["rel_l2"] == pytest.approx(abs(math.sqrt(1 + 2.25 ** 2 + 0.25) - math.sqrt(5.25)) / math.sqrt(5.25))
    assert g["status"] == "exceeds tolerance"  # 0.25 > 1e-5 + 1.6e-2 * 2


def test_bf16_read_exactly(tmp_path):
    d = run_dir(tmp_path, "a", {"grad.w": [1.0078125, -3.5, 0.0]}, bf16=("grad.w",))
    read = kept.read_safetensors(d / schemas.KEPT_TENSORS_NAME)
    dtype, shape, raw, values = read["grad.w"]
    assert dtype == "BF16" and shape == [3] and len(raw) == 6
    assert values.tolist() == [1.0078125, -3.5, 0.0]


def _flip_one_value(path, tensor: str, index: int, new_value: float) -> None:
    """Overwrite element ``index`` of an F32 tensor in place (offsets from the header)."""
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    start = 8 + n + json.loads(data[8:8 + n])[tensor]["data_offsets"][0] + 4 * index
    data[start:start + 4] = np.float32(new_value).tobytes()
    path.write_bytes(bytes(data))


@pytest.mark.integration
def test_tampered_tensor_is_named(tmp_path):
    a = run_dir(tmp_path, "a", BASE)
    b = run_dir(tmp_path, "b", BASE)
    _flip_one_value(b / schemas.KEPT_TENSORS_NAME, "grad.w", 1, -2.5)
    with pytest.raises(BadInput) as exc:
        drift.drift(a, b)
    assert exc.value.reason == "file_changed"
    assert exc.value.message == "tensor grad.w changed after the record (sha256 differs from kept.parquet)"
    assert exc.value.problems == []  # one changed tensor: said once, not again as a "further" problem
    proc = subprocess.run([sys.executable, "-m", "analyzer", "drift", str(a), str(b)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "grad.w changed after the record" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.count("changed after the record") == 1, proc.stderr  # printed once


def test_tampered_kept_table_is_named(tmp_path):
    a = run_dir(tmp_path, "a", BASE)
    (a / schemas.KEPT_NAME).write_bytes((a / schemas.KEPT_NAME).read_bytes() + b"x")
    with pytest.raises(BadInput, match="kept.parquet: sha256 differs from the manifest"):
        drift.drift(a, a)


@pytest.mark.integration
def test_cli_json_and_check(tmp_path):
    a = run_dir(tmp_path, "a", BASE)
    b = run_dir(tmp_path, "b", {**BASE, "loss": [0.75, 0.5 + 2.0 ** -10]})
    proc = subprocess.run([sys.executable, "-m", "analyzer", "drift", str(a), str(b), "--format", "json",
                           "--check"], capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr
    out = json.loads(proc.stdout)
    assert [t["tensor"] for t in out["tensors"] if not t["ok"]] == ["loss"]
    proc = subprocess.run([sys.executable, "-m", "analyzer", "drift", str(a), str(a)],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "OK bitwise identical" in proc.stdout
