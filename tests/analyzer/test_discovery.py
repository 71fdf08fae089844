"""What `report`, `gate`, `summary`, `merge` and `drift` take as input: runs a failed or running
record left without a manifest, the analyzer's own outputs, folders of symlinked run directories,
folders of trace sub-folders, one trace file, a path that does not exist. Oracle: the folder
layout each test builds by hand, and the rule written out in analyzer/ingest/rundirs.py."""

from __future__ import annotations

import pytest

import os
import shutil

from tests.corpus import corpus, needs_corpus
from tests.inputs import bad_input, cli, copy_run


def _baseline_only(run_dir, src):
    """What a record that failed after placing the baseline leaves (tracer/record.py
    ``prepare_run_dir``): the baseline files, no trace, no manifest."""
    run_dir.mkdir(parents=True)
    shutil.copy(src / "baseline.safetensors", run_dir / "baseline.safetensors")
    return run_dir


def test_failed_record_leaving_only_the_baseline_is_incomplete_and_fails_the_gate(tmp_path, ddp_run):
    root = tmp_path / "traces"
    copy_run(ddp_run, root / "ddp")
    failed = _baseline_only(root / "fsdp", ddp_run)
    # before: fsdp skipped without a word, gate passed on ddp alone
    line = bad_input(cli("gate", str(root)), str(failed), "incomplete run", "--allow-incomplete")
    assert "did not complete" in line
    bad_input(cli("report", str(root), "--out", str(tmp_path / "r")), str(failed), "incomplete run")
    gate = cli("gate", str(root), "--allow-incomplete")
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert any(ln.startswith("SKIP fsdp: not_recorded") for ln in gate.stdout.splitlines())
    assert gate.stdout.splitlines()[-1] == ("gate: passed (1 incomplete run(s) skipped, not "
                                            "verified: fsdp)")
    rep = cli("report", str(root), "--allow-incomplete", "--out", str(tmp_path / "r"))
    assert rep.returncode == 0, rep.stderr
    md = (tmp_path / "r" / "report.md").read_text()
    # the verdict and the parity table say the same of fsdp: not verified, incomplete
    assert "Parity: not verified for fsdp (incomplete run" in md
    assert "| fsdp | not_recorded |" in md and "Parity: all" not in md
    assert "| fsdp | incomplete run (no manifest.json) |" in md  # settings: not "foreign"
    # only incomplete runs: nothing was verified, the gate fails
    only = tmp_path / "only"
    _baseline_only(only / "fsdp", ddp_run)
    gate = cli("gate", str(only), "--allow-incomplete")
    assert gate.returncode == 3 and "nothing was verified" in gate.stdout.splitlines()[-1]


def test_run_dir_being_recorded_is_incomplete_not_foreign(tmp_path, ddp_run):
    # mid-record: baseline placed, rank 0's trace written, no manifest yet (before: analysed
    # as a folder of foreign traces, parity "not recorded")
    run = _baseline_only(tmp_path / "ddp", ddp_run)
    shutil.copy(ddp_run / "rank0.trace.json.gz", run / "rank0.trace.json.gz")
    for cmd in ("report", "gate", "summary", "merge"):
        bad_input(cli(cmd, str(run)), str(run), "incomplete run")
    proc = cli("summary", str(run), "--allow-incomplete")
    assert proc.returncode == 0, proc.stderr
    # re-recording a finished run: tracer record's marker beside the previous manifest
    again = copy_run(ddp_run, tmp_path / "again")
    (again / ".tracer-recording").write_text("")
    for cmd in ("report", "gate"):
        bad_input(cli(cmd, str(again)), str(again), "incomplete run", ".tracer-recording marker")
    root = tmp_path / "root"
    copy_run(ddp_run, root / "ddp")
    (root / "ddp" / ".tracer-recording").write_text("")
    bad_input(cli("gate", str(root)), str(root / "ddp"), "incomplete run")


def test_analyzer_outputs_are_never_read_as_input(tmp_path, ddp_run):
    root = tmp_path / "traces"
    copy_run(ddp_run, root / "ddp")
    # a report folder of any name inside the root (before: "holds profiler traces that
    # `tracer record` did not write" for its report.json), merge outputs, tables caches
    assert cli("report", str(root), "--out", str(root / "mine")).returncode == 0
    assert cli("merge", str(root / "ddp"), "-o", str(tmp_path / "merged.trace.json.gz")).returncode == 0
    for _ in range(2):
        proc = cli("report", str(root))
        assert proc.returncode == 0, proc.stderr
    assert cli("gate", str(root)).returncode == 0
    # a folder of foreign traces with its report inside it, and one named "report" holding a run
    tb = tmp_path / "tb"
    tb.mkdir()
    for r in (0, 1):
        shutil.copy(ddp_run / f"rank{r}.trace.json.gz", tb / f"worker{r}.json.gz")
    assert cli("report", str(tb), "--out", str(tb / "out")).returncode == 0
    again = cli("report", str(tb), "--out", str(tb / "out"))
    listed = again.stdout.split("## Trace files")[1].split("\n## ")[0]  # the section only
    assert again.returncode == 0 and "report.json" not in listed and "worker0.json.gz" in listed
    named = tmp_path / "named"
    copy_run(ddp_run, named / "report")  # a run named like the output folder: a run
    proc = cli("report", str(named), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0 and f"{named / 'report' / 'rank0.trace.json.gz'}" in proc.stdout


def test_folder_of_symlinked_run_dirs_is_analysed(tmp_path, ddp_run):
    runs = tmp_path / "elsewhere"
    copy_run(ddp_run, runs / "ddp")
    (tmp_path / "notes").mkdir()
    links = tmp_path / "links"
    links.mkdir()
    os.symlink(runs / "ddp", links / "ddp")
    os.symlink(tmp_path / "notes", links / "notes")  # not a run dir: named, not followed
    os.symlink(tmp_path, links / "up")  # a loop: named, not followed
    # before: "holds no run directory (manifest.json) and no trace files"
    proc = cli("report", str(links), "--out", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    assert "| 1 | ddp |" in proc.stdout  # ranked first in the ranking table
    md = (tmp_path / "r" / "report.md").read_text()
    assert f"{links / 'notes'}: symlink to" in md.replace("\\", "")
    assert f"{links / 'up'}: symlink to" in md.replace("\\", "")
    assert cli("gate", str(links)).returncode == 0


@pytest.mark.integration
@needs_corpus
def test_folder_of_trace_subfolders_says_what_to_pass(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(corpus("tbplugin_2rank"), root / "tb")
    for cmd in ("summary", "merge"):  # before: "holds no *.json / *.json.gz trace files"
        line = bad_input(cli(cmd, str(root)), str(root), "only sub-folders of traces (tb)")
        assert f"pass one of them, e.g. {root / 'tb'}" in line


def test_drift_on_a_missing_path_says_it_does_not_exist(tmp_path, ddp_run):
    # before: "has no manifest.json (not a completed run directory)"
    bad_input(cli("drift", str(tmp_path / "nope"), str(ddp_run)), "nope", "no such file or folder")


def test_help_shows_debug_as_a_flag():
    proc = cli("--help")
    line = next(ln for ln in proc.stdout.splitlines() if "--debug" in ln)
    assert "<bool>" not in line and "Show tracebacks" in line  # before: `--debug <bool>`


@pytest.mark.parametrize("what", ["fifo", "device"])
def test_an_input_that_is_neither_a_folder_nor_a_file_is_one_line(tmp_path, what):
    from analyzer.contract.errors import BadInput
    from analyzer.ingest.rundirs import discover

    path = tmp_path / "rank0.json"
    if what == "fifo":
        os.mkfifo(path)
    else:
        path = "/dev/null"
    from analyzer.ingest.rundirs import find_job

    for look in (discover, find_job):
        with pytest.raises(BadInput) as exc:
            look(path)  # was NotADirectoryError, an internal error
        assert str(exc.value) == (f"{path}: is neither a folder nor a regular file; point at "
                                  "a folder of traces, a run directory or a trace file")


@pytest.mark.parametrize("fails", ["listing", "looking in"])
def test_a_folder_that_cannot_be_read_is_one_line(tmp_path, monkeypatch, fails):
    """A folder without read or search permission (chmod 000 / 300 / 400: root reads them
    all, so the refusal is planted where the OS raises it) is one line, not an internal
    error."""
    import pathlib

    from analyzer.contract.errors import BadInput
    from analyzer.ingest.rundirs import discover, find_job

    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "rank0.json").write_text('{"traceEvents": []}')

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    if fails == "listing":
        monkeypatch.setattr(os, "scandir", denied)
    else:
        real = pathlib.Path.is_file
        monkeypatch.setattr(pathlib.Path, "is_file",
                            lambda self: denied() if self.parent == folder else real(self))
    for look in (discover, find_job):
        with pytest.raises(BadInput) as exc:
            look(folder)  # was PermissionError, an internal error
        assert str(exc.value) == (f"{folder}: cannot read the folder (Permission denied); "
                                  "check the path and its permissions")
