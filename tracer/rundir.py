"""Run-directory files: which are the tracer's, checking an output folder, the record lock and
marker, clearing what a previous record wrote, the file list with sha256.

Every file is written with ``analyzer.contract.atomic`` (a temp name in the same folder, then
``os.replace``), so a reader never sees half a file; ``manifest.json`` is written last
(see ``manifest.py``) and ``RECORDING_NAME`` removed after it.

Rules (analyzer/contract/schemas.py, run-directory layout):
- the tracer's files are the names ``TRACER_FILE`` matches; only they are listed in the
  manifest and only they (plus the tracer's own hidden transients) are removed by a re-record:
  an older analyzer's caches, ``report/`` and merge outputs beside them stay as they are;
- ``tracer record`` writes only into a missing or empty folder, or one of its run dirs
  (``is_run_dir``), and never into one named ``REPORT_DIR_NAME``;
- one record at a time per run dir: ``fcntl.flock`` on ``LOCK_NAME`` inside it, held by the
  process that records it until that process ends (the launcher; under torchrun global rank 0);
- ``tracer record --repeat N`` (N > 1) writes N run dirs per strategy, ``<name>.r1`` ..
  ``<name>.rN`` (``RecordConfig.run_name``), each a complete run dir under these same rules:
  all are checked and locked before the first record starts, each gets its marker and the
  staged baseline only when its own record starts (tracer/record.py ``record_local``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
from pathlib import Path

import msgspec

import analyzer.contract.owner as owner
from analyzer.contract.schemas import (LOCK_NAME, MANIFEST_NAME, MEMORY_DIR, RECORDING_NAME,
                                       REPORT_DIR_NAME, RUN_FILE, FileEntry, sha256_file)
from analyzer.contract.stopping import stop_signals_held
from analyzer.contract.text import one_line

STAGING_PREFIX = ".tracer-baseline-"
"""Name prefix of the hidden folder beside the run dirs where ``tracer record`` computes the
baseline before placing it in each run dir."""
PARTS_DIR = ".parts"
"""Per-rank partial tables, merged by rank 0 and removed before the manifest is written."""

TRACER_FILE = RUN_FILE
"""Relative, '/'-separated paths of the files a record leaves in a run dir (besides the manifest):
the contract's ``RUN_FILE`` (the only paths a manifest may list); ``fullmatch`` only:
``rank0.trace.json.gz.tables.msgpack`` (an older analyzer's cache) is not one."""
_TRANSIENT = re.compile(rf"\.baseline\.activations\.safetensors|\.tmp-.+-({TRACER_FILE.pattern}"
                        rf"|\.baseline\.activations\.safetensors|{re.escape(MANIFEST_NAME)})")
"""Hidden files a record writes and removes (a killed one leaves them): the ranks' activation
references, ``atomic_path`` temp files of the tracer's own files (``.tmp-<random>-<name>``)."""

_HELD: dict[str, int] = {}
"""Run dirs (real paths) whose lock this process holds -> the lock file's descriptor."""
_CREATED: dict[str, list[Path]] = {}
"""Per locked run dir, the folders ``lock_run_dir`` created for it (deepest first)."""


class RunDirBusy(ValueError):
    """Another process holds the run dir's record lock (the CLI exits 2 with its line)."""


def is_tracer_file(rel: str) -> bool:
    """True when ``rel`` (relative to the run dir, '/'-separated) is a file a record leaves."""
    return TRACER_FILE.fullmatch(rel) is not None


def is_run_dir(path: Path) -> bool:
    """True when ``path`` is a folder a record wrote (complete or not): it holds the tracer's
    manifest (a JSON object with the manifest's ``schema_version`` and ``run_id``), the record
    marker or the record lock. Nothing else: a user's ``rank7.trace.json.gz`` or
    ``numerics.parquet`` in a folder of their own makes it no run dir, so a record there is
    refused instead of replacing them. Every record writes the marker before its first file
    and a failed one keeps it (``abandon_record``), so no record of ours goes unrecognised."""
    if any((path / n).is_file() for n in (RECORDING_NAME, LOCK_NAME)):
        return True
    return _is_tracer_manifest(path / MANIFEST_NAME)


def _is_tracer_manifest(path: Path) -> bool:
    """True when ``path`` is a JSON object with ``schema_version`` (an int) and ``run_id``,
    as every manifest the tracer wrote (analyzer/contract/schemas.py ``Manifest``); at most
    16 MiB is read."""
    try:
        with open(path, "rb") as f:
            raw = f.read(16 << 20)
        data = msgspec.json.decode(raw)
    except (OSError, msgspec.DecodeError):
        return False
    return isinstance(data, dict) and type(data.get("schema_version")) is int \
        and isinstance(data.get("run_id"), str)


def check_run_dir(run_dir: Path) -> None:
    """Refuse a run dir ``tracer record`` must not write, before anything is imported or written.

    Raises ``ValueError`` (one line; the CLI exits 2) when: the run name is ``REPORT_DIR_NAME``
    (the analyzer writes its report there, and skips that folder when it looks for runs) or
    starts with '.' (hidden: the tracer's own staging folders); ``--out`` or the run dir is a
    file; the run dir is a folder that is not empty and not one of the tracer's (``is_run_dir``):
    a re-record removes files, and only its own.
    """
    name = run_dir.name
    if name == REPORT_DIR_NAME:
        raise ValueError(f"{run_dir}: the run name {name!r} is the folder `analyzer report` writes "
                         "its report in; choose another --name")
    if name.startswith("."):
        raise ValueError(f"{run_dir}: a run name starting with '.' is hidden; choose another --name")
    for p in (run_dir.parent, run_dir):
        if p.exists() and not p.is_dir():
            what = "--out" if p == run_dir.parent else "the run directory"
            raise ValueError(f"{p}: is a file, not a folder ({what}); choose another --out or --name")
    check_no_links_out(run_dir)
    if not run_dir.is_dir():
        return
    try:
        empty = next(run_dir.iterdir(), None) is None
        ours = empty or is_run_dir(run_dir)
    except OSError as exc:
        raise ValueError(f"{run_dir}: cannot list the folder ({exc.strerror or exc}); "
                         "choose a readable --out") from None
    if not ours:
        raise ValueError(f"{run_dir}: not empty and not a run directory of tracer record "
                         "(no manifest.json of the tracer, no record marker or lock); a record "
                         "would replace files of the same names there: choose another --out or "
                         "--name, or empty the folder")


_OWN_PATHS = (MEMORY_DIR, PARTS_DIR, LOCK_NAME, RECORDING_NAME)
"""What a record opens, writes or removes files *through* in a run dir (folders it writes into,
files it writes in place); every other file of the record is replaced by a rename, and a link
in its place is replaced, never followed."""


def check_no_links_out(run_dir: Path) -> None:
    """Refuse a run dir a record would delete or write files through a symlink in
    (``ValueError``, one line naming the link; the CLI exits 2): the run dir itself a link that
    resolves outside ``--out`` (its parent), or any of ``_OWN_PATHS`` in it a link, wherever it
    points (the tracer never makes one: a ``memory`` link elsewhere, even to another run of the
    same ``--out``, would have a re-record delete that folder's ``memory.parquet`` and
    snapshots). Rule: nothing is deleted or written through a link that leaves the folder the
    user named (issue 43 R1). Reads only; never raises for a folder that does not exist."""
    out = run_dir.parent
    if run_dir.is_symlink():
        real, real_out = os.path.realpath(run_dir), os.path.realpath(out)
        if real == real_out or os.path.commonpath([real, real_out]) != real_out:
            raise ValueError(f"{run_dir}: is a symlink to {real}, outside --out {out}; a record "
                             "would delete and write files there: replace the link by a folder, "
                             "or choose another --out or --name")
    for name in _OWN_PATHS:
        link = run_dir / name
        if link.is_symlink():
            raise ValueError(f"{link}: is a symlink to {os.path.realpath(link)}; a re-record would "
                             f"delete and write the tracer's files through it: remove the link "
                             f"(the record makes its own {name}) or move the run directory's "
                             "files, or choose another --out or --name")


def check_writable(run_dir: Path) -> None:
    """Refuse a run dir that cannot be written, before anything is written or any process
    group starts (under torchrun every rank checks; rank 0 writes): the nearest existing folder
    of ``run_dir`` (itself or an ancestor) is on a read-only filesystem, is marked read-only (no
    write bit; refused even for root, which could still write there, as the analyzer refuses
    it), or is not writable by this user. Writes nothing. Raises ``ValueError`` (one line, the
    CLI exits 2), as a failed write would later (``record._cannot_prepare``)."""
    folder = next((d for d in (run_dir, *run_dir.parents) if d.exists()), None)
    if folder is None or not folder.is_dir():
        return  # check_run_dir's: a file on the way
    try:
        read_only_fs = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
        marked = not folder.stat().st_mode & 0o222
    except OSError as exc:
        raise ValueError(f"{run_dir}: cannot prepare the run directory ({exc.strerror or exc}); "
                         "choose a writable --out") from None
    why = ("Read-only file system" if read_only_fs
           else f"{folder} is marked read-only" if marked
           else None if os.access(folder, os.W_OK | os.X_OK)
           else f"{folder}: Permission denied")
    if why is not None:
        raise ValueError(f"{run_dir}: cannot prepare the run directory ({why}); choose a writable --out")


def lock_run_dir(run_dir: Path) -> None:
    """Take ``run_dir``'s record lock (``fcntl.flock`` on ``LOCK_NAME``, created with the folder,
    holding this process's pid) for this process; a second call for the same folder is a no-op.
    Released by ``unlock_run_dir`` (which removes the file) or when the process ends, however
    it ends (the kernel drops the lock; a killed record leaves the file, reused by the next).

    Raises ``RunDirBusy`` naming the holder's pid when another process holds it, ``OSError``
    when the folder cannot be written. Rule: one record at a time per run dir, so two records
    never mix their files into one run (issue 17 item 5). Not reliable on NFS without lockd.
    """
    key = os.path.realpath(run_dir)
    if key in _HELD:
        return
    with stop_signals_held():  # a stop between making the file and _HELD: unlock_all misses it
        _take_lock(run_dir, key)


def _take_lock(run_dir: Path, key: str) -> None:
    missing = [d for d in (run_dir, *run_dir.parents) if not d.exists()]
    run_dir.mkdir(parents=True, exist_ok=True)
    _CREATED[key] = missing  # deepest first: unlock removes them again while they stay empty
    path = run_dir / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").split("\n")[0].strip() or "unknown"
            os.close(fd)
            raise RunDirBusy(f"{run_dir}: another tracer record (pid {holder}) is writing this run "
                             "directory; wait for it to end, or choose another --out or --name") from None
        try:  # the holder before us may have removed the file we opened: lock the current one
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)  # pid, then who exactly (a later sweep tells a dead holder: sweep_leftovers)
    os.pwrite(fd, f"{os.getpid()}\n{owner.identity() or ''}\n".encode(), 0)
    _HELD[key] = fd


def unlock_run_dir(run_dir: Path) -> None:
    """Release the lock ``lock_run_dir`` took and remove its file (no-op when this process
    does not hold it). The file goes while the lock is held, so whoever opens the path next
    gets a new file (``lock_run_dir`` checks it locked the file the path names)."""
    key = os.path.realpath(run_dir)
    fd = _HELD.pop(key, None)
    if fd is not None:
        (run_dir / LOCK_NAME).unlink(missing_ok=True)
        os.close(fd)  # closing the only descriptor of the open file drops the flock
    for d in _CREATED.pop(key, []):  # a refused record leaves no folder it made behind
        try:
            d.rmdir()
        except OSError:  # not empty (the record wrote its run) or gone: keep it
            break


def unlock_all() -> None:
    """Release every lock this process still holds (``unlock_run_dir``): the CLI's last step,
    for a stop signal that landed between a claim and the code that releases it."""
    for key in list(_HELD):
        unlock_run_dir(Path(key))


def clear_run_dir(run_dir: Path) -> str | None:
    """Start a record in ``run_dir``: take its lock (``lock_run_dir``), write the record marker
    ``RECORDING_NAME`` (pid), then remove a previous record's files, manifest first.

    The marker comes before the manifest goes, and the manifest before anything else, so an
    interrupted clear or record never leaves a folder that reads as complete. Removes only the
    tracer's files: of a complete record, the ones its manifest lists (and that carry the
    tracer's names, ``TRACER_FILE``), so a file of the user's named like one (a
    ``rank2.trace.json.gz`` beside a 2-rank run) stays; of a record that did not complete (no
    readable manifest), every file named like the tracer's; always the hidden ``_TRANSIENT``
    ones and ``.parts/``; ``memory/`` only when that leaves it empty. Everything else stays
    (issue 17 items 2 and 4). Returns what it replaced, ``finished_run``'s words (``a finished
    ddp run of 2 ranks recorded 2026-12-07 04:40 UTC``), None when the folder held no finished
    run: the caller says it (the CLI, with the run's outcome), so a re-record never loses a
    finished run silently (issue 42). Raises ``RunDirBusy`` (another record holds the lock),
    ``OSError``.
    """
    check_no_links_out(run_dir)  # again: under torchrun rank 0 clears what every rank checked
    lock_run_dir(run_dir)
    listed = _listed_files(run_dir / MANIFEST_NAME)  # before the manifest goes
    replaced = finished_run(run_dir)  # said by the caller: never lose a finished run silently
    _write_no_follow(run_dir / RECORDING_NAME, f"{os.getpid()}\n")
    (run_dir / MANIFEST_NAME).unlink(missing_ok=True)
    for f in _entries(run_dir):
        rel = f.relative_to(run_dir).as_posix()
        ours = is_tracer_file(rel) and (listed is None or rel in listed)
        if f.is_file() and (ours or _TRANSIENT.fullmatch(f.name)):
            f.unlink(missing_ok=True)
    shutil.rmtree(run_dir / PARTS_DIR, ignore_errors=True)
    with contextlib.suppress(OSError):  # absent, or holds files that are not the tracer's
        (run_dir / MEMORY_DIR).rmdir()
    return replaced


def finished_run(run_dir: Path) -> str | None:
    """``a finished ddp run of 2 ranks recorded 2026-12-07 04:40 UTC`` when ``run_dir`` holds a
    finished record (the tracer's manifest and no record marker), None otherwise (empty, or a
    record that did not finish: nothing of value is replaced). Reads the manifest only."""
    path = run_dir / MANIFEST_NAME
    if (run_dir / RECORDING_NAME).exists() or not _is_tracer_manifest(path):
        return None
    try:
        m = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return None
    strategy, world, created = m.get("strategy"), m.get("world_size"), m.get("created_utc")
    ranks = f" of {world} rank{'s' * (world != 1)}" if type(world) is int else ""
    when = ""
    if isinstance(created, str):
        when = " recorded " + (created[:16].replace("T", " ") + " UTC"
                               if re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d.*", created) else created)
    return one_line(f"a finished {strategy if isinstance(strategy, str) else 'tracer'} run{ranks}{when}")


def incomplete_hint(run_dirs: list[Path], replaced: dict[Path, str] | None = None) -> str:
    """For the one line of a failed or interrupted command: which of ``run_dirs`` its records
    left incomplete (the record marker, no manifest) and how to clean them up, exactly --
    ``; traces/ddp is incomplete: record it again, or delete the folder traces/ddp`` (several:
    ``...: record them again, or delete the folders a, b``); "" when none is. ``replaced``: run
    dir -> the finished run its record replaced (``clear_run_dir``), said gone: ``traces/ddp is
    incomplete (the finished ddp run of 2 ranks recorded ... it held was removed when this
    record started)``. "Record it again", not "run this command again": the command may be what
    failed (a ``--fault hang`` canary hangs again). The analyzer refuses them until a record
    completes there (analyzer/ingest/rundirs.py)."""
    replaced = replaced or {}
    left = [d for d in run_dirs if (d / RECORDING_NAME).exists()]
    if not left:
        return ""
    if len(left) == 1:
        d = left[0]
        gone = (f" ({_the(replaced[d])} it held was removed when this record started)"
                if d in replaced else "")
        return f"; {d} is incomplete{gone}: record it again, or delete the folder {d}"
    named = ", ".join(f"{d}" + (f" ({_the(replaced[d])} it held was removed when its record "
                                "started)" if d in replaced else "") for d in left)
    return (f"; {named} are incomplete: record them again, or delete the folders "
            f"{', '.join(map(str, left))}")


def _the(run: str) -> str:
    """``a finished ddp run ...`` (``finished_run``) -> ``the finished ddp run ...``."""
    return "the " + run[2:] if run.startswith("a ") else run


def _write_no_follow(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` in place, never through a symlink there (``ELOOP``: OSError)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _listed_files(manifest: Path) -> set[str] | None:
    """The ``files[].path`` of the tracer manifest ``manifest``; None when there is none or it
    cannot be read as one (the previous record did not complete)."""
    if not _is_tracer_manifest(manifest):
        return None
    try:
        files = msgspec.json.decode(manifest.read_bytes()).get("files")
    except (OSError, msgspec.DecodeError):
        return None
    if not isinstance(files, list):
        return None
    return {f["path"] for f in files if isinstance(f, dict) and isinstance(f.get("path"), str)}


def holds_lock(run_dir: Path) -> bool:
    """True when this process holds ``run_dir``'s record lock (it cleared the run dir: the
    launcher, or global rank 0 under torchrun)."""
    return os.path.realpath(run_dir) in _HELD


def finish_record(run_dir: Path) -> None:
    """After ``manifest.json`` is written and every rank succeeded: remove the record marker
    (the run is complete). Called by the process holding the lock."""
    (run_dir / RECORDING_NAME).unlink(missing_ok=True)


def abandon_record(run_dir: Path) -> None:
    """A record of ``run_dir`` failed or was interrupted: when it had started writing there
    (the marker is present), remove the manifest if one was written (a rank may fail after
    rank 0 wrote it); the marker stays, so the run reads as incomplete. A run dir whose record
    never started keeps its previous complete contents."""
    if (run_dir / RECORDING_NAME).exists():
        (run_dir / MANIFEST_NAME).unlink(missing_ok=True)


def _entries(run_dir: Path) -> list[Path]:
    """The run dir's entries and its ``memory/`` folder's; a ``memory`` link is not entered
    (``check_no_links_out`` refused it before; this is for a link made since)."""
    memory = run_dir / MEMORY_DIR
    inside = [] if memory.is_symlink() else list(memory.glob("*"))
    return list(run_dir.iterdir()) + inside


def file_entries(run_dir: Path) -> list[FileEntry]:
    """One entry per tracer file in ``run_dir`` (``TRACER_FILE``): paths relative,
    '/'-separated, sorted. Other files (the analyzer's caches and reports) are not the record's."""
    entries = []
    for f in sorted(_entries(run_dir)):
        rel = f.relative_to(run_dir).as_posix()
        if f.is_file() and not f.is_symlink() and is_tracer_file(rel):
            entries.append(FileEntry(path=rel, size_bytes=f.stat().st_size, sha256=sha256_file(f)))
    return sorted(entries, key=lambda e: e.path)


def sweep_leftovers(out: Path) -> list[Path]:
    """Remove from ``out`` (the ``--out`` folder) what records killed beyond any clean-up
    (SIGKILL, a power cut) left there, and only what is provably theirs and theirs alone:

    - a baseline staging folder (``STAGING_PREFIX``) whose owner file names a dead process
      (``analyzer.contract.owner``) and that holds nothing but the owner file and baseline files;
    - a run dir that holds nothing but its record lock (``--repeat``: the later repeats of a
      killed record were claimed, never started) whose lock nobody holds and whose writer,
      named in it, is dead.

    Run dirs a record had started are left: they keep their marker and read as incomplete.
    Returns the paths removed. Never raises for a folder it cannot read or remove (kept)."""
    removed = owner.sweep(out, lambda name: name.startswith(STAGING_PREFIX),
                          lambda rel: _STAGED.fullmatch(rel) is not None)
    try:
        entries = [p for p in out.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return removed
    for d in entries:
        try:
            if not d.name.startswith(".") and _unstarted_and_dead(d):
                removed.append(d)
        except OSError:
            continue
    return removed


def staged_baseline(baseline_id: str) -> str:
    """The folder, inside a staging folder, of the baseline ``baseline_id`` (record.py: one per
    set of numerics settings)."""
    return f"baseline-{baseline_id}"


_STAGED = re.compile(rf"(baseline-[0-9a-f]{{12}}/)?({TRACER_FILE.pattern}|{_TRANSIENT.pattern})?",
                     re.ASCII)
"""What a staging folder holds besides its owner file: baseline folders (``staged_baseline``)
and, in them or beside them, baseline files."""


def _unstarted_and_dead(d: Path) -> bool:
    """Remove ``d`` when it holds only a lock file, free, written by a dead process (True)."""
    names = [p.name for p in d.iterdir()]
    lock = d / LOCK_NAME
    if names != [LOCK_NAME] or lock.is_symlink() or os.stat(d).st_uid != os.geteuid():
        return False
    fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live record holds it
            return False
        lines = os.pread(fd, 512, 0).decode("ascii", "replace").split("\n")
        if len(lines) < 2 or not owner.dead(lines[1].strip()):
            return False
        if os.stat(lock).st_ino != os.fstat(fd).st_ino:
            return False
        lock.unlink()  # while locked: whoever opens the path next gets a new file
    finally:
        os.close(fd)
    try:
        d.rmdir()
    except OSError:  # something arrived meanwhile: keep it
        return False
    return True
