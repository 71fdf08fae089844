"""Fixtures for every test folder: a private cache folder, the real records (tiny 2-rank gloo
runs) that the behaviour tests copy and corrupt (tests/inputs.py), and two guards that keep
tests independent of their order (pytest-xdist, random order): a folder a session or module
fixture shares stays as the fixture made it (``shared``), and the garbage collector's state
(``gc.freeze`` by analyzer/ingest/pool.py's ``collector_paused``, run in-process by
``tests.inputs.cli``) is put back after each test."""

import gc
import os
from pathlib import Path

import pytest

from tests.inputs import SHARED, TINY, listing, record, shared


@pytest.fixture(autouse=True)
def _shared_folders_untouched():
    """Fail the test that changed a folder a fixture shares (``tests.inputs.shared``)."""
    yield
    changed = {}
    for root, before in SHARED.items():
        after = listing(root) if root.exists() else {}
        if after != before:
            changed[root] = sorted(set(after.items()) ^ set(before.items()))
            SHARED[root] = after  # reported once: the next test is not blamed for it
    if changed:
        pytest.fail(f"the test changed folders that fixtures share (copy them first): {changed}",
                    pytrace=False)


@pytest.fixture(autouse=True)
def _gc_restored():
    """The collector enabled or not, and nothing frozen, as before the test (an in-process
    ``analyzer report`` freezes what its imports built: ``pool.collector_paused``)."""
    enabled, frozen = gc.isenabled(), gc.get_freeze_count()
    yield
    if frozen == 0 and gc.get_freeze_count():
        gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


FSDP_TINY = [a if a != "ddp" else "fsdp" for a in TINY]


@pytest.fixture(scope="session", autouse=True)
def _no_terminal_width():
    """Output width as a pipe gets it, whatever runs the suite: a terminal's COLUMNS (or the
    80 pytest-xdist's workers set) would fold the CLI's lines that tests read. A test that
    needs a width sets it (monkeypatch)."""
    saved = {k: os.environ.pop(k) for k in ("COLUMNS", "LINES") if k in os.environ}
    yield
    os.environ.update(saved)


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
    return shared(record(tmp_path_factory.mktemp("rel") / "traces", *TINY) / "ddp")


@pytest.fixture(scope="session")
def fsdp_run(tmp_path_factory) -> Path:
    """A real 2-rank gloo FSDP run directory (same tiny model as ``ddp_run``)."""
    return shared(record(tmp_path_factory.mktemp("rel-fsdp") / "traces", *FSDP_TINY) / "fsdp")


@pytest.fixture(scope="session")
def fsdp_fault_run(tmp_path_factory) -> Path:
    """A real 2-rank gloo FSDP run directory recorded with ``--fault wrong-grad-scale``
    (gradients divided by the world size once more: relative error 0.5)."""
    out = tmp_path_factory.mktemp("fu-fsdp") / "traces"
    return shared(record(out, *FSDP_TINY, "--fault", "wrong-grad-scale") / "fsdp")
