"""Bugs a new-user test found: merge -o onto a folder, a closed output pipe, tolerance hints,
a tamper error said twice, a text file called truncated JSON, cut table headers, hidden files
and our own outputs in a trace folder, and two jobs' traces mixed in one folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analyzer.contract.errors import BadInput
from tests.reliability.conftest import DLRM, TBPLUGIN, TINY, bad_input, cli, copy_run, need


@pytest.fixture(scope="session")
def fsdp_run(tmp_path_factory) -> Path:
    """A real 2-rank gloo FSDP run directory (same tiny model as ``ddp_run``)."""
    out = tmp_path_factory.mktemp("rel-fsdp") / "traces"
    args = [a if a != "ddp" else "fsdp" for a in TINY]
    proc = subprocess.run([sys.executable, "-m", "tracer", "record", *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "fsdp"


# 1. merge -o onto an existing directory

def test_merge_out_is_a_directory(ddp_run, tmp_path):
    run = copy_run(ddp_run, tmp_path / "run")
    target = tmp_path / "somedir"
    target.mkdir()
    line = bad_input(cli("merge", str(run), "-o", str(target)), str(target), "-o", "directory")
    assert "merged.trace.json.gz" in line  # says what to pass instead
    assert list(target.iterdir()) == []


# 2. the reader of stdout goes away (`| head -1`)

@pytest.mark.parametrize("cmd", ["summary", "drift", "report"])
def test_closed_pipe_exits_quietly(ddp_run, tmp_path, cmd):
    run = copy_run(ddp_run, tmp_path / "run")
    args = {"summary": [str(run)], "drift": [str(run), str(run)],
            "report": [str(run), "--out", str(tmp_path / "rep")]}[cmd]
    proc = subprocess.Popen([sys.executable, "-m", "analyzer", cmd, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the interpreter has even started: every write hits EPIPE
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=300)
    assert rc == 0, err
    assert err == "", err  # no traceback, no "internal error", no "Exception ignored"


# 3. each tolerance option's hint names that option

@pytest.mark.parametrize("opt", ["--atol", "--rtol"])
def test_bad_tolerance_hint_names_its_option(ddp_run, tmp_path, opt):
    run = copy_run(ddp_run, tmp_path / "run")
    other = "--rtol" if opt == "--atol" else "--atol"
    for args in (["gate", str(run)], ["drift", str(run), str(run)],
                 ["report", str(run), "--out", str(tmp_path / "rep")]):
        line = bad_input(cli(*args, opt, "inf"), opt, f"e.g. {opt} ")
        assert other not in line, line


# 4. a tampered kept tensor is reported once

def test_tamper_error_printed_once(ddp_run, tmp_path):
    from safetensors.numpy import load_file, save_file

    a = copy_run(ddp_run, tmp_path / "a")
    b = copy_run(ddp_run, tmp_path / "b")
    path = b / "baseline.safetensors"
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    changed = tensors[name].copy()
    changed.view(np.uint8).flat[0] ^= 1  # one byte
    tensors[name] = changed
    save_file(tensors, str(path))
    line = bad_input(cli("drift", str(a), str(b)), str(path), f"tensor {name} changed")
    assert line.count("changed after the record") == 1


# 5. a text file is "not JSON", a cut trace is "truncated"

def test_text_file_is_not_json(tmp_path):
    txt = tmp_path / "file.txt"
    txt.write_text("hello world\nthis is not a trace\n")
    line = bad_input(cli("summary", str(txt)), str(txt), "not JSON", "not a Chrome/Kineto trace")
    assert "truncated" not in line and "copy the trace again" not in line
    cut = tmp_path / "cut.json"
    cut.write_text('{"traceEvents": [{"ph": "X", "name": "a"')
    assert "truncated" in bad_input(cli("summary", str(cut)), str(cut))


# 6. summary tables readable when piped or narrow

@pytest.mark.parametrize("columns", [None, "80"])
def test_summary_headers_not_cut(ddp_run, tmp_path, monkeypatch, columns):
    run = copy_run(ddp_run, tmp_path / "run")
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    proc = cli("summary", str(run))
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout, proc.stdout
    for word in ("rank", "step", "compute", "exposed", "kind"):  # whole words in the headers
        assert word in proc.stdout or columns, word
    if columns:
        rows = [ln for ln in proc.stdout.splitlines() if ln[:1] in "┏┃┡│└"]  # table lines
        assert rows and max(len(ln) for ln in rows) <= 80


# 7. hidden files and our own outputs are skipped, and named

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


def test_run_dir_skips_tracer_temp_file(ddp_run, tmp_path):
    run = copy_run(ddp_run, tmp_path / "run")
    raw = (run / "rank0.trace.json.gz").read_bytes()
    (run / ".tmp-99-rank0.trace.json.gz").write_bytes(raw[:100])
    proc = cli("summary", str(run))
    assert proc.returncode == 0, proc.stderr
    assert ".tmp-99-rank0.trace.json.gz" in proc.stdout + proc.stderr


# 8. two jobs' traces mixed in one folder

def test_mixed_jobs_refused(ddp_run, fsdp_run, tmp_path):
    folder = tmp_path / "mix"
    folder.mkdir()
    shutil.copy(ddp_run / "rank0.trace.json.gz", folder / "ddp_rank0.json.gz")
    shutil.copy(fsdp_run / "rank1.trace.json.gz", folder / "fsdp_rank1.json.gz")
    for cmd, extra in (("summary", []), ("report", ["--out", str(tmp_path / "rep")])):
        line = bad_input(cli(cmd, str(folder), *extra), "different jobs", "ddp_rank0.json.gz",
                         "fsdp_rank1.json.gz")
        assert "all_reduce" in line and "all_gather" in line  # the evidence
    from analyzer.api import load_tables

    with pytest.raises(BadInput) as exc:
        load_tables(folder)
    assert exc.value.reason == "mixed_jobs"


def test_same_job_sets_still_load(ddp_run, fsdp_run, tmp_path):
    from analyzer.api import load_tables

    folders = [copy_run(ddp_run, tmp_path / "ddp"), copy_run(fsdp_run, tmp_path / "fsdp")]
    if DLRM.exists():
        folders.append(DLRM)
    for backend in ("gloo_cpu", "nccl"):
        pair = tmp_path / f"tb_{backend}"
        pair.mkdir()
        for r in (0, 1):
            shutil.copy(need(TBPLUGIN / f"{backend}__worker{r}.json"), pair)
        folders.append(pair)
    for folder in folders:
        ts = load_tables(folder)
        assert len(ts.ranks) == (8 if folder == DLRM else 2), folder
