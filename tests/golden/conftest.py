"""Session-scoped tiny records for the golden-baseline tests (each costs seconds)."""

from __future__ import annotations

import pytest

from tests.inputs import shared
from tests.tracer.helpers import run_tracer

# Tiny shapes and the shortest schedule: one profiled step, two steps in all.
TINY = ["--hidden", "32", "--seq", "8", "--batch", "4", "--wait", "1", "--warmup", "0", "--active", "1"]


def record(out, name: str, args: list[str]):
    proc, _ = run_tracer(args + TINY + ["--out", str(out), "--name", name], cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / name


@pytest.fixture(scope="session")
def golden_root(tmp_path_factory):
    """traces/ with a (single, fp32), b (single, fp32, same settings), c (ddp, bf16, --golden a)."""
    out = tmp_path_factory.mktemp("golden")
    record(out, "a", ["--strategy", "single"])
    record(out, "b", ["--strategy", "single"])
    record(out, "c", ["--strategy", "ddp", "--nproc", "2", "--precision", "bf16", "--golden", str(out / "a")])
    return shared(out)
