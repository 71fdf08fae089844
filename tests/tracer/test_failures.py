"""Record faults: a raising, hanging or SIGKILLed rank and Ctrl-C end cleanly, name the rank,
leave no manifest and no process behind; a rerun into the same folder works; bad options."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from analyzer.contract import schemas
from analyzer.contract.tolerance import TOLERANCES
from tests.inputs import default_signals
from tests.tracer.helpers import (HANG_S, REPO, TAG_ENV, TINY, alive_with_tag, run_tracer,
                                  tensor_rel_l2)

pytestmark = pytest.mark.record
HANG_TIMEOUT_S = 20
"""The hang test's collective timeout: rank 0 waits this long (generous for a loaded machine:
a shorter one can fire at rendezvous before the injected hang)."""


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def _failed_record(tmp_path, inject: str, strategy: str = "ddp", extra: tuple[str, ...] = ()):
    args = ["--strategy", strategy, "--out", str(tmp_path), *extra] + TINY
    proc, tag = run_tracer(args, tmp_path, env_extra={"PARITYTRACE_INJECT": inject})
    assert proc.returncode == 1, proc.stderr
    assert not (tmp_path / strategy / schemas.MANIFEST_NAME).exists()
    assert alive_with_tag(tag) == []
    return _one_line(proc.stderr)


def test_raising_rank_is_named_and_a_rerun_into_the_folder_works(tmp_path):
    line = _failed_record(tmp_path, "raise@1:2")
    assert "rank 1 failed at step 2" in line and "injected failure" in line
    run_dir = tmp_path / "ddp"
    assert not list(run_dir.glob("rank*.trace.json.gz"))  # a failed rank exports no partial trace
    # A stale file from some older record, then a rerun into the same run dir: it succeeds,
    # the stale file is gone, the manifest lists exactly what is there. The rerun doubles as
    # the skip-grad-sync canary.
    (run_dir / "rank7.trace.json.gz").write_bytes(b"stale")
    proc, tag = run_tracer(["--strategy", "ddp", "--fault", "skip-grad-sync", "--out", str(tmp_path)]
                           + TINY, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not (run_dir / "rank7.trace.json.gz").exists()
    manifest = schemas.read_manifest(run_dir / schemas.MANIFEST_NAME)
    listed = sorted(f.path for f in manifest.files)
    assert listed == sorted(p.name for p in run_dir.iterdir() if p.name != schemas.MANIFEST_NAME)
    assert manifest.fault == "skip-grad-sync"
    numerics = pd.read_parquet(run_dir / schemas.NUMERICS_NAME)
    # Step-0 forward is untouched (same weights, same rows); gradients were never averaged.
    assert max(tensor_rel_l2(numerics, "activation").values()) == 0.0
    assert max(tensor_rel_l2(numerics, "grad").values()) > TOLERANCES["fp32"].rtol * 1000
    assert alive_with_tag(tag) == []


def test_hanging_rank_is_named_within_the_timeout(tmp_path):
    """The record ends through its own collective timeout ("timed out"), not never."""
    line = _failed_record(tmp_path, "hang@1:1", strategy="fsdp2",
                          extra=("--timeout", str(HANG_TIMEOUT_S)))
    assert "rank 1 hung" in line and "timed out" in line


def test_sigkilled_rank_is_named(tmp_path):
    line = _failed_record(tmp_path, "sigkill@1:1")
    assert "rank 1 was killed by SIGKILL" in line


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_stopping_the_launcher_stops_every_worker(tmp_path, sig):
    """Ctrl-C: the launcher kills its workers and exits 130. SIGKILL (no clean-up possible):
    the workers die with it (PR_SET_PDEATHSIG). Either way no process and no manifest remain."""
    tag = "stop-" + os.urandom(8).hex()
    env = dict(os.environ, PARITYTRACE_INJECT="hang@1:1", TMPDIR=str(tmp_path), **{TAG_ENV: tag})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    parent = subprocess.Popen([sys.executable, "-m", "tracer", "record", "--strategy", "ddp", "--out",
                               str(tmp_path), "--timeout", "120"] + TINY,
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, preexec_fn=default_signals)
    try:
        # until both ranks train (their heartbeat files say a step); no event to wait on
        deadline = time.monotonic() + HANG_S
        while [h.read_text().split()[-1:] for h in tmp_path.glob("tracer-ddp-*/rank*.hb")] \
                != [["step"], ["step"]]:
            assert parent.poll() is None and time.monotonic() < deadline, "workers never trained"
            time.sleep(0.05)
        parent.send_signal(sig)
        _, stderr = parent.communicate(timeout=HANG_S)
    finally:
        if parent.poll() is None:
            parent.kill()
    if sig == signal.SIGINT:
        assert parent.returncode == 130
        assert "interrupted" in _one_line(stderr)
    else:
        assert parent.returncode == -signal.SIGKILL
    assert alive_with_tag(tag) == []
    assert not (tmp_path / "ddp" / schemas.MANIFEST_NAME).exists()


@pytest.mark.parametrize("args, expected", [
    (["--batch", "7"], "--batch 7"),
    (["--hidden", "abc"], "--hidden"),
    (["--strategy", "ring"], "--strategy ring"),
    (["--fault", "skip-grad-sync", "--strategy", "fsdp"], "only ddp"),
    (["--wait", "0"], "--wait 0"),
    (["--no-such-option"], "--no-such-option"),
    (["--strategy", "fsdp2", "--backward-prefetch", "post"], "--backward-prefetch post"),
])
def test_bad_options_one_line_exit_2(tmp_path, args, expected):
    proc, _ = run_tracer(args + ["--out", str(tmp_path)], tmp_path)
    assert proc.returncode == 2
    line = _one_line(proc.stderr)
    assert line.startswith("tracer: ") and expected in line
    assert not any(tmp_path.iterdir())  # nothing recorded


def test_unwritable_out_is_bad_input(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    # --out under a file: no check of the path sees it, creating the folder fails (OSError)
    proc, _ = run_tracer(["--strategy", "ddp", "--out", str(blocker / "sub")] + TINY, tmp_path)
    assert proc.returncode == 2
    line = _one_line(proc.stderr)
    assert str(blocker / "sub" / "ddp") in line and "cannot prepare the run directory" in line
