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
from tests.tracer.helpers import TINY, alive_with_tag, run_tracer
from tracer.record import STAGING_PREFIX

pytestmark = pytest.mark.slow
BASELINE = "baseline.safetensors"


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_complete(run_dir) -> dict:
    """Every file the manifest lists is there with its size and sha256 (hashlib, not the
    tracer's code); nothing else but the manifest is in the dir. Returns the manifest."""
    manifest = schemas.read_manifest(run_dir / schemas.MANIFEST_NAME)
    listed = {f.path: f for f in manifest.files}
    on_disk = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*")
                     if p.is_file() and p.name != schemas.MANIFEST_NAME)
    assert sorted(listed) == on_disk
    for rel, f in listed.items():
        assert (run_dir / rel).stat().st_size == f.size_bytes, rel
        assert _sha256(run_dir / rel) == f.sha256, rel
    return manifest


def test_failed_rerecord_keeps_runs_that_never_started(fp32_all, tmp_path):
    out = tmp_path / "traces"
    shutil.copytree(fp32_all[0], out)
    # copytree breaks the hard links a record makes; restore them as `record --strategy all`
    # leaves them (one baseline inode shared by the four run dirs), so an in-place rewrite of
    # the shared file through single/ would show up as a sha256 mismatch in fsdp/ and fsdp2/.
    shared = out / "single" / BASELINE
    for s in schemas.STRATEGIES[1:]:
        assert _sha256(out / s / BASELINE) == _sha256(shared)
        (out / s / BASELINE).unlink()
        os.link(shared, out / s / BASELINE)
    assert shared.stat().st_nlink == len(schemas.STRATEGIES)
    before = {s: {p.relative_to(out / s).as_posix(): _sha256(p) for p in (out / s).rglob("*") if p.is_file()}
              for s in ("fsdp", "fsdp2")}
    old_seed = _assert_complete(out / "fsdp").seed

    # Re-record with another seed (a different baseline): single completes, rank 1 of ddp (the
    # second strategy) raises at step 2, fsdp and fsdp2 never start.
    new_seed = old_seed + 1
    proc, tag = run_tracer(["--strategy", "all", "--out", str(out), "--seed", str(new_seed), "--timeout", "4"]
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
        after = {p.relative_to(out / s).as_posix(): _sha256(p) for p in (out / s).rglob("*") if p.is_file()}
        assert after == before[s]
    # No staging folder is left under --out (it would hold a stale baseline).
    assert not [p.name for p in out.iterdir() if p.name.startswith(STAGING_PREFIX)]
