"""`analyzer drift OLD NEW`: baseline drift between two runs' kept tensors and numerics (issue 9)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from analyzer.cli import input_path

from analyzer.cli.richout import Format


def register(app, run) -> None:
    """Add the ``drift`` command to ``app``; ``run`` maps typed errors to exit codes."""

    @app.command()
    def drift(
        old: Annotated[Path, typer.Argument(parser=input_path, help="Earlier (golden) run directory.")],
        new: Annotated[Path, typer.Argument(parser=input_path, help="Later run directory.")],
        fmt: Annotated[Format, typer.Option("--format", help="table or json.")] = Format.table,
        rtol: Annotated[Optional[float], typer.Option("--rtol", help="Override the relative tolerance.")] = None,
        atol: Annotated[Optional[float], typer.Option("--atol", help="Override the absolute tolerance.")] = None,
        check: Annotated[bool, typer.Option("--check", help="Exit 3 when a kept tensor drifts "
                                                        "beyond what is expected.")] = False,
    ) -> None:
        """Per kept tensor: the difference, the tolerance applied and why; which settings differ."""
        from analyzer.compare.drift import drift as compute
        from analyzer.contract.errors import ExitCode
        from analyzer.contract.report_types import ToleranceOverride

        result = run(lambda: compute(old, new, ToleranceOverride(rtol=rtol, atol=atol)))
        if fmt == Format.json:
            import json

            typer.echo(json.dumps(result, indent=1))
        else:
            _print(result)
        if check and not result["ok"]:
            raise typer.Exit(ExitCode.GATE_FAILED)


def _print(r: dict) -> None:
    from rich.table import Table

    from analyzer.cli import richout
    from reports import fmt

    con = richout.console()
    say = lambda s: con.print(s, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    say(f"OLD {r['old']['run_name']} ({r['old']['path']}, kept {r['old']['keep_tensors']})")
    say(f"NEW {r['new']['run_name']} ({r['new']['path']}, kept {r['new']['keep_tensors']})")
    if r["settings_differ"]:
        for d in r["settings_differ"]:
            say(f"settings differ: {d['setting']}: {d['old']} -> {d['new']}")
    else:
        say("settings: identical (versions, device, precision, sharding, world size, model, batch, seed)")
    say(f"expected: {r['expectation']['mode']} -- {r['expectation']['why']}")
    t = Table(title="kept tensors (OLD = reference)")
    for c in ("tensor", "shape", "basis", "max |diff|", "rel L2", "max |old|", "limit", "status"):
        t.add_column(c, justify="left" if c in ("tensor", "basis", "status") else "right",
                     overflow="fold")  # tensor names are never cut
    for x in r["tensors"]:
        t.add_row(x["tensor"], "x".join(map(str, x["shape"] or [])) or "-", x["basis"],
                  fmt.num(x["max_abs_diff"]), fmt.num(x["rel_l2"]), fmt.num(x["max_abs_ref"]),
                  fmt.num(x["limit"]), x["status"])
    con.print(t)
    num = r["numerics"]
    if num["loss"]:
        lt = Table(title="distributed loss per step (mean over ranks)")
        for c in ("step", "OLD", "NEW", "|diff|"):
            lt.add_column(c, justify="right")
        for x in num["loss"]:
            lt.add_row(str(x["step"]), fmt.num(x["old"], ".9g"), fmt.num(x["new"], ".9g"),
                       fmt.num(x["abs_diff"]))
        con.print(lt)
    for side in ("old", "new"):
        p = num[f"{side}_parity"]
        say(f"{side.upper()} parity vs its own baseline: {p['status']} -- {p['reason']}")
    g = r.get("golden")
    if g:
        say(f"NEW was recorded with --golden OLD: batch sha256 equal {g['batch_sha256_equal']}, "
            f"initial state sha256 equal {g['init_sha256_equal']}")
        d = g.get("distributed")
        if d:
            say(f"NEW distributed step-0 tensors vs OLD's kept tensors: {d['tensors']} tensors, "
                f"max rel L2 {fmt.num(d['max_rel_l2'])}, max |diff| {fmt.num(d['max_abs_diff'])}; "
                + (f"beyond the expectation: {', '.join(d['beyond'])}" if d["beyond"] else "all as expected"))
    say(("OK " if r["ok"] else "DRIFT ") + r["verdict"])
