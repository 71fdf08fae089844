"""scripts/device_check.sh on CPU (DEVICE=cpu, world size 1, tiny shapes): the same script the
GPU check runs, end to end: eight run dirs, the big model's baseline dropped, the report
printed. Slow-ish (~8 records of a tiny model), so one run shared by the assertions."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.record

REPO = Path(__file__).resolve().parents[2]
STRATEGIES = ("single", "ddp", "fsdp", "fsdp2")


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    out = tmp_path_factory.mktemp("device_check")
    env = dict(os.environ, DEVICE="cpu", NPROC="1", HIDDEN="16", LAYERS="1", SEQ="4", BATCH="2",
               BIG_HIDDEN="32", BIG_LAYERS="1", BIG_SEQ="4", BIG_BATCH="2", STEPS_ACTIVE="1")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "device_check.sh"), str(out)], env=env,
                          capture_output=True, text=True)
    return out, proc


def test_script_succeeds_and_prints_the_report(check):
    out, proc = check
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "device_check: report exit code 0" in proc.stdout
    assert (out / "report" / "report.md").read_text() in proc.stdout  # the report, printed whole


def test_every_strategy_recorded_twice_with_the_requested_shapes(check):
    out, _ = check
    for name, hidden, precision in (("small", 16, "fp32"), ("big", 32, "bf16")):
        for s in STRATEGIES:
            m = json.loads((out / "traces" / f"{name}-{s}" / "manifest.json").read_text())
            assert (m["strategy"], m["model"]["hidden"], m["precision"]) == (s, hidden, precision)
            assert m["world_size"] == 1
    big = list((out / "traces").glob("big-*/baseline.safetensors"))
    small = list((out / "traces").glob("small-*/baseline.safetensors"))
    assert big == [] and len(small) == 4
    assert json.loads((out / "versions.json").read_text())["torch"]


def test_usage_error(tmp_path):
    proc = subprocess.run(["bash", str(REPO / "scripts" / "device_check.sh")], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_projection_step_writes_memory_beside_the_arithmetic(check):
    """The projection step (issue 44): world 8 fsdp2 and hsdp 2x4 projected on this device, each
    role's parameter / gradient / optimizer bytes equal to the sharding arithmetic, and the
    section for bench/RESULTS.md written and printed."""
    out, proc = check
    rows = json.loads((out / "projection-memory.json").read_text())
    assert sorted((r["run"], r["strategy"], r["mesh"], r["fake_tensors"]) for r in rows) == [
        ("fsdp2-w8-h64", "fsdp2", None, False), ("fsdp2-w8-h64-fake", "fsdp2", None, True),
        ("hsdp-2x4-h64", "hsdp", "2x4", False)]
    for r in rows:
        assert (r["world_size"], r["rank"]) == (8, 0)
        assert r["measured_bytes"] | r["expected_bytes"] == r["measured_bytes"], r
        assert (r["device"], r["precision"], r["cuda_max_allocated_bytes"]) == ("cpu", "bf16", None)
        assert (r["live_peak_bytes"] is not None) == r["fake_tensors"]
    md = (out / "projection-memory.md").read_text()
    assert md.startswith("### Projected per-rank memory, world 8, hidden 64, bf16, on cpu (issue 44), ")
    assert md.count("| yes, to the byte |") == 3 and md in proc.stdout
