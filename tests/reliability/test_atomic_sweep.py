"""The atomic writer's temp folders: a writer killed mid-write leaves one that the next write
into that folder removes once its owner is provably dead, and nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from analyzer.contract import atomic, owner


def _dead() -> str:
    """This process's identity with another start time: a pid reused, its owner gone."""
    pid, ticks, boot, host = owner.identity().split()
    return f"{pid} {int(ticks) + 1} {boot} {host}"


def _left(folder: Path, ident: str | None, files: dict[str, bytes]) -> Path:
    folder.mkdir()
    if ident is not None:
        (folder / owner.OWNER_NAME).write_text(ident + "\n")
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_only_a_dead_writers_temp_folder_is_swept(tmp_path):
    dead = _left(tmp_path / ".tmp-abcd1234-m.trace.json.gz", _dead(), {"m.trace.json.gz": b"half"})
    empty = _left(tmp_path / ".tmp-abcd1235-m.json", _dead(), {})  # killed before the file
    live = _left(tmp_path / ".tmp-abcd1236-m.json", owner.identity(), {"m.json": b"being written"})
    anonymous = _left(tmp_path / ".tmp-abcd1237-m.json", None, {"m.json": b"?"})
    foreign = _left(tmp_path / ".tmp-abcd1238-m.json", _dead(), {"m.json": b"x", "notes.txt": b"mine"})
    other = _left(tmp_path / ".tmp-abcd1239-m.json", _dead(), {"n.json": b"x"})
    tables = _left(tmp_path / ".tmp-old-abcd12-tables", _dead(), {})  # not this writer's name
    old_style = tmp_path / ".tmp-abcd1240-m.json"
    old_style.write_bytes(b"no owner: kept")
    removed = atomic.sweep_leftovers(tmp_path)
    assert sorted(removed) == sorted([dead, empty])
    for kept in (live, anonymous, foreign, other, tables, old_style):
        assert kept.exists(), kept


def test_the_first_write_into_a_folder_sweeps_it(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_swept", set())
    dead = _left(tmp_path / ".tmp-abcd1234-m.json", _dead(), {"m.json": b"half"})
    atomic.write_atomic(tmp_path / "m.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]
    assert not dead.exists()


def test_a_write_leaves_no_temp_folder(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic.atomic_path(tmp_path / "m.json") as tmp:
            assert (tmp.parent / owner.OWNER_NAME).is_file()  # owned from the start
            raise RuntimeError("writer failed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.integration
def test_a_merge_sweeps_what_a_killed_merge_left(tmp_path):
    from tests.inputs import cli
    from tests.merge.builders import gloo_rank, write

    job = tmp_path / "job"
    for r in (0, 1):
        write(job / f"rank{r}.trace.json", gloo_rank(r, 2, offset_us=0.0, ends_us=[600.0, 1600.0]))
    out = tmp_path / "out" / "m.trace.json.gz"
    # a merge SIGKILLed while it writes the merged trace (the writer, killed in its block)
    code = textwrap.dedent(f"""
        import os, signal
        from analyzer.contract.atomic import atomic_path
        with atomic_path({str(out)!r}) as tmp:
            tmp.write_bytes(b"half a trace")
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".tmp-")]
    atomic._swept.discard(os.path.abspath(out.parent))
    assert cli("merge", str(job), "-o", str(out)).returncode == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.offsets.json", "m.trace.json.gz"]
