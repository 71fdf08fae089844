"""The suite's three layers, and the guard that keeps their markers true (README, "Tests").

- ``fast``: no ``tracer record``, no child program, no corpus. Every test that carries neither
  mark below is in it (``pytest -m fast``): a developer runs it after each change.
- ``integration``: runs a child program (the CLIs as subprocesses, HTA's child, Chromium, git,
  pytest itself), real Dask workers, or reads the public trace corpus (``$PARITYTRACE_CORPUS``);
  also the few scale tests that build thousands of ranks or collectives (tens of seconds each).
- ``record``: runs ``tracer record`` (or another multi-process torch job) or reads a run
  directory one made (a fixture built with ``tests.records``).

The marks are checked where a test gets its inputs, so a missing one cannot hide:
- at collection: a test that uses a record fixture (``RECORD_FIXTURES``) without the ``record``
  mark is a collection error;
- while it runs: an audit hook (PEP 578) sees every program a test starts (``subprocess.Popen``)
  and every file or folder it opens under the corpus; a test that did either without the mark
  that allows it fails, naming what it did. Fixtures count for the test that set them up.
A ``record`` test may do what an ``integration`` test does.
"""

from __future__ import annotations

import contextlib
import os
import sys

import pytest

from tests.corpus import corpus_root

FAST, INTEGRATION, RECORD = "fast", "integration", "record"
MARKS = {
    FAST: "no record, no child program, no corpus (set by the suite: tests with neither mark)",
    INTEGRATION: "starts a child program (CLI subprocess, HTA, Chromium), real Dask workers, "
                 "reads the corpus, or a scale test",
    RECORD: "runs tracer record or reads a run directory a record fixture made",
}

RECORD_FIXTURES = {"fp32_all", "golden_root", "gloo_runs", "adamw_all", "mixed_bf16", "clean",
                   "pp_1f1b", "pp_gpipe", "pp_canary", "golden_run", "records", "clean_root",
                   "canary_roots", "ddp_default_fault_run", "check", "pp_interleaved", "pp_zbv"}
"""The fixtures that record (or return what a record fixture made): a test that uses one must
carry the ``record`` mark. A fixture that starts a record while it is set up and is not named
here fails the test that set it up."""

RECORD_LOG_ENV = "PARITYTRACE_TESTS_RECORD_LOG"
"""Set to a file's path, the suite appends a line there for every record a test or fixture
starts (test id, fixtures being set up, argv): the list of records a run makes."""

_CORPUS = str(corpus_root() or "")
_UNLISTED = "unlisted"
_running: dict = {"item": None, "did": [], "fixtures": []}
"""The test running now, what it did that needs a mark, the fixtures being set up."""


def needs(argv) -> str:
    """The layer a child program started with ``argv`` puts a test in: ``record`` for
    ``tracer record``, torchrun and the suite's own multi-process torch scripts, else
    ``integration``."""
    words = [os.fsdecode(a) if isinstance(a, (str, bytes, os.PathLike)) else "" for a in argv]
    text = " ".join(words)
    if "--help" in words:
        return INTEGRATION
    if ("tracer" in words and "record" in words) or "torchrun" in text or "torch.distributed.run" \
            in text or text.endswith("_record.py") or "_record.py " in text or "_ranks.py" in text:
        return RECORD
    return INTEGRATION


def _audit(event: str, args: tuple) -> None:
    # Called for every audited operation of the process: cheap checks only, never raises.
    if _running["item"] is None or _running.get("paused"):
        return
    if event == "subprocess.Popen":
        argv = args[1] if isinstance(args[1], (list, tuple)) else [args[1] or args[0]]
        need, what = needs(argv), "started " + " ".join(map(str, argv))[:200]
        _running["did"].append((need, what))
        if need == RECORD and (log := os.environ.get(RECORD_LOG_ENV)):
            with open(log, "a") as fh:  # one line a record: test, fixture, argv
                fh.write("\t".join([_running["item"].nodeid, ",".join(_running["fixtures"]),
                                    " ".join(map(str, argv))]) + "\n")
        fixtures = _running["fixtures"]
        if need == RECORD and fixtures and not RECORD_FIXTURES.intersection(fixtures):
            _running["did"].append((_UNLISTED, f"set up fixture {fixtures[-1]}, which {what}: "
                                                "name it in tests/layers.py RECORD_FIXTURES"))
    elif _CORPUS and event in ("open", "os.listdir", "os.scandir") and args \
            and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if path.startswith(_CORPUS) and path[len(_CORPUS):len(_CORPUS) + 1] in ("", os.sep):
            _running["did"].append((INTEGRATION, f"read the corpus ({path})"))


def layer(item: pytest.Item) -> str:
    """The most demanding layer ``item``'s marks allow."""
    names = {m.name for m in item.iter_markers()}
    return RECORD if RECORD in names else INTEGRATION if INTEGRATION in names else FAST


def allowed(have: str, need: str) -> bool:
    """Whether a test in layer ``have`` may do what layer ``need`` needs."""
    order = (FAST, INTEGRATION, RECORD)
    return order.index(have) >= order.index(need)


def configure(config: pytest.Config) -> None:
    for name, text in MARKS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if not _running.get("hooked"):  # an audit hook cannot be removed: add it once a process
        sys.addaudithook(_audit)
        _running["hooked"] = True


def mark_collected(items: list[pytest.Item]) -> None:
    """Put every test with neither mark in ``fast``; a test that uses a record fixture without
    the ``record`` mark is a collection error."""
    wrong = []
    for item in items:
        used = RECORD_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if used and layer(item) != RECORD:
            wrong.append(f"{item.nodeid} uses {', '.join(sorted(used))} without the record mark")
        if layer(item) == FAST:
            item.add_marker(FAST)
    if wrong:
        raise pytest.UsageError("tests/layers.py: " + "; ".join(wrong))


def started(item: pytest.Item) -> None:
    _running["item"], _running["did"], _running["fixtures"] = item, [], []


@contextlib.contextmanager
def unwatched():
    """The suite's own checks inside (listing a shared folder, the corpus included) count for
    no test."""
    _running["paused"] = True
    try:
        yield
    finally:
        _running["paused"] = False


def noted(need: str, what: str) -> None:
    """Count ``what`` (a shared record read, say) for the running test as needing ``need``."""
    if _running["item"] is not None:
        _running["did"].append((need, what))


def fixture_setup(name: str):
    """Context of a fixture's set-up (conftest's ``pytest_fixture_setup``)."""
    _running["fixtures"].append(name)
    return _running["fixtures"].pop


def finished() -> list[str]:
    """What the test that ran did beyond its layer (empty when its marks are true)."""
    item, did = _running["item"], _running["did"]
    _running["item"], _running["did"] = None, []
    if item is None:
        return []
    have = layer(item)
    return sorted({what if need == _UNLISTED else what + f" (needs the {need} mark)"
                   for need, what in did if need == _UNLISTED or not allowed(have, need)})
