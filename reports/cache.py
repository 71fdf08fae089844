"""Whole-report cache: a second ``analyzer report`` on unchanged inputs skips the analysis.

The key is ``analyzer.ingest.cachekey.cache_key`` of the resolved DIR and output folder, the
options and the stat signature (``cachekey.input_signature``) of every file under DIR, computed by every
``analyzer`` and ``reports`` module. The ctime is in it because the mtime can be set back
(``cp -p``, ``touch -d``): a file rewritten in place with its old size and mtime would otherwise
be served the stale report, skipping the manifest's sha256 check that a miss runs; no user
call can set the ctime back.

The cache is ``$XDG_CACHE_HOME/paritytrace/reports/<hash of DIR and output folder>.json``
(``~/.cache`` when unset; report.json's text plus the key and the notes the analysis said on
stderr, which a hit says again), signed with this user's cache key as the per-rank tables
caches are (``_MAGIC``; a planted or copied entry is a miss, never read whole), written
atomically after the report; the output folder holds
only the report files. A hit decodes the cached text (analyzer/contract/report_types.py) and renders
it: no pandas import, no trace read. A miss renders from its report.json text decoded the same
way, so both paths write identical outputs. Each write trims the folder to its cap
(``cachekey.trim``; a hit touches its entry). A cache that cannot be read or written is skipped
(log line), never an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from pathlib import Path

import msgspec

from analyzer.contract.atomic import write_atomic
from analyzer.ingest.cachekey import (cache_dir, cache_key, input_signature, read_regular,
                                      read_signed, sign, trim)
from analyzer.contract.report_types import AnalysisOptions

log = logging.getLogger(__name__)

_SKIP_SUFFIXES = (".tables.msgpack",)  # an older analyzer's caches beside traces
_NAMES = r"[0-9a-f]{32}\.json"
"""The report entries (``_path``): what trim may delete. Never the records of written files
(``_written_path``): without one, a report file the user edited could be taken for ours."""
_MAGIC = b"paritytrace-report/1\n"
"""First bytes of a report entry (``_path``): then its HMAC under this user's cache key
(analyzer/ingest/cachekey.py ``sign``), then the entry's JSON the HMAC covers."""
_RECORD_MAX_BYTES = 1 << 20
"""A record of written files names a few report files: larger is not one of ours."""
_HERE = Path(__file__).resolve().parent
_MODULES = tuple(sorted((*(_HERE.parent / "analyzer").rglob("*.py"), *_HERE.glob("*.py"))))


class _Entry(msgspec.Struct):
    key: str
    notes: list[str]
    """What the analysis said on stderr, one line each."""
    report: str
    """report.json's text."""


def key(root: Path, out: Path, options: AnalysisOptions) -> str:
    """The cache key of a report of ``root`` written to ``out`` with ``options`` (``jobs``
    leaves the report unchanged: not in the key)."""
    chosen = {"rtol": options.tolerance.rtol, "atol": options.tolerance.atol,
              "allow_incomplete": options.allow_incomplete,
              "device_memory_bytes": options.device_memory_bytes,
              # the link model's files by content: a re-measured curve changes the projection
              "link_model": [[os.path.realpath(p), _sha256(Path(p))] for p in options.link_model],
              "ranks_per_node": options.ranks_per_node}
    return cache_key(json.dumps({"root": os.path.realpath(root), "out": os.path.realpath(out),
                                 "options": chosen, "files": input_signature(root, out, _SKIP_SUFFIXES)},
                                sort_keys=True), _MODULES)


def _path(root: Path, out: Path) -> Path:
    name = hashlib.blake2b(f"{os.path.realpath(root)}\0{os.path.realpath(out)}".encode(),
                           digest_size=16).hexdigest()
    return cache_dir() / "reports" / f"{name}.json"


def load_entry(root: Path, out: Path, k: str) -> tuple[str, list[str]] | None:
    """(report.json's text, notes) cached for ``root`` -> ``out`` and key ``k``; None when
    absent, stale or unreadable. ``notes``: the lines the analysis that made the report said on
    stderr (``store``), so a hit can say them again."""
    path = _path(root, out)
    try:
        payload = read_signed(path, _MAGIC)  # nothing held before its HMAC verifies
        if payload is None:
            log.info("ignoring report cache %s: not signed with this user's cache key", path)
            return None
        entry = msgspec.json.decode(payload, type=_Entry)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError) as exc:  # ValidationError too: an older cache's shape
        log.info("ignoring unreadable report cache %s (%s)", path, exc)
        return None
    if entry.key != k:
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # used: the last to go when the folder is trimmed
    return entry.report, entry.notes


def store(root: Path, out: Path, k: str, report_json: str, notes: list[str] = ()) -> None:
    """Write the cache atomically: ``report_json`` (report.json's text) and ``notes`` (the
    lines the analysis said on stderr, one per note)."""
    path = _path(root, out)
    payload = msgspec.json.encode(_Entry(key=k, notes=list(notes), report=report_json))
    mac = sign(payload)
    if mac is None:
        return  # no cache key (a read-only home): nothing a later report could trust
    try:
        data = _MAGIC + mac + payload
        write_atomic(path, data)
        trim(path.parent, _NAMES, len(data))
    except OSError as exc:
        log.info("could not write report cache %s (%s)", path, exc)


# --- what the analyzer wrote in an output folder: the only files it removes -------------------

def _written_path(out: Path) -> Path:
    name = hashlib.blake2b(os.path.realpath(out).encode(), digest_size=16).hexdigest()
    return cache_dir() / "reports" / f"{name}.written.json"


def _sha256(path: Path) -> str | None:
    """SHA-256 of the file ``path``, read in chunks (a huge file in --out costs no memory)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def fs_now_ns() -> int:
    """Now on the clock the kernel stamps file times with (the coarse real-time clock where
    there is one: a file written after this instant never carries an older mtime)."""
    import time

    coarse = getattr(time, "CLOCK_REALTIME_COARSE", None)
    return time.clock_gettime_ns(coarse) if coarse is not None else time.time_ns()


_COMMAND_STARTED_NS: list[int] = []


def command_started() -> None:
    """Note the instant this command started (``fs_now_ns``), as early as the CLI can
    (analyzer/cli/app.py ``main``): what ``started_ns`` calls the start of this analysis."""
    _COMMAND_STARTED_NS[:] = [fs_now_ns()]


def started_ns() -> int:
    """When this command started (``command_started``), else now: files a report running
    beside this one wrote after it are newer, whatever each spent importing and analysing."""
    return _COMMAND_STARTED_NS[0] if _COMMAND_STARTED_NS else fs_now_ns()


def remove_stale(out: Path, names: list[str], written: dict[str, str],
                 started_ns: int | None = None) -> tuple[list[str], list[str]]:
    """Remove the files ``names`` of the output folder ``out`` that an earlier analysis wrote
    and nobody changed since: their SHA-256 equals the one recorded when it wrote them (kept
    beside the report cache, ``_written_path``) and, with ``started_ns`` (``fs_now_ns`` when
    this analysis began), they were written before it began -- a report running at the same
    time (another ``--format``) wrote the newer ones, which stay and stay recorded. A file of
    that name that the analyzer did not write, or that was edited since, or with no record (the
    cache cleared), is left alone. Then records ``written`` (name -> SHA-256 of this analysis's
    files, plus the concurrent ones kept) for ``out``. Call it under ``out_lock``. Returns
    (names removed, names left). Raises ``OSError`` when a file cannot be removed; a record
    that cannot be read or written is skipped (log line)."""
    rec_path = _written_path(out)
    try:
        known = msgspec.json.decode(read_regular(rec_path, _RECORD_MAX_BYTES), type=dict[str, str])
    except FileNotFoundError:
        known = {}
    except (OSError, msgspec.DecodeError) as exc:
        log.info("ignoring unreadable record of written files %s (%s)", rec_path, exc)
        known = {}
    removed, left, record = [], [], dict(written)
    for name in names:
        path = out / name
        if path.is_symlink() or not path.is_file():
            continue  # a link is not a file the analyzer writes (write_atomic replaces links)
        if name in known and _sha256(path) == known[name]:
            if started_ns is not None and path.stat().st_mtime_ns >= started_ns:
                record[name] = known[name]  # a concurrent report's: not an earlier analysis
                continue
            path.unlink()
            removed.append(name)
        else:
            left.append(name)
    try:
        write_atomic(rec_path, msgspec.json.encode(record))
    except OSError as exc:
        log.info("could not record the files written in %s (%s)", out, exc)
    return removed, left


def _looks_written_by_us(path: Path) -> bool:
    """True when ``path`` (report.md / .json / .html) starts as every report the analyzer
    writes does: Markdown ``# paritytrace report``, HTML its doctype and title, JSON an object
    whose first key is ``schema_version`` (reports/markdown.py, html.py, report_types.encode).
    Read: the first 256 bytes."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False
    if path.suffix == ".md":
        return head.startswith(b"# paritytrace report\n")
    if path.suffix == ".html":
        return head.startswith(b'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">\n'
                               b"<title>paritytrace report</title>")
    return head.lstrip().startswith(b"{") and head.lstrip()[1:].lstrip().startswith(b'"schema_version"')


def foreign_files(out: Path, names: list[str]) -> list[str]:
    """The files ``names`` in ``out`` that a report would replace and the analyzer did not
    write as they are: a file the record of written files (``remove_stale``'s) names is the
    analyzer's only with the recorded SHA-256 (an edited report.md is the user's now); one it
    does not name (the record cleared with the cache) is the analyzer's when it carries the
    start every analyzer report has. A symlink counts as foreign (write_atomic would replace
    the link, not what it names). Call it under ``out_lock``, so that a report writing at
    the same time is seen before or after its record, never between."""
    try:
        known = msgspec.json.decode(read_regular(_written_path(out), _RECORD_MAX_BYTES),
                                   type=dict[str, str])
    except (OSError, msgspec.DecodeError):
        known = {}
    out_names = []
    for name in names:
        path = out / name
        if not path.is_symlink() and not path.exists():
            continue
        if path.is_symlink() or not path.is_file() or not (
                _sha256(path) == known[name] if name in known else _looks_written_by_us(path)):
            out_names.append(name)
    return out_names


@contextlib.contextmanager
def out_lock(out: Path, *, create: bool = True):
    """Hold an exclusive ``fcntl.flock`` for the output folder ``out`` while a report writes
    its files, removes an earlier analysis's and records what it wrote: two reports into one
    folder at once (say ``--format md`` and ``--format json``) take turns, so the folder ends as
    one of them left it, never with each having removed the other's files. The lock file is
    beside the record of written files in the user cache (nothing is added to ``out``); when it
    cannot be created the report goes on unlocked (log line). ``create`` False (the checks
    before an input is accepted, which must leave no cache file): an absent lock file is not
    made and nothing is locked -- no report has written ``out`` under this cache, so there is
    no record of written files to read consistently."""
    import fcntl

    path = _written_path(out).with_suffix(".lock")
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:
        if create:
            log.info("could not lock %s (not found)", path)
        yield
        return
    except OSError as exc:
        log.info("could not lock %s (%s)", path, exc)
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by close, or by the kernel if we die
        yield
    finally:
        os.close(fd)
