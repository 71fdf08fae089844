"""Shared fixtures of the data-supply tests (issue 10)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.corpus import CORPUS  # noqa: F401 - used by the test modules

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "data"


@pytest.fixture
def data_fixture(tmp_path):
    """Copy a fixtures/data trace into a fresh folder (caches land there, not in the repo)."""
    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copy(FIXTURES / name, dst)
        return dst
    return copy
