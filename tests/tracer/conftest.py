"""Session-scoped records shared by the tracer tests (each record costs a few seconds)."""

from __future__ import annotations

import pytest

from tests.inputs import shared
from tests.tracer.helpers import TINY, run_tracer


def _record(tmp_path_factory, name: str, args: list[str]):
    out = tmp_path_factory.mktemp(name)
    proc, _ = run_tracer(args + TINY + ["--out", str(out)], cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


@pytest.fixture(scope="session")
def fp32_all(tmp_path_factory):
    """``tracer record --strategy all`` (fp32, tiny shapes): (out root, completed process)."""
    out, proc = _record(tmp_path_factory, "fp32", ["--strategy", "all"])
    return shared(out), proc
