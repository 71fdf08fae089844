"""Confinement (issue 17 item 7): what a run directory's manifest names stays inside it and
is all checked; the analyzer writes only where it should and removes only what it wrote.

Oracles: run directories built by the test (tests/reports/builders.py, manifest files listed
with hashlib as the tracer does) and edited one fault at a time; files outside the input
whose content the test knows and checks unchanged afterwards."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from analyzer.contract import schemas
from tests.inputs import bad_input, cli
from tests.merge.builders import gloo_rank, write
from tests.reports.builders import write_run


def _run(path: Path, *, traces: bool = True) -> Path:
    """A complete 2-rank run directory: traces (when ``traces``), numerics, steps, manifest
    listing every file."""
    path.mkdir(parents=True)
    if traces:
        for r in (0, 1):
            t = gloo_rank(r, 2, offset_us=0.0, ends_us=[600.0, 1600.0])
            t["distributedInfo"] = {"rank": r, "world_size": 2, "backend": "gloo"}
            write(path / f"rank{r}.trace.json.gz", t)
    write_run(path, strategy="ddp", walls={0: (5, 5), 1: (6, 6), 2: (7, 7)})
    return path


def _edit(run: Path, fn) -> None:
    m = json.loads((run / schemas.MANIFEST_NAME).read_text())
    fn(m)
    (run / schemas.MANIFEST_NAME).write_text(json.dumps(m))


@pytest.mark.parametrize("bad,why", [("/etc/passwd", "is absolute"),
                                     ("../outside.parquet", "climbs out of the run directory"),
                                     ("sub/../../x", "climbs out"), ("", "is empty")])
def test_manifest_path_absolute_or_with_dotdot_is_refused(tmp_path, bad, why):
    run = _run(tmp_path / "ddp")
    _edit(run, lambda m: m["files"].append({"path": bad, "size_bytes": 1, "sha256": "0" * 64}))
    for cmd in ("report", "gate", "summary", "merge"):
        bad_input(cli(cmd, str(run)), "manifest.json", "$.files[4].path", why)


def test_manifest_path_through_a_symlink_out_of_the_run_is_refused(tmp_path):
    run = _run(tmp_path / "ddp")
    outside = tmp_path / "elsewhere.parquet"
    shutil.move(run / "steps.parquet", outside)
    os.symlink(outside, run / "steps.parquet")
    for cmd in ("report", "gate", "summary", "merge"):
        bad_input(cli(cmd, str(run)), "manifest.json", "'steps.parquet'",
                  "outside the run directory", "replace the link")
    # a link that stays inside the run directory is fine
    os.unlink(run / "steps.parquet")
    shutil.move(outside, run / "real.parquet")
    os.symlink("real.parquet", run / "steps.parquet")
    assert cli("gate", str(run)).returncode == 0


def test_manifest_with_an_empty_files_list_is_refused(tmp_path):
    run = _run(tmp_path / "ddp")
    assert cli("gate", str(run)).returncode == 0
    _edit(run, lambda m: m.update(files=[]))
    for cmd in ("report", "gate", "summary", "merge"):
        bad_input(cli(cmd, str(run)), "manifest.json", "lists no files", "re-record")


def test_trace_not_listed_in_the_manifest_is_named(tmp_path):
    run = _run(tmp_path / "ddp")
    _edit(run, lambda m: m.update(files=[f for f in m["files"]
                                         if f["path"] != "rank1.trace.json.gz"]))
    for cmd in ("report", "gate", "summary", "merge"):
        bad_input(cli(cmd, str(run)), "rank1.trace.json.gz", "not listed in manifest.json")


@pytest.mark.parametrize("version", ["x", True, 0, -3, 1.5, None])
def test_garbage_schema_version_in_a_manifest_is_bad_input(tmp_path, version):
    run = _run(tmp_path / "ddp", traces=False)
    _edit(run, lambda m: m.update(schema_version=version))
    for cmd in ("report", "gate", "summary"):
        bad_input(cli(cmd, str(run)), "manifest.json", "schema_version", "not a version number")


def test_garbage_schema_version_in_a_parquet_file_is_bad_input(tmp_path):
    import pyarrow.parquet as pq

    from tests.remanifest import refresh_manifest

    run = _run(tmp_path / "ddp", traces=False)
    table = pq.read_table(run / "numerics.parquet")
    pq.write_table(table.replace_schema_metadata({b"paritytrace.schema_version": b"v1;drop"}),
                   run / "numerics.parquet")
    refresh_manifest(run)
    bad_input(cli("gate", str(run)), "numerics.parquet", "not a version number")


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_default_report_folder_that_is_a_symlink_is_refused(tmp_path, where):
    root = tmp_path / "root"
    _run(root / "ddp", traces=False)
    target = tmp_path / "victim" if where == "outside" else root / "elsewhere"
    target.mkdir()
    (target / "report.md").write_text("someone's notes")
    os.symlink(target, root / "report")
    bad_input(cli("report", str(root)), str(root / "report"), "symlink", "--out")
    assert [p.name for p in target.iterdir()] == ["report.md"]
    assert (target / "report.md").read_text() == "someone's notes"
    assert cli("report", str(root), "--out", str(tmp_path / "o")).returncode == 0


def test_stale_removal_leaves_a_report_file_the_analyzer_did_not_write(tmp_path):
    root = tmp_path / "root"
    _run(root / "ddp", traces=False)
    out = tmp_path / "docs"
    out.mkdir()
    (out / "report.html").write_text("<p>my own page</p>")  # the user's, not the analyzer's
    proc = cli("report", str(root), "--out", str(out), "--format", "md")
    assert proc.returncode == 0, proc.stderr
    assert (out / "report.html").read_text() == "<p>my own page</p>"
    assert "left report.html, not written by the analyzer" in proc.stderr
    # what the analyzer wrote, unchanged since, is removed when a later run drops the format
    assert cli("report", str(root), "--out", str(out), "--format", "md,json").returncode == 0
    (out / "report.html").unlink()
    proc = cli("report", str(root), "--out", str(out), "--format", "md")
    assert proc.returncode == 0 and not (out / "report.json").exists(), proc.stderr
    assert "removed report.json" in proc.stderr
    # edited since the analyzer wrote it: left, and said so
    assert cli("report", str(root), "--out", str(out), "--format", "md,json").returncode == 0
    (out / "report.json").write_text("{}")
    proc = cli("report", str(root), "--out", str(out), "--format", "md")
    assert (out / "report.json").read_text() == "{}" and "left report.json" in proc.stderr


@pytest.mark.parametrize("target", ["rank1.trace.json.gz", "manifest.json", "link"])
def test_merge_out_onto_one_of_its_inputs_is_refused(tmp_path, target):
    run = _run(tmp_path / "ddp")
    if target == "link":  # the same file through a link
        os.symlink(run / "rank0.trace.json.gz", tmp_path / "link.json.gz")
        out = tmp_path / "link.json.gz"
    else:
        out = run / target
    before = (run / "rank0.trace.json.gz").read_bytes(), (run / target).read_bytes() \
        if target != "link" else b""
    # a link is refused as a link before it is resolved (outpaths: never written through)
    said = "a symlink, not a regular file" if target == "link" else "one of the files merged"
    bad_input(cli("merge", str(run), "-o", str(out)), str(out), said)
    assert before == ((run / "rank0.trace.json.gz").read_bytes(), (run / target).read_bytes()
                      if target != "link" else b"")
    assert cli("merge", str(run), "-o", str(tmp_path / "m.json.gz")).returncode == 0
