"""`analyzer report DIR` (issue 4): its options; the report files are written by
analyzer/compare/reportfiles.py. `analyzer gate` is analyzer/cli/gate.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from analyzer.cli import input_path
from analyzer.compare.reportfiles import FORMATS

ALLOW_INCOMPLETE_HELP = (
    "Analyse a run directory without manifest.json (a record that did not finish) as found: "
    "marked incomplete, parity not checked, left out of the ranking. Folders of foreign "
    "traces need no flag: pass each such folder itself (a traces root takes run directories).")
DEVICE_MEMORY_HELP = (
    "One device's memory, e.g. 80GiB (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB): the Memory section "
    "says per run whether its largest per-rank peak fits, and with how much to spare.")
LINK_MODEL_HELP = (
    "A link model for the runs tracer project wrote: a JSON file of curves (tracer linkbench), "
    "nccl-tests output (all_reduce_perf ... as printed), or a report.json whose records "
    "measured transfers; repeat for several. Each projection then gets a projected step at "
    "its world size (section Projection at N ranks).")
RANKS_PER_NODE_HELP = (
    "The target's ranks per node for a projected step: a process group spans nodes by it "
    "(default: the whole world on one node).")
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
        link_model: Annotated[Optional[list[Path]], typer.Option("--link-model", parser=input_path, help=LINK_MODEL_HELP)] = None,
        ranks_per_node: Annotated[Optional[int], typer.Option("--ranks-per-node", min=1, help=RANKS_PER_NODE_HELP)] = None,
        tables_out: Annotated[Optional[Path], typer.Option("--tables-out", parser=input_path, help=TABLES_OUT_HELP)] = None,
    ) -> None:
        """Check parity, attribute time and memory, compare and rank; print report.md."""
        from analyzer.compare.reportfiles import default_out, write_report
        from analyzer.contract.report_types import AnalysisOptions, ToleranceOverride, parse_bytes
        from analyzer.ingest.cluster import scheduler_address

        formats = _formats(fmt)
        notes: list[str] = []
        _, md = run(lambda: write_report(directory, out=out, formats=formats, notes=notes,
                                         options=AnalysisOptions(
                                             tolerance=ToleranceOverride(rtol=rtol, atol=atol),
                                             allow_incomplete=allow_incomplete,
                                             device_memory_bytes=None if device_memory is None
                                             else parse_bytes(device_memory),
                                             link_model=tuple(str(p) for p in link_model or ()),
                                             ranks_per_node=ranks_per_node),
                                         scheduler=scheduler_address(scheduler),
                                         tables_out=tables_out))
        from analyzer.cli import richout

        for n in notes:  # said by the analysis, or kept with the cached report: said again
            richout.echo(n, err=True, one_line=True)  # one line each, whatever a path holds
        richout.echo(md)
        richout.echo(f"analyzer: wrote {', '.join(f'report.{f}' for f in FORMATS if f in formats)} "
                     f"to {out or default_out(directory)}", err=True, one_line=True)
