"""The report files of ``analyzer report DIR`` (its options: analyzer/cli/report.py): analyse
DIR (``runs.analyse``), or take the report cached for unchanged inputs (reports/cache.py),
render it (reports/), write ``report.{md,json,html}`` in the output folder and remove an earlier
analysis's files of the formats not asked for."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analyzer.contract.report_types import AnalysisOptions, Report

log = logging.getLogger(__name__)
FORMATS = ("md", "json", "html")
PARSE_MODULES = ("analyzer.ingest.pipeline", "analyzer.ingest.decode", "analyzer.ingest.classify",
                 "analyzer.analyses.breakdown", "analyzer.analyses.collectives", "analyzer.analyses.prefetch")
"""What a worker parsing ranks uses (analyzer/ingest/ranktables.py ``rank_tables``): imported
before the workers fork."""


@contextlib.contextmanager
def said_on_stderr(notes: list[str]) -> Iterator[None]:
    """Keep in ``notes``, instead of logging them, the WARNING+ records of the ``analyzer`` and
    ``reports`` loggers (what a cold report said on stderr, e.g. an incomplete run analysed as
    found): the caller says them, and the report cache keeps them for a hit to say again. Lower
    levels go to the root logger. If the block raises, the kept notes are logged as usual."""

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                notes.append(record.getMessage())
            else:
                logging.getLogger().handle(record)

    keep = _Keep()
    loggers = [logging.getLogger(n) for n in ("analyzer", "reports")]
    saved = [lg.propagate for lg in loggers]
    for lg in loggers:
        lg.addHandler(keep)
        lg.propagate = False
    ok = False
    try:
        yield
        ok = True
    finally:
        for lg, prop in zip(loggers, saved):
            lg.removeHandler(keep)
            lg.propagate = prop
        if not ok:
            for n in notes:
                log.warning("%s", n)


def write_report(root: Path, *, out: Path | None, formats: list[str], options: AnalysisOptions,
                 notes: list[str] | None = None, scheduler: str | None = None,
                 tables_out: Path | None = None) -> tuple[Report, str]:
    """Analyse ``root`` with ``options`` and write the chosen formats under ``out`` (default
    ``default_out(root)``). Returns (the report, markdown text). Raises ``BadInput``.

    ``scheduler``: a Dask scheduler address (``tcp://HOST:PORT``) that parses the ranks
    (analyzer/ingest/cluster.py), else the local process pool. ``tables_out``: also write every
    run's per-rank tables there as a Parquet dataset (analyzer/ingest/dataset.py); the
    analysis then runs even when the report is cached (the per-rank tables caches answer).

    The notes the analysis says on stderr (``said_on_stderr``) are stored with the cached
    report and given again on a cache hit: appended to ``notes`` when a list is passed (the
    CLI prints them), else logged as warnings (``logging``)."""
    from analyzer.contract import outpaths, report_types
    from analyzer.contract.errors import BadInput, Reason
    from reports import cache, html, markdown

    started_ns = cache.started_ns()  # what this analysis may prune is older than this
    out, remote = _checked_out(root, out, formats, scheduler, tables_out)
    # Unchanged inputs, options and code: render the cached report (reports/cache.py).
    key = None if remote else cache.key(root, out, options)
    hit = cache.load_entry(root, out, key) if tables_out is None and key is not None else None
    report_json, said = hit or _analysed(root, options, scheduler, remote, tables_out)
    report = report_types.decode(report_json)  # render what report.json holds, hit or miss
    _say(said, notes)
    md = markdown.render(report)
    texts = {"json": lambda: report_json, "html": lambda: html.render(report, out), "md": lambda: md}
    rendered = {f"report.{f}": texts[f]() for f in ("json", "html", "md") if f in formats}
    written = {name: hashlib.sha256(text.encode("utf-8")).hexdigest() for name, text in rendered.items()}
    with cache.out_lock(out):  # one report at a time writes and prunes this folder
        for name, text in rendered.items():
            outpaths.write_out(out / name, text, option="--out")
        try:  # an earlier analysis's report.* of the formats not asked for: left, they
            # would sit beside this report as if one set (reports/cache.py remove_stale)
            stale, left = cache.remove_stale(
                out, [f"report.{f}" for f in FORMATS if f not in formats], written, started_ns)
        except OSError as exc:
            raise BadInput(exc.filename or out, Reason.UNWRITABLE, "is from an earlier analysis "
                           f"and cannot be removed ({exc.strerror})",
                           "pass --out to a writable folder") from None
    if hit is None and key is not None:
        cache.store(root, out, key, report_json, said)
    wrote = ", ".join(f"report.{f}" for f in FORMATS if f in formats)
    lines = [f"{out}: removed {', '.join(stale)} of an earlier analysis (this one wrote "
             f"{wrote})"] if stale else []
    if left:
        lines.append(f"{out}: left {', '.join(left)}, not written by the analyzer as it is now "
                     f"(edited, or its record cleared); this analysis wrote {wrote}")
    _say(lines, notes)
    return report, md


def _checked_out(root: Path, out: Path | None, formats: list[str], scheduler: str | None,
                 tables_out: Path | None) -> tuple[Path, bool]:
    """(the report folder, whether only the Dask workers' hosts hold the traces), every option
    checked before any analysis. Raises ``BadInput``."""
    from analyzer.contract import outpaths, settings
    from analyzer.contract.errors import BadInput, Reason
    from analyzer.ingest import hostlocal
    from analyzer.ingest.fswalk import check_name
    from reports import cache

    settings.tables_memory_bytes()  # a bad value is said even when the report is cached
    # traces only the Dask workers' hosts hold (analyzer/ingest/hostlocal.py)
    remote = scheduler is not None and not hostlocal.client_sees(root)
    if remote and out is None:
        raise BadInput(root, Reason.BAD_OPTION, "is not on this machine: the Dask workers read "
                       "the traces there, so there is no folder here to write the report in",
                       "pass --out FOLDER")
    if not remote and not root.is_dir():
        from analyzer.ingest import rundirs

        rundirs.discover(root)  # raises the one-line BadInput: missing, or not a trace file
    out = out or default_out(root)
    outpaths.check_out(out, option="--out", what="the report")
    if tables_out is not None:
        from analyzer.ingest import dataset

        outpaths.check_out(tables_out, option="--tables-out", what="the tables dataset")
        dataset.check_target(tables_out, root)
        a, b = os.path.realpath(out), os.path.realpath(tables_out)
        if os.path.commonpath([a, b]) in (a, b):  # one inside the other: each would replace
            raise BadInput(tables_out, Reason.BAD_OPTION, f"overlaps --out {out}: the report "
                           "and the dataset would each read the other as files they did not "
                           "write", "give --tables-out and --out two separate folders")
    check_name(root)  # the report, its cache's key and its notes hold the input's path
    check_name(out)
    # report files of the user's own in --out are never replaced (reports/cache.py)
    with cache.out_lock(out, create=False):  # checked before the input is: no cache file made
        foreign = cache.foreign_files(out, [f"report.{f}" for f in FORMATS if f in formats])
    if foreign:
        raise BadInput(out / foreign[0], Reason.UNWRITABLE, "was not written by analyzer report "
                       "and a report would replace it" + (f" (also {', '.join(foreign[1:])})"
                                                          if len(foreign) > 1 else ""),
                       "move it away, or pass another --out")
    return out, remote


def _analysed(root: Path, options: AnalysisOptions, scheduler: str | None, remote: bool,
              tables_out: Path | None) -> tuple[str, list[str]]:
    """(report.json's text of ``runs.analyse(root, options)``, the notes it said on stderr):
    the ranks parsed by the local pool or the Dask cluster at ``scheduler`` (``remote``: the
    traces on its workers' hosts only), the tables also written to ``tables_out``."""
    from analyzer.contract import report_types
    from analyzer.ingest import cluster, hostlocal, pool

    said: list[str] = []
    with contextlib.ExitStack() as stack:
        if scheduler is not None:  # ranks parsed by the Dask cluster's workers
            dask_map = stack.enter_context(cluster.connected(scheduler))
            if remote:
                stack.enter_context(hostlocal.remote_job(root, dask_map))
        stack.enter_context(said_on_stderr(said))
        with pool.collector_paused():  # pandas and the analysis: only on a cache miss
            from analyzer.compare import runs
            for name in PARSE_MODULES:
                importlib.import_module(name)
        if scheduler is None:
            # forked after the imports, a worker inherits them (preload: a no-op) instead of
            # importing them again beside this process: the same wall time on two cores, 0.3-
            # 0.5 s less CPU per worker. Where workers are spawned (macOS) they import ahead.
            stack.enter_context(pool.workers(preload=PARSE_MODULES))
        if tables_out is not None:
            from analyzer.ingest import dataset

            stack.enter_context(dataset.writing(tables_out))
        return report_types.encode(runs.analyse(root, options)), said


def _say(lines: list[str], notes: list[str] | None) -> None:
    """Append ``lines`` to ``notes`` (the CLI prints them), or log each as a warning."""
    if notes is not None:
        notes += lines
    else:
        for line in lines:
            log.warning("%s", line)


def default_out(root: Path) -> Path:
    """The report folder when ``--out`` is not given: ``DIR/report`` for a folder
    (``outpaths.default_report_dir``: refused when a symlink or outside DIR), ``FILE.report``
    beside one trace file (refused when a symlink; a later report of its folder skips it: it
    holds report files, analyzer/ingest/rundirs.py ``OUTPUT_FILES``)."""
    from analyzer.contract import outpaths
    from analyzer.contract.errors import BadInput, Reason

    if not root.is_file():
        return outpaths.default_report_dir(root)
    out = root.with_name(root.name + ".report")
    if out.is_symlink():
        raise BadInput(out, Reason.UNWRITABLE, "is a symlink; the default report folder of a "
                       "trace file is never written through one", "remove the link, or pass --out")
    return out
