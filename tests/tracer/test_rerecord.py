"""A re-record that fails part-way leaves the runs that never started as they were.

Regression: ``tracer record --strategy all`` used to clear all four run dirs before the first
strategy ran, so interrupting a re-record during ``single`` emptied ddp/fsdp/fsdp2 too.
"""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from analyzer.contract import schemas
from tests.tracer.helpers import HANG_S, REPO, TINY, alive_with_tag, run_tracer
from tracer.rundir import STAGING_PREFIX

pytestmark = pytest.mark.record
BASELINE = "baseline.safetensors"


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_complete(run_dir) -> dict:
    """Every file the manifest lists is there with its size and sha256 (hashlib, not the
    tracer's code); nothing else but the manifest is in the dir (no record marker or lock: the
    record is over). Returns the manifest."""
    manifest = schemas.read_manifest(run_dir / schemas.MANIFEST_NAME)
    listed = {f.path: f for f in manifest.files}
    on_disk = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")
                     if p.is_file() and p.name != schemas.MANIFEST_NAME)
    assert sorted(listed) == on_disk
    for rel, f in listed.items():
        assert (run_dir / rel).stat().st_size == f.size_bytes, rel
        assert _sha256(run_dir / rel) == f.sha256, rel
    return manifest


def _digests(run_dir) -> dict:
    return {p.relative_to(run_dir).as_posix(): _sha256(p) for p in run_dir.rglob("*") if p.is_file()}


def test_failed_rerecord_keeps_runs_that_never_started(fp32_all, tmp_path):
    out = tmp_path / "traces"
    shutil.copytree(fp32_all[0], out)
    # copytree breaks the hard links a record makes; restore them as `record --strategy all`
    # leaves them (one baseline inode shared by the four run dirs), so an in-place rewrite of
    # the shared file through single/ would show up as a sha256 mismatch in fsdp/ and fsdp2/.
    shared = out / "single" / BASELINE
    for s in schemas.FLAT_STRATEGIES[1:]:
        assert _sha256(out / s / BASELINE) == _sha256(shared)
        (out / s / BASELINE).unlink()
        os.link(shared, out / s / BASELINE)
    assert shared.stat().st_nlink == len(schemas.FLAT_STRATEGIES)
    before = {s: _digests(out / s) for s in ("fsdp", "fsdp2")}
    old_seed = _assert_complete(out / "fsdp").seed

    # Re-record with another seed (a different baseline): single completes, rank 1 of ddp (the
    # second strategy) raises at step 2, fsdp and fsdp2 never start.
    new_seed = old_seed + 1
    proc, tag = run_tracer(["--strategy", "all", "--out", str(out), "--seed", str(new_seed)]
                           + TINY, tmp_path, env_extra={"PARITYTRACE_INJECT": "raise@1:2"})
    assert proc.returncode == 1, proc.stderr
    assert "ddp" in proc.stderr and "rank 1 failed at step 2" in proc.stderr
    assert alive_with_tag(tag) == []

    single = _assert_complete(out / "single")
    assert single.seed == new_seed
    assert _sha256(out / "single" / BASELINE) != before["fsdp"][BASELINE]  # the baseline did change
    assert not (out / "ddp" / schemas.MANIFEST_NAME).exists()
    for s in ("fsdp", "fsdp2"):
        manifest = _assert_complete(out / s)
        assert manifest.seed == old_seed
        after = _digests(out / s)
        assert after == before[s]
    # No staging folder is left under --out (it would hold a stale baseline).
    assert not [p.name for p in out.iterdir() if p.name.startswith(STAGING_PREFIX)]


def _record_ddp(out, extra=(), env_extra=None):
    return run_tracer(["--strategy", "ddp", "--out", str(out), *extra] + TINY, out.parent, env_extra=env_extra)


# The files a tiny 2-rank CPU ddp record leaves, by hand (not through tracer.rundir's patterns).
DDP_FILES = ["baseline.safetensors", "kept.parquet", "memory_categories.parquet", "numerics.parquet",
             "rank0.trace.json.gz", "rank1.trace.json.gz", "steps.parquet"]


def test_record_report_record_report_gate_passes(tmp_path):
    """README's loop run twice (issue 17 item 2): the analyzer's outputs beside the run -- the
    per-rank tables caches, report/ in the root and in the run dir, merge's trace and sidecar --
    are not the record's: never listed in its manifest, left in place by the re-record, and the
    second report and the gate read the new run (before: the caches were listed, the next
    report rewrote them, and every later gate failed with file_changed)."""
    from tests.inputs import cli

    out = tmp_path / "traces"
    run = out / "ddp"
    for attempt in range(2):
        proc, _ = _record_ddp(out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip() == f"recorded {run}"
        manifest = _assert_listed(run)
        for args in (["report", str(out)], ["report", str(run)], ["merge", str(run)]):
            done = cli(*args)
            assert done.returncode == 0, (args, done.stderr[-2000:])
        # the report's and merge's outputs, and a tables cache an older analyzer left beside a
        # trace (today's keeps them in the user cache: docs/caches.md)
        if attempt == 0:
            (run / "rank0.trace.json.gz.tables.msgpack").write_bytes(b"left by an older analyzer")
        outputs = ["rank0.trace.json.gz.tables.msgpack", "report/report.md",
                   "merged.trace.json.gz", "merged.offsets.json"]
        assert all((run / n).is_file() for n in outputs), sorted(p.name for p in run.iterdir())
        assert (out / "report" / "report.md").is_file()
        if attempt == 0:
            first_id = manifest.run_id
    assert manifest.run_id != first_id
    gate = cli("gate", str(out))
    assert gate.returncode == 0, gate.stdout[-2000:] + gate.stderr[-2000:]


def _assert_listed(run_dir) -> schemas.Manifest:
    """The manifest lists exactly the record's files, each with the size and sha256 hashlib
    computes."""
    manifest = schemas.read_manifest(run_dir / schemas.MANIFEST_NAME)
    assert sorted(f.path for f in manifest.files) == DDP_FILES
    for f in manifest.files:
        assert (run_dir / f.path).stat().st_size == f.size_bytes and _sha256(run_dir / f.path) == f.sha256
    return manifest


def test_failed_rerecord_leaves_no_manifest_and_the_record_marker(tmp_path):
    """Issue 17 item 3: a re-record over a complete run that fails leaves a run dir the
    analyzer reads as incomplete (no manifest, the marker there), never the old manifest over
    a mix of old and new files."""
    out = tmp_path / "traces"
    proc, _ = _record_ddp(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc, tag = _record_ddp(out, [], env_extra={"PARITYTRACE_INJECT": "raise@1:2"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert alive_with_tag(tag) == []
    assert not (out / "ddp" / schemas.MANIFEST_NAME).exists()
    assert (out / "ddp" / schemas.RECORDING_NAME).is_file()


def test_run_dir_reads_incomplete_throughout_a_rerecord(tmp_path):
    """Issue 17 item 3: sampled while a re-record runs, the run dir is always either complete
    (manifest, no marker: the old run, then the new one) or marked (the marker is there): a
    manifest-less folder without the marker is never seen. The samples must catch the record
    in progress (marker seen) and its end (new manifest)."""
    import subprocess
    import sys
    import time

    out = tmp_path / "traces"
    run = out / "ddp"
    proc, _ = _record_ddp(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    old_id = schemas.read_manifest(run / schemas.MANIFEST_NAME).run_id
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rec = subprocess.Popen([sys.executable, "-m", "tracer", "record", "--strategy", "ddp", "--out", str(out)]
                           + TINY, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    states = set()
    while rec.poll() is None:
        time.sleep(0.005)  # pacing only: two shared cores
        states.add(((run / schemas.MANIFEST_NAME).exists(), (run / schemas.RECORDING_NAME).exists()))
    assert rec.returncode == 0, rec.stderr.read()[-3000:]
    assert (False, False) not in states, states
    assert (False, True) in states, states
    assert not (run / schemas.RECORDING_NAME).exists()
    assert schemas.read_manifest(run / schemas.MANIFEST_NAME).run_id != old_id


def test_concurrent_records_into_one_run_dir_one_is_refused(tmp_path):
    """Issue 17 item 5: two `tracer record` into the same --out/--name at once: one records,
    the other stops with one line (exit 2) before writing anything; the run dir holds one
    complete run whose files all match its manifest (hashlib), and the gate passes."""
    import subprocess
    import sys

    from tests.inputs import cli

    out = tmp_path / "traces"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "tracer", "record", "--strategy", "ddp", "--out", str(out)] + TINY
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = sorted((p.wait(timeout=HANG_S), *p.communicate()) for p in procs)
    (rc0, out0, err0), (rc1, _, err1) = results
    assert (rc0, rc1) == (0, 2), results
    assert out0.strip() == f"recorded {out / 'ddp'}"
    lines = [ln for ln in err1.splitlines() if ln.strip()]
    assert len(lines) == 1 and "another tracer record" in lines[0] and str(out / "ddp") in lines[0], err1
    _assert_listed(out / "ddp")
    assert cli("gate", str(out)).returncode == 0


def test_rerecord_says_which_finished_run_it_replaced(tmp_path):
    args = ["--strategy", "ddp", *TINY, "--warmup", "0", "--active", "1", "--out", str(tmp_path)]
    first, _ = run_tracer(args, REPO)
    assert first.returncode == 0 and "replacing" not in first.stderr, first.stderr
    created = schemas.read_manifest(tmp_path / "ddp" / schemas.MANIFEST_NAME).created_utc
    again, _ = run_tracer(args, REPO)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [f"recorded {tmp_path / 'ddp'}"]
    assert again.stderr.splitlines() == [
        f"tracer: {tmp_path / 'ddp'} replaced a finished ddp run of 2 ranks recorded "
        f"{created[:10]} {created[11:16]} UTC"]
