"""Model code that misbehaves where no ``except`` sees it (issue 33 items 6, 7, 17): it ends
its process with status 0 (``sys.exit(0)``, ``os._exit(0)``) in the factory or in a rank,
hangs in the factory, exits after printing its own error, or prints a line that reads like
the tracer's. Each ends in one line and a non-zero exit, leaves no process behind, and a run
it cut short reads as incomplete (``analyzer gate`` refuses it), or, when it never started,
nothing written. Oracles: the exit status, the process table, the run dir's files and the
analyzer's gate (an independent reader)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from analyzer.contract import schemas
from tests.inputs import copy_run
from tests.inputs import default_signals
from tests.tracer.helpers import HANG_S, REPO, TAG_ENV, TINY, alive_with_tag, run_tracer
from tests.tracer.specs.unruly import ARRIVED_ENV

pytestmark = pytest.mark.record
SPECS = "tests.tracer.specs.unruly"
BATCH = ["--batch", "4", "--wait", "1", "--warmup", "0", "--active", "1"]


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def _gate(out) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analyzer", "gate", str(out)], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))


@pytest.mark.parametrize("spec, says", [
    ("sys_exit_in_rank1", "rank 1 failed at step 0: the model code exited with status 0 (sys.exit) "
                          "during the record"),
    ("os_exit_in_rank1", "rank 1: the model code exited with status 0 during the record"),
    ("os_exit_in_every_rank", ": the model code exited with status 0 during the record, at '0 step'"),
    ("library_gives_up_in_rank1", "rank 1 exited with code 1 at '0 step': FATAL: the kernel library "
                                  "gave up: shape mismatch"),
])
def test_model_code_ending_a_rank_fails_the_record_and_the_gate(tmp_path, ddp_run, spec, says):
    """Over a complete earlier run of the same name: before, ``os._exit(0)`` in a rank ended
    the record with status 0 and ``analyzer gate`` passed; a library's own error line was
    reported as 'wrote no error'."""
    out = tmp_path / "out"
    copy_run(ddp_run, out / "ddp")
    assert _gate(out).returncode == 0  # the earlier run passes
    proc, tag = run_tracer(["--strategy", "ddp", "--model", f"{SPECS}:{spec}", "--out", str(out),
                            "--timeout", "20"] + BATCH, tmp_path)
    assert proc.returncode == 1, proc.stderr
    line = _one_line(proc.stderr)
    assert line.startswith("tracer: record failed: ddp: ") and says in line, line
    assert proc.stdout == ""  # nothing recorded, nothing said recorded
    run_dir = out / "ddp"
    created = json.loads((ddp_run / schemas.MANIFEST_NAME).read_text())["created_utc"]
    assert line.endswith(  # the finished run it replaced, and how to clean up
        f"no manifest written; {run_dir} is incomplete (the finished ddp run of 2 ranks "
        f"recorded {created[:10]} {created[11:16]} UTC it held was removed when this record "
        f"started): record it again, or delete the folder {run_dir}"), line
    assert not (run_dir / schemas.MANIFEST_NAME).exists()
    assert (run_dir / schemas.RECORDING_NAME).exists()  # incomplete
    gate = _gate(out)
    assert gate.returncode == 2 and "incomplete run" in gate.stderr, gate.stderr
    assert alive_with_tag(tag) == []


@pytest.mark.parametrize("spec, says", [
    ("sys_exit_in_factory", "the factory exited with status 0 (sys.exit)"),
    ("os_exit_in_factory", "the model code exited with status 0 during the spec check"),
])
def test_model_code_ending_the_spec_check_is_one_line_and_nothing_written(tmp_path, spec, says):
    """Before: the launcher ran the factory itself, so ``os._exit(0)`` there ended
    ``tracer record`` with status 0 and no word."""
    out = tmp_path / "out"
    proc, tag = run_tracer(["--strategy", "ddp", "--model", f"{SPECS}:{spec}", "--out", str(out)]
                           + BATCH, tmp_path)
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert line.startswith(f"tracer: --model {SPECS}:{spec}: ") and says in line, line
    assert proc.stdout == "" and not out.exists()
    assert alive_with_tag(tag) == []


def test_hanging_factory_ends_at_the_timeout(tmp_path):
    """Before: the spec check ran in the launcher before any watchdog, ``--timeout`` did not
    apply and the record hung for good."""
    out = tmp_path / "out"
    proc, tag = run_tracer(["--strategy", "ddp", "--model", f"{SPECS}:hangs_in_factory", "--out",
                            str(out), "--timeout", "3"] + BATCH, tmp_path)
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert "did not finish within --timeout 3s" in line and "hangs_in_factory" in line, line
    assert not out.exists()
    assert alive_with_tag(tag) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGQUIT], ids=["sigterm", "sigquit"])
def test_stop_signal_during_a_hanging_factory_is_one_line_exit_130(tmp_path, sig):
    """Before: SIGTERM while the factory ran ended the launcher by the signal (143 in a shell),
    without a line; SIGQUIT dumped core and skipped every clean-up."""
    out = tmp_path / "out"
    arrived = tmp_path / "arrived"
    tag = "unruly-" + os.urandom(8).hex()
    env = dict(os.environ, TMPDIR=str(tmp_path), **{TAG_ENV: tag, ARRIVED_ENV: str(arrived)})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    launcher = subprocess.Popen([sys.executable, "-m", "tracer", "record", "--strategy", "ddp", "--model",
                                 f"{SPECS}:hangs_in_factory", "--out", str(out), "--timeout", "600"] + BATCH,
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + HANG_S
        while not arrived.exists() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # until the factory runs
        assert arrived.exists(), "the factory never ran"
        launcher.send_signal(sig)
        stdout, stderr = launcher.communicate(timeout=HANG_S)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, stderr
    assert "interrupted" in _one_line(stderr) and stdout == ""
    assert not out.exists()
    assert alive_with_tag(tag) == []


def test_model_output_is_not_the_tracers(tmp_path):
    """A model printing ``recorded traces/ddp`` in its factory and forward: stdout holds only
    the tracer's line for the run it wrote. Before: the factory's print came out of the
    launcher's spec check, as if a run had been recorded there."""
    out = tmp_path / "out"
    proc, tag = run_tracer(["--strategy", "ddp", "--model", f"{SPECS}:prints_recorded", "--out", str(out)]
                           + BATCH, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"recorded {out / 'ddp'}"]
    assert (out / "ddp" / schemas.MANIFEST_NAME).exists()
    assert alive_with_tag(tag) == []


def test_model_output_under_torchrun_goes_to_stderr(tmp_path):
    """Under torchrun the rank's stdout is the user's: model prints go to stderr, stdout holds
    rank 0's ``recorded`` line alone. Before: the model's fake lines came first."""
    out = tmp_path / "out"
    proc, tag = run_tracer(["--strategy", "ddp", "--model", f"{SPECS}:prints_recorded", "--out", str(out)]
                           + BATCH, tmp_path,
                           module=[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                                   "-m", "tracer", "record"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [f"recorded {out / 'ddp'}"]
    assert "recorded traces/fsdp" in proc.stderr  # the model's own line, where it belongs
    assert alive_with_tag(tag) == []


def test_read_only_out_under_torchrun_refused_before_the_process_group(tmp_path):
    """Every rank refuses a read-only ``--out`` in one line before ``init_process_group``
    (before: rank 0 found out after the process group and a barrier, or, as root, wrote into a
    folder marked read-only). Nothing is written there."""
    out = tmp_path / "ro"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    out.chmod(0o555)
    try:
        proc, tag = run_tracer(["--strategy", "ddp", "--out", str(out)] + TINY, tmp_path,
                               module=[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                                       "-m", "tracer", "record"])
        assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    finally:
        out.chmod(0o755)
    assert proc.returncode != 0
    refusals = [ln for ln in proc.stderr.splitlines() if "cannot prepare the run directory" in ln]
    # one line per rank that got to say it: the first to exit 2 makes torchrun stop the other,
    # on a loaded machine sometimes before that one has printed its own (seen in a full run)
    assert 1 <= len(refusals) <= 2, proc.stderr[-3000:]
    assert all(f"{out / 'ddp'}: cannot prepare the run directory ({out} is marked read-only)" in ln
               for ln in refusals)
    assert "init_process_group" not in proc.stderr
    assert alive_with_tag(tag) == []
