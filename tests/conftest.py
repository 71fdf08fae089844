"""Fixtures for every test folder: a private cache folder, and the real records (tiny 2-rank
gloo runs) that the behaviour tests copy and corrupt (tests/inputs.py)."""

import os
from pathlib import Path

import pytest

from tests.inputs import TINY, record

FSDP_TINY = [a if a != "ddp" else "fsdp" for a in TINY]


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Parsed-trace and report caches go to a per-session folder, not ~/.cache."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory) -> Path:
    """A real 2-rank gloo DDP run directory written by `tracer record` (read-only by convention:
    tests copy it with ``tests.inputs.copy_run``)."""
    return record(tmp_path_factory.mktemp("rel") / "traces", *TINY) / "ddp"


@pytest.fixture(scope="session")
def fsdp_run(tmp_path_factory) -> Path:
    """A real 2-rank gloo FSDP run directory (same tiny model as ``ddp_run``)."""
    return record(tmp_path_factory.mktemp("rel-fsdp") / "traces", *FSDP_TINY) / "fsdp"


@pytest.fixture(scope="session")
def fsdp_fault_run(tmp_path_factory) -> Path:
    """A real 2-rank gloo FSDP run directory recorded with ``--fault wrong-grad-scale``
    (gradients divided by the world size once more: relative error 0.5)."""
    out = tmp_path_factory.mktemp("fu-fsdp") / "traces"
    return record(out, *FSDP_TINY, "--fault", "wrong-grad-scale") / "fsdp"
