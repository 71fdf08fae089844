"""`analyzer summary DIR`: per-rank / per-step / per-kind tables (issue 3)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

from analyzer.cli import input_path
from analyzer.cli.report import SCHEDULER_HELP
from analyzer.cli.richout import Format
from analyzer.contract.errors import BadInput, Reason


BUSBW_NOTE = (
    "algbw = bytes / time; busbw = bytes x the nccl-tests factor (all_reduce 2(n-1)/n, "
    "all_gather, reduce_scatter and all_to_all (n-1)/n, broadcast and send_recv 1) / time, "
    "GB/s = 10^9 bytes/s. whole duration: the time is each collective's whole duration, "
    "waiting for the slowest rank included; from transfer: its transfer time only, from the "
    "group's last start to its end (`analyzer report`'s \"busbw from transfer\"). --format "
    "json gives both under report.json's names for them.")


class _Check(str, enum.Enum):
    hta = "hta"


def register(app, run) -> None:
    """Add the ``summary`` command to ``app``; ``run`` maps typed errors to exit codes."""

    @app.command()
    def summary(
        path: Annotated[Path, typer.Argument(parser=input_path, help="Run directory, folder of traces, or a trace file.")],
        fmt: Annotated[Format, typer.Option("--format", help="table (rich) or json.")] = Format.table,
        output: Annotated[Path | None, typer.Option("--output", "-o", parser=input_path,
                                                    help="Write the JSON here instead of stdout (with --format json only).")] = None,
        crosscheck: Annotated[_Check | None, typer.Option(
            "--crosscheck", help="Also run HolisticTraceAnalysis's overlap and show both.")] = None,
        allow_incomplete: Annotated[bool, typer.Option(
            "--allow-incomplete", help="Analyse a run directory without manifest.json.")] = False,
        jobs: Annotated[int | None, typer.Option("--jobs", "-j", min=1,
                                                 help="Parser processes (default: min(cpus, ranks)).")] = None,
        scheduler: Annotated[str | None, typer.Option("--scheduler", help=SCHEDULER_HELP)] = None,
    ) -> None:
        """Time per collective, overlap and exposed communication per rank and ProfilerStep."""
        if output is not None and fmt != Format.json:  # -o writes JSON (its help says so)
            raise typer.BadParameter("writes JSON only: add --format json (the table goes to "
                                     "stdout: redirect it with > FILE)",
                                     param_hint="'--output' / '-o'")
        run(lambda: _summary(path, fmt, output, crosscheck, allow_incomplete, jobs, scheduler))


def _summary(path, fmt, output, crosscheck, allow_incomplete, jobs, scheduler) -> None:
    job, ts = _loaded(path, output, crosscheck, allow_incomplete, jobs, scheduler)
    with ts:  # its spilled tables removed on the way out
        _said(job, ts, path, fmt, output, crosscheck)


def _loaded(path, output, crosscheck, allow_incomplete, jobs, scheduler):
    """The job found at ``path`` and its tables (``JobTables``), the options checked before
    any parse."""
    import contextlib

    from analyzer.contract import outpaths
    from analyzer.ingest import cluster, hostlocal
    from analyzer.ingest.pipeline import load_run
    from analyzer.ingest.rundirs import find_job

    if output is not None:  # before the analysis: refused at once
        outpaths.check_out(output, option="-o", what="the summary", example="summary.json")
    if crosscheck is not None:  # a bad PARITYTRACE_HTA_TIMEOUT_S, likewise
        from analyzer.contract import settings

        settings.hta_timeout_s()
    address = cluster.scheduler_address(scheduler)
    with contextlib.ExitStack() as stack:
        if address is not None:  # ranks parsed by the Dask cluster's workers
            dask_map = stack.enter_context(cluster.connected(address))
            if not hostlocal.client_sees(path):
                if crosscheck is not None:
                    raise BadInput(path, Reason.BAD_OPTION, "is not on this machine, and "
                                   "--crosscheck hta reads every trace here",
                                   "drop --crosscheck, or run it where the traces are")
                stack.enter_context(hostlocal.remote_job(path, dask_map))
        # a run directory gets the manifest checks of `report` and `gate`
        # (analyzer/ingest/rundirs.py): a listed file missing or changed since the record is
        # refused, not summarised partially
        job = find_job(path, allow_incomplete=allow_incomplete)  # as load_tables does
        return job, load_run(job, jobs=jobs)


def _said(job, ts, path, fmt, output, crosscheck) -> None:
    """Summarise ``ts`` and print it, or write it to ``output``."""
    import json

    from analyzer.analyses.summary import summarize
    from analyzer.contract import outpaths
    from analyzer.compare.runs import job_findings

    if output is not None:
        _refuse_output_on_input(output, path, ts)
    s = summarize(ts)
    # the findings `analyzer report` gives for this job, by the same rules (compare/runs.py)
    s.findings = job_findings(job, ts)
    if crosscheck is not None:
        from analyzer.compare import crosscheck_hta

        s.crosscheck, notes = crosscheck_hta.crosscheck(ts)
        s.notes += notes
    if fmt == Format.json:
        from analyzer.ingest.fswalk import OUTPUT_MARKER

        # the marker first: a folder walk knows the file for ours (analyzer/ingest/fswalk.py)
        text = json.dumps({OUTPUT_MARKER: "analyzer summary", **s.to_json()}, indent=1)
        if output is None:
            typer.echo(text)
        else:
            outpaths.write_out(output, text, option="-o", example="summary.json")
        return
    _print_tables(s)


def _refuse_output_on_input(output: Path, path: Path, ts) -> None:
    """Raise ``BadInput`` (``out_is_input``) when ``-o`` names, through any link, a file the
    summary is made of: a trace it read, or in a run directory its manifest.json or a file of
    the tracer's (``schemas.RUN_FILE``) -- writing it would destroy the input (as ``merge -o``
    refuses, analyzer/timeline/merge.py)."""
    import os

    from analyzer.contract import schemas

    inputs = [r.path for r in ts.ranks]
    folder = path if path.is_dir() else path.parent
    if (folder / schemas.MANIFEST_NAME).is_file():
        inputs.append(folder / schemas.MANIFEST_NAME)
        inputs += [p for p in folder.iterdir() if schemas.RUN_FILE.fullmatch(p.name)]
    real = {os.path.realpath(p): p for p in inputs}
    hit = real.get(os.path.realpath(output))
    if hit is not None:
        raise BadInput(output, Reason.OUT_IS_INPUT, f"is {hit.name}, one of the files summarised "
                       "(writing it would destroy the input)",
                       "pass -o a new file, e.g. -o summary.json")


def _figure(value, unit: str) -> str:
    from reports import fmt

    if unit == "ns":
        return fmt.ms(value, ".3f")
    if unit == "bytes":
        return fmt.data_bytes(value)
    if unit == "frac":
        return fmt.pct(value)
    if unit == "GB/s":
        return "-" if value is None else f"{value:.3g} GB/s"
    if unit == "count":
        return fmt.count(value)
    return fmt.num(value)


def finding_lines(findings) -> list[str]:
    """The findings as plain lines, most severe first: ``N. title``, then indented the step
    time at stake, the cause with its rule and share (or "cause not established"), the action
    and the evidence (figure = value, report.json pointer)."""
    from reports import fmt

    if not findings:
        return []
    out = ["Findings (most severe first; evidence paths point into the report.json that "
           "'analyzer report' writes for this one job dir; a root's report.json numbers its "
           "runs differently):"]
    for n, f in enumerate(findings, 1):
        out.append(f"{n}. [{f.kind}] {f.title}")
        out.append(f"   at stake: {fmt.ms(f.severity_ns, '.3f')} per step")
        out.append(f"   cause: {f.cause} ({f.cause_rule}; explains {fmt.pct(f.explained_frac)})"
                   if f.cause else "   cause not established")
        if f.action:
            out.append(f"   try: {f.action}")
        out += [f"   {e.figure} = {_figure(e.value, e.unit)} ({e.path})" for e in f.evidence]
    return out


def _print_tables(s) -> None:
    from functools import partial

    from analyzer.cli.richout import add_column, clean, console, table
    from reports import fmt

    con = console()
    for line in s.headline:  # one line each, whatever a path or name holds
        con.print(clean(line, one_line=True), markup=False, highlight=False, soft_wrap=True)
    for line in finding_lines(s.findings):
        con.print(clean(line, one_line=True), markup=False, highlight=False, soft_wrap=True)
    # units in the headers, bare numbers in the cells: 11 columns fit 80 characters
    text, pct = partial(fmt.num, spec=""), partial(fmt.num, spec=".1f")
    ms = lambda ns: fmt.num(None if ns is None else ns / 1e6, ".3f")  # noqa: E731 ms to 1 µs
    gbps, pct100 = partial(fmt.num, spec=".3f"), partial(fmt.num, spec=".2f")  # pct100: 0..100

    def show(title, df, cols: dict) -> None:
        """A table of ``df``: ``cols`` maps each header to (column, formatter); NaN is missing."""
        if df is None or df.empty:
            return
        t = table(title)
        for head, (c, _) in cols.items():
            add_column(t, head, justify="left" if c in ("kind", "pg", "explanation") else "right",
                       key=c in ("rank", "step", "kind", "pg", "seq"))
        for rec in df[[c for c, _ in cols.values()]].itertuples(index=False):
            t.add_row(*[f(None if v != v else v) for (_, f), v in zip(cols.values(), rec)])
        con.print(t)

    times = ("compute", "comm", "overlap", "exposed_comm", "data_wait", "other", "idle")
    show("Per rank and step", s.breakdown,
         {"rank": ("rank", text), "step": ("step", text), "step_ms": ("step_ns", ms),
          **{f"{c}_ms": (f"{c}_ns", ms) for c in times},
          "overlap_of_comm_%": ("overlap_frac", lambda f: pct(None if f is None else 100 * f))})
    show("Per collective kind (all profiled steps)", s.by_kind,
         {"rank": ("rank", text), "kind": ("kind", text), "count": ("count", text),
          "time_ms": ("time_ns", ms),
          "bytes": ("bytes", lambda b: fmt.data_bytes(None if b is None or b < 0 else b)),
          "algbw_gbps": ("algbw_gbps", gbps),
          "busbw_whole_duration_gbps": ("busbw_gbps", gbps),
          "busbw_from_transfer_gbps": ("transfer_busbw_gbps", gbps)})
    if s.by_kind is not None and len(s.by_kind):
        con.print(BUSBW_NOTE, markup=False, highlight=False, soft_wrap=True)
    if len(s.offsets) > 1:
        show("Clock offsets (aligned time = rank time - offset applied)",
             s.offsets.astype({"mad_ns": "float64", "estimate_ns": "float64"}),
             {"rank": ("rank", text), "offset_ms": ("offset_ns", ms),
              "estimate_ms": ("estimate_ns", ms), "mad_ms": ("mad_ns", ms),
              "matched": ("n_matched", text), "clock": ("clock", text)})
    show("Stragglers (last to start, skew > 0, aligned clocks; cause: a part >= 80 %)", s.stragglers.head(10),
         {"rank": ("rank", text), "times_last": ("times_last", text),
          "skew_caused_ms": ("skew_caused_ns", ms),
          "cause": ("cause", lambda v: text("not established" if v is None else v)),
          "largest_part": ("largest_part", text),
          "of_skew_%": ("explained_frac", lambda f: pct(None if f is None else 100 * f))})
    x = s.cross_rank
    if len(x):  # a collective seen on one rank only, or not one instance, has no skew to show
        x = x[(x["n_ranks"] > 1) & x["measured"].astype(bool)].astype(
            {c: "int64" for c in ("start_skew_ns", "transfer_ns", "max_wait_ns")})
        x = x.astype({"straggler_rank": "float64"})
    show("Cross-rank: largest start skews (aligned clocks)", x.sort_values("start_skew_ns", ascending=False).head(10),
         {**{c: (c, text) for c in ("pg", "seq", "kind", "n_ranks")},
          "start_skew_ms": ("start_skew_ns", ms), "transfer_ms": ("transfer_ns", ms),
          "max_wait_ms": ("max_wait_ns", ms),
          "straggler_rank": ("straggler_rank", lambda v: text(None if v is None else int(v)))})
    show("Cross-check with HTA get_comm_comp_overlap (% of communication)", s.crosscheck,
         {"rank": ("rank", text), **{c: (c, pct100) for c in ("hta_overlap_pct", "ours_hta_scope_pct", "ours_step_pct",
                                       "diff_pct")}, "explanation": ("explanation", text)})
    for line in s.notes:
        con.print(clean(line, one_line=True), markup=False, highlight=False, soft_wrap=True)
