"""What the commands print to a pipe or a narrow terminal: a reader that goes away (`| head -1`)
ends the command quietly, and summary's table headers are never cut."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.inputs import cli, copy_run


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
        rules = [ln for ln in proc.stdout.splitlines() if "──" in ln]  # under each header
        assert rules and max(len(ln) for ln in rules) <= 80
        # every table fits: no header word folded (before: ``comp / ute``, ``13.0 / 09 / ms``)
        assert "exposed" in proc.stdout and "compute" in proc.stdout
