"""What the commands print to a pipe or a narrow terminal: a reader that goes away (`| head -1`)
ends the command quietly, and summary's table headers are never cut."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.inputs import HANG_S, cli, copy_run


@pytest.mark.integration
@pytest.mark.parametrize("cmd", ["summary", "drift", "report"])
def test_closed_pipe_exits_quietly(ddp_run, tmp_path, cmd):
    run = copy_run(ddp_run, tmp_path / "run")
    args = {"summary": [str(run)], "drift": [str(run), str(run)],
            "report": [str(run), "--out", str(tmp_path / "rep")]}[cmd]
    proc = subprocess.Popen([sys.executable, "-m", "analyzer", cmd, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the interpreter has even started: every write hits EPIPE
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=HANG_S)
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
    lines = proc.stdout.splitlines()
    rules = [i for i, ln in enumerate(lines) if "──" in ln]  # the rule under each header
    # whole words in the headers themselves (the prose around the tables says "rank", "step"
    # ... too), at any width: no header word folded (before: ``comp / ute``)
    headers = set()
    for i in rules:
        top = i
        while top > 0 and lines[top - 1].strip():
            top -= 1
        headers.update(w for ln in lines[top:i] for w in ln.split())
    assert {"rank", "step", "compute", "exposed", "kind"} <= headers, headers
    if columns:  # every table fits the 80 columns asked for
        assert rules and max(len(lines[i]) for i in rules) <= 80


FORGED = "x\ngate: passed"
RLO = "\u202e"


def _named(run, name: str):
    """``run`` with its manifest's run_name (the name every report and gate line shows) set
    to ``name``."""
    import json

    m = json.loads((run / "manifest.json").read_text())
    m["run_name"] = name
    (run / "manifest.json").write_text(json.dumps(m))
    return run


def test_a_name_with_a_newline_cannot_forge_a_gate_line(fsdp_fault_run, tmp_path):
    """A run named with a newline and a fake verdict: every gate line stays one line (the
    newline shown as \\n), so no line reads ``gate: passed`` but the real verdict."""
    root = tmp_path / "traces"
    _named(copy_run(fsdp_fault_run, root / "fsdp"), FORGED)
    proc = cli("gate", str(root))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert not [ln for ln in lines if ln.startswith("gate: passed")], lines
    assert lines[-1].startswith("gate: FAILED")
    assert any("x\\ngate: passed" in ln for ln in lines), lines


def test_bidi_overrides_are_shown_not_applied(ddp_run, tmp_path):
    """U+202E in a run name reaches report.md, report.html and the terminal as the text
    \\u202e, never as the character that reverses what follows it."""
    root = tmp_path / "traces"
    _named(copy_run(ddp_run, root / "ddp"), f"ddp{RLO}exe.fdp")
    out = tmp_path / "rep"
    proc = cli("report", str(root), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    for name in ("report.md", "report.html"):
        text = (out / name).read_text()
        assert RLO not in text, name
        assert "u202e" in text, name
    assert RLO not in proc.stdout + proc.stderr
    gate = cli("gate", str(root))
    assert RLO not in gate.stdout + gate.stderr and "\\u202e" in gate.stdout


def test_report_lines_around_a_folder_name_stay_one_line(ddp_run, tmp_path):
    """A folder named with a newline and U+202E: the stderr lines of report (wrote ... to
    FOLDER) stay one line each, the newline shown as \\n, the override as \\u202e."""
    root = tmp_path / f"nl\nname{RLO}dir"
    copy_run(ddp_run, root / "ddp")
    proc = cli("report", str(root), "--format", "md")
    assert proc.returncode == 0, proc.stderr
    wrote = [ln for ln in proc.stderr.splitlines() if "wrote" in ln]
    assert len(wrote) == 1 and "nl\\nname\\u202edir" in wrote[0], proc.stderr
    assert RLO not in proc.stderr


def test_contract_one_line_shows_what_would_break_a_line():
    from analyzer.contract.text import one_line

    assert one_line(f"a\nb\r\nc{RLO}d\x1b[31m") == "a\\nb\\nc\\u202ed[31m"
