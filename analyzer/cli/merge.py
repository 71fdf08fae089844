"""`analyzer merge DIR -o merged.trace.json.gz`: one aligned multi-rank Chrome trace (issue 8)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from analyzer.cli import input_path


def register(app, run) -> None:
    """Add the ``merge`` command to ``app``; ``run`` maps typed errors to exit codes."""

    @app.command()
    def merge(
        directory: Annotated[Path, typer.Argument(parser=input_path, help="Run directory, folder of per-rank traces, or one trace file.")],
        out: Annotated[Optional[Path], typer.Option("-o", "--out", parser=input_path, help="Merged trace "
                       "(default DIR/merged.trace.json.gz; gzip when it ends in .gz).")] = None,
        steps: Annotated[Optional[str], typer.Option("--steps", help="ProfilerStep numbers to keep: "
                         "N, N-M or N,M (default: everything).")] = None,
        ref_rank: Annotated[Optional[int], typer.Option("--ref-rank", min=0,
                            help="Rank whose clock is the reference (default: lowest).")] = None,
        no_align: Annotated[bool, typer.Option("--no-align", help="Write the traces unshifted "
                            "(offsets are still estimated and reported).")] = False,
        allow_incomplete: Annotated[bool, typer.Option(
            "--allow-incomplete", help="Merge a run directory without manifest.json.")] = False,
        perfetto_manifest: Annotated[bool, typer.Option(
            "--perfetto-manifest", help="Also write OUT's stem + .perfetto_manifest.json beside "
            "the merged trace: each rank's trace and the clock offset applied, in Perfetto's "
            "manifest format 1 (perfetto.dev/docs/reference/perfetto-manifest), so that "
            "`trace_processor util merge -o job.tar --manifest MANIFEST TRACES...` lines the "
            "ranks up as merge does; the command is printed.")] = False,
    ) -> None:
        """Merge every rank into one Chrome trace aligned on matched collectives (opens in Perfetto)."""
        from analyzer.contract import outpaths
        from analyzer.contract.errors import BadInput, Reason
        from analyzer.timeline.merge import MergeOptions, merge_traces, parse_steps
        from analyzer.timeline import perfetto

        def go():
            try:
                chosen = parse_steps(steps) if steps else None
            except ValueError as exc:
                raise BadInput(directory, Reason.BAD_OPTION, str(exc),
                               "e.g. --steps 3 or --steps 2-4") from None
            # one trace file: merged beside it (a merged.* file is never read as input)
            target = out or (directory / "merged.trace.json.gz" if directory.is_dir()
                             else directory.with_name("merged.trace.json.gz"))
            if directory.exists():  # else merge_traces names what is wrong with the input
                for path in (target, perfetto.beside(target, ".offsets.json")):
                    outpaths.check_out(path, option="-o", what="the merged trace",
                                       example="merged.trace.json.gz")
            _check_like_report(directory, allow_incomplete)
            options = MergeOptions(steps=chosen, ref_rank=ref_rank, align=not no_align,
                                   allow_incomplete=allow_incomplete,
                                   perfetto_manifest=perfetto_manifest)
            return merge_traces(directory, target, options)

        result = run(go)
        _print(result)


def _check_like_report(directory: Path, allow_incomplete: bool) -> None:
    """Refuse a run directory without manifest.json (unless ``allow_incomplete``) in merge's
    words, before anything is read; the rest ``merge_traces`` refuses through the ingest, with
    ``analyzer report``'s errors."""
    from analyzer.contract import schemas
    from analyzer.contract.errors import BadInput, Reason

    if directory.is_dir() and not (directory / schemas.MANIFEST_NAME).is_file() \
            and any((directory / n).exists() for n in (schemas.NUMERICS_NAME, schemas.STEPS_NAME)) \
            and not allow_incomplete:
        raise BadInput(directory, Reason.INCOMPLETE_RUN, "incomplete run: no manifest.json (the "
                       "tracer writes it last)", "re-record the run, or pass "
                       "--allow-incomplete to merge what is there")


def _print(result) -> None:
    from analyzer.cli import richout
    from rich.table import Table

    def us(v) -> str:
        return "-" if v is None or v != v else f"{v / 1000:,.1f}"

    table = Table(title=f"clock offsets vs rank {result.ref_rank} (µs; aligned = own - offset)")
    for col in ("rank", "file", "offset", "estimate", "± MAD", "bounds", "matched", "clock"):
        table.add_column(col, justify="left" if col in ("file", "clock") else "right")
    files = {r.rank: r.path.name for r in result.ranks}
    for row in result.offsets.itertuples(index=False):
        bounds = "-" if row.n_matched == 0 or row.rank == result.ref_rank else f"[{us(row.lo_ns)}, {us(row.hi_ns)}]"
        table.add_row(str(row.rank), files[row.rank], us(row.offset_ns),
                      "-" if row.n_matched == 0 else us(row.estimate_ns),
                      "-" if row.n_matched == 0 else us(row.mad_ns), bounds, str(row.n_matched),
                      str(row.clock))
    console = richout.console()
    console.print(table)
    sp = result.spread
    if len(sp):
        console.print(f"{len(sp)} matched collectives; spread of their ends across ranks, median "
                      f"{us(sp['spread_before_ns'].median())} µs before alignment, "
                      f"{us(sp['spread_after_ns'].median())} µs after")
    for line in result.warnings:
        console.print(richout.clean(f"warning: {line}", one_line=True))
    console.print(richout.clean(f"wrote {result.out_path} ({result.n_events} events, "
                                f"{result.n_moved_to_overlap_tracks} on overlap tracks) and "
                                f"{result.sidecar_path}", one_line=True))
    if result.manifest_path is not None:
        from analyzer.timeline.perfetto import MANIFEST_SUFFIX, util_merge_command

        archive = result.manifest_path.with_name(
            result.manifest_path.name.removesuffix(MANIFEST_SUFFIX) + ".perfetto.tar")
        traces = {r.rank: r.path for r in result.ranks}
        console.print(richout.clean(f"wrote {result.manifest_path}; for Perfetto's own merge: "
                                    f"{util_merge_command(result.manifest_path, traces, archive)}",
                                    one_line=True), soft_wrap=True, markup=False)
