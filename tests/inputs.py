"""Shared inputs of the behaviour tests: real corpus traces and real tracer run directories
(tests/records.py, the fixtures of tests/conftest.py), corrupted copy by
copy in tmp_path (never in place), and a CLI runner that checks the one-line error contract of
issue 5."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.remanifest import refresh_manifest
from tests.corpus import CORPUS, need  # noqa: F401 - used by the test modules
from tests.layers import unwatched

DLRM = CORPUS / "dlrm_ddp_8rank_v100"
TBPLUGIN = CORPUS / "tbplugin_2rank"
HANG_S = 300
"""Seconds after which a wait that normally ends in seconds (a process reaching a phase, a
command ending after a signal) is taken for a hang, on a loaded 2-core machine too: a hang
guard, never a speed check. A child process that does real work (a record, a report) gets no
limit of its own: the suite's pytest-timeout (pyproject.toml) stops a hung test."""


def default_signals() -> None:
    """``preexec_fn`` of a child a test stops with SIGINT, SIGQUIT or SIGHUP: those at their
    default action in it, as in a terminal's foreground job. A suite started in the background
    (``pytest &`` in a script: SIGINT and SIGQUIT ignored) or under nohup (SIGHUP ignored) hands
    its children the signals ignored, and the product keeps an inherited ignore on purpose
    (a nohup'd record survives its terminal): the test would wait for an exit that never comes."""
    for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


SHARED: dict[Path, dict[str, tuple[int, int]]] = {}
"""Folder a fixture shares -> its listing when the fixture made it (``listing``)."""


def listing(root: Path) -> dict[str, tuple[int, int]]:
    """Relative path -> (size, mtime ns) of every file and folder under ``root``."""
    out = {}
    with unwatched():  # the suite's own check: it reads the corpus for no test
        for p in root.rglob("*"):
            st = p.lstat()
            kept = p.is_file()
            out[p.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns) if kept else (0, 0)
    return out


def shared(path: Path) -> Path:
    """Mark ``path``, a folder a session- or module-scoped fixture returns, as read-only for the
    tests that use it (they copy it first: ``copy_run``). After each test, tests/conftest.py's
    ``_shared_folders_untouched`` fails the test that added, removed or changed a file there
    (an analyzer cache written beside a trace, a report written into the run): the next test
    would read another input than its neighbour did. Returns ``path``."""
    SHARED[path] = listing(path)
    return path


def copy_run(src: Path, dst: Path) -> Path:
    """Copy a run directory without its report folder (per-rank tables caches are copied:
    valid for the copy's identical traces)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("report"))
    return dst


def load(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def save(path: Path, trace: dict | bytes) -> Path:
    """Write ``trace``; inside a recorded run directory, re-write the manifest's size+sha256 of
    the edited file too (tests.remanifest), so the test checks what it edited the trace for and
    not the analyzer's changed-file check."""
    data = trace if isinstance(trace, bytes) else json.dumps(trace).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    if (path.parent / "manifest.json").is_file():
        refresh_manifest(path.parent)
    return path


def cli_proc(*args: str) -> subprocess.CompletedProcess:
    """Run the real console entry point in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "analyzer", *args], capture_output=True, text=True)


def cli(*args: str) -> subprocess.CompletedProcess:
    """Run ``analyzer.cli.app.main`` in this process with ``args`` (the same path a user's command
    takes: usage errors, typed errors and internal errors included), capturing stdout / stderr
    and the exit status. In-process because an interpreter start costs seconds on a loaded CI."""
    from analyzer.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["analyzer", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                rc = 0
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(list(args), rc, out.getvalue(), err.getvalue())


def bad_input(proc: subprocess.CompletedProcess, *must: str) -> str:
    """Assert the issue-5 contract for one problem: exit 2, no traceback, exactly one line on
    stderr that starts with ``analyzer:`` and holds every string in ``must``. Returns it."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("analyzer: ")
    for m in must:
        assert m in line, (m, line)
    return line
