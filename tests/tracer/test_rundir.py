"""What ``tracer record`` may touch in a run dir, without torch (fast): the refusals checked
before anything is imported or written, the files a re-record removes, the files a manifest
lists, the record lock (issue 17 items 2, 3, 4, 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest

from analyzer.contract import schemas
from tests.tracer.helpers import HANG_S, REPO
from tracer import rundir

# The files a tiny CPU record leaves (tests/tracer/test_record.py checks them on real runs),
# named here by hand, not through the tracer's patterns.
RECORDED = ["baseline.safetensors", "kept.parquet", "numerics.parquet", "rank0.trace.json.gz",
            "rank1.trace.json.gz", "steps.parquet", "memory/rank0.snapshot.pickle", "memory/memory.parquet"]
# What others leave beside them: the analyzer's caches, report and merge outputs, a user's notes,
# the analyzer's own temp file, a file in memory/ that is not the tracer's.
OTHERS = ["rank0.trace.json.gz.tables.msgpack", "rank1.trace.json.gz.tables.msgpack", "report/index.html",
          "report/report.md", "merged.trace.json.gz", "merged.offsets.json", "notes.txt",
          ".tmp-k2j3.msgpack", "memory/notes.txt", "summary.json"]


def _tree(root: Path, names: list[str]) -> Path:
    for n in names:
        (root / n).parent.mkdir(parents=True, exist_ok=True)
        (root / n).write_text(n)
    return root


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _record_cli(args: list[str], cwd: Path, no_torch: Path | None = None) -> subprocess.CompletedProcess:
    """``python -m tracer record ARGS``; with ``no_torch`` a ``torch`` package that raises on
    import shadows the real one, so a refusal that comes after importing torch shows up as
    that ImportError instead of the one-line refusal."""
    path = [str(REPO)] + ([str(no_torch)] if no_torch else []) + [os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    return subprocess.run([sys.executable, "-m", "tracer", "record", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)


@pytest.fixture
def no_torch(tmp_path) -> Path:
    d = tmp_path / "shadow"
    (d / "torch").mkdir(parents=True)
    (d / "torch" / "__init__.py").write_text('raise ImportError("torch imported before the refusal")\n')
    return d


def _one_line_refusal(proc: subprocess.CompletedProcess, *must: str) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("tracer: "), proc.stderr
    for m in must:
        assert m in lines[0], (m, lines[0])
    return lines[0]


def test_rerecord_removes_only_the_files_the_tracer_writes(tmp_path):
    run = _tree(tmp_path / "ddp", RECORDED + OTHERS + [schemas.MANIFEST_NAME, ".tmp-ab12-rank1.trace.json.gz",
                                                      ".baseline.activations.safetensors", ".parts/rank0.steps.parquet"])
    rundir.clear_run_dir(run)
    rundir.unlock_run_dir(run)
    assert _files(run) == sorted(OTHERS + [schemas.RECORDING_NAME])


def test_manifest_lists_only_the_files_the_tracer_writes(tmp_path):
    run = _tree(tmp_path / "ddp", RECORDED + OTHERS)
    assert [e.path for e in rundir.file_entries(run)] == sorted(RECORDED)


def test_rerecord_marks_the_run_dir_incomplete_before_removing_its_manifest(tmp_path, monkeypatch):
    run = _tree(tmp_path / "ddp", RECORDED + [schemas.MANIFEST_NAME])
    seen = []
    real_unlink = Path.unlink

    def spy(self, *a, **k):  # what a reader would see when the manifest goes
        if self.name == schemas.MANIFEST_NAME:
            seen.append((self.parent / schemas.RECORDING_NAME).exists())
        return real_unlink(self, *a, **k)

    monkeypatch.setattr(Path, "unlink", spy)
    rundir.clear_run_dir(run)
    rundir.unlock_run_dir(run)
    assert seen == [True]
    rundir.finish_record(run)
    assert not (run / schemas.RECORDING_NAME).exists()


@pytest.mark.record
def test_record_into_a_foreign_folder_is_refused_and_left_untouched(tmp_path, no_torch):
    _tree(tmp_path / "out" / "ddp", ["notes.txt", "data/x.csv"])
    proc = _record_cli(["--strategy", "ddp", "--out", "out"], tmp_path, no_torch)
    _one_line_refusal(proc, "out/ddp", "not empty and not a run directory")
    assert _files(tmp_path / "out" / "ddp") == ["data/x.csv", "notes.txt"]


@pytest.mark.record
def test_record_named_like_the_report_folder_is_refused(tmp_path, no_torch):
    proc = _record_cli(["--strategy", "ddp", "--out", "out", "--name", "report"], tmp_path, no_torch)
    _one_line_refusal(proc, "out/report", "analyzer report")
    assert not (tmp_path / "out" / "report").exists()


@pytest.mark.record
def test_record_out_an_existing_file_is_refused_before_torch_is_imported(tmp_path, no_torch):
    (tmp_path / "afile").write_text("mine")
    proc = _record_cli(["--strategy", "all", "--out", "afile"], tmp_path, no_torch)
    _one_line_refusal(proc, "afile", "is a file, not a folder")
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.record
def test_record_into_a_run_dir_another_record_holds_is_refused(tmp_path, no_torch):
    """The holder is another process (flock locks are per open file: this test's own lock would
    not conflict with itself); the refusal comes before torch is imported."""
    run = tmp_path / "out" / "ddp"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from tracer.rundir import lock_run_dir
        lock_run_dir(Path({str(run)!r})); print("locked", flush=True); sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert holder.stdout.readline().strip() == "locked"
        proc = _record_cli(["--strategy", "ddp", "--out", "out"], tmp_path, no_torch)
        _one_line_refusal(proc, "out/ddp", f"another tracer record (pid {holder.pid})")
        with pytest.raises(rundir.RunDirBusy):
            rundir.lock_run_dir(run)
    finally:
        holder.communicate("", timeout=HANG_S)
    rundir.lock_run_dir(run)  # the holder ended: its lock went with it
    rundir.unlock_run_dir(run)


@pytest.mark.record
def test_user_files_named_like_the_tracers_do_not_make_a_run_dir(tmp_path, no_torch):
    """A folder of the user's own with names the tracer writes (a trace, numerics.parquet,
    a manifest.json of another tool) is no run dir: the record is refused, nothing touched."""
    run = _tree(tmp_path / "out" / "ddp", ["rank7.trace.json.gz", "numerics.parquet"])
    (run / schemas.MANIFEST_NAME).write_text('{"tool": "mine"}')
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    proc = _record_cli(["--strategy", "ddp", "--out", "out"], tmp_path, no_torch)
    _one_line_refusal(proc, "out/ddp", "not empty and not a run directory")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_a_run_dir_is_one_with_the_tracers_manifest_marker_or_lock(tmp_path):
    for name, text in ((schemas.MANIFEST_NAME, '{"schema_version": 1, "run_id": "x"}'),
                       (schemas.RECORDING_NAME, "123\n"), (schemas.LOCK_NAME, "")):
        d = tmp_path / name
        d.mkdir()
        (d / name).write_text(text)
        assert rundir.is_run_dir(d), name
    assert not rundir.is_run_dir(_tree(tmp_path / "user", RECORDED))


def test_rerecord_removes_only_the_files_its_manifest_lists(tmp_path):
    """A complete run dir whose manifest lists two ranks: a rank2.trace.json.gz and a
    golden.parquet of the user's, named like the tracer's but not listed, stay."""
    import json

    run = _tree(tmp_path / "ddp", RECORDED + ["rank2.trace.json.gz", "golden.parquet", "notes.txt"])
    listed = [n for n in RECORDED if n != "golden.parquet"]
    (run / schemas.MANIFEST_NAME).write_text(json.dumps(
        {"schema_version": 1, "run_id": "x", "files": [{"path": n} for n in listed]}))
    rundir.clear_run_dir(run)
    rundir.unlock_run_dir(run)
    left = _files(run)
    assert {"rank2.trace.json.gz", "golden.parquet", "notes.txt"} <= set(left)
    assert not set(listed) & set(left)


def test_rerecord_of_an_incomplete_run_removes_its_tracer_files(tmp_path):
    """No manifest (the record did not complete): every file named like the tracer's goes."""
    run = _tree(tmp_path / "ddp", RECORDED + ["notes.txt", schemas.RECORDING_NAME])
    rundir.clear_run_dir(run)
    rundir.unlock_run_dir(run)
    assert _files(run) == sorted(["notes.txt", schemas.RECORDING_NAME])


def test_unlock_all_releases_every_held_lock_and_the_folders_it_made(tmp_path):
    """The CLI's last step (tracer/cli.py ``main``): a stop signal between a claim and its
    release leaves no lock file and no empty run dir the claim made."""
    runs = [tmp_path / "traces" / "ddp", tmp_path / "traces" / "fsdp"]
    for run in runs:
        rundir.lock_run_dir(run)
    assert all((run / rundir.LOCK_NAME).exists() for run in runs)
    rundir.unlock_all()
    assert not any(run.exists() for run in runs)
    rundir.lock_run_dir(runs[0])  # released: it can be taken again
    rundir.unlock_run_dir(runs[0])


@pytest.mark.parametrize("where", ["write_owner", "baseline_id"])
def test_a_stop_right_after_the_staging_folder_is_made_leaves_no_folder_and_no_lock(tmp_path, monkeypatch, where):
    """A stop signal (``KeyboardInterrupt``) landing while the baseline staging folder is being
    set up (its owner file written, the baseline ids computed) removes that folder and every
    lock before it propagates: ``--out`` holds what it held before."""
    import tracer.baseline
    from analyzer.contract import owner
    from tracer.config import RecordConfig
    from tracer.record import record_local

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "write_owner":
        monkeypatch.setattr(owner, "write_owner", stop)
    else:
        monkeypatch.setattr(tracer.baseline, "baseline_id", stop)
    out = tmp_path / "traces"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(KeyboardInterrupt):
        record_local([RecordConfig(strategy="ddp", out=str(out), device="cpu")])
    assert _files(out) == ["notes.txt"]
    assert not any(p.is_dir() for p in out.iterdir())


def test_a_stop_signal_while_the_lock_is_taken_is_held_until_unlock_all_knows_the_lock(tmp_path, monkeypatch):
    """The launcher's SIGTERM handler (``stopping.stop_on_signals``: ``KeyboardInterrupt``) run
    after the lock file is made and before the lock is recorded: the stop is raised only once
    the lock is recorded, so ``unlock_all`` (the CLI's last step) removes the file and the
    folder. The handler is called directly: Python runs it at the next bytecode of the main
    thread when another thread took the signal (the kernel hands it to a thread that does not
    block it: numpy's BLAS threads), so blocking the signals in the main thread is not enough."""
    import signal

    from analyzer.contract import stopping

    real_pwrite = os.pwrite

    def pwrite_then_signal(fd, data, offset):
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        return real_pwrite(fd, data, offset)

    run = tmp_path / "traces" / "ddp"
    before = {s: signal.getsignal(s) for s in stopping.STOP_SIGNALS}
    stopping.stop_on_signals()
    try:
        monkeypatch.setattr(rundir.os, "pwrite", pwrite_then_signal)
        with pytest.raises(KeyboardInterrupt):
            rundir.lock_run_dir(run)
        monkeypatch.undo()
        rundir.unlock_all()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        stopping._STOPPED.clear()
    assert not (tmp_path / "traces").exists()


def _linked_memory(tmp_path: Path, *, manifest: bool) -> tuple[Path, Path, dict]:
    """out/ddp, a run dir (complete with ``manifest``, else incomplete) whose ``memory`` is a
    symlink to a folder outside out/ holding files named like the tracer's memory files."""
    import json

    elsewhere = _tree(tmp_path / "elsewhere", ["memory.parquet", "rank0.snapshot.pickle", "mine.txt"])
    run = _tree(tmp_path / "out" / "ddp", [n for n in RECORDED if not n.startswith("memory/")])
    (run / "memory").symlink_to(elsewhere)
    if manifest:
        (run / schemas.MANIFEST_NAME).write_text(json.dumps(
            {"schema_version": 1, "run_id": "x", "files": [{"path": n} for n in RECORDED]}))
    else:
        (run / schemas.RECORDING_NAME).write_text("1\n")
    return run, elsewhere, {p.name: p.read_bytes() for p in elsewhere.iterdir()}


@pytest.mark.parametrize("manifest", [True, False], ids=["complete", "incomplete"])
def test_rerecord_never_deletes_through_a_memory_link_out_of_the_run_dir(tmp_path, manifest):
    run, elsewhere, before = _linked_memory(tmp_path, manifest=manifest)
    with pytest.raises(ValueError, match=r"out/ddp/memory: is a symlink to .*elsewhere.*remove the link"):
        rundir.check_run_dir(run)
    with pytest.raises(ValueError, match="is a symlink"):
        rundir.clear_run_dir(run)
    rundir.unlock_all()
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before
    assert "memory/memory.parquet" not in [e.path for e in rundir.file_entries(run)]


@pytest.mark.parametrize("name", [rundir.PARTS_DIR, schemas.LOCK_NAME, schemas.RECORDING_NAME])
def test_a_run_dir_whose_own_paths_are_links_is_refused(tmp_path, name):
    """The folders a record writes into and the files it writes in place: a link there is
    refused, and the file it points to is never written."""
    target = tmp_path / "elsewhere"
    if name == rundir.PARTS_DIR:
        target.mkdir()
    else:
        target.write_text("mine")
    run = _tree(tmp_path / "out" / "ddp", [schemas.MANIFEST_NAME])
    (run / name).symlink_to(target)
    with pytest.raises(ValueError, match=f"{name}: is a symlink"):
        rundir.check_run_dir(run)
    if name != rundir.PARTS_DIR:
        assert target.read_text() == "mine"


def test_a_run_dir_linked_outside_out_is_refused_one_inside_is_not(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out" / "b").mkdir(parents=True)
    (tmp_path / "out" / "a").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "out" / "c").symlink_to(tmp_path / "out" / "b")
    with pytest.raises(ValueError, match="out/a: is a symlink to .*outside --out"):
        rundir.check_run_dir(tmp_path / "out" / "a")
    rundir.check_run_dir(tmp_path / "out" / "c")


@pytest.mark.record
def test_record_over_a_memory_link_is_refused_before_torch_is_imported(tmp_path, no_torch):
    run, elsewhere, before = _linked_memory(tmp_path, manifest=False)
    proc = _record_cli(["--strategy", "ddp", "--out", "out"], tmp_path, no_torch)
    _one_line_refusal(proc, "out/ddp/memory: is a symlink", "remove the link")
    assert {p.name: p.read_bytes() for p in elsewhere.iterdir()} == before
    assert (run / "memory").is_symlink()


def test_rerecord_of_a_finished_run_names_what_it_replaces(tmp_path):
    import shutil

    run = tmp_path / "ddp"
    shutil.copytree(REPO / "fixtures" / "recorded" / "tiny" / "ddp", run)
    created = json.loads((run / "manifest.json").read_text())["created_utc"]  # ISO, to the second
    when = datetime.fromisoformat(created).strftime("%Y-%m-%d %H:%M UTC")
    assert rundir.clear_run_dir(run) == f"a finished ddp run of 2 ranks recorded {when}"
    rundir.unlock_run_dir(run)
    assert rundir.clear_run_dir(run) is None  # now incomplete: nothing of value replaced
    rundir.unlock_run_dir(run)


def test_incomplete_run_dirs_say_how_to_clean_them_up(tmp_path):
    a, b, done = (_tree(tmp_path / n, [schemas.RECORDING_NAME]) for n in ("a", "b", "c"))
    (done / schemas.RECORDING_NAME).unlink()
    assert rundir.incomplete_hint([done]) == ""
    assert rundir.incomplete_hint([a, done]) == (
        f"; {a} is incomplete: record it again, or delete the folder {a}")
    assert rundir.incomplete_hint([a, b]) == (
        f"; {a}, {b} are incomplete: record them again, or delete the folders {a}, {b}")
    # the finished run is gone (cleared when the record started): said so, not "it held"
    assert rundir.incomplete_hint([a], {a: "a finished ddp run of 2 ranks recorded X"}) == (
        f"; {a} is incomplete (the finished ddp run of 2 ranks recorded X it held was removed "
        f"when this record started): record it again, or delete the folder {a}")
    assert rundir.incomplete_hint([a, b], {b: "a finished ddp run of 2 ranks recorded X"}) == (
        f"; {a}, {b} (the finished ddp run of 2 ranks recorded X it held was removed when its "
        f"record started) are incomplete: record them again, or delete the folders {a}, {b}")
