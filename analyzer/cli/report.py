"""`analyzer report DIR` (issue 4); `analyzer gate` is analyzer/cli/gate.py."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from analyzer.cli.outpaths import input_path

if TYPE_CHECKING:
    from analyzer.contract.report_types import AnalysisOptions, Report

log = logging.getLogger(__name__)
FORMATS = ("md", "json", "html")
PARSE_MODULES = ("analyzer.ingest.pipeline", "analyzer.ingest.decode", "analyzer.ingest.classify",
                 "analyzer.analyses.breakdown", "analyzer.analyses.collectives", "analyzer.analyses.prefetch")
"""What a worker parsing ranks imports (analyzer/ingest/pipeline.py ``rank_tables``)."""
ALLOW_INCOMPLETE_HELP = (
    "Analyse a run directory without manifest.json (a record that did not finish) as found: "
    "marked incomplete, parity not checked, left out of the ranking. Folders of foreign "
    "traces need no flag: pass each such folder itself (a traces root takes run directories).")
DEVICE_MEMORY_HELP = (
    "One device's memory, e.g. 80GiB (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB): the Memory section "
    "says per run whether its largest per-rank peak fits, and with how much to spare.")
SCHEDULER_HELP = (
    "Parse the ranks on this Dask scheduler's workers (tcp://HOST:PORT; default "
    "$DASK_SCHEDULER_ADDRESS; 'local' or unset: the local cores). Workers see the traces at "
    "the same absolute path (a shared filesystem), or, when this machine does not have DIR, "
    "each worker host lists its own traces there (report then needs --out). Needs "
    "paritytrace[dask].")
TABLES_OUT_HELP = (
    "Also write the per-rank tables to this folder (DIR) as a hive-partitioned Parquet dataset "
    "(DIR/<table>/run=<run>/rank=<rank>/part-0.parquet) for DuckDB / pandas / polars. DIR: new, "
    "empty, or a dataset written by this option; outside the input.")


def _formats(value: str) -> list[str]:
    wanted = [f.strip() for f in value.split(",") if f.strip()]
    bad = [f for f in wanted if f not in FORMATS]
    if bad or not wanted:
        raise typer.BadParameter(f"unknown format(s) {', '.join(bad) or '(none)'}; "
                                 f"choose from {','.join(FORMATS)}")
    return wanted


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
    from analyzer.cli import outpaths
    from analyzer.contract import report_types
    from reports import cache, html, markdown

    from analyzer.contract.errors import BadInput, Reason
    from analyzer.ingest import hostlocal, spill

    spill.budget_bytes()  # a bad PARITYTRACE_TABLES_MEMORY is said even when the report is cached

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
    from analyzer.ingest.fswalk import check_name

    check_name(root)  # the report, its cache's key and its notes hold the input's path
    check_name(out)
    started_ns = cache.started_ns()  # what this analysis may prune is older than this
    # report files of the user's own in --out are never replaced (reports/cache.py)
    with cache.out_lock(out):
        foreign = cache.foreign_files(out, [f"report.{f}" for f in FORMATS if f in formats])
    if foreign:
        raise BadInput(out / foreign[0], Reason.UNWRITABLE, "was not written by analyzer report "
                       "and a report would replace it" + (f" (also {', '.join(foreign[1:])})"
                                                          if len(foreign) > 1 else ""),
                       "move it away, or pass another --out")
    # Unchanged inputs, options and code: render the cached report (reports/cache.py).
    key = None if remote else cache.key(root, out, options)
    hit = cache.load_entry(root, out, key) if tables_out is None and key is not None else None
    if hit is None:
        from analyzer.ingest import cluster, pool

        said: list[str] = []
        with contextlib.ExitStack() as stack:
            if scheduler is not None:  # ranks parsed by the Dask cluster's workers
                dask_map = stack.enter_context(cluster.connected(scheduler))
                if remote:
                    stack.enter_context(hostlocal.remote_job(root, dask_map))
            stack.enter_context(said_on_stderr(said))
            if scheduler is None:
                # workers start now and import the per-rank analysis while this process
                # imports pandas and the report (analyzer/ingest/pool.py)
                stack.enter_context(pool.workers(preload=PARSE_MODULES))
            if tables_out is not None:
                stack.enter_context(dataset.writing(tables_out))
            with pool.collector_paused():
                from analyzer.compare import runs# pandas and the analysis: only on a cache miss

            report_json = report_types.encode(runs.analyse(root, options))
    else:
        report_json, said = hit
    report = report_types.decode(report_json)  # render what report.json holds, hit or miss
    if notes is not None:
        notes += said
    else:
        for n in said:
            log.warning("%s", n)
    md = markdown.render(report)
    texts = {"json": lambda: report_json, "html": lambda: html.render(report, out), "md": lambda: md}
    written = {}
    rendered = {f: texts[f]() for f in ("json", "html", "md") if f in formats}
    with cache.out_lock(out):  # one report at a time writes and prunes this folder
        for f, text in rendered.items():
            outpaths.write_out(out / f"report.{f}", text, option="--out")
            written[f"report.{f}"] = hashlib.sha256(text.encode("utf-8")).hexdigest()
        stale, left = _remove_stale(out, formats, written, started_ns)
    if hit is None and key is not None:
        cache.store(root, out, key, report_json, said)
    wrote = ", ".join(f"report.{f}" for f in FORMATS if f in formats)
    lines = [f"{out}: removed {', '.join(stale)} of an earlier analysis (this one wrote "
             f"{wrote})"] if stale else []
    if left:
        lines.append(f"{out}: left {', '.join(left)}, not written by the analyzer as it is now "
                     f"(edited, or its record cleared); this analysis wrote {wrote}")
    for line in lines:
        if notes is not None:
            notes.append(line)
        else:
            log.warning("%s", line)
    return report, md


def default_out(root: Path) -> Path:
    """The report folder when ``--out`` is not given: ``DIR/report`` for a folder
    (``outpaths.default_report_dir``: refused when a symlink or outside DIR), ``FILE.report``
    beside one trace file (refused when a symlink; a later report of its folder skips it: it
    holds report files, analyzer/ingest/rundirs.py ``OUTPUT_FILES``)."""
    from analyzer.cli import outpaths
    from analyzer.contract.errors import BadInput, Reason

    if not root.is_file():
        return outpaths.default_report_dir(root)
    out = root.with_name(root.name + ".report")
    if out.is_symlink():
        raise BadInput(out, Reason.UNWRITABLE, "is a symlink; the default report folder of a "
                       "trace file is never written through one", "remove the link, or pass --out")
    return out


def _remove_stale(out: Path, formats: list[str], written: dict[str, str], started_ns: int
                  ) -> tuple[list[str], list[str]]:
    """Remove ``out/report.{md,json,html}`` of the formats not in ``formats`` when an earlier
    analysis wrote them unchanged (reports/cache.py ``remove_stale``): left there, they would
    sit beside the new report as if one set. Returns (names removed, names left). Raises
    ``BadInput`` when one cannot be removed."""
    from analyzer.contract.errors import BadInput
    from reports import cache

    try:
        return cache.remove_stale(out, [f"report.{f}" for f in FORMATS if f not in formats],
                                  written, started_ns)
    except OSError as exc:
        raise BadInput(exc.filename or out, "unwritable", f"is from an earlier analysis and "
                       f"cannot be removed ({exc.strerror})",
                       "pass --out to a writable folder") from None


def register(app, run) -> None:
    """Add the ``report`` command to ``app``; ``run`` maps typed errors to exit codes."""

    @app.command("report")
    def report_cmd(
        directory: Annotated[Path, typer.Argument(parser=input_path, help="Traces root, one run directory, a folder of foreign traces, or one trace file.")],
        out: Annotated[Optional[Path], typer.Option("--out", parser=input_path, help="Output folder (default DIR/report; FILE.report for one trace file).")] = None,
        fmt: Annotated[str, typer.Option("--format", help="Comma-separated: md,json,html.")] = "md,json,html",
        rtol: Annotated[Optional[float], typer.Option("--rtol", help="Override the relative tolerance.")] = None,
        atol: Annotated[Optional[float], typer.Option("--atol", help="Override the absolute tolerance.")] = None,
        allow_incomplete: Annotated[bool, typer.Option("--allow-incomplete", help=ALLOW_INCOMPLETE_HELP)] = False,
        device_memory: Annotated[Optional[str], typer.Option("--device-memory", help=DEVICE_MEMORY_HELP)] = None,
        scheduler: Annotated[Optional[str], typer.Option("--scheduler", help=SCHEDULER_HELP)] = None,
        tables_out: Annotated[Optional[Path], typer.Option("--tables-out", parser=input_path, help=TABLES_OUT_HELP)] = None,
    ) -> None:
        """Check parity, attribute time and memory, compare and rank; print report.md."""
        from analyzer.contract.report_types import AnalysisOptions, ToleranceOverride, parse_bytes
        from analyzer.ingest.cluster import scheduler_address

        formats = _formats(fmt)
        notes: list[str] = []
        _, md = run(lambda: write_report(directory, out=out, formats=formats, notes=notes,
                                         options=AnalysisOptions(
                                             tolerance=ToleranceOverride(rtol=rtol, atol=atol),
                                             allow_incomplete=allow_incomplete,
                                             device_memory_bytes=None if device_memory is None
                                             else parse_bytes(device_memory)),
                                         scheduler=scheduler_address(scheduler),
                                         tables_out=tables_out))
        from analyzer.cli import richout

        for n in notes:  # said by the analysis, or kept with the cached report: said again
            richout.echo(n, err=True, one_line=True)  # one line each, whatever a path holds
        richout.echo(md)
        richout.echo(f"analyzer: wrote {', '.join(f'report.{f}' for f in FORMATS if f in formats)} "
                     f"to {out or default_out(directory)}", err=True, one_line=True)
