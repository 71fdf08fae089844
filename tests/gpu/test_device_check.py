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
