"""Session-scoped records shared by the tracer tests (each record costs a few seconds)."""

from __future__ import annotations

import pytest

from tests.tracer.helpers import TINY, run_tracer


def _record(tmp_path_factory, name: str, args: list[str]):
    out = tmp_path_factory.mktemp(name)
    proc, _ = run_tracer(args + TINY + ["--out", str(out)], cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


@pytest.fixture(scope="session")
def fp32_all(tmp_path_factory):
    """``tracer record --strategy all`` (fp32, tiny shapes): (out root, completed process)."""
    return _record(tmp_path_factory, "fp32", ["--strategy", "all"])


@pytest.fixture(scope="session")
def bf16_fsdp2(tmp_path_factory):
    """``tracer record --strategy fsdp2 --precision bf16`` (tiny shapes). One strategy suffices:
    the bf16 policy (autocast) is the same code for every strategy; fsdp2's sharded
    reduce-scatter is the path furthest from the baseline."""
    return _record(tmp_path_factory, "bf16", ["--strategy", "fsdp2", "--precision", "bf16"])
