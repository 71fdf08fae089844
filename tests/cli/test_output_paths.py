"""Where `report --out`, `merge -o` and `summary -o` write, and what they refuse: a folder
marked read-only, an existing folder where a file is written, a file where a folder is needed,
an unwritable parent. Nothing of the user's is overwritten, no temporary file is left, and
report files of an earlier analysis in the same folder are removed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.inputs import DLRM, bad_input, cli, copy_run, need


@pytest.fixture
def dlrm_copy(tmp_path) -> Path:
    """A writable copy of the 8-rank DLRM corpus folder (the corpus itself is never touched)."""
    dst = tmp_path / "dlrm"
    shutil.copytree(need(DLRM), dst)
    for p in (dst, *dst.iterdir()):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


@pytest.fixture
def read_only_dlrm(dlrm_copy) -> Path:
    """``dlrm_copy`` marked read-only (mode 0o555); made writable again afterwards so that
    pytest can remove it."""
    dlrm_copy.chmod(0o555)
    yield dlrm_copy
    dlrm_copy.chmod(0o755)


# merge: a read-only folder, -o onto a folder

@pytest.mark.integration
def test_merge_refuses_read_only_folder(read_only_dlrm):
    before = sorted(p.name for p in read_only_dlrm.iterdir())
    line = bad_input(cli("merge", str(read_only_dlrm)), str(read_only_dlrm), "read-only", "-o")
    assert "--out" not in line  # merge's option is -o
    assert sorted(p.name for p in read_only_dlrm.iterdir()) == before


@pytest.mark.integration
def test_merge_refuses_read_only_out_folder(dlrm_copy, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    try:
        bad_input(cli("merge", str(dlrm_copy), "-o", str(locked / "sub" / "m.trace.json.gz")),
                  str(locked), "read-only")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


@pytest.mark.integration
def test_merge_of_read_only_folder_with_o_elsewhere_works(read_only_dlrm, tmp_path):
    """The refusal is about where the output goes, not about reading a read-only folder."""
    target = tmp_path / "out" / "m.trace.json.gz"
    proc = cli("merge", str(read_only_dlrm), "-o", str(target))
    assert proc.returncode == 0, proc.stderr
    assert target.is_file() and (target.parent / "m.offsets.json").is_file()
    ranks = json.loads((target.parent / "m.offsets.json").read_text())
    assert len(ranks["offsets"]) == 8  # worker0..worker7 in the corpus folder


def test_merge_out_is_a_directory(ddp_run, tmp_path):
    run = copy_run(ddp_run, tmp_path / "run")
    target = tmp_path / "somedir"
    target.mkdir()
    line = bad_input(cli("merge", str(run), "-o", str(target)), str(target), "-o", "directory")
    assert "merged.trace.json.gz" in line  # says what to pass instead
    assert list(target.iterdir()) == []


# summary -o: onto a folder, under a file, atomically, only with --format json

def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or "tmp" in p.name)


def test_summary_json_out_is_a_directory(tmp_path):
    target = tmp_path / "somedir"
    target.mkdir()
    line = bad_input(cli("summary", str(need(DLRM)), "--format", "json", "-o", str(target)),
                     str(target), "-o", "directory")
    assert "summary.json" in line  # says what to pass instead
    assert list(target.iterdir()) == []
    assert _leftovers(tmp_path) == []


@pytest.mark.integration
def test_summary_json_unwritable_parent_is_bad_input(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    bad_input(cli("summary", str(need(DLRM)), "--format", "json", "-o", str(blocker / "s.json")),
              str(blocker / "s.json"), "cannot be written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_summary_atomic_writer_removes_its_temp_file(tmp_path):
    from analyzer.contract.atomic import write_atomic as _write_atomic

    target = tmp_path / "s.json"
    target.mkdir()  # os.replace of a file onto a directory fails after the temp file is written
    with pytest.raises(IsADirectoryError):
        _write_atomic(target, "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]
    _write_atomic(tmp_path / "t.json", '{"a": 1}')
    assert json.loads((tmp_path / "t.json").read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json", "t.json"]


@pytest.mark.integration
def test_summary_json_to_file(tmp_path):
    out = tmp_path / "deep" / "s.json"
    proc = cli("summary", str(need(DLRM)), "--format", "json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    # the corpus folder holds worker0..worker7: one rank each
    assert sorted({row["rank"] for row in data["breakdown"]}) == list(range(8))
    assert _leftovers(out.parent) == []


@pytest.mark.parametrize("fmt", [[], ["--format", "table"]], ids=["default", "table"])
def test_summary_table_with_o_is_a_usage_error(tmp_path, fmt):
    out = tmp_path / "out.txt"
    proc = cli("summary", str(need(DLRM)), *fmt, "-o", str(out))
    bad_input(proc, "-o", "--format json")
    assert proc.stdout == ""  # refused before any analysis: no table printed either
    assert list(tmp_path.iterdir()) == []


# report --out: onto a file (checked after the input), stale report files removed

@pytest.mark.parametrize("below", [False, True], ids=["the-file", "a-folder-under-it"])
def test_report_out_onto_a_file(ddp_run, tmp_path, below):
    afile = tmp_path / "report.md"
    afile.write_text("keep me")
    out = afile / "sub" if below else afile
    line = bad_input(cli("report", str(ddp_run.parent), "--out", str(out)),
                     str(afile), "is a file, not a folder", "pass --out a folder")
    assert "File exists" not in line and "cannot be written" not in line
    assert afile.read_text() == "keep me"


def test_report_input_error_comes_before_out_error(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    bad_input(cli("report", str(tmp_path / "missing"), "--out", str(afile)),
              str(tmp_path / "missing"), "no such file or folder")


def test_report_out_is_an_existing_file(tmp_path, ddp_run):
    (tmp_path / "notes.txt").write_text("mine")
    bad_input(cli("report", str(ddp_run), "--out", str(tmp_path / "notes.txt")),
              "is a file, not a folder", "--out")
    assert (tmp_path / "notes.txt").read_text() == "mine"  # nothing of the user's is overwritten


@pytest.mark.integration
def test_report_removes_formats_not_written_this_time(dlrm_copy, tmp_path):
    out = tmp_path / "rep"
    assert cli("report", str(dlrm_copy), "--out", str(out)).returncode == 0
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "report.md"]
    for name in ("report.css", "report.md.bak", "notes.txt"):  # not ours: never touched
        (out / name).write_text("keep")

    proc = cli("report", str(dlrm_copy), "--out", str(out), "--format", "md")
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "removed" in ln]
    assert len(said) == 1, proc.stderr
    assert f"{out}: removed report.json, report.html of" in said[0], said
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "report.css", "report.md",
                                                     "report.md.bak"]
    # the report.md left is this analysis's: the same text as into an empty folder
    fresh = tmp_path / "fresh"
    assert cli("report", str(dlrm_copy), "--out", str(fresh), "--format", "md").returncode == 0
    assert (out / "report.md").read_text() == (fresh / "report.md").read_text()

    proc = cli("report", str(dlrm_copy), "--out", str(out), "--format", "json,html")
    assert proc.returncode == 0, proc.stderr
    said = [ln for ln in proc.stderr.splitlines() if "removed" in ln]
    assert len(said) == 1 and "removed report.md of" in said[0], said
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("report.")) == [
        "report.css", "report.html", "report.json", "report.md.bak"]


@pytest.mark.integration
def test_report_same_formats_again_removes_nothing(dlrm_copy, tmp_path):
    out = tmp_path / "rep"
    for _ in range(2):
        proc = cli("report", str(dlrm_copy), "--out", str(out), "--format", "md,json")
        assert proc.returncode == 0, proc.stderr
        assert "removed" not in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]


@pytest.mark.integration
def test_report_never_replaces_report_files_of_the_users_own(dlrm_copy, tmp_path, monkeypatch):
    """A report.md / report.json in --out that the analyzer did not write (no record of it,
    not a paritytrace report) is refused in one line, exit 2, and left as it was; the
    analyzer's own earlier reports are replaced, even after the records were cleared."""
    out = tmp_path / "rep"
    out.mkdir()
    (out / "report.md").write_text("# my notes\n")
    (out / "report.json").write_text('{"mine": 1}')
    proc = cli("report", str(dlrm_copy), "--out", str(out), "--format", "md,json")
    bad_input(proc, f"{out / 'report.md'}: was not written by analyzer report", "another --out")
    assert "(also report.json)" in proc.stderr
    assert (out / "report.md").read_text() == "# my notes\n"
    assert (out / "report.json").read_text() == '{"mine": 1}'

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    mine = tmp_path / "ours"
    assert cli("report", str(dlrm_copy), "--out", str(mine)).returncode == 0
    shutil.rmtree(tmp_path / "xdg" / "paritytrace")  # README's clearing recipe
    again = cli("report", str(dlrm_copy), "--out", str(mine))
    assert again.returncode == 0, again.stderr


def test_concurrent_reports_of_other_formats_keep_each_others_files(tmp_path, monkeypatch):
    """Two reports into one folder at once, --format json and --format md: the md report's
    prune must not remove the json the other wrote after the md report began (nor may the
    record forget it); a json from before it began is an earlier analysis's and goes."""
    import hashlib
    import os

    from reports import cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    out = tmp_path / "rep"
    out.mkdir()
    started = cache.fs_now_ns()
    text = '{"schema_version": 1}'
    sha = hashlib.sha256(text.encode()).hexdigest()
    (out / "report.json").write_text(text)
    cache.remove_stale(out, [], {"report.json": sha})  # the json report's own record
    os.utime(out / "report.json", ns=(started + 10**9, started + 10**9))
    with cache.out_lock(out):
        removed, left = cache.remove_stale(out, ["report.json"], {"report.md": "m"}, started)
    assert (removed, left) == ([], []) and (out / "report.json").is_file()
    record = json.loads(cache._written_path(out).read_text())
    assert record == {"report.md": "m", "report.json": sha}
    os.utime(out / "report.json", ns=(started - 10**9, started - 10**9))
    removed, _ = cache.remove_stale(out, ["report.json"], {"report.md": "m"}, started)
    assert removed == ["report.json"] and not (out / "report.json").exists()


@pytest.mark.parametrize("target", ["rank0.trace.json.gz", "manifest.json", "rank1.trace.json.gz"])
def test_summary_o_never_writes_over_an_input(ddp_run, tmp_path, target):
    """summary -o onto a trace it reads or the run's manifest: one line (out_is_input), exit 2,
    the file unchanged, as merge -o refuses."""
    run = copy_run(ddp_run, tmp_path / "ddp")
    before = (run / target).read_bytes()
    proc = cli("summary", str(run), "--format", "json", "-o", str(run / target))
    bad_input(proc, f"{run / target}: is {target}, one of the files summarised", "-o")
    assert (run / target).read_bytes() == before


@pytest.mark.integration
def test_report_never_replaces_a_report_edited_since_it_was_written(dlrm_copy, tmp_path,
                                                                    monkeypatch):
    """The analyzer's own report.md, edited by the user (the record's SHA-256 differs): the
    next report into that folder refuses in one line and leaves the edit."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    out = tmp_path / "rep"
    assert cli("report", str(dlrm_copy), "--out", str(out)).returncode == 0
    edited = (out / "report.md").read_text() + "\nmy notes\n"
    (out / "report.md").write_text(edited)
    bad_input(cli("report", str(dlrm_copy), "--out", str(out)),
              f"{out / 'report.md'}: was not written by analyzer report")
    assert (out / "report.md").read_text() == edited


@pytest.mark.parametrize("kind", ["symlink", "fifo", "sidecar_symlink"])
def test_merge_never_replaces_what_is_not_a_regular_file(ddp_run, tmp_path, kind):
    """-o onto a link (e.g. to /dev/stdout), a FIFO or a device: the write would rename a new
    file over it; refused, one line, the link and what it points at untouched."""
    import os

    run = copy_run(ddp_run, tmp_path / "run")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    target = tmp_path / "m.trace.json.gz"
    if kind == "symlink":
        target.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        (tmp_path / "m.offsets.json").symlink_to(victim)
    named = target if kind != "sidecar_symlink" else tmp_path / "m.offsets.json"
    what = "a FIFO" if kind == "fifo" else "a symlink"
    bad_input(cli("merge", str(run), "-o", str(target)), str(named), what, "not a regular file")
    assert victim.read_text() == "keep"
    assert named.is_symlink() or kind == "fifo"


def test_summary_never_replaces_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    (tmp_path / "s.json").symlink_to(victim)
    bad_input(cli("summary", str(need(DLRM)), "--format", "json", "-o", str(tmp_path / "s.json")),
              str(tmp_path / "s.json"), "a symlink", "not a regular file")
    assert victim.read_text() == "keep" and (tmp_path / "s.json").is_symlink()
