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

from tests import layers
from tests.corpus import corpus_root
from tests.inputs import SHARED, listing, shared
from tests.records import committed


def pytest_configure(config):
    layers.configure(config)


def pytest_collection_modifyitems(items):
    layers.mark_collected(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    layers.started(item)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef):
    done = layers.fixture_setup(fixturedef.argname)
    try:
        return (yield)
    finally:
        done()


@pytest.fixture(autouse=True)
def _marks_true():
    """Fail the test that started a program or read the corpus without the mark that allows it
    (tests/layers.py): the fast layer must not hide a record, a child program or the corpus."""
    yield
    if beyond := layers.finished():
        if os.environ.get("PARITYTRACE_LAYERS_LOG"):  # survey mode: list, do not fail
            with open(os.environ["PARITYTRACE_LAYERS_LOG"], "a") as fh:
                fh.writelines(f"{os.environ.get('PYTEST_CURRENT_TEST', '?')}\t{b}\n" for b in beyond)
            return
        pytest.fail("tests/layers.py: this test " + "; ".join(beyond), pytrace=False)


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


@pytest.fixture(scope="session", autouse=True)
def _no_terminal_width():
    """Output width as a pipe gets it, whatever runs the suite: a terminal's COLUMNS (or the
    80 pytest-xdist's workers set) would fold the CLI's lines that tests read. A test that
    needs a width sets it (monkeypatch)."""
    saved = {k: os.environ.pop(k) for k in ("COLUMNS", "LINES") if k in os.environ}
    yield
    os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def _corpus_read_only():
    """The public trace corpus is input, never output: a test that leaves a file in it (a cache,
    a report) fails as for any shared folder (``_shared_folders_untouched``)."""
    if (root := corpus_root()) is not None:
        shared(root)


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
def ddp_run() -> Path:
    """A real 2-rank gloo DDP run directory written by `tracer record` (fixtures/recorded, kept
    current by tests/tracer/test_recorded_fixtures.py); shared read-only: tests copy it with
    ``tests.inputs.copy_run``."""
    return committed("tiny") / "ddp"


@pytest.fixture(scope="session")
def fsdp_run() -> Path:
    """A real 2-rank gloo FSDP run directory (same tiny model and record as ``ddp_run``)."""
    return committed("tiny") / "fsdp"


@pytest.fixture(scope="session")
def fsdp_fault_run() -> Path:
    """A real 2-rank gloo FSDP run directory recorded with ``--fault wrong-grad-scale``
    (gradients divided by the world size once more: relative error 0.5)."""
    return committed("fsdp-wrong-grad-scale") / "fsdp"
