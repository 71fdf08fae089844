"""Session-scoped records shared by the tracer tests (tests/records.py: made once per run)."""

from __future__ import annotations

import pytest

from tests.records import recorded, stdout


@pytest.fixture(scope="session")
def fp32_all(tmp_path_factory):
    """``tracer record --strategy all`` (fp32, tiny shapes, the default profiler schedule):
    (traces root, what the record printed on stdout)."""
    return recorded("all-default-schedule", tmp_path_factory), stdout("all-default-schedule",
                                                                      tmp_path_factory)
