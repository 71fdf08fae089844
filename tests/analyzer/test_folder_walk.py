"""What the folder walk finds and what it says: hidden files, temporary files and our own
outputs skipped and named; symlinks (a loop, a link out of the input) noted once; traces read
whatever their compression and name; partial rank sets and runs without a manifest (incomplete)
said; a root of foreign trace folders answered with advice that fits them."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from analyzer.api import load_tables
from analyzer.compare.runs import analyse
from analyzer.contract.errors import BadInput
from analyzer.contract.report_types import AnalysisOptions
from tests.inputs import CORPUS, DLRM, TBPLUGIN, bad_input, cli, copy_run, need
from tests.reports.builders import caveats, context, details


# hidden files, temporary files and our own outputs

def test_folder_skips_hidden_files_and_own_outputs(ddp_run, tmp_path):
    folder = tmp_path / "job"
    folder.mkdir()
    for r in (0, 1):
        shutil.copy(ddp_run / f"rank{r}.trace.json.gz", folder / f"worker{r}.json.gz")
    (folder / "._worker0.json").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X")
    raw = (ddp_run / "rank0.trace.json.gz").read_bytes()
    (folder / ".tmp-4242-rank0.trace.json.gz").write_bytes(raw[: len(raw) // 3])  # SIGKILLed
    first = cli("merge", str(folder))  # writes merged.trace.json.gz + merged.offsets.json here
    assert first.returncode == 0, first.stderr
    assert (folder / "merged.trace.json.gz").is_file() and (folder / "merged.offsets.json").is_file()
    hidden = ["._worker0.json", ".tmp-4242-rank0.trace.json.gz"]
    assert all(n in first.stdout for n in hidden), first.stdout
    for cmd, extra in (("summary", []), ("merge", ["-o", str(tmp_path / "m.json.gz")]),
                       ("report", ["--out", str(tmp_path / "rep")])):
        proc = cli(cmd, str(folder), *extra)
        assert proc.returncode == 0, (cmd, proc.stderr)
        said = proc.stdout + proc.stderr + (
            (tmp_path / "rep" / "report.md").read_text() if cmd == "report" else "")
        names = hidden + (["merged.trace.json.gz", "merged.offsets.json"] if cmd != "report" else [])
        if cmd != "report":
            for n in names:
                assert n in said, (cmd, n, said)
    from analyzer.api import load_tables

    ts = load_tables(folder)
    assert sorted(r.path.name for r in ts.ranks) == ["worker0.json.gz", "worker1.json.gz"]
    assert sum("skipped" in w for w in ts.warnings) == 4


def test_own_outputs_under_any_name_are_never_inputs(ddp_run, tmp_path):
    """summary -o, merge -o and report --out written into the folder of traces itself, under
    names no name rule knows: every later command skips them (said), and reads the two ranks."""
    folder = tmp_path / "job"
    folder.mkdir()
    for r in (0, 1):
        shutil.copy(ddp_run / f"rank{r}.trace.json.gz", folder / f"worker{r}.json.gz")
    assert cli("summary", str(folder), "--format", "json", "-o",
               str(folder / "s.json")).returncode == 0
    assert cli("merge", str(folder), "-o", str(folder / "all.json.gz")).returncode == 0
    assert cli("report", str(folder), "--out", str(folder), "--format", "json").returncode == 0
    for cmd in ("summary", "report"):
        extra = ["--out", str(tmp_path / "rep")] if cmd == "report" else []
        proc = cli(cmd, str(folder), *extra)
        assert proc.returncode == 0, (cmd, proc.stderr)
        for name in ("s.json", "all.json.gz", "report.json"):
            assert f"{folder / name}: " in proc.stdout + proc.stderr, (cmd, name)
    ts = load_tables(folder)
    assert sorted(r.path.name for r in ts.ranks) == ["worker0.json.gz", "worker1.json.gz"]


def test_run_dir_skips_tracer_temp_file(ddp_run, tmp_path):
    run = copy_run(ddp_run, tmp_path / "run")
    raw = (run / "rank0.trace.json.gz").read_bytes()
    (run / ".tmp-99-rank0.trace.json.gz").write_bytes(raw[:100])
    proc = cli("summary", str(run))
    assert proc.returncode == 0, proc.stderr
    assert ".tmp-99-rank0.trace.json.gz" in proc.stdout + proc.stderr


@pytest.mark.integration
def test_gzip_named_json_and_plain_json_named_gz_just_work(tmp_path):  # not an error at all
    job = tmp_path / "job"
    job.mkdir()
    (job / "worker0.json").write_bytes(gzip.compress(need(TBPLUGIN / "nccl__worker0.json").read_bytes()))
    (job / "worker1.json.gz").write_bytes((TBPLUGIN / "nccl__worker1.json").read_bytes())
    proc = cli("summary", str(job))
    assert proc.returncode == 0 and "2 of 2 ranks, rank from file name" in proc.stdout


# symlink notes (a loop, a link out of the input) said once by `analyzer report`

def _with_links(folder: Path, outside: Path) -> list[str]:
    """Add a symlink loop and a link out of ``folder``; returns the two link paths."""
    (folder / "loop").symlink_to(folder)
    (folder / "out.json").symlink_to(outside)
    return [str(folder / "loop"), str(folder / "out.json")]


def _count_notes(proc, out: Path, links: list[str]) -> list[tuple[int, int, int]]:
    md = (out / "report.md").read_text()
    warns = json.loads((out / "report.json").read_text())["warnings"]
    said = proc.stdout + proc.stderr
    return [(sum(ln.count(f"{link}: ") for ln in said.splitlines()),
             md.count(f"{link}: "), sum(w.count(f"{link}: ") for w in warns)) for link in links]


@pytest.mark.integration
def test_symlink_notes_said_once_for_a_folder_of_traces(tmp_path):
    src = need(CORPUS / "tbplugin_2rank")
    folder = tmp_path / "fo"
    folder.mkdir()
    for p in src.glob("gloo_cpu__worker*.json"):
        shutil.copy(p, folder / p.name)
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    links = _with_links(folder, outside)
    out = tmp_path / "r"
    proc = cli("report", str(folder), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert _count_notes(proc, out, links) == [(1, 1, 1), (1, 1, 1)]


def test_symlink_notes_said_once_for_an_incomplete_run(ddp_run, tmp_path):
    run = copy_run(ddp_run, tmp_path / "ddp")
    (run / "manifest.json").unlink()
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    links = _with_links(run, outside)
    out = tmp_path / "r"
    proc = cli("report", str(run), "--allow-incomplete", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert _count_notes(proc, out, links) == [(1, 1, 1), (1, 1, 1)]


def test_symlink_notes_said_once_in_a_traces_root(ddp_run, tmp_path):
    """Control: a traces root's own links and a run's links, each said once."""
    root = tmp_path / "traces"
    run = copy_run(ddp_run, root / "ddp")
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    (root / "away").symlink_to(tmp_path)
    (run / "out.json").symlink_to(outside)
    links = [str(root / "away"), str(run / "out.json")]
    out = tmp_path / "r"
    proc = cli("report", str(root), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert _count_notes(proc, out, links) == [(1, 1, 1), (1, 1, 1)]


# partial rank sets, incomplete runs, folders of foreign traces under a root

@pytest.mark.integration
def test_missing_ranks_are_said_and_the_report_is_not_presented_as_complete(tmp_path):
    job = tmp_path / "job"
    shutil.copytree(need(DLRM), job)
    (job / "worker5.pt.trace.json.gz").unlink()
    ts = load_tables(job)
    assert ts.world_size == 8 and ts.missing_ranks == [5]
    proc = cli("summary", str(job))
    assert proc.returncode == 0 and "7 of 8 ranks" in proc.stdout and "rank 5)" in proc.stdout
    proc = cli("report", str(job), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0
    assert "job: partial: 7 of 8 ranks have a trace (no trace: rank 5)" in caveats(proc.stdout)
    assert ("Partial rank set (1 of 1 run): job: 1 of 8 ranks missing; cross-rank figures "
            "cover the traced ranks only.") in context(proc.stdout)


def test_run_directory_without_manifest(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    (job / "manifest.json").unlink()
    for cmd in ("summary", "report", "gate", "merge"):
        bad_input(cli(cmd, str(job)), str(job), "incomplete run", "--allow-incomplete")
    with pytest.raises(BadInput) as exc:
        analyse(job)
    assert exc.value.reason == "incomplete_run"
    proc = cli("report", str(job), "--allow-incomplete", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0
    said = caveats(proc.stdout)  # the incomplete run's, and whatever the recording's clocks add
    assert said[0] == "ddp: incomplete run (no manifest.json), analysed as found"
    count = f"{len(said)} caveat{'' if len(said) == 1 else 's'} on how figures were measured: see Caveats."
    assert count in details(proc.stdout)
    rep = analyse(job, AnalysisOptions(allow_incomplete=True))
    run = rep.runs[0]
    assert run.incomplete and run.parity.status == "not_recorded"
    assert rep.ranking.status == "withheld"
    proc = cli("gate", str(job), "--allow-incomplete")
    assert proc.returncode == 3 and "incomplete run" in proc.stdout
    proc = cli("merge", str(job), "--allow-incomplete", "-o", str(tmp_path / "m.json.gz"))
    assert proc.returncode == 0 and "incomplete run" in proc.stdout


@pytest.mark.integration
def test_root_of_foreign_trace_folders_advises_one_folder_at_a_time(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    dlrm = root / "dlrm"
    shutil.copytree(need(DLRM), dlrm)
    tb = root / "tb_nccl"
    tb.mkdir()
    for r in (0, 1):
        shutil.copy(need(TBPLUGIN / f"nccl__worker{r}.json"), tb)
    for extra in ([], ["--allow-incomplete"]):
        for cmd in ("report", "gate"):
            proc = cli(cmd, str(root), *extra)
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
            assert len(lines) == 2, lines  # one per folder
            for line, sub in zip(lines, (dlrm, tb)):
                assert line.startswith(f"analyzer: {sub}: ") and "did not write" in line
                assert f"`analyzer report {sub}`" in line
                assert "re-record" not in line and "did not complete" not in line
    # the advice works: the folder alone is analysed (foreign: parity not recorded)
    proc = cli("report", str(tb), "--out", str(tmp_path / "rep"))
    assert proc.returncode == 0 and "not_recorded" in proc.stdout, proc.stderr
    # a sub-folder with a trace named as the tracer names them is still an incomplete run,
    # refused with the re-record advice unless --allow-incomplete
    inc = root / "ddp"
    inc.mkdir()
    shutil.copy(tb / "nccl__worker0.json", inc / "rank0.trace.json.gz")
    proc = cli("report", str(root))
    assert f"analyzer: {inc}: incomplete run: no manifest.json" in proc.stderr
    assert (f"re-record it (tracer record ... --out {root} --name ddp) or delete the folder "
            f"{inc}; or pass --allow-incomplete to analyse as found") in proc.stderr
