"""`analyzer grade PROJECTION RUN`: a projection's exact figures beside the real run's (issue
44, Deliver 4; the rules: analyzer/compare/grade.py).

Exit codes (docs/errors.md): 0 every exact figure equal; 2 bad input, or RUN of another
configuration (one line naming each difference, before any trace is read); 3 a figure differs
or could not be measured (``ExitCode.GATE_FAILED``, the gate's "check failed").
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from analyzer.cli import input_path
from analyzer.cli.report import LINK_MODEL_HELP, RANKS_PER_NODE_HELP
from analyzer.cli.richout import Format

if TYPE_CHECKING:
    from analyzer.compare.grade import Figure, Grade

GRADE_HELP = (
    "Grade a projection (PROJECTION: the run directory tracer project wrote, or any run "
    "directory) against the real run of the same configuration (RUN). Collective calls and "
    "bytes per step by kind and mesh dimension, and parameter, gradient and optimizer-state "
    "bytes, for each rank the projection holds, stand beside the measured ones and must be "
    "exactly equal. Exit 0 when all are, 3 when one differs or is not measured, 2 for bad "
    "input or a RUN of another configuration (strategy, options, mesh, world size, model, "
    "batch, precision, training). With --link-model, the projected step time [interval] "
    "stands beside the RUNs' measured median with the error: an error bar, not a failure.")

_FIGURE = {"calls_per_step": "calls/step", "bytes_per_step": "bytes/step", "bytes": "memory bytes"}


def _show(v) -> str:
    from analyzer.compare.grade import number

    n = number(v)
    return "-" if n is None else f"{n:,}" if isinstance(n, int) else f"{n:,.6g}"


def ranks_text(ranks: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``0-2, 5, 7, 8``: runs of three or more ranks as a range."""
    out: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out += [f"{ranks[i]}-{ranks[j]}"] if j - i >= 2 else [str(r) for r in ranks[i:j + 1]]
        i = j + 1
    return ", ".join(out)


def rows(g: Grade) -> list[tuple[Figure, list[int]]]:
    """The table's rows: figures alike but for their rank (same figure, kind, dimension and
    values) joined, ordered as the figures of a rank are (collectives by kind and dimension,
    calls then bytes; then memory), then by their first rank."""
    joined: dict[tuple, tuple[Figure, list[int]]] = {}
    order: dict[tuple, int] = {}
    for f in g.figures:
        what = (f.figure, f.kind, f.mesh_dim)
        order.setdefault(what, len(order))
        joined.setdefault(what + (f.projected, f.measured), (f, []))[1].append(f.rank)
    return sorted(joined.values(),
                  key=lambda fr: (order[(fr[0].figure, fr[0].kind, fr[0].mesh_dim)], fr[1][0]))


def lines(g: Grade) -> tuple[list[str], list[str]]:
    """(the lines above the table, the lines below it: timed figures and the verdict)."""
    info = g.projection_info
    what = (f"projected at world {g.world_size} from one process"
            + (f", roles run {', '.join(map(str, info['roles_run']))}"
               if isinstance(info.get("roles_run"), list) else "")
            + (f", on {info['device']}" if info.get("device") else "")
            if info else f"world {g.world_size}, not marked as a projection")
    head = [f"PROJECTION {g.projection} ({what})", f"RUN {g.run}",
            "configuration: the same (strategy, options, mesh, world size, model, batch, "
            "precision, training)",
            f"ranks compared: {ranks_text(g.ranks_compared)}"
            + (f" (projected ranks not in RUN: {ranks_text(g.ranks_not_in_run)})"
               if g.ranks_not_in_run else "")]
    differ = [f for f in g.figures if f.status == "mismatch"]
    unknown = [f for f in g.figures if f.status == "unknown"]
    tail = [step_line(g)]
    if not differ and not unknown:
        tail.append(f"grade: passed -- {len(g.figures)} exact figures equal on ranks "
                    f"{ranks_text(g.ranks_compared)}")
    else:  # a difference is named before a figure not measured
        first = (differ or unknown)[0]
        where = f"{_FIGURE[first.figure]} {first.kind}" + (
            f" {first.mesh_dim}" if first.mesh_dim else "")
        counts = ", ".join(([f"{len(differ)} of {len(g.figures)} exact figures differ"]
                            if differ else [])
                           + ([f"{len(unknown)}{'' if differ else f' of {len(g.figures)}'} "
                               "exact figures not measured"] if unknown else []))
        tail.append(f"grade: FAILED -- {counts}, first: {where} rank {first.rank} (projected "
                    f"{_show(first.projected)}, measured {_show(first.measured)})")
    return head, tail


def step_line(g: Grade) -> str:
    """The step time's line: projected [interval] beside the measured median, or why not."""
    from analyzer.compare.grade import TIMED

    s = g.step
    if s is None:
        return f"step time: {TIMED}"
    ms = lambda ns: f"{ns / 1e6:,.3g} ms"  # noqa: E731
    return (f"step time: projected {ms(s.projected_ns)} [{ms(s.low_ns)}, {ms(s.high_ns)}], "
            f"measured median {ms(s.measured_median_ns)} over {s.measured_steps} profiled "
            f"steps of {len(g.runs)} run(s): error {s.error:+.1%}, "
            f"{'inside' if s.inside else 'outside'} the interval (an error bar, not graded "
            "exactly)")


def _print(g: Grade) -> None:
    from analyzer.cli import richout

    head, tail = lines(g)
    for line in head:
        richout.echo(line, one_line=True)
    t = richout.table("exact figures per rank (must be equal)")
    for name, key in (("figure", True), ("kind", True), ("mesh_dim", True), ("ranks", True),
                      ("projected", False), ("measured", False), ("status", True)):
        richout.add_column(t, name, justify="left" if name in ("figure", "kind", "mesh_dim",
                                                               "ranks", "status") else "right",
                           key=key)
    for f, ranks in rows(g):
        t.add_row(_FIGURE[f.figure], f.kind, f.mesh_dim or "-", ranks_text(ranks),
                  _show(f.projected), _show(f.measured),
                  "MISMATCH" if f.status == "mismatch" else f.status)
    richout.console().print(t)
    for line in tail:
        richout.echo(line, one_line=True)


def register(app, call) -> None:
    """Add the ``grade`` command to ``app``; ``call`` maps typed errors to exit codes."""

    @app.command("grade", help=GRADE_HELP)
    def grade_cmd(
        projection: Annotated[Path, typer.Argument(parser=input_path, help="The projection's run directory (tracer project).")],
        runs: Annotated[list[Path], typer.Argument(parser=input_path, help="The real run's directory, of the same configuration; several: repeats of it (their step times pooled).")],
        fmt: Annotated[Format, typer.Option("--format", help="table or json.")] = Format.table,
        link_model: Annotated[Optional[list[Path]], typer.Option("--link-model", parser=input_path, help=LINK_MODEL_HELP)] = None,
        ranks_per_node: Annotated[Optional[int], typer.Option("--ranks-per-node", min=1, help=RANKS_PER_NODE_HELP)] = None,
    ) -> None:
        from analyzer.compare import grade
        from analyzer.contract.errors import ExitCode
        from analyzer.contract.report_types import AnalysisOptions

        options = AnalysisOptions(link_model=tuple(str(p) for p in link_model or ()),
                                  ranks_per_node=ranks_per_node)
        g = call(lambda: grade.grade(projection, runs, options))
        if fmt == Format.json:
            import json

            typer.echo(json.dumps(grade.to_json(g), indent=1))
        else:
            _print(g)
        if not g.ok:
            raise typer.Exit(ExitCode.GATE_FAILED)
