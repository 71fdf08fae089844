"""Every configuration the record layer shares, made once per test run and read by many tests.

``RECORDS`` names each configuration once (``tracer record`` arguments, ``--out`` aside). A test
or fixture asks for one with ``recorded(NAME, tmp_path_factory)``: the first pytest-xdist worker
that needs it records it into the run's shared temp root under a file lock; the other workers wait on
that lock (an event, not a sleep) and read the same folder. The folder is shared read-only
(``tests.inputs.shared``): a test that must alter a run copies it (``tests.inputs.copy_run``).
A record that failed is recorded as failed, and every test that needs it fails with its stderr
(it is not run again). Reading one needs the ``record`` mark (tests/layers.py).

The fast layer does not record: ``committed(NAME)`` gives the run directories of
``fixtures/recorded/``, written by ``python3 -m tests.records fixtures/recorded`` from the same
configurations (``COMMITTED``); ``tests/tracer/test_recorded_fixtures.py`` records them anew
and fails when today's tracer writes something the committed ones do not hold.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from filelock import FileLock

from tests import layers
from tests.inputs import shared

REPO = Path(__file__).resolve().parents[1]
COMMITTED_ROOT = REPO / "fixtures" / "recorded"

_TINY = ["--hidden", "32", "--seq", "16", "--warmup", "0", "--active", "2"]
"""2 layers of width 32 (two FSDP units), 16 tokens, 3 steps of which 2 are profiled."""
RECORDS: dict[str, list[str]] = {
    # single, ddp, fsdp, fsdp2 at the tiny shapes: the default job in small
    "tiny": ["--strategy", "all", *_TINY],
    # FSDP with gradients divided by the world size once more (relative error 0.5)
    "fsdp-wrong-grad-scale": ["--strategy", "fsdp", "--fault", "wrong-grad-scale", *_TINY],
    # the default profiler schedule (wait 1, warmup 1, active 3) at batch 4, 8 tokens
    "all-default-schedule": ["--strategy", "all", "--hidden", "32", "--seq", "8", "--batch", "4"],
    # the other two canaries, one per strategy family
    "ddp-skip-grad-sync": ["--strategy", "ddp", "--fault", "skip-grad-sync", *_TINY],
    "fsdp2-unsynced-init": ["--strategy", "fsdp2", "--fault", "unsynced-init", *_TINY],
}
"""Name -> ``tracer record`` arguments (2 gloo ranks on CPU)."""

COMMITTED = ("tiny", "fsdp-wrong-grad-scale")
"""The configurations kept in fixtures/recorded (the fast layer reads them)."""


def _root(factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this run shares (pytest-xdist gives each worker its own
    basetemp under one run folder)."""
    base = factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "records"


def make(name: str, out: Path, tmp: Path | None = None) -> subprocess.CompletedProcess:
    """Record configuration ``name`` into ``out`` (a traces root) in a fresh interpreter, its
    temporary files in ``tmp`` (default: beside ``out``); returns the finished process. Raises
    ``RuntimeError`` with the record's stderr when it fails."""
    env = dict(os.environ, TMPDIR=str(tmp or out.parent))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "tracer", "record", *RECORDS[name], "--out",
                           str(out)], cwd=out.parent, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"tracer record {' '.join(RECORDS[name])} failed "
                           f"(exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def recorded(name: str, factory: pytest.TempPathFactory) -> Path:
    """The traces root of configuration ``name``, recorded once per test run (module
    docstring). Fails the calling test when the record failed."""
    layers.noted(layers.RECORD, f"read the shared record {name}")
    root = _root(factory)
    root.mkdir(parents=True, exist_ok=True)
    folder, failed = root / name / "traces", root / name / "failed.txt"
    with FileLock(str(root / f"{name}.lock")):
        if not folder.exists() and not failed.exists():
            folder.parent.mkdir(exist_ok=True)
            try:
                (root / name / "stdout.txt").write_text(make(name, folder).stdout)
            except RuntimeError as exc:
                shutil.rmtree(folder, ignore_errors=True)
                failed.write_text(str(exc))
    if failed.exists():
        pytest.fail(failed.read_text(), pytrace=False)
    return shared(folder)


def stdout(name: str, factory: pytest.TempPathFactory) -> str:
    """What ``tracer record`` printed on stdout when it recorded configuration ``name``."""
    return (recorded(name, factory).parent / "stdout.txt").read_text()


def committed(name: str) -> Path:
    """fixtures/recorded/NAME: configuration ``name`` as recorded when the fixtures were last
    written, shared read-only."""
    path = COMMITTED_ROOT / name
    if not path.is_dir():
        pytest.fail(f"{path} is missing: run python3 -m tests.records fixtures/recorded",
                    pytrace=False)
    return shared(path)


def write_committed(dest: Path) -> None:
    """Record every configuration of ``COMMITTED`` into ``dest`` anew (replacing what it held)."""
    dest = dest.resolve()
    for name in COMMITTED:
        target = dest / name
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:  # torch's own temp folders stay out of dest
            make(name, target, Path(tmp))


if __name__ == "__main__":  # python3 -m tests.records fixtures/recorded
    write_committed(Path(sys.argv[1] if len(sys.argv) > 1 else COMMITTED_ROOT))
