"""torchrun launches: one node with two ranks, and two nodes on loopback with one rank each."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from analyzer.contract import schemas
from analyzer.contract.tolerance import TOLERANCES
from tests.tracer.helpers import HANG_S, TINY, alive_with_tag, run_tracer, tensor_rel_l2
from tracer.launch import free_port

pytestmark = pytest.mark.record
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _check(run_dir, nnodes):
    manifest = schemas.read_manifest(run_dir / schemas.MANIFEST_NAME)
    assert manifest.launch.method == "torchrun"
    assert manifest.launch.nnodes == nnodes and manifest.world_size == 2
    assert sorted(p.name for p in run_dir.glob("rank*.trace.json.gz")) == [
        "rank0.trace.json.gz", "rank1.trace.json.gz"]
    return manifest, pd.read_parquet(run_dir / schemas.NUMERICS_NAME)


def test_torchrun_one_node_bf16_within_documented_tolerance_rank0_says_where(tmp_path):
    """torchrun launch, and the bf16 policy (one record serves both: the autocast policy is the
    same code for every strategy and launcher). Global rank 0, and only it, prints where the
    run went (README's torchrun example: OUT/NAME, default traces/<strategy>)."""
    proc, tag = run_tracer(["record", "--strategy", "fsdp", "--precision", "bf16", "--out", str(tmp_path)]
                           + TINY, tmp_path, module=TORCHRUN + ["--standalone", "--nproc_per_node", "2", "-m", "tracer"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [ln for ln in proc.stdout.splitlines() if "recorded" in ln] == [f"recorded {tmp_path / 'fsdp'}"]
    manifest, numerics = _check(tmp_path / "fsdp", nnodes=1)
    assert not (tmp_path / "fsdp" / schemas.RECORDING_NAME).exists()
    assert not (tmp_path / "fsdp" / schemas.LOCK_NAME).exists()
    assert alive_with_tag(tag) == []
    rtol = TOLERANCES["bf16"].rtol
    assert manifest.precision == "bf16" and manifest.tolerance.rtol == rtol
    grads = tensor_rel_l2(numerics, "grad")
    assert max(grads.values()) < rtol
    # bf16 rounding is visible (the policy is really applied), far above fp32's ~1e-7.
    assert max(grads.values()) > 1e-4


def test_torchrun_two_nodes_on_loopback(tmp_path):
    port = str(free_port())
    common = ["--nnodes", "2", "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
              "--master_port", port]
    args = ["record", "--strategy", "ddp", "--out", str(tmp_path), "--timeout", "60"] + TINY
    env = dict(os.environ)
    node1 = subprocess.Popen(TORCHRUN + common + ["--node_rank", "1", "-m", "tracer"] + args,
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=env)
    try:
        proc, _ = run_tracer(args, tmp_path, module=TORCHRUN + common + ["--node_rank", "0", "-m", "tracer"])
        _, err1 = node1.communicate(timeout=HANG_S)
    finally:
        if node1.poll() is None:
            node1.kill()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert node1.returncode == 0, err1[-3000:]
    _, numerics = _check(tmp_path / "ddp", nnodes=2)
    assert max(tensor_rel_l2(numerics, "grad").values()) < 1e-5
