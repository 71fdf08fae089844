"""No tracebacks left (issue 17, item 9): every way a record can end badly ends with one line,
the documented exit code, no worker or staging folder behind, and no file that looks complete.

Oracles: the process table (psutil, processes tagged through their environment), the folder
listing, the exit status and stderr as the user sees them; disk full is a real full tmpfs where
the machine allows a private mount, and an injected ENOSPC in the writers' own exception forms
(copied from what pyarrow and safetensors raise on a full tmpfs) otherwise.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from analyzer.contract import schemas
from tests.inputs import default_signals
from tests.tracer.helpers import HANG_S, REPO, TAG_ENV, TINY, alive_with_tag, run_tracer
from tracer import baseline
from tracer.config import MAX_TIMEOUT_S, MIN_TIMEOUT_S, RecordConfig
from tracer.rundir import STAGING_PREFIX

pytestmark = pytest.mark.record
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "tracer"]  # --standalone: a free port, so parallel test workers do not meet
SHORT = ["--wait", "1", "--warmup", "0", "--active", "1"]  # two steps: the least a record runs
TRACER_FRAME = f'File "{REPO / "tracer"}'  # a traceback line inside tracer's own code


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def _staging(out) -> list:
    return [p for p in out.rglob(f"{STAGING_PREFIX}*")]


# -- disk full ---------------------------------------------------------------------------------

def _tiny_baseline():
    cfg = RecordConfig(strategy="single", device="cpu", hidden=8, layers=1, batch=2, seq=2, active=1, warmup=0)
    return baseline.compute_baseline(cfg, "cpu")


def _no_space_after_half(real_writer, exc: Exception):
    """A writer that puts half its bytes on disk, then fails as a full disk does."""
    def write(obj, where, *args, **kwargs):
        real_writer(obj, where, *args, **kwargs)
        data = open(where, "rb").read()
        open(where, "wb").write(data[: len(data) // 2])
        raise exc
    return write


@pytest.mark.parametrize("which", ["parquet", "safetensors"])
def test_disk_full_while_writing_the_baseline_is_one_line_and_leaves_no_complete_looking_file(
        tmp_path, monkeypatch, which):
    """pyarrow raises OSError(errno 28); safetensors a SafetensorError that carries only the text
    (both seen on a full 64 KiB tmpfs). Either way: a ValueError naming the --out folder (the
    staging folder is hidden and removed) with "no space left", and no baseline file left."""
    tensors, meta = _tiny_baseline()
    staging = tmp_path / f"{STAGING_PREFIX}x"
    staging.mkdir()
    if which == "parquet":
        exc = OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
        monkeypatch.setattr(baseline.pq, "write_table", _no_space_after_half(baseline.pq.write_table, exc))
    else:
        from safetensors import SafetensorError

        exc = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        calls = []

        def save_file(tensors, filename, metadata=None):  # the second file: the kept tensors
            calls.append(filename)
            if len(calls) == 2:
                open(filename, "wb").write(b"\0" * 100)
                raise exc
            return real(tensors, filename, metadata=metadata)

        real = baseline.save_file
        monkeypatch.setattr(baseline, "save_file", save_file)
    with pytest.raises(ValueError) as raised:
        baseline.save_baseline(tensors, meta, staging / baseline.BASELINE_NAME)
    message = str(raised.value)
    assert message.startswith(f"{tmp_path}: no space left on device") and "\n" not in message
    left = sorted(p.name for p in staging.iterdir())
    assert baseline.BASELINE_NAME not in left  # written last: its absence marks the set incomplete
    assert not [n for n in left if n.startswith(".tmp-")]  # no half-written temp file
    assert baseline.KEPT_NAME not in left or which == "safetensors"


def _can_mount_tmpfs(where) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "sh", "-c", f"mount -t tmpfs -o size=8k tmpfs '{where}'"],
                           capture_output=True)
    return probe.returncode == 0


def test_disk_full_on_a_real_full_filesystem_is_one_line_naming_the_folder(tmp_path):
    """A 128 KiB tmpfs (private mount namespace) as --out: the activations and kept.parquet fit,
    baseline.safetensors (~240 KB at these shapes) does not."""
    out = tmp_path / "small"
    out.mkdir()
    if not _can_mount_tmpfs(out):
        pytest.skip("no private tmpfs mount here (unshare --mount needs CAP_SYS_ADMIN)")
    script = ('mount -t tmpfs -o size=128k tmpfs "$OUT" || exit 99; "$@"; rc=$?; '
              'echo "rc=$rc"; ls -A "$OUT"; ls -A "$OUT/ddp" 2>/dev/null; exit 0')
    proc, tag = run_tracer(["--strategy", "ddp", "--out", str(out)] + TINY + SHORT, tmp_path,
                           env_extra={"OUT": str(out)},
                           module=["unshare", "--mount", "sh", "-c", script, "sh", sys.executable, "-m",
                                   "tracer", "record"])
    assert proc.returncode == 0 and "rc=2" in proc.stdout, proc.stdout + proc.stderr
    line = _one_line(proc.stderr)
    assert line == f"tracer: {out}: no space left on device while writing the baseline; free space there or choose another --out"
    listing = proc.stdout.split("rc=2", 1)[1].split()
    assert not [n for n in listing if n.startswith((STAGING_PREFIX, ".tmp-"))]
    assert baseline.BASELINE_NAME not in listing and schemas.MANIFEST_NAME not in listing
    assert "ddp" not in listing  # the run dir the refused record created is removed again
    assert alive_with_tag(tag) == []


# -- --golden at a corrupt run ------------------------------------------------------------------

@pytest.fixture(scope="module")
def golden_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden")
    proc, _ = run_tracer(["--strategy", "single", "--out", str(out), "--name", "g"] + TINY + SHORT, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / "g"


def _rehash(run_dir) -> None:
    """Rewrite the manifest's size and sha256 of every file to match: a corrupt file that passes
    the integrity check (a copy cut short before its manifest was made, or an edited manifest)."""
    m = json.loads((run_dir / schemas.MANIFEST_NAME).read_text())
    for f in m["files"]:
        data = (run_dir / f["path"]).read_bytes()
        f["sha256"], f["size_bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (run_dir / schemas.MANIFEST_NAME).write_text(json.dumps(m))


def _corrupt(kind, run_dir):
    st = run_dir / schemas.KEPT_TENSORS_NAME
    if kind == "truncated-safetensors":
        st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
        _rehash(run_dir)
        return run_dir, f"{st}: not a readable safetensors file"
    if kind == "random-bytes":
        st.write_bytes(os.urandom(4096))
        _rehash(run_dir)
        return run_dir, f"{st}: not a readable safetensors file"
    if kind == "random-kept-parquet":
        (run_dir / schemas.KEPT_NAME).write_bytes(os.urandom(4096))
        _rehash(run_dir)
        return run_dir, f"{run_dir / schemas.KEPT_NAME}: not a readable Parquet file"
    if kind == "a-file":
        return run_dir / schemas.MANIFEST_NAME, "is a file, not a run directory"
    if kind == "a-directory-without-a-run":
        empty = run_dir.parent / "empty"
        empty.mkdir()
        return empty, "no manifest.json"
    if kind == "missing":
        return run_dir.parent / "nothing-here", "no such run directory"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["truncated-safetensors", "random-bytes", "random-kept-parquet", "a-file",
                                  "a-directory-without-a-run", "missing"])
def test_golden_at_a_corrupt_file_is_one_line_exit_2(golden_run, tmp_path, kind):
    run_dir = tmp_path / "copy"
    shutil.copytree(golden_run, run_dir)
    golden, expected = _corrupt(kind, run_dir)
    out = tmp_path / "out"
    proc, tag = run_tracer(["--strategy", "single", "--out", str(out), "--golden", str(golden)] + TINY + SHORT,
                           tmp_path)
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert line.startswith(f"tracer: --golden {golden}") and expected in line, line
    assert not (out / "single" / schemas.MANIFEST_NAME).exists() and not _staging(tmp_path)
    assert alive_with_tag(tag) == []


# -- --timeout ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), -1.0, 0.0, 0.5,
                                   MIN_TIMEOUT_S - 0.01, MAX_TIMEOUT_S + 1])
def test_timeout_must_be_finite_and_bounded(value):
    with pytest.raises(ValueError, match=f"^--timeout .*: must be a finite number of seconds "
                                         f">= {MIN_TIMEOUT_S:g} and at most {MAX_TIMEOUT_S:g}"):
        RecordConfig(strategy="ddp", timeout_s=value)
    RecordConfig(strategy="ddp", timeout_s=MAX_TIMEOUT_S)  # the bounds themselves are accepted
    RecordConfig(strategy="ddp", timeout_s=MIN_TIMEOUT_S)


@pytest.mark.parametrize("value", ["inf", "0.5"])
def test_timeout_out_of_bounds_is_a_bad_option_with_one_line(tmp_path, value):
    proc, _ = run_tracer(["--strategy", "ddp", "--out", str(tmp_path / "o"), "--timeout", value] + TINY,
                         tmp_path)
    assert proc.returncode == 2
    assert _one_line(proc.stderr).startswith(f"tracer: --timeout {value}: must be a finite number")
    assert not (tmp_path / "o").exists()


# -- signals ------------------------------------------------------------------------------------

def _start_hanging_record(tmp_path, extra: list[str] = ()):
    """A ddp record whose rank 1 hangs at step 1; returns (launcher, tag) once both workers run."""
    tag = "sig-" + os.urandom(8).hex()
    env = dict(os.environ, PARITYTRACE_INJECT="hang@1:1", TMPDIR=str(tmp_path), **{TAG_ENV: tag})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    launcher = subprocess.Popen([sys.executable, "-m", "tracer", "record", "--strategy", "ddp", "--out",
                                 str(tmp_path), "--timeout", "120"] + TINY + list(extra),
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=default_signals)
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:  # until both ranks are at a step (heartbeat files)
        phases = [h.read_text().split()[-1:] for h in tmp_path.glob("tracer-ddp-*/rank*.hb")]
        if phases == [["step"], ["step"]]:
            break
        time.sleep(0.2)
    else:
        launcher.kill()
        pytest.fail("workers never reached a step")
    return launcher, tag


def _stopped(launcher, tag, tmp_path):
    try:
        _, stderr = launcher.communicate(timeout=HANG_S)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, stderr
    assert "interrupted" in _one_line(stderr)
    assert alive_with_tag(tag) == []
    assert not _staging(tmp_path)
    assert not (tmp_path / "ddp" / schemas.MANIFEST_NAME).exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["sigterm", "sighup"])
def test_sigterm_and_sighup_leave_no_staging_folder_and_no_worker(tmp_path, sig):
    launcher, tag = _start_hanging_record(tmp_path)
    launcher.send_signal(sig)
    _stopped(launcher, tag, tmp_path)


def test_signals_during_clean_up_still_end_with_one_line_and_exit_130(tmp_path):
    """Ctrl-C, then SIGTERM / Ctrl-C every 5 ms until the launcher is gone (a user hammering
    Ctrl-C, a batch system that sends SIGTERM on top): the first starts the clean-up, the rest
    must not cut it short."""
    launcher, tag = _start_hanging_record(tmp_path)
    launcher.send_signal(signal.SIGINT)
    n = 0
    while launcher.poll() is None and n < 2000:
        launcher.send_signal(signal.SIGTERM if n % 2 else signal.SIGINT)
        n += 1
        time.sleep(0.005)
    assert n > 1  # signals did arrive during the clean-up
    _stopped(launcher, tag, tmp_path)



def _phase_reached(out, phase: str) -> bool:
    if phase == "claimed":  # the CLI locked the run dir; torch being imported
        return (out / "ddp" / schemas.LOCK_NAME).exists()
    if phase == "baseline":  # the staging folder exists: baseline being computed, ranks importing torch
        return bool(_staging(out))
    if phase == "prepared":  # the run dir was cleared and got its baseline: the record has started
        return (out / "ddp" / schemas.RECORDING_NAME).exists()
    phases = [h.read_text().split()[-1:] for h in out.glob("tracer-ddp-*/rank*.hb")]
    return phases == [["step"], ["step"]]  # both ranks train


@pytest.mark.parametrize("phase", ["claimed", "baseline", "prepared", "steps"])
def test_sigterm_at_each_phase_of_a_record_exits_130_and_leaves_an_incomplete_run(tmp_path, phase):
    """``kill -TERM`` on a plain (not hanging) record, sent as soon as it reaches ``phase``: one
    line, exit 130, no process, no staging folder; a run dir the record had started writing
    keeps its marker and has no manifest (reads as incomplete); one it had not started writing,
    which it created itself, is gone again."""
    tag = "term-" + os.urandom(8).hex()
    env = dict(os.environ, TMPDIR=str(tmp_path), **{TAG_ENV: tag})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    launcher = subprocess.Popen([sys.executable, "-m", "tracer", "record", "--strategy", "ddp", "--out",
                                 str(tmp_path), "--active", "400"] + TINY,
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + HANG_S
        while not _phase_reached(tmp_path, phase) and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert launcher.poll() is None, f"the record ended before reaching {phase}"
        assert _phase_reached(tmp_path, phase), f"the record never reached {phase}"
        launcher.send_signal(signal.SIGTERM)
        _, stderr = launcher.communicate(timeout=HANG_S)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, stderr
    run_dir = tmp_path / "ddp"
    said = ["tracer: interrupted; all workers stopped, the interrupted run has no manifest"]
    if (run_dir / schemas.RECORDING_NAME).exists():  # left incomplete: how to clean it up
        said = [f"{said[0]}; {run_dir} is incomplete: record it again, or delete the folder "
                f"{run_dir}"]
    if phase == "claimed":  # the signal may land while the claim is still being taken
        said.append("tracer: interrupted before any record started; nothing written")
    assert _one_line(stderr) in said
    assert alive_with_tag(tag) == []
    assert not _staging(tmp_path)
    assert not (run_dir / schemas.MANIFEST_NAME).exists()
    if phase in ("prepared", "steps"):
        assert (run_dir / schemas.RECORDING_NAME).exists()
    if not (run_dir / schemas.RECORDING_NAME).exists():  # stopped before its record started
        assert not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())


# -- a killed rank's DataLoader workers ----------------------------------------------------------

def test_dataloader_workers_of_a_killed_rank_end_with_it(tmp_path):
    """An input-bound run (4 s per sample, two loader workers per rank): when rank 1 is
    SIGKILLed at step 1 its loader workers are mid-batch (they notice their parent's death only
    between samples, seconds later). The launcher kills the dead rank's process group too."""
    proc, tag = run_tracer(["--strategy", "ddp", "--out", str(tmp_path), "--timeout", "30", "--data", "loader",
                            "--data-workers", "2", "--data-sample-cost-ms", "4000"] + TINY, tmp_path,
                           env_extra={"PARITYTRACE_INJECT": "sigkill@1:1"})
    assert proc.returncode == 1, proc.stderr
    assert "rank 1 was killed by SIGKILL" in _one_line(proc.stderr)
    assert alive_with_tag(tag, wait_s=1.0) == []  # 1 s for the kernel to reap the killed


# -- torchrun ------------------------------------------------------------------------------------

def _tracer_lines(stderr: str) -> list[str]:
    """The tracer's lines under torchrun, each from its "tracer: " on: torch's C++ loggers (Kineto's
    "USDT: ... profiler_start") write a line's text and its newline apart, so another rank's
    whole line can follow that text on the same line of the shared stderr."""
    return [ln[ln.index("tracer: "):] for ln in stderr.splitlines() if "tracer: " in ln]


def test_rank_failure_under_torchrun_is_one_line_per_rank_without_traceback(tmp_path):
    # --timeout 60: the rendezvous of a loaded machine can take longer than 10 s; torchrun
    # stops rank 0 once rank 1 has failed, so the failure is not waited out
    proc, tag = run_tracer(["record", "--strategy", "ddp", "--out", str(tmp_path), "--timeout", "60"] + TINY
                           + SHORT, tmp_path, module=TORCHRUN, env_extra={"PARITYTRACE_INJECT": "raise@1:1"})
    assert proc.returncode != 0
    ours = _tracer_lines(proc.stderr)
    assert TRACER_FRAME not in proc.stderr  # torchrun's own ChildFailedError report may follow
    rank1 = [ln for ln in ours if ln.startswith("tracer: rank 1 failed at step 1")]
    assert len(rank1) == 1 and "injected failure" in rank1[0], proc.stderr
    assert len([ln for ln in ours if ln.startswith("tracer: rank 0 ")]) <= 1
    kept = rank1[0].rsplit("(traceback: ", 1)[1].rstrip(")")
    assert "RuntimeError: injected failure at step 1" in open(kept).read()  # the traceback is kept
    assert alive_with_tag(tag) == []


def test_single_under_torchrun_with_two_processes_is_one_line_per_rank_exit_2(tmp_path):
    proc, tag = run_tracer(["record", "--strategy", "single", "--out", str(tmp_path)] + TINY + SHORT, tmp_path,
                           module=TORCHRUN)
    assert proc.returncode != 0
    assert TRACER_FRAME not in proc.stderr
    ours = _tracer_lines(proc.stderr)
    # one line per rank that got to say it (torchrun SIGTERMs the others after the first exit)
    assert 1 <= len(ours) <= 2 and set(ours) == {
        "tracer: --strategy single: runs one process, not WORLD_SIZE 2; under torchrun pass "
        "--nproc_per_node 1, or record single without torchrun"}, proc.stderr
    assert "exitcode  : 2" in proc.stderr  # torchrun's summary: the first rank exited 2 (bad option)
    assert not (tmp_path / "single").exists()
    assert alive_with_tag(tag) == []
