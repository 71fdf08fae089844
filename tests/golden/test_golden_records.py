"""Golden baselines on real tiny records (issue 9 "Done when"). Oracles: hashlib over the stored
tensor bytes, numpy over the tensors read with safetensors' own numpy loader, the published
torch.testing tolerances."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from analyzer.compare import drift
from analyzer.contract import schemas
from tests.golden.conftest import TINY
from tests.tracer.helpers import run_tracer

pytestmark = pytest.mark.record

BF16_RTOL, BF16_ATOL = 1.6e-2, 1e-5  # torch.testing.assert_close defaults for bfloat16


def _drift_json(old, new, *extra):
    proc = subprocess.run([sys.executable, "-m", "analyzer", "drift", str(old), str(new), "--format", "json",
                           *extra], capture_output=True, text=True)
    return proc, (json.loads(proc.stdout) if proc.returncode in (0, 3) else None)


def _tensor_shas(run) -> dict[str, str]:
    """sha256 of each tensor's bytes, via safetensors' numpy loader (all tensors are F32 / F64)."""
    return {k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()
            for k, v in load_file(str(run / schemas.KEPT_TENSORS_NAME)).items()}


def test_kept_files_and_manifest(golden_root):
    run = golden_root / "a"
    m = json.loads((run / schemas.MANIFEST_NAME).read_text())
    files = {f["path"]: f for f in m["files"]}
    for name in (schemas.KEPT_TENSORS_NAME, schemas.KEPT_NAME):
        assert files[name]["sha256"] == hashlib.sha256((run / name).read_bytes()).hexdigest()
    assert m["keep_tensors"] == "full"
    tensors = load_file(str(run / schemas.KEPT_TENSORS_NAME))
    groups = {k.split(".", 1)[0] for k in tensors}
    assert groups == {"batch", "init", "grad", "param", "loss"}  # no activations kept
    assert tensors["batch.x"].shape == (4, 8, 32) and tensors["loss"].shape == (2,)
    assert not any(p.name.startswith(".") for p in run.iterdir())  # transient files removed


def test_identical_settings_bitwise_and_drift_says_so(golden_root):
    a, b = golden_root / "a", golden_root / "b"
    assert (a / schemas.KEPT_TENSORS_NAME).read_bytes() == (b / schemas.KEPT_TENSORS_NAME).read_bytes()
    proc, out = _drift_json(a, b, "--check")
    assert proc.returncode == 0, proc.stderr
    assert out["expectation"]["mode"] == "bitwise" and out["settings_differ"] == []
    assert out["ok"] and out["verdict"].startswith("bitwise identical")
    assert len(out["tensors"]) == len(_tensor_shas(a))
    assert all(t["bitwise_equal"] and t["max_abs_diff"] == 0 for t in out["tensors"])


def test_golden_reuses_batch_and_initial_state(golden_root):
    a, c = _tensor_shas(golden_root / "a"), _tensor_shas(golden_root / "c")
    reused = [k for k in a if k.startswith(("batch.", "init."))]
    assert len(reused) == 2 + 16  # x, y and 8 parameters per layer x 2 layers
    assert all(a[k] == c[k] for k in reused)
    g = json.loads((golden_root / "c" / schemas.MANIFEST_NAME).read_text())["golden"]
    a_id = json.loads((golden_root / "a" / schemas.MANIFEST_NAME).read_text())["run_id"]
    assert g["run_id"] == a_id and g["batch_sha256_equal"] and g["init_sha256_equal"]


def test_fp32_vs_bf16_drift_per_tensor(golden_root):
    a, c = golden_root / "a", golden_root / "c"
    proc, out = _drift_json(a, c)
    assert proc.returncode == 0, proc.stderr
    exp = out["expectation"]
    assert exp["mode"] == "tolerance"
    assert (exp["tolerance"]["rtol"], exp["tolerance"]["atol"]) == (BF16_RTOL, BF16_ATOL)
    differ = {d["setting"]: (d["old"], d["new"]) for d in out["settings_differ"]}
    assert differ["precision"] == ("fp32", "bf16")
    assert differ["world_size"] == (1, 2) and differ["sharding"][1]["strategy"] == "ddp"
    ta, tc = load_file(str(a / schemas.KEPT_TENSORS_NAME)), load_file(str(c / schemas.KEPT_TENSORS_NAME))
    rows = {t["tensor"]: t for t in out["tensors"]}
    moved = 0
    for name, t in rows.items():
        d = tc[name].astype(np.float64) - ta[name].astype(np.float64)
        mad, mar = float(np.abs(d).max()), float(np.abs(ta[name]).max())
        assert t["max_abs_diff"] == pytest.approx(mad, rel=1e-12, abs=0)
        assert t["limit"] == pytest.approx(BF16_ATOL + BF16_RTOL * mar)
        assert t["status"] == ("identical" if mad == 0 else
                               "within tolerance" if mad <= BF16_ATOL + BF16_RTOL * mar else "exceeds tolerance")
        moved += mad > 0
    assert moved >= 16  # bf16 autocast changes every gradient
    assert all(rows[k]["status"] == "identical" for k in rows if k.startswith(("batch.", "init.")))
    # the distributed bf16 run against the golden tensors, from its numerics
    assert out["golden"]["batch_sha256_equal"] and out["golden"]["distributed"]["tensors"] == 32


def test_tampered_kept_tensor_is_named(golden_root, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(golden_root / "b", copy)
    path = copy / schemas.KEPT_TENSORS_NAME
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    start = 8 + n + json.loads(data[8:8 + n])["grad.layers.1.mlp.2.weight"]["data_offsets"][0]
    value = np.frombuffer(bytes(data[start:start + 4]), "<f4")[0]
    data[start:start + 4] = np.float32(value + 1.0).tobytes()  # one value changed
    path.write_bytes(bytes(data))
    proc, _ = _drift_json(golden_root / "a", copy)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1  # one line: the one tampered tensor, said once
    assert "tensor grad.layers.1.mlp.2.weight changed after the record" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_golden_refuses_other_shapes(golden_root, tmp_path):
    args = ["--strategy", "single", *TINY, "--hidden", "16", "--golden", str(golden_root / "a"),
            "--out", str(tmp_path)]
    proc, _ = run_tracer(args, cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--hidden 32" in lines[0] and "--hidden 16" in lines[0]
    assert not (tmp_path / "single").exists()  # refused before anything was written


def test_summaries_only(golden_root, tmp_path):
    proc, _ = run_tracer(["--strategy", "single", *TINY, "--keep-tensors", "summaries",
                          "--out", str(tmp_path), "--name", "s"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = tmp_path / "s"
    assert not (s / schemas.KEPT_TENSORS_NAME).exists() and (s / schemas.KEPT_NAME).exists()
    out = drift.drift(golden_root / "a", s)
    assert out["new"]["keep_tensors"] == "summaries" and out["ok"]
    assert {t["basis"] for t in out["tensors"]} == {"sha256"}  # same settings: equal sha256
    proc, _ = run_tracer(["--strategy", "single", *TINY, "--golden", str(s), "--out", str(tmp_path),
                          "--name", "t"], cwd=tmp_path)
    assert proc.returncode == 2 and "--keep-tensors full" in proc.stderr


def test_report_shows_baseline_drift_and_does_not_rank(golden_root, tmp_path):
    root = shutil.copytree(golden_root, tmp_path / "traces")  # the report's caches land there
    proc = subprocess.run([sys.executable, "-m", "analyzer", "report", str(root), "--out",
                           str(tmp_path), "--format", "json,md"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads((tmp_path / "report.json").read_text())
    # three commands, three experiments: the one with a distributed run is ranked alone
    rk = rep["ranking"]
    assert rk["order"] == ["c"] and sorted(rk["descriptive"]) == ["a", "b"] and rk["pairs"] == []
    assert any("differ in precision" in w for w in rep["settings_warnings"])
    bd = rep["baseline_drift"]
    assert bd["reference"] == "a"
    [c] = bd["comparisons"]  # fp32 group (a, b) vs bf16 group (c)
    assert (c["old"], c["new"]) == ("a", "c") and "bf16 precision tolerance" in c["expectation"]["why"]
    assert [d["setting"] for d in c["settings_differ"]][:1] == ["precision"]
    md = (tmp_path / "report.md").read_text()
    assert "## Baseline drift" in md and "| a | c | precision fp32 -&gt; bf16" in md  # markdown.escape writes ">" as an entity (renders "->")
