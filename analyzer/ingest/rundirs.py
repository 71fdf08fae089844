"""Find what ``analyzer report DIR`` should read: run directories or one folder of foreign traces.

DIR may be (checked in this order):

0. one trace file: a foreign job of one file (as ``summary`` and HTA take);
1. one run directory: it holds ``manifest.json``;
1b. a run directory whose record did not complete (failed, interrupted, or still running): the
   ``schemas.RECORDING_NAME`` marker (even beside a manifest: the previous record's, being
   replaced), or no manifest but the tracer's files (``tracer_written``: baseline files placed before any rank
   starts, rank traces, per-rank parts) -- an error unless ``allow_incomplete``;
2. a traces root: sub-folders holding ``manifest.json`` (one run each), or symlinks to run
   directories (followed, wherever they point: a folder of links is the user's choice of runs;
   a link to the root or above it is a loop, skipped and named); a sub-folder with the
   tracer's files but no manifest is an incomplete run -- refused in one line naming them all
   unless ``allow_incomplete``, then analysed as found, marked ``incomplete`` (README), with a
   warning; a sub-folder of traces with none of the tracer's files is foreign traces, which a
   root does not take: an error (``foreign_in_root``) whatever ``allow_incomplete`` says,
   advising to pass that folder alone. Never read as input: ``analyzer report``'s output
   folders (``OUTPUT_FILES``, whatever their name; ``report/`` with a manifest is a run),
   hidden sub-folders (the tracer's staging folder; named), the per-rank tables caches
   (``*.tables.msgpack``: not a trace suffix) and ``merge``'s outputs (fswalk.py);
3. a folder of foreign traces: Chrome/Kineto trace files (``*.json``, ``*.json.gz``) and no
   manifest anywhere -- one job whose parity is "not recorded".

Flight Recorder JSON dumps (issue 30) ride along with the job they sit beside (``fr_dumps``):
an incomplete run directory's ``rank<r>.flightrec.json``, a foreign folder's FR dumps (which are
then not traces; a folder of dumps alone is a job without traces).

Each folder is listed once and each manifest read once per command: a ``RunDir`` carries its
validated manifest and the trace files the ingest (analyzer/ingest/pipeline.py) reads, so nothing is
walked or read again. ``find_job`` is the same walk for the commands that take one job
(``summary`` also takes one trace file, ``merge``, the library's ``api.load_tables``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from analyzer.contract import schemas
from analyzer.contract.errors import BadInput
from analyzer.ingest import frdump
from analyzer.ingest.fswalk import (DATASET_MARKER, analyzer_output, entries, linked_folder,
                                    not_an_input)

log = logging.getLogger(__name__)

TRACE_SUFFIXES = (".json", ".json.gz")
"""Files are hashed in chunks of this size (memory stays flat for large traces)."""


@dataclass(kw_only=True, slots=True)
class RunDir:
    """One job to report on."""

    path: Path
    """The run directory (or the foreign traces folder)."""
    name: str
    """Display name: the manifest's run_name, else the folder name."""
    manifest: schemas.Manifest | None
    """The validated manifest; None for foreign traces."""
    incomplete: bool = False
    """A tracer run directory without ``manifest.json`` (the record did not finish), analysed
    only with ``allow_incomplete`` and marked so."""
    traces: list[Path] = field(default_factory=list)
    """The trace files to analyse, sorted by name (``trace_files``; a name never decides a
    rank)."""
    notes: list[str] = field(default_factory=list)
    """Files of the folder left out of ``traces`` (symlinks out of it, hidden files, the
    analyzer's own outputs), one line each."""
    fr_dumps: list[Path] = field(default_factory=list)
    """Flight Recorder JSON dumps beside the traces (``fr_dumps``): a failed record's
    ``rank<r>.flightrec.json``, or FR dumps in a folder of foreign traces."""
    fr_pickles: list[Path] = field(default_factory=list)
    """Flight Recorder dumps in torch's pickle format beside the traces / dumps
    (``frdump.pickle_dumps``: ``nccl_trace_rank_<r>``): never read, named in the run's
    Flight Recorder notes and caveats."""

    @property
    def foreign(self) -> bool:
        """True for traces not written by ``tracer record``."""
        return self.manifest is None

    @property
    def strategy(self) -> str:
        """The manifest's strategy, ``unknown`` for foreign traces."""
        return self.manifest.strategy if self.manifest else "unknown"


@dataclass(kw_only=True, slots=True)
class Discovery:
    """What was found under DIR."""

    root: Path
    """DIR as given."""
    layout: str
    """``run`` | ``root`` | ``foreign``."""
    runs: list[RunDir]
    """Runs in a stable order: single first, then by strategy order, then name."""
    warnings: list[str] = field(default_factory=list)
    """Incomplete runs included as found, folders left out by the walk: one line each."""


def _is_trace(p: Path) -> bool:
    return p.is_file() and p.name.endswith(TRACE_SUFFIXES) and p.name != schemas.MANIFEST_NAME


def trace_files(children: list[Path], *, run_dir: bool, notes: list[str]) -> list[Path]:
    """The trace files among a folder's ``children`` (``fswalk.entries``): ``rank*.trace.json.gz``
    in a run directory (and hidden ``*.json*``, a killed record's ``.tmp-<pid>-rank0...``, so
    that they are named as skipped), else every ``*.json`` / ``*.json.gz`` but the manifest.
    Hidden files and the analyzer's own outputs (``fswalk.not_an_input`` by name; outside a
    run directory also ``fswalk.analyzer_output`` by their first JSON key, whatever their
    name) are left out with one line each appended to ``notes``."""
    from fnmatch import fnmatch

    if run_dir:
        found = [p for p in children if p.is_file() and (fnmatch(p.name, schemas.TRACE_GLOB) or (
            p.name.startswith(".") and fnmatch(p.name, "*.json*")))]
    else:  # a Flight Recorder dump is not a trace (fr_dumps)
        found = [p for p in children if _is_trace(p) and not frdump.is_dump(p)]
    keep = []
    for p in found:
        why = not_an_input(p.name) or (None if run_dir else analyzer_output(p))
        if why:
            notes.append(f"{p}: {why}; skipped")
        else:
            keep.append(p)
    return keep


def fr_dumps(children: list[Path], *, run_dir: bool) -> list[Path]:
    """The Flight Recorder JSON dumps among a folder's ``children`` (analyzer/ingest/frdump.py):
    in a run directory the tracer's ``rank<r>.flightrec.json``, else every ``*.json`` /
    ``*.json.gz`` that starts as a dump does (not a trace: ``trace_files`` leaves them out)."""
    if run_dir:
        return frdump.in_run_dir(children)
    return sorted(p for p in children if _is_trace(p) and not not_an_input(p.name) and frdump.is_dump(p))


TRACER_FILES = (schemas.NUMERICS_NAME, schemas.STEPS_NAME, schemas.MEMORY_CATEGORIES_NAME, schemas.KEPT_NAME,
                schemas.KEPT_TENSORS_NAME, schemas.GOLDEN_NAME, schemas.MEMORY_DIR,
                ".baseline.activations.safetensors", ".parts")
"""Files (and folders) of a run directory besides the manifest and the traces: the baseline
files (``baseline.safetensors``, its hidden activations, ``golden.parquet``) are placed before
any rank starts (tracer/record.py ``prepare_run_dir``), ``.parts`` holds per-rank tables while
the record runs (tracer/rundir.py), so a failed or running record always has one of them."""

OUTPUT_FILES = ("report.md", "report.json", "report.html", DATASET_MARKER)
"""What ``analyzer report`` writes into its output folder (analyzer/compare/reportfiles.py)."""


def tracer_written(folder: Path, children: list[Path] | None = None) -> bool:
    """True when ``folder``, which is not ``_complete``, is a run directory of ``tracer record``
    that did not complete (failed, interrupted, or still running): it holds the
    ``schemas.RECORDING_NAME`` marker or one of ``TRACER_FILES`` (a record places the baseline
    before any rank starts, so a run dir being recorded has them). With ``children`` (a traces root's sub-folder, listed), a trace named as the tracer
    names them (``schemas.TRACE_GLOB``) counts too: a root holds run directories only. A folder
    given directly with such names and nothing else of the tracer is taken as foreign traces
    (copied traces, or another tool's of the same naming)."""
    from fnmatch import fnmatch

    return (any((folder / n).exists() for n in (*TRACER_FILES, schemas.RECORDING_NAME))
            or any(fnmatch(p.name, schemas.TRACE_GLOB) for p in children or []))


def _complete(folder: Path) -> bool:
    """True when ``folder`` is a finished record: ``manifest.json`` and no
    ``schemas.RECORDING_NAME`` marker (tracer record writes the marker before it removes the
    previous manifest and removes it after the new one, so a manifest beside the marker is
    a previous record's, being replaced, or one a failed record left)."""
    return (folder / schemas.MANIFEST_NAME).is_file() and not (folder / schemas.RECORDING_NAME).exists()


def _analyzer_output(sub: Path) -> bool:
    """True when the sub-folder ``sub`` (no manifest) is an output folder of ``analyzer
    report`` (it holds one of ``OUTPUT_FILES``): the analyzer's own output, never an input."""
    return any((sub / n).is_file() for n in OUTPUT_FILES)


def _read(run_dir: Path) -> RunDir:
    try:
        manifest = schemas.read_manifest(run_dir / schemas.MANIFEST_NAME)
    except schemas.SchemaError as exc:
        raise BadInput(exc.path, "bad_run_file", str(exc).split(": ", 1)[-1]) from None
    _check_manifest_paths(run_dir, manifest)
    _verify_files(run_dir, manifest)
    children, notes = entries(run_dir)
    traces = trace_files(children, run_dir=True, notes=notes)
    _check_traces_listed(run_dir, manifest, traces)
    return RunDir(path=run_dir, name=manifest.run_name or run_dir.name,
                  manifest=manifest, traces=traces, notes=notes, fr_pickles=frdump.pickle_dumps(children))


def _check_manifest_paths(run_dir: Path, manifest: schemas.Manifest) -> None:
    """Raise ``BadInput`` (``bad_run_file``, naming the manifest entry) when a listed file
    resolves, through a symlink, to a place outside ``run_dir``: its size and SHA-256 would be
    checked, and the file read, somewhere the run does not own. Absolute paths and ``..`` are
    refused by the manifest's validation (``schemas.unsafe_run_path``) before this."""
    base = os.path.realpath(run_dir)
    for i, f in enumerate(manifest.files):
        target = os.path.realpath(run_dir / f.path)
        if os.path.commonpath([base, target]) != base:
            raise BadInput(run_dir / schemas.MANIFEST_NAME, "bad_run_file",
                           f"entry $.files[{i}].path {f.path!r} resolves through a symlink to "
                           f"{target}, outside the run directory",
                           "replace the link by the file itself, or re-record the run")


def _check_traces_listed(run_dir: Path, manifest: schemas.Manifest, traces: list[Path]) -> None:
    """Raise ``BadInput`` (``bad_run_file``) naming the traces of ``run_dir`` that
    ``manifest.json`` does not list: their SHA-256 could not be checked against the record (a
    trace planted or copied in after it), and the tracer lists every trace it writes."""
    listed = {f.path for f in manifest.files}
    extra = [p for p in traces if p.relative_to(run_dir).as_posix() not in listed]
    if extra:
        raise BadInput(extra[0] if len(extra) == 1 else run_dir, "bad_run_file",
                       f"{', '.join(p.name for p in extra)} not listed in manifest.json: added "
                       "after the record, so not checked against it",
                       "move the file(s) out of the run directory, or re-record the run")


def _verify_files(run_dir: Path, manifest: schemas.Manifest) -> None:
    """Check every file ``manifest`` lists (the tracer writes it last, with each file's
    ``size_bytes`` and ``sha256``). Raises ``BadInput``: ``missing_file`` naming the files gone
    since the record (a deleted rank's trace would otherwise read as a smaller world), else
    ``file_changed`` naming the first file replaced or edited (a numerics.parquet copied in from
    another run would otherwise be analysed and gated as this run's). The size is compared first
    (no read); the hash only when the size agrees, and not for traces: their parse hashes them
    anyway and checks the manifest's sha256 (analyzer/ingest/pipeline.py
    ``check_manifest_sha256``), so big traces are not read twice."""
    gone = [f.path for f in manifest.files if not (run_dir / f.path).is_file()]
    if gone:
        raise BadInput(run_dir / gone[0] if len(gone) == 1 else run_dir, "missing_file",
                       f"{', '.join(gone)} listed in manifest.json but missing",
                       "restore the file(s) or re-record the run")
    for f in manifest.files:
        path = run_dir / f.path
        st = path.stat()
        if st.st_size != f.size_bytes:
            what = f"size {st.st_size} bytes differs from manifest.json's {f.size_bytes}"
        elif _sparse(st):
            raise BadInput(path, "file_changed", f"is a sparse file ({st.st_size:,} bytes, "
                           f"{st.st_blocks * 512:,} on disk): not a file tracer record wrote, "
                           "so it is not hashed", "re-record the run")
        elif not _is_trace(path) and schemas.sha256_file(path) != f.sha256.lower():
            what = "sha256 differs from manifest.json"
        else:
            continue
        raise BadInput(path, "file_changed", f"changed since it was recorded ({what})", "re-record the run")


SPARSE_MIN_BYTES = 64 << 20
"""A listed file at least this large with under 1/8 of its bytes on disk is sparse."""


def _sparse(st: os.stat_result) -> bool:
    """True when the file of ``st`` is mostly holes (``truncate -s 1T``): the tracer writes every
    byte of its files, while hashing a sparse terabyte would hang the command. Small files and
    compressing file systems (ZFS, btrfs: a few times, not 8x, for Parquet and tensors) pass."""
    blocks = getattr(st, "st_blocks", None)
    return blocks is not None and st.st_size >= SPARSE_MIN_BYTES and blocks * 512 * 8 < st.st_size


def _order(run: RunDir) -> tuple:
    names = list(schemas.STRATEGIES)  # the strategy table's order: the reference first
    return (names.index(run.strategy) if run.strategy in names else len(names), run.name)


_NOT_DONE = "the record did not complete (failed, interrupted or still running)"
_ANALYSE_ANYWAY = "or pass --allow-incomplete to analyse what is there"


def cleanup_hint(folders: list[Path]) -> str:
    """How to clean up incomplete run directories, exactly: re-record each where it was
    recorded (``tracer record`` writes ``--out OUT --name NAME`` to ``OUT/NAME``, and replaces a
    run dir of its own there) or delete the folder. One folder::

        re-record it (tracer record ... --out traces --name ddp) or delete the folder traces/ddp

    Several: each named, ``re-record them (tracer record ... --out traces --name ddp, ... --name
    fsdp) or delete the folders traces/ddp, traces/fsdp``."""
    commands = {_writer(f) for f in folders}  # a projection's folder: tracer project again
    command = commands.pop() if len(commands) == 1 else "record / tracer project"
    if len(folders) == 1:
        f = folders[0]
        return f"re-record it (tracer {command} ... --out {f.parent} --name {f.name}) or delete the folder {f}"
    names = ", ".join(f"... --name {f.name}" for f in folders[1:])
    return (f"re-record them (tracer {command} ... --out {folders[0].parent} --name {folders[0].name}"
            f"{', ' + names if names else ''}) or delete the folders {', '.join(map(str, folders))}")


def _writer(folder: Path) -> str:
    """``project`` when ``folder``'s record marker says ``tracer project`` wrote it (its second
    line, tracer/project.py ``project``), else ``record``."""
    try:
        lines = (folder / schemas.RECORDING_NAME).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return "record"
    return "project" if lines[1:2] == ["project"] else "record"


def _incomplete_fix(folders: list[Path]) -> str:
    return f"{cleanup_hint(folders)}; {_ANALYSE_ANYWAY}"


def _why_incomplete(folder: Path) -> str:
    """Why a tracer run directory is incomplete, in words: the marker or the missing manifest."""
    if (folder / schemas.RECORDING_NAME).exists():
        return f"{schemas.RECORDING_NAME} marker present: {_NOT_DONE}"
    return f"no manifest.json (the tracer writes it last): {_NOT_DONE}"


def _unreadable(folder: Path, exc: OSError) -> BadInput:
    return BadInput(folder, "unreadable", f"cannot read the folder ({exc.strerror or exc})",
                    "check the path and its permissions")


def _not_a_dataset(folder: Path) -> None:
    """Refuse a ``--tables-out`` dataset given as the input (it holds Parquet, not traces),
    and a folder that cannot be listed or looked into (``unreadable``: without read or
    search permission; ``Path.is_file`` raises ``PermissionError``)."""
    try:
        os.scandir(folder).close()
        marked = (folder / DATASET_MARKER).is_file()
    except OSError as exc:
        raise _unreadable(folder, exc) from None
    if marked:
        raise BadInput(folder, "empty", "is a dataset written by --tables-out (Parquet tables), "
                       "not traces", "query it with DuckDB or pandas (README \"Beyond one "
                       "machine\"), or pass the folder of traces it came from")


def _existing(root: Path) -> Path:
    """``root``, a folder or a regular file. Raises ``BadInput``: missing, or anything else (a
    FIFO, a device, a socket: nothing a profiler writes, and listing it as a folder fails)."""
    if not root.exists():
        raise BadInput(root, "missing", "no such file or folder", "check the path")
    if not root.is_file() and not root.is_dir():
        raise BadInput(root, "not_a_trace", "is neither a folder nor a regular file",
                       "point at a folder of traces, a run directory or a trace file")
    return root


def _trace_file(path: Path) -> RunDir:
    """One file given on its own: a job of one trace (``summary``, ``report``, ``merge`` and HTA
    take one); the ingest refuses a file that is not a trace, naming it. Raises ``BadInput``
    for a run directory's ``manifest.json``: its folder is what to pass; for a pickled Flight
    Recorder dump (``frdump.pickle_refusal``)."""
    if path.name == schemas.MANIFEST_NAME:
        raise BadInput(path, "not_a_folder", "is a run directory's manifest, not a trace",
                       f"pass the run directory that holds it: {path.parent}")
    if frdump.is_pickle(path):  # torch's default nccl_trace_rank_<r>: never unpickled
        raise frdump.pickle_refusal(path)
    return RunDir(path=path, name=path.name, manifest=None, traces=[path])


def _subfolders_hint(path: Path, children: list[Path]) -> BadInput | None:
    """The error for a folder without trace files whose sub-folders hold runs or traces (the
    commands that take one job): which to pass instead. None when no sub-folder does."""
    subs = [p for p in children if p.is_dir() and not p.name.startswith(".")
            and ((p / schemas.MANIFEST_NAME).is_file() or any(_is_trace(q) for q in p.iterdir()))]
    if not subs:
        return None
    shown = ", ".join(p.name for p in subs[:3]) + (", ..." if len(subs) > 3 else "")
    return BadInput(path, "empty", f"holds no trace files, only sub-folders of traces ({shown})",
                    f"pass one of them, e.g. {subs[0]}; `analyzer report {path}` takes them all")


def find_job(path: Path | str, *, allow_incomplete: bool = False) -> RunDir:
    """The one job at ``path``, for the commands that analyse one job: a trace file (its own
    job of one file), a run directory (``manifest.json`` read and checked as ``discover`` does),
    a run directory without manifest (``tracer_written``: refused unless ``allow_incomplete``)
    or a folder of foreign traces. Raises ``BadInput``: also for a folder without trace files
    whose sub-folders hold some (naming what to pass instead); a folder with neither is left
    to the ingest (analyzer/ingest/pipeline.py ``load_run``), which refuses it."""
    if Path(path) in _ELSEWHERE:  # traces the Dask workers' hosts hold (hostlocal.py)
        return _ELSEWHERE[Path(path)].runs[0]
    path = _existing(Path(path))
    if path.is_file():
        return _trace_file(path)
    _not_a_dataset(path)
    if _complete(path):
        return _read(path)
    children, notes = entries(path)
    incomplete = tracer_written(path)
    if incomplete and not allow_incomplete:
        raise BadInput(path, "incomplete_run", f"incomplete run: {_why_incomplete(path)}",
                       _incomplete_fix([path]))
    traces = trace_files(children, run_dir=incomplete, notes=notes)
    hint = None if traces or incomplete else _subfolders_hint(path, children)
    if hint:
        raise hint
    return RunDir(path=path, name=path.name, manifest=None, incomplete=incomplete, notes=notes,
                  traces=traces, fr_dumps=fr_dumps(children, run_dir=incomplete),
                  fr_pickles=frdump.pickle_dumps(children))


def _linked_runs(root: Path, children: list[Path], skipped: list[str]) -> list[Path]:
    """Symlinks in ``root`` to run directories outside it (a folder of links to runs is the
    user's choice of runs): appended to ``children`` and their "outside" lines taken out of
    ``skipped``. A link to ``root`` or a folder above it (a loop) or to anything that is not a
    run directory stays skipped and named (analyzer/ingest/fswalk.py ``entries``)."""
    kept = set(children)
    for link in sorted(p for p in root.iterdir() if p.is_symlink() and p not in kept):
        if linked_run(link, root) is None:
            continue
        children.append(link)
        skipped[:] = [s for s in skipped if not s.startswith(f"{link}: ")]
    return sorted(children)


def linked_run(link: Path, root: Path) -> Path | None:
    """The run directory (complete or not) the symlink ``link`` in ``root`` names outside it
    (``fswalk.linked_folder``), else None: what ``_linked_runs`` takes and the report cache's
    key walks (reports/cache.py)."""
    target = linked_folder(link, root)
    return target if target is not None and (_complete(target) or tracer_written(target)) else None


_ELSEWHERE: dict[Path, Discovery] = {}
"""Jobs whose traces only the Dask workers' hosts hold (analyzer/ingest/hostlocal.py)."""


@contextlib.contextmanager
def elsewhere(found: Discovery) -> Iterator[None]:
    """Inside the block ``discover(found.root)`` returns ``found`` (a job the Dask workers
    listed on their hosts; this machine has no such folder)."""
    _ELSEWHERE[found.root] = found
    try:
        yield
    finally:
        _ELSEWHERE.pop(found.root, None)


def _incomplete_runs(root: Path, incomplete: list[Path]) -> BadInput:
    """The one problem naming every incomplete run of ``root`` (its own path and reason when
    there is one)."""
    one = len(incomplete) == 1
    return BadInput(
        incomplete[0] if one else root, "incomplete_run",
        f"incomplete run: {_why_incomplete(incomplete[0])}" if one else
        f"incomplete runs {', '.join(p.name for p in incomplete)}: {_NOT_DONE} (no "
        f"manifest.json, or a {schemas.RECORDING_NAME} marker)",
        f"{cleanup_hint(incomplete)}; or pass --allow-incomplete to analyse as found (marked "
        "incomplete, not ranked, not gated)")


def _foreign_job(root: Path, children: list[Path], skipped: list[str]) -> Discovery:
    """``root`` with no run directory: one foreign job of its traces and Flight Recorder
    dumps. Raises ``BadInput`` ("empty") when it holds neither (``skipped``: the walk's
    notes, named in the message)."""
    traces = trace_files(children, run_dir=False, notes=skipped)
    dumps = fr_dumps(children, run_dir=False)
    if traces or dumps:
        return Discovery(root=root, layout="foreign", runs=[RunDir(
            path=root, name=root.name, manifest=None, notes=skipped, traces=traces,
            fr_dumps=dumps, fr_pickles=frdump.pickle_dumps(children))])
    pickles = frdump.pickle_dumps(children)
    if pickles:  # torch's default FR dumps (nccl_trace_rank_<r>): named, never unpickled
        raise frdump.pickle_folder_refusal(root, pickles)
    left = f" ({'; '.join(skipped)})" if skipped else ""  # e.g. only hidden *.json files
    raise BadInput(root, "empty", "holds no run directory (manifest.json) and no trace files"
                   + left, "pass a traces root written by `tracer record`, one run directory, "
                   "or a folder of *.json / *.json.gz profiler traces")


def _claimed_only(sub: Path) -> list[str]:
    """The warning for a sub-folder with no trace and none of the tracer's files that holds the
    record lock (``schemas.LOCK_NAME``): a run dir a ``--repeat`` record claimed and never
    started (killed before it; the next record sweeps it), or one about to start."""
    if not (sub / schemas.LOCK_NAME).is_file():
        return []
    return [f"{sub}: holds only the record lock of tracer record (a --repeat record killed "
            "before this run, or one still running): no run yet; skipped"]


def discover(root: Path | str, *, allow_incomplete: bool = False) -> Discovery:
    """Classify ``root`` and list its runs. ``root`` may also be one trace file (a foreign job
    of one file). Raises ``BadInput`` naming the folder when it is missing, empty of runs and
    traces, or holds incomplete runs (one line naming them all, unless ``allow_incomplete``).

    Left out of a traces root: hidden sub-folders (the tracer's staging folder, named in a
    warning), the output folders of ``analyzer report`` (``OUTPUT_FILES``, whatever their name),
    and sub-folders with no trace and no tracer file.
    """
    if Path(root) in _ELSEWHERE:
        return _ELSEWHERE[Path(root)]
    root = _existing(Path(root))
    if root.is_file():
        return Discovery(root=root, layout="foreign", runs=[_trace_file(root)])
    _not_a_dataset(root)
    if _complete(root):
        return Discovery(root=root, layout="run", runs=[_read(root)])
    children, skipped = entries(root)
    if tracer_written(root):
        if not allow_incomplete:
            raise BadInput(root, "incomplete_run", f"incomplete run: {_why_incomplete(root)}",
                           _incomplete_fix([root]))
        # the run is root itself: the walk's notes are the run's (said once, by its analysis)
        return Discovery(root=root, layout="run", runs=[RunDir(
            path=root, name=root.name, manifest=None, incomplete=True, notes=skipped,
            traces=trace_files(children, run_dir=True, notes=skipped),
            fr_dumps=fr_dumps(children, run_dir=True), fr_pickles=frdump.pickle_dumps(children))])
    children = _linked_runs(root, children, skipped)
    warnings: list[str] = list(skipped)
    runs: list[RunDir] = []
    problems: list[BadInput] = []
    incomplete: list[Path] = []
    for sub in [p for p in children if p.is_dir()]:
        if _complete(sub):
            runs.append(_read(sub))
            continue
        if sub.name.startswith("."):
            warnings.append(f"{sub}: hidden folder (e.g. a staging folder of tracer record); "
                            "skipped")
            continue
        if _analyzer_output(sub):
            continue
        sub_children, notes = entries(sub)
        traces = [p for p in sub_children if _is_trace(p)]
        written = tracer_written(sub, sub_children)
        if not traces and not written:
            warnings += _claimed_only(sub)
            continue
        if not written:
            problems.append(BadInput(
                sub, "foreign_in_root", "holds profiler traces that `tracer record` did not "
                "write (no manifest.json and none of the other files of a run directory)",
                f"a traces root holds run directories only: analyse each folder of foreign "
                f"traces on its own, e.g. `analyzer report {sub}`"))
            continue
        if allow_incomplete:  # README: analysed as found, marked incomplete
            msg = _why_incomplete(sub)
            warnings.append(f"{sub}: {msg}; analysed as found (--allow-incomplete); to clean "
                            f"up, {cleanup_hint([sub])}")
            log.warning("%s: %s; analysed as found", sub, msg)
            runs.append(RunDir(path=sub, name=sub.name, manifest=None, incomplete=True,
                               notes=notes, traces=trace_files(sub_children, run_dir=True,
                                                               notes=notes),
                               fr_dumps=fr_dumps(sub_children, run_dir=True),
                               fr_pickles=frdump.pickle_dumps(sub_children)))
        else:
            incomplete.append(sub)
    if incomplete:  # one line naming every incomplete run, before other problems
        problems.insert(0, _incomplete_runs(root, incomplete))
    if problems:
        first = problems[0]
        raise BadInput(first.path, first.reason, first.message, first.fix, problems=problems[1:])
    if runs:
        names = [r.name for r in runs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise BadInput(root, "duplicate_run", f"run name(s) {', '.join(dup)} appear twice",
                           "give each run directory a distinct run_name")
        return Discovery(root=root, layout="root", runs=sorted(runs, key=_order), warnings=warnings)
    return _foreign_job(root, children, skipped)
