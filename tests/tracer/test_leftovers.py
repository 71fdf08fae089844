"""What a stopped ``tracer record --repeat`` leaves, and says (issue 33 item 16): a SIGKILLed
launcher leaves its baseline staging folder and the run dirs of repeats it had claimed but not
started; the next record into that ``--out`` sweeps exactly those (their writer provably dead)
and nothing else. An interrupted one names the repeats it recorded and the ones it did not.
Oracle: the folders on disk, the analyzer's gate, and the real processes (killed, reaped)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analyzer.contract import owner, schemas
from tests.inputs import default_signals
from tests.tracer.helpers import HANG_S, REPO, TAG_ENV, TINY, alive_with_tag

pytestmark = pytest.mark.record
STEPS = ["--wait", "1", "--warmup", "0", "--active", "1"]


def _launch(out: Path, name: str, tag: str, cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, TMPDIR=str(cwd), **{TAG_ENV: tag})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-m", "tracer", "record", "--strategy", "ddp", "--repeat", "3",
                             "--name", name, "--out", str(out)] + TINY + STEPS,
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)


def _until_second_repeat_started(proc: subprocess.Popen, out: Path, name: str) -> None:
    """Wait until repeat 1 is complete and repeat 2 has begun (its record marker exists: the
    launcher counted repeat 1 done before it cleared repeat 2)."""
    marker = out / f"{name}.r2" / schemas.RECORDING_NAME
    deadline = time.monotonic() + HANG_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), proc.stderr.read() if proc.poll() is not None else "repeat 2 never started"
    assert (out / f"{name}.r1" / schemas.MANIFEST_NAME).is_file()


def test_killed_repeat_leftovers_are_swept_and_an_interrupted_one_names_its_missing_repeats(tmp_path):
    out = tmp_path / "out"
    # decoys a sweep must leave: a staging-like folder without an owner, a lock-only folder
    # whose writer lives (this process)
    out.mkdir()
    (out / ".tracer-baseline-mine").mkdir()
    (out / ".tracer-baseline-mine" / "notes.txt").write_text("mine")
    (out / "held").mkdir()
    (out / "held" / schemas.LOCK_NAME).write_text(f"{os.getpid()}\n{owner.identity()}\n")

    tag = "left-" + os.urandom(8).hex()
    killed = _launch(out, "ddp", tag, tmp_path)
    try:
        _until_second_repeat_started(killed, out, "ddp")
        killed.send_signal(signal.SIGKILL)
        killed.communicate(timeout=HANG_S)
    finally:
        if killed.poll() is None:
            killed.kill()
    assert alive_with_tag(tag) == []  # the ranks died with it
    staging = [p for p in out.iterdir() if p.name.startswith(".tracer-baseline-") and p.name != ".tracer-baseline-mine"]
    assert len(staging) == 1  # nothing could sweep it: what this test is about
    assert sorted(p.name for p in (out / "ddp.r3").iterdir()) == [schemas.LOCK_NAME]  # claimed, never started

    tag = "left-" + os.urandom(8).hex()
    stopped = _launch(out, "other", tag, tmp_path)
    try:
        _until_second_repeat_started(stopped, out, "other")
        # the sweep ran before the first record: the killed launcher's leftovers are gone
        assert not staging[0].exists() and not (out / "ddp.r3").exists()
        stopped.send_signal(signal.SIGINT)
        stdout, stderr = stopped.communicate(timeout=HANG_S)
    finally:
        if stopped.poll() is None:
            stopped.kill()
    assert stopped.returncode == 130, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    r2 = out / "other.r2"  # its record had started: left incomplete, and said how to clean up
    assert lines[0].startswith("tracer: interrupted") and lines[0].endswith(
        "; 1 of 3 runs recorded (other.r1), not recorded: other.r2, other.r3; "
        f"{r2} is incomplete: record it again, or delete the folder {r2}"), lines[0]
    assert stdout.splitlines() == [f"recorded {out / 'other.r1'}"]
    assert alive_with_tag(tag) == []

    # kept: complete runs, the killed record's started repeat (incomplete: marker), the decoys
    assert (out / "ddp.r1" / schemas.MANIFEST_NAME).is_file()
    assert (out / "ddp.r2" / schemas.RECORDING_NAME).is_file()
    assert (out / ".tracer-baseline-mine" / "notes.txt").read_text() == "mine"
    assert (out / "held" / schemas.LOCK_NAME).is_file()
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted([".tracer-baseline-mine", "held", "ddp.r1", "ddp.r2", "other.r1", "other.r2"]), names
