"""FSDP2 explicit prefetch depth 1 and 2 with reshard_after_forward=2 on 4 ranks (issue 45),
recorded, reported and checked for parity end to end: one ``--sweep fsdp2-prefetch=1,2``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from analyzer.contract import schemas
from tests.tracer.helpers import REPO, run_tracer


@pytest.mark.record
def test_prefetch_depth_and_partial_reshard_record_report_and_pass_parity(tmp_path):
    out = tmp_path / "t"
    proc, _ = run_tracer(["--strategy", "fsdp2", "--nproc", "4", "--sweep", "fsdp2-prefetch=1,2",
                          "--reshard-after-forward-size", "2", "--hidden", "32", "--layers", "3",
                          "--seq", "8", "--batch", "4", "--active", "1", "--out", str(out)],
                         cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    arms = ["fsdp2-prefetch=1", "fsdp2-prefetch=2"]
    for depth, arm in enumerate(arms, start=1):
        options = json.loads((out / arm / schemas.MANIFEST_NAME).read_text())["strategy_options"]
        # read back from the FSDPModule state, not the options as asked
        assert options["fsdp2_prefetch"] == {"forward": depth, "backward": depth}
        assert options["reshard_after_forward"] == 2
    report = subprocess.run([sys.executable, "-m", "analyzer", "report", str(out)], cwd=REPO,
                            capture_output=True, text=True)
    assert report.returncode == 0, report.stderr[-3000:]
    runs = {r["name"]: r for r in json.loads((out / "report" / "report.json").read_text())["runs"]}
    for depth, arm in enumerate(arms, start=1):
        assert runs[arm]["parity"]["status"] == "pass", runs[arm]["parity"]["reason"]
        units = {(u["phase"], u["unit"]): u for u in runs[arm]["prefetch"]["units"]}
        forward = [units[("forward", f"layers.{k}")]["ahead_units"] for k in range(3)]
        assert forward == [0, 1, depth]  # layers.2: issued `depth` units before its use
        # after forward each unit holds a 2-rank shard: backward gathers over 2, forward over 4
        assert {u["group_size"] for (phase, _), u in units.items() if phase == "backward"} == {2}
        assert {u["group_size"] for (phase, _), u in units.items() if phase == "forward"} == {4}
    md = (out / "report" / "report.md").read_text()
    assert "| forward | layers.2 | 100.0 % | 2 | 4 |" in md
