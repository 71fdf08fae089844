"""Shared fixtures of the analyzer-core tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.analyzer.helpers import FIXTURES
from tests.inputs import shared


@pytest.fixture
def fixture_copy(tmp_path):
    """Copy a fixtures/core file into a fresh folder (caches land there, not in the repo)."""
    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copy(FIXTURES / name, dst)
        return dst
    return copy


@pytest.fixture(scope="session")
def gloo_runs(tmp_path_factory) -> Path:
    """A real 2-rank CPU/gloo DDP and FSDP record (tests/analyzer/gloo_record.py), ~30 s."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("gloo-runs")
    script = Path(__file__).with_name("gloo_record.py")
    proc = subprocess.run([sys.executable, str(script), str(out)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return shared(out)


@pytest.fixture(scope="module")
def local_cluster():
    """A Dask cluster on loopback TCP: two in-process workers (one thread each) behind a
    scheduler; skipped without dask.distributed."""
    distributed = pytest.importorskip(
        "distributed", reason="dask[distributed] is not installed (pip install 'paritytrace[dask]')")
    c = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                 protocol="tcp", host="127.0.0.1", dashboard_address=":0")
    yield c
    c.close()
