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


def _listening(pid: int) -> list[tuple[str, int]]:
    import psutil

    try:
        return [(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def test_the_built_in_launchers_rendezvous_listens_on_loopback_only(tmp_path):
    """A one-machine record (the built-in launcher): while its ranks run, every socket they
    listen on (rank 0's TCPStore, gloo's pairs) is on 127.0.0.1, none on every interface; rank
    0's store is among them (on MASTER_PORT). Rank 1 is held at step 1 (``PARITYTRACE_INJECT``)
    so the ranks are looked at mid-record, then the record is stopped."""
    import signal
    import time

    import psutil

    from tests.inputs import default_signals
    from tests.tracer.helpers import REPO, TAG_ENV

    tag = "rdv-" + os.urandom(8).hex()
    env = dict(os.environ, PARITYTRACE_INJECT="hang@1:1", TMPDIR=str(tmp_path), **{TAG_ENV: tag})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    launcher = subprocess.Popen([sys.executable, "-m", "tracer", "record", "--strategy", "ddp", "--out",
                                 str(tmp_path), "--timeout", "120"] + TINY, cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:  # both ranks at a step (heartbeat files)
            phases = [h.read_text().split()[-1:] for h in tmp_path.glob("tracer-ddp-*/rank*.hb")]
            if phases == [["step"], ["step"]]:
                break
            time.sleep(0.2)
        else:
            pytest.fail("workers never reached a step")
        ranks = {}
        for p in psutil.process_iter(["pid"]):
            try:
                penv = p.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if penv.get(TAG_ENV) == tag and "RANK" in penv:
                ranks[int(penv["RANK"])] = (p.pid, int(penv["MASTER_PORT"]))
        assert sorted(ranks) == [0, 1], ranks
        listening = {r: _listening(pid) for r, (pid, _) in ranks.items()}
        assert ("127.0.0.1", ranks[0][1]) in listening[0], listening
        assert all(ip in ("127.0.0.1", "::1") for socks in listening.values() for ip, _ in socks), listening
    finally:
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.communicate(timeout=HANG_S)
        finally:
            if launcher.poll() is None:
                launcher.kill()
    assert alive_with_tag(tag) == []
