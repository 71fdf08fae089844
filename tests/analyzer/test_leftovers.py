"""Temporary folders of analyzers killed beyond any clean-up (SIGKILL) are swept by the next
run when provably theirs and their owner provably dead (issue 33 item 16): the spill folders in
``$TMPDIR`` and the ``--tables-out`` staging folders. Anything else stays: a live owner's, one
without an owner file, one holding a file the analyzer does not write. Oracle: the folders on
disk, and a real process whose identity is read while it lives and that is then killed."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from analyzer.contract import owner
from analyzer.ingest import spill
from analyzer.ingest.pipeline import load_tables
from tests.analyzer.helpers import gloo_job
from tests.inputs import cli

pytestmark = pytest.mark.integration


@pytest.fixture()
def dead_identity() -> str:
    """The identity of a process that existed and is gone (killed, reaped)."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        ident = owner.identity(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert ident is not None and owner.dead(ident)
    return ident


def _left(folder: Path, ident: str | None, files: dict[str, bytes]) -> Path:
    folder.mkdir()
    if ident is not None:
        (folder / owner.OWNER_NAME).write_text(ident + "\n")
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def test_spill_sweeps_a_dead_runs_folder_only(tmp_path, monkeypatch, dead_identity):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("PARITYTRACE_TABLES_MEMORY", "0")
    arrow = {"1.collectives.arrow": b"x", "1.prefetch.arrow": b"y"}
    dead = _left(tmp / "paritytrace-tables-dead", dead_identity, arrow)
    live = _left(tmp / "paritytrace-tables-live", owner.identity(), arrow)
    anonymous = _left(tmp / "paritytrace-tables-anon", None, arrow)
    foreign = _left(tmp / "paritytrace-tables-mine", dead_identity, {**arrow, "notes.txt": b"mine"})
    job = load_tables(gloo_job(tmp_path / "job", 2))
    assert job.spill.folder is not None and job.spill.folder.parent == tmp
    assert not dead.exists()
    assert live.exists() and anonymous.exists() and foreign.exists()
    assert (foreign / "notes.txt").read_bytes() == b"mine"


def test_tables_out_sweeps_a_dead_runs_staging_only(tmp_path, dead_identity):
    job = gloo_job(tmp_path / "job", 2)
    out = tmp_path / "tables"
    dead = _left(tmp_path / ".tmp-abc123-tables", dead_identity,
                 {"breakdown/run=job/rank=0/part-0.parquet": b"p"})
    moved_aside = _left(tmp_path / ".tmp-old-def456-tables", dead_identity,
                        {"tables/paritytrace-tables.json": b"{}"})
    live = _left(tmp_path / ".tmp-live99-tables", owner.identity(), {})
    foreign = _left(tmp_path / ".tmp-user77-tables", dead_identity, {"draft.md": b"mine"})
    other_name = _left(tmp_path / ".tmp-abc123-other", dead_identity, {})
    proc = cli("report", str(job), "--out", str(tmp_path / "report"), "--tables-out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (out / "paritytrace-tables.json").is_file()
    assert not (out / owner.OWNER_NAME).exists()  # the owner file is not part of the dataset
    assert not dead.exists() and not moved_aside.exists()
    assert live.exists() and foreign.exists() and other_name.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")) == sorted(
        [live.name, foreign.name, other_name.name])  # and its own staging is gone


def test_an_owner_is_dead_only_when_provably_gone():
    """A reused pid (another start time) or another boot is dead; another host, a malformed
    owner line, this very process are not."""
    ident = owner.identity()
    pid, ticks, boot, host = ident.split()
    assert not owner.dead(ident)
    assert owner.dead(f"{pid} {int(ticks) + 1} {boot} {host}")
    assert owner.dead(f"{pid} {ticks} another-boot {host}")
    assert not owner.dead(f"{pid} {ticks} {boot} {host}-elsewhere")
    assert not owner.dead("") and not owner.dead("12 x y z") and not owner.dead(f"{pid} {ticks}")
