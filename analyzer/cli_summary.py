"""`analyzer summary DIR`: per-rank / per-step / per-kind tables (issue 3)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer


class _Format(str, enum.Enum):
    table = "table"
    json = "json"


class _Check(str, enum.Enum):
    hta = "hta"


def register(app, run) -> None:
    """Add the ``summary`` command to ``app``; ``run`` maps typed errors to exit codes."""

    @app.command()
    def summary(
        path: Annotated[Path, typer.Argument(help="Run directory, folder of traces, or a trace file.")],
        fmt: Annotated[_Format, typer.Option("--format", help="table (rich) or json.")] = _Format.table,
        output: Annotated[Path | None, typer.Option("--output", "-o",
                                                    help="Write the JSON here instead of stdout (with --format json only).")] = None,
        crosscheck: Annotated[_Check | None, typer.Option(
            "--crosscheck", help="Also run HolisticTraceAnalysis's overlap and show both.")] = None,
        allow_incomplete: Annotated[bool, typer.Option(
            "--allow-incomplete", help="Analyse a run directory without manifest.json.")] = False,
        jobs: Annotated[int | None, typer.Option("--jobs", "-j", min=1,
                                                 help="Parser processes (default: min(cpus, ranks)).")] = None,
    ) -> None:
        """Time per collective, overlap and exposed communication per rank and ProfilerStep."""
        if output is not None and fmt != _Format.json:  # -o writes JSON (its help says so)
            raise typer.BadParameter("writes JSON only: add --format json (the table goes to "
                                     "stdout: redirect it with > FILE)",
                                     param_hint="'--output' / '-o'")
        run(lambda: _summary(path, fmt, output, crosscheck, allow_incomplete, jobs))


def _summary(path, fmt, output, crosscheck, allow_incomplete, jobs) -> None:
    import json

    from analyzer.atomic import write_atomic
    from analyzer.errors import BadInput
    from analyzer.ingest import load_tables
    from analyzer.summary import summarize

    if output is not None and output.is_dir():  # before the analysis: refused at once
        raise BadInput(output, "out_is_dir", "-o names an existing directory, not a file",
                       f"pass a file name, e.g. -o {output / 'summary.json'}")
    # a run directory gets the manifest checks of `report` and `gate` (analyzer/rundirs.py): a
    # listed file missing or changed since the record is refused, not summarised partially
    ts = load_tables(path, allow_incomplete=allow_incomplete, jobs=jobs)
    s = summarize(ts)
    if crosscheck is not None:
        from analyzer import crosscheck_hta

        if not crosscheck_hta.hta_available():
            raise BadInput(path, "hta_missing", "--crosscheck hta needs HolisticTraceAnalysis",
                           "pip install 'paritytrace[hta]'")
        if ts.root.is_dir():
            s.crosscheck = crosscheck_hta.compare(ts, crosscheck_hta.run_hta_overlap(ts.root))
        else:
            s.crosscheck = crosscheck_hta.compare(ts, _hta_on_one_file(ts.root))
    if fmt == _Format.json:
        text = json.dumps(s.to_json(), indent=1)
        if output is None:
            typer.echo(text)
        else:
            try:
                write_atomic(output, text)
            except OSError as exc:
                raise BadInput(output, "unwritable", f"cannot be written ({exc.strerror})",
                               "pass -o a file in a writable folder") from None
        return
    _print_tables(s)


def _hta_on_one_file(trace: Path):
    """HTA's overlap for one trace file: HTA reads whole folders, so it gets a temporary folder
    holding only a symlink to ``trace`` (removed afterwards). Given the file's parent instead,
    HTA read every sibling trace too, logged a "same rank" line for each and kept another
    file's figure for the rank."""
    import tempfile

    from analyzer import crosscheck_hta

    with tempfile.TemporaryDirectory(prefix="paritytrace-hta-") as tmp:
        link = Path(tmp) / trace.name
        link.symlink_to(trace.resolve())
        return crosscheck_hta.run_hta_overlap(Path(tmp))


def _print_tables(s) -> None:
    from rich.table import Table

    from analyzer.richout import add_column, console

    con = console()
    for line in s.headline:
        con.print(line, markup=False, highlight=False, soft_wrap=True)

    def show(title, df, cols, fmt=None):
        if df is None or df.empty:
            return
        t = Table(title=title)
        for c in cols:
            add_column(t, c, justify="right" if c not in ("kind", "pg", "explanation") else "left",
                       key=c in ("rank", "step", "kind", "pg", "seq"))
        for rec in df[cols].itertuples(index=False):
            t.add_row(*[(fmt or {}).get(c, _cell)(v) for c, v in zip(cols, rec)])
        con.print(t)

    ms = lambda v: f"{v / 1e6:.3f}"  # noqa: E731
    b = s.breakdown.copy()
    b_cols = ["rank", "step", "step_ms", "compute_ms", "comm_ms", "overlap_ms", "exposed_comm_ms",
              "data_wait_ms", "other_ms", "idle_ms", "overlap_pct"]
    for c in ("step", "compute", "comm", "overlap", "exposed_comm", "data_wait", "other", "idle"):
        b[f"{c}_ms"] = b[f"{c}_ns"]
    b["overlap_pct"] = b["overlap_frac"] * 100
    show("Per rank and step (ms)", b, b_cols,
         {**{c: ms for c in b_cols if c.endswith("_ms")}, "overlap_pct": _pct})
    k = s.by_kind.copy()
    if not k.empty:
        k["time_ms"] = k["time_ns"]
        show("Per collective kind", k, ["rank", "kind", "count", "time_ms", "bytes", "algbw_gbps",
                                        "busbw_gbps"], {"time_ms": ms})
    st = s.stragglers.copy()
    if not st.empty:
        st["skew_caused_ms"] = st["skew_caused_ns"]
        show("Stragglers (last to start a matched collective)", st.head(10),
             ["rank", "times_last", "skew_caused_ms"], {"skew_caused_ms": ms})
    x = s.cross_rank
    if not x.empty:
        worst = x.sort_values("start_skew_ns", ascending=False).head(10).copy()
        worst["start_skew_ms"] = worst["start_skew_ns"]
        worst["transfer_ms"] = worst["transfer_ns"]
        worst["max_wait_ms"] = worst["max_wait_ns"]
        show("Cross-rank: largest start skews", worst,
             ["pg", "seq", "kind", "n_ranks", "start_skew_ms", "transfer_ms", "max_wait_ms",
              "straggler_rank"], {"start_skew_ms": ms, "transfer_ms": ms, "max_wait_ms": ms})
    if s.crosscheck is not None:
        show("Cross-check with HTA get_comm_comp_overlap (% of communication)", s.crosscheck,
             ["rank", "hta_overlap_pct", "ours_whole_trace_pct", "ours_step_pct", "diff_pct",
              "explanation"], {c: _pct for c in ("hta_overlap_pct", "ours_whole_trace_pct",
                                                  "ours_step_pct", "diff_pct")})


def _cell(v) -> str:
    if isinstance(v, float):
        return "-" if v != v else f"{v:.3f}"
    return str(v)


def _pct(v) -> str:
    return "-" if v != v else f"{v:.2f}"
