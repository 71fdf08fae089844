"""Shared fixtures of the analyzer-core tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.analyzer.helpers import FIXTURES


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Parsed-trace caches of read-only inputs go to a per-session folder, not ~/.cache."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


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
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out
